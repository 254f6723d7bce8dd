"""The sandbox's daemons: munged, slurmctld and a slurmd per node, started, checked and stopped;
with accounting (:mod:`.accounting`), a MariaDB server and slurmdbd too.

Role: each :class:`Daemon` says how it starts (its argv, the user it runs as), where its pid
file and log are, and which tokens of ``/proc/PID/cmdline`` (or, for slurmdbd, which takes no
option naming its configuration, of ``/proc/PID/environ``) make a pid its own; :func:`start`
waits for a self-daemonizing program's pid file to name it (``mariadbd``, which stays in the
foreground, is started detached with ``setsid -f``), :func:`stop` sends TERM (and CONT, for a
partitioned slurmd), then KILL after a timeout; :func:`munge_works`, :func:`database_answers`,
:func:`dbd_answers` and :func:`controller_answers` are what ``up`` waits for.  munged's key is
made here, once.

Invariant: a pid is signalled only when it came from the daemon's own pid file *and* its
command line (or environment) names this sandbox's configuration (or socket); a stale pid
file whose number was reused by another process is treated as no daemon.
"""

from __future__ import annotations

import os
import pwd
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import SandboxError
from . import network
from .accounting import SERVER_OPTIONS
from .clients import program, root_of, run_slurm, wrap
from .layout import DB_USER, MUNGE_USER, Layout
from .state_folder import append, create_once, tail


@dataclass(frozen=True)
class Daemon:
    """One daemon of a sandbox: how it starts, and how to tell its pid from anyone else's."""

    name: str
    program: str
    argv: tuple[str, ...]
    # Tokens that must all appear in /proc/PID/cmdline for the pid to be ours.
    marks: tuple[str, ...]
    pid_file: Path
    log: Path
    run_as: Optional[str] = None
    # A slurmd starts inside its node's network namespace (network.netns_argv).
    node: Optional[str] = None
    # Lines that must all be in /proc/PID/environ (for a program whose argv names nothing).
    environ_marks: tuple[str, ...] = ()
    # Runs from this machine even for a sandbox in a Debian root (the database server).
    on_host: bool = False
    # Stays in the foreground: started detached (setsid -f), its pid file its own.
    foreground: bool = False


def munged(layout: Layout) -> Daemon:
    socket_arg = f"--socket={layout.munge_socket}"
    return Daemon(
        name="munged",
        program="munged",
        argv=(
            program("munged", root_of(layout)),
            f"--key-file={layout.munge_key}",
            socket_arg,
            f"--pid-file={layout.munge_pid_file}",
            f"--log-file={layout.munge_log}",
            f"--seed-file={layout.munge_seed}",
            "--num-threads=4",
        ),
        marks=(socket_arg,),
        pid_file=layout.munge_pid_file,
        log=layout.munge_log,
        run_as=MUNGE_USER,
    )


def slurmctld(layout: Layout) -> Daemon:
    conf = str(layout.slurm_conf)
    return Daemon(
        name="slurmctld",
        program="slurmctld",
        argv=(program("slurmctld", root_of(layout)), "-f", conf),
        marks=("-f", conf),
        pid_file=layout.slurmctld_pid_file,
        log=layout.slurmctld_log,
    )


def slurmd(layout: Layout, node: str) -> Daemon:
    conf = str(layout.slurm_conf)
    return Daemon(
        name=f"slurmd {node}",
        program="slurmd",
        argv=(program("slurmd", root_of(layout)), "-f", conf, "-N", node),
        marks=("-f", conf, "-N", node),
        pid_file=layout.slurmd_pid_file(node),
        log=layout.slurmd_log(node),
        node=node,
    )


def mariadbd(layout: Layout) -> Daemon:
    """The sandbox's own database server (:mod:`.accounting`): no network, its socket in
    ``<state>/db``, as the mysql user (it drops to it itself)."""
    socket_arg = f"--socket={layout.db_socket}"
    return Daemon(
        name="mariadbd",
        program="mariadbd",
        argv=(
            program("mariadbd"),
            "--no-defaults",
            f"--datadir={layout.db_data}",
            socket_arg,
            f"--pid-file={layout.db_pid_file}",
            f"--log-error={layout.db_log}",
            f"--user={DB_USER}",
            *SERVER_OPTIONS,
            *(
                (f"--ssl-cert={layout.db_cert}", f"--ssl-key={layout.db_key}")
                if layout.db_key.exists()
                else ()
            ),
        ),
        marks=(socket_arg,),
        pid_file=layout.db_pid_file,
        log=layout.db_log,
        on_host=True,
        foreground=True,
    )


def slurmdbd(layout: Layout) -> Daemon:
    """slurmdbd reads ``slurmdbd.conf`` beside ``$SLURM_CONF`` and reaches the server through
    ``$MYSQL_UNIX_PORT`` (:func:`_daemon_env`): its environment tells it apart."""
    return Daemon(
        name="slurmdbd",
        program="slurmdbd",
        argv=(program("slurmdbd", root_of(layout)),),
        marks=(),
        pid_file=layout.slurmdbd_pid_file,
        log=layout.slurmdbd_log,
        environ_marks=(f"SLURM_CONF={layout.slurm_conf}",),
    )


def _read_pid(pid_file: Path) -> Optional[int]:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _proc_words(pid: int, name: str = "cmdline") -> list[str]:
    """``/proc/PID/cmdline`` (or ``environ``) as its NUL-separated words; [] when gone."""
    try:
        raw = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _environ_has(pid: int, marks: tuple[str, ...]) -> bool:
    """Whether ``marks`` are all in the pid's environment.  Only root may read a root
    process's environment, and only root signals: a status read by anyone else (``dispatch-
    sandbox status`` as the job user) takes the pid file and the program's name for it."""
    if os.geteuid() != 0 and not os.access(f"/proc/{pid}/environ", os.R_OK):
        return True
    return set(marks) <= set(_proc_words(pid, "environ"))


def _proc_state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    after = text.rpartition(")")[2].split()
    return after[0] if after else ""


def is_stopped(pid: Optional[int]) -> bool:
    return pid is not None and _proc_state(pid) in ("T", "t")


def _is_ours(pid: int, daemon: Daemon) -> bool:
    argv = _proc_words(pid)
    if not argv or os.path.basename(argv[0]) != daemon.program:
        return False
    if daemon.environ_marks and not _environ_has(pid, daemon.environ_marks):
        return False
    return all(mark in argv for mark in daemon.marks) and (
        "-N" not in daemon.marks
        or argv[argv.index("-N") + 1 : argv.index("-N") + 2]
        == [daemon.marks[daemon.marks.index("-N") + 1]]
    )


def live_pid(daemon: Daemon) -> Optional[int]:
    """The daemon's pid if its pid file names a live (non-zombie) process that is ours."""
    pid = _read_pid(daemon.pid_file)
    if pid is None or _proc_state(pid) in ("", "Z", "X") or not _is_ours(pid, daemon):
        return None
    return pid


def alive(daemon: Daemon) -> bool:
    return live_pid(daemon) is not None


def checked_pid(daemon: Daemon) -> int:
    pid = live_pid(daemon)
    if pid is None:
        raise SandboxError(
            f"{daemon.name} is not running (pid file {daemon.pid_file}); run `dispatch-sandbox up`"
        )
    return pid


def start(daemon: Daemon, layout: Layout) -> list[str]:
    """Start a self-daemonizing program and wait for its pid file to name it."""
    daemon.pid_file.unlink(missing_ok=True)
    start_log = layout.log_dir / f"{daemon.name.replace(' ', '-')}.start.log"
    extra: dict[str, Any] = {}
    argv = list(daemon.argv)
    if daemon.foreground:
        argv = [program("setsid"), "-f", *argv]
    if root_of(layout) is not None and not daemon.on_host:
        # Mounting needs root: the root's own runuser drops to the daemon's user inside.
        argv = wrap(layout, argv, user=daemon.run_as)
    elif daemon.run_as is not None:
        extra = {"user": daemon.run_as, "group": daemon.run_as, "extra_groups": []}
    if daemon.node is not None:
        argv = network.netns_argv(layout, daemon.node, argv)
    with append(start_log) as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(daemon.argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_daemon_env(layout),
                cwd="/",
                start_new_session=True,
                timeout=60,
                **extra,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"could not start {daemon.name}: {exc}") from exc
    if proc.returncode != 0:
        raise SandboxError(
            f"{daemon.name} exited {proc.returncode} at start:\n"
            + tail(start_log)
            + tail(daemon.log)
        )
    deadline = time.monotonic() + 15
    while not alive(daemon):
        if time.monotonic() > deadline:
            raise SandboxError(
                f"{daemon.name} did not stay up (no live pid in "
                f"{daemon.pid_file}):\n" + tail(start_log) + tail(daemon.log)
            )
        time.sleep(0.05)
    return [f"started {daemon.name} (pid {live_pid(daemon)})"]


def stop(daemon: Daemon, timeout: float = 30.0) -> list[str]:
    pid = live_pid(daemon)
    if pid is None:
        return []
    os.kill(pid, signal.SIGTERM)
    # A partitioned slurmd gets the TERM only once it runs again.
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while _proc_state(pid) not in ("", "Z", "X") and _is_ours(pid, daemon):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return [f"killed {daemon.name} (pid {pid}; it ignored SIGTERM for {timeout:.0f} s)"]
        time.sleep(0.05)
    return [f"stopped {daemon.name} (pid {pid})"]


def _daemon_env(layout: Layout) -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SLURM_CONF": str(layout.slurm_conf),
        "LANG": "C.UTF-8",
        "MYSQL_UNIX_PORT": str(layout.db_socket),
        # mariadbd's files (its pid file above all) readable by all, as every other pid
        # file here: `dispatch-sandbox status` runs as any user (its default is 0660).
        "UMASK": "0644",
    }


def munge_works(layout: Layout) -> bool:
    sock = f"--socket={layout.munge_socket}"
    root = root_of(layout)
    try:
        cred = subprocess.run(
            wrap(layout, [program("munge", root), sock, "-n"], root=root),
            capture_output=True,
            timeout=5,
            stdin=subprocess.DEVNULL,
        )
        if cred.returncode != 0:
            return False
        check = subprocess.run(
            wrap(layout, [program("unmunge", root), sock], root=root),
            input=cred.stdout,
            capture_output=True,
            timeout=5,
        )
    except subprocess.TimeoutExpired:
        return False
    return check.returncode == 0


def database_answers(layout: Layout) -> bool:
    """The sandbox's server takes connections on its socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(str(layout.db_socket))
        except OSError:
            return False
    return True


def dbd_answers(layout: Layout) -> bool:
    """slurmdbd answers a client (``sacctmgr show cluster``: it has reached its database)."""
    try:
        run_slurm(layout, ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], timeout=10)
    except SandboxError:
        return False
    return True


def controller_answers(layout: Layout) -> bool:
    try:
        return " is UP" in run_slurm(layout, ["scontrol", "ping"], timeout=10)
    except SandboxError:
        return False


def wait_until(
    predicate: Any, deadline: float, what: str, layout: Layout, nodes: Sequence[str]
) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise SandboxError(f"timed out waiting for {what}:\n" + logs_tail(layout, nodes))
        time.sleep(0.1)


def logs_tail(layout: Layout, nodes: Sequence[str]) -> str:
    paths = [
        layout.munge_log,
        layout.db_log,
        layout.slurmdbd_log,
        layout.slurmctld_log,
        *(layout.slurmd_log(n) for n in nodes),
    ]
    return "".join(tail(p) for p in paths) or f"(no logs yet in {layout.log_dir})"


def ensure_munge_key(layout: Layout) -> list[str]:
    """munged's key, made once (1 KiB from the system's random source, the munge user's, 0400)."""
    if layout.munge_key.exists():
        return []
    munge = pwd.getpwnam(MUNGE_USER)
    create_once(layout.munge_key, os.urandom(1024), 0o400, munge.pw_uid, munge.pw_gid)
    return [f"created munge key {layout.munge_key}"]
