"""The sandbox: a real multi-node Slurm cluster on one machine, for the demo and the real tests.

It runs Debian's own daemons on loopback: one ``munged`` (as the munge user, with its own key and
socket), one ``slurmctld`` and one ``slurmd -N nX`` per node, all as root, configured for speed
(short credential lifetime, short timeouts, a scheduler that starts jobs within a second).  Jobs
run as an unprivileged user (``dispatchuser``) from a virtualenv under the state folder that this
repository is installed into, because the developer's own interpreter is usually unreachable for
that user.

Another Slurm release (``up(slurm="24.11")``, :data:`sandbox_root.RELEASES`) runs the same
daemons, the same configuration and a venv on the root's own Python from a Debian root built
once with debootstrap (:mod:`slurm_dispatch.sandbox.root`); every command that talks to that
cluster, the sandbox's own included, enters the root (:func:`command`).  A state folder keeps
the release it was made with (its manifest says which, and where the root is).

Invariant: everything the sandbox writes or starts lives under its state folder (configuration,
munge key, socket, pid files, logs, spool, state, venv), the Debian root of another release
under its cache folder.  It never reads or writes ``/etc/slurm`` or ``/etc/munge``, never changes
the host's mount table, and never signals a process unless the pid came from one of its own pid
files *and* that process's command line names its own configuration.

The state folder's path is predictable (``/var/tmp/slurm-dispatch-sandbox``), so another local
user may have made it, or a folder above it, first.  Before root writes there
(:func:`claim_state_folder`, run by every root verb) the path is walked from ``/`` one opened
folder at a time, never following a link it has not checked: every folder on the way must be
root's and closed to others (or sticky, like ``/var/tmp``), the state folder is made with an
exclusive ``mkdir`` or accepted only when root's and writable by nobody else, and so is each
folder the sandbox makes in it (``munge/`` is the munge user's).  No other user can then place a
name there; on top of that, files are written to a fresh ``O_EXCL|O_NOFOLLOW`` temporary name
and renamed into place, and opened with ``O_NOFOLLOW``, so a link is replaced, never written
through.  The library never prints: it
returns values and raises :class:`~slurm_dispatch.errors.SandboxError`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import SandboxError
from . import root as sandbox_root

DEFAULT_DIR = Path("/var/tmp/slurm-dispatch-sandbox")
DIR_ENV = "DISPATCH_SANDBOX_DIR"
USER_ENV = "DISPATCH_SANDBOX_USER"
# Which Slurm the sandbox runs: "host" (this machine's, the default) or a release of
# sandbox_root.RELEASES, run from a Debian root; a release's default folder is DEFAULT_DIR-<it>.
RELEASE_ENV = "DISPATCH_SANDBOX_SLURM"
HOST_RELEASE = sandbox_root.HOST
DEFAULT_USER = "dispatchuser"
DEFAULT_NODE_COUNT = 3
MAX_NODE_COUNT = 32
CLUSTER_NAME = "dispatch-sandbox"
# Another ClusterName, for a second sandbox standing for another cluster over the same home.
# Fixed for a folder's life: slurmctld refuses to start on state saved under another name.
CLUSTER_ENV = "DISPATCH_SANDBOX_CLUSTER"
# How long slurmctld keeps an ended job (slurm.conf MinJobAge); a short one lets a test see
# a job forgotten (slurmctld purges about once a minute).
MIN_JOB_AGE = 600
MIN_JOB_AGE_ENV = "DISPATCH_SANDBOX_MIN_JOB_AGE"
PARTITION_NAME = "debug"
# Well away from Slurm's defaults (6817/6818) so a system Slurm can run beside the sandbox.
# A sandbox in another folder shifts them (Layout.port_slot) so that two can run at once.
CONTROLLER_PORT = 16817
FIRST_NODE_PORT = 17001
PORT_SLOTS = 50
MUNGE_USER = "munge"
SYSTEM_PYTHON = "/usr/bin/python3"
APT_PACKAGES = ("slurm-wlm", "munge")
SLURM_PROGRAMS = ("slurmctld", "slurmd", "munged", "munge", "unmunge", "sinfo", "scontrol",
                  "sbatch", "squeue", "scancel")
# Job credential lifetime: a requeued job may not start again before it has passed (measured
# here: requeue-to-running 6 s with 5, 11 s with 10).  Slurm 22.05 rejects values below 5 and
# falls back to 120 (with an error in the log).
CRED_EXPIRE = 5
FIRST_ROOT_JOB_ID = 1_000_000

PathLike = Union[str, "os.PathLike[str]"]

# Node states (sinfo %T, flags stripped) in which a node accepts or runs work.
USABLE_STATES = frozenset({"idle", "mixed", "allocated"})
# sinfo appends these to a state: * not responding, ~ powered off, # powering up, ! powering
# down, % powering down, $ maintenance, @ pending reboot, ^ rebooting, - planned.
_STATE_FLAGS = "*~#!%$@^-"


def site_config_lines(state_dir: Path) -> list[str]:
    """Lines of ``<state>/etc/site.conf``, included at the end of the sandbox's slurm.conf.

    This is where the project's hooks get installed the way a site admin would (Prolog, Epilog,
    PrologSlurmctld, EpilogSlurmctld, TaskProlog, PrologFlags): the base slurm.conf sets none of
    those keys, so this file may set any of them.  The hooks' parts and dispatch.conf are copied
    from the checkout's ``contrib/`` and ``site-config/`` (docs/admin-guide.md, "Install") with
    the knobs pointing at the sandbox: its venv's interpreter and ``<state>/etc/dispatch.conf``,
    whose StateDir is ``<state>/dispatch-state``.
    """
    layout = Layout(state_dir)
    if not _install_dispatch_site(layout):
        return []
    hooks = layout.etc
    return [
        "# slurm-dispatch hooks (site-config/slurm.conf.dispatch, with sandbox paths)",
        f"Prolog={hooks}/prolog.d/*",
        f"Epilog={hooks}/epilog.d/*",
        f"PrologSlurmctld={hooks}/prolog.d/{DISPATCH_PART}",
        f"EpilogSlurmctld={hooks}/epilog.d/{DISPATCH_PART}",
        "PrologFlags=Alloc",
        f"HealthCheckProgram={hooks}/dispatch-recheck",
        "HealthCheckInterval=5",
    ]


DISPATCH_PART = "05-dispatch"


def _dispatch_knobs(text: str, python: Path, conf: Path) -> str:
    """Set a contrib part's knobs the way the admin guide tells an admin to."""
    lines = []
    for line in text.splitlines():
        if line.startswith("DISPATCH_PYTHON="):
            line = f"DISPATCH_PYTHON={python}"
        elif line.startswith("DISPATCH_CONF="):
            line = f"DISPATCH_CONF={conf}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _install_dispatch_site(layout: Layout) -> bool:
    """Install the hook parts, the re-check script and dispatch.conf; False when the checkout
    with ``contrib/`` is not at hand and nothing was installed before."""
    repo = source_root()
    conf = layout.etc / "dispatch.conf"
    facts_dir = layout.root / "dispatch-state"
    if repo is None or not (repo / "contrib" / "prolog.d" / DISPATCH_PART).is_file():
        return conf.is_file()
    python = layout.venv_bin / "python"
    parts = {
        repo / "contrib" / "prolog.d" / DISPATCH_PART: layout.etc / "prolog.d" / DISPATCH_PART,
        repo / "contrib" / "epilog.d" / DISPATCH_PART: layout.etc / "epilog.d" / DISPATCH_PART,
        repo / "site-config" / "dispatch-recheck": layout.etc / "dispatch-recheck",
    }
    for source, target in parts.items():
        _own_folder(target.parent)
        _write_if_changed(target, _dispatch_knobs(source.read_text(), python, conf), 0o755)
    settings = []
    for line in (repo / "site-config" / "dispatch.conf").read_text().splitlines():
        if line.startswith("StateDir="):
            line = f"StateDir={facts_dir}"
        elif line.startswith("BootTimeTolerance="):
            line = "BootTimeTolerance=2"
        elif line.startswith("ListingLag="):
            line = "ListingLag=0"  # one machine, one local file system: no node sees late
        settings.append(line)
    _write_if_changed(conf, "\n".join(settings) + "\n", 0o644)
    _own_folder(facts_dir)
    return True


# --------------------------------------------------------------------------------------------
# Where things live


@dataclass(frozen=True)
class Layout:
    """Every path of one sandbox, derived from its state folder."""

    root: Path

    @property
    def port_slot(self) -> int:
        """0 for the default folder, else 1..49 derived from the folder's path."""
        if self.root == DEFAULT_DIR:
            return 0
        return 1 + zlib.crc32(str(self.root).encode()) % (PORT_SLOTS - 1)

    @property
    def controller_port(self) -> int:
        return CONTROLLER_PORT - self.port_slot

    def node_port(self, index: int) -> int:
        """Port of the node at ``index`` (0 for n1); room for MAX_NODE_COUNT per slot."""
        return FIRST_NODE_PORT + (MAX_NODE_COUNT + 8) * self.port_slot + index

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def site_conf(self) -> Path:
        return self.etc / "site.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_pid_file(self) -> Path:
        return self.munge_dir / "munged.pid"

    @property
    def munge_log(self) -> Path:
        return self.munge_dir / "munged.log"

    @property
    def munge_seed(self) -> Path:
        return self.munge_dir / "munged.seed"

    @property
    def state_save(self) -> Path:
        return self.root / "state"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def venv_bin(self) -> Path:
        return self.venv / "bin"

    @property
    def source_hash_file(self) -> Path:
        return self.venv / ".slurm-dispatch-source-sha256"

    @property
    def manifest(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def slurmctld_pid_file(self) -> Path:
        return self.run_dir / "slurmctld.pid"

    @property
    def slurmctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    def slurmd_pid_file(self, node: str) -> Path:
        return self.run_dir / f"slurmd-{node}.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"


def default_dir(release: Optional[str] = None) -> Path:
    """The default state folder of ``release`` (default ``$DISPATCH_SANDBOX_SLURM``, else the
    host's): DEFAULT_DIR for the host's Slurm, ``DEFAULT_DIR-<release>`` for another."""
    chosen = sandbox_root.normalize(release if release is not None
                                    else os.environ.get(RELEASE_ENV))
    return DEFAULT_DIR if chosen == HOST_RELEASE else Path(f"{DEFAULT_DIR}-{chosen}")


def state_dir(override: Optional[PathLike] = None) -> Path:
    """The sandbox state folder: ``override``, else ``$DISPATCH_SANDBOX_DIR``, else the default
    folder of ``$DISPATCH_SANDBOX_SLURM``'s release (:func:`default_dir`)."""
    # An empty value (DISPATCH_SANDBOX_DIR= from a Makefile) means the default, not ".".
    chosen = override if override not in (None, "") else \
        os.environ.get(DIR_ENV) or default_dir()
    path = Path(os.path.abspath(os.fspath(chosen)))
    bad = [c for c in " \t\n,=\"'#" if c in str(path)]
    if bad:
        raise SandboxError(
            f"sandbox folder {str(path)!r} contains {''.join(bad)!r}; slurm.conf cannot quote "
            "that: choose a folder whose path has no spaces, commas, '=', quotes or '#'")
    # A unix socket path must fit in 108 bytes.
    if len(str(Layout(path).munge_socket)) > 100:
        raise SandboxError(f"sandbox folder {str(path)!r} is too long for a unix socket path "
                           "(keep it under about 80 characters)")
    return path


def node_names(count: int) -> list[str]:
    """``n1`` … ``nCOUNT``."""
    if not 1 <= count <= MAX_NODE_COUNT:
        raise SandboxError(f"node count {count} is out of range: choose 1 to {MAX_NODE_COUNT}")
    return [f"n{i}" for i in range(1, count + 1)]


def render_slurm_conf(layout: Layout, nodes: Sequence[str], hostname: str,
                      release: str = HOST_RELEASE, cluster: str = CLUSTER_NAME,
                      min_job_age: int = MIN_JOB_AGE) -> str:
    """The sandbox's slurm.conf (pure): loopback nodes, fast timers, no accounting, no hooks.

    The same for every release (24.11 also reads ``cgroup.conf``, written beside it), except
    that a sandbox in a Debian root numbers its jobs from FIRST_ROOT_JOB_ID: the job user is
    shared with the host's sandboxes, and the hooks' survivor scan must not take a process a
    host sandbox left behind under the same job id for one of this sandbox's jobs."""
    spool = layout.spool / "%n"
    lines = [
        "# slurm.conf of the slurm-dispatch sandbox, written by `dispatch-sandbox up`: do not",
        "# edit; site settings come from the sandbox's site_config_lines (site.conf).",
        f"ClusterName={cluster}",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={layout.controller_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "",
        "# Authentication: our own munged, never the system one.  CredType signs job",
        "# credentials through the same socket; a requeued job waits cred_expire to run again.",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket},cred_expire={CRED_EXPIRE}",
        "",
        "# Plain processes: no cgroups on these machines.",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        f"PlugStackConfig={layout.plugstack_conf}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
        "",
        "# Scheduling: start work within about a second of it becoming eligible.",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=1,sched_min_interval=0,"
        "batch_sched_delay=0",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "",
        "# Timers: fail fast, requeue fast, keep ended jobs visible for ten minutes.",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "MessageTimeout=10",
        "KillWait=5",
        "InactiveLimit=0",
        "WaitTime=0",
        f"MinJobAge={min_job_age}",
        *([f"FirstJobId={FIRST_ROOT_JOB_ID}"] if release != HOST_RELEASE else []),
        "PrologEpilogTimeout=30",
        "UnkillableStepTimeout=60",
        "JobRequeue=1",
        "ReturnToService=2",
        "",
        "# Files: all under the sandbox folder.",
        f"StateSaveLocation={layout.state_save}",
        f"SlurmdSpoolDir={spool}",
        f"SlurmctldPidFile={layout.slurmctld_pid_file}",
        f"SlurmdPidFile={layout.run_dir / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={layout.slurmctld_log}",
        f"SlurmdLogFile={layout.log_dir / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "",
        "# Nodes: one slurmd per node on this machine (`slurmd -N nX`), each on its own port.",
        "SlurmdParameters=config_overrides",
    ]
    for index, node in enumerate(nodes):
        lines.append(f"NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 "
                     f"Port={layout.node_port(index)} CPUs=2 RealMemory=1000 State=UNKNOWN")
    lines += [
        f"PartitionName={PARTITION_NAME} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
        "State=UP",
        "",
        f"Include {layout.site_conf}",
    ]
    return "\n".join(lines) + "\n"


def render_site_conf(layout: Layout) -> str:
    """The content of ``site.conf``: a header and :func:`site_config_lines`."""
    lines = ["# Site settings of the sandbox (slurm_dispatch.sandbox.cluster.site_config_lines)."]
    lines += site_config_lines(layout.root)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Environment for clients


def environment(directory: Optional[PathLike] = None, user: Optional[str] = None,
                base_path: Optional[str] = None) -> dict[str, str]:
    """The variables that point Slurm clients and ``dispatch`` at the sandbox.

    Only the sandbox's own variables (``SLURM_CONF``, ``DISPATCH_SANDBOX_DIR``,
    ``DISPATCH_SANDBOX_USER`` and ``PATH`` with ``<state>/venv/bin`` first); merge them into a
    copy of ``os.environ`` to run commands.
    """
    layout = Layout(state_dir(directory))
    if user is None:
        user = _read_manifest(layout).get("user", DEFAULT_USER) if layout.manifest.exists() \
            else DEFAULT_USER
    path = base_path if base_path is not None else os.environ.get("PATH", os.defpath)
    return {
        "SLURM_CONF": str(layout.slurm_conf),
        DIR_ENV: str(layout.root),
        USER_ENV: str(user),
        "PATH": f"{layout.venv_bin}{os.pathsep}{path}" if path else str(layout.venv_bin),
    }


def env_lines(directory: Optional[PathLike] = None) -> list[str]:
    """Shell lines to ``eval``: the exports of :func:`environment`, PATH prepended literally.

    Refused for a sandbox in a Debian root: its clients and venv run only inside that root
    (:func:`command`, ``dispatch-sandbox exec``)."""
    layout = Layout(state_dir(directory))
    if _root_of(layout) is not None:
        release = _read_manifest(layout).get("slurm", "")
        raise SandboxError(
            f"the sandbox in {layout.root} runs Slurm {release} from its Debian root; its "
            "clients and venv do not run on this machine: run them with `dispatch-sandbox "
            "exec [--user USER] -- COMMAND`")
    env = environment(directory, base_path="")
    lines = [f"export {name}={shlex.quote(env[name])}"
             for name in ("SLURM_CONF", DIR_ENV, USER_ENV)]
    venv_bin = Layout(state_dir(directory)).venv_bin
    lines.append(f'export PATH={shlex.quote(str(venv_bin))}:"$PATH"')
    return lines


# --------------------------------------------------------------------------------------------
# Reports


@dataclass
class DaemonStatus:
    """One daemon of the sandbox as seen through its pid file."""

    name: str
    pid: Optional[int]
    alive: bool
    stopped: bool
    pid_file: str
    log: str


@dataclass
class NodeStatus:
    """One node as ``sinfo`` reports it (``state`` keeps flags such as ``*``)."""

    name: str
    state: str
    reason: str = ""

    @property
    def usable(self) -> bool:
        return _is_usable(self.state)


@dataclass
class SandboxStatus:
    """What ``status`` shows: the folder, the daemons, the nodes, and whether all is usable."""

    dir: str
    slurm_conf: str
    user: str
    venv_bin: str
    daemons: list[DaemonStatus] = field(default_factory=list)
    # "host" (this machine's Slurm) or the release run from a Debian root, and that root.
    slurm: str = HOST_RELEASE
    rootfs: str = ""
    nodes: list[NodeStatus] = field(default_factory=list)
    controller_error: str = ""

    @property
    def running(self) -> bool:
        """Every daemon alive and answering, every node usable."""
        return (bool(self.daemons) and all(d.alive and not d.stopped for d in self.daemons)
                and bool(self.nodes) and all(n.usable for n in self.nodes))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["running"] = self.running
        for node in data["nodes"]:
            node["usable"] = _is_usable(node["state"])
        return data


@dataclass
class UpReport:
    """What ``up`` did (``actions`` is empty when nothing needed doing) and the result."""

    status: SandboxStatus
    actions: list[str]
    seconds: float
    # Nodes left partitioned (their slurmd stopped by `partition`), not waited for.
    partitioned: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Public verbs


def up(directory: Optional[PathLike] = None, nodes: Optional[int] = None,
       user: str = DEFAULT_USER, source: Optional[PathLike] = None,
       timeout: float = 120.0, slurm: Optional[str] = None) -> UpReport:
    """Start the sandbox, or make a running one whole; return when every node is usable.

    Usable means idle, or running jobs (``mixed``/``allocated``) that someone left running.
    Idempotent: with everything already running as configured it changes nothing; a node that
    :func:`partition` cut off stays cut off (listed in ``partitioned``, not waited for), since
    undoing someone's deliberate partition is :func:`heal`'s job.

    ``nodes`` defaults to the running sandbox's count, else 3.  ``source`` is the repository to
    install into ``<state>/venv`` (default: this checkout, when the package runs from one); it
    is reinstalled only when its files changed.  Raises :class:`SandboxError` with the tail of
    the daemon logs when the daemons and nodes are not up within ``timeout`` seconds (counted
    after packages and venv are in place).

    ``slurm`` chooses the release: ``host`` (this machine's Slurm) or one of
    :data:`sandbox_root.RELEASES` (``24.11``), whose daemons, clients, venv and jobs run from a
    Debian root built once under :func:`sandbox_root.cache_folder`.  Default:
    ``$DISPATCH_SANDBOX_SLURM``, else the folder's, else the host's; a folder keeps the
    release it was made with (another one is an error naming both).
    """
    started = time.monotonic()
    _require_root("up")
    wanted_release = slurm if slurm is not None else os.environ.get(RELEASE_ENV)
    if directory is None or directory == "":
        directory = os.environ.get(DIR_ENV) or default_dir(wanted_release)
    layout = Layout(claim_state_folder(directory))
    actions: list[str] = []
    old_manifest = _read_manifest(layout) if layout.manifest.exists() else {}
    release = sandbox_root.normalize(
        wanted_release if wanted_release is not None
        else old_manifest.get("slurm", HOST_RELEASE))
    if old_manifest and old_manifest.get("slurm", HOST_RELEASE) != release:
        raise SandboxError(
            f"the sandbox in {layout.root} runs Slurm "
            f"{old_manifest.get('slurm', HOST_RELEASE)}, not {release}: its state cannot change "
            f"release; choose another folder (--dir) or remove {layout.root}")
    root: Optional[Path] = None
    if release == HOST_RELEASE:
        actions += _ensure_packages(layout)
    else:
        actions += _ensure_munge_user(layout)
        root, built = sandbox_root.ensure_root(
            sandbox_root.RELEASES[release], sandbox_root.cache_folder(),
            lambda folder: _claim(folder, create=True),
            lambda packages: _apt_install(layout, packages))
        actions += built
        point = sandbox_root.mount_point(root, layout.root)
        if point is not None:
            _claim(point, create=True)
    _make_folders(layout)
    with _locked(layout):
        manifest = _read_manifest(layout) if layout.manifest.exists() else {}
        old_nodes: list[str] = list(manifest.get("nodes", []))
        count = nodes if nodes is not None else (len(old_nodes) or DEFAULT_NODE_COUNT)
        wanted = node_names(count)
        for node in wanted:
            _own_folder(layout.spool / node)
        actions += _ensure_user(user)
        repo = Path(source) if source is not None else source_root()
        if repo is not None:
            actions += _ensure_venv(layout, repo, root)
        elif not (layout.venv_bin / "python").exists():
            raise SandboxError(
                f"no venv in {layout.venv} and no source checkout to install from: run "
                "`dispatch-sandbox up` from a checkout (bin/dispatch-sandbox) once")
        actions += _ensure_munge_key(layout)
        changed = _write_config(layout, wanted, release)
        if changed:
            actions.append("wrote " + ", ".join(changed))
        new_manifest: dict[str, Any] = {"nodes": wanted, "user": user}
        if root is not None:
            new_manifest.update(slurm=release, rootfs=str(root))
        if manifest != new_manifest:
            _write_text(layout.manifest, json.dumps(new_manifest, indent=2) + "\n")

        deadline = time.monotonic() + timeout
        munged = _munged(layout)
        if not _alive(munged):
            actions += _start(munged, layout)
            _wait(lambda: _munge_works(layout), deadline, "munged to answer", layout, wanted)

        slurmds = {node: _slurmd(layout, node) for node in sorted(set(wanted) | set(old_nodes))}
        slurmctld = _slurmctld(layout)
        if changed:
            # Node lists and plugin settings are only read at start; restart what runs.
            # Running jobs survive: their slurmstepd processes do not depend on slurmd.
            for daemon in [*slurmds.values(), slurmctld]:
                actions += _stop(daemon)
        for node in set(old_nodes) - set(wanted):
            actions += _stop(slurmds[node])
        if not _alive(slurmctld):
            actions += _start(slurmctld, layout)
            _wait(lambda: _controller_answers(layout), deadline, "slurmctld to answer",
                  layout, wanted)
        partitioned = []
        for node in wanted:
            daemon = slurmds[node]
            if not _alive(daemon):
                actions += _start(daemon, layout)
            elif _is_stopped(_live_pid(daemon)):
                # Someone's deliberate partition (perhaps a test still running): not ours to
                # undo; `heal` does that.
                partitioned.append(node)
        actions += _wait_nodes_usable(
            layout, [n for n in wanted if n not in partitioned], deadline)
    return UpReport(status=status(layout.root), actions=actions,
                    seconds=round(time.monotonic() - started, 2), partitioned=partitioned)


def down(directory: Optional[PathLike] = None, timeout: float = 30.0) -> list[str]:
    """Stop the daemons this sandbox started (slurmds, slurmctld, munged); keep every file.

    Only pids from the sandbox's pid files whose command line names the sandbox are signalled.
    Job processes (slurmstepd and its children) are left alone, as a dead node would leave them.
    Returns what it did.
    """
    _require_root("down")
    layout = Layout(state_dir(directory))
    if not _claim(layout.root, create=False):
        return []
    actions: list[str] = []
    with _locked(layout):
        slurmd_nodes = sorted(p.name[len("slurmd-"):-len(".pid")]
                              for p in layout.run_dir.glob("slurmd-*.pid"))
        for node in slurmd_nodes:
            actions += _stop(_slurmd(layout, node), timeout)
        actions += _stop(_slurmctld(layout), timeout)
        actions += _stop(_munged(layout), timeout)
    return actions


def status(directory: Optional[PathLike] = None) -> SandboxStatus:
    """Daemons (pid, alive, stopped), nodes and their states, and the folder.  Needs no root."""
    layout = Layout(state_dir(directory))
    manifest = _read_manifest(layout) if layout.manifest.exists() else {}
    nodes: list[str] = list(manifest.get("nodes", []))
    report = SandboxStatus(dir=str(layout.root), slurm_conf=str(layout.slurm_conf),
                           user=str(manifest.get("user", DEFAULT_USER)),
                           venv_bin=str(layout.venv_bin),
                           slurm=str(manifest.get("slurm", HOST_RELEASE)),
                           rootfs=str(manifest.get("rootfs", "")))
    if not manifest:
        report.controller_error = f"no sandbox in {layout.root} (run `dispatch-sandbox up`)"
        return report
    for daemon in [_munged(layout), _slurmctld(layout), *(_slurmd(layout, n) for n in nodes)]:
        pid = _live_pid(daemon)
        report.daemons.append(DaemonStatus(
            name=daemon.name, pid=pid, alive=pid is not None,
            stopped=pid is not None and _is_stopped(pid),
            pid_file=str(daemon.pid_file), log=str(daemon.log)))
    try:
        states = node_states(layout.root)
    except SandboxError as exc:
        report.controller_error = str(exc)
    else:
        report.nodes = [states.get(n, NodeStatus(n, "absent")) for n in nodes]
    return report


def node_states(directory: Optional[PathLike] = None) -> dict[str, NodeStatus]:
    """Each node's state and reason from ``sinfo -N``; raises if the controller does not answer."""
    layout = Layout(state_dir(directory))
    out = _slurm(layout, ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], timeout=15)
    states: dict[str, NodeStatus] = {}
    for line in out.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            reason = "" if parts[2].strip() == "none" else parts[2].strip()
            states[parts[0].strip()] = NodeStatus(parts[0].strip(), parts[1].strip(), reason)
    return states


def partition(node: str, directory: Optional[PathLike] = None) -> int:
    """Cut ``node`` off: SIGSTOP its slurmd so it stops answering while its jobs keep running.

    Slurm marks the node DOWN after ``SlurmdTimeout`` and requeues its batch jobs elsewhere;
    the job's processes on the node are children of slurmstepd and go on.  Returns the pid.
    """
    _require_root("partition")
    layout = Layout(state_dir(directory))
    _claim(layout.root, create=False)
    daemon = _slurmd(layout, _known_node(layout, node))
    pid = _checked_pid(daemon)
    os.kill(pid, signal.SIGSTOP)
    return pid


def heal(node: str, directory: Optional[PathLike] = None, timeout: float = 60.0,
         wait: bool = True, register: bool = True) -> list[str]:
    """Undo :func:`partition`: SIGCONT the node's slurmd and (with ``wait``) wait until usable.

    The rejoining slurmd handles what queued up while it was silent: the controller's order to
    kill the job that was requeued away from it (then the Epilog runs for it).  With
    ``register`` it also gets SIGHUP, which makes it re-register at once; without, the node
    waits for the controller's next look at DOWN nodes (about 40 s here).  ``ReturnToService=2``
    then brings the node back; if it answers but stays DOWN or drained (say, a failed Epilog of
    the killed job), heal resumes it and says why it was down.  Returns what it did.
    """
    _require_root("heal")
    layout = Layout(state_dir(directory))
    _claim(layout.root, create=False)
    name = _known_node(layout, node)
    daemon = _slurmd(layout, name)
    actions: list[str] = []
    pid = _live_pid(daemon)
    if pid is None:
        actions += _start(daemon, layout)
    elif _is_stopped(pid):
        os.kill(pid, signal.SIGCONT)
        actions.append(f"continued slurmd {name}")
        if register:
            os.kill(pid, signal.SIGHUP)
    if wait:
        actions += _wait_nodes_usable(layout, [name], time.monotonic() + timeout)
    return actions


def stop_controller(directory: Optional[PathLike] = None) -> list[str]:
    """Stop slurmctld alone (a controller outage: every client call fails until
    :func:`start_controller`); the nodes and their jobs go on.  Returns what it did."""
    _require_root("stop the controller")
    layout = Layout(state_dir(directory))
    _claim(layout.root, create=False)
    with _locked(layout):
        return _stop(_slurmctld(layout))


def start_controller(directory: Optional[PathLike] = None, timeout: float = 60.0
                     ) -> list[str]:
    """Start slurmctld again after :func:`stop_controller` (it reads its saved state) and wait
    until it answers.  Returns what it did."""
    _require_root("start the controller")
    layout = Layout(state_dir(directory))
    _claim(layout.root, create=False)
    with _locked(layout):
        daemon = _slurmctld(layout)
        actions = [] if _alive(daemon) else _start(daemon, layout)
        _wait(lambda: _controller_answers(layout), time.monotonic() + timeout,
              "slurmctld to answer", layout, [])
    return actions


def set_job_requeue(enabled: bool, directory: Optional[PathLike] = None) -> None:
    """Set ``JobRequeue`` (1: Slurm requeues batch jobs after a node failure; 0: such a job
    ends NODE_FAIL) and make slurmctld read it (``scontrol reconfigure``), for sites that do
    not requeue.  Jobs take the value at submission; the next ``up`` restores 1."""
    _require_root("set JobRequeue")
    layout = Layout(state_dir(directory))
    _claim(layout.root, create=False)
    text = _read_own(layout.slurm_conf)
    if text is None or "\nJobRequeue=" not in text:
        raise SandboxError(f"{layout.slurm_conf} has no JobRequeue line: run "
                           "`dispatch-sandbox up` first")
    lines = [f"JobRequeue={1 if enabled else 0}" if line.startswith("JobRequeue=") else line
             for line in text.split("\n")]
    _write_text(layout.slurm_conf, "\n".join(lines))
    _slurm(layout, ["scontrol", "reconfigure"])


def source_root() -> Optional[Path]:
    """The checkout this package runs from, or None when it runs from an installed copy."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "slurm_dispatch").is_dir():
        return root
    return None


def source_digest(repo: Path) -> str:
    """SHA-256 over the files that make the installed package: pyproject, README, the package."""
    digest = hashlib.sha256()
    for path in _source_files(repo):
        digest.update(str(path.relative_to(repo)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Daemons


@dataclass(frozen=True)
class _Daemon:
    name: str
    program: str
    argv: tuple[str, ...]
    # Tokens that must all appear in /proc/PID/cmdline for the pid to be ours.
    marks: tuple[str, ...]
    pid_file: Path
    log: Path
    run_as: Optional[str] = None


def _munged(layout: Layout) -> _Daemon:
    socket_arg = f"--socket={layout.munge_socket}"
    return _Daemon(
        name="munged", program="munged",
        argv=(_program("munged", _root_of(layout)), f"--key-file={layout.munge_key}", socket_arg,
              f"--pid-file={layout.munge_pid_file}", f"--log-file={layout.munge_log}",
              f"--seed-file={layout.munge_seed}", "--num-threads=4"),
        marks=(socket_arg,), pid_file=layout.munge_pid_file, log=layout.munge_log,
        run_as=MUNGE_USER)


def _slurmctld(layout: Layout) -> _Daemon:
    conf = str(layout.slurm_conf)
    return _Daemon(name="slurmctld", program="slurmctld",
                   argv=(_program("slurmctld", _root_of(layout)), "-f", conf),
                   marks=("-f", conf),
                   pid_file=layout.slurmctld_pid_file, log=layout.slurmctld_log)


def _slurmd(layout: Layout, node: str) -> _Daemon:
    conf = str(layout.slurm_conf)
    return _Daemon(name=f"slurmd {node}", program="slurmd",
                   argv=(_program("slurmd", _root_of(layout)), "-f", conf, "-N", node),
                   marks=("-f", conf, "-N", node),
                   pid_file=layout.slurmd_pid_file(node), log=layout.slurmd_log(node))


def _read_pid(pid_file: Path) -> Optional[int]:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _proc_state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    after = text.rpartition(")")[2].split()
    return after[0] if after else ""


def _is_stopped(pid: Optional[int]) -> bool:
    return pid is not None and _proc_state(pid) in ("T", "t")


def _is_ours(pid: int, daemon: _Daemon) -> bool:
    argv = _cmdline(pid)
    if not argv or os.path.basename(argv[0]) != daemon.program:
        return False
    return all(mark in argv for mark in daemon.marks) and (
        "-N" not in daemon.marks or argv[argv.index("-N") + 1:argv.index("-N") + 2]
        == [daemon.marks[daemon.marks.index("-N") + 1]])


def _live_pid(daemon: _Daemon) -> Optional[int]:
    """The daemon's pid if its pid file names a live (non-zombie) process that is ours."""
    pid = _read_pid(daemon.pid_file)
    if pid is None or _proc_state(pid) in ("", "Z", "X") or not _is_ours(pid, daemon):
        return None
    return pid


def _alive(daemon: _Daemon) -> bool:
    return _live_pid(daemon) is not None


def _checked_pid(daemon: _Daemon) -> int:
    pid = _live_pid(daemon)
    if pid is None:
        raise SandboxError(f"{daemon.name} is not running (pid file {daemon.pid_file}); "
                           "run `dispatch-sandbox up`")
    return pid


def _start(daemon: _Daemon, layout: Layout) -> list[str]:
    """Start a self-daemonizing program and wait for its pid file to name it."""
    daemon.pid_file.unlink(missing_ok=True)
    start_log = layout.log_dir / f"{daemon.name.replace(' ', '-')}.start.log"
    extra: dict[str, Any] = {}
    argv = list(daemon.argv)
    if _root_of(layout) is not None:
        # Mounting needs root: the root's own runuser drops to the daemon's user inside.
        argv = _wrap(layout, argv, user=daemon.run_as)
    elif daemon.run_as is not None:
        extra = {"user": daemon.run_as, "group": daemon.run_as, "extra_groups": []}
    with _append(start_log) as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(daemon.argv)}\n"
                  .encode())
        out.flush()
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, env=_daemon_env(layout),
                                  cwd="/", start_new_session=True, timeout=60, **extra)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"could not start {daemon.name}: {exc}") from exc
    if proc.returncode != 0:
        raise SandboxError(f"{daemon.name} exited {proc.returncode} at start:\n"
                           + _tail(start_log) + _tail(daemon.log))
    deadline = time.monotonic() + 15
    while not _alive(daemon):
        if time.monotonic() > deadline:
            raise SandboxError(f"{daemon.name} did not stay up (no live pid in "
                               f"{daemon.pid_file}):\n" + _tail(start_log) + _tail(daemon.log))
        time.sleep(0.05)
    return [f"started {daemon.name} (pid {_live_pid(daemon)})"]


def _stop(daemon: _Daemon, timeout: float = 30.0) -> list[str]:
    pid = _live_pid(daemon)
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
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(layout.slurm_conf),
            "LANG": "C.UTF-8"}


def _client_env(layout: Layout) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_"))}
    env["SLURM_CONF"] = str(layout.slurm_conf)
    return env


def _slurm(layout: Layout, argv: list[str], timeout: float = 30) -> str:
    """Run a Slurm client against the sandbox; return stdout or raise with its output."""
    root = _root_of(layout)
    full = [_program(argv[0], root), *argv[1:]]
    try:
        proc = subprocess.run(_wrap(layout, full, root=root), capture_output=True, text=True,
                              env=_client_env(layout), timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{shlex.join(full)} did not answer within {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise SandboxError(f"{shlex.join(full)} failed (exit {proc.returncode}): "
                           + (proc.stderr + proc.stdout).strip())
    return proc.stdout


def _munge_works(layout: Layout) -> bool:
    sock = f"--socket={layout.munge_socket}"
    root = _root_of(layout)
    try:
        cred = subprocess.run(_wrap(layout, [_program("munge", root), sock, "-n"], root=root),
                              capture_output=True, timeout=5, stdin=subprocess.DEVNULL)
        if cred.returncode != 0:
            return False
        check = subprocess.run(_wrap(layout, [_program("unmunge", root), sock], root=root),
                               input=cred.stdout,
                               capture_output=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return check.returncode == 0


def _controller_answers(layout: Layout) -> bool:
    try:
        return " is UP" in _slurm(layout, ["scontrol", "ping"], timeout=10)
    except SandboxError:
        return False


def _base_state(state: str) -> str:
    return state.rstrip(_STATE_FLAGS).lower()


def _is_usable(state: str) -> bool:
    return not any(flag in state for flag in _STATE_FLAGS) and _base_state(state) in USABLE_STATES


def _wait_nodes_usable(layout: Layout, nodes: Sequence[str], deadline: float) -> list[str]:
    """Wait until each node is idle (or running jobs); resume nodes that answer but stay down."""
    actions: list[str] = []
    resumed: set[str] = set()
    seen_down_responding: dict[str, float] = {}
    last: dict[str, NodeStatus] = {}
    while True:
        try:
            last = node_states(layout.root)
        except SandboxError:
            last = {}
        if last and all(n in last and last[n].usable for n in nodes):
            return actions
        now = time.monotonic()
        for name in nodes:
            node = last.get(name)
            if node is None or name in resumed or "*" in node.state:
                continue
            base = _base_state(node.state)
            # ReturnToService=2 returns an answering DOWN node by itself within a ping or two;
            # resume only if it has not after a few seconds.  Drained nodes too (a hook that
            # failed in some test): the promise is a usable cluster, and the reason is kept
            # in the returned actions.
            if base in ("down", "drained", "draining", "drain", "fail", "failing") or \
                    base.startswith("drain"):
                first = seen_down_responding.setdefault(name, now)
                if now - first >= 5:
                    _slurm(layout, ["scontrol", "update", f"nodename={name}", "state=resume"])
                    resumed.add(name)
                    actions.append(f"resumed {name} (was {node.state}"
                                   + (f": {node.reason})" if node.reason else ")"))
        if now > deadline:
            states = ", ".join(f"{n}={last[n].state}" if n in last else f"{n}=?" for n in nodes)
            raise SandboxError(f"nodes not usable in time ({states}):\n"
                               + _logs_tail(layout, nodes))
        time.sleep(0.2)


def _wait(predicate: Any, deadline: float, what: str, layout: Layout,
          nodes: Sequence[str]) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            raise SandboxError(f"timed out waiting for {what}:\n" + _logs_tail(layout, nodes))
        time.sleep(0.1)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    if not text:
        return ""
    return f"--- {path} (last {len(text)} lines)\n" + "\n".join(text) + "\n"


def _logs_tail(layout: Layout, nodes: Sequence[str]) -> str:
    paths = [layout.munge_log, layout.slurmctld_log, *(layout.slurmd_log(n) for n in nodes)]
    return "".join(_tail(p) for p in paths) or f"(no logs yet in {layout.log_dir})"


# --------------------------------------------------------------------------------------------
# Setting up the machine and the folder


def _require_root(verb: str) -> None:
    if os.geteuid() != 0:
        raise SandboxError(f"`dispatch-sandbox {verb}` must run as root: the sandbox's "
                           f"daemons run as root; try: sudo dispatch-sandbox {verb}")


def _program(name: str, root: Optional[Path] = None) -> str:
    """The program's path on this machine, or inside ``root`` (as seen from within it)."""
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        candidate = os.path.join(folder, name)
        if os.access(f"{root}{candidate}" if root is not None else candidate, os.X_OK):
            return candidate
    return name if root is not None else shutil.which(name) or name


def _missing_programs() -> list[str]:
    return [p for p in SLURM_PROGRAMS if not os.path.isabs(_program(p))]


def _venv_missing() -> bool:
    try:
        proc = subprocess.run([SYSTEM_PYTHON, "-c", "import venv, ensurepip"],
                              capture_output=True, timeout=30)
    except OSError:
        return True
    return proc.returncode != 0


def _ensure_packages(layout: Layout) -> list[str]:
    """apt-get install Slurm, munge and python3-venv when missing (CI starts from a bare box)."""
    packages = list(APT_PACKAGES) if _missing_programs() else []
    if _venv_missing():
        packages.append("python3-venv")
    if not packages:
        return []
    _apt_install(layout, packages)
    still = _missing_programs()
    if still:
        raise SandboxError(f"after installing {' '.join(packages)}, still missing: "
                           + ", ".join(still))
    return [f"installed {' '.join(packages)}"]


def _apt_install(layout: Layout, packages: list[str]) -> None:
    log = layout.root / "apt.log"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        with _append(log) as out:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            raise SandboxError(f"{shlex.join(argv)} failed (exit {proc.returncode}):\n"
                               + _tail(log))


def build_root(release: str) -> tuple[Path, list[str]]:
    """The Debian root of ``release`` (see :mod:`sandbox_root`), built now when missing, as
    ``up`` would (debootstrap installed with apt-get when missing); its path and what was
    done.  For CI, to build (and time) it before the tests."""
    _require_root("build-root")
    chosen = sandbox_root.normalize(release)
    if chosen == HOST_RELEASE:
        raise SandboxError("the host's Slurm needs no Debian root: name a release of "
                           + ", ".join(sandbox_root.RELEASES))
    cache = sandbox_root.cache_folder()
    _claim(cache, create=True)
    return sandbox_root.ensure_root(
        sandbox_root.RELEASES[chosen], cache, lambda folder: _claim(folder, create=True),
        lambda packages: _apt_install(Layout(cache), packages))


def _ensure_munge_user(layout: Layout) -> list[str]:
    """A sandbox in a Debian root shares the host's accounts (sandbox_root binds /etc/passwd):
    its munged runs as the host's munge user, made by the host's munge package when missing."""
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        _apt_install(layout, ["munge"])
        return ["installed munge (for its user)"]
    return []


def _root_of(layout: Layout) -> Optional[Path]:
    """The Debian root this sandbox runs from (its manifest says), or None for the host's."""
    if not layout.manifest.exists():
        return None
    rootfs = _read_manifest(layout).get("rootfs")
    return Path(rootfs) if rootfs else None


def _wrap(layout: Layout, argv: Sequence[str], user: Optional[str] = None,
          cwd: Optional[str] = None, root: Optional[Path] = None) -> list[str]:
    """``argv`` as run against this sandbox: unchanged for the host's Slurm (``user`` and
    ``cwd`` are then the caller's to apply), entered into the Debian root otherwise."""
    root = root if root is not None else _root_of(layout)
    if root is None:
        return list(argv)
    return sandbox_root.enter_argv(root, layout.root, argv, user=user, cwd=cwd)


def command(argv: Sequence[str], directory: Optional[PathLike] = None,
            user: Optional[str] = None, cwd: Optional[PathLike] = None) -> list[str]:
    """The command line that runs ``argv`` on the sandbox's side, as ``user`` in ``cwd``.

    For the host's Slurm: ``runuser -u USER -- env -C CWD ARGV`` (or less).  For a sandbox
    in a Debian root, the same inside that root (see :mod:`sandbox_root`); then it must be
    run as root.  Run it with the variables of :func:`environment`.
    """
    layout = Layout(state_dir(directory))
    where = os.fspath(cwd) if cwd is not None else None
    root = _root_of(layout)
    if root is not None:
        return sandbox_root.enter_argv(root, layout.root, argv, user=user, cwd=where)
    prefix = ["runuser", "-u", user, "--"] if user is not None else []
    if where is not None:
        prefix += ["env", "-C", where]
    return [*prefix, *argv]


def home_of(user: str) -> str:
    """``user``'s home folder (where `exec --user` runs by default)."""
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        raise SandboxError(f"no user {user!r} on this machine") from None


def _make_folders(layout: Layout) -> None:
    """The folders of a claimed state folder, each root's (munge/ the munge user's)."""
    for folder in (layout.root, layout.etc, layout.state_save, layout.spool, layout.log_dir,
                   layout.run_dir):
        _own_folder(folder)
    munge = pwd.getpwnam(MUNGE_USER)
    _own_folder(layout.munge_dir, munge.pw_uid, munge.pw_gid)


# --------------------------------------------------------------------------------------------
# A state folder no other user can plant anything in


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on links followed in one path


def claim_state_folder(directory: Optional[PathLike] = None) -> Path:
    """Make sure root may write into the sandbox's state folder; return the folder.

    Every folder from ``/`` down is opened relative to the one before (``O_NOFOLLOW``) and
    checked on the open descriptor: it must be root's and not writable by group or others,
    except that a folder above the state folder may be sticky (``/var/tmp``: others may add
    names there but not move root's).  A symlink on the way must be root's; its target is
    walked the same way.  A missing folder is made by root with ``mkdir`` (exclusive: one
    that appears meanwhile is checked like any other).  Raises :class:`SandboxError` naming
    the folder and its owner otherwise, before anything is written.
    """
    path = state_dir(directory)
    _claim(path, create=True)
    return path


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _refuse(folder: Path, problem: str) -> SandboxError:
    return SandboxError(
        f"{problem}: another user could plant links or programs there that root would write "
        f"through or run; refusing to use {folder} as the sandbox folder (remove it, or choose "
        f"another with --dir or ${DIR_ENV})")


def _check_folder(fd: int, where: str, folder: Path, last: bool) -> None:
    st = os.fstat(fd)
    what = f"sandbox folder {where}" if last else f"folder {where} above the sandbox folder"
    if st.st_uid != 0:
        raise _refuse(folder, f"{what} is owned by {_owner(st.st_uid)}, not root")
    if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
        raise _refuse(folder, f"{what} is writable by others (mode "
                              f"{stat.S_IMODE(st.st_mode):o})")


def _claim(folder: Path, create: bool) -> bool:
    """Walk ``folder`` (absolute) as :func:`claim_state_folder` says; False when it is missing
    and ``create`` is false."""
    todo = list(folder.parts[1:])
    fd = os.open("/", _DIR_FLAGS)
    where = "/"
    links = 0
    try:
        _check_folder(fd, where, folder, last=not todo)
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            made = False
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    return False
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            here = os.path.join(where, name)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0:
                    raise _refuse(folder, f"{here} is a symlink owned by {_owner(st.st_uid)}")
                links += 1
                if links > _MAX_LINKS:
                    raise _refuse(folder, f"{here}: too many symlinks on the way")
                target = os.readlink(name, dir_fd=fd)
                todo = list(Path(target).parts) + todo
                if target.startswith("/"):
                    todo.pop(0)
                    os.close(fd)
                    fd, where = os.open("/", _DIR_FLAGS), "/"
                continue
            try:
                opened = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _refuse(folder, f"{here} is not a folder ({exc.strerror})") from None
            os.close(fd)
            fd, where = opened, os.path.normpath(here)
            if not stat.S_ISDIR(st.st_mode):  # replaced between stat and open
                raise _refuse(folder, f"{here} changed while it was checked")
            if made:
                os.fchmod(fd, 0o755)  # whatever root's umask: jobs read the config below
            _check_folder(fd, where, folder, last=not todo)
    finally:
        os.close(fd)
    return True


def _own_folder(path: Path, uid: int = 0, gid: int = 0, mode: int = 0o755) -> None:
    """Make ``path`` (whose parent is ours) a folder of ``uid``, mode ``mode``, or refuse one
    that someone else made.  World-traversable: jobs run as another user and read the config
    and the venv; munged refuses a socket folder that others can write to."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        raise SandboxError(f"{path} is a symlink or not a folder ({exc.strerror}); refusing to "
                           "write into it as root: remove it and run `dispatch-sandbox up` "
                           "again") from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (0, uid) or st.st_mode & 0o022:
            raise SandboxError(
                f"{path} is owned by {_owner(st.st_uid)} with mode "
                f"{stat.S_IMODE(st.st_mode):o}, not root's and closed to others: another user "
                "could have planted links there; refusing to write into it as root (remove it "
                "and run `dispatch-sandbox up` again)")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _append(path: Path) -> Any:
    """``path`` opened for appending bytes, never through a symlink."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644), "ab")


def _read_own(path: Path) -> Optional[str]:
    """The text of the regular file ``path``, or None when it is missing or a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode(errors="replace")


@contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    fd = os.open(layout.lock_file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _ensure_user(user: str) -> list[str]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        entry = None
    if entry is None:
        proc = subprocess.run(["useradd", "-m", "-s", "/bin/bash", user], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise SandboxError(f"useradd -m {user} failed: {(proc.stderr + proc.stdout).strip()}")
        return [f"created user {user}"]
    home = Path(entry.pw_dir)
    if not home.is_dir():
        home.mkdir(parents=True, mode=0o755)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        return [f"created home {home} of {user}"]
    return []


def _ensure_munge_key(layout: Layout) -> list[str]:
    if layout.munge_key.exists():
        return []
    munge = pwd.getpwnam(MUNGE_USER)
    fd = os.open(layout.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o400)
    try:
        os.write(fd, os.urandom(1024))
        os.fchown(fd, munge.pw_uid, munge.pw_gid)
    finally:
        os.close(fd)
    return [f"created munge key {layout.munge_key}"]


def _write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` by a file holding ``text``: written under a fresh name (mkstemp:
    O_EXCL|O_NOFOLLOW) in the same folder, then renamed over it; a symlink in place of either
    is replaced, never written through."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` unless it holds it already (a symlink never does)."""
    if _read_own(path) == text:
        return False
    _write_text(path, text, mode)
    return True


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise SandboxError(f"${name}={raw!r} is not a whole number of seconds")
    return int(raw)


def _write_config(layout: Layout, nodes: Sequence[str],
                  release: str = HOST_RELEASE) -> list[str]:
    """Write the config files that differ; return the names of those written."""
    hostname = socket.gethostname().split(".")[0]
    wanted = {
        layout.slurm_conf: render_slurm_conf(
            layout, nodes, hostname, release,
            cluster=os.environ.get(CLUSTER_ENV) or CLUSTER_NAME,
            min_job_age=_env_int(MIN_JOB_AGE_ENV, MIN_JOB_AGE)),
        layout.site_conf: render_site_conf(layout),
        layout.plugstack_conf: "# No SPANK plugins in the sandbox.\n",
    }
    if release != HOST_RELEASE:
        # 24.11's slurmd refuses to start without a cgroup plugin unless told there is none.
        wanted[layout.etc / "cgroup.conf"] = (
            "# cgroup.conf of the slurm-dispatch sandbox: plain processes, no cgroups.\n"
            "CgroupPlugin=disabled\n")
    return [path.name for path, text in wanted.items() if _write_if_changed(path, text)]


def _source_files(repo: Path) -> list[Path]:
    files = [repo / name for name in ("pyproject.toml", "README.md", "setup.cfg", "setup.py",
                                      "MANIFEST.in", "LICENSE")
             if (repo / name).is_file()]
    package = repo / "slurm_dispatch"
    files += sorted(p for p in package.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def _ensure_venv(layout: Layout, repo: Path, root: Optional[Path] = None) -> list[str]:
    """Install ``repo`` into ``<state>/venv`` unless the same source is installed already.

    With ``root`` the venv is made by, and runs on, that Debian root's Python (its path is
    the same inside: sandbox_root binds the state folder), and pip runs inside it."""
    if not (repo / "pyproject.toml").is_file():
        raise SandboxError(f"{repo} is not a slurm-dispatch checkout (no pyproject.toml)")
    digest = source_digest(repo)
    python = layout.venv_bin / "python"
    works = (python.exists() or python.is_symlink()) and subprocess.run(
        _wrap(layout, [str(python), "-c", ""], root=root), capture_output=True,
        env=_pip_env(root)).returncode == 0
    try:
        installed = layout.source_hash_file.read_text().strip()
    except OSError:
        installed = ""
    if works and installed == digest:
        return []
    actions = []
    log = layout.log_dir / "venv.log"
    if not works:
        shutil.rmtree(layout.venv, ignore_errors=True)
        _logged_run(_wrap(layout, [SYSTEM_PYTHON, "-m", "venv", str(layout.venv)], root=root),
                    log, "creating the venv", env=_pip_env(root))
        actions.append(f"created {layout.venv}")
    # Build from a copy: an in-tree build would write build/ and *.egg-info into the checkout,
    # and a non-editable install keeps working when the checkout is not readable by the job user.
    with tempfile.TemporaryDirectory(dir=layout.root, prefix="build-") as scratch:
        copy = Path(scratch) / "src"
        for path in _source_files(repo):
            target = copy / path.relative_to(repo)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        if not (copy / "README.md").exists():
            (copy / "README.md").write_text("slurm-dispatch\n")
        layout.source_hash_file.unlink(missing_ok=True)
        # pip always reinstalls a project given as a folder; dependencies only when missing.
        _logged_run(_wrap(layout, [str(python), "-m", "pip", "install",
                                   "--disable-pip-version-check", "--no-input", "--quiet",
                                   str(copy)], root=root),
                    log, f"installing {repo} into the venv", env=_pip_env(root))
    _write_text(layout.source_hash_file, digest + "\n")
    actions.append(f"installed {repo} into {layout.venv}")
    return actions


def _pip_env(root: Optional[Path]) -> Optional[dict[str, str]]:
    """The environment of pip: ours on the host; inside a Debian root without this machine's
    pip settings (they name files of the host, such as local wheels), trusting what this
    machine trusts (its certificate store is bound inside)."""
    if root is None:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    if os.path.isfile(sandbox_root.CA_BUNDLE):
        env["PIP_CERT"] = sandbox_root.CA_BUNDLE
    return env


def _logged_run(argv: list[str], log: Path, what: str,
                env: Optional[dict[str, str]] = None) -> None:
    with _append(log) as out:
        out.write(f"--- {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, umask=0o022, env=env)
    if proc.returncode != 0:
        raise SandboxError(f"{what} failed (exit {proc.returncode}):\n" + _tail(log, 30))


def _read_manifest(layout: Layout) -> dict[str, Any]:
    try:
        data = json.loads(layout.manifest.read_text())
    except (OSError, ValueError) as exc:
        raise SandboxError(f"cannot read {layout.manifest}: {exc}") from exc
    if not isinstance(data, dict):
        raise SandboxError(f"{layout.manifest} is not a JSON object")
    return data


def _known_node(layout: Layout, node: str) -> str:
    if not layout.manifest.exists():
        raise SandboxError(f"no sandbox in {layout.root}: run `dispatch-sandbox up` first")
    nodes = list(_read_manifest(layout).get("nodes", []))
    if node not in nodes:
        raise SandboxError(f"unknown node {node!r}: valid nodes are {', '.join(nodes)}")
    return node

