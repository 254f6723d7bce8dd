"""Retention of ``facts/``: which jobs' facts nothing needs any more, and removing them.

``dispatch-admin prune`` (run from cron as the owner of ``StateDir``) asks :func:`plan` for
every job folder ``facts/<uid>/<jobid>/`` and removes those it may.  A folder is removed only
when every one of these holds, and kept (with the reason counted) otherwise:

1. its newest fact is older than the retention (the time in each fact's name, which is when
   it was written; a name that does not read as a fact keeps the folder); a fact whose time is
   ahead of this host's clock by more than :data:`AHEAD` was named by a clock ahead, and keeps
   its folder as "from the future", said apart from the merely recent;
2. every fact in it reads as a whole fact of a format this reader knows (a garbled one is for
   a person to look at); a fact still being written is named ``.<name>.<random>`` until it is
   whole (``factstore.create_file``) and keeps its folder while it is younger than the retention,
   and one older is what a killed writer left, removed with the folder;
3. its facts prove that every execution they record ceased, the way ``dispatch-cease`` would
   need them: every node's ``start`` has that node's ``end``, and that end found no survivor
   and no scan error, or the latest re-check of it found none; every ``ctld-start`` has its
   ``ctld-end`` (the controller saw it end);
4. no machine still watches survivors of the job (``watch/<host>/<uid>.<jobid>.*``);
5. the users' records do not need it: the caller says, per uid, the Slurm job ids that a
   record not yet settled or a standing hold still names (``None``: that user's records could
   not be read, so every folder of that user is kept).  An array's task is filed under its own
   job id (task 1 of array 97 may be job 98) while records name the array (``97``) and a held
   task (``97_1``): a folder whose ``start`` or ``ctld-start`` names array A and task T
   (``array_job_id``, ``array_task_id``, written by hooks since they record them) is needed
   when its own id, ``A_T`` or ``A`` is; facts without them are tied by their own id alone.

Nothing is followed or removed that the fact store did not write: every folder is opened
``O_NOFOLLOW`` relative to its parent from ``StateDir`` and must be owned by us and writable by
nobody else; an entry that is not a regular file of ours (a symlink, a FIFO, another owner's
file) keeps its folder.  Only the names judged are unlinked, so a fact written after the
judgement stays (with its folder, put back in sight).

A folder goes whole or not at all, as its readers see it: it is first renamed out of sight,
to ``.pruning-<jobid>-<when, ns in hex>`` in the same user's folder (no reader looks a job
up by that name), then its facts are unlinked, then it is removed.  A prune killed at any
point leaves either the folder whole, where it was (what was proven stays proven: never an
end without its start), or a hidden folder that the next prune finishes: the facts written
before it was hidden go (they were judged), one written after is put back in sight in the
job's folder.  Standard library only.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .. import _fsio
from ..errors import FactError
from . import factstore

if TYPE_CHECKING:
    from .factstore import Fact

#: Why a folder is kept, as the summary counts them.
REASONS = (
    "recent",
    "from the future",
    "not readable",
    "not proven ceased",
    "watched",
    "needed by a record",
    "records unreadable",
    "not ours",
)


#: How far a fact's time may be ahead of this host's clock before it is "from the future".
AHEAD = 300.0


class Judged:
    """One job folder and the verdict: ``reason`` None means it may go."""

    __slots__ = (
        "uid",
        "job_id",
        "names",
        "leftovers",
        "size",
        "reason",
        "detail",
        "array_ids",
        "hidden",
    )

    def __init__(self, uid: str, job_id: str, hidden: str = "") -> None:
        self.uid = uid
        self.job_id = job_id
        #: The name of a folder a killed prune left out of sight (:data:`GOING`), to finish.
        self.hidden = hidden
        self.names: list[str] = []
        #: What killed writers left (``.<name>``, never a fact): removed with the folder.
        self.leftovers: list[str] = []
        self.size = 0
        self.reason: str | None = None
        self.detail = ""
        #: The ids a record names this folder's array task by (``A_T``, ``A``), from its facts.
        self.array_ids: list[str] = []

    @property
    def path(self) -> str:
        return f"{factstore.FACTS}/{self.uid}/{self.hidden or self.job_id}"


#: A job folder being removed, out of every reader's sight: ``.pruning-<jobid>-<ns hex>``.
GOING = ".pruning-"


def _hidden_name(job_id: str, now_ns: int) -> str:
    return f"{GOING}{job_id}-{now_ns:016x}"


def _hidden_parts(name: str) -> tuple[str, int] | None:
    """(job id, when it was hidden, ns) of a hidden folder's name, or None."""
    if not name.startswith(GOING):
        return None
    job_id, _, when = name[len(GOING) :].rpartition("-")
    try:
        return (job_id, int(when, 16)) if job_id and len(when) == 16 else None
    except ValueError:
        return None


def _token_time(token: str) -> float | None:
    try:
        return int(token[:16], 16) / 1e9
    except ValueError:
        return None


def _open_ours(parent: int, name: str, where: str) -> int:
    """Open folder ``name`` under ``parent``, never through a symlink; FactError unless it is
    ours and writable by nobody else."""
    try:
        fd = _fsio.open_dir(name, parent)
    except OSError as exc:
        raise FactError(
            f"{where}: {exc.strerror} (a symlink or a non-folder is left alone)"
        ) from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        raise FactError(
            f"{where}: owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):04o}; left alone"
        )
    return fd


def watched_jobs(state_dir: str) -> set[tuple[str, str]]:
    """(uid, job id) of every job whose survivors some machine still watches."""
    found: set[tuple[str, str]] = set()
    top = os.path.join(state_dir, factstore.WATCH)
    try:
        hosts = os.listdir(top)
    except FileNotFoundError:
        return found
    for host in hosts:
        try:
            names = os.listdir(os.path.join(top, host))
        except OSError:
            continue
        for name in names:
            uid, _, rest = name.partition(".")
            job_id = rest.rpartition(".")[0]
            found.add((uid, job_id))
    return found


def _proof_problem(facts: list[Fact]) -> str:
    """Why these facts do not prove every execution ceased, or ''."""
    ends: dict[tuple[str, str], Fact] = {}
    rechecks: dict[tuple[str, str], Fact] = {}
    ctld_ended = set()
    for fact in facts:
        kind, node, token = fact.get("kind"), str(fact.get("node")), str(fact.get("token"))
        if kind == "end":
            ends[(node, token)] = fact
        elif kind == "recheck":
            key = (node, str(fact.get("end_token")))
            if key not in rechecks or rechecks[key].get("time", 0) <= fact.get("time", 0):
                rechecks[key] = fact
        elif kind == "ctld-end" and fact.get("start_token"):
            ctld_ended.add(str(fact["start_token"]))
    for fact in facts:
        kind, node, token = fact.get("kind"), str(fact.get("node")), str(fact.get("token"))
        if kind == "start":
            end = ends.get((node, token))
            if end is None:
                return f"node {node} recorded a start and no end"
            if end.get("survivors") or end.get("scan_error"):
                later = rechecks.get((node, token))
                if later is None or later.get("survivors"):
                    return f"node {node} recorded survivors not since found gone"
        elif kind == "ctld-start" and token not in ctld_ended:
            return "the controller recorded a start and no end"
    return ""


def _array_ids(facts: list[Fact]) -> list[str]:
    """``A_T`` and ``A`` of the array task these facts' starts say they are, or []."""
    found: list[str] = []
    for fact in facts:
        if fact.get("kind") not in ("start", "ctld-start"):
            continue
        array, task = fact.get("array_job_id"), fact.get("array_task_id")
        if not (isinstance(array, str) and array.isascii() and array.isdigit()):
            continue
        if isinstance(task, str) and task.isascii() and task.isdigit():
            found.append(f"{array}_{task}")
        found.append(array)
    return list(dict.fromkeys(found))


def _judge(job_fd: int, judged: Judged, cutoff: float, now: float) -> None:
    trusted = {os.geteuid()}
    facts: list[Fact] = []
    for name in sorted(os.listdir(job_fd)):
        info = os.stat(name, dir_fd=job_fd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in trusted:
            judged.reason, judged.detail = "not ours", f"{name} is not a fact file of ours"
            return
        if name.startswith("."):
            # A fact a writer has not named yet (factstore.create_file): one still at work if
            # recent, else the leftover of one that was ended, which no reader ever counted.
            if info.st_mtime > cutoff:
                judged.reason, judged.detail = "recent", f"{name} is a fact still being written"
                return
            judged.leftovers.append(name)
            continue
        judged.names.append(name)
        judged.size += info.st_size
        parsed = factstore.parse_name(name)
        written = _token_time(parsed[3]) if parsed else None
        if written is None:
            judged.reason, judged.detail = "not readable", f"{name} is not a fact's name"
            return
        if max(written, info.st_mtime) > now + AHEAD:
            from .._clock import instant

            judged.reason = "from the future"
            judged.detail = (
                f"{name} was written at {instant(max(written, info.st_mtime))}, "
                "ahead of this host's clock: a clock ahead where it was written; "
                "kept until then (remove it by hand once that clock is right)"
            )
            return
        if written > cutoff or info.st_mtime > cutoff:
            judged.reason, judged.detail = "recent", f"{name} is newer than the retention"
            return
        try:
            record: Fact = json.loads(factstore.read_regular(job_fd, name, trusted))
            if not isinstance(record, dict) or record.get("kind") not in factstore.KINDS:
                raise ValueError("not a fact")
            problem = factstore.format_problem(record)
            if problem:
                raise ValueError(problem)
        except (FactError, ValueError) as exc:
            judged.reason, judged.detail = "not readable", f"{name}: {exc}"
            return
        facts.append(record)
    judged.array_ids = _array_ids(facts)
    problem = _proof_problem(facts)
    if problem:
        judged.reason, judged.detail = "not proven ceased", problem


def plan(
    state_dir: str,
    retention: float,
    needed: Callable[[int], set[str] | None],
    now: float | None = None,
) -> Iterator[Judged]:
    """Judge every job folder under ``StateDir/facts`` (see the module's rules), in uid then
    job order; FactError when ``StateDir`` or ``facts/`` cannot be used."""
    now = time.time() if now is None else now
    cutoff = now - retention
    watched = watched_jobs(state_dir)
    base = factstore.open_state_dir(state_dir)
    try:
        try:
            facts = _open_ours(base, factstore.FACTS, f"{state_dir}/{factstore.FACTS}")
        except FactError:
            if not os.path.lexists(os.path.join(state_dir, factstore.FACTS)):
                return
            raise
        try:
            for uid in sorted(os.listdir(facts), key=lambda n: (len(n), n)):
                yield from _plan_user(facts, uid, state_dir, cutoff, watched, needed, now)
        finally:
            os.close(facts)
    finally:
        os.close(base)


def _plan_user(
    facts: int,
    uid: str,
    state_dir: str,
    cutoff: float,
    watched: set[tuple[str, str]],
    needed: Callable[[int], set[str] | None],
    now: float,
) -> Iterator[Judged]:
    where = f"{state_dir}/{factstore.FACTS}/{uid}"
    try:
        user = _open_ours(facts, uid, where)
    except FactError as exc:
        judged = Judged(uid, "*")
        judged.reason, judged.detail = "not ours", str(exc)
        yield judged
        return
    try:
        wanted = needed(int(uid)) if uid.isdigit() else None
        for job_id in sorted(os.listdir(user), key=lambda n: (len(n), n)):
            judged = Judged(uid, job_id)
            hidden = _hidden_parts(job_id)
            if hidden is not None:
                # A folder a killed prune hid: judged already, it is finished now.
                judged = Judged(uid, hidden[0], hidden=job_id)
                try:
                    _list_hidden(user, judged, hidden[1], f"{where}/{job_id}")
                except FactError as exc:
                    judged.reason, judged.detail = "not ours", str(exc)
                yield judged
                continue
            if job_id.startswith("."):
                judged.reason, judged.detail = "not ours", "a dot name"
                yield judged
                continue
            try:
                job = _open_ours(user, job_id, f"{where}/{job_id}")
            except FactError as exc:
                judged.reason, judged.detail = "not ours", str(exc)
                yield judged
                continue
            try:
                _judge(job, judged, cutoff, now)
            finally:
                os.close(job)
            if judged.reason is None and (uid, job_id) in watched:
                judged.reason, judged.detail = "watched", "a machine still re-checks survivors"
            if judged.reason is None and wanted is None:
                judged.reason, judged.detail = (
                    "records unreadable",
                    f"the records of uid {uid} could not be read",
                )
            elif judged.reason is None and wanted is not None and job_id in wanted:
                judged.reason, judged.detail = (
                    "needed by a record",
                    "a standing hold or an unsettled record names it",
                )
            elif judged.reason is None and wanted is not None and set(judged.array_ids) & wanted:
                named = next(i for i in judged.array_ids if i in wanted)
                what = "array task" if "_" in named else "array"
                judged.reason, judged.detail = (
                    "needed by a record",
                    f"a standing hold or an unsettled record names its {what}, {named}",
                )
            yield judged
    finally:
        os.close(user)


def _list_hidden(user: int, judged: Judged, since_ns: int, where: str) -> None:
    """What a hidden folder holds: the facts written before it was hidden (``names``, to go;
    judged with it), those written since (``leftovers`` stay empty; they are put back)."""
    job = _open_ours(user, judged.hidden, where)
    try:
        for name in sorted(os.listdir(job)):
            info = os.stat(name, dir_fd=job, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise FactError(f"{where}/{name} is not a fact file of ours")
            parsed = factstore.parse_name(name)
            written = _token_time(parsed[3]) if parsed else None
            if written is not None and written * 1e9 < since_ns and info.st_mtime_ns < since_ns:
                judged.names.append(name)
                judged.size += info.st_size
            elif name.startswith(".") and info.st_mtime_ns < since_ns:
                judged.leftovers.append(name)
    finally:
        os.close(job)


def remove(state_dir: str, judged: Judged, step: Callable[[str], None] = lambda where: None) -> int:
    """Remove a folder :func:`plan` let go (or finish one a killed prune hid): hide it, unlink
    only the names it judged, then remove it; a fact written since is put back in sight in
    the job's folder.  Returns the facts removed.  ``step(where)`` is called after each
    change (tests end the process there)."""
    base = factstore.open_state_dir(state_dir)
    fds = [base]
    removed = 0
    try:
        fds.append(_open_ours(fds[-1], factstore.FACTS, f"{state_dir}/{factstore.FACTS}"))
        fds.append(_open_ours(fds[-1], judged.uid, f"{state_dir}/{factstore.FACTS}/{judged.uid}"))
        user = fds[-1]
        hidden = judged.hidden
        if not hidden:
            hidden = _hidden_name(judged.job_id, time.time_ns())
            try:
                os.rename(judged.job_id, hidden, src_dir_fd=user, dst_dir_fd=user)
            except FileNotFoundError:
                return 0  # gone meanwhile (another prune)
            step("hidden")
        job = _open_ours(user, hidden, f"{state_dir}/{factstore.FACTS}/{judged.uid}/{hidden}")
        fds.append(job)
        for name in [*judged.names, *judged.leftovers]:
            try:
                os.unlink(name, dir_fd=job)
                removed += name in judged.names
            except FileNotFoundError:
                pass
            step("unlinked")
        try:
            os.rmdir(hidden, dir_fd=user)
            step("removed")
        except OSError:
            _put_back(user, job, hidden, judged.job_id)  # something new was written there
            step("put back")
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return removed


def _put_back(user: int, hidden_fd: int, hidden: str, job_id: str) -> None:
    """Move what is left in a hidden folder back in sight, as ``job_id``: the folder itself
    when no folder of the job is there (or an empty one), else each fact, linked into it
    (never replacing a fact there), then unlinked; the hidden folder goes once empty."""
    try:
        os.rename(hidden, job_id, src_dir_fd=user, dst_dir_fd=user)
        return
    except OSError:
        pass  # a folder of the job was made meanwhile, with facts in it
    target = _fsio.open_dir(job_id, user)
    try:
        for name in os.listdir(hidden_fd):
            try:
                os.link(name, name, src_dir_fd=hidden_fd, dst_dir_fd=target, follow_symlinks=False)
            except FileExistsError:
                there = os.stat(name, dir_fd=target, follow_symlinks=False)
                here = os.stat(name, dir_fd=hidden_fd, follow_symlinks=False)
                if (there.st_ino, there.st_dev) != (here.st_ino, here.st_dev):
                    continue  # another fact of that name: this one stays hidden, unlost
            os.unlink(name, dir_fd=hidden_fd)
    finally:
        os.close(target)
    try:
        os.rmdir(hidden, dir_fd=user)
    except OSError:
        pass
