"""A job whose interpreter is gone: its venv moved, every resubmission
failed at once in the batch shell and still took the budget.  Now the supervisor makes no
submission and spends nothing, says why and how to fix it in each pass and in `dispatch
status`; `dispatch resubmit --python PATH` resubmits with another, kept for later ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.control import interpreter, status, status_text, submit
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import RefusedError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from ..fakes.controller import Controller
from .test_supervisor import new_job

DISPATCH = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]

REPO = str(Path(__file__).resolve().parents[2])


def venv_python(folder: Path) -> Path:
    """A venv's interpreter, as a venv has it: a link to a real one."""
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.symlink_to(sys.executable)
    return python


def test_a_gone_interpreter_is_never_resubmitted_and_spends_no_budget(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = venv_python(home / "venv")
    monkeypatch.setenv("DISPATCH_PYTHON", str(python))
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "2")
    assert str(python) in (Path(job.path) / "batch-1.sh").read_text()
    (home / "venv").rename(home / "moved")
    cluster.set(first, JobState="FAILED")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    for _ in range(2):  # every pass says so; none submits
        report = sup.run_pass()
        (error,) = report.errors
        assert (
            error.startswith(f"{job.id}: submission 2 not made, nothing of its budget spent")
            and f"the interpreter {python} is gone" in error
        ), error
        assert f"dispatch resubmit --python PATH {job.id}" in error
        assert len(cluster.sbatch_calls()) == 1 and len(job.submissions()) == 1
        assert not (Path(job.path) / "claims" / "submission-2").exists()
    data = status.collect(job, Slurm(cluster, wait=0).own_jobs())
    assert f"the interpreter {python} is gone" in data["launcher_problem"]
    text = status_text.render(data)
    assert f"Launcher    the interpreter {python} is gone" in text
    assert "1 of 2" in text or "0 of 2" in text  # nothing of the budget went
    with pytest.raises(RefusedError, match="not resubmitted: the interpreter"):
        submit.resubmit(Slurm(cluster, wait=0), job)
    assert len(cluster.sbatch_calls()) == 1

    interpreter.choose(job, sys.executable)  # what `dispatch resubmit --python` does first
    done = submit.resubmit(Slurm(cluster, wait=0), job)
    assert (
        f"{sys.executable} -m slurm_dispatch.launch" in (Path(job.path) / "batch-2.sh").read_text()
    )
    assert status.collect(job, {})["launcher_problem"] is None
    cluster.set(done.slurm_job_id, JobState="FAILED")
    report = sup.run_pass()
    assert report.errors == [] and "resubmitted as submission 3" in report.actions[0]
    assert sys.executable in (Path(job.path) / "batch-3.sh").read_text()


def test_dispatch_resubmit_takes_python(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    controller = Controller(home / "slurm")
    monkeypatch.setenv("PATH", f"{controller.bin}:{os.environ['PATH']}")
    python = venv_python(home / "venv")
    monkeypatch.setenv("DISPATCH_PYTHON", str(python))
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(controller, wait=0)
    )
    controller.set(done.slurm_job_id, JobState="FAILED")
    (home / "venv").rename(home / "moved")
    env = controller.env(PYTHONPATH=REPO, DISPATCH_SLURM_BACKEND="cli")

    def resubmit(*words: str) -> Any:
        return subprocess.run(
            [*DISPATCH, "resubmit", *words, done.job.id],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = resubmit()
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1
    assert f"the interpreter {python} is gone" in refused.stderr
    wrong = resubmit("--python", str(home / "nowhere" / "python"))
    assert wrong.returncode == 2, wrong.stderr
    assert wrong.stderr.strip() == (
        f"dispatch: --python {home}/nowhere/python: interpreter {home}/nowhere/python is gone"
    )
    fixed = resubmit("--python", str(home / "moved" / "bin" / "python"))
    assert fixed.returncode == 0, fixed.stderr
    assert "submission 2" in fixed.stdout
    assert (
        f"{home}/moved/bin/python -m slurm_dispatch.launch"
        in (Path(done.job.path) / "batch-2.sh").read_text()
    )
