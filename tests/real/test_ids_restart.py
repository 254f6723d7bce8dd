"""Real tier: job ids that start again (docs/invariants.md, 1), on a release with SLUIDs (26.05).

A controller restarted with its StateSaveLocation wiped numbers jobs from its FirstJobId again,
so the Slurm job id a dispatch record holds names another job, and a node's facts under that
id hold both jobs' runs of restart 0.  The launcher records the execution's SLURM_JOB_SLUID and
the hooks their facts' SLUIDs: dispatch status shows the execution its own run's facts, and
dispatch-cease judges the run ``--sluid`` names.  A submission without its marker (the user's
own --comment) records its job's SLUID, and dispatch cancel and dispatch jobs leave another
job under its id alone.  On a release without SLUIDs (before 26.05) the tests say so and skip.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.conftest import (
    empty_controller_state,
    next_job_id,
    recorded_job_ids,
    restore_controller_state,
)
from tests.real.test_dispatch_sbatch import Workdir, wait_executions

pytestmark = pytest.mark.real
work = sbatch_tests.work  # the fixture, used by name

SLUID_RELEASE = (26, 5)
QUICK = "#!/bin/bash\necho done\n"
SLEEPER = "#!/bin/sh\nsleep 600\n"


def _sluid_or_skip(sandbox: Any) -> None:
    version = sandbox.run(["sbatch", "--version"]).stdout.split()[-1]
    if tuple(int(part) for part in version.split(".")[:2]) < SLUID_RELEASE:
        pytest.skip(f"Slurm {version} gives no SLUID (26.05 does)")


@pytest.fixture(scope="module", autouse=True)
def _state_put_back(sandbox: Any) -> Iterator[None]:
    """After this module the controller numbers jobs on from where it was before the first
    test emptied its state: every job id the folder's records hold stays behind it, so the
    next session in this folder (CI keeps them) never reads another job's facts as its own."""
    yield
    restore_controller_state(sandbox)
    probe, recorded = next_job_id(sandbox), max(recorded_job_ids(sandbox), default=0)
    assert probe > recorded, (probe, recorded)


def _controller_state_lost(sandbox: Any) -> None:
    """slurmctld restarted with its StateSaveLocation emptied (kept aside until the module's
    end): it knows no job and numbers new ones from FirstJobId again."""
    empty_controller_state(sandbox)


def _ids_from_the_start(work: Workdir) -> tuple[Any, str]:
    """The sandbox (one with SLUIDs, else the test skips) whose controller numbers jobs from
    FirstJobId again, and the node a test's jobs run on."""
    sandbox: Any = work.sandbox
    _sluid_or_skip(sandbox)
    _controller_state_lost(sandbox)
    return sandbox, sandbox.nodes[0]


def _cease(work: Workdir, slurm_id: str, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = work.run("dispatch-cease", slurm_id, "--restart", "0", "--json", *extra, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_after_the_controller_lost_its_state_each_run_of_a_job_id_is_told_by_its_sluid(
    work: Workdir,
) -> None:
    sandbox, node = _ids_from_the_start(work)
    work.write("quick.sh", QUICK)
    job, slurm_id = work.submit("--checkpoint", "ck", "-w", node, "-o", "out-%j.txt", "quick.sh")
    [first] = wait_executions(work, job, 1)
    ours = first["sluid"]
    assert ours.startswith("s") and ours.isalnum(), first
    sandbox.wait_for(lambda: _cease(work, slurm_id)[0] == 0, 60, "the execution proven ceased")
    # A supervisor pass while slurmctld still knows the job records its end: the job is over
    # (the pass reads every record of the user, other tests' too: only this job's lines count).
    work.run("dispatch", "supervise", check=False)
    _controller_state_lost(sandbox)
    # A plain job of the same user, under the same id, on the same node: still running.
    other = sandbox.submit(SLEEPER, "-w", node, "-o", "/dev/null")
    assert other == slurm_id
    sandbox.wait_for(
        lambda: sandbox.job_state(other).get("JobState") == "RUNNING", 60, "the other job running"
    )
    theirs = sandbox.run(["squeue", "-h", "-o", "%s", "-j", other]).stdout.strip()
    assert theirs and theirs != ours

    def facts_seen() -> list[Any]:
        [execution] = work.status(job)["executions"]
        return [f for f in execution["facts"] if f.get("nodes", {}).get(node, {}).get("start")]

    sandbox.wait_for(
        lambda: _cease(work, slurm_id)[1].get("sluid") == theirs,
        60,
        "the other job's run recorded under the id",
    )
    [facts] = facts_seen()
    assert facts["sluid"] == ours and facts["nodes"][node]["ceased"] is True, facts
    [execution] = work.status(job)["executions"]
    assert execution["sluid"] == ours and execution["state"] != "RUNNING", execution
    # The SLUID squeue showed names the dispatch job's run, whatever the job ids did.
    assert work.status(ours)["id"] == job
    # dispatch-cease judges the run asked about; without --sluid, the id's latest (running).
    code, verdict = _cease(work, slurm_id, "--sluid", ours)
    assert code == 0 and verdict["sluid"] == ours, verdict
    code, verdict = _cease(work, slurm_id)
    assert code == 1 and verdict["sluid"] == theirs and "has not ended" in verdict["reason"]
    # The supervisor leaves the finished job alone: the other job under its id is not its own.
    passed = work.run("dispatch", "supervise", check=False)
    assert not [line for line in (passed.stdout + passed.stderr).splitlines() if job in line]


def test_a_submission_with_the_users_own_comment_is_told_by_its_sluid_after_ids_restart(
    work: Workdir,
) -> None:
    """Without a marker (the user's own --comment) the submission records its job's SLUID,
    read right after sbatch; once the controller lost its state and another job of the
    user's got the id, dispatch cancel leaves that job alone and dispatch jobs does not show
    its state as the dispatch job's."""
    sandbox, node = _ids_from_the_start(work)
    work.write("sleeper.sh", SLEEPER)
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "-w", node, "-o", "/dev/null", "--comment=my own note", "sleeper.sh"
    )
    ours = sandbox.run(["squeue", "-h", "-O", "SLUID", "-j", slurm_id]).stdout.strip()
    [made] = work.status(job)["submissions"]
    assert ours and made.get("sluid") == ours, made
    _controller_state_lost(sandbox)
    other = sandbox.submit(SLEEPER, "-w", node, "-o", "/dev/null", "--comment=my own note")
    assert other == slurm_id
    sandbox.wait_for(
        lambda: sandbox.job_state(other).get("JobState") == "RUNNING", 60, "the other job running"
    )
    cancelled = work.run("dispatch", "cancel", job)
    assert "has no active Slurm job" in cancelled.stdout, cancelled.stdout
    assert sandbox.job_state(other).get("JobState") == "RUNNING"
    listed = work.run("dispatch", "jobs", "--json")
    [mine] = [j for j in json.loads(listed.stdout) if j.get("id") == job]
    assert "RUNNING" not in json.dumps(mine), mine
    sandbox.run(["scancel", other])
