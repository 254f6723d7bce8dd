"""The sandbox: a real multi-node Slurm cluster on one machine, for the demo and the real tests.

It runs Debian's own daemons on this machine: one ``munged`` (as the munge user, with its own key
and socket), one ``slurmctld`` and one ``slurmd -N nX`` per node, each node in its own network
namespace on a bridge of the sandbox's (:mod:`.network`), all as root, configured for speed
(short credential lifetime, short timeouts, a scheduler that starts jobs within a second).  Jobs
run as an unprivileged user (``dispatchuser``) from a virtualenv under the state folder that this
repository is installed into, because the developer's own interpreter is usually unreachable for
that user.

Another Slurm release (``up(slurm="24.11")``, :data:`sandbox_root.RELEASES`) runs the same
daemons, the same configuration and a venv on the root's own Python from a Debian root built
once with debootstrap (:mod:`slurm_dispatch.sandbox.root`); every command that talks to that
cluster, the sandbox's own included, enters the root (:mod:`~slurm_dispatch.sandbox.clients`).
A state folder keeps the release it was made with (its manifest says which, and where the root
is).

Role: the verbs (``up``, ``down``, ``remove_sandbox``, ``status``, ``partition``, ``heal``, the
controller's outage, ``JobRequeue``, ``build_root``) and what they report; each is a short
sequence of the steps the other modules of this package own: :mod:`.layout` (where things live),
:mod:`.state_folder` (root's writes there), :mod:`.machine` (packages and accounts),
:mod:`.install` (the venv), :mod:`.slurm_conf` (the configuration), :mod:`.daemons` and
:mod:`.nodes`.

Invariant: everything the sandbox writes or starts lives under its state folder (configuration,
munge key, socket, pid files, logs, spool, state, venv), the Debian root of another release
under its cache folder.  It never reads or writes ``/etc/slurm`` or ``/etc/munge``, never changes
the host's mount table, and never signals a process unless the pid came from one of its own pid
files *and* that process's command line names its own configuration.  Every root verb claims
the state folder (:func:`.state_folder.claim`) before it writes there.  The library never
prints: it returns values and raises :class:`~slurm_dispatch.errors.SandboxError`.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import SandboxError
from . import accounting as accounting_lib
from . import daemons, network, slots, state_folder
from . import root as sandbox_root
from .clients import run_slurm
from .install import ensure_venv, source_root
from .layout import (
    DEFAULT_NODE_COUNT,
    DEFAULT_USER,
    DIR_ENV,
    HOST_RELEASE,
    MUNGE_USER,
    RELEASE_ENV,
    Layout,
    PathLike,
    default_dir,
    job_user,
    known_node,
    node_names,
    read_manifest,
    state_dir,
)
from .machine import (
    apt_install,
    ensure_database_server,
    ensure_munge_user,
    ensure_packages,
    ensure_user,
    require_root,
)
from .nodes import NodeStatus, down_since, is_usable, node_states, wait_until_usable
from .slurm_conf import MESSAGE_TIMEOUT, write_config


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
    # Nodes cut off by `partition` (their network down, or their slurmd stopped).
    partitioned: list[str] = field(default_factory=list)
    # "slurmdbd" (its own database server) or "none" (:mod:`.accounting`).
    accounting: str = accounting_lib.NONE

    @property
    def running(self) -> bool:
        """Every daemon alive and answering, every node usable."""
        return (
            bool(self.daemons)
            and all(d.alive and not d.stopped for d in self.daemons)
            and bool(self.nodes)
            and all(n.usable for n in self.nodes)
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["running"] = self.running
        for node in data["nodes"]:
            node["usable"] = is_usable(node["state"])
        return data


@dataclass
class UpReport:
    """What ``up`` did (``actions`` is empty when nothing needed doing) and the result."""

    status: SandboxStatus
    actions: list[str]
    seconds: float
    # Nodes left partitioned (cut off by `partition`), not waited for.
    partitioned: list[str] = field(default_factory=list)


def up(
    directory: Optional[PathLike] = None,
    nodes: Optional[int] = None,
    user: Optional[str] = None,
    source: Optional[PathLike] = None,
    timeout: float = 120.0,
    slurm: Optional[str] = None,
) -> UpReport:
    """Start the sandbox, or make a running one whole; return when every node is usable.

    Usable means idle, or running jobs (``mixed``/``allocated``) that someone left running.
    Idempotent: with everything already running as configured it changes nothing; a node that
    :func:`partition` cut off stays cut off (listed in ``partitioned``, not waited for), since
    undoing someone's deliberate partition is :func:`heal`'s job.

    ``nodes`` defaults to the running sandbox's count, else 3.  ``user`` (the job user, created
    when missing; never root) defaults to ``$DISPATCH_SANDBOX_USER``, else the folder's, else
    ``dispatchuser`` (:func:`.layout.job_user`).  ``source`` is the repository to
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
    require_root("up")
    layout, release = _claim_folder(directory, slurm)
    actions: list[str] = []
    root, keeps = _prepare_machine(layout, release, actions)
    _make_folders(layout)
    with state_folder.locked(layout.lock_file):
        old_nodes, wanted, changed = _prepare_folder(
            layout, release, root, nodes, user, source, keeps, actions
        )
        partitioned = _start_daemons(
            layout, old_nodes, wanted, changed, keeps, time.monotonic() + timeout, actions
        )
    return UpReport(
        status=status(layout.root),
        actions=actions,
        seconds=round(time.monotonic() - started, 2),
        partitioned=partitioned,
    )


def _claim_folder(directory: Optional[PathLike], slurm: Optional[str]) -> tuple[Layout, str]:
    """``up``'s folder, claimed, and the release it runs: the one asked for, else the
    folder's; a folder made with another release is refused, naming both."""
    wanted_release = slurm if slurm is not None else os.environ.get(RELEASE_ENV)
    if directory is None or directory == "":
        directory = os.environ.get(DIR_ENV) or default_dir(wanted_release)
    layout = Layout(state_dir(directory))
    state_folder.claim(layout.root, create=True)
    old_manifest = read_manifest(layout) if layout.manifest.exists() else {}
    release = sandbox_root.normalize(
        wanted_release if wanted_release is not None else old_manifest.get("slurm", HOST_RELEASE)
    )
    if old_manifest and old_manifest.get("slurm", HOST_RELEASE) != release:
        raise SandboxError(
            f"the sandbox in {layout.root} runs Slurm "
            f"{old_manifest.get('slurm', HOST_RELEASE)}, not {release}: its state cannot change "
            f"release; choose another folder (--dir) or remove {layout.root}"
        )
    return layout, release


def _make_folders(layout: Layout) -> None:
    """The folders of a claimed state folder, each root's (munge/ the munge user's)."""
    for folder in (
        layout.root,
        layout.etc,
        layout.state_save,
        layout.spool,
        layout.log_dir,
        layout.run_dir,
    ):
        state_folder.own_folder(folder)
    munge = pwd.getpwnam(MUNGE_USER)
    state_folder.own_folder(layout.munge_dir, munge.pw_uid, munge.pw_gid)


def _prepare_machine(
    layout: Layout, release: str, actions: list[str]
) -> tuple[Optional[Path], str]:
    """What the release needs on this machine: Debian's Slurm and munge for the host's, the
    munge user and the Debian root (built when missing) for another, and MariaDB's server
    (and the host's slurmdbd) where the sandbox keeps accounting; that root (or None) and
    the accounting it keeps (:func:`.accounting.wanted`).  What it did is appended to
    ``actions`` (so are the other steps' of ``up``)."""
    if release == HOST_RELEASE:
        keeps = accounting_lib.wanted(None)
        actions += ensure_packages(layout, accounting=keeps == accounting_lib.SLURMDBD)
        return None, keeps
    actions += ensure_munge_user(layout)
    root, built = sandbox_root.ensure_root(
        sandbox_root.RELEASES[release],
        sandbox_root.cache_folder(),
        lambda folder: state_folder.claim(folder, create=True),
        lambda packages: apt_install(layout, packages),
    )
    actions += built
    point = sandbox_root.mount_point(root, layout.root)
    if point is not None:
        state_folder.claim(point, create=True)
    keeps = accounting_lib.wanted(root)
    if keeps == accounting_lib.SLURMDBD:
        actions += ensure_database_server(layout)
    return root, keeps


def _prepare_folder(
    layout: Layout,
    release: str,
    root: Optional[Path],
    nodes: Optional[int],
    user: Optional[str],
    source: Optional[PathLike],
    keeps: str,
    actions: list[str],
) -> tuple[list[str], list[str], list[str]]:
    """Under the lock: the job user, the venv, the munge key, the accounting database, the
    configuration and the manifest, each made or changed only when it differs.  Returns the
    nodes the manifest named before, the nodes wanted now, and the configuration files
    changed."""
    manifest = read_manifest(layout) if layout.manifest.exists() else {}
    old_nodes: list[str] = list(manifest.get("nodes", []))
    count = nodes if nodes is not None else (len(old_nodes) or DEFAULT_NODE_COUNT)
    wanted = node_names(count)
    user = job_user(user, manifest)
    for node in wanted:
        state_folder.own_folder(layout.spool / node)
    actions += slots.take(layout)
    actions += network.ensure(layout, wanted)
    actions += ensure_user(user)
    repo = Path(source) if source is not None else source_root()
    if repo is not None:
        actions += ensure_venv(layout, repo, root)
    elif not (layout.venv_bin / "python").exists():
        raise SandboxError(
            f"no venv in {layout.venv} and no source checkout to install from: run "
            "`dispatch-sandbox up` from a checkout (bin/dispatch-sandbox) once"
        )
    actions += daemons.ensure_munge_key(layout)
    major = sandbox_root.held(root) if root is not None else sandbox_root.host_release()
    if keeps == accounting_lib.SLURMDBD:
        actions += accounting_lib.ensure_database(layout)
        changed = accounting_lib.ensure_certificate(layout, major)
        if changed:
            # A running server speaks TLS as it started: start it again with what is now.
            actions += changed + daemons.stop(daemons.mariadbd(layout))
    changed = write_config(layout, wanted, release, major, keeps)
    if changed:
        actions.append("wrote " + ", ".join(changed))
    new_manifest: dict[str, Any] = {"nodes": wanted, "user": user, "accounting": keeps}
    if root is not None:
        new_manifest.update(slurm=release, rootfs=str(root))
    if manifest != new_manifest:
        state_folder.write_text(layout.manifest, json.dumps(new_manifest, indent=2) + "\n")
    return old_nodes, wanted, changed


def _start_daemons(
    layout: Layout,
    old_nodes: list[str],
    wanted: list[str],
    changed_files: list[str],
    keeps: str,
    deadline: float,
    actions: list[str],
) -> list[str]:
    """munged, then (with accounting, ``keeps``) the database server and slurmdbd, then
    slurmctld, then a slurmd per wanted node, each started unless running (slurmctld and the
    slurmds restarted when slurm.conf or what it includes changed, slurmdbd when its own file
    did; the slurmds of nodes no longer wanted stopped, and slurmdbd and its server where
    accounting is off now), then wait until the nodes are usable.  Returns the nodes left
    partitioned."""
    munged = daemons.munged(layout)
    if not daemons.alive(munged):
        actions += daemons.start(munged, layout)
        daemons.wait_until(
            lambda: daemons.munge_works(layout), deadline, "munged to answer", layout, wanted
        )
    _start_accounting(layout, keeps, layout.slurmdbd_conf.name in changed_files, deadline, actions)
    changed = any(name != layout.slurmdbd_conf.name for name in changed_files)

    slurmds = {node: daemons.slurmd(layout, node) for node in sorted(set(wanted) | set(old_nodes))}
    slurmctld = daemons.slurmctld(layout)
    if changed:
        # Node lists and plugin settings are only read at start; restart what runs.
        # Running jobs survive: their slurmstepd processes do not depend on slurmd.
        for daemon in [*slurmds.values(), slurmctld]:
            actions += daemons.stop(daemon)
    for node in set(old_nodes) - set(wanted):
        actions += daemons.stop(slurmds[node])
    for node in wanted:
        pid = daemons.live_pid(slurmds[node])
        if pid is not None and not network.in_netns(pid, layout, node):
            # Started before its node had a namespace (an older sandbox), or in one that a
            # crash left behind: restart it in its own.
            actions += daemons.stop(slurmds[node])
    if not daemons.alive(slurmctld):
        actions += daemons.start(slurmctld, layout)
        daemons.wait_until(
            lambda: daemons.controller_answers(layout),
            deadline,
            "slurmctld to answer",
            layout,
            wanted,
        )
    partitioned = []
    for node in wanted:
        daemon = slurmds[node]
        if not daemons.alive(daemon):
            actions += daemons.start(daemon, layout)
        if network.is_cut(layout, node) or daemons.is_stopped(daemons.live_pid(daemon)):
            # Someone's deliberate partition (perhaps a test still running): not ours to
            # undo; `heal` does that.
            partitioned.append(node)
    actions += wait_until_usable(layout, [n for n in wanted if n not in partitioned], deadline)
    return partitioned


def _start_accounting(
    layout: Layout, keeps: str, changed: bool, deadline: float, actions: list[str]
) -> None:
    """The database server, then slurmdbd (restarted when its file ``changed``), each waited
    for until it answers; both stopped where the sandbox keeps no accounting (now)."""
    server, dbd = daemons.mariadbd(layout), daemons.slurmdbd(layout)
    if keeps != accounting_lib.SLURMDBD:
        actions += daemons.stop(dbd)
        actions += daemons.stop(server)
        return
    if not daemons.alive(server):
        actions += daemons.start(server, layout)
    daemons.wait_until(
        lambda: daemons.database_answers(layout),
        deadline,
        "the accounting database's server to answer",
        layout,
        [],
    )
    if changed:
        actions += daemons.stop(dbd)
    if not daemons.alive(dbd):
        actions += daemons.start(dbd, layout)
        daemons.wait_until(
            lambda: daemons.dbd_answers(layout), deadline, "slurmdbd to answer", layout, []
        )


def _accounting_daemons(layout: Layout, manifest: dict[str, Any]) -> list[daemons.Daemon]:
    """slurmdbd and its server, where the folder's manifest says it keeps accounting."""
    if manifest.get("accounting") != accounting_lib.SLURMDBD:
        return []
    return [daemons.mariadbd(layout), daemons.slurmdbd(layout)]


def down(directory: Optional[PathLike] = None, timeout: float = 30.0) -> list[str]:
    """Stop the daemons this sandbox started (slurmds, slurmctld, munged), remove its network
    (namespaces, veths, bridge; not when its port slot is another folder's); keep every file.

    Only pids from the sandbox's pid files whose command line names the sandbox are signalled.
    Job processes (slurmstepd and its children) are left alone, as a dead node would leave them.
    Returns what it did.
    """
    require_root("down")
    layout = Layout(state_dir(directory))
    if not state_folder.claim(layout.root, create=False):
        return []
    actions: list[str] = []
    with state_folder.locked(layout.lock_file):
        slurmd_nodes = sorted(
            p.name[len("slurmd-") : -len(".pid")] for p in layout.run_dir.glob("slurmd-*.pid")
        )
        for node in slurmd_nodes:
            actions += daemons.stop(daemons.slurmd(layout, node), timeout)
        actions += daemons.stop(daemons.slurmctld(layout), timeout)
        # Whatever the manifest says now: a server started before accounting was turned off.
        actions += daemons.stop(daemons.slurmdbd(layout), timeout)
        actions += daemons.stop(daemons.mariadbd(layout), timeout)
        actions += daemons.stop(daemons.munged(layout), timeout)
        manifest = read_manifest(layout) if layout.manifest.exists() else {}
        if slots.holder(layout.port_slot) in (None, layout.root):  # never another's network
            actions += network.remove(
                layout, sorted(set(slurmd_nodes) | set(manifest.get("nodes", [])))
            )
    return actions


def remove_sandbox(
    directory: Optional[PathLike] = None, timeout: float = 30.0
) -> tuple[list[str], Optional[str]]:
    """Stop the sandbox (as :func:`down`) and remove what ``up`` made for its folder: the
    network, the port slot's claim, the mount point in its Debian root, and the folder.

    Refuses, before anything is stopped or removed, a folder that is not a sandbox's (no
    manifest, and no port slot of this machine names it), one that is a symlink, one another
    user could write to (:func:`.state_folder.claim`) and one with a mount in it.  The job
    user and a release's Debian root stay (other sandboxes may use them).  Returns what it did
    and the job user (None when the folder was already gone).
    """
    require_root("remove")
    layout = Layout(state_dir(directory))
    if not os.path.lexists(layout.root):
        return [], None
    manifest = _sandbox_manifest(layout)
    actions = down(layout.root, timeout)
    actions += slots.release(layout)
    rootfs = manifest.get("rootfs")
    point = sandbox_root.mount_point(Path(rootfs), layout.root) if rootfs else None
    if point is not None and point.is_dir() and not point.is_symlink() and not any(point.iterdir()):
        point.rmdir()
        actions.append(f"removed mount point {point}")
    with state_folder.locked(layout.lock_file):
        actions.append(state_folder.delete_folder(layout.root))
    return actions, str(manifest.get("user", DEFAULT_USER))


def _sandbox_manifest(layout: Layout) -> dict[str, Any]:
    """The manifest of the sandbox in ``layout`` ({} for a folder whose first ``up`` stopped
    before writing it, but whose port slot this machine records); raises for a folder that
    is not a sandbox's, or may not be removed as one."""
    if layout.root.is_symlink():
        raise SandboxError(
            f"{layout.root} is a symlink (to {os.readlink(layout.root)}), not a "
            "sandbox folder: nothing was removed (remove the link itself with rm, "
            "or name the folder it points to)"
        )
    if not layout.root.is_dir():
        raise SandboxError(f"{layout.root} is not a folder: nothing was removed")
    state_folder.claim(layout.root, create=False)
    text = state_folder.read_own(layout.manifest)
    try:
        manifest = json.loads(text) if text is not None else None
    except ValueError:
        manifest = None
    if isinstance(manifest, dict) and isinstance(manifest.get("nodes"), list):
        return manifest
    slot = layout.recorded_slot()
    if slot is not None and slots.holder(slot) == layout.root:
        return {}
    raise SandboxError(
        f"{layout.root} is not a sandbox folder (no {layout.manifest.name} that "
        "`dispatch-sandbox up` writes, and no port slot of this machine names "
        "it): nothing was removed"
    )


def status(directory: Optional[PathLike] = None) -> SandboxStatus:
    """Daemons (pid, alive, stopped), nodes and their states, and the folder.  Needs no root."""
    layout = Layout(state_dir(directory))
    manifest = read_manifest(layout) if layout.manifest.exists() else {}
    nodes: list[str] = list(manifest.get("nodes", []))
    report = SandboxStatus(
        dir=str(layout.root),
        slurm_conf=str(layout.slurm_conf),
        user=str(manifest.get("user", DEFAULT_USER)),
        venv_bin=str(layout.venv_bin),
        slurm=str(manifest.get("slurm", HOST_RELEASE)),
        rootfs=str(manifest.get("rootfs", "")),
        accounting=str(manifest.get("accounting", accounting_lib.NONE)),
    )
    if not manifest:
        report.controller_error = f"no sandbox in {layout.root} (run `dispatch-sandbox up`)"
        return report
    for daemon in [
        daemons.munged(layout),
        *_accounting_daemons(layout, manifest),
        daemons.slurmctld(layout),
        *(daemons.slurmd(layout, n) for n in nodes),
    ]:
        pid = daemons.live_pid(daemon)
        report.daemons.append(
            DaemonStatus(
                name=daemon.name,
                pid=pid,
                alive=pid is not None,
                stopped=pid is not None and daemons.is_stopped(pid),
                pid_file=str(daemon.pid_file),
                log=str(daemon.log),
            )
        )
        if daemon.node is not None and (
            network.is_cut(layout, daemon.node) or report.daemons[-1].stopped
        ):
            report.partitioned.append(daemon.node)
    try:
        states = node_states(layout.root)
    except SandboxError as exc:
        report.controller_error = str(exc)
    else:
        report.nodes = [states.get(n, NodeStatus(n, "absent")) for n in nodes]
    return report


def partition(node: str, directory: Optional[PathLike] = None) -> int:
    """Cut ``node`` off the network: everything it sends or receives is lost (its veth down).

    slurmd, slurmstepd and the job's own processes keep running and keep their file system,
    but none of them reaches the controller or another node.  Slurm marks the node DOWN
    (not responding) after ``SlurmdTimeout`` and requeues its batch jobs elsewhere; the job on
    the cut node cannot report its end.  Returns the pid of the node's slurmd.
    """
    require_root("partition")
    layout = Layout(state_dir(directory))
    state_folder.claim(layout.root, create=False)
    name = known_node(layout, node)
    pid = daemons.checked_pid(daemons.slurmd(layout, name))
    if not network.in_netns(pid, layout, name):
        raise SandboxError(
            f"slurmd {name} (pid {pid}) does not run in its network namespace "
            f"{network.net_of(layout).netns(name)}: run `dispatch-sandbox up`"
        )
    network.cut(layout, name)
    return pid


def heal(
    node: str,
    directory: Optional[PathLike] = None,
    timeout: float = 60.0,
    wait: bool = True,
    register: bool = True,
) -> list[str]:
    """Undo :func:`partition`: reconnect the node and (with ``wait``) wait until it is usable.

    A slurmd found stopped (SIGSTOP, as an older sandbox's ``partition`` left it) is
    continued too.  The rejoining slurmd handles what queued up while it was silent: the
    controller's order to kill the job that was requeued away from it (then the Epilog runs
    for it).  With ``register`` it also gets SIGHUP, which makes it re-register at once;
    without, the node waits for the controller's next look at DOWN nodes (about 40 s here).
    A job the node's failure ended (NODE_FAIL, a ``--no-requeue`` job) is killed when the
    registration reports it, unless that comes less than ``MessageTimeout`` after the job's
    end: the controller takes it for a race ("newly completed") and leaves it running until
    its next registration request (28 s later on 22.05, over 60 s on 24.11).  So with
    ``register`` and ``wait``, a node whose first registration may have fallen in that window
    gets SIGHUP again once the window has passed (a wait of up to ``MessageTimeout`` + 1 s).
    ``ReturnToService=2`` then brings the node back; if it answers but stays DOWN or drained
    (say, a failed Epilog of the killed job), heal resumes it and says why it was down.
    Returns what it did.
    """
    require_root("heal")
    layout = Layout(state_dir(directory))
    state_folder.claim(layout.root, create=False)
    name = known_node(layout, node)
    daemon = daemons.slurmd(layout, name)
    actions: list[str] = []
    pid = daemons.live_pid(daemon)
    went_down = down_since(layout, name)
    reconnected = network.restore(layout, name)
    if reconnected:
        actions.append(f"reconnected {name}")
    if pid is None:
        actions += daemons.start(daemon, layout)
    elif daemons.is_stopped(pid):
        os.kill(pid, signal.SIGCONT)
        actions.append(f"continued slurmd {name}")
    registered = register and pid is not None and bool(actions)
    if registered and pid is not None:
        os.kill(pid, signal.SIGHUP)
    window_ends = (went_down + MESSAGE_TIMEOUT + 1) if went_down is not None else None
    if wait and registered and window_ends is not None and time.time() < window_ends:
        registered_again = _register_past(layout, daemon, name, window_ends, timeout)
        if registered_again:
            actions.append(registered_again)
    if wait:
        actions += wait_until_usable(layout, [name], time.monotonic() + timeout)
    return actions


def _register_past(
    layout: Layout, daemon: daemons.Daemon, name: str, moment: float, timeout: float
) -> str:
    """Once node ``name`` is usable (its first registration came), wait until the epoch time
    ``moment`` and make its slurmd (``daemon``) register again; what it did ("" if nothing)."""
    wait_until_usable(layout, [name], time.monotonic() + timeout)
    time.sleep(max(0.0, moment - time.time()))
    pid = daemons.live_pid(daemon)
    if pid is None:
        return ""
    os.kill(pid, signal.SIGHUP)
    return (
        f"registered {name} again past MessageTimeout after it went down (the jobs its "
        "failure ended are killed now)"
    )


def stop_controller(directory: Optional[PathLike] = None) -> list[str]:
    """Stop slurmctld alone (a controller outage: every client call fails until
    :func:`start_controller`); the nodes and their jobs go on.  Returns what it did."""
    require_root("stop the controller")
    layout = Layout(state_dir(directory))
    state_folder.claim(layout.root, create=False)
    with state_folder.locked(layout.lock_file):
        return daemons.stop(daemons.slurmctld(layout))


def start_controller(directory: Optional[PathLike] = None, timeout: float = 60.0) -> list[str]:
    """Start slurmctld again after :func:`stop_controller` (it reads its saved state) and wait
    until it answers.  Returns what it did."""
    require_root("start the controller")
    layout = Layout(state_dir(directory))
    state_folder.claim(layout.root, create=False)
    with state_folder.locked(layout.lock_file):
        daemon = daemons.slurmctld(layout)
        actions = [] if daemons.alive(daemon) else daemons.start(daemon, layout)
        daemons.wait_until(
            lambda: daemons.controller_answers(layout),
            time.monotonic() + timeout,
            "slurmctld to answer",
            layout,
            [],
        )
    return actions


def set_job_requeue(enabled: bool, directory: Optional[PathLike] = None) -> None:
    """Set ``JobRequeue`` (1: Slurm requeues batch jobs after a node failure; 0: such a job
    ends NODE_FAIL) and make slurmctld read it (``scontrol reconfigure``), for sites that do
    not requeue.  Jobs take the value at submission; the next ``up`` restores 1."""
    require_root("set JobRequeue")
    layout = Layout(state_dir(directory))
    state_folder.claim(layout.root, create=False)
    text = state_folder.read_own(layout.slurm_conf)
    if text is None or "\nJobRequeue=" not in text:
        raise SandboxError(
            f"{layout.slurm_conf} has no JobRequeue line: run `dispatch-sandbox up` first"
        )
    lines = [
        f"JobRequeue={1 if enabled else 0}" if line.startswith("JobRequeue=") else line
        for line in text.split("\n")
    ]
    state_folder.write_text(layout.slurm_conf, "\n".join(lines))
    run_slurm(layout, ["scontrol", "reconfigure"])


def build_root(release: str) -> tuple[Path, list[str]]:
    """The Debian root of ``release`` (see :mod:`sandbox_root`), built now when missing, as
    ``up`` would (debootstrap installed with apt-get when missing); its path and what was
    done.  For CI, to build (and time) it before the tests."""
    require_root("build-root")
    chosen = sandbox_root.normalize(release)
    if chosen == HOST_RELEASE:
        raise SandboxError(
            "the host's Slurm needs no Debian root: name a release of "
            + ", ".join(sandbox_root.RELEASES)
        )
    cache = sandbox_root.cache_folder()
    state_folder.claim(cache, create=True)
    return sandbox_root.ensure_root(
        sandbox_root.RELEASES[chosen],
        cache,
        lambda folder: state_folder.claim(folder, create=True),
        lambda packages: apt_install(Layout(cache), packages),
    )
