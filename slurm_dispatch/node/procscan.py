"""The survivor scan: processes of a job still alive on this machine after slurmd's kill.

A process belongs to job J when its environment holds ``SLURM_JOB_ID=J``: Slurm gives it to every
process of a job and it survives ``setsid`` and double forks, which is how a process escapes
``proctrack/linuxproc``.  Its ``SLURM_RESTART_COUNT`` (unset: 0) and ``SLURMD_NODENAME`` say which
execution, on which node, it belongs to: a process started with a cleaned environment (a
container's ``--cleanenv``) is found only if it kept these three (the user guide's container
section says how).  Where the site runs ``proctrack/cgroup``, the job's cgroup
(:func:`cgroup_look`) is stronger evidence: it holds a process whatever its environment
says.  It is looked for under every name and slice a release gives it: cgroup/v2's
``job_<id>``, or from 26.05 the execution's SLUID (unless cgroup.conf's ``CgroupJobIdPaths=yes``),
in the slurmstepd scope of whatever slice holds it (``system.slice``, or 25.11's
``CgroupSlice``), and cgroup v1's ``slurm/uid_<uid>/job_<id>``; where it was looked for is part
of the answer, so a caller can say that nothing was found where something should be.

Invariants:

* A process is counted only if one of its uids (real, effective, saved, file system) is the job's
  own or root: another user cannot keep a victim's job unproven by claiming its id.  Slurm's own
  prolog and epilog processes (all uids root, ``SLURM_SCRIPT_CONTEXT`` set) are not counted.
* One pass over /proc is not enough: a process whose PID changes all the time (fork, the parent
  exits, again) is gone before the pass reaches it.  :func:`scan` re-lists /proc and examines the
  new PIDs until a round in which every PID it examined could be read alive.  Any process alive
  at that round's listing was then read (it was either new in it, or seen before and read alive:
  a PID that vanished in an earlier round was dead before this listing).  A scan that does not
  get there by its deadline names the PIDs it could not read (``unresolved``), never a clean pass.
* A process read alive may be killed before the scan ends (slurmd's SIGKILL reaches a trap's
  reparented child after the Epilog began, on a loaded node).  Before it returns, the scan reads
  each process it found again: one that is gone (its PID missing, reused, or a zombie) is no
  survivor; one that is dying (exiting, or SIGKILL pending) is waited for until the deadline and
  counted if it is still there (a process stuck in the kernel with SIGKILL pending is exactly
  the survivor a proof must not miss).
* A thread group whose leader exited (``SYS_exit`` in the main thread) shows a zombie leader with
  an empty environment; its live threads are read instead.  Environments are read to their end,
  in chunks (no size cut).
* Standard library only (the Epilog imports it); it reads /proc and cgroups and never writes.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc costs a hook's start-up 1.5 ms; only mypy needs it
    from collections.abc import Collection, Iterable, Iterator
    from typing import Optional, TypedDict

    class _ProcessSeen(TypedDict):
        pid: int
        ppid: Optional[int]
        state: str  # /proc/PID/stat's state letter ("?" where it could not be read)
        starttime: Optional[int]  # clock ticks after boot: with the PID, the process's identity
        uid: Optional[int]
        restart: object  # SLURM_RESTART_COUNT in its environment (0 where absent)
        env_node: Optional[str]  # SLURMD_NODENAME in its environment
        cmdline: str  # at most 512 characters

    class Process(_ProcessSeen, total=False):
        """A process a scan found for a job (a survivor, once the job has ended), as the
        Epilog and the re-checks record it in a fact's ``survivors``."""

        source: str  # "cgroup": found in the job's cgroup, whatever its environment says
        unresolved: bool  # a PID the scan could not read: not known to be gone


__all__ = [
    "CgroupLook",
    "Scan",
    "ancestors",
    "cgroup_look",
    "cgroup_names",
    "cgroup_processes",
    "cgroup_scopes",
    "environ_facts",
    "scan",
    "scan_survivors",
    "scan_within",
]

# Variables read from a process's environment besides SLURM_JOB_ID (first occurrence wins).
_RESTART, _NODE, _CONTEXT = b"SLURM_RESTART_COUNT", b"SLURMD_NODENAME", b"SLURM_SCRIPT_CONTEXT"
_NAMES = frozenset({_RESTART, _NODE, _CONTEXT})
# Bytes kept from one read to the next: longer than any entry that matters (job ids and node
# names are at most 200 characters), so an entry cut by a read is seen whole in the next.
_OVERLAP = 512
_CHUNK = 1 << 16
_GONE, _DEAD, _OTHER = "gone", "dead", "other"
_PF_EXITING = 0x4  # in the flags field of /proc/PID/stat (include/linux/sched.h)


class Scan:
    """What a scan found: job id -> processes, the PIDs it could not read, how long it took."""

    __slots__ = ("found", "unresolved", "rounds", "seconds", "complete", "current")

    def __init__(self, jobs: Iterable[str]) -> None:
        self.found: dict[str, list[Process]] = {job: [] for job in jobs}
        self.unresolved: list[int] = []
        self.rounds = 0
        self.seconds = 0.0
        self.complete = False
        self.current: int | None = None  # the PID being read (for a read that never returns)


def environ_facts(
    chunks: Iterable[bytes], jobs: Collection[str]
) -> tuple[set[str], dict[bytes, bytes]]:
    """The ``jobs`` whose ``SLURM_JOB_ID`` an environment holds, and the values of
    ``SLURM_RESTART_COUNT``, ``SLURMD_NODENAME`` and ``SLURM_SCRIPT_CONTEXT`` in it.

    ``chunks`` are the environment's bytes as read (NUL-separated ``NAME=value``), in any cuts.
    """
    wanted = {job.encode(): job for job in jobs}
    matched: set[str] = set()
    values: dict[bytes, bytes] = {}
    carry = b"\0"
    for chunk in _then_nul(iter(chunks)):
        data = carry + chunk
        at = data.find(b"\0SLURM")
        while at >= 0:
            end = data.find(b"\0", at + 1)
            if end < 0:
                break
            name, sep, value = data[at + 1 : end].partition(b"=")
            if sep:
                if name == b"SLURM_JOB_ID":
                    if value in wanted:
                        matched.add(wanted[value])
                elif name in _NAMES:
                    values.setdefault(name, value)
            at = data.find(b"\0SLURM", end)
        carry = data[-_OVERLAP:]
    return matched, values


def _then_nul(chunks: Iterator[bytes]) -> Iterator[bytes]:
    yield from chunks
    yield b"\0"


def _environ(path: str, jobs: Collection[str]) -> tuple[set[str], dict[bytes, bytes], bool]:
    """:func:`environ_facts` of the environment file at ``path``, and whether it was empty.

    Most environments fit one read and hold no Slurm variable: that case costs one search."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        first = os.read(fd, _CHUNK)
        if not first:
            return set(), {}, True
        second = os.read(fd, _CHUNK)
        if not second:
            if b"SLURM_JOB_ID=" not in first:
                return set(), {}, False
            return (*environ_facts((first,), jobs), False)

        def chunks() -> Iterator[bytes]:
            yield first
            yield second
            while True:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    return
                yield chunk

        return (*environ_facts(chunks(), jobs), False)
    finally:
        os.close(fd)


def _read(path: str, limit: int = 1 << 16) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        total = 0
        while total < limit:
            chunk = os.read(fd, min(_CHUNK, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _stat_fields(path: str) -> list[str]:
    """``/proc/PID/stat`` from the state on (field 3 of proc(5) is index 0)."""
    # One read: the kernel renders the whole file at once (a short read is not a cut).
    fd = os.open(f"{path}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        raw = os.read(fd, 4096).decode("utf-8", "replace")
    finally:
        os.close(fd)
    # The command name is in parentheses and may contain anything, spaces included.
    return raw[raw.rfind(")") + 2 :].split()


def _uids(path: str) -> list[int]:
    """Real, effective, saved and file-system uid (from status: exact even when /proc/PID is
    shown as root's because the process made itself non-dumpable)."""
    for line in _read(f"{path}/status").splitlines():
        if line.startswith(b"Uid:"):
            return [int(v) for v in line.split()[1:]]
    raise ValueError(f"no Uid line in {path}/status")


def ancestors(pid: int | None = None) -> set[int]:
    """``pid`` (default: this process) and all its ancestors."""
    found = set()
    current = os.getpid() if pid is None else pid
    while current > 0 and current not in found:
        found.add(current)
        try:
            current = int(_stat_fields(f"/proc/{current}")[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _live_task(pid: str) -> str | None:
    """A live thread of ``pid`` other than its leader (the leader exited alone), or None."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        if tid != pid:
            path = f"/proc/{pid}/task/{tid}"
            try:
                if _stat_fields(path)[0] not in ("Z", "X"):
                    return path
            except (OSError, IndexError):
                continue
    return None


def _kernel_threads() -> set[str]:
    """PIDs of kernel threads (kthreadd and its children): their environment is empty for good,
    and telling them apart from a user process that is exiting would cost a read each."""
    try:
        fd = os.open("/proc/2/task/2/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return set()
    try:
        if b"kthreadd" not in _read("/proc/2/comm", 64):
            return set()
        return {"2", *_read_fd(fd).decode("ascii", "replace").split()}
    except OSError:
        return set()
    finally:
        os.close(fd)


def _read_fd(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _examine(
    pid: str, jobs: dict[str, int | None], kernel: set[str] | frozenset[str] = frozenset()
) -> tuple[str, list[tuple[str, Process]]]:
    """(outcome, [(job, process)]) for one PID; outcome is ``_GONE`` (vanished before it could be
    read), ``_DEAD`` (a zombie: it may have forked just before), or ``_OTHER`` (read alive)."""
    path = f"/proc/{pid}"
    try:
        matched, values, empty = _environ(f"{path}/environ", jobs)
    except ProcessLookupError:
        matched, values, empty = set(), {}, True
    except OSError:
        return _GONE, []
    if empty:
        if pid in kernel:
            return _OTHER, []
        # An emptied environment, an exiting process, a zombie, or a zombie leader of threads.
        try:
            fields = _stat_fields(path)
        except (OSError, IndexError):
            return _GONE, []
        if fields[0] not in ("Z", "X"):
            # Alive with no environment: a kernel thread or an emptied environment, unless it
            # is exiting (its memory already released), when it may have forked just before.
            exiting = len(fields) > 6 and fields[6].isdigit() and int(fields[6]) & _PF_EXITING
            return (_DEAD if exiting else _OTHER), []
        task = _live_task(pid) if len(fields) > 17 and fields[17] != "1" else None
        if task is None:
            return _DEAD, []
        path = task
        try:
            matched, values, _ = _environ(f"{path}/environ", jobs)
        except OSError:
            return _GONE, []
    if not matched:
        return _OTHER, []
    try:
        fields = _stat_fields(path)
        cmdline = _read(f"{path}/cmdline", 4096).rstrip(b"\0")
        uids = _uids(path)
    except (OSError, IndexError, ValueError):
        return _GONE, []
    if fields[0] in ("Z", "X"):
        return _DEAD, []
    if _CONTEXT in values and not any(uids):
        # A prolog or epilog Slurm runs as root for this job (another node's, where nodes share
        # a machine, or the controller's): not a job process.  A user's process cannot be root.
        return _OTHER, []
    restart_raw = values.get(_RESTART, b"")
    node = values.get(_NODE)
    process: Process = {
        "pid": int(pid),
        "ppid": int(fields[1]),
        "state": fields[0],
        "starttime": int(fields[19]),
        "uid": uids[0],
        "restart": int(restart_raw) if restart_raw.isdigit() else 0,
        "env_node": node.decode("utf-8", "replace") if node is not None else None,
        "cmdline": cmdline.replace(b"\0", b" ").decode("utf-8", "replace")[:512],
    }
    mine = [
        (job, process)
        for job in sorted(matched)
        if jobs[job] is None or jobs[job] in uids or 0 in uids
    ]
    return _OTHER, mine


def scan(
    jobs: dict[str, int | None],
    exclude: set[int] | None = None,
    seconds: float = 2.0,
    result: Scan | None = None,
) -> Scan:
    """Processes of ``jobs`` (job id -> the job's uid, None: any uid) alive on this machine.

    Rounds over /proc until one in which every PID examined was read alive, or ``seconds``
    have passed (then ``complete`` is False and ``unresolved`` names the PIDs of the last round
    that could not be read).  ``exclude`` (default: this process and its ancestors, which run in
    the job's Epilog environment) is skipped.  ``result`` is filled as the scan goes (so a caller
    that gives up on a read that never returns keeps what was found).
    """
    import time

    started = time.monotonic()
    skip = ancestors() if exclude is None else exclude
    out = result if result is not None else Scan(jobs)
    seen: set[str] = set()
    kernel = _kernel_threads()
    while True:
        out.rounds += 1
        names = [n for n in os.listdir("/proc") if n.isdigit() and n not in seen]
        seen.update(names)
        # Newest first: a short-lived process is most likely among the highest PIDs.
        names.sort(key=int, reverse=True)
        unresolved = []
        for name in names:
            if name in kernel or int(name) in skip:
                continue
            out.current = int(name)
            outcome, mine = _examine(name, jobs, kernel)
            out.current = None
            if outcome != _OTHER:
                unresolved.append(int(name))
            for job, process in mine:
                out.found[job].append(process)
        out.seconds = time.monotonic() - started
        if unresolved and out.seconds < seconds:
            continue
        out.complete, out.unresolved = not unresolved, unresolved
        if unresolved or out.seconds >= seconds:
            return out
        # A converged round: read what was found again.  One gone may have forked first (its
        # child is new in the next listing), so after a drop the scan goes on; a dying one is
        # waited for.  At the deadline what was found stands.
        changed = _settle(out)
        if changed is None:
            return out
        if changed == "dying":
            time.sleep(0.01)


_SIGKILL_BIT = 1 << 8  # signal 9 in the pending masks of /proc/PID/status


def _now(process: Process) -> str:
    """``gone`` (PID missing, reused, or a zombie with no live thread), ``dying`` (exiting or
    SIGKILL pending) or ``alive``, for a process found earlier."""
    path = f"/proc/{process['pid']}"
    try:
        fields = _stat_fields(path)
        if fields[0] in ("Z", "X"):
            task = _live_task(str(process["pid"])) if fields[17] != "1" else None
            if task is None:
                return "gone"
            path, fields = task, _stat_fields(task)
        if int(fields[19]) != process["starttime"]:
            return "gone"
        if int(fields[6]) & _PF_EXITING:
            return "dying"
        for line in _read(f"{path}/status").splitlines():
            if (
                line.startswith((b"SigPnd:", b"ShdPnd:"))
                and int(line.split()[1], 16) & _SIGKILL_BIT
            ):
                return "dying"
    except (OSError, IndexError, ValueError):
        return "gone"
    return "alive"


def _settle(out: Scan) -> str | None:
    """Drop from ``out.found`` the processes gone by now: ``gone`` if one was dropped, else
    ``dying`` if one is dying, else None (every one still alive)."""
    dropped = dying = False
    for job, found in out.found.items():
        kept = []
        for process in found:
            state = _now(process)
            if state == "gone":
                dropped = True
            else:
                kept.append(process)
                dying = dying or state == "dying"
        out.found[job] = kept
    return "gone" if dropped else "dying" if dying else None


def scan_within(
    jobs: dict[str, int | None], seconds: float, exclude: set[int] | None = None
) -> Scan:
    """:func:`scan`, given up after ``seconds`` even if a read never returns (a process stuck in
    uninterruptible sleep can block a read of its /proc files): then what was found so far, and
    the PID that could not be read as ``unresolved``."""
    import _thread
    import time

    out = Scan(jobs)
    done = _thread.allocate_lock()
    done.acquire()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            scan(jobs, exclude, seconds * 0.8, out)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)
        finally:
            done.release()

    started = time.monotonic()
    _thread.start_new_thread(work, ())
    if not done.acquire(timeout=seconds):
        stuck = out.current
        out.complete = False
        out.unresolved = [stuck] if stuck is not None else []
        out.seconds = time.monotonic() - started
        out.found = {job: list(found) for job, found in out.found.items()}
        return out
    if failure:
        raise failure[0]
    return out


def scan_survivors(
    job_ids: dict[str, int | None],
    exclude: set[int] | None = None,
    *,
    uids: dict[str, int] | None = None,
) -> dict[str, list[Process]]:
    """Processes whose environment says they belong to one of ``job_ids``.

    ``job_ids`` maps a Slurm job id to the restart count of the execution wanted (None: any):
    a process belongs to execution R when its ``SLURM_RESTART_COUNT`` is R (unset means 0).
    ``uids`` maps a job id to the job's uid: only that uid's (and root's) processes count
    (default: any uid).  Returns job id -> [{"pid", "ppid", "state", "starttime", "uid",
    "restart", "env_node", "cmdline"}].  A scan that could not finish lists nothing more: use
    :func:`scan` to know.
    """
    result = scan({job: (uids or {}).get(job) for job in job_ids}, exclude)
    return {
        job: [p for p in found if job_ids[job] is None or p["restart"] == job_ids[job]]
        for job, found in result.found.items()
    }


# --------------------------------------------------------------------------------------------
# The job's cgroup (proctrack/cgroup)


_V1_CONTROLLERS = ("freezer", "cpuset", "memory", "pids", "cpuacct")


def _cgroup_bases(root: str) -> list[str]:
    """Where cgroup/v2 Slurm makes its slice: the mount, and in a container whose pid 1 sits
    deeper, the folder above pid 1's cgroup (Slurm's own rule for its "init" path)."""
    bases = [root]
    try:
        lines = _read("/proc/1/cgroup", 1 << 16).decode("utf-8", "replace").splitlines()
    except OSError:
        return bases
    for line in lines:
        if line.startswith("0::"):
            path = line[3:].strip().strip("/")
            if path:
                above = os.path.dirname(f"{root}/{path}")
                if above != root:
                    bases.append(above)
    return bases


def cgroup_scopes(root: str, node: str) -> list[str]:
    """The folders under which Slurm keeps its jobs' cgroups on this machine: cgroup v2's
    slurmstepd scope (``<node>_slurmstepd.scope`` where several slurmd share a machine) in
    whatever slice holds it (``system.slice``; 25.11's ``CgroupSlice`` names another), and
    cgroup v1's ``slurm[_<node>]`` folder of each controller."""
    found = []
    for base in _cgroup_bases(root):
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            for scope in (f"{node}_slurmstepd.scope", "slurmstepd.scope"):
                path = f"{base}/{name}/{scope}"
                if os.path.isdir(path) and path not in found:
                    found.append(path)
    for controller in _V1_CONTROLLERS:
        found += [
            p
            for p in (f"{root}/{controller}/{top}" for top in (f"slurm_{node}", "slurm"))
            if os.path.isdir(p)
        ]
    return found


def cgroup_names(job_id: str, sluid: str | None) -> list[str]:
    """The names a job's cgroup/v2 folder has: ``job_<id>`` (before 26.05, and from 26.05
    with cgroup.conf's ``CgroupJobIdPaths=yes``) or the execution's SLUID (26.05's default)."""
    return [f"job_{job_id}", *([sluid] if sluid else [])]


def _cgroup_dirs(scopes: list[str], job_id: str, uid: int, sluid: str | None) -> list[str]:
    """The job's folders under ``scopes`` (:func:`cgroup_scopes`): cgroup v2's by every name
    it can have, cgroup v1's under ``uid_<uid>``."""
    places = []
    for scope in scopes:
        if scope.endswith(".scope"):
            places += [f"{scope}/{name}" for name in cgroup_names(job_id, sluid)]
        else:
            places.append(f"{scope}/uid_{uid}/job_{job_id}")
    return [p for p in places if os.path.isdir(p)]


class CgroupLook:
    """Where a job's cgroup was looked for and what was in it: the ``scopes`` Slurm keeps jobs
    under on this machine, the job's ``folders`` found there, and their ``processes`` (None
    when no folder was found: no cgroup evidence either way)."""

    __slots__ = ("scopes", "folders", "names", "processes")

    def __init__(
        self,
        scopes: list[str],
        folders: list[str],
        names: list[str],
        processes: list[Process] | None,
    ) -> None:
        self.scopes, self.folders, self.names = scopes, folders, names
        self.processes = processes


def cgroup_look(
    root: str, job_id: str, uid: int, node: str, sluid: str | None = None
) -> CgroupLook:
    """:class:`CgroupLook` of the job's cgroup under every naming and slice a release uses
    (:func:`cgroup_scopes`, :func:`cgroup_names`).  ``sluid``: the execution's
    (``SLURM_JOB_SLUID``), without which a 26.05 job's folder is not found."""
    scopes = cgroup_scopes(root, node)
    places = _cgroup_dirs(scopes, job_id, uid, sluid)
    names = cgroup_names(job_id, sluid)
    if not places:
        return CgroupLook(scopes, [], names, None)
    return CgroupLook(scopes, places, names, _cgroup_members(places))


def cgroup_processes(
    root: str, job_id: str, uid: int, node: str, sluid: str | None = None
) -> list[Process] | None:
    """Processes in the job's cgroup, whatever their environment; None when the job has none
    (no proctrack/cgroup, or Slurm already removed it): then there is no cgroup evidence."""
    return cgroup_look(root, job_id, uid, node, sluid).processes


def _cgroup_members(places: list[str]) -> list[Process]:
    pids: set[int] = set()
    for top in places:
        for folder, _, files in os.walk(top):
            if "cgroup.procs" not in files:
                continue
            try:
                text = _read(f"{folder}/cgroup.procs", 1 << 22).decode("ascii", "replace")
            except OSError:
                continue
            pids.update(int(p) for p in text.split() if p.isdigit())
    found: list[Process] = []
    for pid in sorted(pids):
        path = f"/proc/{pid}"
        try:
            fields = _stat_fields(path)
            cmdline = _read(f"{path}/cmdline", 4096).rstrip(b"\0")
            owner = _uids(path)[0]
        except (OSError, IndexError, ValueError):
            continue  # listed, gone since
        if fields[0] in ("Z", "X"):
            continue
        found.append(
            {
                "pid": pid,
                "ppid": int(fields[1]),
                "state": fields[0],
                "starttime": int(fields[19]),
                "uid": owner,
                "restart": None,
                "env_node": None,
                "source": "cgroup",
                "cmdline": cmdline.replace(b"\0", b" ").decode("utf-8", "replace")[:512],
            }
        )
    return found
