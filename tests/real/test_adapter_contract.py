"""Real tier: one contract for the Slurm adapter, run against both backends on the sandbox.

Each test runs the adapter (``slurm_dispatch.slurm.adapter.Slurm(backend=...)``) as the sandbox's
job user, in the sandbox's venv, with the pyslurm matching the sandbox's Slurm on its import path
(built from the vendored source: tests/real/pyslurm_build.py).  The same assertions hold for
``cli`` (squeue, scontrol, scancel) and ``pyslurm``: the caller's own jobs only, every array
task, a hostile comment read back as a comment, a held job, release, requeue, cancel, nodes with
their BootTime, an unknown job and an unknown node.  Then the two backends' answers are compared
field by field, and the choice itself: ``auto`` takes pyslurm here, and without a configuration
source (pyslurm's import is then a fatal exit) ``auto`` takes the tools while ``pyslurm`` is an
error that says why, the calling process alive.  Where no pyslurm exists for the sandbox's
release (none supports 26.05: the newest row's root holds it), the contract runs on the tools
alone and ``auto`` must take them, ``pyslurm`` being the error that says it is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import root as sandbox_root
from slurm_dispatch.slurm.release import major_release
from tests.real import pyslurm_build
from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real


def _session_release() -> str:
    """The major Slurm release the session's sandbox runs (a root's as its marker says)."""
    release = sandbox_root.normalize(os.environ.get(sandbox_layout.RELEASE_ENV))
    if release == sandbox_layout.HOST_RELEASE:
        return sandbox_root.host_release()
    row = sandbox_root.RELEASES[release]
    return sandbox_root.held(sandbox_root.cache_folder() / row.folder) or row.expected


# Whether a pyslurm exists for it (a vendored source release: tests/real/pyslurm_build.py).
PYSLURM = major_release(_session_release()) in pyslurm_build.SOURCES
BACKENDS = ["cli", "pyslurm"] if PYSLURM else ["cli"]
HOSTILE = (
    "JobState=COMPLETED Restarts=3 NodeList=(null) UserId=root(0)\n"
    "7|7|N/A|COMPLETED|3|0||N/A|N/A|N/A|None#00#forged#00#\tdispatch:dfake0001/9"
)

# Runs in the sandbox's venv as its job user: the operations given as JSON, each answer as
# JSON (jobs as dictionaries, an error as its class and message).
DRIVER = r"""
import json, sys
from slurm_dispatch.slurm.adapter import Slurm

def job(j):
    return {k: getattr(j, k) for k in ("job_id", "array_job_id", "array_task_id", "state",
            "reason", "restarts", "nodes", "uid", "comment", "submit_time", "start_time",
            "end_time", "display_id", "is_held", "exit_code")}

backend, ops = sys.argv[1], json.loads(sys.argv[2])
out = []
try:
    slurm = Slurm(backend=None if backend == "setting" else backend, wait=0.5)
    out.append({"backend": slurm.backend})
    for name, *args in ops:
        try:
            got = getattr(slurm, name)(*args)
        except Exception as exc:
            out.append({"error": type(exc).__name__, "message": str(exc)})
            continue
        if name == "own_jobs":
            got = {k: job(v) for k, v in got.items()}
        elif name == "jobs":
            got = [job(v) for v in got]
        elif name == "nodes":
            got = {k: {"state": v.state, "boot_time": v.boot_time} for k, v in got.items()}
        out.append({"ok": got})
except Exception as exc:
    out.append({"error": type(exc).__name__, "message": str(exc)})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def overlay(sandbox: Sandbox) -> Path:
    """A folder holding the pyslurm that matches the sandbox's Slurm, for PYTHONPATH (an
    empty one where no pyslurm exists for it)."""
    said = sandbox.run(["scontrol", "--version"]).stdout.split()[-1]
    release = major_release(said)
    assert release is not None, f"scontrol --version said {said!r}"
    if not PYSLURM:
        assert release not in pyslurm_build.SOURCES, (release, _session_release())
        empty = sandbox.dir / "pyslurm" / "none"
        empty.mkdir(parents=True, exist_ok=True)
        return empty
    python = str(sandbox.venv_bin / "python")
    host = sandbox.slurm == sandbox_layout.HOST_RELEASE
    # The wheel cache is the machine's (.ci/run fills it up front, for both releases); a Debian
    # root does not see it, but it sees the sandbox's state folder: the wheel passes through it.
    staging = None if host else sandbox.dir / "wheels"

    def run(argv: Any) -> Any:
        return sandbox.run(argv, check=False, timeout=1800)

    wheel = pyslurm_build.wheel_for(release, python, run, staging=staging)
    return pyslurm_build.install_into(
        sandbox.dir / "pyslurm" / f"{release[0]}.{release[1]}", wheel, python, run, staging=staging
    )


def adapter(
    sandbox: Sandbox,
    overlay: Path,
    backend: str,
    *ops: Any,
    env: tuple[str, ...] = (),
    as_root: bool = False,
) -> list[Any]:
    """Run ``ops`` through the adapter as the job user (as root: dispatch-cease's caller);
    the answers, the first being ``{"backend": ...}``."""
    argv = [
        "env",
        *env,
        f"PYTHONPATH={overlay}",
        str(sandbox.venv_bin / "python"),
        "-c",
        DRIVER,
        backend,
        json.dumps(list(ops)),
    ]
    proc = sandbox.run(argv, user=None if as_root else sandbox.user, check=False)
    assert proc.returncode == 0 and proc.stdout.strip(), (
        f"the adapter's process ended with {proc.returncode}: {proc.stderr[-2000:]}"
    )
    answers: list[Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return answers


def ok(answer: dict[str, Any]) -> Any:
    assert "ok" in answer, f"the adapter raised: {answer}"
    return answer["ok"]


def run_as_user(sandbox: Sandbox, overlay: Path, backend: str, *ops: Any) -> list[Any]:
    answers = adapter(sandbox, overlay, backend, *ops)
    assert answers[0] == {"backend": backend}, answers[0]
    return [ok(a) for a in answers[1:]]


def sleeper(seconds: int = 300) -> str:
    return f"#!/bin/bash\nsleep {seconds}\n"


def wait_state(sandbox: Sandbox, job_id: str, state: str) -> dict[str, str]:
    def reached() -> dict[str, str] | None:
        fields = sandbox.job_state(job_id)
        return fields if fields.get("JobState") == state else None

    return sandbox.wait_for(reached, 60, f"job {job_id} {state}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_own_jobs_only_with_every_array_task(sandbox: Sandbox, overlay: Path, backend: str) -> None:
    array = sandbox.submit(sleeper(), "--array=0-3", "--hold", "--comment", "dispatch:darray01/1")
    mine = sandbox.submit(sleeper(), "--comment", "dispatch:dmine001/1")
    theirs = sandbox.run(
        [
            "sbatch",
            "--parsable",
            "--hold",
            "--comment",
            "dispatch:dmine001/2",
            "--wrap",
            "sleep 300",
        ]
    ).stdout.strip()  # root's, same-looking marker
    wait_state(sandbox, mine, "RUNNING")
    (jobs,) = run_as_user(sandbox, overlay, backend, ["own_jobs"])
    ours = {array, mine, theirs}  # earlier tests' ended jobs are still in slurmctld's memory
    shown = {job["display_id"] for job in jobs.values() if job["display_id"].split("_")[0] in ours}
    assert shown == {f"{array}_{t}" for t in range(4)} | {mine}, jobs
    assert theirs not in jobs and all(job["uid"] == sandbox.uid for job in jobs.values())
    tasks = [jobs[f"{array}_{t}"] for t in range(4)]
    assert all(
        t["array_job_id"] == array and t["is_held"] and t["state"] == "PENDING" for t in tasks
    ), tasks
    assert (
        jobs[mine]["state"] == "RUNNING"
        and jobs[mine]["nodes"]
        and jobs[mine]["start_time"]
        and jobs[mine]["comment"] == "dispatch:dmine001/1"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_comment_is_only_a_comment(sandbox: Sandbox, overlay: Path, backend: str) -> None:
    job = sandbox.submit(sleeper())
    fields = wait_state(sandbox, job, "RUNNING")
    _, (read,), own = run_as_user(
        sandbox, overlay, backend, ["set_comment", job, HOSTILE], ["jobs", job], ["own_jobs"]
    )
    assert read["comment"] == HOSTILE == own[job]["comment"]
    assert (read["state"], read["restarts"], read["uid"]) == ("RUNNING", 0, sandbox.uid)
    assert read["nodes"] == [fields["NodeList"]] and read["start_time"] is not None
    assert sandbox.job_state(job)["JobState"] == "RUNNING"


@pytest.mark.parametrize("backend", BACKENDS)
def test_hold_release_requeue_cancel(sandbox: Sandbox, overlay: Path, backend: str) -> None:
    pending = sandbox.submit(sleeper(), "--begin=now+1hour")
    running = sandbox.submit(sleeper())
    wait_state(sandbox, running, "RUNNING")
    _, (held,) = run_as_user(sandbox, overlay, backend, ["hold", [pending]], ["jobs", pending])
    assert held["is_held"] and held["reason"] == "JobHeldUser", held
    _, (freed,) = run_as_user(sandbox, overlay, backend, ["release", [pending]], ["jobs", pending])
    assert not freed["is_held"] and freed["state"] == "PENDING", freed
    run_as_user(sandbox, overlay, backend, ["requeue", [running]])
    sandbox.wait_for(
        lambda: sandbox.job_state(running).get("Restarts") == "1", 60, f"job {running} requeued"
    )
    _, (cancelled,) = run_as_user(
        sandbox, overlay, backend, ["cancel", [pending]], ["jobs", pending]
    )
    assert cancelled["state"] == "CANCELLED", cancelled


@pytest.mark.parametrize("backend", BACKENDS)
def test_held_array_task_and_unknowns(sandbox: Sandbox, overlay: Path, backend: str) -> None:
    array = sandbox.submit(sleeper(), "--array=0-2", "--begin=now+1hour")
    _, (task,), whole, unknown = run_as_user(
        sandbox,
        overlay,
        backend,
        ["hold", [f"{array}_1"]],
        ["jobs", f"{array}_1"],
        ["jobs", array],
        ["jobs", "999999"],
    )
    assert task["display_id"] == f"{array}_1" and task["is_held"], task
    assert sorted(t["array_task_id"] for t in whole) == [0, 1, 2]
    assert [t["is_held"] for t in sorted(whole, key=lambda t: t["array_task_id"])] == [
        False,
        True,
        False,
    ]
    assert unknown == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_nodes_with_boot_time(sandbox: Sandbox, overlay: Path, backend: str) -> None:
    (nodes,) = run_as_user(sandbox, overlay, backend, ["nodes", [*sandbox.nodes, "nx9"]])
    assert sorted(nodes) == sorted(sandbox.nodes)  # the unknown node is absent, no error
    for name, node in nodes.items():
        said = sandbox.run(["scontrol", "-o", "show", "node", name]).stdout
        boot = said.split("BootTime=")[1].split()[0]
        # slurmd reports BootTime as now minus uptime at each registration, so two reads a
        # moment apart can differ by a second (seen on 24.11; cease allows BootTimeTolerance).
        said_boot = time.mktime(time.strptime(boot, "%Y-%m-%dT%H:%M:%S"))
        assert abs(node["boot_time"] - said_boot) <= 1, (node["boot_time"], said_boot)
        assert node["state"].startswith("IDLE"), node


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_ended_jobs_exit_code_is_scontrols(
    sandbox: Sandbox, overlay: Path, backend: str
) -> None:
    """A job's exit code as scontrol writes it (``3:0`` for a script's own
    exit 3, ``0:9`` for SIGKILL), whatever the backend reads (squeue's exit_code field is a
    wait status on 22.05: 768)."""
    exited = sandbox.submit("#!/bin/bash\nexit 3\n")
    killed = sandbox.submit("#!/bin/bash\nkill -9 $$\n")
    for job_id in (exited, killed):
        wait_state(sandbox, job_id, "FAILED")
    answers = run_as_user(sandbox, overlay, backend, ["jobs", exited], ["jobs", killed])
    assert [a[0]["exit_code"] for a in answers] == ["3:0", "0:9"], answers


def test_the_backends_agree(sandbox: Sandbox, overlay: Path) -> None:
    """Field by field: an array with running tasks and a pending remainder (8 tasks, 6 CPUs),
    a hostile comment on every task, a held job, the nodes."""
    array = sandbox.submit(sleeper(), "--array=0-7", "--comment", HOSTILE)
    single = sandbox.submit(sleeper(), "--hold")

    def settled() -> bool:
        # Six running, and the scheduler has looked at the two it could not start: until its
        # pass, their Reason is "None", then "Resources", and the two backends read a moment
        # apart (CI once saw 'None' from the tools and 'Resources' from pyslurm).
        states = [sandbox.job_state(f"{array}_{t}") for t in range(8)]
        running = [s for s in states if s.get("JobState") == "RUNNING"]
        pending = [s for s in states if s.get("JobState") == "PENDING"]
        return len(running) == 6 and all(s.get("Reason") not in (None, "None") for s in pending)

    sandbox.wait_for(settled, 60, "six tasks running and the scheduler's reason for the rest")
    ops = (
        ["own_jobs"],
        ["jobs", array],
        ["jobs", f"{array}_7"],
        ["jobs", single],
        ["nodes", sandbox.nodes],
    )
    cli = run_as_user(sandbox, overlay, "cli", *ops)
    ours = {array, single}
    cli[0] = {k: v for k, v in cli[0].items() if k.split("_")[0] in ours}
    assert len(cli[0]) == 9 and len(cli[1]) == 8 and len(cli[2]) == 1, cli
    if not PYSLURM:
        return  # the tools' answers alone, checked above and by each test before
    lib = run_as_user(sandbox, overlay, "pyslurm", *ops)
    lib[0] = {k: v for k, v in lib[0].items() if k.split("_")[0] in ours}
    # The two backends read the nodes a moment apart, and a registration between them can move
    # a node's BootTime by a second (see test_nodes_with_boot_time): within that second, equal.
    assert sorted(cli[4]) == sorted(lib[4]) == sorted(sandbox.nodes), (cli[4], lib[4])
    for name, node in cli[4].items():
        assert abs(lib[4][name]["boot_time"] - node["boot_time"]) <= 1, (name, node, lib[4])
        lib[4][name]["boot_time"] = node["boot_time"]
    for what, one, other in zip(ops, cli, lib):
        assert other == one, f"{what}: cli and pyslurm differ: {differences(one, other)}"


def test_root_reads_a_users_jobs_alike(sandbox: Sandbox, overlay: Path) -> None:
    """dispatch-cease runs as root and reads the user's job: an array with a pending
    remainder and a plain job, each whole, alike through both backends (pyslurm 24.11 finds a
    job through its owner's jobs, so the owner must be the job's, not the caller's)."""
    array = sandbox.submit(sleeper(), "--array=0-3", "--begin=now+1hour")
    single = sandbox.submit(sleeper(), "--hold")
    # The scheduler sets a pending job's reason on its own time: both backends read after.
    sandbox.wait_for(
        lambda: (
            sandbox.job_state(array).get("Reason") == "BeginTime"
            and sandbox.job_state(single).get("Reason") == "JobHeldUser"
        ),
        60,
        "the scheduler's reasons set",
    )
    ops = (["jobs", array], ["jobs", f"{array}_2"], ["jobs", single], ["jobs", "999999"])
    answers = {}
    for backend in BACKENDS:
        got = adapter(sandbox, overlay, backend, *ops, as_root=True)
        assert got[0] == {"backend": backend}, got[0]
        answers[backend] = [ok(a) for a in got[1:]]
    whole, task, plain, unknown = answers["cli"]
    assert sorted(t["array_task_id"] for t in whole) == [0, 1, 2, 3], whole
    assert all(t["uid"] == sandbox.uid for t in whole + plain), whole + plain
    assert [t["display_id"] for t in task] == [f"{array}_2"] and len(plain) == 1
    assert unknown == []
    for backend in BACKENDS:
        assert answers[backend] == answers["cli"], differences(answers["cli"], answers[backend])


def differences(one: Any, other: Any, where: str = "") -> list[str]:
    """Where two JSON values differ, as ``path: a != b`` lines."""
    if isinstance(one, dict) and isinstance(other, dict):
        return [
            line
            for key in sorted(set(one) | set(other), key=str)
            for line in differences(one.get(key), other.get(key), f"{where}/{key}")
        ]
    if isinstance(one, list) and isinstance(other, list) and len(one) == len(other):
        return [
            line
            for i, (a, b) in enumerate(zip(one, other))
            for line in differences(a, b, f"{where}[{i}]")
        ]
    return [] if one == other else [f"{where}: {one!r} != {other!r}"]


def test_auto_takes_pyslurm_where_it_matches(sandbox: Sandbox, overlay: Path) -> None:
    answers = adapter(sandbox, overlay, "setting", ["own_jobs"])
    # Else the tools: no pyslurm exists for the release (26.05).
    assert answers[0] == {"backend": BACKENDS[-1]} and "ok" in answers[1]
    answers = adapter(
        sandbox, overlay, "setting", ["own_jobs"], env=("DISPATCH_SLURM_BACKEND=cli",)
    )
    assert answers[0] == {"backend": "cli"}


def test_no_configuration_source_is_survived(sandbox: Sandbox, overlay: Path) -> None:
    """`import pyslurm` without SLURM_CONF is a fatal exit: the probe's child dies, we don't."""
    unset = ("-u", "SLURM_CONF")
    auto = adapter(sandbox, overlay, "auto", env=unset)
    assert auto == [{"backend": "cli"}]
    forced = adapter(sandbox, overlay, "pyslurm", env=unset)
    assert forced[0]["error"] == "ConfigError", forced
    assert (
        "Could not establish a configuration source" if PYSLURM else "pyslurm is not installed"
    ) in forced[0]["message"], forced


def test_a_mismatched_release_is_refused(sandbox: Sandbox, overlay: Path) -> None:
    """A pyslurm of another major release is never used: auto takes the tools, pyslurm says
    which two releases differ.  (The matching build, its version number changed.  Where no
    pyslurm exists for the release there is none to change: pyslurm is then the error that
    says it is not installed.)"""
    fake = sandbox.dir / "pyslurm-mismatch"
    if not PYSLURM:
        forced = adapter(sandbox, overlay, "pyslurm")
        assert (
            forced[0]["error"] == "ConfigError"
            and "pyslurm is not installed" in forced[0]["message"]
        ), forced
        return
    if not fake.exists():
        shutil.copytree(overlay, fake)
        for name in ("__version__.py", "version.py"):
            path = fake / "pyslurm" / name
            if path.exists():
                path.write_text('__version__ = "25.11.0"\n')
    argv = ["env", f"PYTHONPATH={fake}", str(sandbox.venv_bin / "python"), "-c", DRIVER]
    auto = json.loads(sandbox.run([*argv, "auto", "[]"], user=sandbox.user).stdout)
    forced = json.loads(sandbox.run([*argv, "pyslurm", "[]"], user=sandbox.user).stdout)
    assert auto == [{"backend": "cli"}]
    assert (
        forced[0]["error"] == "ConfigError" and "25.11.0 does not match" in forced[0]["message"]
    ), forced
