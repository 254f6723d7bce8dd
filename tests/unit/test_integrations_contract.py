"""The contract every framework integration keeps, one test run over each (the real
``transformers`` and ``lightning`` Trainers and ``torch.distributed.checkpoint`` on the CPU,
tiny models from a config): each save is published once, sealed, inside the execution's
folder; the next execution resumes from the save it was given, and past one cut short to
the save before it; and (the callbacks) the warning signal's save is published, then the job
requeued (never a shared-checkpoint job's: that one ends with NotRequeued).  A new
framework's integration joins by one adapter here (``INTEGRATIONS``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from slurm_dispatch.checkpoint import execdir
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import NotRequeued
from slurm_dispatch.execution import saves
from tests.execution_env import dispatch_env

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

E1, E2 = 1_000_000, 1_000_001
STEPS = 6  # a save every 2 steps: 2, 4, 6
SIGNAL_IN = 3  # the warning signal arrives while this step runs


class Integration:
    """One framework as the contract drives it."""

    name = ""
    signals = True  # it answers the warning signal (a callback)

    def train(
        self,
        tmp_path: Path,
        steps: int,
        signal_in: Optional[int] = None,
        command: Optional[list[str]] = None,
    ) -> Any:
        """Train ``steps`` steps from what its resume helper gives, saving every 2; returns
        the callback (None for DCP)."""
        raise NotImplementedError

    def resume(self) -> Optional[str]:
        """What its resume helper gives a fresh process."""
        raise NotImplementedError


class Transformers(Integration):
    name = "transformers"

    def train(
        self,
        tmp_path: Path,
        steps: int,
        signal_in: Optional[int] = None,
        command: Optional[list[str]] = None,
    ) -> Any:
        import transformers

        from slurm_dispatch.integrations.transformers import DispatchCallback
        from tests.unit.test_integrations_transformers import make_trainer

        class Warn(transformers.TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if signal_in is not None and state.global_step == signal_in - 1:
                    os.kill(os.getpid(), signal.SIGUSR1)

        callback = DispatchCallback(requeue_command=command)
        make_trainer(tmp_path / "out", steps, [Warn(), callback]).train(
            resume_from_checkpoint=self.resume()
        )
        return callback

    def resume(self) -> Optional[str]:
        from slurm_dispatch.integrations.transformers import resume_from_checkpoint

        found = resume_from_checkpoint()
        return found if isinstance(found, str) else None


class Lightning(Integration):
    name = "lightning"

    def train(
        self,
        tmp_path: Path,
        steps: int,
        signal_in: Optional[int] = None,
        command: Optional[list[str]] = None,
    ) -> Any:
        from lightning.pytorch.callbacks import ModelCheckpoint

        from slurm_dispatch.integrations.lightning import DispatchCallback
        from tests.unit.test_integrations_lightning import Tiny, fit

        callback = DispatchCallback(requeue_command=command)
        checkpoint = ModelCheckpoint(every_n_train_steps=2, save_top_k=1)
        fit(
            tmp_path,
            steps,
            [checkpoint, callback],
            model=Tiny(signal_at=signal_in),
            ckpt_path=self.resume(),
        )
        return callback

    def resume(self) -> Optional[str]:
        from slurm_dispatch.integrations.lightning import resume_from_checkpoint

        return resume_from_checkpoint()


class DCP(Integration):
    name = "dcp"
    signals = False  # a library call, not a callback: the loop around it answers signals

    def train(
        self,
        tmp_path: Path,
        steps: int,
        signal_in: Optional[int] = None,
        command: Optional[list[str]] = None,
    ) -> Any:
        import torch

        from slurm_dispatch.integrations import dcp

        state = {"w": torch.zeros(4)}
        start = self.resume()
        first = 1 if start is None else int(Path(start).name.split("-")[1]) + 1
        for step in range(first, steps + 1):
            state["w"] += 1
            if step % 2 == 0:
                dcp.save(state, step=step, no_dist=True)
        return None

    def resume(self) -> Optional[str]:
        import torch

        from slurm_dispatch.integrations import dcp

        return dcp.load({"w": torch.zeros(4)}, no_dist=True)


INTEGRATIONS: list[Callable[[], Integration]] = [Transformers, Lightning, DCP]


@pytest.fixture(params=INTEGRATIONS, ids=lambda made: made.name)
def integration(request: pytest.FixtureRequest) -> Integration:
    made: Integration = request.param()
    pytest.importorskip(made.name if made.name != "dcp" else "torch")
    return made


def _published(root: Path) -> list[tuple[int, int, str]]:
    return [(f.epoch, f.step, f.path) for f in store.list_publications(str(root))]


def _cut_short(save: str) -> None:
    """The save's largest file truncated to half its size (a copy cut off)."""
    files = (
        [Path(save)] if os.path.isfile(save) else [p for p in Path(save).rglob("*") if p.is_file()]
    )
    largest = max(files, key=lambda p: p.stat().st_size)
    os.truncate(largest, largest.stat().st_size // 2)


def test_each_save_is_published_once_sealed_in_the_executions_folder(
    integration: Integration, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    assert integration.resume() is None  # nothing published: a fresh start
    callback = integration.train(tmp_path, STEPS)
    found = _published(root)
    assert [(epoch, step) for epoch, step, _path in found] == [(E1, 2), (E1, 4), (E1, 6)]
    assert len({path for _e, _s, path in found}) == 3
    for _epoch, _step, path in found:
        assert path.startswith(f"{exec_dir}/")
        assert os.path.lexists(execdir.manifest_of(path, os.path.isdir(path)))
        assert saves.why_unloadable(path) is None
    if callback is not None:
        assert len(callback.publications) == 3 and not callback.requeued


def test_the_next_execution_resumes_from_its_save_and_past_one_cut_short(
    integration: Integration, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    integration.train(tmp_path, STEPS)
    paths = [path for _e, _s, path in _published(root)]
    dispatch_env(root, "b", E2, paths[-1], monkeypatch)
    assert integration.resume() == paths[-1]
    _cut_short(paths[-1])
    exec_c = dispatch_env(root, "c", E2, paths[-1], monkeypatch)
    assert integration.resume() == paths[-2]  # the save before it, along the lineage
    # The fallback is recorded as this execution's choice, so cleanup keeps it.
    assert any(n.startswith(execdir.CHOICE_PREFIX) for n in os.listdir(exec_c))
    integration.train(tmp_path, STEPS + 2)
    assert [(e, s) for e, s, _p in _published(root)][-1] == (E2, STEPS + 2)


@pytest.mark.parametrize("shared", [False, True], ids=["requeued", "shared"])
def test_the_signals_save_is_published_then_the_job_requeued(
    integration: Integration, shared: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not integration.signals:
        pytest.skip(f"{integration.name} has no callback: its loop answers the signal")
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        f"slurm_dispatch.integrations.{integration.name}.is_shared_checkpoint",
        lambda execution: shared,
    )
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    marker = tmp_path / "requeued"
    try:
        if shared:
            with pytest.raises(NotRequeued):
                integration.train(tmp_path, 50, SIGNAL_IN, ["touch", str(marker)])
        else:
            callback = integration.train(tmp_path, 50, SIGNAL_IN, ["touch", str(marker)])
            assert callback.requeued
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN  # handed back
    finally:
        signal.signal(signal.SIGUSR1, previous)
    found = _published(root)
    # The save made at the next safe point after the signal, published; training stopped.
    assert found and SIGNAL_IN <= found[-1][1] <= SIGNAL_IN + 1
    assert all(step <= found[-1][1] for _e, step, _p in found)
    assert marker.exists() is not shared
    assert (exec_dir / execdir.REQUEUED).exists() is not shared
