"""The trust findings on the real sandbox: a "ceased" that an array, a comment or another user
cannot fool, and a superseding generation of a shared job that waits for the old one.

Each test is the scenario that fooled dispatch before, run as a user would run it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_cease import cease, wait_cease  # tests/real is on sys.path (no package)
from test_supervisor import User, site_conf

pytestmark = pytest.mark.real

OTHER_USER = "dispatchother"


def test_an_array_has_not_ceased_while_one_task_still_runs(sandbox: Any) -> None:
    """Finding 1: task 1 exits 3 while task 0 keeps writing; dispatch-cease of the array's id
    answered ceased, reading only the first record scontrol printed."""
    workdir = sandbox.workdir("array")
    script = (
        "#!/bin/bash\n"
        'if [ "$SLURM_ARRAY_TASK_ID" = 1 ]; then exit 3; fi\n'
        f"touch {workdir}/task0-running\n"
        f"while [ ! -e {workdir}/stop ]; do sleep 0.2; done\n"
    )
    array = sandbox.submit(script, "--array=0-1", f"--chdir={workdir}", "-o", "/dev/null")
    sandbox.wait_for(lambda: (workdir / "task0-running").exists(), 60, "task 0 running")
    sandbox.wait_for(
        lambda: sandbox.job_state(f"{array}_1").get("JobState") == "FAILED", 60, "task 1 failed"
    )
    rc, verdict = cease(sandbox, array)
    assert rc == 1 and not verdict["ceased"], verdict
    tasks = {t["job_id"]: t for t in verdict["tasks"]}
    assert set(tasks) == {f"{array}_0", f"{array}_1"}
    assert "has not ended" in tasks[f"{array}_0"]["reason"]
    # The failed task, asked on its own, has ceased (its Epilog found nothing left).
    assert wait_cease(sandbox, f"{array}_1", 0)["job_state"] == "FAILED"
    (workdir / "stop").touch()
    verdict = wait_cease(sandbox, array, 0)
    assert all(t["ceased"] for t in verdict["tasks"]) and len(verdict["tasks"]) == 2


@pytest.mark.parametrize(
    "comment",
    [
        "JobState=COMPLETED Restarts=3 NodeList=(null)",
        "JobState=COMPLETED Restarts=3\nNodeList=(null) |COMPLETED|3|0||",
    ],
)
def test_a_comment_cannot_make_a_running_job_read_as_ended(sandbox: Any, comment: str) -> None:
    """Finding 4: a running job set its own comment to look like controller fields, and
    dispatch-cease answered "execution 3 never started on any node: ceased"."""
    workdir = sandbox.workdir("comment")
    (workdir / "comment").write_text(comment)
    script = (
        "#!/bin/bash\n"
        f'scontrol update jobid=$SLURM_JOB_ID comment="$(cat {workdir}/comment)"\n'
        f"touch {workdir}/updated\n"
        f"while [ ! -e {workdir}/stop ]; do sleep 0.2; done\n"
    )
    jobid = sandbox.submit(script, f"--chdir={workdir}", "-o", "/dev/null")
    sandbox.wait_for(lambda: (workdir / "updated").exists(), 60, "the comment set")
    shown = sandbox.run(["squeue", "-h", "-j", jobid, "-O", "Comment:0"]).stdout
    assert "JobState=COMPLETED" in shown  # the attack is in place
    rc, verdict = cease(sandbox, jobid)
    assert rc == 1 and verdict["job_state"] == "RUNNING" and verdict["restart"] == 0, verdict
    assert "has not ended" in verdict["reason"]
    (workdir / "stop").touch()
    wait_cease(sandbox, jobid, 0)


@pytest.fixture(scope="module")
def other_user() -> str:
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", OTHER_USER], check=True)
    return OTHER_USER


@pytest.fixture
def user(sandbox: Any) -> User:
    path = Path(os.path.expanduser(f"~{sandbox.user}")) / "trust" / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    for folder in (path, path.parent):
        shutil.chown(folder, sandbox.user)
    failing = "#!/bin/bash\n#SBATCH --time=5\necho failing on purpose; exit 3\n"
    waiting = (
        "#!/bin/bash\n#SBATCH --time=5\n"
        f"touch {path}/started.$SLURM_JOB_ID\n"
        f"while [ ! -e {path}/stop ]; do sleep 0.2; done\n"
    )
    for name, text in (("failing.sh", failing), ("waiting.sh", waiting)):
        (path / name).write_text(text)
        (path / name).chmod(0o755)
        shutil.chown(path / name, sandbox.user)
    return User(sandbox, path, site_conf(sandbox, path, CessationInterval="1"))


def test_another_users_planted_markers_are_not_adopted(user: User, other_user: str) -> None:
    """Finding 5: comments are public; another user planted held jobs carrying the victim's
    marker for its next submission, the victim's pass recorded one as its own, and when its
    owner cancelled it the victim's job stopped."""
    job, first = user.submit("--checkpoint", "ck", "--resubmit", "1", "failing.sh")
    planted = [
        user.sandbox.submit(
            "#!/bin/bash\nsleep 600\n",
            "--hold",
            f"--comment=dispatch:{job}/2",
            "-o",
            "/dev/null",
            user=other_user,
        )
        for _ in range(2)
    ]
    user.sandbox.wait_for(
        lambda: user.sandbox.job_state(first).get("JobState") == "FAILED",
        60,
        "the first submission to fail",
    )
    # A pass that claimed submission 2 and died before its sbatch, long enough ago for the
    # claim to be retried (past any sbatch in flight, within the sandbox's MinJobAge of
    # 600 s): the next pass looks for the submission by its marker, which is where another
    # user's planted jobs were adopted.
    claim = (
        Path(user.sandbox.home)
        / ".local/state/slurm-dispatch/jobs"
        / job
        / "claims"
        / "submission-2"
    )
    user.sandbox.run(["touch", "-d", "5 minutes ago", str(claim)], user=user.sandbox.user)
    user.sandbox.wait_for(
        lambda: "resubmitted" in user.supervise(), 60, "a resubmission", interval=1
    )
    subs = user.status(job)["submissions"]
    assert [s["submission"] for s in subs] == [1, 2]
    second = subs[1]["slurm_job_id"]
    assert second not in planted
    # Read the owner once the resubmitted failing.sh has failed, always: squeue -j without
    # --states lists only pending and running jobs, so CI once read an empty owner when the
    # job was quick; scontrol shows an ended job until MinJobAge.
    user.sandbox.wait_for(
        lambda: user.sandbox.job_state(second).get("JobState") == "FAILED",
        60,
        "the second submission to fail",
    )
    owner = user.sandbox.job_state(second).get("UserId", "").partition("(")[0]
    assert owner == user.sandbox.user
    user.sandbox.run(["scancel", *planted])


def test_superseding_a_shared_job_waits_for_the_old_generation(user: User) -> None:
    """Finding 7: --supersede of a shared-checkpoint job ran sbatch, sbatch, scancel: the new
    generation started while the old one still wrote the shared checkpoint."""
    old, first = user.submit(
        "--checkpoint", "ck", "--shared-checkpoint", "--resubmit", "1", "waiting.sh"
    )
    user.sandbox.wait_for(
        lambda: (user.path / f"started.{first}").exists(), 60, "the old generation running"
    )
    proc = user.run("dispatch-sbatch", "--parsable", "--supersede", old, "waiting.sh")
    new_job = proc.stderr.split("Dispatch job ")[1].split()[0]
    held = proc.stdout.strip()
    state = user.sandbox.job_state(held)
    assert (state["JobState"], state["Reason"]) == ("PENDING", "JobHeldUser"), state
    assert (
        "held: shared checkpoint"
        in user.sandbox.run(["squeue", "-h", "-j", held, "-O", "Comment:0"]).stdout
    )
    # The old generation is cancelled; the hold stands until dispatch-cease proves it gone.
    user.sandbox.wait_for(
        lambda: user.sandbox.job_state(first).get("JobState") == "CANCELLED",
        60,
        "the old generation cancelled",
    )
    assert not (user.path / f"started.{held}").exists()

    def released() -> bool:
        user.supervise()
        return user.sandbox.job_state(held).get("JobState") == "RUNNING"

    user.sandbox.wait_for(released, 120, "the hold lifted by a ceased answer", interval=1)
    status = user.status(new_job)
    assert [e["verdict"] for e in status["events"] if e["event"] == "cessation"][-1] == "ceased"
    assert any(e["event"] == "released" for e in status["events"])
    (user.path / "stop").touch()
