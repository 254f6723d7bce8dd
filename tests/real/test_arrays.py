"""Array jobs and jobs Slurm has forgotten, on the real sandbox.

Arrays: a failed array task is resubmitted on its own (``--array=<task>``), numbered in its own
lineage, and resumes from its own task root's latest publication; the other tasks are left
alone.  Forgotten jobs: a job that failed while no supervisor ran and then aged out of slurmctld
(MinJobAge) is resubmitted by the next pass from Slurm's accounting (``sacct``: the sandbox runs
slurmdbd), or, where the sandbox keeps none (``DISPATCH_SANDBOX_ACCOUNTING=none``), from the
controller hook's end record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.real import test_supervisor as supervisor_tests
from tests.real.test_supervisor import User

pytestmark = pytest.mark.real

# Each task publishes one save in its own root; task 1's first submission then exits 5.
TASK_SCRIPT = """#!/bin/bash
#SBATCH --time=5
mkdir -p "$DISPATCH_EXEC_DIR/save"
echo "$SLURM_ARRAY_TASK_ID" > "$DISPATCH_EXEC_DIR/save/data"
dispatch publish --step "$DISPATCH_SUBMISSION" "$DISPATCH_EXEC_DIR/save"
echo "task=$SLURM_ARRAY_TASK_ID submission=$DISPATCH_SUBMISSION epoch=$DISPATCH_EPOCH \
resume=$DISPATCH_RESUME_FROM" >> "run-$SLURM_ARRAY_TASK_ID.log"
if [ "$SLURM_ARRAY_TASK_ID" = 1 ] && [ "$DISPATCH_SUBMISSION" = 1 ]; then exit 5; fi
"""


user = supervisor_tests.user  # the fixture: a folder of the sandbox user's, failing.sh in it


def write_script(user: User, name: str, text: str) -> None:
    (user.path / name).write_text(text)
    (user.path / name).chmod(0o755)
    shutil.chown(user.path / name, user.sandbox.user)


def state(sandbox: Any, jobid: str) -> str:
    return sandbox.job_state(jobid).get("JobState", "")


def test_a_failed_task_is_resubmitted_alone_and_resumes_from_its_own_root(user: User) -> None:
    sandbox = user.sandbox
    write_script(user, "tasks.sh", TASK_SCRIPT)
    job, array = user.submit("--checkpoint", "ck/%a", "--array=0-2", "--resubmit", "1", "tasks.sh")
    array = array.split(";")[0]
    sandbox.wait_for(
        lambda: (
            [state(sandbox, f"{array}_{t}") for t in range(3)]
            == ["COMPLETED", "FAILED", "COMPLETED"]
        ),
        90,
        "tasks 0 and 2 to complete, task 1 to fail",
    )
    said = user.supervise()
    assert f"{job} task 0: completed: stop (done)" in said
    assert f"{job} task 2: completed: stop (done)" in said
    assert f"{job} task 1: failed: resubmitted as submission 2 (Slurm job " in said, said
    data = user.status(job)
    (again,) = [s for s in data["submissions"] if s["task"] == 1]
    assert again["submission"] == 2 and again["display_id"] == f"{again['slurm_job_id']}_1"
    argv = user.run(
        "squeue", "-h", "--states=all", "-r", "-j", again["slurm_job_id"], "-o", "%i"
    ).stdout.split()
    assert argv == [f"{again['slurm_job_id']}_1"], "only task 1 was submitted again"
    sandbox.wait_for(
        lambda: state(sandbox, again["display_id"]) == "COMPLETED",
        90,
        "task 1's own submission to complete",
    )

    def settled() -> bool:
        user.supervise()
        return all(t["settled"] for t in user.status(job)["tasks"])

    sandbox.wait_for(settled, 60, "every task settled", interval=1)
    first, second = (user.path / "run-1.log").read_text().splitlines()
    assert "submission=1 epoch=1000000" in first
    # Task 1's second submission is N=2 in its own epoch and resumes from its own root.
    assert "submission=2 epoch=2000000" in second
    resumed = second.split("resume=")[1]
    assert resumed.startswith(str(user.path / "ck" / "1" / "exec") + "/"), second
    for other in (0, 2):
        (line,) = (user.path / f"run-{other}.log").read_text().splitlines()
        assert "submission=1 epoch=1000000" in line
    data = user.status(job)
    tasks = {t["task"]: t for t in data["tasks"]}
    assert tasks[1]["submission"] == 2 and tasks[1]["latest"]["epoch"] == 2_000_000
    assert tasks[1]["latest"]["path"].startswith(str(user.path / "ck" / "1" / "exec"))
    assert [tasks[t]["latest"]["epoch"] for t in (0, 2)] == [1_000_000, 1_000_000]
    text = user.run("dispatch", "status", job).stdout
    assert "unreadable" not in text and f"{array}_1" in text
    # A task's own Slurm job id finds the dispatch job (Slurm shows the task as 97_1).
    own = next(e["slurm_job_id"] for e in data["executions"] if e["array_task_id"] == "1")
    assert own != array and user.status(own)["id"] == job


@pytest.fixture
def short_min_job_age(sandbox: Any) -> Iterator[None]:
    """MinJobAge 5 s for one test: a line in the sandbox's site.conf (included last by its
    slurm.conf, so it wins) and ``scontrol reconfigure``; put back afterwards."""
    site = Path(sandbox.dir) / "etc" / "site.conf"
    kept = site.read_text()
    site.write_text(kept + "MinJobAge=5\n")
    try:
        sandbox.run(["scontrol", "reconfigure"])
        shown = sandbox.run(["scontrol", "show", "config"]).stdout
        assert any(line.split() == ["MinJobAge", "=", "5", "sec"] for line in shown.splitlines())
        yield
    finally:
        site.write_text(kept)
        sandbox.run(["scontrol", "reconfigure"])


def known(sandbox: Any, jobid: str) -> bool:
    proc = sandbox.run(["squeue", "-h", "--states=all", "-j", jobid, "-o", "%i"], check=False)
    return proc.returncode == 0 and bool(proc.stdout.strip())


def test_a_job_that_failed_and_aged_out_unseen_is_resubmitted(
    user: User, short_min_job_age: None
) -> None:
    sandbox = user.sandbox
    job, first = user.submit("--checkpoint", "ck", "--resubmit", "1", "failing.sh")
    first = first.split(";")[0]
    # No supervisor runs while it fails and slurmctld forgets it (MinJobAge, then its purge).
    sandbox.wait_for(
        lambda: not known(sandbox, first), 200, f"slurmctld to forget job {first}", interval=2
    )
    kept = sandbox.run(
        ["sacct", "-X", "-n", "-P", "-j", first, "-o", "State"], user=sandbox.user, check=False
    )
    if sandbox.accounting == "slurmdbd":
        # As at a site: Slurm's accounting keeps what slurmctld forgot, and the pass reads it.
        assert kept.returncode == 0 and kept.stdout.split() == ["FAILED"], kept
        source = "Slurm's accounting (sacct)"
    else:
        assert kept.returncode != 0, kept  # no accounting: the controller hook's end record
        source = "the controller's end record (exit 3:0)"
    said = user.supervise()
    assert f"{job}: failed (known from {source}): resubmitted as submission 2" in said, said
    subs = user.status(job)["submissions"]
    assert [s["submission"] for s in subs] == [1, 2]
    assert f"known from {source}" in subs[1]["reason"]


def test_a_task_the_controller_forgot_is_judged_from_its_own_facts(
    sandbox: Any, short_min_job_age: None
) -> None:
    """dispatch-cease A_T once slurmctld has forgotten the task (MinJobAge):
    its facts are filed under its own job id, which the controller's start names as array A
    task T, so the answer is a verdict from them, not 'unknown to the controller'."""
    array = sandbox.submit("#!/bin/sh\nexit 0\n", "--array=0-1", "-o", "/dev/null")
    own = sandbox.wait_for(
        lambda: (lambda f: f.get("JobId") if f.get("JobState") == "COMPLETED" else None)(
            sandbox.job_state(f"{array}_1")
        ),
        60,
        "task 1 to complete",
        interval=1,
    )
    sandbox.wait_for(
        lambda: not known(sandbox, array) and not known(sandbox, own),
        200,
        f"slurmctld to forget array {array}",
        interval=2,
    )
    cease = str(sandbox.venv_bin / "dispatch-cease")
    proc = sandbox.run(
        [cease, f"{array}_1", "--restart", "0", "--json"], user=sandbox.user, check=False
    )
    assert proc.returncode == 0, proc
    verdict = json.loads(proc.stdout)
    assert (verdict["job_id"], verdict["slurm_job_id"], verdict["ceased"]) == (
        f"{array}_1",
        own,
        True,
    ), verdict
    assert verdict["job_state"] == "unknown to the controller"
