"""The site's view across users' records, and the site's release of proven holds.

Records live in each user's home (:mod:`.record`), written by that user.  Root reads them for
``dispatch-admin holds`` (every standing hold, its deadline, what the site's CessationSignal last
said about each ended execution it waits for) and lifts the holds proven ceased for
``dispatch-admin release-service``: the one way holds lift by themselves where the site made
``facts/`` 0700, which stops every user's own supervisor from asking ``dispatch-cease``.

Invariants:

* Root never opens a user's record: every read and write of a user's records is done by a
  child process running as that user (uid, gid, the user's groups; a scrubbed environment),
  so a symlink the user planted leads only where the user could go anyway, and whatever is
  written is the user's own, owned by the user.
* Only the question is root's: the CessationSignal runs as root (it reads facts/ 0700), about
  the Slurm job ids and restart counts the user's record names, as separate words (never a
  shell); a target that is not a Slurm job id is refused, never asked.
* Evidence never crosses users: root asks only about a Slurm job that is the record's own
  user's, as root learns it without the record (:func:`job_owners`: the controller, else
  Slurm's accounting, else the facts the hooks filed by the job's own uid); another's job, or
  one whose user nothing says, is answered "error" naming no one, never asked.  An answer
  judged from another uid's facts (a job id used twice) is not handed to the user either.
* The view changes nothing; the service lifts a hold only when every ended execution it waits
  for is proven ceased, records each answer first (as the supervisor does), and releases the
  held job as its owner.
* A configured group (dispatch.conf's ``SiteViewGroup``, resolved at each write: a group
  that does not resolve for a moment is that write's error, never the pass's end) sees the
  view without root's reach into homes: each pass of the service writes it, whole, as
  ``StateDir/siteview/holds.json`` (folder 0750, file 0640, both root and the group's; a
  new file renamed over the old, so a reader finds the last whole view or none), and a
  member reads that and is told how old it is.  Nothing of a user's is in it that
  ``dispatch-admin holds`` would not show root.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import stat
import time
from typing import Any, Callable, Optional, Sequence

from .. import _account, _fsio
from ..errors import DispatchError, RefusedError, UsageError

DEFAULT_RECORDS = "%h/.local/state/slurm-dispatch"
CHILD_TIMEOUT = 300.0  # seconds a user's child may take
ANSWER_LIMIT = _account.LIMIT  # bytes a user's child may answer (it holds what the user wrote)
_TARGET = re.compile(r"^[0-9]+(_[0-9]+)?$")  # a Slurm job id, or an array task's A_T
_UNANSWERED = (
    "the account database does not answer for it (an account gone, or a directory "
    "service down): its records are not read"
)


def records_of(pattern: str, user: pwd.struct_passwd) -> str:
    """A user's record home: ``pattern`` with ``%u`` the user's name, ``%h`` their home."""
    if "%" not in pattern.replace("%u", "").replace("%h", "").replace("%%", "") and os.path.isabs(
        pattern.replace("%h", "/")
    ):
        out = pattern.replace("%%", "\0").replace("%u", user.pw_name)
        return out.replace("%h", user.pw_dir).replace("\0", "%")
    raise UsageError(
        f"--records {pattern!r}: give an absolute path in which %u stands for the "
        f"user's name and %h for their home (default {DEFAULT_RECORDS})"
    )


def users(
    names: Sequence[str], pattern: str, state_dir: Optional[str] = None
) -> tuple[list[tuple[pwd.struct_passwd, str]], list[str]]:
    """The users to look at with their record homes, and what stopped one being looked at.

    ``names``, else every account whose record home exists or that root cannot look into (a
    folder that is not there has no records), among: every account the account database
    lists, and every user something of the site's names, looked up one by one (a directory
    service with ``enumerate = false``, sssd's default, lists only the local accounts,
    while it answers ``getpwuid`` and ``getpwnam`` for every user): the uids with facts under
    ``state_dir`` (each job that ran under the hooks leaves its user's ``facts/<uid>/``) and
    the users the release service's last view (the group's copy) saw a standing hold of.  One
    of those the account database does not answer for is an error naming it."""
    if names:
        chosen = []
        for name in names:
            try:
                chosen.append(pwd.getpwnam(name))
            except KeyError:
                raise UsageError(f"--user {name!r}: no such user") from None
        return [(user, records_of(pattern, user)) for user in chosen], []
    accounts = list(pwd.getpwall())
    listed = {user.pw_uid: user for user in accounts}
    errors: list[str] = []
    if state_dir is not None:
        for uid, where in _named_uids(state_dir, errors):
            if uid in listed:
                continue
            try:
                listed[uid] = pwd.getpwuid(uid)
                accounts.append(listed[uid])
            except KeyError:
                errors.append(f"uid {uid} ({where}): {_UNANSWERED}")
        known = {user.pw_name for user in accounts}
        for name, where in _named_users(state_dir, errors):
            if name in known:
                continue
            try:
                accounts.append(pwd.getpwnam(name))
                known.add(name)
            except KeyError:
                errors.append(f"{name} ({where}): {_UNANSWERED}")
    out = []
    for user in sorted(accounts, key=lambda u: u.pw_name):
        home = records_of(pattern, user)
        if _may_hold_records(home):
            out.append((user, home))
    return out, errors


def _named_uids(state_dir: str, errors: list[str]) -> list[tuple[int, str]]:
    """(uid, where it was found) for every uid with facts under ``state_dir``."""
    from ..node import factstore

    try:
        uids = factstore.fact_uids(state_dir)
    except DispatchError as exc:
        errors.append(f"{exc}: the users whose jobs left facts there are not all looked at")
        return []
    return [(uid, f"facts in {state_dir}/{factstore.FACTS}/{uid}") for uid in uids]


def _named_users(state_dir: str, errors: list[str]) -> list[tuple[str, str]]:
    """(user name, where) for every user with a standing hold in the release service's last
    copy of the view under ``state_dir``, when there is one."""
    path = snapshot_path(state_dir)
    if not os.path.lexists(path):
        return []
    try:
        seen = load_snapshot(path)
    except DispatchError as exc:
        errors.append(f"{exc}: the users it names are not all looked at")
        return []
    holds = seen.get("holds")
    named = (
        {h.get("user") for h in holds if isinstance(h, dict)} if isinstance(holds, list) else set()
    )
    names = sorted(n for n in named if isinstance(n, str))
    return [(name, f"a standing hold in {path}") for name in names]


def _may_hold_records(home: str) -> bool:
    """Whether ``home`` may hold records, as root sees it: False only for a ``jobs/`` folder
    that is not there.  Root cannot look into a root-squashed 0700 home (Permission denied):
    only the user's own process can say, so that user is read."""
    try:
        return stat.S_ISDIR(os.stat(os.path.join(home, "jobs")).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


# -- what a user's child does, as that user ----------------------------------------------


def _targets(hold: Any) -> list[list[Any]]:
    return [
        [str(t), int(r)]
        for t, r in (hold.ended_tasks or [[hold.ended_slurm_job_id, hold.ended_restart]])
    ]


def _answered(answers: Sequence[Any]) -> Optional[float]:
    """When the hold's last answer that was not an error came: CessationInterval counts from
    it.  An error (the user's own supervisor cannot read facts/ 0700, so all its answers are
    errors, every interval) never postpones the site's question."""
    real = [a.asked for a in answers if a.verdict != "error"]
    return max(real) if real else None


def standing(home: str) -> dict[str, Any]:
    """Every standing hold of the records in ``home`` (run as their user)."""
    from . import record

    holds: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        jobs = record.all_jobs(home)
    except DispatchError as exc:
        return {"holds": [], "errors": [str(exc)]}
    for job in jobs:
        try:
            history = job.history()
            tasks = history.tasks
            seen: set[str] = set()
            for line in [history.lineage()] + [history.lineage(t) for t in tasks]:
                hold = line.hold
                if (
                    hold is None
                    or hold.slurm_job_id + f"/{hold.task}" in seen
                    or (line.task is not None and hold.task is None)
                ):
                    continue
                seen.add(hold.slurm_job_id + f"/{hold.task}")
                answers = line.answers_for(hold.slurm_job_id)
                ended = []
                for target, restart in _targets(hold):
                    mine = [a for a in answers if a.ended_slurm_job_id == target]
                    last = mine[-1] if mine else None
                    ended.append(
                        {
                            "slurm_job_id": target,
                            "restart": restart,
                            "verdict": last.verdict if last else "not asked",
                            "asked_at": last.asked if last else None,
                            "evidence": last.evidence if last else None,
                        }
                    )
                answered = _answered(answers)
                holds.append(
                    {
                        "answered_at": answered,
                        "dispatch_job": job.id,
                        "held_slurm_job_id": hold.slurm_job_id,
                        "task": hold.task,
                        "submission": hold.submission,
                        "end_state": hold.end_state,
                        "held_since": hold.time,
                        "deadline": hold.deadline,
                        "ended": ended,
                    }
                )
        except (DispatchError, OSError) as exc:
            errors.append(f"{job.id}: {exc}")
    return {"holds": holds, "errors": errors}


def lift(
    home: str,
    answers: dict[str, dict[str, Any]],
    signal: str,
    timeout: float,
    interval: float,
    now: float,
) -> dict[str, Any]:
    """Record root's ``answers`` (keyed ``target:restart``) on every standing hold of the
    records in ``home`` and lift those proven ceased (run as their user, who owns the held
    jobs)."""
    from ..errors import SlurmError
    from ..slurm.adapter import Slurm
    from . import holds as asking
    from . import record
    from .events import Released

    def runner(argv: list[str], _timeout: float) -> asking.Answer:
        got = answers.get(f"{argv[-4]}:{argv[-2]}")
        if got is None:
            return asking.Answer("error", None, "not asked by the site's release service")
        return asking.Answer(got["verdict"], got["code"], got["evidence"])

    actions: list[str] = []
    errors: list[str] = []
    slurm = Slurm()
    for job in record.all_jobs(home):
        try:
            history = job.history()
            for line in [history.lineage()] + [history.lineage(t) for t in history.tasks]:
                hold = line.hold
                if (
                    hold is None
                    or (line.task is not None and hold.task is None)
                    or now >= hold.deadline
                ):
                    continue  # an expired hold is the owner's supervisor's to end
                answered = _answered(line.answers_for(hold.slurm_job_id))
                if answered is not None and now - answered < interval:
                    continue
                if not asking.ceased(
                    asking.ask(job, hold, signal, timeout, runner, lambda: now, hold.task)
                ):
                    continue
                try:
                    slurm.release([hold.slurm_job_id])
                except SlurmError as exc:
                    errors.append(
                        f"{job.id}: cannot release Slurm job {hold.slurm_job_id} "
                        f"(the hold stands): {exc}"
                    )
                    continue
                job.append(
                    Released,
                    slurm_job_id=hold.slurm_job_id,
                    by="the site's release service (ceased)",
                    task=hold.task,
                )
                asking.mark_released(slurm, job, hold, "(ceased, site)")
                actions.append(f"{job.id}: hold on Slurm job {hold.slurm_job_id} lifted: ceased")
                history = job.history()
        except (DispatchError, OSError) as exc:
            errors.append(f"{job.id}: {exc}")
    return {"actions": actions, "errors": errors}


# -- root's side -------------------------------------------------------------------------


def as_user(
    user: pwd.struct_passwd, home: str, work: Callable[..., dict[str, Any]], *args: Any
) -> dict[str, Any]:
    """``work(home, *args)`` in a forked child running as ``user`` (their uid, gid and groups,
    a scrubbed environment, cwd /): its JSON answer, or one error naming what failed.  The
    child is the user's to stop: past CHILD_TIMEOUT (and _account.GRACE) root kills it and
    that user alone is reported, so a caller's pass over every user goes on."""
    env = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": "C.UTF-8",
        "DISPATCH_HOME": home,
    }
    for name in ("SLURM_CONF", "SLURM_DISPATCH_CONF", "DISPATCH_SLURM_BACKEND"):
        if name in os.environ:
            env[name] = os.environ[name]

    def answer() -> bytes:
        return json.dumps(work(home, *args), sort_keys=True).encode()

    def failed(exc: BaseException) -> bytes:
        return json.dumps({"errors": [f"{type(exc).__name__}: {exc}"]}).encode()

    try:
        # The alarm: a hung file system ends the child.  The limit: the answer is the user's.
        data, status = _account.run_as(
            user, answer, failed, alarm=int(CHILD_TIMEOUT), env=env, cwd="/", limit=ANSWER_LIMIT
        )
    except OverflowError:
        return {
            "errors": [
                f"reading {home} as {user.pw_name}: the answer passed "
                f"{ANSWER_LIMIT} bytes; not read further (its records hold more "
                "than a site view shows)"
            ]
        }
    except TimeoutError:  # the user stopped their child (SIGSTOP), or it hung past its alarm
        return {
            "errors": [
                f"reading {home} as {user.pw_name}: no answer within "
                f"{CHILD_TIMEOUT:g} s (the child was stopped, or hung): ended with "
                "SIGKILL"
            ]
        }
    try:
        got = json.loads(data.decode("utf-8", "replace"))
        if not isinstance(got, dict):
            raise ValueError("not an object")
        return got
    except ValueError:
        return {
            "errors": [f"reading {home} as {user.pw_name} gave no answer (wait status {status})"]
        }


def view(chosen: list[tuple[pwd.struct_passwd, str]]) -> dict[str, Any]:
    """Every standing hold of every chosen user, read as that user; nothing is changed."""
    holds: list[dict[str, Any]] = []
    errors: list[str] = []
    for user, home in chosen:
        got = as_user(user, home, standing)
        for hold in got.get("holds", []):
            holds.append({"user": user.pw_name, **hold})
        errors += [f"{user.pw_name}: {e}" for e in got.get("errors", [])]
    holds.sort(key=lambda h: (h["deadline"], h["user"], h["dispatch_job"]))
    return {"holds": holds, "errors": errors}


def ask_as_root(
    signal: str,
    timeout: float,
    target: str,
    restart: int,
    runner: Optional[Callable[[list[str], float], Any]] = None,
) -> dict[str, Any]:
    """The CessationSignal's answer about one ended execution a user's record names."""
    from . import holds as asking

    if not _TARGET.match(target):
        return {
            "verdict": "error",
            "code": None,
            "evidence": f"{target!r} is not a Slurm job id; not asked",
        }
    _, answer = asking.ask_one(signal, target, restart, timeout, runner or asking.ask_signal)
    return {"verdict": answer.verdict, "code": answer.code, "evidence": answer.evidence}


def job_owners(target: str, state_dir: str, slurm: Any) -> tuple[set[int], str]:
    """Whose Slurm job ``target`` is, as root learns it without a user's record: the uids, and
    who says so (``the controller says``).  The controller first (it names the job that holds
    the id now), then Slurm's accounting (a job the controller forgot, MinJobAge), then the
    facts the hooks filed under the job's own uid (``StateDir/facts/<uid>/<job id>``, from
    Slurm's environment, root's: no user writes them).  No uid: nothing knows the job.  A
    controller that cannot answer is a SlurmError: who holds the id now is not known.
    Accounting that cannot answer (slurmdbd down) leaves it to the facts, as a site without
    accounting does."""
    from ..errors import SlurmError

    uids = {job.uid for job in slurm.jobs(target) if job.uid >= 0}
    if uids:
        return uids, "the controller says"
    try:
        uids = {job.uid for job in slurm.accounting(target) or [] if job.uid >= 0}
    except SlurmError:
        uids = set()
    if uids:
        return uids, "Slurm's accounting says"
    return set(_fact_owners(target, state_dir)), f"the facts under {state_dir} say"


def _fact_owners(target: str, state_dir: str) -> list[int]:
    """The uids whose facts are of ``target`` (an array task ``A_T`` the controller forgot: the
    uids whose facts of array A name task T, under whatever job id it ran)."""
    from ..errors import FactError
    from ..node import facts

    array, sep, task = target.partition("_")
    if not sep:
        return facts.job_uids(state_dir, target)
    try:
        uids = facts.fact_uids(state_dir)
    except FactError:
        return []
    found = []
    for uid in uids:
        try:
            if facts.array_task_job(state_dir, uid, array, task) is not None:
                found.append(uid)
        except FactError:  # its facts name the task more than once: it may be theirs
            found.append(uid)
    return found


class _Owners:
    """:func:`job_owners` once per Slurm job in a pass, whichever users' holds name it."""

    def __init__(self, state_dir: str) -> None:
        from ..slurm.adapter import Slurm

        self.state_dir = state_dir
        self.slurm = Slurm()
        self.known: dict[str, tuple[set[int], str]] = {}

    def of(self, target: str) -> tuple[set[int], str]:
        if target not in self.known:
            self.known[target] = job_owners(target, self.state_dir, self.slurm)
        return self.known[target]


def _not_theirs(target: str, user: pwd.struct_passwd, owners: _Owners) -> Optional[str]:
    """Why root does not ask about Slurm job ``target`` for ``user``'s hold (naming no other
    user), or None when it is ``user``'s own."""
    from ..errors import SlurmError

    if not _TARGET.match(target):
        return None  # ask_as_root refuses it, saying so
    try:
        uids, source = owners.of(target)
    except SlurmError as exc:
        return (
            f"whose job Slurm job {target} is cannot be learnt now ({exc}): not asked; the "
            "site's release service asks only about a user's own jobs"
        )
    if not uids:
        return (
            f"whose job it is, neither the controller, Slurm's accounting nor the facts "
            f"under {owners.state_dir} say (Slurm job {target}): not asked; the site's "
            "release service asks only about a user's own jobs"
        )
    if uids != {user.pw_uid}:
        return (
            f"Slurm job {target} is not {user.pw_name}'s, as {source}: not asked; the "
            "site's release service asks only about a user's own jobs"
        )
    return None


def _judged(evidence: Any) -> set[int]:
    """Every uid whose facts an answer says it judged (``dispatch-cease --json``'s ``uid``,
    an array's tasks' too)."""
    if not isinstance(evidence, dict):
        return set()
    uid = evidence.get("uid")
    found = {uid} if isinstance(uid, int) and not isinstance(uid, bool) else set()
    tasks = evidence.get("tasks")
    for task in tasks if isinstance(tasks, list) else []:
        found |= _judged(task)
    return found


def _theirs_only(answer: dict[str, Any], target: str, user: pwd.struct_passwd) -> dict[str, Any]:
    """``answer``, unless it was judged from another uid's facts: then an error without it."""
    if _judged(answer.get("evidence")) <= {user.pw_uid}:
        return answer
    return {
        "verdict": "error",
        "code": answer.get("code"),
        "evidence": f"the CessationSignal judged Slurm job {target} from another user's "
        "facts (a job id used twice: slurmctld's state started anew, or "
        "MaxJobId wrapped): its answer is not recorded here; release the hold "
        "by hand once you know",
    }


def release_pass(
    chosen: list[tuple[pwd.struct_passwd, str]],
    signal: str,
    timeout: float,
    interval: float,
    now: Optional[float] = None,
    *,
    state_dir: Optional[str] = None,
) -> dict[str, Any]:
    """One pass of the site's release service over the chosen users (``state_dir``: the
    site's StateDir, whose facts say whose a job the controller forgot was)."""
    if state_dir is None:
        from .. import config as config_module

        state_dir = config_module.load().state_dir
    owners = _Owners(state_dir)
    now = time.time() if now is None else now
    actions: list[str] = []
    errors: list[str] = []
    for user, home in chosen:
        got = as_user(user, home, standing)
        errors += [f"{user.pw_name}: {e}" for e in got.get("errors", [])]
        answers: dict[str, dict[str, Any]] = {}
        for hold in got.get("holds", []):
            if not isinstance(hold, dict) or now >= float(hold.get("deadline", 0)):
                continue
            ended_all = [e for e in hold.get("ended", []) if isinstance(e, dict)]
            answered = hold.get("answered_at")
            if isinstance(answered, (int, float)) and now - answered < interval:
                continue  # answered within CessationInterval: the next pass asks again
            for ended in ended_all:
                key = f"{ended.get('slurm_job_id')}:{ended.get('restart')}"
                if key in answers:
                    continue
                target = str(ended.get("slurm_job_id"))
                why = _not_theirs(target, user, owners)
                if why is not None:
                    answers[key] = {"verdict": "error", "code": None, "evidence": why}
                    continue
                answers[key] = _theirs_only(
                    ask_as_root(signal, timeout, target, int(ended.get("restart", 0))), target, user
                )
        if not answers:
            continue
        done = as_user(user, home, lift, answers, signal, timeout, interval, now)
        actions += [f"{user.pw_name}: {a}" for a in done.get("actions", [])]
        errors += [f"{user.pw_name}: {e}" for e in done.get("errors", [])]
    return {"actions": actions, "errors": errors}


# -- the group's copy: a snapshot root writes and members read ----------------------------

SNAPSHOT_DIR = "siteview"
SNAPSHOT = "holds.json"
SNAPSHOT_VERSION = 1


def snapshot_path(state_dir: str) -> str:
    """Where the release service keeps the group's copy of the view."""
    return os.path.join(state_dir, SNAPSHOT_DIR, SNAPSHOT)


def site_group(name: str, where: str) -> grp.struct_group:
    """The SiteViewGroup ``name`` (dispatch.conf ``where``), which must exist."""
    try:
        return grp.getgrnam(name)
    except KeyError:
        raise UsageError(
            f"SiteViewGroup={name} ({where}): no such group (or the directory "
            "service does not answer for it now)"
        ) from None


def write_snapshot(
    state_dir: str, group: grp.struct_group, seen: dict[str, Any], now: float
) -> str:
    """Replace the group's copy of the view with ``seen`` (root only): StateDir/siteview/ is
    made 0750 root:group (or set so, never through a symlink), holds.json in it 0640
    root:group, whole; the path written."""
    folder = os.path.join(state_dir, SNAPSHOT_DIR)
    try:
        state_fd = _fsio.open_dir(state_dir)
    except OSError as exc:
        raise UsageError(
            f"StateDir {state_dir!r}: cannot open it ({exc.strerror}): the "
            "site view's snapshot lives there"
        ) from None
    try:
        try:
            os.mkdir(SNAPSHOT_DIR, 0o700, dir_fd=state_fd)
        except FileExistsError:
            pass
        try:
            fd = _fsio.open_dir(SNAPSHOT_DIR, state_fd)
        except OSError as exc:
            raise RefusedError(
                f"{folder}: {exc.strerror} (a symlink is refused): not written"
            ) from None
    finally:
        os.close(state_fd)
    try:
        info = os.fstat(fd)
        if info.st_uid != 0:
            raise RefusedError(
                f"{folder} is owned by uid {info.st_uid}, not root: the site "
                "view is not written there; remove it"
            )
        os.fchown(fd, 0, group.gr_gid)
        os.fchmod(fd, 0o750)
        data = json.dumps(
            {"version": SNAPSHOT_VERSION, "written_at": now, **seen}, sort_keys=True
        ).encode()
        try:
            _fsio.replace(SNAPSHOT, data, 0o640, dir_fd=fd, gid=group.gr_gid)
        except OSError as exc:
            raise RefusedError(
                f"cannot write {folder}/{SNAPSHOT}: {exc.strerror}; the last snapshot stands"
            ) from None
    finally:
        os.close(fd)
    return os.path.join(folder, SNAPSHOT)


def remove_snapshot(state_dir: str) -> Optional[str]:
    """Remove the group's copy (root only; SiteViewGroup no longer set), never through a
    symlink, only a file in a root-owned StateDir/siteview/: the path removed, or None."""
    try:
        state_fd = _fsio.open_dir(state_dir)
    except OSError:
        return None
    try:
        fd = _fsio.open_dir(SNAPSHOT_DIR, state_fd)
    except OSError:
        return None
    finally:
        os.close(state_fd)
    try:
        if os.fstat(fd).st_uid != 0:
            return None
        try:
            info = os.stat(SNAPSHOT, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                return None
            os.unlink(SNAPSHOT, dir_fd=fd)
        except OSError:
            return None
    finally:
        os.close(fd)
    return snapshot_path(state_dir)


def read_snapshot(state_dir: str, group: grp.struct_group, where: str) -> dict[str, Any]:
    """The group's copy of the view, for a member of ``group``: refused, naming the group, for
    anyone else; an error naming the file when there is none or it is not root's and whole."""
    member = group.gr_gid == os.getegid() or group.gr_gid in os.getgroups()
    if not member:
        try:
            who = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            who = f"uid {os.geteuid()}"
        raise RefusedError(
            f"{who} is not root and not in SiteViewGroup {group.gr_name} "
            f"({where}): only root and members of {group.gr_name} see other "
            "users' holds"
        )
    return load_snapshot(snapshot_path(state_dir))


def load_snapshot(path: str) -> dict[str, Any]:
    """The view in the file ``path``, root's and whole: an error naming it otherwise."""
    try:
        fd = _fsio.open_file(path, nonblock=True)
    except FileNotFoundError:
        raise RefusedError(
            f"no site view at {path}: root's dispatch-admin release-service "
            "writes it on each pass (its timer, contrib/systemd/"
            "dispatch-release.timer); is it running?"
        ) from None
    except OSError as exc:
        raise RefusedError(f"cannot read the site view {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != 0 or not stat.S_ISREG(info.st_mode) or info.st_mode & 0o002:
            raise RefusedError(
                f"{path} is not root's file (uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):04o}): not trusted"
            )
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        seen = json.loads(b"".join(chunks))
        if (
            not isinstance(seen, dict)
            or seen.get("version") != SNAPSHOT_VERSION
            or not isinstance(seen.get("written_at"), (int, float))
        ):
            raise ValueError("not a site view")
    except ValueError as exc:
        raise RefusedError(f"{path}: {exc}") from None
    return seen
