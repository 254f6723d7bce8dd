"""A job Slurm held after a failed launch: said by ``dispatch jobs`` and ``dispatch status``,
and released by the supervisor (the soak's finding).

How the soak met it: a node is cut off while it runs a job; Slurm requeues the job (restart
1) and it waits for the node (``-w``); the node rejoins while the old execution still runs
there, the relaunch of the same job id reaches slurmd before the old one is gone, slurmd
refuses it ("Job 2 already running, do not launch second copy"; slurmctld: "Duplicate jobid",
the node drained) and slurmctld requeues the job *held*: priority 0, reason ``launch failed
requeued held``.  It never runs until released; the owner may (``scontrol release``), and
that is Slurm's own advice.  That order is a race of milliseconds (by hand on the sandbox with
``partition``/``heal``: 1 of 4 tries; the others ran, or were killed as "Job credential
revoked"), so this test makes Slurm's same hold the other way Slurm makes it: a site Prolog
part that fails once (a fault not of ours: the node is drained, the job requeued held).

The hold is Slurm's, not one slurm-dispatch placed, so the supervisor releases it for an
isolated job, at most :data:`~slurm_dispatch.control.supervisor.LAUNCH_RELEASES` times a
submission (a shared-checkpoint job is left to a person: its restarts are a person's).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real

HELD_REASON = "launch failed requeued held"
# A site's own Prolog part that fails the first launch after FLAG is made (and removes it).
FAILING_PART = """#!/bin/sh
# sample: a site Prolog part that fails once (tests/real/test_failed_launch.py)
if [ -e {flag} ]; then rm -f {flag}; exit 1; fi
exit 0
"""


def test_a_job_held_after_a_failed_launch_is_said_and_released(sandbox: Sandbox) -> None:
    work = sandbox.workdir("launch-held")
    user = ["env", f"DISPATCH_HOME={work / 'dispatch-home'}"]
    sandbox.run(["tee", str(work / "job.sh")], user=sandbox.user, input="#!/bin/bash\nsleep 300\n")
    node = sandbox.nodes[0]
    part = sandbox.dir / "etc" / "prolog.d" / "01-fails-once"
    flag = sandbox.dir / "fail-next-prolog"
    part.write_text(FAILING_PART.format(flag=flag))
    part.chmod(0o755)
    flag.touch()
    try:
        out = sandbox.run(
            [
                *user,
                str(sandbox.venv_bin / "dispatch-sbatch"),
                "--parsable",
                "-w",
                node,
                "--checkpoint",
                "ck",
                "job.sh",
            ],
            user=sandbox.user,
            cwd=work,
        ).stdout
        job = out.strip().split(";")[0]

        def held() -> bool:
            return (
                sandbox.run(["squeue", "-h", "-j", job, "-o", "%T|%r"]).stdout.strip()
                == f"PENDING|{HELD_REASON}"
            )

        sandbox.wait_for(held, 60, f"Slurm to hold job {job} after its failed launch")
    finally:
        part.unlink()
        flag.unlink(missing_ok=True)
    # The failed Prolog drained the node: the site's admin resumes it.
    sandbox.run(["scontrol", "update", f"nodename={node}", "state=resume"])

    dispatch = [*user, str(sandbox.venv_bin / "dispatch")]
    lines = json.loads(
        sandbox.run([*dispatch, "jobs", "--json"], user=sandbox.user, cwd=work).stdout
    )
    assert [line["state"] for line in lines] == ["HELD (Slurm: launch failed)"], lines
    table = sandbox.run([*dispatch, "jobs", "--state", "HELD"], user=sandbox.user, cwd=work).stdout
    assert job in table, table
    text = sandbox.run([*dispatch, "status", job], user=sandbox.user, cwd=work).stdout
    assert (
        f"Slurm holds job {job} after a failed launch ({HELD_REASON})" in text
        and f"scontrol release {job}" in text
    ), text

    passed = sandbox.run([*dispatch, "supervise"], user=sandbox.user, cwd=work)
    assert f"lifted Slurm's hold on job {job}" in passed.stdout, passed.stdout + passed.stderr
    sandbox.wait_for(
        lambda: sandbox.job_state(job).get("JobState") == "RUNNING",
        60,
        f"job {job} to run again once released",
    )
    text = sandbox.run([*dispatch, "status", job], user=sandbox.user, cwd=work).stdout
    assert f"RELEASED Slurm job {job} by dispatch supervise" in text, text
