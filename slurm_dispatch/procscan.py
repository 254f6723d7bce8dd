"""The survivor scan: processes of a job still alive on this machine after slurmd's kill.

Invariant: standard library only (the Epilog imports it); it reads /proc and never writes.
"""

from __future__ import annotations

import os

__all__ = ["ancestors", "scan_survivors"]


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
