"""Real tier: the session's sandbox Slurm cluster and the helpers that drive it.

The ``sandbox`` fixture brings the cluster up once per session through
:func:`slurm_dispatch.sandbox.cluster.up` (3 nodes, this checkout installed in its venv) and
leaves it running at the end, so the next run starts in a second.  It never skips: a sandbox
that cannot start fails every real test with the reason.

Invariant: every test that used the sandbox hands it back settled: no node partitioned, no job
pending or running, every node idle.  Tests clean up after themselves (a partition test heals
in a ``finally``); the teardown below checks and repairs anyway, so one failing test cannot
poison the next.

So one test session per sandbox at a time (settling cancels every job in it).  To run another
session beside it, give it its own sandbox: ``DISPATCH_SANDBOX_DIR=/var/tmp/sandbox-b pytest``
(a sandbox in another folder gets its own ports), and its own job user with
``DISPATCH_SANDBOX_USER=dispatchuser-b`` (another home, so records of the two never mix).

Split over pytest-xdist's workers (``pytest -n 2 --dist loadfile tests/real``, as make test
runs the host's real tier), each worker is such a session of its own: worker ``gw0`` keeps the
folder and job user the environment names (or their defaults), and each other worker ``gwK``
takes the folder with ``-gwK`` appended and the job user with ``-gwK`` appended
(``/var/tmp/slurm-dispatch-sandbox-gw1`` and ``dispatchuser-gw1`` by default): its own
sandbox, ports, network and home.  ``--dist loadfile`` keeps each file on one worker, so a
module's fixtures (a second cluster, a sandbox of its own) are made once.

The Slurm release: ``DISPATCH_SANDBOX_SLURM=24.11 pytest tests/real`` runs the same tests
against a sandbox whose daemons, clients, venv, jobs and hooks run from a Debian 13 root
(slurm_dispatch.sandbox.root; its default folder is ``/var/tmp/slurm-dispatch-sandbox-24.11``);
unset or ``host``, this machine's own Slurm.  :meth:`Sandbox.run` runs every command on the
sandbox's side, so a test that runs its commands through it runs unchanged on both.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import clients as sandbox_clients
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import nodes as sandbox_nodes
from slurm_dispatch.sandbox import root as sandbox_root
from slurm_dispatch.slurm.jobs import FINAL_STATES

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_COUNT = 3
ENDED_STATES = FINAL_STATES  # the adapter's own vocabulary (slurm_dispatch.slurm.jobs)
T = TypeVar("T")
# `scontrol -o` prints Key=Value pairs separated by spaces; a value may itself contain spaces
# (Reason, Command) or '=' (TRES), so split only before a space that starts the next key.
_NEXT_KEY = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:/]*=)")


@dataclass
class Sandbox:
    """A running sandbox cluster, as the tests see it."""

    dir: Path
    user: str
    env: dict[str, str]
    venv_bin: Path
    nodes: list[str]
    # "host", or the release run from a Debian root (sandbox_layout.RELEASE_ENV).
    slurm: str = sandbox_layout.HOST_RELEASE
    # The Debian root it runs from (None on the host's Slurm).
    rootfs: Optional[Path] = None
    # "slurmdbd" where it keeps Slurm's accounting (sacct answers), else "none".
    accounting: str = "none"
    uid: int = field(init=False)
    home: Path = field(init=False)

    def __post_init__(self) -> None:
        entry = pwd.getpwnam(self.user)
        self.uid = entry.pw_uid
        self.home = Path(entry.pw_dir)

    def run(
        self,
        argv: Sequence[Union[str, os.PathLike[str]]],
        user: Optional[str] = None,
        check: bool = True,
        input: Optional[str] = None,
        cwd: Optional[Path] = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` with the sandbox environment; as ``user`` (via runuser) when given.

        A user's command runs in that user's home unless ``cwd`` says otherwise (the test's
        own folder is usually unreadable to it).  With ``check``, a non-zero exit fails with
        the command's output.  On a sandbox in a Debian root the command runs inside it.
        """
        args = [os.fspath(a) for a in argv]
        if user is not None and cwd is None:
            cwd = Path(pwd.getpwnam(user).pw_dir)
        args = sandbox_clients.command(args, self.dir, user=user, cwd=cwd)
        proc = subprocess.run(
            args,
            env=self.env,
            input=input,
            text=True,
            capture_output=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def seen(self, path: str) -> Path:
        """Where this machine finds ``path`` as the sandbox's daemons, hooks and commands see
        it: ``path`` itself on the host's Slurm; in a Debian root, the root's own file (its
        /run, /etc and /var are its own), but for the folders bound into it from this machine
        (sandbox_root.BOUND_FOLDERS: /tmp, /var/tmp, /home, ...)."""
        if self.rootfs is None or any(
            path == folder or path.startswith(folder + "/") for folder in sandbox_root.BOUND_FOLDERS
        ):
            return Path(path)
        return Path(f"{self.rootfs}{path}")

    def wait_for(
        self, predicate: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.2
    ) -> T:
        """Poll ``predicate`` until it returns something truthy, and return that; fail after
        ``timeout`` seconds naming ``what`` and the last value seen."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {what} (last value: {value!r})"
                )
            time.sleep(interval)

    def job_state(self, jobid: str) -> dict[str, str]:
        """``scontrol -o show job JOBID`` as a dict (JobState, Restarts, NodeList, …).

        Each key's first occurrence: Slurm's own fields come before the words of the user's
        submit line (SubmitLine, printed from 26.05), where a comment such as
        ``JobState=COMPLETED`` is read as a key too."""
        out = self.run(["scontrol", "-o", "show", "job", jobid]).stdout.strip()
        line = out.splitlines()[0] if out else ""
        fields: dict[str, str] = {}
        for pair in _NEXT_KEY.split(line):
            key, sep, value = pair.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def node_states(self) -> dict[str, str]:
        """Each node's sinfo state (``idle``, ``mixed``, ``down*``, …)."""
        return {name: node.state for name, node in sandbox_nodes.node_states(self.dir).items()}

    def submit(self, script: str, *sbatch_args: str, user: Optional[str] = None) -> str:
        """Submit ``script`` (given on stdin) with ``sbatch --parsable``; return the job id."""
        out = self.run(
            ["sbatch", "--parsable", *sbatch_args], user=user or self.user, input=script
        ).stdout
        return out.strip().split(";")[0]

    def workdir(self, name: str) -> Path:
        """A fresh folder in the job user's home, created by that user."""
        out = self.run(["mktemp", "-d", f"{self.home}/{name}.XXXXXX"], user=self.user).stdout
        return Path(out.strip())

    def active_jobs(self) -> list[str]:
        return self.run(["squeue", "-h", "-o", "%i"]).stdout.split()

    def settle(self, timeout: float = 120) -> None:
        """Heal partitioned nodes, cancel every active job, wait until every node is idle."""
        for node in sandbox_lib.status(self.dir).partitioned:
            sandbox_lib.heal(node, self.dir, wait=False)
        jobs = self.active_jobs()
        if jobs:
            self.run(["scancel", *jobs], check=False)

        last: dict[str, Any] = {}

        def settled() -> bool:
            last["jobs"] = self.active_jobs()
            last["nodes"] = self.node_states()
            return (
                not last["jobs"]
                and sorted(last["nodes"]) == sorted(self.nodes)
                and all(s == "idle" for s in last["nodes"].values())
            )

        try:
            self.wait_for(settled, timeout, "every node idle and no job active")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: jobs {last.get('jobs')}, nodes {last.get('nodes')}"
            ) from None


WORKER_ENV = "PYTEST_XDIST_WORKER"  # gw0, gw1, ...: set by pytest-xdist in each worker


def worker_sandbox(environ: dict[str, str]) -> dict[str, str]:
    """The folder and job user (``DISPATCH_SANDBOX_DIR`` and ``DISPATCH_SANDBOX_USER``) that
    the pytest-xdist worker ``environ`` names runs its sandbox with: none for the first worker
    (``gw0``) or outside xdist, where the environment's (or the defaults) hold; for worker
    ``gwK``, those with ``-gwK`` appended, so that no two workers share a sandbox or a home."""
    worker = environ.get(WORKER_ENV, "")
    if worker in ("", "gw0"):
        return {}
    base = environ.get(sandbox_layout.DIR_ENV) or str(
        sandbox_layout.default_dir(
            environ.get(sandbox_layout.RELEASE_ENV) or sandbox_layout.HOST_RELEASE
        )
    )
    user = environ.get(sandbox_layout.USER_ENV) or sandbox_layout.DEFAULT_USER
    return {
        sandbox_layout.DIR_ENV: f"{base.rstrip('/')}-{worker}",
        sandbox_layout.USER_ENV: f"{user}-{worker}",
    }


def pytest_configure(config: pytest.Config) -> None:
    # Into the worker's own environment, so that whatever reads the folder or the job user from
    # it (the fixture below, the library's defaults, a command a test runs) agrees.
    os.environ.update(worker_sandbox(dict(os.environ)))


def sandbox_of(report: Any) -> Sandbox:
    """The running sandbox :func:`~slurm_dispatch.sandbox.cluster.up` reported, as tests see it."""
    state = report.status
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
    env.update(sandbox_clients.environment(state.dir, user=state.user))
    return Sandbox(
        dir=Path(state.dir),
        user=state.user,
        env=env,
        venv_bin=Path(state.venv_bin),
        nodes=[n.name for n in state.nodes],
        slurm=state.slurm,
        rootfs=Path(state.rootfs) if state.rootfs else None,
        accounting=state.accounting,
    )


def release_line() -> str:
    """Which Slurm the session's sandbox runs: the newest row's is read from its root, so the
    line says the release that ran after Debian's testing moved on."""
    try:
        release = sandbox_root.normalize(os.environ.get(sandbox_layout.RELEASE_ENV))
    except SandboxError as exc:
        return f"sandbox Slurm: {exc}"
    if release == sandbox_layout.HOST_RELEASE:
        return f"sandbox Slurm: this machine's, {sandbox_root.host_release() or 'none'}"
    row = sandbox_root.RELEASES[release]
    held = sandbox_root.held(sandbox_root.cache_folder() / row.folder) or "not built yet"
    return f"sandbox Slurm: {release} from {row.debian} ({row.suite}), holding {held}"


def pytest_report_header(config: pytest.Config) -> str:
    return release_line()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Also under -q (make test's), which prints no header.
    terminalreporter.write_line(release_line())


# Where a test that empties slurmctld's StateSaveLocation (test_ids_restart: job ids that start
# again) keeps what was there, beside it, until it is put back.
STATE_KEPT = "state.kept-by-test"


def empty_controller_state(cluster: Sandbox) -> None:
    """Restart slurmctld with its StateSaveLocation emptied: it knows no job and numbers new
    ones from FirstJobId again.  What was there is kept beside it (once: a second call keeps
    the first copy) for :func:`restore_controller_state`."""
    sandbox_lib.stop_controller(cluster.dir)
    layout = sandbox_layout.Layout(Path(cluster.dir))
    kept = layout.root / STATE_KEPT
    if not kept.exists():
        shutil.copytree(layout.state_save, kept, symlinks=True)
    _empty(layout.state_save)
    sandbox_lib.start_controller(cluster.dir)
    _nodes_idle_again(cluster)


def restore_controller_state(cluster: Sandbox) -> bool:
    """Put back the state :func:`empty_controller_state` kept, so that the controller numbers
    jobs on from where it was: a folder's records hold facts of every job id it gave before,
    and a later session in the same folder whose jobs got those ids again would read another
    job's facts as its own (CI keeps its sandbox folders from run to run).  Returns whether
    there was something to put back."""
    layout = sandbox_layout.Layout(Path(cluster.dir))
    kept = layout.root / STATE_KEPT
    if not kept.is_dir():
        return False
    sandbox_lib.stop_controller(cluster.dir)
    _empty(layout.state_save)
    for entry in kept.iterdir():
        shutil.move(str(entry), str(layout.state_save / entry.name))
    kept.rmdir()
    sandbox_lib.start_controller(cluster.dir)
    _nodes_idle_again(cluster)
    return True


def recorded_job_ids(cluster: Sandbox) -> list[int]:
    """The Slurm job ids the sandbox folder's records hold facts of."""
    facts = Path(cluster.dir) / "dispatch-state" / "facts"
    return [int(job.name) for job in facts.glob("*/*") if job.name.isdigit()]


def next_job_id(cluster: Sandbox) -> int:
    """The id the controller gives the next job: a held job submitted and cancelled."""
    probe = cluster.submit("#!/bin/sh\nexit 0\n", "-H", "-o", "/dev/null")
    cluster.run(["scancel", probe])
    return int(probe)


def put_aside_facts_of_ids_given_again(cluster: Sandbox) -> Optional[Path]:
    """Where the controller numbers new jobs at or below a job id the folder's records already
    hold facts of (its state was emptied and not put back: an interrupted test_ids_restart, a
    folder kept from a release before that test put it back), the tests would read those jobs'
    facts as their own jobs': the facts are moved aside (the hooks make the folder again).
    Returns where they went, or None when the ids are all new."""
    recorded = recorded_job_ids(cluster)
    if not recorded:
        return None
    probe = next_job_id(cluster)
    if probe > max(recorded):
        return None
    facts = Path(cluster.dir) / "dispatch-state" / "facts"
    aside = facts.with_name(f"facts.before-job-{probe}")
    facts.rename(aside)
    return aside


def _empty(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _nodes_idle_again(cluster: Sandbox) -> None:
    cluster.wait_for(
        lambda: (
            sorted(cluster.node_states()) == sorted(cluster.nodes)
            and all(s == "idle" for s in cluster.node_states().values())
        ),
        90,
        "every node idle again",
    )


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """The real Slurm sandbox (started once, left running after the session)."""
    if os.geteuid() != 0:
        pytest.fail("the real tier needs root: it starts munged, slurmctld and slurmd")
    try:
        # DISPATCH_SANDBOX_USER: the job user, so that two sessions at once (make test runs
        # 24.11 beside 22.05's fast tier) do not share one home and its dispatch records.
        report = sandbox_lib.up(
            os.environ.get(sandbox_layout.DIR_ENV),
            nodes=NODE_COUNT,
            user=os.environ.get(sandbox_layout.USER_ENV) or sandbox_layout.DEFAULT_USER,
            source=REPO_ROOT,
        )
    except SandboxError as exc:
        pytest.fail(f"the sandbox cluster did not start: {exc}")
    cluster = sandbox_of(report)
    # Leftovers of an earlier, interrupted session (a requeued loop, a stopped slurmd, the
    # controller's state a test emptied and did not put back).
    restore_controller_state(cluster)
    cluster.settle()
    put_aside_facts_of_ids_given_again(cluster)
    yield cluster


@pytest.fixture(autouse=True)
def _sandbox_handed_back_settled(request: pytest.FixtureRequest) -> Iterator[None]:
    cluster = request.getfixturevalue("sandbox") if "sandbox" in request.fixturenames else None
    yield
    if cluster is not None:
        cluster.settle()
