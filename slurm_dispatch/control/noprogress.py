"""Executions in a row that made no progress: the count behind ``--max-no-progress``, and
the saves that made them fail, behind ``--quarantine-after``.

An execution made progress when one of its own publications (a save in its execution folder)
is past the save it resumed from (:func:`slurm_dispatch.checkpoint.progress.went_on`).  The
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
        return {"executions": [[s.submission, s.restart, s.attempt] for s in self.executions],
                "resumed_from": self.resumed_from}


def root_of(job: record.JobRecord, task: Optional[int]) -> str:
    """The root of a lineage: the job's, or an array task's own (%a)."""
    root = str(job.spec["checkpoint"])
    if task is not None and roots.per_task(root):
        return roots.for_task(root, task)
    return roots.one_root(root)


def _listing(root: str) -> list[store.Found]:
    if not store.is_s3_root(root) and not os.path.lexists(root):
        return []
    return store.list_publications(root)


def _own(start: events.Started, listing: list[store.Found]) -> list[tuple[str, int]]:
    """(path, step) of every publication of the execution ``start`` (its folder's saves)."""
    folder = start.exec_dir.rstrip("/")
    return [(f.path, f.step) for f in listing if folder and f.path.startswith(folder + "/")]


def poisoned(job: record.JobRecord, line: events.Lineage, limit: int) -> Optional[Streak]:
    """The lineage's last ``limit`` executions when they all resumed from one save and none
    published anything (``--quarantine-after``), else None.  Lists the root only then."""
    started = sorted(line.started, key=lambda s: (s.epoch, s.ns))
    if limit <= 0 or len(started) < limit:
        return None
    last = started[-limit:]
    if not last[0].resume_from or any(s.resume_from != last[0].resume_from for s in last):
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
    listing = _listing(root_of(job, line.task))
    steps = {found.path: found.step for found in listing}
    went = []
    for start in last:
        source = start.resume_from
        went.append(progress.went_on(steps.get(source) if source else None, source,
                                     _own(start, listing)))
    if not rules.stalled(went, limit):
        return None
    saves: list[str] = []
    for start in last:
        if start.resume_from not in saves:
            saves.append(start.resume_from)
    return Streak(last, saves)


def stop_text(stop: events.NoProgress, job_id: str = "") -> str:
    """One line for a person: which executions, from which save, and what was done; with
    ``job_id``, the command that goes on."""
    runs = runs_text(stop.executions)
    saves = " or ".join(s or "nothing (a fresh start)" for s in stop.resumed_from) or "?"
    task = "" if stop.task is None else f"--task {stop.task} "
    if stop.action == "held":
        done = f"Slurm job {stop.slurm_job_id} is held"
        go_on = f": `dispatch release {job_id}` lets it run again"
    else:
        done = f"not resubmitted after {stop.end_state or 'its end'}"
        go_on = f": `dispatch resubmit {task}{job_id}` submits it again"
    return (f"{len(stop.executions)} execution(s) in a row ({runs}) published nothing past "
            f"the save they resumed from, {saves} (--max-no-progress {stop.limit}); {done}"
            + (go_on if job_id else ""))


def runs_text(executions: list[list[object]]) -> str:
    """``S1 R0, S2 R0`` for [submission, restart, attempt] lists."""
    return ", ".join(f"S{e[0]} R{e[1]}" if isinstance(e, list) and len(e) > 1 else str(e)
                     for e in executions)


def quarantine_text(event: events.Quarantined, root: str = "") -> str:
    """One line for a person: the save, why, and (with ``root``) the command that lifts it."""
    return (f"{event.save}: {len(event.executions)} execution(s) in a row "
            f"({runs_text(event.executions)}) resumed from it and failed before publishing "
            "anything; the next one falls back past it"
            + (f" (`dispatch unquarantine --root {root} {event.save}` lifts it)" if root
               else ""))
