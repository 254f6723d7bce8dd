"""What each hook records (runs in the child that :func:`slurm_dispatch.hooks.run` forked).

* ``prolog`` (node, root): "execution R of job J started on node X" with the machine's boot id
  and boot time, and for an array's task the array and task id it is (J is the task's own id).
* ``epilog`` (node, root; Slurm runs it after slurmd killed the job's tracked processes): scans
  /proc for processes still carrying the job's ``SLURM_JOB_ID`` and restart count (which is how a
  process that escaped tracking with setsid or a double fork is caught), and records the end tied
  to the start this same node recorded, with the survivors found.  The same /proc pass re-checks
  survivors of earlier jobs that this machine still watches.  An orphan's Epilog (Slurm gives
  it uid 0, no restart count, but the execution's SLUID) records the owner's end, tied to the
  start of that SLUID (:func:`_orphans_start`).  Start, end, watch entry and the controller's
  facts carry the SLUID where Slurm gives one (26.05 and later), and an end is tied to the
  open start of its own SLUID where several are open: job ids start again once a controller
  lost its state, and the id's run from before is another execution.
  The end says where the job's cgroup was looked for (every naming and slice:
  :func:`slurm_dispatch.node.procscan.cgroup_look`) and, where slurm.conf runs proctrack/cgroup
  but no place Slurm keeps cgroups was found, that the survivors were judged by /proc alone
  (``cgroup.missing``).
* ``recheck`` (health check or timer, root): re-checks watched survivors; records when they are
  gone (or the machine rebooted), so ``dispatch-cease`` can prove cessation later.
* ``prolog-slurmctld`` / ``epilog-slurmctld`` (controller, SlurmUser): the allocation (and an
  array task's array and task id) and the end state as the controller saw it.

Every handler raises on a fault; the caller logs it and exits 0.
"""

from __future__ import annotations

import os
import time

from ..config import Config
from ..errors import FactError
from ..node import factstore as store

TYPE_CHECKING = False
if TYPE_CHECKING:  # the scan is imported where a hook scans (the Epilog, a re-check with work)
    from typing import Mapping, Optional, TypedDict

    from ..node import procscan
    from ..node.factstore import Fact
    from ..node.procscan import Process

    class WatchEntry(TypedDict, total=False):
        """A node's watch of one execution's survivors (``StateDir/watch/``), which each
        re-check scans again until they are gone; read from a file, like a fact."""

        v: int
        job_id: str
        uid: int
        gid: int
        node: str
        restart: object
        end_token: str  # the end whose survivors these are
        sluid: str
        boot_id: Optional[str]
        time: float
        survivors: list[Process]
        end: Fact  # the end its Epilog was writing (the first entry only), but its survivors
        _name: str  # its file's name, once read


# This run's survivor scans, for the node's metrics: (hook, seconds, complete, survivors).
SCANS: list[tuple[str, float, bool, int]] = []

# Variables of the job's end that EpilogSlurmctld and Epilog may carry (22.05 and later).
_END_VARIABLES = (
    "SLURM_JOB_EXIT_CODE",
    "SLURM_JOB_EXIT_CODE2",
    "SLURM_JOB_DERIVED_EC",
    "SLURM_JOB_STATE",
    "SLURM_JOB_REASON",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_NAME",
    "SLURM_JOB_USER",
    "SLURM_SCRIPT_CONTEXT",
)


def _require(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise FactError(f"${name} is not set; recording nothing")
    return value


def _int_var(name: str) -> int:
    value = _require(name)
    if not (value.isascii() and value.isdigit()):  # isdigit() alone admits other scripts
        raise FactError(f"${name}={value!r} is not a number; recording nothing")
    return int(value)


def _restart_env() -> tuple[int, str | None]:
    raw = os.environ.get("SLURM_JOB_RESTART_COUNT")
    if raw is None or raw == "":
        return 0, raw
    if not (raw.isascii() and raw.isdigit()):
        raise FactError(f"$SLURM_JOB_RESTART_COUNT={raw!r} is not a number")
    return int(raw), raw


def _job() -> tuple[str, int, int]:
    job_id = store.check_name(_require("SLURM_JOB_ID"), "$SLURM_JOB_ID")
    return job_id, _int_var("SLURM_JOB_UID"), _int_var("SLURM_JOB_GID")


def _node() -> str:
    return store.check_name(_require("SLURMD_NODENAME"), "$SLURMD_NODENAME")


def _array_task() -> dict[str, str]:
    """For an array's task, the array and task id Slurm gives the Prolog and PrologSlurmctld
    (``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``): what ties the task's facts, filed under
    its own job id, to the records that name ``A`` and ``A_T``.  Each is recorded only when it
    is ASCII digits (a job id's at most 10): anything else is recorded as absent, and the
    hook records the rest as ever (a bad value only loses the tie, never the fact)."""
    found = {}
    for key, name in (
        ("array_job_id", "SLURM_ARRAY_JOB_ID"),
        ("array_task_id", "SLURM_ARRAY_TASK_ID"),
    ):
        value = os.environ.get(name, "")
        if 0 < len(value) <= 10 and value.isascii() and value.isdigit():
            found[key] = value
    return found


def _sluid() -> dict[str, str]:
    """``{"sluid": ...}`` where Slurm gives the execution one (``SLURM_JOB_SLUID``, 26.05 and
    later: an id of this execution alone; a requeue draws a new one), else {}.  Recorded only
    when it is 1 to 64 ASCII letters and digits (a bad value loses the tie, never the fact)."""
    value = os.environ.get("SLURM_JOB_SLUID", "")
    if 0 < len(value) <= 64 and value.isascii() and value.isalnum():
        return {"sluid": value}
    return {}


def _end_variables() -> dict[str, str]:
    return {name: os.environ[name] for name in _END_VARIABLES if name in os.environ}


def prolog(cfg: Config) -> None:
    job_id, uid, gid = _job()
    node = _node()
    restart, raw = _restart_env()
    store.write_fact(
        cfg.state_dir,
        uid,
        gid,
        job_id,
        "start",
        node,
        {
            "time": time.time(),
            "restart": restart,
            "restart_env": raw,
            "boot_id": store.boot_id(),
            "boot_time": store.boot_time(),
            "hostname": os.uname().nodename,
            **_array_task(),
            **_sluid(),
        },
    )


def _unended_start(
    cfg: Config,
    uid: int,
    job_id: str,
    node: str,
    restart: int,
    kinds: tuple[str, str] = ("start", "end"),
    oldest: bool = False,
    sluid: str = "",
) -> tuple[str, int] | None:
    """(token, restart) of the start ``node`` recorded for the job with no end tied to it yet.

    Read from the file names alone: an end carries the token of its start.  A node prefers the
    start with the restart count Slurm gives now, else its latest; the controller (``oldest``)
    ends its executions in the order they started, whatever count its EpilogSlurmctld is given
    (after ``scontrol requeue`` it is the next execution's).  Where several starts are open and
    Slurm gives the hook the execution's ``sluid``, the start of that SLUID is the one: job ids
    start again once a controller lost its state, and a run of the id from before (its end
    never recorded) is another execution, whatever its restart count.
    """
    starts: list[tuple[str, str]] = []
    ended = set()
    # The folder holds every node's facts of the job (a 512-node job's, 1,000 and more): only
    # this node's of the two kinds are parsed (a node "n1.x" passes the prefix of "n1", not the
    # parse's check).
    prefixes = (f"{kinds[0]}.{node}.", f"{kinds[1]}.{node}.")
    for name in store.list_job(cfg.state_dir, uid, job_id):
        if not name.startswith(prefixes):
            continue
        parsed = store.parse_name(name)
        if parsed is None or parsed[1] != node:
            continue
        kind, _, restart_text, token = parsed
        if kind == kinds[0] and restart_text.isdigit():
            starts.append((token, restart_text))
        elif kind == kinds[1]:
            ended.add(token)
    open_starts = sorted(s for s in starts if s[0] not in ended)
    if not open_starts:
        return None
    if sluid and len(open_starts) > 1:
        open_starts = (
            _of_sluid(cfg, uid, job_id, f"{kinds[0]}.{node}.", sluid, open_starts) or open_starts
        )
    if oldest:
        token, restart_text = open_starts[0]
        return token, int(restart_text)
    same = [s for s in open_starts if int(s[1]) == restart]
    token, restart_text = (same or open_starts)[-1]
    return token, int(restart_text)


def _of_sluid(
    cfg: Config, uid: int, job_id: str, prefix: str, sluid: str, candidates: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The ``candidates`` (token, restart) whose start fact records ``sluid``."""
    facts, _problems = store.read_job_facts(cfg.state_dir, uid, job_id, (prefix,))
    tokens = {str(f.get("token")) for f in facts if f.get("sluid") == sluid}
    return [c for c in candidates if c[0] in tokens]


def _orphans_start(
    cfg: Config, job_id: str, node: str, sluid: str
) -> tuple[int, int, str, int] | None:
    """(uid, gid, token, restart) of the start with no end yet that ``node`` recorded for the
    execution ``sluid``, in whichever user's folder holds it, or None.

    For an orphan's Epilog: an execution that slurmctld no longer knows by its SLUID (26.05
    looks up the steps of a node that rejoins by SLUID, and a requeue drew the job a new one)
    is an "Orphan" to it, and the Epilog it then runs is given ``SLURM_JOB_UID=0``, no restart
    count and no times, but still the SLUID its Prolog was given.  Only this node's starts of
    the job are read (in the folders of the users that have the job).
    """
    for uid in store.job_uids(cfg.state_dir, job_id):
        names = store.list_job(cfg.state_dir, uid, job_id)
        ended = {
            parsed[3]
            for parsed in map(store.parse_name, names)
            if parsed is not None and parsed[0] == "end" and parsed[1] == node
        }
        starts, _problems = store.read_job_facts(cfg.state_dir, uid, job_id, (f"start.{node}.",))
        for fact in starts:
            restart, gid = fact.get("restart"), fact.get("gid")
            if (
                fact.get("sluid") == sluid
                and fact.get("node") == node
                and fact.get("token") not in ended
                and fact.get("uid") == uid
                and isinstance(restart, int)
                and isinstance(gid, int)
            ):
                return uid, gid, str(fact["token"]), restart
    return None


def _belongs(process: Process, node: str, restart: object) -> bool:
    """Whether a process found for a job belongs to the execution this node ran: its
    environment names this node (or no node) and this restart count.  Where nodes share a
    machine (the sandbox), another node's processes of the same job are its own business."""
    if process.get("source") == "cgroup" or process.get("unresolved"):
        return True
    return process.get("env_node") in (None, node) and process.get("restart") == restart


def _unresolved(scan: procscan.Scan, restart: object) -> list[Process]:
    """PIDs the scan could not read, as survivors: not knowing is not proof."""
    return [
        {
            "pid": pid,
            "ppid": None,
            "state": "?",
            "starttime": None,
            "uid": None,
            "restart": restart,
            "env_node": None,
            "unresolved": True,
            "cmdline": f"(not readable within {scan.seconds:.1f} s: vanished and replaced "
            "faster than the scan, or stuck; not known to be gone)",
        }
        for pid in scan.unresolved
    ]


def _execution_survivors(
    cfg: Config,
    scan: procscan.Scan,
    job_id: str,
    uid: int,
    node: str,
    restart: object,
    sluid: str | None = None,
) -> tuple[list[Process], procscan.CgroupLook]:
    """The execution's survivors, and where its cgroup was looked for."""
    from ..node import procscan

    survivors = [p for p in scan.found.get(job_id, []) if _belongs(p, node, restart)]
    if not scan.complete:
        survivors += _unresolved(scan, restart)
    # proctrack/cgroup: the job's cgroup holds its processes whatever their environment says.
    look = procscan.cgroup_look(cfg.cgroup_root, job_id, uid, node, sluid)
    known = {p["pid"] for p in survivors}
    return survivors + [p for p in look.processes or [] if p["pid"] not in known], look


def _cgroup_evidence(cfg: Config, look: procscan.CgroupLook) -> dict[str, object]:
    """What the Epilog says of the job's cgroup: where Slurm keeps jobs' cgroups on this
    machine (``scopes``), the job's folders found there (``folders``, by the ``names`` looked
    for), and, where slurm.conf says ``ProctrackType=proctrack/cgroup`` but no place Slurm
    keeps jobs' cgroups was found under CgroupRoot, ``missing``: survivors were then judged by
    /proc alone, and the evidence says so instead of going quiet.  A scope without the job's
    folder is Slurm's own word that the job's cgroup emptied (it removes it then)."""
    from ..node import slurmconf

    proctrack = slurmconf.setting("ProctrackType")
    said: dict[str, object] = {
        "proctrack": proctrack,
        "scopes": look.scopes,
        "folders": look.folders,
        "names": look.names,
    }
    if proctrack is not None and proctrack.strip() == "proctrack/cgroup" and not look.scopes:
        said["missing"] = (
            f"ProctrackType=proctrack/cgroup in {slurmconf.slurm_conf_path()}, "
            f"but {cfg.cgroup_root} holds no slurmstepd scope (cgroup v2, in any "
            "slice) nor a slurm folder (cgroup v1): the job's cgroup was not "
            "read; set CgroupRoot in dispatch.conf to cgroup.conf's "
            "CgroupMountpoint"
        )
    return said


def _scan_budget(cfg: Config) -> float:
    # Half the hook's time: the rest writes the record, whatever the scan met.
    return max(0.05, cfg.hook_timeout * 0.5)


def epilog(cfg: Config) -> None:
    job_id, uid, gid = _job()
    node = _node()
    restart_now, raw = _restart_env()
    sluid = _sluid()
    start = _unended_start(cfg, uid, job_id, node, restart_now, sluid=sluid.get("sluid", ""))
    orphan = None
    if start is None and sluid:
        # An orphan's Epilog (given uid 0): its end is the owner's, tied to the start of its
        # SLUID, and the survivors are looked for among the owner's processes.
        orphan = _orphans_start(cfg, job_id, node, sluid["sluid"])
        if orphan is not None:
            uid, gid = orphan[0], orphan[1]
            start = orphan[2], orphan[3]
    restart = start[1] if start is not None else restart_now
    try:
        watched, unreadable = _watched(cfg), None
    except FactError as exc:
        # A watch/ that cannot be opened costs the re-checks, never this end: raised after it.
        watched, unreadable = [], exc
    jobs: dict[str, int | None] = {job_id: uid}
    for entry in watched:
        jobs.setdefault(str(entry["job_id"]), int(entry["uid"]))
    scan_error = None
    from ..node import procscan

    cgroup: dict[str, object] | None = None
    try:
        scan = procscan.scan_within(jobs, _scan_budget(cfg))
        survivors, look = _execution_survivors(
            cfg, scan, job_id, uid, node, restart, sluid.get("sluid")
        )
        cgroup = _cgroup_evidence(cfg, look)
    except OSError as exc:
        scan, survivors = None, []
        scan_error = f"cannot scan /proc: {exc.strerror}"
    boot = (store.boot_id(), store.boot_time())  # read once: /proc/stat is long on big nodes
    body: dict[str, object] = {
        "time": time.time(),
        "restart": restart,
        "restart_env": raw,
        "start_token": start[0] if start is not None else None,
        "boot_id": boot[0],
        "boot_time": boot[1],
        "hostname": os.uname().nodename,
        "survivors": survivors,
        "scan_error": scan_error,
        "scan": None
        if scan is None
        else {"rounds": scan.rounds, "complete": scan.complete, "seconds": round(scan.seconds, 4)},
        "cgroup_root": cfg.cgroup_root,
        "cgroup": cgroup,
        "slurm": _end_variables(),
        **sluid,
    }
    if orphan is not None:
        body["orphan"] = True  # Slurm gave its Epilog uid 0 (see _orphans_start)
    token = start[0] if start is not None else store.new_token()
    unwatched = None
    if survivors and not scan_error:
        # The watch entry before the end: a hook ended in between leaves an entry whose
        # re-check no reader ties to an end (the execution has none: not proven), never an
        # end with survivors that nothing re-checks (never proven, whatever became of them).
        # One that cannot be written still lets the end record what the scan found.
        try:
            # The entry carries the end itself, but for the survivors it holds already (a
            # fact or an entry is at most MAX_FACT_BYTES): a re-check records it where missing.
            _add_watch(
                cfg,
                {
                    "job_id": job_id,
                    "uid": uid,
                    "gid": gid,
                    "node": node,
                    "restart": restart,
                    "end_token": token,
                    **sluid,
                    "boot_id": body["boot_id"],
                    "time": body["time"],
                    "survivors": survivors,
                    "end": {k: v for k, v in body.items() if k != "survivors"},
                },
            )
        except FactError as exc:
            unwatched = exc
    store.write_fact(cfg.state_dir, uid, gid, job_id, "end", node, body, token=token)
    if unwatched is not None:
        raise unwatched
    if scan is not None:
        SCANS.append(("epilog", scan.seconds, scan.complete, len(survivors)))
        _settle(cfg, watched, scan, boot)
    if unreadable is not None:
        raise unreadable


def recheck(cfg: Config) -> None:
    watched = _watched(cfg)
    if not watched:
        return
    jobs: dict[str, int | None] = {}
    for entry in watched:
        jobs.setdefault(str(entry["job_id"]), int(entry["uid"]))
    from ..node import procscan

    scan = procscan.scan_within(jobs, _scan_budget(cfg))
    SCANS.append(
        ("recheck", scan.seconds, scan.complete, sum(len(found) for found in scan.found.values()))
    )
    _settle(cfg, watched, scan)


def _controller_fact(cfg: Config, kind: str, extra: Mapping[str, object]) -> None:
    """What the controller saw of one execution: its nodes, and for an end, Slurm's words.

    An end is tied to the controller's start it closes, the way a node's end is (it takes the
    start's token and restart count): the count EpilogSlurmctld is given is not reliable.
    """
    job_id, uid, gid = _job()
    restart, raw = _restart_env()
    token = None
    sluid = _sluid()
    if kind == "ctld-end":
        start = _unended_start(
            cfg,
            uid,
            job_id,
            CONTROLLER,
            restart,
            ("ctld-start", "ctld-end"),
            oldest=True,
            sluid=sluid.get("sluid", ""),
        )
        if start is not None:
            token, restart = start
            extra = {**extra, "start_token": token}
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or ""
    from ..slurm import hostlist

    store.write_fact(
        cfg.state_dir,
        uid,
        gid,
        job_id,
        kind,
        CONTROLLER,
        {
            "time": time.time(),
            "restart": restart,
            "restart_env": raw,
            "nodelist": nodelist,
            "nodes": hostlist.expand_hostlist(nodelist),
            **extra,
            **sluid,
        },
        token=token,
    )


CONTROLLER = "slurmctld"  # the node name the controller's facts are recorded under


def prolog_slurmctld(cfg: Config) -> None:
    _controller_fact(cfg, "ctld-start", _array_task())


def epilog_slurmctld(cfg: Config) -> None:
    _controller_fact(cfg, "ctld-end", {"slurm": _end_variables()})


HANDLERS = {
    "prolog": prolog,
    "epilog": epilog,
    "recheck": recheck,
    "prolog-slurmctld": prolog_slurmctld,
    "epilog-slurmctld": epilog_slurmctld,
}


# --------------------------------------------------------------------------------------------
# Survivors this machine watches: StateDir/watch/<hostname>/<uid>.<jobid>.<token>


def _watch_dir(cfg: Config, create: bool) -> int | None:
    host = store.check_name(os.uname().nodename, "hostname")
    base = store.open_state_dir(cfg.state_dir)
    try:
        if not create:
            try:
                os.stat(store.WATCH, dir_fd=base, follow_symlinks=False)
            except FileNotFoundError:
                return None
        top = store.open_subdir(base, store.WATCH, f"{cfg.state_dir}/{store.WATCH}", 0o700)
        try:
            if not create:
                try:
                    os.stat(host, dir_fd=top, follow_symlinks=False)
                except FileNotFoundError:
                    return None
            return store.open_subdir(top, host, f"{cfg.state_dir}/{store.WATCH}/{host}", 0o700)
        finally:
            os.close(top)
    finally:
        os.close(base)


def _watched(cfg: Config) -> list[WatchEntry]:
    fd = _watch_dir(cfg, create=False)
    if fd is None:
        return []
    entries = []
    try:
        # A dot-name is an entry not yet written whole (create_file), or one a killed hook left.
        names = sorted(n for n in os.listdir(fd) if not n.startswith("."))
        if names:
            import json
        for name in names:
            try:
                data = store.read_regular(fd, name, {os.geteuid()})
                entry = json.loads(data)
                problem = store.format_problem(entry)
                if problem:
                    raise FactError(problem)  # a newer hook's entry: it settles it itself
                entry["_name"] = name
                store.check_name(str(entry["job_id"]), "job id")
                int(entry["uid"]), int(entry["gid"])
                entries.append(entry)
            except (FactError, ValueError, KeyError, TypeError) as exc:
                from . import log

                log(f"watch entry {name}: {exc}; ignored")
    finally:
        os.close(fd)
    return entries


def _add_watch(cfg: Config, entry: Mapping[str, object]) -> None:
    fd = _watch_dir(cfg, create=True)
    assert fd is not None
    try:
        name = f"{entry['uid']}.{entry['job_id']}.{store.new_token()}"
        data = store.dumps({**entry, "v": store.FORMAT_VERSION}).encode()
        store.create_file(fd, name, data, f"{cfg.state_dir}/{store.WATCH}", 0o600)
    finally:
        os.close(fd)


def _drop_watch(cfg: Config, name: str) -> None:
    fd = _watch_dir(cfg, create=False)
    if fd is None:
        return
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _entry_time(entry: WatchEntry) -> float | None:
    """When a watch entry was made: its ``time``, else its name's token (nanoseconds, hex)."""
    value = entry.get("time")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    token = str(entry.get("_name", "")).rpartition(".")[2][:16]
    try:
        return int(token, 16) / 1e9
    except ValueError:
        return None


def _end_left_unwritten(cfg: Config, entry: WatchEntry) -> bool:
    """Record the end an Epilog ended between its watch entry and its end did not, from the
    entry (``end``: the end as that Epilog was writing it, whose survivors are the entry's):
    without it the re-check recorded next ties to no end, and the execution would never be
    proven on that node.  False (settle the entry later) while the entry is younger than
    HookTimeout: its Epilog may be at work.  Only the Epilog's own entry carries ``end``: a
    renewed one is written once the end is recorded, and its survivors are fewer."""
    body = entry.get("end")
    token = entry.get("end_token")
    if not isinstance(body, dict) or not isinstance(token, str):
        return True  # an entry of an earlier release, which carries no end
    uid, job_id, node = int(entry["uid"]), str(entry["job_id"]), str(entry["node"])
    name = store.fact_name("end", node, body.get("restart"), token)
    if name in store.list_job(cfg.state_dir, uid, job_id):
        return True
    made = _entry_time(entry)
    if made is not None and time.time() - made < cfg.hook_timeout:
        return False
    try:
        store.write_fact(
            cfg.state_dir,
            uid,
            int(entry["gid"]),
            job_id,
            "end",
            node,
            {
                **body,
                "survivors": entry.get("survivors") or [],
                "recorded_by": "recheck: the Epilog was ended before it",
            },
            token=token,
        )
    except FactError:
        if name not in store.list_job(cfg.state_dir, uid, job_id):
            raise  # else the Epilog itself, slow, wrote it in between
    return True


def _settle(
    cfg: Config,
    watched: list[WatchEntry],
    scan: procscan.Scan,
    boot: tuple[str, float | None] | None = None,
) -> None:
    """Record what became of watched survivors; stop watching those that are all gone.

    Each entry is one execution on one node (its end's token): its survivors are the processes
    of that job, node and restart count, never all of the job's.  An entry of another boot is
    settled as "rebooted" only if this machine booted after the entry was made; otherwise it is
    another machine with this host name (a shared StateDir) and is left for that machine.
    ``boot``: this machine's boot id and boot time as the caller read them already.
    """
    if not watched:
        return
    current_boot, booted = boot if boot is not None else (store.boot_id(), store.boot_time())
    for entry in watched:
        job_id = str(entry["job_id"])
        if entry.get("boot_id") and entry.get("boot_id") != current_boot:
            made = _entry_time(entry)
            if booted is None or made is None or booted <= made:
                continue
            now: list[Process] = []
            reason = "the machine rebooted"
        elif not scan.complete and scan.unresolved:
            continue  # not knowing is no news: keep watching
        else:
            sluid = entry.get("sluid")
            now, _ = _execution_survivors(
                cfg,
                scan,
                job_id,
                int(entry["uid"]),
                str(entry["node"]),
                entry.get("restart"),
                sluid if isinstance(sluid, str) else None,
            )
            reason = "re-scanned /proc"
        before = {(s.get("pid"), s.get("starttime")) for s in entry.get("survivors", [])}
        after = {(s.get("pid"), s.get("starttime")) for s in now}
        if now and after == before:
            continue
        if not _end_left_unwritten(cfg, entry):
            continue  # its Epilog may be writing the end still: settled by a later re-check
        store.write_fact(
            cfg.state_dir,
            int(entry["uid"]),
            int(entry["gid"]),
            job_id,
            "recheck",
            str(entry["node"]),
            {
                "time": time.time(),
                "restart": entry.get("restart"),
                "end_token": entry.get("end_token"),
                "boot_id": current_boot,
                "survivors": now,
                "reason": reason,
            },
        )
        if now:
            # The new entry first: a hook ended in between leaves two (re-checked alike),
            # never none (the survivors left would be watched no more, never proven gone).
            fresh = {k: v for k, v in entry.items() if k not in ("_name", "end")}
            fresh["survivors"] = now
            _add_watch(cfg, fresh)
        _drop_watch(cfg, entry["_name"])
