"""Save before the limit, framework-neutral: the warning signal taken as a flag, and the
requeue that follows the save made at the next safe point.  Imports no training library;
the Lightning and Hugging Face callbacks use it the same way.

Invariants (docs/invariants.md, 6; docs/user-guide.md, "Saving before the time limit"):

* The handler only sets a flag: nothing is saved or requeued inside a signal handler.  The
  framework's callback saves at its next step boundary, publishes that save as every save is
  published, and only then asks :func:`requeue`.
* A ``--shared-checkpoint`` job, or one whose dispatch record cannot be read, is never
  requeued (it restarts only after a proof or a person); a requeue Slurm refuses
  (``--no-requeue``, ``JobRequeue=0``) or that cannot be run is said.  Either way
  :func:`requeue` returns why, and the callback ends the run with :class:`NotRequeued` so the
  job ends FAILED, never COMPLETED (where the supervisor stops for good).
* Before the requeue is asked, the execution's folder is marked (``.dispatch-requeued.json``):
  ``dispatch supervise``'s ``--max-requeues`` counts Slurm's requeues, not this one.
* The signal is the job's ``--warn-before`` one (its record), else SIGUSR1.
* A stalled execution (the launcher's stall watcher marked its folder before it sent the
  signal: :mod:`slurm_dispatch.execution.stall`) is never requeued: it saves, then ends with
  :class:`NotRequeued`, so it counts as failed and the rule for a failure applies.
* The requeue names this execution, not the job, where Slurm gives the execution an id of its
  own (``SLURM_JOB_SLUID``, 26.05 and later; scontrol takes a SLUID wherever it takes a job
  id, and a requeue draws the job a new one): a late call from an old execution (a straggler,
  a node cut off that comes back) then names no job and fails, instead of requeuing the
  execution that replaced it.  Older releases have no such id: there the job id is named, and
  a late call requeues whatever execution of the job runs then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import Any, Callable, Optional, Union

from ..control import record
from ..errors import DispatchError
from ..execution.saves import Execution
from ..execution.stall import stalled_here
from ..slurm.cli_backend import requeue_argv

DEFAULT_SIGNAL = signal.SIGUSR1


def job_spec(execution: Execution) -> Optional[dict[str, Any]]:
    """The execution's dispatch job's spec, or None when it cannot be read."""
    if not execution.job:
        return None
    try:
        return dict(record.open_job(execution.job).spec)
    except (DispatchError, OSError, ValueError, KeyError):
        return None


def is_shared_checkpoint(execution: Execution) -> Optional[bool]:
    """Whether the execution's dispatch job shares its checkpoint; ``None`` when its record
    cannot be read (then it is treated as shared: no restart behind dispatch's back)."""
    spec = job_spec(execution)
    return None if spec is None else bool(spec.get("shared_checkpoint"))


def warning_signal(execution: Execution) -> int:
    """The signal the job's ``--warn-before TIME[:SIGNAL]`` asks Slurm to send; SIGUSR1 when
    it gives none (or its record cannot be read)."""
    spec = job_spec(execution) or {}
    warn = spec.get("warn_before")
    if isinstance(warn, (list, tuple)) and warn:
        found = getattr(signal, f"SIG{str(warn[0]).upper().removeprefix('SIG')}", None)
        if isinstance(found, int):
            return int(found)
    return int(DEFAULT_SIGNAL)


Handler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


class SignalFlag:
    """A signal taken as a flag (``raised``), the previous handler kept to hand back."""

    def __init__(self) -> None:
        self.raised = False
        self.signum: Optional[int] = None
        self._previous: Handler = None

    def take(self, signum: int) -> None:
        """Install the flag's handler for ``signum`` (only the main thread can)."""
        if self.signum is None and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signum, self._on_signal)
            self.signum = int(signum)

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.raised = True  # nothing else inside the handler

    def hand_back(self) -> None:
        if self.signum is not None and threading.current_thread() is threading.main_thread():
            signal.signal(
                self.signum, self._previous if self._previous is not None else signal.SIG_DFL
            )
            self.signum = None


def mark_own_requeue(execution: Execution, save: str) -> None:
    """Mark the execution's folder (``.dispatch-requeued.json``) before its own requeue: the
    supervisor's ``--max-requeues`` counts Slurm's requeues (node failure, preemption), not
    the job's continuation at its warning signal.  A mark that cannot be written is said,
    and the requeue then counts as Slurm's."""
    from ..checkpoint import execdir
    from ..checkpoint import publish as store

    attempt = execution.attempt or execution.exec_dir.rstrip("/").rsplit("/", 1)[-1]
    try:
        execdir.mark_requeued(store.open_store(execution.root), attempt, save)
    except (DispatchError, OSError) as exc:
        sys.stderr.write(
            f"dispatch: cannot mark this execution's own requeue in its folder "
            f"({exc}): --max-requeues counts it as Slurm's\n"
        )


def requeue(
    save: str,
    shared: Optional[bool],
    command: Optional[list[str]] = None,
    execution: Optional[Execution] = None,
) -> Optional[str]:
    """After ``save`` was published at the warning signal: requeue the job (``execution``'s
    folder marked first, :func:`mark_own_requeue`).  None when Slurm took it, else what
    happened and what comes next (the message of the
    :class:`~slurm_dispatch.errors.NotRequeued` the job ends with)."""
    after = (
        "so it ends with this error: Slurm records it FAILED, not COMPLETED, and "
        "dispatch's rule for a failed job applies"
    )
    stalled = stalled_here()
    if stalled is not None:
        step = stalled.get("step")
        why = f"stalled: no progress for {stalled.get('seconds')} s since " + (
            f"step {step}" if step is not None else "its last record"
        )
        sys.stderr.write(
            f"dispatch: saved and published {save} at the stall watcher's "
            f"signal ({why}); not requeuing the job\n"
        )
        return f"{why} (--stall-timeout): published {save} at the signal, not requeued, {after}"
    if shared is not False:
        why = "it shares its checkpoint" if shared else "its dispatch record could not be read"
        sys.stderr.write(
            "dispatch: saved and published at the requeue signal; not "
            f"requeuing the job: {why}, so it restarts only after a proof "
            "or a person\n"
        )
        return (
            f"stopped at the requeue signal and published {save}, but not requeued: "
            f"{why}, {after}: while its --resubmit budget lasts, a hold until the "
            "old execution is proven gone or a person releases it (`dispatch "
            "status` shows it)"
        )
    target = own_execution()
    command = command or requeue_argv([target])
    if execution is not None:
        mark_own_requeue(execution, save)
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        failed = f"could not run ({exc.strerror or exc})"
    else:
        if result.returncode == 0:
            sys.stderr.write(
                f"dispatch: saved and published {save} at the requeue signal; requeued the job\n"
            )
            return None
        failed = f"failed (exit {result.returncode}): {result.stderr.strip()}"
    refused = (
        "as Slurm refuses for a job submitted with --no-requeue or where JobRequeue=0"
        if target == slurm_job_id()
        else f"as Slurm refuses for a job submitted with --no-requeue or where JobRequeue=0, "
        f"or when {target}, this execution's SLUID, names no job any more: the job was "
        "requeued or ended since, and whatever runs now is left alone"
    )
    message = (
        f"stopped at the requeue signal and published {save}, but "
        f"`{' '.join(command)}` {failed}; the job was not requeued ({refused}), {after}: "
        "`dispatch supervise` resubmits it while its --resubmit budget lasts, "
        "and the resubmission resumes from that save; with no budget left the "
        "job stops"
    )
    sys.stderr.write(f"dispatch: {message}\n")
    return message


def own_execution() -> str:
    """What the job's own requeue names: its execution's SLUID where Slurm gives one
    (``SLURM_JOB_SLUID``, 26.05 and later), so that only this execution is requeued; else
    the job id (``A_T`` for an array's task)."""
    sluid = os.environ.get("SLURM_JOB_SLUID", "")
    if 0 < len(sluid) <= 64 and sluid.isascii() and sluid.isalnum():
        return sluid
    return slurm_job_id()


def slurm_job_id() -> str:
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job:
        return f"{array_job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return os.environ.get("SLURM_JOB_ID", "")
