"""A shared-checkpoint job's submission runs its script at most once (the soak's finding, seed
802312, 2026-12-04: two executions of one shared job wrote its checkpoint side by side).

A shared job is submitted ``--no-requeue`` and every restart of it is a held submission, so
one submission is one execution.  Slurm can still start the same job again behind dispatch's
back: a controller that restarts from a state saved before it launched the job (slurmctld
saves its state up to seconds after a change; a SIGKILL, or a backup controller taking over,
loses them) schedules it again, on another node, while the first launch still runs.  The
launcher is the one gate every execution passes, so there each execution of a shared job
claims its submission (per array task) once, in the job's record; a second execution of the
same submission finds the claim and stops before the script runs, naming the execution that
holds it.  Its end is then an end like any other: the supervisor holds the next submission
until the site's signal proves every execution of the Slurm job gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.control import record

# Appends the node it ran on to RAN (one line per execution that ran the script).
SCRIPT = """#!/bin/sh
echo "$SLURMD_NODENAME $DISPATCH_SUBMISSION $DISPATCH_ATTEMPT" >> "$RAN"
"""


def make_job(tmp_path: Path, shared: bool) -> record.JobRecord:
    spec = {
        "generation": 0,
        "checkpoint": str(tmp_path / "ck"),
        "script": "job.sh",
        "shared_checkpoint": shared,
    }
    return record.create_job(spec, SCRIPT.encode(), home=str(tmp_path / "home"))


def launch(
    tmp_path: Path,
    job: record.JobRecord,
    submission: int,
    node: str,
    restart: Optional[int] = None,
    task: Optional[int] = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DISPATCH_HOME": str(tmp_path / "home"),
        "SLURM_JOB_ID": "41",
        "SLURMD_NODENAME": node,
        "RAN": str(tmp_path / "ran"),
    }
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = str(restart)
    if task is not None:
        env.update(SLURM_ARRAY_JOB_ID="40", SLURM_ARRAY_TASK_ID=str(task))
    # The launcher's dispatch commands: a held submission's comment is best effort, and the
    # test has no controller, so no scontrol is on PATH.
    env["PATH"] = os.path.dirname(sys.executable) + ":/usr/bin:/bin"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            job.path,
            "--submission",
            str(submission),
            "--",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran"
    return path.read_text().splitlines() if path.exists() else []


def test_a_second_execution_of_a_shared_submission_never_runs_its_script(tmp_path: Path) -> None:
    job = make_job(tmp_path, shared=True)
    first = launch(tmp_path, job, 1, "n1")
    assert first.returncode == 0, first.stderr
    (line,) = ran(tmp_path)
    attempt = line.split()[2]

    # The controller lost the launch and starts the same job again on n2 (restart 0 again),
    # and again after a requeue it should never have made (restart 1).
    for restart in (None, 1):
        again = launch(tmp_path, job, 1, "n2", restart=restart)
        assert again.returncode == 2
        assert ran(tmp_path) == [line], "the second execution ran the script"
        said = again.stderr
        assert f"dispatch job {job.id} submission 1" in said
        assert "already started" in said and "on n1" in said and attempt in said, said
        assert "Slurm job 41 restart 0" in said, said
        assert "shared checkpoint" in said and "dispatch release" not in said, said
    # The record holds the one execution that ran.
    started = [e for e in job.events() if e["event"] == "started"]
    assert [(e["node"], e["attempt"]) for e in started] == [("n1", attempt)]

    # The next submission (a hold lifted, a resubmission) is an execution of its own.
    second = launch(tmp_path, job, 2, "n3")
    assert second.returncode == 0, second.stderr
    assert [r.split()[:2] for r in ran(tmp_path)] == [["n1", "1"], ["n3", "2"]]


def test_each_task_of_a_shared_array_runs_once_per_submission(tmp_path: Path) -> None:
    job = make_job(tmp_path, shared=True)
    assert launch(tmp_path, job, 1, "n1", task=0).returncode == 0
    assert launch(tmp_path, job, 1, "n2", task=1).returncode == 0
    refused = launch(tmp_path, job, 1, "n3", task=0)
    assert refused.returncode == 2 and "task 0" in refused.stderr, refused.stderr
    # Each named as squeue and the job's own output name an array task (40_0), never by the
    # task's own job id (found by the attack on 865ad2b).
    assert "(Slurm job 40_0 restart 0, attempt" in refused.stderr, refused.stderr
    assert "(Slurm job 40_0 restart 0 on n3)" in refused.stderr, refused.stderr
    assert [r.split()[0] for r in ran(tmp_path)] == ["n1", "n2"]


def test_an_isolated_job_runs_every_execution(tmp_path: Path) -> None:
    # Overlap is harmless there (each execution writes its own folder): Slurm's own requeue
    # and a controller's second launch both run.
    job = make_job(tmp_path, shared=False)
    for node, restart in (("n1", None), ("n2", None), ("n3", 1)):
        proc = launch(tmp_path, job, 1, node, restart=restart)
        assert proc.returncode == 0, proc.stderr
    assert [r.split()[0] for r in ran(tmp_path)] == ["n1", "n2", "n3"]


def test_what_follows_a_refusal_is_said_as_the_jobs_budget_has_it(tmp_path: Path) -> None:
    # With --resubmit budget left the supervisor holds the next submission; without, the job
    # stops there, as after any end of a shared job (found by the attack on 865ad2b: the
    # message promised a hold the default budget never makes).
    job = make_job(tmp_path, shared=True)
    assert launch(tmp_path, job, 1, "n1").returncode == 0
    said = " ".join(launch(tmp_path, job, 1, "n2").stderr.split())
    assert (
        "with --resubmit budget left, `dispatch supervise` holds the next submission" in said
        and "with none left, the job stops there" in said
    ), said


def test_a_claim_the_execution_itself_made_is_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS a LINK that succeeded but whose reply was lost is retried and answered EEXIST:
    the one execution finds its own claim and runs (found by the attack on 865ad2b)."""
    from slurm_dispatch.execution import launch as launcher

    job = make_job(tmp_path, shared=True)
    link = os.link

    def linked_then_exists(src: str, dst: str) -> None:
        link(src, dst)
        raise FileExistsError(17, "File exists", dst)

    monkeypatch.setattr(os, "link", linked_then_exists)
    env = {"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "n1"}
    launcher.claim_shared(job, 1, env)  # no SharedRefused
    monkeypatch.setattr(os, "link", link)
    with pytest.raises(launcher.SharedRefused):  # another execution's is not
        launcher.claim_shared(job, 1, {**env, "SLURMD_NODENAME": "n2"})


def started_by_the_release_before(
    job: record.JobRecord, submission: int, node: str, task: Optional[int] = None
) -> str:
    """What an execution of the release before the claim left: a start, and no claim."""
    attempt = "0" * 25 + node[-1]
    job.append(
        "started",
        submission=submission,
        slurm_job_id="41",
        array_job_id="40" if task is not None else "",
        array_task_id="" if task is None else str(task),
        restart=0,
        attempt=attempt,
        epoch=submission * 1_000_000,
        exec_dir="/x",
        node=node,
        nodes=node,
        host="h-" + node,
        pid=4242,
    )
    return attempt


def test_a_start_recorded_without_a_claim_counts_as_the_claim(tmp_path: Path) -> None:
    """A shared job's first execution, started by the release before the
    claim existed, recorded its start and no claim.  A second execution of the same
    submission (a controller back from a lost launch, after an upgrade in place) stops before
    its script, naming it; other submissions and other tasks run."""
    job = make_job(tmp_path, shared=True)
    attempt = started_by_the_release_before(job, 1, "n1")
    again = launch(tmp_path, job, 1, "n2")
    assert again.returncode == 2, again.stderr
    assert ran(tmp_path) == [], "the second execution ran the script"
    said = again.stderr
    assert "already started on n1" in said and attempt in said, said
    assert "Slurm job 41 restart 0" in said, said
    assert not job.claims("execution-1"), "a refused execution holds no claim"
    assert launch(tmp_path, job, 2, "n3").returncode == 0
    # An array: the task that started is claimed so; another task is not.
    array = make_job(tmp_path, shared=True)
    started_by_the_release_before(array, 1, "n1", task=0)
    refused = launch(tmp_path, array, 1, "n2", task=0)
    assert refused.returncode == 2 and "(Slurm job 40_0 restart 0" in refused.stderr, refused.stderr
    assert launch(tmp_path, array, 1, "n4", task=1).returncode == 0
    assert [r.split()[:2] for r in ran(tmp_path)] == [["n3", "2"], ["n4", "1"]]
