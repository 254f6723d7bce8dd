"""The fact store: facts the hooks write once under ``StateDir``, never through a user's link.

Which is which: this module is the store (names, writing, trusted reading), imported by the
hooks; readers import :mod:`slurm_dispatch.node.facts`, which re-exports it beside the
survivor scan and the grouping into executions.

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

Every fact carries its format version, ``"v": 1`` (:data:`FORMAT_VERSION`); a fact without one
was written before versions existed and is read as version 1.  A fact of a version this reader
does not know is reported as a problem, never used as evidence.

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

from .. import __version__, _fsio
from ..errors import FactError

TYPE_CHECKING = False  # typing is not imported at run time: the hooks import this module
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional, TypedDict

    from .procscan import Process

    class Fact(TypedDict, total=False):
        """A fact as :func:`write_fact` writes it and :func:`read_job_facts` reads it back.

        Read from a file an older or newer hook wrote, so a reader asks for each key with
        ``.get`` and checks its type; the keys of each kind are those its hook writes
        (hooks/evidence.py)."""

        # Every fact: what write_fact adds, and the moment and restart count it is about.
        v: int  # FORMAT_VERSION
        kind: str  # one of KINDS
        job_id: str
        node: str  # "slurmctld" for the controller's
        uid: int
        gid: int
        token: str  # 24 hex digits; a node's end shares its start's
        release: str  # the release that wrote it
        time: float
        restart: Optional[int]  # the execution's restart count (None: not known)
        restart_env: Optional[str]  # SLURM_RESTART_COUNT as the hook was given it
        sluid: str  # Slurm's id of the run (26.05)
        boot_id: Optional[str]
        # A node's start (Prolog) and the controller's start (PrologSlurmctld).
        boot_time: Optional[float]
        hostname: str
        array_job_id: str
        array_task_id: str
        # A node's end (Epilog); a re-check (the survivors found again, tied by end_token).
        start_token: Optional[str]  # the start an end closes (a controller's end too)
        end_token: str
        survivors: list[Process]
        scan_error: Optional[str]
        scan: Optional[dict[str, Any]]  # rounds, complete, seconds
        cgroup_root: str
        cgroup: Optional[dict[str, object]]  # where the job's cgroup was looked for
        slurm: dict[str, str]  # the end's SLURM_JOB_* variables
        orphan: bool
        recorded_by: str
        reason: str
        # The controller's start and end.
        nodelist: str
        nodes: list[str]


FACTS = "facts"
WATCH = "watch"
KINDS = ("start", "end", "recheck", "ctld-start", "ctld-end")
FORMAT_VERSION = 1
MAX_FACT_BYTES = 1 << 20
#: Facts this process wrote, by kind (a hook's run adds them to the node's metrics).
WRITTEN: dict[str, int] = {}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")

__all__ = [
    "FACTS",
    "FORMAT_VERSION",
    "FactError",
    "KINDS",
    "MAX_FACT_BYTES",
    "WATCH",
    "array_starts",
    "array_task_job",
    "boot_id",
    "boot_time",
    "check_name",
    "create_file",
    "dumps",
    "fact_name",
    "fact_uids",
    "format_problem",
    "job_uids",
    "list_job",
    "new_token",
    "node_activity",
    "open_state_dir",
    "open_subdir",
    "parse_name",
    "read_job_facts",
    "read_regular",
    "token_time",
    "write_fact",
]


# --------------------------------------------------------------------------------------------
# Names and small readers


def check_name(value: str, what: str) -> str:
    """A node name or job id usable as one path component: ``[A-Za-z0-9._-]``, not ``.``-first."""
    if not value or value[0] == "." or len(value) > 200 or not set(value) <= _NAME_CHARS:
        raise FactError(
            f"{what} {value!r} is not a plain name ([A-Za-z0-9._-], not starting with '.')"
        )
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


# --------------------------------------------------------------------------------------------
# Writing: an O_NOFOLLOW chain from a StateDir owned by us


def _check_private_dir(fd: int, where: str, owner: int) -> os.stat_result:
    info = os.fstat(fd)
    if info.st_uid != owner:
        raise FactError(f"{where} is owned by uid {info.st_uid}, not {owner}; refusing to use it")
    if info.st_mode & 0o022:
        raise FactError(
            f"{where} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); refusing to use it"
        )
    return info


def open_state_dir(state_dir: str) -> int:
    """Open ``StateDir`` for writing facts; it must exist, be ours and writable only by us."""
    try:
        fd = _fsio.open_dir(state_dir)
    except OSError as exc:
        raise FactError(f"cannot open StateDir {state_dir!r}: {exc.strerror}") from None
    try:
        _check_private_dir(fd, f"StateDir {state_dir!r}", os.geteuid())
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_subdir(parent: int, name: str, where: str, mode: int, gid: int = -1) -> int:
    """Open (creating if needed) directory ``name`` under ``parent``; never through a symlink.

    A writer may be ended at any step (a hook past its HookTimeout is killed where it stands),
    so no step may leave a folder its readers cannot use.  Without a group to set, the folder
    is made with ``mode`` at once, whatever the umask.  With one (``gid``, as root), it is made
    private (0700), given the group, then ``mode``; a folder found private while ``mode`` opens
    it to a group is one a killed writer left half made, and is finished here (a folder a site
    made private on purpose is facts/ itself, which takes no group and is never opened up)."""
    owner = os.geteuid()
    grouped = gid >= 0 and owner == 0
    try:
        fd = _fsio.open_dir(name, parent)
    except FileNotFoundError:
        try:
            if grouped:
                # Private first; group and mode are set only once it is open as ours.
                os.mkdir(name, 0o700, dir_fd=parent)
            else:
                umask = os.umask(0)
                try:
                    os.mkdir(name, mode, dir_fd=parent)
                finally:
                    os.umask(umask)
        except FileExistsError:
            pass
        except OSError as exc:
            raise FactError(f"cannot create {where}: {exc.strerror}") from None
        try:
            fd = _fsio.open_dir(name, parent)
        except OSError as exc:
            raise FactError(f"cannot open {where}: {exc.strerror}") from None
    except OSError as exc:
        raise FactError(
            f"cannot open {where}: {exc.strerror} (a symlink or a non-directory is refused)"
        ) from None
    try:
        info = _check_private_dir(fd, where, owner)
        if grouped and stat.S_IMODE(info.st_mode) & 0o077 == 0 and mode & 0o077:
            if info.st_gid != gid:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
    except OSError as exc:
        os.close(fd)
        raise FactError(f"cannot set the group and mode of {where}: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(dir_fd: int, name: str, data: bytes, where: str, mode: int, gid: int = -1) -> None:
    """Put a new file ``name`` with ``data`` in ``dir_fd``, whole or not at all, and only once
    (FactError when ``name`` exists: a fact is written once).

    The bytes go into ``.<name>.<random>`` first, which gets its group and mode before a byte
    is written, and only then is linked as ``name`` (a link, not a rename, refuses a name that
    exists) and its temporary name removed: a writer ended at any step leaves at most that
    dot-name behind, which the readers pass over (and prune removes with its folder), never a
    fact that is empty, half written, or closed to its user.  The random part keeps such a
    leftover from refusing the next writer of the same name (the next end of the same start)."""
    temp = f".{name}.{os.urandom(4).hex()}"
    try:
        fd = _fsio.create_new(temp, 0o600, dir_fd)
    except OSError as exc:
        raise FactError(f"cannot create {where}/{temp}: {exc.strerror}") from None
    try:
        try:
            if gid >= 0 and os.geteuid() == 0:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
            _fsio.write_all(fd, data, temp)
        finally:
            os.close(fd)
        _name_once(dir_fd, temp, name)
    except OSError as exc:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, FileExistsError):
            raise FactError(
                f"cannot write {where}/{name}: it exists (a fact is written once)"
            ) from None
        raise FactError(f"cannot write {where}/{name}: {exc.strerror}") from None


def _name_once(dir_fd: int, temp: str, name: str) -> None:
    """Give ``temp`` the name ``name``, FileExistsError if that exists, then drop ``temp``."""
    import errno

    try:
        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (
            errno.EPERM,
            errno.EOPNOTSUPP,
            errno.ENOTSUP,
            errno.EMLINK,
            errno.ENOSYS,
        ):
            raise
        # A file system without hard links (the kernel's EPERM; ENOSYS from a FUSE daemon
        # without a link operation): look, then rename (no other writer of the same name runs
        # at the same moment but the end of one start's two Epilogs).
        try:
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return
        raise FileExistsError(errno.EEXIST, "File exists") from None
    os.unlink(temp, dir_fd=dir_fd)


def fact_name(kind: str, node: str, restart: object, token: str) -> str:
    """The file name :func:`write_fact` gives a fact (``x`` for a restart count not known)."""
    return f"{kind}.{node}.{restart if isinstance(restart, int) else 'x'}.{token}"


def write_fact(
    state_dir: str,
    uid: int,
    gid: int,
    job_id: str,
    kind: str,
    node: str,
    body: dict[str, object],
    token: str | None = None,
) -> str:
    """Write one fact of ``kind`` about ``job_id``; return its file name."""
    check_name(job_id, "job id")
    check_name(node, "node name")
    if kind not in KINDS:
        raise FactError(f"unknown fact kind {kind!r}")
    token = token or new_token()
    name = fact_name(kind, node, body.get("restart"), token)
    record = dict(body)
    # The release that wrote it: dispatch-admin doctor compares the nodes' and the controller's.
    record.setdefault("release", __version__)
    record.update(
        {
            "v": FORMAT_VERSION,
            "kind": kind,
            "job_id": job_id,
            "node": node,
            "uid": uid,
            "gid": gid,
            "token": token,
        }
    )
    data = dumps(record).encode() + b"\n"
    base = open_state_dir(state_dir)
    fds = [base]
    try:
        facts = open_subdir(base, FACTS, f"{state_dir}/{FACTS}", 0o711)
        fds.append(facts)
        user = open_subdir(facts, str(uid), f"{state_dir}/{FACTS}/{uid}", 0o750, gid)
        fds.append(user)
        where = f"{state_dir}/{FACTS}/{uid}/{job_id}"
        job = open_subdir(user, job_id, where, 0o750, gid)
        fds.append(job)
        create_file(job, name, data, where, 0o640, gid)
    finally:
        for fd in reversed(fds):
            os.close(fd)
    WRITTEN[kind] = WRITTEN.get(kind, 0) + 1
    return name


# --------------------------------------------------------------------------------------------
# Reading


def format_problem(record: Mapping[str, Any]) -> str | None:
    """Why a fact or watch entry of another format version cannot be read, or None.

    No ``v`` means version 1 (written before versions existed)."""
    version = record.get("v", 1)
    if version == FORMAT_VERSION and not isinstance(version, bool):
        return None
    return (
        f"format version {version!r}: written by a newer slurm-dispatch (this reader knows "
        f"{FORMAT_VERSION}); upgrade slurm-dispatch where the facts are read"
    )


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
        fds.append(
            _open_trusted_dir(fds[-1], job_id, f"{where}/{uid}/{job_id}", trusted, listable=True)
        )
        return os.listdir(fds[-1])
    except FileNotFoundError:
        return []
    finally:
        for fd in reversed(fds):
            os.close(fd)


def read_regular(dir_fd: int, name: str, trusted: set[int]) -> bytes:
    try:
        fd = _fsio.open_file(name, dir_fd, nonblock=True)
    except OSError as exc:
        raise FactError(f"{name}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FactError(f"{name}: not a regular file")
        if info.st_uid not in trusted or info.st_mode & 0o022:
            raise FactError(
                f"{name}: owned by uid {info.st_uid} with mode "
                f"{stat.S_IMODE(info.st_mode):04o}; not trusted"
            )
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


def _open_trusted_dir(
    parent: int | None, name: str, where: str, trusted: set[int], listable: bool = False
) -> int:
    # O_PATH: a user may pass through facts/ (mode 0711) without the right to open it.
    try:
        # The first folder (the StateDir as configured) may be a symlink; none below it may.
        fd = _fsio.open_dir(name, parent, follow=parent is None, path_only=not listable)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FactError(f"cannot open {where}: {exc.strerror}") from None
    info = os.fstat(fd)
    if info.st_uid not in trusted or info.st_mode & 0o022:
        os.close(fd)
        raise FactError(
            f"{where} is owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):04o}; its facts are not trusted"
        )
    return fd


def _open_chain(state_dir: str, names: tuple[str, ...], fds: list[int]) -> set[int]:
    """Open StateDir, then each of ``names`` below the one before, as the readers trust them
    (owned by root or StateDir's owner, a controller's SlurmUser that is not root; the last
    listable), appending each descriptor to ``fds`` for the caller to close; the uids trusted."""
    try:
        base = _open_trusted_dir(None, state_dir, f"StateDir {state_dir!r}", {0})
    except FactError:
        # A controller whose SlurmUser is not root owns its StateDir; trust that owner too.
        info = os.stat(state_dir)
        base = _open_trusted_dir(None, state_dir, f"StateDir {state_dir!r}", {0, info.st_uid})
    fds.append(base)
    trusted = {0, os.fstat(base).st_uid}
    where = state_dir
    for i, name in enumerate(names):
        where = f"{where}/{name}"
        fds.append(_open_trusted_dir(fds[-1], name, where, trusted, listable=i == len(names) - 1))
    return trusted


def read_job_facts(
    state_dir: str, uid: int, job_id: str, prefixes: tuple[str, ...] = ()
) -> tuple[list[Fact], list[str]]:
    """Every trusted fact recorded about ``job_id`` of user ``uid``, oldest first, and problems.

    ``prefixes`` limits the files read to names starting with one of them (``"start.n1."``).
    No folder for the job means no facts (not a problem).
    """
    import json

    check_name(job_id, "job id")
    facts: list[Fact] = []
    problems: list[str] = []
    fds: list[int] = []
    try:
        trusted = _open_chain(state_dir, (FACTS, str(uid), job_id), fds)
        where = f"{state_dir}/{FACTS}/{uid}/{job_id}"
        job = fds[-1]
        for name in sorted(os.listdir(job), key=lambda n: n.rpartition(".")[2]):
            if name.startswith(".") or prefixes and not name.startswith(prefixes):
                continue  # a dot-name is a fact not yet written whole (create_file)
            try:
                data = read_regular(job, name, trusted)
                record: Fact = json.loads(data)  # checked next: a JSON object of a kind
                if not isinstance(record, dict) or record.get("kind") not in KINDS:
                    raise FactError(f"{name}: not a fact")
                problem = format_problem(record)
                if problem:
                    raise FactError(f"{name}: {problem}")
            except (FactError, ValueError) as exc:
                problems.append(
                    f"{where}/{exc}"
                    if isinstance(exc, FactError)
                    else f"{where}/{name}: garbled ({exc})"
                )
                continue
            facts.append(record)
    except FileNotFoundError:
        pass
    except PermissionError as exc:
        problems.append(f"cannot read the facts of job {job_id} under {state_dir}: {exc.strerror}")
    except (FactError, OSError) as exc:
        problems.append(str(exc))
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return facts, problems


def token_time(token: str) -> float | None:
    """When a fact's token was made (its first 16 hex digits are nanoseconds), or None."""
    try:
        return int(token[:16], 16) / 1e9
    except ValueError:
        return None


def node_activity(
    state_dir: str, nodes: set[str], since: float
) -> dict[str, dict[str, list[float]]] | None:
    """For each of ``nodes``: when it recorded ``start`` and ``end`` facts, for any job, since
    ``since`` (``{"start": [times], "end": [times]}``), read from the file names of the job
    folders changed since then; None when ``facts/`` cannot be listed (not root).

    What it is for: a node that records starts and never an end has an Epilog that does not
    run (``dispatch-cease`` says so)."""
    found: dict[str, dict[str, list[float]]] = {node: {"start": [], "end": []} for node in nodes}
    top = os.path.join(state_dir, FACTS)
    try:
        users = os.listdir(top)
    except OSError:
        return None
    for user in users:
        if not user.isdigit():
            continue
        try:
            jobs = os.scandir(os.path.join(top, user))
        except OSError:
            continue
        with jobs:
            for job in jobs:
                try:
                    if (
                        not job.is_dir(follow_symlinks=False)
                        or job.stat(follow_symlinks=False).st_mtime < since - 1
                    ):
                        continue
                    names = os.listdir(job.path)
                except OSError:
                    continue
                for name in names:
                    parsed = parse_name(name)
                    if (
                        parsed is None
                        or parsed[0] not in ("start", "end")
                        or parsed[1] not in found
                    ):
                        continue
                    made = token_time(parsed[3])
                    if made is not None and made >= since:
                        found[parsed[1]][parsed[0]].append(made)
    return found


def fact_uids(state_dir: str) -> list[int]:
    """Every uid with a folder under ``facts/`` (each job that ran under the hooks leaves its
    user's), in order: what names a user to the site's view where the account database does
    not list every account.  None there (no StateDir or ``facts/``: no hooks ran) is ``[]``;
    FactError when ``facts/`` cannot be listed or is not trusted (as readers trust it)."""
    fds: list[int] = []
    try:
        try:
            _open_chain(state_dir, (FACTS,), fds)
            names = os.listdir(fds[-1])
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise FactError(f"cannot list {state_dir}/{FACTS}: {exc.strerror}") from None
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return sorted(int(n) for n in names if n.isascii() and n.isdigit())


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


def array_starts(state_dir: str, uid: int, array: str) -> list[tuple[str, set[tuple[str, str]]]]:
    """Every folder of user ``uid`` numbered ``array`` or later (Slurm numbers a task after its
    array), in job order, with the (array, task) pairs its ``ctld-start`` facts name (only
    those facts are read; a start without both fields names none); [] when ``array`` is not a
    job id or the user's facts cannot be listed."""
    if not (array.isascii() and array.isdigit()):
        return []
    fds: list[int] = []
    try:
        _open_chain(state_dir, (FACTS, str(uid)), fds)
        names = os.listdir(fds[-1])
    except (OSError, FactError):
        return []
    finally:
        for fd in reversed(fds):
            os.close(fd)
    first = int(array)
    found = []
    for name in sorted(
        (n for n in names if n.isascii() and n.isdigit() and int(n) >= first), key=int
    ):
        starts, _ = read_job_facts(state_dir, uid, name, ("ctld-start.",))
        found.append(
            (
                name,
                {
                    (f["array_job_id"], f["array_task_id"])
                    for f in starts
                    if isinstance(f.get("array_job_id"), str)
                    and isinstance(f.get("array_task_id"), str)
                },
            )
        )
    return found


def array_task_job(state_dir: str, uid: int, array: str, task: str) -> str | None:
    """The job id under which task ``task`` of array ``array`` of user ``uid`` filed its facts
    (its own ``SLURM_JOB_ID``: task 1 of array 97 may be job 98), from the controller's start,
    which names the array and the task (``array_job_id``, ``array_task_id``); None when no
    folder says so (facts written before those fields, or none left).  For when the controller
    has forgotten the task: every folder :func:`array_starts` reads is read, since job ids
    are used again once slurmctld's state starts anew or MaxJobId wraps, so two folders may
    name the task, or the folder that does may hold another job's start too; either is a
    FactError naming them, since the facts then do not say which job the task was."""
    if not (task.isascii() and task.isdigit()):
        return None
    found: list[str] = []
    for name, named in array_starts(state_dir, uid, array):
        if (array, task) not in named:
            continue
        others = sorted(f"array {a} task {t}" for a, t in named - {(array, task)})
        if others:
            raise FactError(
                f"the facts of job {name} (under {state_dir}/{FACTS}/{uid}) name "
                f"array {array} task {task}, and job {name} also has a controller "
                f"start of {', '.join(others)}: job id {name} was used twice "
                "(slurmctld's state started anew, or MaxJobId wrapped)"
            )
        found.append(name)
    if len(found) > 1:
        raise FactError(
            "the facts of "
            + " and ".join(f"job {n}" for n in found)
            + f" (under {state_dir}/{FACTS}/{uid}) each name array {array} task "
            f"{task}: job ids were used twice (slurmctld's state started anew, or "
            "MaxJobId wrapped)"
        )
    return found[0] if found else None
