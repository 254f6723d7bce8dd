"""Dependencies on dispatch jobs: ``--dependency=afterok:<dispatch job>`` follows the job's
current submission.

A resubmission gets a new Slurm job id, so a plain ``--dependency=afterok:<slurm id>`` of a
downstream job never starts once its upstream is resubmitted.  Naming the *dispatch* job
instead (``afterok:dab2cd3e``) fixes that in two places:

* at each submission of the downstream job, every dispatch job id in its ``--dependency`` is
  replaced by that job's current Slurm job id (:func:`resolve`);
* when the supervisor resubmits an upstream job, every pending downstream job of the user's that
  names it gets its dependency rewritten to the new submission (:func:`follow`), with
  ``scontrol update``.  Every other dispatch job the dependency names is looked up again; one
  that cannot be (an unreadable record, none of its submissions recorded) is not known, and
  unknown is never satisfied: that downstream's dependency is left as Slurm has it, refused
  with the reason, never rewritten without the term.

Invariant: only the words of ``--dependency`` (``-d``) are rewritten, only dispatch job ids in
them (``d`` and seven letters of the id alphabet), and Slurm's own grammar is kept: types,
``+time`` suffixes, ``,`` (all) and ``?`` (any) separators.

An upstream whose current Slurm job slurmctld has forgotten (``MinJobAge`` after its end) can
no longer be named to sbatch; its final outcome in the dispatch record decides each term by the
term's meaning in sbatch(1) (:func:`judge`): ``afterany`` and ``afterburstbuffer`` are
satisfied by any end, ``afterok`` and ``aftercorr`` only by ``completed``, ``afternotok`` only by
any other end (failed, timeout, node failure, cancelled, ...), ``after`` by the start (or the
cancellation) plus its ``+time`` minutes.  A satisfied term is dropped; one that can never be
satisfied is refused at submission (sbatch would leave the job pending for ever with
DependencyNeverSatisfied); an outcome the record does not know is an error saying so.  With
``?`` one satisfied alternative satisfies the whole dependency and only alternatives that can
never be are dropped, so it is refused only when none is left.
"""

from __future__ import annotations

import re
import time

from .. import _clock
from ..errors import DispatchError, UsageError
from ..slurm.adapter import Slurm
from ..slurm.jobs import Job
from . import events, naming, record, sbatch_words

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed (dispatch-sbatch)
if TYPE_CHECKING:
    from typing import Callable, Optional

    # (dispatch job id, dependency type, the item's "+time" or "") -> Slurm job id, or None
    # when the item is satisfied already; raises Never when it can never be.
    Lookup = Callable[[str, str, str], Optional[str]]

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
            found = (i, word.index("=") + 1, word[word.index("=") + 1 :])
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


class Never(Exception):
    """An item of a dependency that can never be satisfied; the message says why."""


def rewrite(value: str, lookup: Lookup) -> str:
    """``value`` with each dispatch job id replaced by ``lookup(id, type, "+time")``.

    An item looked up as None (satisfied already) is dropped, and a term left with no item
    goes with its separator.  With ``?`` (any of them) a satisfied item satisfies the whole
    dependency (``""``) and an item that can never be satisfied (:class:`Never`) is dropped,
    refused (UsageError) only when every item is; without, such an item is refused at once.
    """
    parts = re.split(r"([,?])", value)  # term, separator, term, ...
    any_of = "?" in parts[1::2]  # Slurm does not mix ',' and '?' in one dependency
    kept: list[str] = []
    never: list[str] = []
    for index in range(0, len(parts), 2):
        term = parts[index]
        match = _TERM.match(term)
        if match:
            kind, items = match.group("type"), []
            for item in match.group("ids").split(":"):
                base, plus, extra = item.partition("+")
                if DISPATCH_ID.match(base):
                    try:
                        slurm_id = lookup(base, kind, plus + extra)
                    except Never as exc:
                        if not any_of:
                            raise UsageError(f"--dependency {value!r}: {exc}") from None
                        never.append(str(exc))
                        continue
                    if slurm_id is None:
                        if any_of:
                            return ""  # one satisfied alternative satisfies them all
                        continue
                    item = slurm_id + plus + extra
                items.append(item)
            if not items:
                continue
            term = f"{kind}:{':'.join(items)}"
        if kept:
            kept.append(parts[index - 1])
        kept.append(term)
    if never and not kept:
        raise UsageError(
            f"--dependency {value!r}: no alternative can ever be satisfied: " + "; ".join(never)
        )
    return "".join(kept)


OK_ONLY = {"afterok", "aftercorr"}  # satisfied only by a success
ANY_END = {"afterany", "afterburstbuffer"}  # satisfied by any end


def judge(kind: str, ident: str, outcome: str, started: float, delay: str, now: float) -> None:
    """Whether a term of ``kind`` on dispatch job ``ident`` is satisfied, its Slurm job having
    ended with ``outcome`` for good (started, or was cancelled, at ``started``) and been
    forgotten: returns when it is; raises :class:`Never` when it can never be, and
    UsageError when it is not yet (an ``after`` delay still running) or ``kind`` is unknown."""
    never = (
        f"{kind}:{ident} can never be satisfied: dispatch job {ident} ended {outcome} "
        "for good (and Slurm has forgotten its job), so sbatch would leave this job "
        "pending for ever with reason DependencyNeverSatisfied"
    )
    success = outcome == "completed"
    if kind in ANY_END:
        return
    if kind in OK_ONLY or kind == "afternotok":
        if success != (kind in OK_ONLY):
            raise Never(never)
        return
    if kind == "after":
        minutes = delay[1:]
        if minutes and not minutes.isdigit():
            raise UsageError(
                f"--dependency {kind}:{ident}{delay}: {minutes!r} is not a number of minutes"
            )
        due = started + 60 * int(minutes or 0)
        if now < due:
            when = _clock.instant(due)
            began = _clock.instant(started)
            raise UsageError(
                f"--dependency {kind}:{ident}{delay}: dispatch job {ident} started (or was "
                f"cancelled) at {began} and Slurm has forgotten its job, so the wait cannot "
                f"be left to Slurm; it ends at {when}: submit then, or give --begin={when} "
                "instead of this term"
            )
        return
    raise UsageError(
        f"--dependency {kind}:{ident}: unknown dependency type {kind!r} (sbatch "
        "knows after, afterany, afterburstbuffer, aftercorr, afternotok, "
        "afterok and singleton)"
    )


def _final_outcome(upstream: record.JobRecord) -> Optional[tuple[str, float]]:
    """How a dispatch job ended for good (``completed``, or the other ends of its lineages:
    an array's tasks each have one) and when its last submission started (or, never started,
    ended); None while the record does not say for every lineage."""

    history = upstream.history()
    whole = history.lineage()
    tasks = sbatch_words.array_tasks(upstream)
    lines = [whole] if not tasks or whole.settled else [history.lineage(t) for t in tasks]
    outcomes, started = [], 0.0
    for line in lines:
        end = line.finished or line.superseded
        if end is None:
            return None
        # Superseding cancels the job's Slurm jobs.
        outcomes.append(line.finished.end_state if line.finished else "cancelled")
        current = line.current
        runs = line.started_for(current.submission) if current is not None else []
        started = max(started, runs[-1].time if runs else end.time)
    failed = sorted({o for o in outcomes if o != "completed"})
    return (", ".join(failed) if failed else "completed"), started


def resolve(
    words: list[str],
    home: Optional[str] = None,
    jobs: Optional[dict[str, Job]] = None,
    cluster: Optional[str] = None,
) -> list[str]:
    """sbatch words with the dispatch job ids of ``--dependency`` replaced by their current
    Slurm job ids.  An upstream job whose Slurm job Slurm has forgotten is judged by its final
    outcome and the term's type (:func:`judge`): satisfied, its term goes; never satisfiable,
    or not known yet, an error naming it."""
    where = dependency_value(words)
    if where is None or not named_jobs(where[2]):
        return list(words)
    index, offset, value = where

    def lookup(ident: str, kind: str, delay: str) -> Optional[str]:
        try:
            # This cluster's job only: another's Slurm ids mean other jobs here.
            upstream = record.open_job(ident, home, cluster=cluster)
            line = upstream.history().lineage()
            current = line.current
            if current is None:
                raise UsageError(
                    f"--dependency {value!r}: dispatch job {ident} has no submission yet"
                )
            if jobs is None or _known(upstream, current, jobs):
                return current.slurm_job_id  # Slurm knows it: Slurm judges the term
            outcome = _final_outcome(upstream)
        except DispatchError as exc:
            raise UsageError(f"--dependency {value!r}: {exc}") from None
        if outcome is None:
            raise UsageError(
                f"--dependency {value!r}: dispatch job {ident}'s Slurm job "
                f"{current.slurm_job_id} has ended and Slurm has forgotten it, and how it "
                "ended for good is not known yet (no supervisor pass has judged it since; it "
                "may still be resubmitted): run `dispatch supervise`, then submit again"
            )
        judge(kind, ident, outcome[0], outcome[1], delay, time.time())
        return None

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


class Moved:
    """What :func:`follow` did: the Slurm job ids whose dependency it rewrote, and one line
    for each pending job it left as Slurm has it, saying why."""

    __slots__ = ("updated", "refused")

    def __init__(self) -> None:
        self.updated: list[str] = []
        self.refused: list[str] = []


def follow(
    slurm: Slurm,
    upstream: record.JobRecord,
    new_slurm_id: str,
    home: Optional[str] = None,
    jobs: Optional[dict[str, Job]] = None,
    waiting: Optional[list[record.JobRecord]] = None,
) -> Moved:
    """After ``upstream`` was resubmitted as ``new_slurm_id``: rewrite the dependency of every
    pending Slurm job of the caller's dispatch jobs that names ``upstream``.  ``waiting``
    (from :func:`dependents`) and ``jobs`` (a supervisor pass's) save reading them again;
    Slurm is asked only when a job names ``upstream``.

    The rewrite gives Slurm the whole dependency again, so every other dispatch job it names
    must be known: one whose record cannot be read now (a full disk, an NFS hiccup) or has
    no submission is not known, never satisfied, and the job's dependency is left as Slurm
    has it (its term on ``upstream`` still naming the ended job), refused with the reason."""
    moved = Moved()
    if waiting is None:
        waiting = dependents(record.all_jobs(home)).get(upstream.id, [])
    if not waiting:
        return moved
    jobs = jobs if jobs is not None else slurm.own_jobs()
    for job in waiting:
        try:
            where = dependency_value(list(job.spec["sbatch"]))
            current = job.history().lineage().current
        except DispatchError:
            continue
        if where is None or current is None:
            continue
        info = jobs.get(current.slurm_job_id)
        if info is None or not info.is_pending or not _known(job, current, jobs):
            continue
        try:
            value = rewrite(
                where[2],
                lambda ident, kind, delay: (
                    new_slurm_id if ident == upstream.id else _current(ident, home)
                ),
            )
        except DispatchError as exc:
            moved.refused.append(
                f"Slurm job {info.job_id} (dispatch job {job.id}) keeps its dependency as "
                f"Slurm has it, still naming {upstream.id}'s ended job, not its new Slurm job "
                f"{new_slurm_id}: {exc}; once that reads again, `scontrol update "
                f"jobid={info.job_id} dependency=...` with {new_slurm_id} for {upstream.id}"
            )
            continue
        slurm.set_dependency(info.job_id, value)
        moved.updated.append(info.job_id)
    return moved


def _known(job: record.JobRecord, current: events.Submitted, jobs: dict[str, Job]) -> bool:
    """Slurm's job under the submission's id is that submission (its marker; ids start again
    when slurmctld loses its state: a plain job of the user's may have it now)."""
    found = jobs.get(current.slurm_job_id)
    return found is not None and naming.is_submission(job, current, found)


def _current(ident: str, home: Optional[str]) -> str:
    """The Slurm job id of dispatch job ``ident``'s current submission; an error when it is
    not known (an unknown term is never taken as satisfied)."""
    try:
        current = record.open_job(ident, home).history().lineage().current
    except DispatchError as exc:
        raise DispatchError(f"dispatch job {ident}'s record cannot be read ({exc})") from None
    if current is None:
        raise DispatchError(f"dispatch job {ident}'s record holds no submission")
    return current.slurm_job_id
