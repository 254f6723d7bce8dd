"""``dispatch supervise`` as a process against a controller that goes silent:
the loop says each failed pass, keeps passing, and carries out what was due once the controller
answers again; ``dispatch status`` shows the last good pass and since when passes fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from slurm_dispatch.control import heartbeat, record, submit, supervisor
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.controller import CLUSTER, Controller

DISPATCH = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    home = tmp_path / "home"
    conf = tmp_path / "dispatch.conf"
    conf.write_text("CessationSignal=\n")
    monkeypatch.setenv("DISPATCH_HOME", str(home))
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    controller = Controller(tmp_path / "slurm")
    # Submissions keep the first one's environment: its PATH finds the fake commands.
    monkeypatch.setenv("PATH", f"{controller.bin}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", CLUSTER)
    env = controller.env(
        DISPATCH_HOME=str(home),
        SLURM_DISPATCH_CONF=str(conf),
        DISPATCH_SLURM_ATTEMPTS="1",
        DISPATCH_SLURM_BACKEND="cli",
        PYTHONPATH=REPO,
    )
    return {"home": str(home), "controller": controller, "env": env, "tmp": tmp_path}


def poll(
    what: str, found: Callable[[], Any], proc: subprocess.Popen[str], timeout: float = 60.0
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = found()
        if value:
            return value
        assert proc.poll() is None, (
            f"the loop ended ({proc.returncode}) waiting for {what}: {proc.communicate()}"
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_loop_rides_out_a_silent_controller_and_acts_after(world: dict[str, Any]) -> None:
    controller: Controller = world["controller"]
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "--resubmit", "1", "job.sh"]),
        Slurm(controller, wait=0),
    )
    job = done.job
    proc = subprocess.Popen(
        [*DISPATCH, "supervise", "--loop", "--interval", "0.2"],
        env=world["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        good = poll("a first good pass", lambda: supervisor.last_pass(world["home"], CLUSTER), proc)
        assert not good.get("failing_since")
        controller.down()
        controller.set(done.slurm_job_id, JobState="FAILED")  # due while nobody answers

        def failures() -> int:
            seen = supervisor.last_pass(world["home"], CLUSTER) or {}
            return int(seen.get("failures") or 0)

        poll("five failed passes", lambda: failures() >= 5, proc)
        assert len(job.submissions()) == 1
        os.kill(proc.pid, signal.SIGSTOP)  # still failing, as `dispatch status` reads it
        controller.down(False)
        shown = subprocess.run(
            [*DISPATCH, "status", job.id],
            env=world["env"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        line = next(x for x in shown.stdout.splitlines() if x.startswith("Supervisor"))
        assert "last good pass" in line and "passes failing since" in line, line
        assert "Socket timed out" in line, line
        os.kill(proc.pid, signal.SIGCONT)
        poll(
            "the resubmission after the controller answered again",
            lambda: len(job.submissions()) == 2,
            proc,
        )

        def good_pass() -> dict[str, Any]:
            seen = supervisor.last_pass(world["home"], CLUSTER) or {}
            return {} if seen.get("failing_since") else seen

        again = poll("a good pass again", good_pass, proc)
        # One pass more: the first one's lines are printed before the next pass begins.
        poll("the pass after", lambda: good_pass().get("time", 0) > again["time"], proc)
        assert proc.poll() is None, "the loop ended"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
        out, err = proc.communicate(timeout=30)
    failed = [x for x in err.splitlines() if "pass failed" in x]
    assert len(failed) >= 5, err
    assert all("Socket timed out" in x and x.startswith("dispatch: ") for x in failed), err
    assert "resubmitted as submission 2" in out
    assert "answers again" in out, out
    shown = subprocess.run(
        [*DISPATCH, "status", job.id], env=world["env"], capture_output=True, text=True, timeout=60
    )
    line = next(x for x in shown.stdout.splitlines() if x.startswith("Supervisor"))
    assert "failing" not in line and "last good pass" in line, line


def test_one_failed_pass_without_loop_is_recorded_and_exits_2(world: dict[str, Any]) -> None:
    controller: Controller = world["controller"]
    submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(controller, wait=0)
    )
    controller.down()
    for n in (1, 2):
        proc = subprocess.run(
            [*DISPATCH, "supervise"], env=world["env"], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2
        (line,) = proc.stderr.splitlines()
        assert "pass failed" in line and "Socket timed out" in line, proc.stderr
        seen = supervisor.last_pass(world["home"], CLUSTER)
        assert seen is not None and seen["failures"] == n and seen["time"] is None
    first = json.loads(Path(heartbeat.path(world["home"], CLUSTER)).read_text())
    assert isinstance(first["failing_since"], float) and first["cluster"] == CLUSTER
    controller.down(False)
    proc = subprocess.run(
        [*DISPATCH, "supervise"], env=world["env"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    seen = supervisor.last_pass(world["home"], CLUSTER)
    assert seen is not None and seen["time"] and "failing_since" not in seen
    assert record.all_jobs(world["home"])


def test_a_missing_named_config_stops_the_pass_and_says_so(tmp_path: Path) -> None:
    """It printed "...; using the defaults" and then refused to run."""
    missing = tmp_path / "nowhere.conf"
    env = {
        **os.environ,
        "SLURM_DISPATCH_CONF": str(missing),
        "DISPATCH_HOME": str(tmp_path / "home"),
        "PYTHONPATH": REPO,
    }
    proc = subprocess.run(
        [*DISPATCH, "supervise"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc
    assert proc.stderr == (
        f"dispatch: site configuration: {missing}: no such file (named by "
        "$SLURM_DISPATCH_CONF); nothing done (the commands stop where "
        "dispatch.conf or $SLURM_DISPATCH_CONF is wrong; only the hooks go "
        "on with the defaults)\n"
    ), proc.stderr
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").rglob("*.json"))
