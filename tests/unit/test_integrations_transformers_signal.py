"""Save before the limit with the real ``transformers.Trainer`` on the CPU
(docs/user-guide.md, saving before the time limit):
the warning signal arrives mid-epoch, between two ``save_steps``; the callback has the Trainer
save at the next step boundary, publishes that save, then requeues by the Lightning path's rules
(never a shared-checkpoint job; a refused requeue ends ``train()`` with ``NotRequeued``), hands
the signal back, and the next execution resumes from that save with its weights and step."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import transformers

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import NotRequeued
from slurm_dispatch.execution import saves
from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
from tests.unit.test_integrations_transformers import (
    E1,
    E2,
    StartProbe,
    dispatch_env,
    make_trainer,
    saved_weights_hash,
)

SIGNAL_IN_STEP = 5  # save_steps is 2: step 5 is no save step of the Trainer's own


class Warn(transformers.TrainerCallback):  # type: ignore[misc]
    """Sends the warning signal while step SIGNAL_IN_STEP runs (mid-epoch: 64 steps a epoch)."""

    def __init__(self, signum: int = signal.SIGUSR1) -> None:
        self.signum = signum
        self.saved_in_handler: Any = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == SIGNAL_IN_STEP - 1:
            folder = Path(os.environ.get("DISPATCH_EXEC_DIR", args.output_dir))
            before = set(folder.rglob("*"))
            os.kill(os.getpid(), self.signum)  # its handler has run when kill returns
            self.saved_in_handler = set(folder.rglob("*")) != before


def stopped_at_the_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: Any, command: list[str]
) -> tuple[str, NotRequeued]:
    """Train with the warning signal in step SIGNAL_IN_STEP until it raises NotRequeued;
    checks the save made at the signal is published; returns it and the error."""
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        "slurm_dispatch.integrations.transformers.is_shared_checkpoint", lambda execution: shared
    )
    callback = DispatchCallback(requeue_command=command)
    trainer = make_trainer(tmp_path / "o", 50, [Warn(), callback])
    with pytest.raises(NotRequeued) as stopped:
        trainer.train()
    save = str(exec_dir / f"checkpoint-{SIGNAL_IN_STEP}")
    assert save in [f.path for f in store.list_publications(str(root))]
    assert trainer.state.global_step == SIGNAL_IN_STEP and not callback.requeued
    assert save in str(stopped.value)
    return save, stopped.value


@pytest.fixture
def previous_handler() -> Any:
    """A handler of the test's own, so that a missing one fails the test instead of killing
    pytest; the callback must hand it back."""
    seen: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGUSR1, old)


def test_the_signal_mid_epoch_saves_at_the_next_step_publishes_requeues_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous_handler: list[int]
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        "slurm_dispatch.integrations.transformers.is_shared_checkpoint", lambda execution: False
    )
    marker = tmp_path / "requeued"
    callback, warn = DispatchCallback(requeue_command=["touch", str(marker)]), Warn()
    trainer = make_trainer(tmp_path / "o", 50, [warn, callback])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    save = exec_dir / f"checkpoint-{SIGNAL_IN_STEP}"
    assert warn.saved_in_handler is False and previous_handler == []
    assert trainer.state.global_step == SIGNAL_IN_STEP  # stopped at the step's end
    assert [(f.epoch, f.step, f.path) for f in store.list_publications(str(root))] == [
        (E1, 2, str(exec_dir / "checkpoint-2")),
        (E1, 4, str(exec_dir / "checkpoint-4")),
        (E1, SIGNAL_IN_STEP, str(save)),
    ]
    assert saves.why_unloadable(str(save), ("trainer_state.json",)) is None
    assert marker.exists() and callback.requeued
    # Its own requeue, marked for --max-requeues (not one of Slurm's).
    assert (exec_dir / ".dispatch-requeued.json").exists()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert previous_handler == [signal.SIGUSR1]  # handed back

    # The requeued execution resumes from it, with its weights and step.
    dispatch_env(root, "b", E2, str(save), monkeypatch)
    probe = StartProbe()
    resumed = make_trainer(tmp_path / "o", 8, [DispatchCallback(), probe])
    resumed.train(resume_from_checkpoint=resume_from_checkpoint())
    assert probe.step == SIGNAL_IN_STEP and probe.weights == saved_weights_hash(str(save))
    assert resumed.state.global_step == 8


def test_the_signal_the_job_names_is_the_one_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--warn-before 60:USR2``: USR2 is answered (read from the job's record)."""
    dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setattr(
        "slurm_dispatch.integrations.requeue.job_spec",
        lambda execution: {"warn_before": ["USR2", 60]},
    )
    monkeypatch.setattr(
        "slurm_dispatch.integrations.transformers.is_shared_checkpoint", lambda execution: False
    )
    marker = tmp_path / "requeued"
    trainer = make_trainer(
        tmp_path / "o",
        50,
        [Warn(signal.SIGUSR2), DispatchCallback(requeue_command=["touch", str(marker)])],
    )
    trainer.train()
    assert trainer.state.global_step == SIGNAL_IN_STEP and marker.exists()
    assert signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None)


@pytest.mark.parametrize("shared", [True, None], ids=["shared", "record-unreadable"])
def test_a_shared_checkpoint_job_saves_publishes_and_ends_failed_never_requeued(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    previous_handler: list[int],
    shared: Any,
) -> None:
    marker = tmp_path / "requeued"
    _save, stopped = stopped_at_the_signal(tmp_path, monkeypatch, shared, ["touch", str(marker)])
    assert not marker.exists()
    why = "it shares its checkpoint" if shared else "its dispatch record could not be read"
    assert f"not requeuing the job: {why}" in capfd.readouterr().err
    assert why in str(stopped) and "hold" in str(stopped)


def test_a_requeue_slurm_refuses_ends_train_with_not_requeued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous_handler: list[int]
) -> None:
    command = [
        "sh",
        "-c",
        "echo 'scontrol: error: Requested operation is presently disabled' >&2; exit 1",
    ]
    _save, stopped = stopped_at_the_signal(tmp_path, monkeypatch, False, command)
    text = str(stopped)
    assert "Requested operation is presently disabled" in text
    assert "resubmit" in text and "FAILED" in text
    os.kill(os.getpid(), signal.SIGUSR1)
    assert previous_handler == [signal.SIGUSR1]  # handed back before the error


def test_outside_dispatch_the_signal_is_not_taken(
    tmp_path: Path, previous_handler: list[int]
) -> None:
    trainer = make_trainer(tmp_path / "o", 8, [Warn(), DispatchCallback()])
    trainer.train()
    assert trainer.state.global_step == 8 and previous_handler == [signal.SIGUSR1]
