"""A controller that does not answer: `dispatch jobs` and `dispatch status`
give up near Slurm's own MessageTimeout (one try and one retry), say on stderr what they wait
for once it takes longer than a couple of seconds, and fail with one line naming the
controller.  The fake is at the process boundary: an ``squeue`` on PATH that never answers,
or answers as a client does after MessageTimeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_dispatch.control import record

HANGS = "#!/bin/sh\nexec sleep 120\n"
TIMES_OUT = (
    "#!/bin/sh\nsleep 1\necho 'squeue: error: slurm_load_jobs error: Socket timed out "
    "on send/recv operation' >&2\nexit 1\n"
)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=fake\nSlurmctldHost=ctl1(10.0.0.1)\nMessageTimeout=1\n")
    home = tmp_path / "home"
    monkeypatch.setenv("DISPATCH_HOME", str(home))
    job = record.create_job(
        {
            "generation": 0,
            "checkpoint": str(tmp_path / "ck"),
            "resubmit": 0,
            "shared_checkpoint": False,
            "script_name": "x.sh",
            "created": time.time(),
            "cluster": "fake",
        },
        b"#!/bin/sh\n",
    )
    job.append("submitted", submission=1, slurm_job_id="7", reason="first")
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
    env.update(
        SLURM_CONF=str(conf),
        DISPATCH_HOME=str(home),
        DISPATCH_SLURM_BACKEND="cli",
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )
    return {"bin": str(tmp_path / "bin"), "job": job.id, **{f"env:{k}": v for k, v in env.items()}}


def run(
    world: dict[str, str], squeue: str, *argv: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    fake = Path(world["bin"]) / "squeue"
    fake.write_text(squeue)
    fake.chmod(0o755)
    env = {k[4:]: v for k, v in world.items() if k.startswith("env:")}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_dispatch.cli.dispatch", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc, time.monotonic() - started


@pytest.mark.parametrize("squeue", [HANGS, TIMES_OUT], ids=["hangs", "times-out"])
@pytest.mark.parametrize("command", [["jobs"], ["status", "7"]], ids=["jobs", "status"])
def test_a_silent_controller_fails_within_two_tries_naming_it(
    world: dict[str, str], squeue: str, command: list[str]
) -> None:
    proc, took = run(world, squeue, *command)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    # MessageTimeout 1 s: a try lasts at most 1.2 * 1 + 2 s, two tries and a 1 s wait, and
    # the interpreter's start on a loaded machine (before: 4 tries of 30 s each).
    assert took < 13, (took, proc.stderr)
    if squeue == HANGS:  # said once, while waiting
        assert [line for line in lines[:-1] if "waiting for slurmctld on ctl1" in line] == lines[
            :-1
        ] and len(lines) == 2, lines
    assert lines[-1].startswith("dispatch: slurmctld on ctl1 did not answer squeue"), lines
    assert "2 tries" in lines[-1] and proc.stdout == ""
