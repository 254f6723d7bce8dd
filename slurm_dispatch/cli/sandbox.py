"""``dispatch-sandbox``: the command line of the sandbox Slurm cluster.

Role: parse arguments, call the sandbox package (its verbs are
:mod:`slurm_dispatch.sandbox.cluster`'s), print.  Invariant: this is the only place of the
sandbox that prints or exits; every library error reaches the user once, as
``dispatch-sandbox: <message>`` with the error class's exit code (2 for sandbox errors), through
the shell of :mod:`slurm_dispatch.cli.shell`.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import click

from ..sandbox import clients as sandbox_clients
from ..sandbox import cluster as sandbox
from ..sandbox import layout as sandbox_layout
from ..sandbox import machine as sandbox_machine
from ..sandbox import root as sandbox_root
from .shell import ClickShell

PROG = "dispatch-sandbox"
F = TypeVar("F", bound=Callable[..., Any])


class _Shell(ClickShell, click.Group):
    prog = PROG


def _dir_option(func: F) -> F:
    """--dir and --slurm; the command gets ``directory`` (None when neither is given)."""
    func = click.option(
        "--slurm",
        "release",
        metavar="RELEASE",
        default=None,
        help=f"Slurm release: {sandbox_root.choices()}; "
        f"chooses the default folder (default: ${sandbox_layout.RELEASE_ENV}, else "
        "host).",
    )(func)
    return click.option(
        "--dir",
        "directory",
        metavar="DIR",
        default=None,
        help=f"State folder of the sandbox (default: ${sandbox_layout.DIR_ENV}, else "
        f"{sandbox_layout.DEFAULT_DIR} for the host's Slurm, "
        f"{sandbox_layout.DEFAULT_DIR}-RELEASE for another).",
    )(func)


def _folder(directory: Optional[str], release: Optional[str]) -> Optional[str]:
    """The folder a verb works on: --dir, else $DISPATCH_SANDBOX_DIR, else --slurm's default
    (None leaves it to the library: $DISPATCH_SANDBOX_SLURM's default)."""
    if directory is not None or release is None:
        return directory
    return os.environ.get(sandbox_layout.DIR_ENV) or str(sandbox_layout.default_dir(release))


@click.group(
    cls=_Shell, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="slurm-dispatch", prog_name=PROG)
def cli() -> None:
    """A real multi-node Slurm cluster on this machine, for demos and tests.

    It runs Debian's munged, slurmctld and one slurmd per node (n1, n2, n3) on loopback, with
    its own configuration, key, socket, logs and state in one folder; it never touches
    /etc/slurm, /etc/munge or a system Slurm.  Jobs run as an unprivileged user (dispatchuser,
    or `up --user`, $DISPATCH_SANDBOX_USER), with this repository installed in <state>/venv.

    \b
    Typical use (as root):
      dispatch-sandbox up
      eval "$(dispatch-sandbox env)"
      runuser -u "$DISPATCH_SANDBOX_USER" -- sbatch --wrap 'hostname'
      dispatch-sandbox status
      dispatch-sandbox down
      dispatch-sandbox remove     # its folder too, when done with it
    """


@cli.command()
@click.option(
    "--nodes",
    type=click.IntRange(1, sandbox_layout.MAX_NODE_COUNT),
    default=None,
    metavar="N",
    help="Number of nodes n1..nN (default: as running, else 3).",
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for every node to be idle.",
)
@click.option(
    "--user",
    metavar="USER",
    default=None,
    help=f"The job user, created when missing; never root (default: "
    f"${sandbox_layout.USER_ENV}, else the sandbox's, else "
    f"{sandbox_layout.DEFAULT_USER}).",
)
@_dir_option
def up(
    nodes: Optional[int],
    timeout: float,
    user: Optional[str],
    directory: Optional[str],
    release: Optional[str],
) -> None:
    """Start the sandbox (or repair it) and wait until every node is idle.

    Installs slurm-wlm and munge with apt-get when missing, creates the job user (--user), installs
    this checkout into <state>/venv (again only when its files changed), writes the
    configuration and starts the daemons that are not running.  Idempotent: a second `up`
    returns within a second and changes nothing (a partitioned node stays partitioned).  A
    changed configuration (for example another --nodes) restarts slurmctld and the slurmds;
    running jobs survive.

    With --slurm 24.11 the daemons, the Slurm tools, the venv (on Python 3.13) and the jobs
    run from a Debian 13 root that debootstrap builds once from Debian's packages (about 2
    minutes, kept in /var/cache/slurm-dispatch); reach it with `dispatch-sandbox exec`.

    \b
    Examples:
      dispatch-sandbox up
      dispatch-sandbox up --nodes 5
      dispatch-sandbox up --slurm 24.11
      DISPATCH_SANDBOX_DIR=/var/tmp/sb2 DISPATCH_SANDBOX_USER=alice dispatch-sandbox up

    Its last lines are commands to paste: they name the folder (--dir) unless it is the
    default one, and this command as it was run (bin/dispatch-sandbox from a clone).
    """
    report = sandbox.up(
        _folder(directory, release), nodes=nodes, timeout=timeout, slurm=release, user=user
    )
    for action in report.actions:
        click.echo(action)
    for node in report.partitioned:
        click.echo(f"{node} is partitioned: left so (undo with: {PROG} heal {node})")
    names = " ".join(n.name for n in report.status.nodes)
    verb = "up" if report.actions else "already up"
    slurm = (
        ""
        if report.status.slurm == sandbox_layout.HOST_RELEASE
        else f" on Slurm {report.status.slurm}"
    )
    click.echo(
        f"sandbox {verb} in {report.seconds:.1f} s: {len(report.status.nodes)} nodes "
        f"({names}){slurm} in {report.status.dir}"
    )
    for line in use_lines(
        invoked_as(sys.argv[0]), report.status.dir, report.status.user, bool(report.status.rootfs)
    ):
        click.echo(line)


def invoked_as(argv0: str) -> str:
    """This command as the user ran it, to be run again: ``dispatch-sandbox`` when that name
    on PATH is this very program, else the path it was run by (``bin/dispatch-sandbox`` from
    a clone, ``.venv/bin/dispatch-sandbox``), quoted; ``dispatch-sandbox`` when it ran under
    another name (``python -m``)."""
    if os.path.basename(argv0) != PROG:
        return PROG
    found = shutil.which(PROG)
    if found is not None and os.path.realpath(found) == os.path.realpath(argv0):
        return PROG
    return shlex.quote(argv0)


def use_lines(prog: str, folder: str, user: str, in_root: bool) -> list[str]:
    """The lines ``up`` ends with: commands that reach the sandbox in ``folder`` when pasted
    into a shell that has none of its variables (``--dir`` unless it is the default folder),
    and submit a job as its job ``user``."""
    where = "" if Path(folder) == sandbox_layout.DEFAULT_DIR else f" --dir {shlex.quote(folder)}"
    if in_root:
        return [
            f"use it with: {prog} exec{where} -- sinfo -N",
            f"jobs run as {user}: {prog} exec{where} --user {shlex.quote(user)} -- "
            "sbatch --wrap hostname",
        ]
    return [
        f'use it with: eval "$({prog} env{where})"',
        f'jobs run as {user}: runuser -u "${sandbox_layout.USER_ENV}" -- sbatch --wrap hostname',
    ]


@cli.command()
@_dir_option
def down(directory: Optional[str], release: Optional[str]) -> None:
    """Stop the daemons the sandbox started; keep its files.

    Stops each slurmd, slurmctld and munged named by the pid files in the state folder (after
    checking that the process really is the sandbox's).  Logs, state, key and venv stay, so
    the next `up` is quick and a failure can still be read.  Job processes still running are
    left alone, as a crashed node would leave them.

    \b
    Example:
      dispatch-sandbox down
    """
    actions = sandbox.down(_folder(directory, release))
    for action in actions:
        click.echo(action)
    if not actions:
        click.echo("nothing was running")


@cli.command()
@_dir_option
def remove(directory: Optional[str], release: Optional[str]) -> None:
    """Stop the sandbox and remove its state folder, its network and its port slot.

    What `down` does (stop the daemons, remove the nodes' network namespaces and the bridge),
    then removes what `up` made for this folder: the port slot's claim, the mount point in
    the Debian root of another release, and the state folder with its logs, state, key and
    venv.  A link in the folder is removed, never followed.  Says what it removed.

    It refuses, removing nothing, a folder that is not a sandbox's (no sandbox.json that `up`
    writes, and no port slot of this machine names it), a symlink (name the folder itself),
    a folder another user can write to, and one with a mount in it.  The job user stays, and
    so does a release's Debian root in /var/cache/slurm-dispatch: other sandboxes may use
    them.  Job processes still running are left alone, as by `down`.

    \b
    Examples:
      dispatch-sandbox remove --dir /var/tmp/sb2
      dispatch-sandbox remove --slurm 24.11
    """
    folder = sandbox_layout.state_dir(_folder(directory, release))
    actions, user = sandbox.remove_sandbox(folder)
    if user is None:
        click.echo(f"no sandbox folder {folder}: nothing to remove")
        return
    for action in actions:
        click.echo(action)
    click.echo(
        f"the job user {user} stays (other sandboxes may use it; remove it with: "
        f"userdel -r {shlex.quote(user)})"
    )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_dir_option
def status(as_json: bool, directory: Optional[str], release: Optional[str]) -> None:
    """Show the daemons, the nodes and the state folder.  Exit 0 when all is up, else 1.

    Needs no root.  Node states come from `sinfo -N` against the sandbox's slurm.conf; a
    slurmd "cut off the network" (or "stopped") is a partitioned node.

    \b
    Examples:
      dispatch-sandbox status
      dispatch-sandbox status --json | jq '.nodes[].state'
    """
    report = sandbox.status(_folder(directory, release))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        click.echo(f"state dir   {report.dir}")
        click.echo(f"slurm.conf  {report.slurm_conf}")
        click.echo(f"job user    {report.user}")
        click.echo(f"venv        {report.venv_bin}")
        if report.rootfs:
            click.echo(f"slurm       {report.slurm} (Debian root {report.rootfs})")
        if report.daemons:
            click.echo("daemons:")
        for daemon in report.daemons:
            if not daemon.alive:
                what = "not running"
            elif daemon.stopped:
                what = f"pid {daemon.pid}, stopped (partitioned)"
            elif daemon.name.startswith("slurmd ") and daemon.name.split()[1] in report.partitioned:
                what = f"pid {daemon.pid}, running, cut off the network (partitioned)"
            else:
                what = f"pid {daemon.pid}, running"
            click.echo(f"  {daemon.name:<12} {what}")
        if report.nodes:
            click.echo("nodes:")
        for node in report.nodes:
            reason = f"  ({node.reason})" if node.reason else ""
            click.echo(f"  {node.name:<4} {node.state}{reason}")
        if report.controller_error:
            click.echo(f"controller: {report.controller_error}")
    sys.exit(0 if report.running else 1)


@cli.command()
@_dir_option
def env(directory: Optional[str], release: Optional[str]) -> None:
    """Print shell lines that point Slurm commands and `dispatch` at the sandbox.

    Sets SLURM_CONF, DISPATCH_SANDBOX_DIR and DISPATCH_SANDBOX_USER and puts <state>/venv/bin
    first on PATH.  A sandbox in a Debian root (--slurm 24.11) has none: its tools run only
    inside that root, through `dispatch-sandbox exec`.

    \b
    Example:
      eval "$(dispatch-sandbox env)"; sinfo -N
    """
    for line in sandbox_clients.env_lines(_folder(directory, release)):
        click.echo(line)


@cli.command()
@click.argument("node")
@_dir_option
def partition(node: str, directory: Optional[str], release: Optional[str]) -> None:
    """Cut NODE off the network: nothing it sends or receives gets through; its jobs run on.

    Each node runs in its own network namespace on the sandbox's bridge; this takes the
    bridge's end of NODE's link down, so slurmd, slurmstepd and the job's own processes on
    NODE reach neither the controller nor another node, while its files stay reachable.
    About 25 s later Slurm marks the node DOWN (not responding) and requeues its batch jobs
    onto other nodes, while the old processes on NODE go on writing, until `heal`.

    \b
    Example:
      dispatch-sandbox partition n1; sleep 40; squeue; dispatch-sandbox heal n1
    """
    pid = sandbox.partition(node, _folder(directory, release))
    click.echo(
        f"partitioned {node} (its network is cut; slurmd pid {pid} runs on); undo "
        f"with: {PROG} heal {node}"
    )


@cli.command()
@click.argument("node")
@click.option(
    "--no-register",
    is_flag=True,
    help="Do not make slurmd re-register at once; let the controller find the node "
    "again by itself (about 40 s).",
)
@click.option("--no-wait", is_flag=True, help="Return without waiting for NODE to be idle.")
@_dir_option
def heal(
    node: str, no_register: bool, no_wait: bool, directory: Optional[str], release: Optional[str]
) -> None:
    """Reconnect NODE after `partition`, and wait until it is idle again.

    Brings NODE's link up again (its slurmd then kills what is left of the jobs that were
    requeued away from it and runs their Epilog) and sends slurmd SIGHUP so that it
    re-registers at once.  Healed less than MessageTimeout (10 s) after NODE went down, it
    waits out that window and makes slurmd register again: the controller leaves a job the
    failure ended running when a registration reports it sooner.

    \b
    Example:
      dispatch-sandbox heal n1
    """
    actions = sandbox.heal(
        node, _folder(directory, release), wait=not no_wait, register=not no_register
    )
    for action in actions:
        click.echo(action)
    click.echo(f"{node} healed" if actions else f"{node} was not partitioned")


@cli.command(name="build-root")
@click.option(
    "--slurm",
    "release",
    metavar="RELEASE",
    required=True,
    help=f"The release whose Debian root to build: {sandbox_root.choices(host=False)}.",
)
def build_root(release: str) -> None:
    """Build the Debian root of a Slurm release now (up --slurm builds it when missing).

    debootstrap (installed with apt-get when missing) makes it from Debian's packages once;
    it is kept in $DISPATCH_SANDBOX_ROOTFS, else /var/cache/slurm-dispatch, and reused.

    \b
    Example:
      dispatch-sandbox build-root --slurm 24.11
    """
    started = time.monotonic()
    root, actions = sandbox.build_root(release)
    for action in actions:
        click.echo(action)
    verb = "built" if actions else "already built"
    click.echo(
        f"Debian root for Slurm {release} (holding {sandbox_root.held(root)}) {verb} in "
        f"{time.monotonic() - started:.1f} s: {root}"
    )


@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.option(
    "--user",
    "-u",
    metavar="USER",
    default=None,
    help="Run as USER (runuser), in USER's home unless --cwd says otherwise.",
)
@click.option("--cwd", metavar="DIR", default=None, help="Folder to run in.")
@_dir_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(
    user: Optional[str],
    cwd: Optional[str],
    directory: Optional[str],
    release: Optional[str],
    command: tuple[str, ...],
) -> None:
    """Run COMMAND against the sandbox: its Slurm tools and venv first on PATH.

    For the host's Slurm this is COMMAND with the variables of `env`; for a sandbox in a
    Debian root (--slurm 24.11) COMMAND runs inside that root, where its own Slurm tools,
    munge and venv are (needs root).  Exits with COMMAND's exit status.

    \b
    Examples:
      dispatch-sandbox exec --slurm 24.11 -- sinfo -N
      dispatch-sandbox exec --slurm 24.11 --user dispatchuser -- sbatch --wrap hostname
    """
    folder = _folder(directory, release)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(sandbox_clients.environment(folder))
    if user is not None and cwd is None:
        cwd = sandbox_machine.home_of(user)
    argv = sandbox_clients.command(list(command), folder, user=user, cwd=cwd)
    sys.exit(subprocess.run(argv, env=env).returncode)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Console entry point: run the CLI; errors print as ``dispatch-sandbox: <message>``."""
    cli.main(args=list(argv) if argv is not None else None, prog_name=PROG)
