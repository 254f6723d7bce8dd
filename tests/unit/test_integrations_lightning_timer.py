"""``Trainer(max_time=...)`` inside a dispatch execution, with the real Lightning on the CPU.

Lightning's ``Timer`` stops training once ``max_time`` of training has passed and ``fit``
returns: the job ends COMPLETED, and the supervisor stops it for good.  That time is counted
across executions: each save carries the Timer's elapsed time and a resumed run starts from it
(Lightning's ``Timer.load_state_dict``), so a run resumed from a save made at the stop trains
nothing.  So a stop at ``max_time`` is the end of the run's time budget, not an interruption
to requeue (a requeued execution would stop at once, again and again); but what was trained
since the last save must not be lost, and the stop must not look like reaching
``max_steps``: the callback saves and publishes the state at the stop, and says what happened
and how to stop before Slurm's limit instead (the warning signal)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
from tests.execution_env import dispatch_env

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

E1, E2 = 1_000_000, 1_000_001
MAX_TIME = {"seconds": 1}


class Slow(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.start_step: Optional[int] = None

    def on_train_start(self) -> None:
        self.start_step = self.trainer.global_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(0.02)
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path: Path, ckpt_path: Optional[str] = None, **limits: Any) -> tuple[Any, Slow]:
    torch.manual_seed(0)
    model = Slow()
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(4096, 4), torch.randn(4096, 1)), batch_size=4
    )
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "user"),
        callbacks=[ModelCheckpoint(every_n_train_steps=10_000, save_top_k=-1), DispatchCallback()],
        **limits,
    )
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return trainer, model


def test_a_stop_at_max_time_publishes_the_state_at_the_stop_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    trainer, _ = fit(tmp_path, max_steps=100_000, max_time=MAX_TIME)
    step = trainer.global_step
    assert 0 < step < 100_000  # stopped by the Timer, between ModelCheckpoint's saves
    found = store.list_publications(str(root))
    assert [(f.epoch, f.step, f.path) for f in found] == [
        (E1, step, f"{exec_dir}/checkpoints/max_time-step={step}.ckpt")
    ]
    err = capsys.readouterr().err
    assert (
        f"dispatch: training stopped at max_time (Lightning's Timer, 0:00:01 of training "
        f"counted across executions) at step {step}, before max_steps or max_epochs: its "
        f"state is saved and published ({exec_dir}/checkpoints/max_time-step={step}.ckpt)"
    ) in err, err
    assert "--warn-before" in err and "--supersede" in err, err


def test_a_run_resumed_from_it_trains_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why a stop at max_time is not requeued: Lightning restores the spent Timer."""
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    first, _ = fit(tmp_path, max_steps=100_000, max_time=MAX_TIME)
    saved = store.list_publications(str(root))[-1]
    dispatch_env(root, "b", E2, saved.path, monkeypatch)
    second, model = fit(
        tmp_path, ckpt_path=resume_from_checkpoint(), max_steps=100_000, max_time=MAX_TIME
    )
    assert second.global_step == first.global_step
    assert model.start_step is None  # the Timer, restored spent, stopped it before training
    assert store.list_publications(str(root)) == [saved]


def test_reaching_max_steps_within_max_time_is_done_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    trainer, _ = fit(tmp_path, max_steps=5, max_time={"minutes": 10})
    assert trainer.global_step == 5
    assert store.list_publications(str(root)) == []  # ModelCheckpoint saves every 10,000
    assert "max_time" not in capsys.readouterr().err


class LastStepSlow(Slow):
    """Its third and last step outlasts max_time: the Timer's stop and max_steps fall on the
    same step."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(1.3 if self.trainer.global_step == 2 else 0.0)
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])


def fit_with(tmp_path: Path, model: Slow, every: int, **limits: Any) -> Any:
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(4096, 4), torch.randn(4096, 1)), batch_size=4
    )
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "user"),
        callbacks=[ModelCheckpoint(every_n_train_steps=every, save_top_k=-1), DispatchCallback()],
        **limits,
    )
    trainer.fit(model, data)
    return trainer


def test_a_stop_at_max_time_right_after_a_save_of_its_step_publishes_that_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ModelCheckpoint saves every step: at the Timer's stop the save of that step is the
    state at the stop, published already; no second save of it is made (a guard: held when
    attacked)."""
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    trainer = fit_with(tmp_path, Slow(), 1, max_steps=100_000, max_time=MAX_TIME)
    step = trainer.global_step
    found = store.list_publications(str(root))
    assert [f.step for f in found] == list(range(1, step + 1))
    assert found[-1].path == f"{exec_dir}/checkpoints/epoch=0-step={step}.ckpt"
    assert not list((exec_dir / "checkpoints").glob("max_time-*"))
    err = capsys.readouterr().err
    assert (
        f"at step {step}, before max_steps or max_epochs: its state is saved and published "
        f"({exec_dir}/checkpoints/epoch=0-step={step}.ckpt)"
    ) in err, err


def test_max_time_spent_at_the_step_that_reaches_max_steps_is_done_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Timer stops at the very step that reaches max_steps: the run is done, not stopped
    at max_time (a guard: held when attacked)."""
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    model = LastStepSlow()
    trainer = fit_with(tmp_path, model, 10_000, max_steps=3, max_time=MAX_TIME)
    assert trainer.global_step == 3
    timer = next(c for c in trainer.callbacks if type(c).__name__ == "Timer")
    assert timer.time_remaining() <= 0  # the Timer's time was spent too
    assert store.list_publications(str(root)) == []
    assert "max_time" not in capsys.readouterr().err
