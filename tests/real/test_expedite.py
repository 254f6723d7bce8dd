"""Real tier: Slurm's expedited requeue (25.11, ``--requeue=expedite``), as dispatch reads it.

The sandbox turns on ``SlurmctldParameters=enable_expedited_requeue`` where the release has it
(slurm_dispatch.sandbox.slurm_conf); a job asks for it itself, through dispatch-sbatch, which
passes the option to sbatch.  On a node failure Slurm requeues such a job (restart count + 1)
and shows it EXPEDITING until it starts again, at once and first in the queue; after a non-zero
exit it holds it (REQUEUE_HOLD).  dispatch must read both as Slurm means them: a submission
waiting to start again, not an execution under way, and nothing for the supervisor to resubmit.
On a release before 25.11 there is no such requeue to test: its tests say so and skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import slurm_conf as sandbox_slurm_conf
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.test_dispatch_sbatch import Workdir, wait_executions

pytestmark = pytest.mark.real
work = sbatch_tests.work  # the fixture, used by name

BLOCKER = "#!/bin/sh\nsleep 600\n"
TOY = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.2", "TOY_SAVE_EVERY": "5"}
FAILING = "#!/bin/bash\necho failing on purpose; exit 3\n"


def _expedite_or_skip(sandbox: Any) -> None:
    """Skip on a release without expedited requeue; on one with it, the sandbox enables it."""
    conf = (Path(sandbox.dir) / "etc" / "slurm.conf").read_text()
    version = sandbox.run(["sbatch", "--version"]).stdout.split()[-1]
    major = tuple(int(part) for part in version.split(".")[:2])
    if major < sandbox_slurm_conf.EXPEDITE_RELEASE:
        assert "enable_expedited_requeue" not in conf
        pytest.skip(f"Slurm {version} has no expedited requeue (25.11 added it)")
    assert "SlurmctldParameters=enable_expedited_requeue" in conf.splitlines()


def _squeue(sandbox: Any, slurm_id: str) -> tuple[str, str, str]:
    """(state, reason, nodes) of a job as squeue shows it."""
    out = sandbox.run(["squeue", "-h", "-o", "%T|%r|%N", "-j", slurm_id]).stdout.strip()
    state, reason, nodes = (out.split("|") + ["", "", ""])[:3]
    return state, reason, nodes


def _no_resubmission(work: Workdir, job: str) -> None:
    """A supervisor pass leaves ``job`` to Slurm.  The pass reads every record of the user
    (other tests' too, whose problems make it exit 2): only this job's lines count."""
    passed = work.run("dispatch", "supervise", check=False)
    said = [line for line in (passed.stdout + passed.stderr).splitlines() if job in line]
    assert not [line for line in said if "resubmitted" in line or "held" in line], said


def test_an_expedited_job_off_a_failed_node_waits_as_expediting_and_starts_first(
    work: Workdir,
) -> None:
    """A --requeue=expedite job whose node fails is requeued by Slurm and shown EXPEDITING
    while no node is free: dispatch jobs and status show it so (a submission waiting to start
    again, its execution REQUEUED), the supervisor resubmits nothing, and once a node frees it
    runs again (restart 1) from the first execution's latest save."""
    sandbox: Any = work.sandbox
    _expedite_or_skip(sandbox)
    node, others = sandbox.nodes[0], sandbox.nodes[1:]
    # The other nodes busy, so the job lands on the first and, requeued, waits for a node.
    blockers = [
        sandbox.submit(BLOCKER, "-w", other, "--exclusive", "-o", "/dev/null") for other in others
    ]
    sandbox.wait_for(
        lambda: all(_squeue(sandbox, b)[0] == "RUNNING" for b in blockers),
        60,
        "the blockers running",
    )
    job, slurm_id = work.submit(
        "--requeue=expedite",
        "--checkpoint",
        "ck",
        "--resubmit",
        "1",
        "-o",
        "out-%j.txt",
        "trainer.sh",
        env=TOY,
    )
    first = wait_executions(work, job, 1)[0]
    assert first["node"] == node
    sandbox.wait_for(lambda: store.latest(str(work.path / "ck")), 60, "a first save")
    sandbox_lib.partition(node, sandbox.dir)
    try:
        sandbox.wait_for(
            lambda: _squeue(sandbox, slurm_id)[0] == "EXPEDITING",
            90,
            "Slurm's expedited requeue off the failed node",
        )
        assert sandbox.job_state(slurm_id)["Restarts"] == "1"
        listed = work.run("dispatch", "jobs", "--state=EXPEDITING").stdout
        assert job in listed and "EXPEDITING" in listed, listed
        status = work.status(job)
        [submission] = status["submissions"]
        assert (submission["state"], submission["restarts"]) == ("EXPEDITING", 1), submission
        [execution] = status["executions"]
        assert execution["state"] == "REQUEUED", execution
        _no_resubmission(work, job)
        assert len(work.status(job)["submissions"]) == 1
        # A node frees: the expedited job takes it at once.
        sandbox.run(["scancel", blockers[0]])
        second = wait_executions(work, job, 2, timeout=60)[1]
    finally:
        sandbox_lib.heal(node, sandbox.dir)
    assert (second["restart"], second["epoch"], second["node"]) == (1, 1_000_001, others[0])
    assert second["resume_from"].startswith(first["exec_dir"] + "/checkpoint-")
    assert [s["submission"] for s in work.status(job)["submissions"]] == [1]


def test_an_expedited_job_that_fails_is_held_by_slurm_and_not_resubmitted(work: Workdir) -> None:
    """A --requeue=expedite job's non-zero exit is Slurm's requeue, held (REQUEUE_HOLD, 'job
    requeued in held state'): dispatch shows it held and the supervisor leaves it to Slurm (no
    resubmission, budget kept); `scontrol release` runs it again, restart 1."""
    sandbox: Any = work.sandbox
    _expedite_or_skip(sandbox)
    work.write("failing.sh", FAILING)
    job, slurm_id = work.submit(
        "--requeue=expedite",
        "--checkpoint",
        "ck",
        "--resubmit",
        "1",
        "-o",
        "out-%j.txt",
        "failing.sh",
    )
    sandbox.wait_for(
        lambda: _squeue(sandbox, slurm_id)[0] == "REQUEUE_HOLD",
        60,
        "Slurm's held requeue of the failed job",
    )
    _no_resubmission(work, job)
    status = work.status(job)
    [submission] = status["submissions"]
    assert (submission["state"], submission["restarts"]) == ("REQUEUE_HOLD", 1), submission
    assert status["resubmits_used"] == 0
    [execution] = status["executions"]
    assert execution["state"] == "REQUEUED", execution
    sandbox.run(["scontrol", "release", slurm_id], user=sandbox.user)
    second = wait_executions(work, job, 2, timeout=60)[1]
    assert (second["restart"], second["epoch"]) == (1, 1_000_001)
