"""The Lightning integration with the real ``lightning.Trainer`` on the CPU: one publication per
save (never the rewritten ``last.ckpt``), ``save_top_k`` off inside dispatch and untouched
outside, the requeue signal answered at the next batch end (not in the handler) with a
published save and a requeue, none for a shared-checkpoint job, and resume from the save."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any, Optional

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import NotRequeued
from slurm_dispatch.execution import saves
from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
from tests.execution_env import dispatch_env

pytestmark = [
    # Lightning's own notices about this tiny set-up, not about the integration.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

E1, E2 = 1_000_000, 1_000_001


def weights_hash(state: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Tiny(L.LightningModule):
    def __init__(
        self, signal_at: Optional[int] = None, signum: signal.Signals = signal.SIGUSR1
    ) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.signal_at = signal_at
        self.signum = signum
        self.start_step: Optional[int] = None
        self.start_weights: Optional[str] = None
        self.saved_in_handler: Optional[bool] = None

    def on_train_start(self) -> None:
        self.start_step = self.trainer.global_step
        self.start_weights = weights_hash(self.state_dict())

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.signal_at is not None and self.global_step == self.signal_at:
            folder = Path(os.environ.get("DISPATCH_EXEC_DIR", os.devnull))
            before = set(folder.rglob("*"))
            os.kill(os.getpid(), self.signum)  # its handler has run when kill returns
            self.saved_in_handler = set(folder.rglob("*")) != before
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(
    tmp_path: Path,
    max_steps: int,
    callbacks: list[Any],
    model: Optional[Tiny] = None,
    ckpt_path: Optional[str] = None,
) -> tuple[Any, Tiny]:
    torch.manual_seed(0)
    model = model or Tiny()
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1)), batch_size=4
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "user"),
        callbacks=callbacks,
    )
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return trainer, model


def test_each_save_is_published_once_and_top_k_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    checkpoint = ModelCheckpoint(every_n_train_steps=2, save_top_k=1, save_last=True)
    callback = DispatchCallback()
    fit(tmp_path, 6, [checkpoint, callback], ckpt_path=resume_from_checkpoint())
    folder = exec_dir / "checkpoints"
    found = store.list_publications(str(root))
    assert [(f.epoch, f.step) for f in found] == [(E1, 2), (E1, 4), (E1, 6)]
    assert [Path(f.path).name for f in found] == [f"epoch=0-step={s}.ckpt" for s in (2, 4, 6)]
    assert all(
        Path(f.path).parent == folder and saves.why_unloadable(f.path) is None for f in found
    )
    assert (folder / "last.ckpt").exists()  # written, never published
    assert json.loads((exec_dir / saves.KEEP_RECORD).read_text())["keep"] == 1


def test_outside_dispatch_lightning_is_left_alone(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "out", every_n_train_steps=2, save_top_k=1)
    callback = DispatchCallback()
    assert resume_from_checkpoint("last") == "last"
    fit(tmp_path, 6, [checkpoint, callback])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["epoch=0-step=6.ckpt"]
    assert callback.publications == []


def test_requeue_signal_saves_at_the_next_batch_end_publishes_and_requeues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        "slurm_dispatch.integrations.lightning.is_shared_checkpoint", lambda execution: False
    )
    marker = tmp_path / "requeued"
    callback = DispatchCallback(requeue_command=["touch", str(marker)])
    trainer, model = fit(tmp_path, 50, [callback], model=Tiny(signal_at=5))
    assert model.saved_in_handler is False
    assert trainer.global_step == 6  # stopped after the batch that got the signal
    save = exec_dir / "checkpoints" / "requeue-step=6.ckpt"
    found = store.list_publications(str(root))
    # Lightning's default ModelCheckpoint also saves as the loop stops: published too.
    assert str(save) in [f.path for f in found] and {f.step for f in found} == {6}
    assert marker.exists() and callback.requeued
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)  # handed back

    # The requeued execution resumes from it, with its weights.
    dispatch_env(root, "b", E2, str(save), monkeypatch)
    stored = torch.load(save, map_location="cpu", weights_only=False)["state_dict"]
    trainer, model = fit(tmp_path, 10, [DispatchCallback()], ckpt_path=resume_from_checkpoint())
    assert model.start_step == 6 and model.start_weights == weights_hash(stored)
    assert trainer.global_step == 10


def test_a_shared_checkpoint_job_is_never_requeued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        "slurm_dispatch.integrations.lightning.is_shared_checkpoint", lambda execution: True
    )
    marker = tmp_path / "requeued"
    callback = DispatchCallback(requeue_command=["touch", str(marker)])
    # Stopped at the signal and not requeued: it must not end COMPLETED (the supervisor would
    # stop for good), but failed, so that its rule (a hold, for a shared checkpoint) applies.
    with pytest.raises(NotRequeued) as stopped:
        fit(tmp_path, 50, [callback], model=Tiny(signal_at=3))
    assert {f.step for f in store.list_publications(str(root))} == {4}
    assert not marker.exists()
    assert "not requeuing the job: it shares its checkpoint" in capfd.readouterr().err
    assert "it shares its checkpoint" in str(stopped.value) and "hold" in str(stopped.value)


@pytest.mark.parametrize(
    "command",
    [
        [
            "sh",
            "-c",
            "echo 'scontrol: error: Requested operation is presently disabled' >&2; exit 1",
        ],
        ["/nonexistent/scontrol", "requeue", "42"],
    ],
)
def test_a_requeue_slurm_refuses_ends_the_job_failed_after_publishing_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """A job Slurm will not requeue (``--no-requeue``, ``JobRequeue=0``)
    stopped at the signal; had ``fit`` returned, the job would exit 0, COMPLETED, and the
    supervisor would stop for good.  The save is published, then ``fit`` raises, saying what
    happened and what the resubmit rule will do, so the job ends FAILED."""
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        "slurm_dispatch.integrations.lightning.is_shared_checkpoint", lambda execution: False
    )
    callback = DispatchCallback(requeue_command=command)
    model = Tiny(signal_at=5)
    with pytest.raises(NotRequeued) as stopped:
        fit(tmp_path, 50, [callback], model=model)
    assert model.trainer.global_step == 6  # stopped after the batch that got the signal
    save = exec_dir / "checkpoints" / "requeue-step=6.ckpt"
    assert str(save) in [f.path for f in store.list_publications(str(root))]
    assert saves.why_unloadable(str(save)) is None
    text = str(stopped.value)
    assert " ".join(command) in text and str(save) in text, text
    assert (
        "Requested operation is presently disabled" in text
        if command[0] == "sh"
        else "No such file" in text
    ), text
    assert "resubmit" in text and "FAILED" in text
    assert not callback.requeued
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None)  # handed back
    assert "save_checkpoint" not in model.trainer.__dict__  # unwrapped


@pytest.mark.parametrize("inside", [True, False])
def test_a_sigterm_never_ends_the_process_0_inside_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], inside: bool
) -> None:
    """Lightning turns SIGTERM into SystemExit with no code (status 0), so
    with `--signal=TERM@` the job would end COMPLETED, training unfinished, and the supervisor
    would stop for good.  Inside dispatch the callback makes the exit 128+15, said on
    stderr; outside, Lightning's own exit is left as it is."""
    if inside:
        dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stopped:
            fit(tmp_path, 50, [DispatchCallback()], model=Tiny(signal_at=3, signum=signal.SIGTERM))
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capfd.readouterr().err
    if inside:
        assert stopped.value.code == 128 + signal.SIGTERM
        assert (
            "dispatch: the trainer stopped at SIGTERM with status 0: its work is not done, "
            "so the process exits 143"
        ) in err, err
    else:
        assert stopped.value.code is None
        assert "dispatch:" not in err


def test_the_callback_records_progress_and_marks_each_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled job (docs/user-guide.md): each batch's end is progress, each save no stall."""
    from slurm_dispatch.execution import steps

    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    seen: list[Any] = []

    class Probe(L.Callback):  # type: ignore[misc]
        def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: Any) -> None:
            seen.append(steps.read(str(exec_dir)))  # inside Trainer.save_checkpoint

    checkpoint = ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)
    fit(tmp_path, 4, [checkpoint, DispatchCallback(), Probe()])
    assert [(r["step"], r["saving"]) for r in seen] == [(2, True), (4, True)]
    last = steps.read(str(exec_dir))
    assert last is not None and (last["step"], last["saving"], last["saves"]) == (4, False, 2)
    # fit() returned: a trainer.test() or an export after it is no stall, however long.
    assert last.get("ended") is True


def test_the_wait_for_the_last_publication_is_inside_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After Lightning's save the callback waits for the previous save's
    background seal and publication (and syncs every rank's files on several ranks): on a
    busy file system that is a slow save, never a stall; the record says saving meanwhile."""
    from slurm_dispatch.execution import steps

    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    callback = DispatchCallback()
    seen: list[Any] = []
    original = callback._publisher.submit

    def submit(work: Any) -> None:  # the training thread, before it waits for the last one
        seen.append(steps.read(str(exec_dir)))
        original(work)

    monkeypatch.setattr(callback._publisher, "submit", submit)
    checkpoint = ModelCheckpoint(
        dirpath=str(exec_dir / "checkpoints"), every_n_train_steps=2, save_top_k=-1
    )
    fit(tmp_path, 4, [checkpoint, callback])
    assert [(r["step"], r["saving"]) for r in seen] == [(2, True), (4, True)], seen


def test_a_validation_run_is_marked_and_its_end_is_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long validation is no stall (the sanity check before the first step
    is not marked: before the first record nothing counts)."""
    from slurm_dispatch.execution import steps

    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    seen: list[Any] = []

    class Validated(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            seen.append(steps.read(str(exec_dir)))

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4
    )
    trainer = L.Trainer(
        max_steps=4,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path / "user"),
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=1,
        callbacks=[DispatchCallback()],
    )
    trainer.fit(Validated(), data, data)
    assert seen[0] is None  # the sanity check: no record yet, nothing marked
    assert [(r["step"], r["saving"], r["what"]) for r in seen[1:]] == [
        (2, True, "evaluation"),
        (4, True, "evaluation"),
    ]
    last = steps.read(str(exec_dir))
    assert last is not None and last["saving"] is False and last["saves"] == 2
