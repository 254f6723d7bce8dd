"""``dispatch forget``: remove the records of dispatch jobs nothing will act on again.

A record is kept while anything may still act on it or read it: a Slurm job of it that the
controller still knows (running, pending, requeued, or ended but not yet aged out), a
standing hold, a submission being made (a claim with no submission recorded), an end the
supervisor has not decided yet (the job is not settled: it may still be resubmitted), and
another unsettled dispatch job that waits for it (``--dependency`` on its id).  Only this
cluster's records are considered (the caller passes them).

What a record that says its job ended tells cleanup (:func:`ended_attempts`): the executions
it recorded as started before that end run no more, so ``dispatch gc`` takes none of them for
live, whatever their epoch.

A record goes whole: its folder is first renamed to a dot name (which no reader lists), then
removed; one a killed run left half removed is removed by the next run.  An entry of ``jobs/``
that is a symlink is no record folder, whatever it leads to: it is kept, named, and never
followed (neither judged, measured nor removed through), so nothing of it is left to finish.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional

from .. import _fsio
from ..errors import DispatchError, RecordError
from ..slurm.jobs import Job, unique_jobs
from . import events, record, sbatch_words

_CLAIM = re.compile(r"submission-(\d+)(?:-t(\d+))?(?:\.|$)")
GOING = ".forgetting-"


def settled(job: record.JobRecord) -> bool:
    """Nothing more is decided for it: finished, superseded, or every array task so."""
    history = job.history()
    tasks = sbatch_words.array_tasks(job)
    return history.settled or (tasks is not None and history.settled_tasks(tasks))


def ended_attempts(job: record.JobRecord) -> frozenset[str]:
    """The executions (attempt tokens) of ``job`` that its record says ended for good: each
    one whose start the launcher recorded before the end that settled its lineage (finished
    by a rule or an expired hold, superseded; an array task's own end, or the whole job's).
    An execution recorded after that end (a person's ``dispatch resubmit``, or one whose
    start is not recorded yet) is not among them; nor is any when the record cannot be read.
    """
    try:
        if symlinked(job) is not None:
            return frozenset()
        history = job.history()
        tasks = history.tasks
    except DispatchError:
        return frozenset()
    out: set[str] = set()
    for line in [history.lineage(), *(history.lineage(t) for t in tasks)]:
        end = line.superseded or line.finished
        if end is None:
            continue
        for event in history.events:  # the record's order: the starts before that end
            if event is end:
                break
            if (
                isinstance(event, events.Started)
                and event.attempt
                and (line.task is None or event.task == line.task)
            ):
                out.add(event.attempt)
    return frozenset(out)


def ended_executions(home: Optional[str] = None) -> Callable[[str], frozenset[str]]:
    """For cleanup (``dispatch gc``): a dispatch job id, as an execution's record names it,
    to :func:`ended_attempts` of its record in ``home``; none for a job with no record there
    (another user's, one forgotten), whose executions cleanup then takes for ones that may
    still run."""
    base = record.jobs_dir(home)

    def ended(job_id: str) -> frozenset[str]:
        path = os.path.join(base, job_id)
        if (
            not job_id
            or "/" in job_id
            or job_id.startswith(".")
            or not os.path.isfile(os.path.join(path, "job.json"))
        ):
            return frozenset()
        return ended_attempts(record.JobRecord(path))

    return ended


def symlinked(job: record.JobRecord) -> Optional[str]:
    """Why ``job``'s path is refused without being followed (a symlink, say to where), or
    None for a record folder of its own."""
    try:
        target = os.readlink(job.path)
    except OSError:
        return None  # not a symlink (or gone: the readers say so)
    return (
        f"a symlink to {target!r}, not a record folder: dispatch forget never follows "
        f"one; remove the link {job.path!r} by hand (or move the record back in its "
        "place)"
    )


def why_kept(
    job: record.JobRecord, slurm_jobs: dict[str, Job], waiting: dict[str, list[record.JobRecord]]
) -> Optional[str]:
    """Why ``job``'s record must stay, or None when it may be forgotten.  ``slurm_jobs`` is
    this cluster's view of the caller's jobs, ``waiting`` :func:`dependency.dependents`."""
    link = symlinked(job)
    if link is not None:
        return link
    try:
        history = job.history()
        tasks = sbatch_words.array_tasks(job)
    except DispatchError as exc:
        return f"unreadable ({exc}): remove it by hand if it is garbage"
    ids = {s.slurm_job_id for s in history.submissions}
    ids |= {s.slurm_job_id for s in history.of(events.Started) if s.slurm_job_id}
    for view in unique_jobs(slurm_jobs):
        if view.job_id in ids or (view.array_job_id or "") in ids:
            return f"still known to Slurm (Slurm job {view.display_id}, {view.state})"
    for line in [history.lineage()] + [history.lineage(t) for t in tasks or []]:
        if line.hold is not None:
            return (
                f"a standing hold (Slurm job {line.hold.slurm_job_id}): release it "
                "(dispatch release) or let it expire first"
            )
    made = {(s.submission, s.task) for s in history.submissions}
    for name in _claim_names(job):
        found = _CLAIM.match(name)
        if found:
            key = (int(found.group(1)), int(found.group(2)) if found.group(2) else None)
            if key not in made and (key[0], None) not in made:
                return f"submission {key[0]} is being made (claim {name})"
    if not settled(job):
        return (
            "not settled: dispatch supervise has not decided its end yet (it may be "
            "resubmitted); run a pass first"
        )
    others = []
    for other in waiting.get(job.id, []):
        try:
            if other.id != job.id and not settled(other):
                others.append(other.id)
        except DispatchError:
            others.append(other.id)
    if others:
        return f"dispatch job(s) {', '.join(sorted(others))} wait for it (--dependency)"
    return None


def _claim_names(job: record.JobRecord) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(job.path, "claims")))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RecordError(f"cannot read {job.path}/claims: {exc.strerror}") from None


def last_activity(job: record.JobRecord) -> float:
    """When anything was last recorded of ``job`` (its newest event, else its creation);
    for a symlink (:func:`symlinked`), the link's own time: it is not followed."""
    if symlinked(job) is not None:
        return os.lstat(job.path).st_mtime
    try:
        found = [e.time for e in job.history().events]
        created = job.created
    except DispatchError:
        return os.stat(job.path).st_mtime
    return max([created, *found])


def size(job: record.JobRecord) -> int:
    """Bytes the record takes on disk (blocks, as du counts them, its folders included):
    what forgetting it frees.  Mostly blocks: a record is four folders and a file or more
    per event, each at least a block, around a few KiB of text (measured: 16 KiB of it in
    a 4 KiB-block file system is its folders; 40 KiB for a job of two events)."""
    if symlinked(job) is not None:
        return os.lstat(job.path).st_blocks * 512  # the link's own: never followed
    total = 0
    for folder, dirs, names in os.walk(job.path):
        for name in [*dirs, *names, ""] if folder == job.path else [*dirs, *names]:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


def forget(job: record.JobRecord) -> None:
    """Remove the record whole: renamed out of every reader's sight, then removed.  A
    symlink is refused (:func:`symlinked`), never followed; what cannot be removed is an
    error naming it (the renamed folder stays for the next run to finish)."""
    link = symlinked(job)
    if link is not None:
        raise RecordError(f"not removing the record {job.path!r}: {link}")
    parent = os.path.dirname(job.path)
    going = os.path.join(parent, f"{GOING}{job.id}-{os.urandom(4).hex()}")
    try:
        os.rename(job.path, going)
    except OSError as exc:
        raise RecordError(f"cannot remove the record {job.path!r}: {exc.strerror}") from None
    if os.path.islink(going):  # made a symlink after the check: only the link goes
        os.unlink(going)
        raise RecordError(
            f"not removing the record {job.path!r}: it became a symlink while "
            "it was being forgotten; the link is removed, nothing it led to"
        )
    why = _remove_tree(going)
    if why:
        raise RecordError(
            f"cannot remove the record {job.path!r} whole (renamed out of sight "
            f"as {os.path.basename(going)}; the next run tries again): {why}"
        )


def _remove_tree(path: str) -> str:
    """Remove the folder ``path`` (a record renamed out of sight, the caller's own): '' when
    it is gone, else what could not be removed and why.  A folder of the caller's that its
    user made read-only is made writable first (it is theirs, and it is going); nothing is
    followed (each folder is opened O_NOFOLLOW, the walk enters no symlink, a symlink is
    unlinked)."""

    def writable(folder: str) -> None:
        try:
            fd = _fsio.open_dir(folder)
        except OSError:
            return  # rmtree names what it cannot remove
        try:
            info = os.fstat(fd)
            if info.st_uid == os.geteuid() and info.st_mode & 0o700 != 0o700:
                os.fchmod(fd, info.st_mode | 0o700)
        except OSError:
            pass
        finally:
            os.close(fd)

    writable(path)
    for folder, dirs, _ in os.walk(path):
        for name in dirs:
            writable(os.path.join(folder, name))
    try:
        for folder, dirs, names in os.walk(path, topdown=False):
            for name in names:
                os.unlink(os.path.join(folder, name))
            for name in dirs:  # a symlink among them is unlinked, never entered
                inner = os.path.join(folder, name)
                os.unlink(inner) if os.path.islink(inner) else os.rmdir(inner)
        os.rmdir(path)
    except OSError as exc:
        return f"{exc.filename}: {exc.strerror}"
    return ""


def finish_earlier(home: Optional[str] = None) -> tuple[list[str], list[str]]:
    """Remove what a killed run left renamed but not removed: (the names removed, what could
    not be and why, each naming its path)."""
    base = record.jobs_dir(home)
    try:
        left = [n for n in os.listdir(base) if n.startswith(GOING)]
    except OSError:
        return [], []
    finished, stuck = [], []
    for name in left:
        path = os.path.join(base, name)
        if os.path.islink(path):  # an earlier release renamed a symlinked record: the link
            os.unlink(path)  # alone goes, never what it leads to
            finished.append(name)
            continue
        why = _remove_tree(path)
        if why:
            stuck.append(
                f"cannot finish removing {path!r}, a record an earlier run renamed out "
                f"of sight: {why}"
            )
        else:
            finished.append(name)
    return finished, stuck


def forget_planned(
    jobs: list[record.JobRecord], going: list[dict[str, Any]], home: Optional[str] = None
) -> list[str]:
    """Forget the records :func:`plan` let go (``going``, from ``jobs``), after finishing what
    a killed run left half removed under ``home``; returns those names.  What both
    ``dispatch forget`` and ``dispatch-admin prune`` (as the user) do.  A leftover that
    cannot be removed is a RecordError naming it, once the others are forgotten."""
    left, stuck = finish_earlier(home)
    by_id = {job.id: job for job in jobs}
    for entry in going:
        forget(by_id[entry["id"]])
    if stuck:
        raise RecordError("; ".join(stuck))
    return left


def plan(
    jobs: list[record.JobRecord],
    slurm_jobs: dict[str, Job],
    waiting: dict[str, list[record.JobRecord]],
    before: Optional[float],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the records to forget, those kept with why), for ``jobs`` last active before
    ``before`` (every one given, with None)."""
    going: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for job in jobs:
        last = last_activity(job)
        if before is not None and last >= before:
            continue
        why = why_kept(job, slurm_jobs, waiting)
        entry = {"id": job.id, "last": round(last, 3), "bytes": size(job)}
        if why is None:
            going.append(entry)
        else:
            kept.append({**entry, "why": why})
    return going, kept
