"""Node and controller facts: written by the hooks, read by dispatch-cease and dispatch status.

Layout under the site's ``StateDir`` (root-owned, not writable by users)::

    StateDir/                               owner root (or SlurmUser on a controller), 0755
      facts/                                0711: users may pass, not list
        <uid>/                              root:<job gid> 0750
          <jobid>/                          root:<job gid> 0750
            <kind>.<node>.<restart>.<token> root:<job gid> 0640, one JSON object, written once
      watch/<hostname>/                     0700: survivors this machine still has to re-check
        <uid>.<jobid>.<token>

Kinds: ``start`` (node Prolog), ``end`` (node Epilog, with the post-kill survivor scan),
``recheck`` (a later scan of the same survivors), ``ctld-start`` (PrologSlurmctld) and
``ctld-end`` (EpilogSlurmctld).  ``token`` is the time in nanoseconds (hex) and 32 random bits, so
names sort by time and never collide; an ``end`` takes the token of the start it is tied to, so
an Epilog finds its node's open start from names alone.  ``restart`` is the execution's restart
count (``x`` when unknown).  Names are parsed from the right: node names may contain dots.

Hooks write JSON with the small encoder here (:func:`dumps`): importing ``json`` (and with it
``re`` and ``enum``) would double a hook's start-up time.

Invariants:

* Writers open a chain of directories with ``O_NOFOLLOW`` relative to the previous one, starting
  from ``StateDir``, which must be owned by the writer and writable by nobody else; every
  directory of the chain must be owned by the writer and not group- or other-writable.  Files are
  created with ``O_CREAT|O_EXCL|O_NOFOLLOW``.  So a symlink, a FIFO or a file planted anywhere in
  the chain is refused, never followed, and nothing is ever written through a path a user controls.
* Readers trust only facts owned by root or by the owner of ``StateDir``, in directories that
  only such an owner can write, and open every file with ``O_NOFOLLOW|O_NONBLOCK`` and check it is
  a regular file.  A fact that does not parse is reported as a problem, never skipped silently.
* Only the standard library is imported (hooks import this module).

A user can read their own jobs' facts if they are in the group of their job (their primary group
on most sites); on sites where many users share one primary group, members of that group can read
each other's facts (never change them).
"""

from __future__ import annotations

import os
import stat

FACTS = "facts"
WATCH = "watch"
KINDS = ("start", "end", "recheck", "ctld-start", "ctld-end")
MAX_FACT_BYTES = 1 << 20
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FactError(Exception):
    """A fact could not be written or read safely (the message says why and where)."""


# --------------------------------------------------------------------------------------------
# Names and small readers


def check_name(value: str, what: str) -> str:
    """A node name or job id usable as one path component: ``[A-Za-z0-9._-]``, not ``.``-first."""
    if not value or value[0] == "." or len(value) > 200 or not set(value) <= _NAME_CHARS:
        raise FactError(f"{what} {value!r} is not a plain name ([A-Za-z0-9._-], not starting "
                        "with '.')")
    return value


def parse_name(name: str) -> tuple[str, str, str, str] | None:
    """``(kind, node, restart, token)`` of a fact's file name, or None."""
    kind, _, rest = name.partition(".")
    rest, _, token = rest.rpartition(".")
    node, _, restart = rest.rpartition(".")
    if kind not in KINDS or not node or not restart or len(token) != 24:
        return None
    return kind, node, restart, token


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _escape(text: str) -> str:
    out = []
    for char in text:
        code = ord(char)
        if char == '"' or char == "\\":
            out.append("\\" + char)
        elif char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def dumps(value: object) -> str:
    """JSON text of ``value`` (dict with str keys, list, tuple, str, int, float, bool, None),
    keys sorted.  Equal to ``json.dumps(value, sort_keys=True, separators=(",", ":"))`` but
    for escaping non-ASCII as itself (UTF-8); raises ValueError on anything else."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not JSON")
        return repr(value)
    if isinstance(value, str):
        return _escape(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(item) for item in value) + "]"
    if isinstance(value, dict):
        items = []
        for key in sorted(value):
            if not isinstance(key, str):
                raise ValueError(f"key {key!r} is not a string")
            items.append(_escape(key) + ":" + dumps(value[key]))
        return "{" + ",".join(items) + "}"
    raise ValueError(f"{type(value).__name__} is not JSON")


def new_token() -> str:
    import time
    return f"{time.time_ns():016x}{os.urandom(4).hex()}"


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
            return handle.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""


def boot_time() -> float | None:
    """The machine's boot time (``btime`` of /proc/stat), seconds since the epoch."""
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def expand_hostlist(text: str) -> list[str]:
    """Slurm host list to names: ``n[1-3,05],gpu1`` -> n1 n2 n3 n05 gpu1 (zero padding kept).

    Several bracket groups in one name multiply (``r[1-2]n[1-2]``).  Raises ValueError on a
    malformed list.
    """
    names: list[str] = []
    depth = 0
    start = 0
    text = text.strip()
    if text in ("", "(null)", "None"):
        return []
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            names += _expand_one(text[start:i], text)
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    names += _expand_one(text[start:], text)
    return names


def _expand_one(item: str, whole: str) -> list[str]:
    item = item.strip()
    if not item:
        return []
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.find("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    values: list[str] = []
    for part in body.split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in host list {whole!r}")
        if not sep:
            values.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        if int(high) < int(low) or int(high) - int(low) > 1_000_000:
            raise ValueError(f"bad range {part!r} in host list {whole!r}")
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    tails = _expand_one(rest, whole) if rest else [""]
    return [prefix + value + tail for value in values for tail in tails]


# --------------------------------------------------------------------------------------------
# Writing: an O_NOFOLLOW chain from a StateDir owned by us


def _check_private_dir(fd: int, where: str, owner: int) -> os.stat_result:
    info = os.fstat(fd)
    if info.st_uid != owner:
        raise FactError(f"{where} is owned by uid {info.st_uid}, not {owner}; refusing to use it")
    if info.st_mode & 0o022:
        raise FactError(f"{where} is writable by group or others "
                        f"(mode {stat.S_IMODE(info.st_mode):04o}); refusing to use it")
    return info


def open_state_dir(state_dir: str) -> int:
    """Open ``StateDir`` for writing facts; it must exist, be ours and writable only by us."""
    try:
        fd = os.open(state_dir, _DIR_FLAGS)
    except OSError as exc:
        raise FactError(f"cannot open StateDir {state_dir!r}: {exc.strerror}") from None
    try:
        _check_private_dir(fd, f"StateDir {state_dir!r}", os.geteuid())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _subdir(parent: int, name: str, where: str, mode: int, gid: int = -1) -> int:
    """Open (creating if needed) directory ``name`` under ``parent``; never through a symlink."""
    owner = os.geteuid()
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        try:
            # Created private first; group and mode are set only once it is open as ours.
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
        except OSError as exc:
            raise FactError(f"cannot create {where}: {exc.strerror}") from None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise FactError(f"cannot open {where}: {exc.strerror}") from None
        try:
            info = _check_private_dir(fd, where, owner)
            if gid >= 0 and info.st_gid != gid and owner == 0:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd
    except OSError as exc:
        raise FactError(f"cannot open {where}: {exc.strerror} (a symlink or a non-directory "
                        "is refused)") from None
    try:
        _check_private_dir(fd, where, owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create_file(dir_fd: int, name: str, data: bytes, where: str, mode: int,
                 gid: int = -1) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise FactError(f"cannot create {where}/{name}: {exc.strerror}") from None
    try:
        if gid >= 0 and os.geteuid() == 0:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        os.close(fd)
        # A half-written fact is worse than none: a reader would report it garbled.
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        raise FactError(f"cannot write {where}/{name}: {exc.strerror}") from None
    os.close(fd)


def write_fact(state_dir: str, uid: int, gid: int, job_id: str, kind: str, node: str,
               body: dict[str, object], token: str | None = None) -> str:
    """Write one fact of ``kind`` about ``job_id``; return its file name."""
    check_name(job_id, "job id")
    check_name(node, "node name")
    if kind not in KINDS:
        raise FactError(f"unknown fact kind {kind!r}")
    token = token or new_token()
    restart = body.get("restart")
    name = f"{kind}.{node}.{restart if isinstance(restart, int) else 'x'}.{token}"
    record = dict(body)
    record.update({"kind": kind, "job_id": job_id, "node": node, "uid": uid, "gid": gid,
                   "token": token})
    data = dumps(record).encode() + b"\n"
    base = open_state_dir(state_dir)
    fds = [base]
    try:
        facts = _subdir(base, FACTS, f"{state_dir}/{FACTS}", 0o711)
        fds.append(facts)
        user = _subdir(facts, str(uid), f"{state_dir}/{FACTS}/{uid}", 0o750, gid)
        fds.append(user)
        where = f"{state_dir}/{FACTS}/{uid}/{job_id}"
        job = _subdir(user, job_id, where, 0o750, gid)
        fds.append(job)
        _create_file(job, name, data, where, 0o640, gid)
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return name


# --------------------------------------------------------------------------------------------
# Reading


def list_job(state_dir: str, uid: int, job_id: str) -> list[str]:
    """The fact names in a job's folder (no content read); [] when there is none."""
    check_name(job_id, "job id")
    trusted = {0, os.geteuid()}
    fds: list[int] = []
    try:
        fds.append(open_state_dir(state_dir))
        where = f"{state_dir}/{FACTS}"
        fds.append(_open_trusted_dir(fds[-1], FACTS, where, trusted))
        fds.append(_open_trusted_dir(fds[-1], str(uid), f"{where}/{uid}", trusted))
        fds.append(_open_trusted_dir(fds[-1], job_id, f"{where}/{uid}/{job_id}", trusted,
                                     listable=True))
        return os.listdir(fds[-1])
    except FileNotFoundError:
        return []
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _read_regular(dir_fd: int, name: str, trusted: set[int]) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        raise FactError(f"{name}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FactError(f"{name}: not a regular file")
        if info.st_uid not in trusted or info.st_mode & 0o022:
            raise FactError(f"{name}: owned by uid {info.st_uid} with mode "
                            f"{stat.S_IMODE(info.st_mode):04o}; not trusted")
        chunks = []
        total = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_FACT_BYTES:
                raise FactError(f"{name}: larger than {MAX_FACT_BYTES} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _open_trusted_dir(parent: int | None, name: str, where: str, trusted: set[int],
                      listable: bool = False) -> int:
    # O_PATH: a user may pass through facts/ (mode 0711) without the right to open it.
    mode = os.O_RDONLY if listable else os.O_PATH
    try:
        if parent is None:
            fd = os.open(name, mode | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            fd = os.open(name, mode | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FactError(f"cannot open {where}: {exc.strerror}") from None
    info = os.fstat(fd)
    if info.st_uid not in trusted or info.st_mode & 0o022:
        os.close(fd)
        raise FactError(f"{where} is owned by uid {info.st_uid} with mode "
                        f"{stat.S_IMODE(info.st_mode):04o}; its facts are not trusted")
    return fd


def read_job_facts(state_dir: str, uid: int, job_id: str,
                   prefixes: tuple[str, ...] = ()) -> tuple[list[dict], list[str]]:
    """Every trusted fact recorded about ``job_id`` of user ``uid``, oldest first, and problems.

    ``prefixes`` limits the files read to names starting with one of them (``"start.n1."``).
    No folder for the job means no facts (not a problem).
    """
    import json
    check_name(job_id, "job id")
    facts: list[dict] = []
    problems: list[str] = []
    fds: list[int] = []
    try:
        try:
            base = _open_trusted_dir(None, state_dir, f"StateDir {state_dir!r}", {0})
        except FactError:
            # A controller whose SlurmUser is not root owns its StateDir; trust that owner too.
            info = os.stat(state_dir)
            base = _open_trusted_dir(None, state_dir, f"StateDir {state_dir!r}", {0, info.st_uid})
        fds.append(base)
        trusted = {0, os.fstat(base).st_uid}
        where = f"{state_dir}/{FACTS}"
        fds.append(_open_trusted_dir(base, FACTS, where, trusted))
        fds.append(_open_trusted_dir(fds[-1], str(uid), f"{where}/{uid}", trusted))
        where = f"{where}/{uid}/{job_id}"
        job = _open_trusted_dir(fds[-1], job_id, where, trusted, listable=True)
        fds.append(job)
        for name in sorted(os.listdir(job), key=lambda n: n.rpartition(".")[2]):
            if prefixes and not name.startswith(prefixes):
                continue
            try:
                data = _read_regular(job, name, trusted)
                record = json.loads(data)
                if not isinstance(record, dict) or record.get("kind") not in KINDS:
                    raise FactError(f"{name}: not a fact")
            except (FactError, ValueError) as exc:
                problems.append(f"{where}/{exc}" if isinstance(exc, FactError)
                                else f"{where}/{name}: garbled ({exc})")
                continue
            facts.append(record)
    except FileNotFoundError:
        pass
    except PermissionError as exc:
        problems.append(f"cannot read the facts of job {job_id} under {state_dir}: "
                        f"{exc.strerror}")
    except (FactError, OSError) as exc:
        problems.append(str(exc))
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return facts, problems


def job_uids(state_dir: str, job_id: str) -> list[int]:
    """The users whose facts folder has ``job_id`` (needs the right to list ``facts/``)."""
    found = []
    try:
        for name in os.listdir(os.path.join(state_dir, FACTS)):
            if name.isdigit() and os.path.isdir(os.path.join(state_dir, FACTS, name, job_id)):
                found.append(int(name))
    except OSError:
        pass
    return sorted(found)


def _restart_of(fact: dict) -> int | None:
    value = fact.get("restart")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def execution_facts(slurm_job_id: str, state_dir: str | None = None,
                    uid: int | None = None) -> list[dict]:
    """What the hooks recorded about each execution of a Slurm job, oldest execution first.

    ``slurm_job_id`` is Slurm's own id (for an array element, its JobId, not ``A_T``).
    ``state_dir`` defaults to the site's ``StateDir``; ``uid`` to the caller's uid (root, which
    may list every user's folder, finds the owner itself).  Each item::

        {"job_id": "123", "restart": 0,
         "allocated": ["n1", "n2"],          # nodes the controller allocated (ctld facts), or []
         "controller": {"start": fact | None, "end": fact | None},
         "nodes": {"n1": {"start": fact | None, "end": fact | None, "recheck": fact | None,
                          "survivors": [...], "ceased": True | False | None}},
         "end": {"time", "source": "controller" | "node", "exit_code": "3:0",
                 "derived_exit_code", "requeued": bool} | None,
         "problems": ["..."]}

    ``ceased`` is the node's own word: True when its post-kill scan (or a later re-check) found
    nothing left, False when something was left, None when the node recorded no end.  A fact is a
    dict as written (``time`` in seconds since the epoch, ``boot_id``, ``boot_time``, ...).
    Unreadable or untrusted facts are named in ``problems`` of every execution; when nothing
    could be read at all, :class:`FactError` says why.  No facts at all is an empty list.
    """
    if state_dir is None:
        from . import config
        state_dir = config.load().state_dir
    if uid is None:
        uid = os.getuid()
        if uid == 0:
            owners = job_uids(state_dir, slurm_job_id)
            if owners:
                uid = owners[0]
    found, problems = collect(slurm_job_id, state_dir, uid)
    if problems and not found:
        raise FactError("; ".join(problems))
    return found


def collect(slurm_job_id: str, state_dir: str, uid: int) -> tuple[list[dict], list[str]]:
    """:func:`execution_facts` and the problems met, without raising."""
    found, problems = read_job_facts(state_dir, uid, slurm_job_id)
    return group_executions(slurm_job_id, found, problems), problems


def group_executions(job_id: str, facts: list[dict], problems: list[str]) -> list[dict]:
    """Group facts by execution; an end is tied to the start its own node recorded."""
    starts = {f.get("token"): f for f in facts if f.get("kind") == "start"}
    executions: dict[int, dict] = {}

    def execution(restart: int) -> dict:
        if restart not in executions:
            executions[restart] = {"job_id": job_id, "restart": restart, "allocated": [],
                                   "controller": {"start": None, "end": None}, "nodes": {},
                                   "problems": list(problems)}
        return executions[restart]

    def node_entry(restart: int, node: str) -> dict:
        return execution(restart)["nodes"].setdefault(
            node, {"start": None, "end": None, "recheck": None, "survivors": [], "ceased": None})

    ends_by_token: dict[str, tuple[int, str]] = {}
    for fact in facts:
        kind = fact.get("kind")
        node = str(fact.get("node", ""))
        if kind == "start":
            restart = _restart_of(fact)
            if restart is None:
                continue
            entry = node_entry(restart, node)
            if entry["start"] is None or entry["start"].get("time", 0) < fact.get("time", 0):
                entry["start"] = fact
        elif kind == "end":
            start = starts.get(fact.get("start_token"))
            restart = _restart_of(start) if start is not None else _restart_of(fact)
            if restart is None:
                continue
            entry = node_entry(restart, node)
            entry["end"] = fact
            if start is not None:
                entry["start"] = start
            survivors = fact.get("survivors") or []
            entry["survivors"] = survivors
            entry["ceased"] = not survivors and not fact.get("scan_error")
            ends_by_token[str(fact.get("token"))] = (restart, node)
        elif kind in ("ctld-start", "ctld-end"):
            restart = _restart_of(fact)
            if restart is None:
                continue
            item = execution(restart)
            item["controller"]["start" if kind == "ctld-start" else "end"] = fact
            allocated = fact.get("nodes")
            if isinstance(allocated, list) and allocated and (
                    not item["allocated"] or kind == "ctld-start"):
                item["allocated"] = [str(n) for n in allocated]
    for fact in facts:
        if fact.get("kind") != "recheck":
            continue
        tied = ends_by_token.get(str(fact.get("end_token")))
        if tied is None:
            continue
        entry = node_entry(*tied)
        if entry["recheck"] is None or entry["recheck"].get("time", 0) <= fact.get("time", 0):
            entry["recheck"] = fact
            if not fact.get("scan_error"):
                entry["survivors"] = fact.get("survivors") or []
                entry["ceased"] = not entry["survivors"]
    ordered = [executions[r] for r in sorted(executions)]
    for item in ordered:
        item["end"] = _end_summary(item, later=item is not ordered[-1])
    return ordered


def _end_summary(execution: dict, later: bool) -> dict | None:
    """The end as the hooks saw it.  Slurm 22.05 gives hooks no job state (no SLURM_JOB_STATE;
    the exit code is 0:0 for a cancelled or node-failed job too), so this is the exit code, and
    ``requeued`` when a later execution of the same job id was recorded."""
    source = execution["controller"].get("end")
    origin = "controller"
    if source is None:
        ends = [n["end"] for n in execution["nodes"].values() if n.get("end")]
        source = ends[-1] if ends else None
        origin = "node"
    if source is None and not later:
        return None
    slurm = (source or {}).get("slurm") or {}
    return {"time": (source or {}).get("time"), "source": origin if source else None,
            "exit_code": slurm.get("SLURM_JOB_EXIT_CODE2"),
            "derived_exit_code": slurm.get("SLURM_JOB_DERIVED_EC"), "requeued": later}


# --------------------------------------------------------------------------------------------
# Survivors: processes of a job still alive after slurmd's kill


def _read_proc(pid: str, what: str, limit: int = 1 << 20) -> bytes:
    fd = os.open(f"/proc/{pid}/{what}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        total = 0
        while total < limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _stat_fields(pid: str) -> list[str]:
    raw = _read_proc(pid, "stat").decode("utf-8", "replace")
    # The command name is in parentheses and may contain anything, spaces included.
    return raw[raw.rfind(")") + 2:].split()


def _uids(pid: str) -> list[int]:
    """Real, effective, saved and file-system uid (from status: exact even when /proc/PID is
    shown as root's because the process made itself non-dumpable)."""
    for line in _read_proc(pid, "status").splitlines():
        if line.startswith(b"Uid:"):
            return [int(v) for v in line.split()[1:]]
    raise ValueError(f"no Uid line in /proc/{pid}/status")


def ancestors(pid: int | None = None) -> set[int]:
    """``pid`` (default: this process) and all its ancestors."""
    found = set()
    current = os.getpid() if pid is None else pid
    while current > 0 and current not in found:
        found.add(current)
        try:
            current = int(_stat_fields(str(current))[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _env_value(environ: bytes, name: bytes) -> bytes | None:
    key = b"\0" + name + b"="
    at = environ.find(key)
    if at < 0:
        return None
    start = at + len(key)
    end = environ.find(b"\0", start)
    return environ[start:end if end >= 0 else len(environ)]


def scan_survivors(job_ids: dict[str, int | None],
                   exclude: set[int] | None = None) -> dict[str, list[dict]]:
    """Processes whose environment says they belong to one of ``job_ids``.

    ``job_ids`` maps a Slurm job id to the restart count of the execution wanted (None: any).
    A process belongs to job J, execution R, when its environment has ``SLURM_JOB_ID=J`` and
    ``SLURM_RESTART_COUNT=R`` (unset means 0): the variables Slurm gives every process of a job,
    which survive setsid and double forks.  Zombies are dead and not reported; ``exclude`` (by
    default this process and its ancestors, which run in the job's Epilog environment) is
    skipped.  Returns job id -> [{"pid", "ppid", "state", "starttime", "uid", "cmdline"}].
    """
    skip = ancestors() if exclude is None else exclude
    wanted = {b"\0SLURM_JOB_ID=" + j.encode() + b"\0": j for j in job_ids}
    found: dict[str, list[dict]] = {j: [] for j in job_ids}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            environ = b"\0" + _read_proc(name, "environ") + b"\0"
        except OSError:
            continue  # gone, or a kernel thread
        for needle, job in wanted.items():
            if needle not in environ:
                continue
            restart_raw = _env_value(environ, b"SLURM_RESTART_COUNT")
            restart = int(restart_raw) if restart_raw and restart_raw.isdigit() else 0
            if job_ids[job] is not None and restart != job_ids[job]:
                continue
            try:
                fields = _stat_fields(name)
                cmdline = _read_proc(name, "cmdline", 4096).rstrip(b"\0")
                uids = _uids(name)
            except (OSError, IndexError, ValueError):
                continue
            if fields[0] in ("Z", "X"):
                continue
            if b"\0SLURM_SCRIPT_CONTEXT=" in environ and not any(uids):
                # A prolog or epilog Slurm runs as root for this job (another node's, where
                # nodes share a machine, or the controller's): not a job process.  A user's
                # process cannot be root, so it cannot hide this way.
                continue
            uid = uids[0]
            found[job].append({
                "pid": int(name), "ppid": int(fields[1]), "state": fields[0],
                "starttime": int(fields[19]), "uid": uid, "restart": restart,
                "cmdline": cmdline.replace(b"\0", b" ").decode("utf-8", "replace")[:512],
            })
    return found
