"""dispatch-sbatch warns when --resubmit or --shared-checkpoint is given and no supervisor of
the user's has passed lately: one stderr line naming the ways to run one,
the job submitted all the same.  The supervisor's heartbeat (slurm_dispatch.control.heartbeat) is
what both this and `dispatch status` read."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.control import heartbeat

from ..fakes.controller import CLUSTER, Controller

REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    conf = tmp_path / "dispatch.conf"
    conf.write_text("CessationSignal=\n")
    controller = Controller(tmp_path / "slurm")
    env = controller.env(
        DISPATCH_HOME=str(tmp_path / "home"),
        PYTHONPATH=REPO,
        SLURM_DISPATCH_CONF=str(conf),
        DISPATCH_SLURM_BACKEND="cli",
    )
    return {"tmp": tmp_path, "env": env, "controller": controller, "home": str(tmp_path / "home")}


def run(world: dict[str, Any], module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"slurm_dispatch.{module}", *argv],
        env=world["env"],
        cwd=world["tmp"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def submitted(world: dict[str, Any]) -> int:
    return len(world["controller"].read()["jobs"])


def warnings(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if "warning" in line]


@pytest.mark.parametrize(
    "options, named",
    [
        (["--resubmit", "2"], "--resubmit 2 acts"),
        (["--shared-checkpoint"], "--shared-checkpoint acts"),
        (["--resubmit", "1", "--shared-checkpoint"], "--resubmit 1 and --shared-checkpoint act"),
    ],
)
def test_no_supervisor_yet_is_one_warning_and_the_job_is_submitted(
    world: dict[str, Any], options: list[str], named: str
) -> None:
    proc = run(world, "cli.sbatch", "--checkpoint", "ck", *options, "job.sh")
    assert proc.returncode == 0, proc.stderr
    assert "Submitted batch job" in proc.stdout and submitted(world) == 1
    (line,) = warnings(proc)
    assert line.startswith(
        f"dispatch-sbatch: warning: {named} only while `dispatch supervise` runs"
    ), line
    assert "none has passed yet" in line
    assert "systemctl --user enable --now dispatch-supervise.timer" in line
    assert "* * * * * dispatch supervise -q" in line and "dispatch supervise --loop" in line


def test_without_those_options_nothing_is_said(world: dict[str, Any]) -> None:
    proc = run(world, "cli.sbatch", "--checkpoint", "ck", "job.sh")
    assert proc.returncode == 0 and warnings(proc) == [], proc.stderr


def test_a_recent_pass_silences_it_and_an_old_one_does_not(world: dict[str, Any]) -> None:
    passed = run(world, "cli.dispatch", "supervise")  # a pass over no jobs leaves the heartbeat too
    assert passed.returncode == 0, passed.stderr
    assert heartbeat.read(world["home"], CLUSTER) is not None
    proc = run(world, "cli.sbatch", "--checkpoint", "ck", "--resubmit", "2", "job.sh")
    assert proc.returncode == 0 and warnings(proc) == [], proc.stderr
    beat = Path(heartbeat.path(world["home"], CLUSTER))
    body = json.loads(beat.read_text())
    body["time"] -= 3600
    beat.write_text(json.dumps(body))
    proc = run(world, "cli.sbatch", "--checkpoint", "ck2", "--resubmit", "2", "job.sh")
    (line,) = warnings(proc)
    assert "in the last 10 min (the last one passed " in line, line
    assert submitted(world) == 2


def test_a_slow_loop_counts_by_its_interval(world: dict[str, Any]) -> None:
    heartbeat.good(world["home"], None, 0, 0, 0, every=900.0)
    body = json.loads(Path(heartbeat.path(world["home"])).read_text())
    body["time"] = time.time() - 1200  # 20 min ago, within three 15-min intervals
    Path(heartbeat.path(world["home"])).write_text(json.dumps(body))
    assert heartbeat.missing_warning(world["home"], None, ["--resubmit 1"]) is None
    assert (
        heartbeat.missing_warning(world["home"], None, ["--resubmit 1"], now=time.time() + 3600)
        is not None
    )
    assert heartbeat.missing_warning(world["home"], "other", ["--resubmit 1"]) is not None
