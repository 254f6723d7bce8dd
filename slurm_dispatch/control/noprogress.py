"""Executions in a row that made no progress: the count behind ``--max-no-progress``, and
the saves that made them fail, behind ``--quarantine-after``.

An execution made progress when one of its own publications (a save in its execution folder,
or one published with its epoch) is past the save it resumed from
(:func:`slurm_dispatch.checkpoint.progress.went_on`): the launcher's choice, or the save its
integration loaded instead where it passed over an unloadable one and recorded it.  The
record holds which save each execution resumed from (its start) and the root holds what it
published, so the supervisor counts, before each restart of a lineage, how many of its last
executions made none (:func:`slurm_dispatch.control.rules.stalled`), and whether its last
executions all resumed from one save and failed before publishing anything (:func:`poisoned`:
the supervisor quarantines that save, :mod:`slurm_dispatch.checkpoint.quarantine`).

Invariants: the root is listed once per question, only where the job's limit could be reached
(at least that many executions started); an execution that has not recorded a start is not
counted (it ran nothing); a root that cannot be listed is an error for the caller, which then
restarts the job as before (not knowing is no proof of a loop).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..checkpoint import progress, roots
from ..checkpoint import publish as store
from ..errors import DispatchError
from . import events, record, rules


def limit_of(job: record.JobRecord, key: str = "max_no_progress") -> int:
    """The job's ``--max-no-progress`` (or, with ``key`` ``quarantine_after``, its
    ``--quarantine-after``); 0 (off) for a record made before the option."""
    value = job.spec.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class Streak:
    """The last ``limit`` executions of a lineage, none of which made progress."""

    executions: list[events.Started]
    resumed_from: list[str]  # the saves they started from, in order, once each ('' fresh)

    def fields(self) -> dict[str, object]:
        """The :class:`events.NoProgress` fields it gives."""
        return {
            "executions": [[s.submission, s.restart, s.attempt] for s in self.executions],
            "resumed_from": self.resumed_from,
        }


def root_of(job: record.JobRecord, task: Optional[int]) -> str:
    """The root of a lineage: the job's, or an array task's own (%a)."""
    root = str(job.spec["checkpoint"])
    if task is not None and roots.per_task(root):
        return roots.for_task(root, task)
    return roots.one_root(root)


def _listing(root: str) -> list[store.Found]:
    if not store.is_remote_root(root) and not os.path.lexists(root):
        return []
    return store.list_publications(root)


def _own(start: events.Started, listing: list[store.Found]) -> list[tuple[str, int]]:
    """(path, step) of every publication of the execution ``start``: its folder's saves, and
    any save under the root published with its epoch (``dispatch publish`` takes any path
    inside the root; no other execution has that epoch)."""
    folder = start.exec_dir.rstrip("/")
    return [
        (f.path, f.step)
        for f in listing
        if (folder and f.path.startswith(folder + "/")) or (start.epoch and f.epoch == start.epoch)
    ]


def _loaded(root: str, start: events.Started) -> Optional[str]:
    """The save the execution's integration finally loaded where it recorded one other than
    the launcher's choice (it passed over an unloadable save: ``.dispatch-resume.json``,
    '' for a fresh start); None where none is recorded or it cannot be read."""
    from ..checkpoint import execdir

    try:
        data = execdir.load(store.open_store(root).read_exec_file(start.attempt, execdir.RESUME))
    except (DispatchError, OSError):
        return None
    loaded = data.get("resume_from") if data else None
    return loaded if isinstance(loaded, str) and loaded != start.resume_from else None


def failed(line: events.Lineage, start: events.Started, current: int) -> bool:
    """Whether the execution ``start`` ended in a failure that may be its save's doing
    (:data:`rules.POISON_ENDS`), as the record says: one Slurm requeued (a later restart of its
    submission started) did not; the last one of an earlier submission ended as the reason of
    the submission after it begins (``failed (budget 3)``), a restart that ``--restart-on-exit``
    made free (``budget not spent``: a transient error, the script says) and a person's
    resubmission (``manual``) not counted; one of submission ``current`` (the one ending now)
    is taken as failed, the caller asking only then."""
    later = [s for s in line.started_for(start.submission) if s.restart > start.restart]
    if later:
        return False
    if start.submission == current:
        return True
    after = line.submission(start.submission + 1)
    reason = after.reason if after is not None else ""
    return (
        any(
            reason.startswith(end + " ") or reason.startswith(end + ":")
            for end in rules.POISON_ENDS
        )
        and rules.FREE not in reason
    )


def poisoned(
    job: record.JobRecord, line: events.Lineage, limit: int, current: int
) -> Optional[Streak]:
    """The lineage's last ``limit`` executions when they all resumed from one save, each
    :func:`failed` and none published anything (``--quarantine-after``), else None; submission
    ``current`` is the one that failed now.  Lists the root only then."""
    started = sorted(line.started, key=lambda s: (s.epoch, s.ns))
    if limit <= 0 or len(started) < limit:
        return None
    last = started[-limit:]
    if not last[0].resume_from or any(s.resume_from != last[0].resume_from for s in last):
        return None
    if not all(failed(line, start, current) for start in last):
        return None
    listing = _listing(root_of(job, line.task))
    if any(_own(start, listing) for start in last):
        return None
    return Streak(last, [last[0].resume_from])


def streak(job: record.JobRecord, line: events.Lineage, limit: int) -> Optional[Streak]:
    """The lineage's last ``limit`` executions when none made progress, else None.  Lists the
    lineage's root once (a StoreError or other DispatchError reaches the caller)."""
    started = sorted(line.started, key=lambda s: (s.epoch, s.ns))
    if limit <= 0 or len(started) < limit:
        return None
    last = started[-limit:]
    root = root_of(job, line.task)
    listing = _listing(root)
    steps = {found.path: found.step for found in listing}
    went = []
    for start in last:
        own = _own(start, listing)
        sources = [start.resume_from]
        if own and start.resume_from and start.attempt:
            # Past what it loaded: an integration may have passed over the launcher's choice.
            loaded = _loaded(root, start)
            sources += [] if loaded is None else [loaded]
        went.append(
            any(
                progress.went_on(steps.get(source) if source else None, source, own)
                for source in sources
            )
        )
    if not rules.stalled(went, limit):
        return None
    saves: list[str] = []
    for start in last:
        if start.resume_from not in saves:
            saves.append(start.resume_from)
    return Streak(last, saves)


def requeues_used(
    job: record.JobRecord, line: events.Lineage, current: int, restarts: int, budget: int
) -> int:
    """How many of Slurm's requeues the lineage has used (``--max-requeues``) once submission
    ``current``'s restart count is ``restarts``: the restarts of each submission, less the
    requeues the launcher made itself to hold a job at an execution's start (recorded with
    ``at_start``), and, where that is past ``budget``, less the job's own requeues at its
    warning signal (:func:`own_requeues`: they are its continuation, not Slurm's)."""
    counted = {
        sub.submission: max((s.restart for s in line.started_for(sub.submission)), default=0)
        for sub in line.submissions
        if sub.submission != current
    }
    counted[current] = restarts
    stops = [(e.at_start, e.submission) for e in line.requeues_spent] + [
        (e.at_start, e.submission) for e in line.no_progress
    ]
    held = [at for at, sub in stops if at is not None and at < counted.get(sub, 0)]
    used = sum(counted.values()) - len(held)
    if rules.requeues_spent(used, budget):
        used -= own_requeues(job, line, current, restarts)
    return used


def due(
    job: record.JobRecord, line: events.Lineage
) -> tuple[Optional[events.NoProgress], Optional[Streak], str]:
    """The lineage's stop for want of progress before its next execution: (the stop recorded
    for its newest execution, None, '') where there is one (a person's release or resubmission
    goes on past it), else (None, the :func:`streak` found, the stop's once key), else (None,
    None, '') where none applies.  A root that cannot be listed raises (DispatchError)."""
    limit = limit_of(job)
    newest = max(line.started, key=lambda s: (s.epoch, s.ns), default=None)
    if limit <= 0 or newest is None:
        return None, None, ""
    made = [e for e in line.no_progress if e.last_attempt == newest.attempt]
    if made:
        return made[-1], None, ""
    found = streak(job, line, limit)
    return None, found, f"no-progress-{newest.attempt}" if found is not None else ""


def own_requeues(job: record.JobRecord, line: events.Lineage, current: int, restarts: int) -> int:
    """How many of the lineage's requeues were the job's own, at its warning signal: an
    execution that Slurm requeued (a later restart of its submission started, or, of
    submission ``current``, whose restart count is now ``restarts``) and whose integration
    marked its folder before asking (``.dispatch-requeued.json``).  Reads one file per
    requeued execution; one that cannot be read counts as Slurm's requeue."""
    from ..checkpoint import execdir

    def requeued(start: events.Started) -> bool:
        if start.submission == current:
            return start.restart < restarts
        return any(s.restart > start.restart for s in line.started_for(start.submission))

    found = [start for start in line.started if start.attempt and requeued(start)]
    if not found:
        return 0
    try:
        st = store.open_store(root_of(job, line.task))
    except (DispatchError, OSError):
        return 0
    own = 0
    for start in found:
        try:
            own += st.read_exec_file(start.attempt, execdir.REQUEUED) is not None
        except (DispatchError, OSError):
            continue
    return own


def stop_text(stop: events.NoProgress, job_id: str = "") -> str:
    """One line for a person: which executions, from which save, and what was done; with
    ``job_id``, the command that goes on (:func:`rules.no_progress_text`)."""
    return rules.no_progress_text(
        stop.executions,
        stop.resumed_from,
        stop.limit,
        stop.action,
        stop.end_state,
        slurm_job_id=stop.slurm_job_id,
        task=stop.task,
        job_id=job_id,
    )


@dataclass(frozen=True)
class Finding:
    """A lineage's stop for want of progress before its next restart, gathered for the rule
    table (:class:`rules.Facts`): ``stop`` (None where none applies), ``key`` the once key
    to record it under where it was found now ('' where it was recorded before), and
    ``unknown`` why it could not be told ('' where it could)."""

    stop: Optional[rules.WithoutProgress] = None
    key: str = ""
    unknown: str = ""


def finding(job: record.JobRecord, line: events.Lineage) -> Finding:
    """:func:`due`, as plain data: a root that cannot be listed is said in ``unknown``
    (not knowing is no proof of a loop: the job is restarted as before)."""
    limit = limit_of(job)
    try:
        made, found, key = due(job, line)
    except DispatchError as exc:
        return Finding(
            unknown=f"cannot tell whether its last {limit} executions made progress, so it "
            f"is restarted as before: {exc}"
        )
    if made is not None:
        return Finding(
            rules.WithoutProgress(
                made.executions,
                made.resumed_from,
                made.limit,
                job.id,
                line.task,
                recorded=stop_text(made, job.id),
            )
        )
    if found is None:
        return Finding()
    executions: list[list[object]] = [
        [s.submission, s.restart, s.attempt] for s in found.executions
    ]
    return Finding(
        rules.WithoutProgress(executions, found.resumed_from, limit, job.id, line.task), key
    )


def kept_text(found: Streak, root: str) -> str:
    """One line for a person: the save the executions of ``found`` resumed from, which looks
    poisoned but is the last one to resume from, so not quarantined, and the command that
    quarantines it."""
    save, executions = found.resumed_from[0], found.executions
    runs = ", ".join(f"S{s.submission} R{s.restart}" for s in executions)
    return (
        f"{save}: {len(executions)} execution(s) in a row ({runs}) "
        "resumed from it and failed before publishing anything, but it is not "
        "quarantined: no save is published below it, so the next execution would start "
        "afresh (its saves then outranking this one); "
        f"`dispatch quarantine --root {root} {save}` does it"
    )


def quarantine_text(event: events.Quarantined, root: str = "") -> str:
    """One line for a person: the save, why, and (with ``root``) the command that lifts it."""
    return (
        f"{event.save}: {len(event.executions)} execution(s) in a row "
        f"({rules.runs_text(event.executions)}) resumed from it and failed before publishing "
        "anything; the next one falls back past it"
        + (f" (`dispatch unquarantine --root {root} {event.save}` lifts it)" if root else "")
    )
