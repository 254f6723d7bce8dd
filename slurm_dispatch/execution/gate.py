"""The launcher's gate for a requeued execution: a stop the job's record already gives is
applied before the script runs (docs/user-guide.md, "Slurm's requeues on a budget of their own").

The supervisor's pass holds Slurm's requeued job, pending, once the lineage's requeues went
past ``--max-requeues`` or its last executions made no progress (``--max-no-progress``).  A
requeued job Slurm starts again before any pass sees it pending slips past both: an expedited
requeue (``--requeue=expedite``, 25.11) starts at once, a site's requeue delay may be shorter
than the pass interval, and no supervisor may run at all.  So the launcher, at an isolated
job's requeued execution (restart count above 0), asks the supervisor's own questions of the
record (:func:`noprogress.requeues_used` with :func:`rules.requeues_spent`;
:func:`noprogress.streak`) and, where a stop applies, does not run the script: it records the
event the supervisor records (``requeues-spent`` or ``no-progress``, held, with ``at_start``,
under the supervisor's key), requeues its own execution held (``scontrol requeuehold``, its
SLUID where Slurm gives one), which leaves the job pending and held as the supervisor's hold
does, and ends with exit 2, saying why on stderr.  ``dispatch release`` lifts it as it lifts
the supervisor's hold; the execution that follows finds the stop recorded and runs.

Invariants: a job whose budgets are not spent, a shared-checkpoint job (its submission's claim
is its gate, :func:`..launch.claim_shared`) and a first execution (restart 0: a submission the
supervisor or a person made) run as before; a root that cannot be listed runs the script (not
knowing is no proof of a loop, as for the supervisor), and so does a gate that cannot decide
(a fault of ours: the launcher fails open, as the hooks do); the decision is recorded before the
requeue, so the end Slurm then gives the execution cannot lose it, and where the requeue fails
the record says so after it (the job ends; nothing holds it), unless the controller did not
answer in time (it may have taken the requeue: the record keeps the hold).
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any, Optional

from ..control import events, noprogress, record, rules
from ..errors import DispatchError


class StoppedAtStart(DispatchError):
    """A requeued execution the record stops before its script (exit 2)."""


class _Stop:
    """What the gate records: an event kind, its once key and its fields."""

    def __init__(self, kind: type[events.Event], once: str, fields: dict[str, Any]) -> None:
        self.kind, self.once, self.fields = kind, once, fields


_RELEASED = _Stop(events.Event, "", {})  # this requeue was held before: a person released it


def display_id(env: dict[str, str], task: Optional[int]) -> str:
    """The Slurm job as the supervisor names it: ``A_T`` for an array's task."""
    array = env.get("SLURM_ARRAY_JOB_ID", "")
    return f"{array}_{task}" if array and task is not None else env.get("SLURM_JOB_ID", "")


def check(
    job: record.JobRecord,
    submission: int,
    restart: int,
    task: Optional[int],
    env: dict[str, str],
    target: str,
    slurm: Any = None,
) -> None:
    """Return where the execution runs its script; else record the stop, requeue the job held
    (``target``: the execution's SLUID, else its job id) and raise :class:`StoppedAtStart`."""
    if job.spec.get("shared_checkpoint") or restart <= 0:
        return
    shown = display_id(env, task)
    try:
        line = job.history().lineage(task)
        stop = _requeues(job, line, submission, restart, shown)
    except Exception as exc:  # noqa: BLE001 - a fault of ours: the launcher fails open
        sys.stderr.write(
            "dispatch-launch: cannot tell whether this requeued execution is past "
            f"--max-requeues or --max-no-progress, so it runs: {type(exc).__name__}: {exc}\n"
        )
        return
    if stop is None or stop is _RELEASED:
        return
    made = job.append(stop.kind, once=stop.once, **stop.fields)
    said = _text(made or events.new(stop.kind, time.time_ns(), **stop.fields), job.id)
    # Slurm ends this batch step once it takes the requeue: what follows must still be said.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if slurm is None:
        from ..slurm.adapter import Slurm

        slurm = Slurm(attempts=1, timeout=30)
    try:
        slurm.requeue_hold(target, env)
    except DispatchError as exc:
        # Not where another execution of this requeue recorded it (and held), nor where the
        # controller did not answer in time (it may have taken the requeue: held after all).
        if made is not None and not _timed_out(exc):
            _not_held(job, stop, f"exit 2 (`scontrol requeuehold {target}` failed: {exc})")
        raise StoppedAtStart(
            f"{said}.  This requeued execution (restart {restart}) does not run the script; "
            f"but `scontrol requeuehold {target}` failed ({exc}), so it ends with exit 2 "
            "instead: `dispatch status` says what follows"
        ) from None
    raise StoppedAtStart(
        f"{said}.  Slurm started the requeued job before a `dispatch supervise` pass could "
        f"hold it, so this execution (restart {restart}) does not run the script: it "
        f"requeued itself held (`scontrol requeuehold {target}`)"
    )


def _timed_out(exc: DispatchError) -> bool:
    """Whether a Slurm command's failure is a controller that did not answer in time."""
    text = str(exc)
    return "did not answer" in text or "timed out" in text.lower()


def _not_held(job: record.JobRecord, stop: _Stop, end: str) -> None:
    """The hold recorded before the requeue did not take: the execution ends (``end``) and
    its job with it, so the record says so after it, as the supervisor records a stop for
    an ended job (no progress: ``not resubmitted``, a person's resubmit goes on; requeues
    spent: the ended job's hold lifted, its end is the supervisor's to judge)."""
    if stop.kind is events.NoProgress:
        job.append(
            events.NoProgress,
            once=f"{stop.once}-ended",
            **{**stop.fields, "action": "not resubmitted", "end_state": end},
        )
    else:
        job.append(
            events.Released,
            slurm_job_id=stop.fields["slurm_job_id"],
            by=f"no one: the launcher's hold did not take, {end}",
            task=stop.fields["task"],
        )


def _requeues(
    job: record.JobRecord, line: events.Lineage, submission: int, restart: int, shown: str
) -> Optional[_Stop]:
    """The stop past ``--max-requeues``, :data:`_RELEASED` where this requeue was held
    before (a person released it: no other stop applies, as in the supervisor's pass), else
    the no-progress stop (:func:`_no_progress`)."""
    budget = job.spec.get("max_requeues")
    if isinstance(budget, int) and not isinstance(budget, bool):
        if any(e.slurm_job_id == shown and e.restarts == restart for e in line.requeues_spent):
            return _RELEASED
        used = noprogress.requeues_used(job, line, submission, restart, budget)
        if rules.requeues_spent(used, budget):
            # Held at restart + 1: the count the requeued job has, as a pass would see it.
            return _Stop(
                events.RequeuesSpent,
                f"requeues-{shown}-{restart + 1}".replace("_", "t"),
                {
                    "submission": submission,
                    "slurm_job_id": shown,
                    "restarts": restart + 1,
                    "used": used,
                    "budget": budget,
                    "task": line.task,
                    "at_start": restart,
                },
            )
    return _no_progress(job, line, submission, restart, shown)


def _no_progress(
    job: record.JobRecord, line: events.Lineage, submission: int, restart: int, shown: str
) -> Optional[_Stop]:
    """The stop for want of progress over the lineage's last executions, once per newest
    execution (recorded before: a person's release went on); None where none applies or
    the root cannot be listed (said, and the script runs)."""
    try:
        made, found, key = noprogress.due(job, line)
    except DispatchError as exc:  # not knowing is no proof of a loop
        sys.stderr.write(
            "dispatch-launch: cannot tell whether the executions before this "
            f"one made progress (--max-no-progress), so it runs: {exc}\n"
        )
        return None
    if made is not None or found is None:
        return None
    return _Stop(
        events.NoProgress,
        key,
        {
            "submission": submission,
            "slurm_job_id": shown,
            "limit": noprogress.limit_of(job),
            "action": "held",
            "end_state": "requeued by Slurm",
            "task": line.task,
            "at_start": restart,
            **found.fields(),
        },
    )


def _text(stop: Optional[events.Event], job_id: str) -> str:
    if isinstance(stop, events.NoProgress):
        return noprogress.stop_text(stop, job_id)
    assert isinstance(stop, events.RequeuesSpent)
    return (
        f"Slurm requeued it {stop.used} time(s), past its --max-requeues {stop.budget}: "
        f"Slurm job {stop.slurm_job_id} is held; `dispatch release {job_id}` lets it run"
    )
