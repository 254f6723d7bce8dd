"""Dependencies on dispatch jobs: ``--dependency=afterok:<dispatch job>`` follows the job's
current submission.

A resubmission gets a new Slurm job id, so a plain ``--dependency=afterok:<slurm id>`` of a
downstream job never starts once its upstream is resubmitted.  Naming the *dispatch* job
instead (``afterok:dab2cd3e``) fixes that in two places:

* at each submission of the downstream job, every dispatch job id in its ``--dependency`` is
  replaced by that job's current Slurm job id (:func:`resolve`);
* when the supervisor resubmits an upstream job, every pending downstream job of the user's that
  names it gets its dependency rewritten to the new submission (:func:`follow`), with
  ``scontrol update``.

Invariant: only the words of ``--dependency`` (``-d``) are rewritten, only dispatch job ids in
them (``d`` and seven letters of the id alphabet), and Slurm's own grammar is kept: types,
``+time`` suffixes, ``,`` (all) and ``?`` (any) separators.
"""

from __future__ import annotations

import re

from . import record
from .errors import DispatchError, UsageError
from .slurm import Job, Slurm

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed (dispatch-sbatch)
if TYPE_CHECKING:
    from typing import Callable, Optional

    Lookup = Callable[[str], Optional[str]]

DISPATCH_ID = re.compile(r"^d[a-km-np-z2-9]{7}$")
_TERM = re.compile(r"^(?P<type>[a-z_]+):(?P<ids>.+)$")


def dependency_value(words: list[str]) -> Optional[tuple[int, int, str]]:
    """Where the last ``--dependency`` value is among sbatch words: (index of the word holding
    it, offset of the value in that word, the value); None when there is none."""
    found = None
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--dependency=") or word.startswith("--dependenc") and "=" in word:
            found = (i, word.index("=") + 1, word[word.index("=") + 1:])
        elif word in ("--dependency", "-d") and i + 1 < len(words):
            found = (i + 1, 0, words[i + 1])
            i += 1
        elif word.startswith("-d") and not word.startswith("--") and len(word) > 2:
            found = (i, 2, word[2:])
        i += 1
    return found


def named_jobs(value: str) -> list[str]:
    """The dispatch job ids a ``--dependency`` value names."""
    names = []
    for term in re.split(r"[,?]", value):
        match = _TERM.match(term)
        if not match:
            continue
        for item in match.group("ids").split(":"):
            base = item.split("+", 1)[0]
            if DISPATCH_ID.match(base):
                names.append(base)
    return names


def rewrite(value: str, lookup: Lookup) -> str:
    """``value`` with each dispatch job id replaced by ``lookup(id)``; a term whose every id
    is looked up as None (satisfied already) is dropped with its separator."""
    parts = re.split(r"([,?])", value)  # term, separator, term, ...
    any_of = "?" in parts[1::2]  # Slurm does not mix ',' and '?' in one dependency
    kept: list[str] = []
    for index in range(0, len(parts), 2):
        term = parts[index]
        match = _TERM.match(term)
        if match:
            items = []
            for item in match.group("ids").split(":"):
                base, plus, extra = item.partition("+")
                if DISPATCH_ID.match(base):
                    slurm_id = lookup(base)
                    if slurm_id is None:
                        continue
                    item = slurm_id + plus + extra
                items.append(item)
            if not items:
                if any_of:
                    return ""  # one satisfied alternative satisfies them all
                continue
            term = f"{match.group('type')}:{':'.join(items)}"
        if kept:
            kept.append(parts[index - 1])
        kept.append(term)
    return "".join(kept)


def resolve(words: list[str], home: Optional[str] = None,
            jobs: Optional[dict[str, Job]] = None) -> list[str]:
    """sbatch words with the dispatch job ids of ``--dependency`` replaced by their current
    Slurm job ids.  An upstream job that completed and that Slurm has forgotten is satisfied
    already (its term goes); one that ended otherwise for good is an error naming it."""
    where = dependency_value(words)
    if where is None or not named_jobs(where[2]):
        return list(words)
    index, offset, value = where

    def lookup(ident: str) -> Optional[str]:
        try:
            upstream = record.open_job(ident, home)
            line = upstream.history().lineage()
        except DispatchError as exc:
            raise UsageError(f"--dependency {value!r}: {exc}") from None
        current = line.current
        if current is None:
            raise UsageError(f"--dependency {value!r}: dispatch job {ident} has no "
                             "submission yet")
        known = jobs is None or current.slurm_job_id in jobs
        if not known and line.finished is not None:
            if line.finished.end_state == "completed":
                return None
            raise UsageError(f"--dependency {value!r}: dispatch job {ident} ended "
                             f"{line.finished.end_state} for good; nothing that waits for "
                             "its success can start")
        return current.slurm_job_id
    new = list(words)
    new[index] = new[index][:offset] + rewrite(value, lookup)
    if new[index] == new[index][:offset]:  # every term satisfied: no dependency left
        del new[index]
        if offset == 0 and index > 0:
            del new[index - 1]
    return new


def dependents(records: list[record.JobRecord]) -> dict[str, list[record.JobRecord]]:
    """The dispatch jobs whose ``--dependency`` names each dispatch job, by its id (read once
    per pass: a scan per resubmission would make a pass quadratic in the user's jobs)."""
    found: dict[str, list[record.JobRecord]] = {}
    for job in records:
        try:
            where = dependency_value(list(job.spec["sbatch"]))
        except DispatchError:
            continue
        for ident in named_jobs(where[2]) if where is not None else []:
            found.setdefault(ident, []).append(job)
    return found


def follow(slurm: Slurm, upstream: record.JobRecord, new_slurm_id: str,
           home: Optional[str] = None, jobs: Optional[dict[str, Job]] = None,
           waiting: Optional[list[record.JobRecord]] = None) -> list[str]:
    """After ``upstream`` was resubmitted as ``new_slurm_id``: rewrite the dependency of every
    pending Slurm job of the caller's dispatch jobs that names ``upstream``; returns the Slurm
    job ids updated.  ``waiting`` (from :func:`dependents`) and ``jobs`` (a supervisor pass's)
    save reading them again; Slurm is asked only when a job names ``upstream``."""
    if waiting is None:
        waiting = dependents(record.all_jobs(home)).get(upstream.id, [])
    if not waiting:
        return []
    jobs = jobs if jobs is not None else slurm.own_jobs()
    updated = []
    for job in waiting:
        try:
            where = dependency_value(list(job.spec["sbatch"]))
            current = job.history().lineage().current
        except DispatchError:
            continue
        if where is None or current is None:
            continue
        info = jobs.get(current.slurm_job_id)
        if info is None or info.state != "PENDING":
            continue
        value = rewrite(where[2], lambda ident: new_slurm_id if ident == upstream.id
                        else _current(ident, home))
        slurm.call(["scontrol", "update", f"jobid={info.job_id}", f"dependency={value}"])
        updated.append(info.job_id)
    return updated


def _current(ident: str, home: Optional[str]) -> Optional[str]:
    try:
        current = record.open_job(ident, home).history().lineage().current
    except DispatchError:
        return None
    return current.slurm_job_id if current is not None else None
