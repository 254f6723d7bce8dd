"""What the users' records still need of ``facts/``: ``dispatch-admin prune`` asks before it
removes a job's facts.

A record needs the facts of every Slurm job it names (each submission, each execution the
launcher recorded) while it is not settled (the supervisor may still ask whether an ended job
ceased, and resubmit), and of a standing hold's held and ended jobs whatever else it says.
An array's task is named as the array (``97``) or as ``97_1`` (a hold): prune ties a task's
folder, filed under its own job id, to those names by what its facts say (node/prune.py).
Records are read where the commands write them by default, ``~/.local/state/slurm-dispatch``
in each user's home (a home moved with ``$DISPATCH_HOME`` is not seen), by a child process
running as that user, as the site's view reads them (:mod:`.siteview`).  A user whose records
cannot be read (a home not mounted, a garbled record) or whose uid the account database does
not answer for (a gone account and a directory service down look the same) needs everything:
:func:`user_needs` says ``None`` and nothing of theirs is removed.

Retention of the records themselves (``RecordRetention``): :func:`forget_old` has each user's
child forget, by ``dispatch forget``'s own judgement (:mod:`.forget`: never a record a Slurm
job of which the controller still knows, a held one, one being submitted, an unsettled one,
or one an unsettled job waits for), the records of this cluster last active before a time.
The child asks Slurm for the user's jobs (one ``squeue --me``) only when the user has such a
record.  A record goes whole or not at all (renamed to a dot name, then removed; what a killed
run left is finished by the next).
"""

from __future__ import annotations

import os
import pwd
from typing import Any, Iterator, Optional

from ..errors import DispatchError
from . import events, forget, record, sbatch_words


def needed_slurm_jobs(home: str) -> set[str]:
    """The Slurm job ids whose facts the records under ``home`` still need; raises
    DispatchError (RecordError) on a record that cannot be read."""
    needed: set[str] = set()
    for job in record.all_jobs(home):
        history = job.history()
        tasks = sbatch_words.array_tasks(job)
        lines = [history.lineage()] + [history.lineage(t) for t in tasks or []]
        standing = [line.hold for line in lines if line.hold is not None]
        if standing or not forget.settled(job):
            needed |= {s.slurm_job_id for s in history.submissions if s.slurm_job_id}
            needed |= {s.slurm_job_id for s in history.of(events.Started) if s.slurm_job_id}
        for hold in standing:
            needed |= {i for i in (hold.slurm_job_id, hold.ended_slurm_job_id) if i}
    return needed


def _answer(home: str) -> dict[str, list[str]]:
    """What :func:`user_needs`'s child, running as the user, answers."""
    return {"needed": sorted(needed_slurm_jobs(home))}


def user_needs(uid: int, pattern: Optional[str] = None) -> Optional[set[str]]:
    """The Slurm job ids user ``uid``'s records (under ``pattern``, :func:`siteview.records_of`;
    default the users' default home) still need, read by a child running as that user (root
    never opens a user's record: :func:`siteview.as_user`); ``None`` when they cannot be read
    (so that every fact of theirs is kept); an empty set for a user with no records."""
    from . import siteview

    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        # An account that is gone and a directory service that did not answer (sssd down)
        # both raise KeyError: keep everything (an admin removes a gone user's facts by hand).
        return None
    pattern = pattern or siteview.DEFAULT_RECORDS
    home = siteview.records_of(pattern, user)
    try:
        if "%h" in pattern:  # a home not there (not mounted?) could hold records: keep all
            os.stat(user.pw_dir)
    except OSError:
        return None
    # Whether there are records at all is asked as the user too: root may not see into a
    # root-squashed home, and 'cannot look' is not 'nothing there' (record.all_jobs says []
    # only for a jobs/ folder that is absent).
    got = siteview.as_user(user, home, _answer)
    needed = got.get("needed")
    if got.get("errors") or not isinstance(needed, list):
        return None
    return {str(i) for i in needed}


def expire_records(
    home: str, cluster: Optional[str], before: float, dry_run: bool
) -> dict[str, Any]:
    """What :func:`forget_old`'s child does, as the user: forget (or, ``dry_run``, only judge)
    the records in ``home`` of ``cluster`` last active before ``before``."""
    from ..slurm.adapter import Slurm
    from . import dependency

    mine = record.cluster_jobs(cluster, home)
    old = [job for job in mine if forget.last_activity(job) < before]
    going: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    if old:  # Slurm is asked only for a user with something to judge
        going, kept = forget.plan(old, Slurm().own_jobs(), dependency.dependents(mine), before)
    if dry_run:
        return {"forgotten": going, "kept": kept, "finished": []}
    try:
        finished = forget.forget_planned(old, going, home)
    except DispatchError as exc:  # one could not be removed: say which went before it
        gone = [
            e for e in going if not os.path.lexists(os.path.join(record.jobs_dir(home), e["id"]))
        ]
        return {"forgotten": gone, "kept": kept, "finished": [], "errors": [str(exc)]}
    return {"forgotten": going, "kept": kept, "finished": finished}


def forget_old(
    chosen: list[tuple[pwd.struct_passwd, str]], cluster: str, before: float, dry_run: bool
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(user name, :func:`expire_records`' answer) for each chosen user, run as that user
    (``errors`` in an answer: nothing of that user was judged, or forgetting one failed)."""
    from . import siteview

    for user, home in chosen:
        yield user.pw_name, siteview.as_user(user, home, expire_records, cluster, before, dry_run)
