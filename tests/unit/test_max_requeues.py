"""Issue 33 item 4: Slurm's requeues (node failure, preemption) on a budget of their own.
Past --max-requeues N requeues of a lineage, the supervisor holds the requeued job for a
person, once per requeue; `dispatch release` lets it run; the plan says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.control import events, plan, status, status_text, submit
from slurm_dispatch.control.holds import release
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm

from .fake_cluster import FakeCluster
from .test_no_progress import home, last_id, new_job, start  # noqa: F401 - the fixture


def test_requeues_past_the_budget_hold_the_job_until_a_release(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "1", "--max-no-progress", "0")
    slurm_id = last_id(job)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, restart=0)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    assert sup.run_pass().actions == []  # one requeue: within the budget
    start(job, restart=1)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="2")
    report = sup.run_pass()
    assert report.actions == [f"{job.id}: Slurm requeued it 2 time(s), past its "
                              f"--max-requeues 1: Slurm job {slurm_id} is held; "
                              f"`dispatch release {job.id}` lets it run"]
    assert cluster.jobs[slurm_id]["Reason"] == "JobHeldUser"
    assert sup.run_pass().actions == []  # once
    text = status_text.render(status.collect(job, Slurm(cluster, wait=0).own_jobs(),
                                             facts_reader=lambda _: []))
    assert "Requeues    Slurm requeued it 2 time(s), past its --max-requeues 1" in text
    assert release(Slurm(cluster, wait=0), job) == slurm_id
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime")
    assert sup.run_pass().actions == []  # released: it runs
    (held,) = job.history().of(events.RequeuesSpent)
    assert (held.used, held.budget, held.restarts) == (2, 1, 2)
    # The next requeue is past the budget again: held again.
    start(job, restart=2)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="3")
    assert "is held" in sup.run_pass().actions[0]


def test_the_option_and_the_plan(home: Path) -> None:  # noqa: F811
    said = {budget: plan.describe(submit.read_request(
        ["--checkpoint", "ck", *(["--max-requeues", budget] if budget else []), "job.sh"]))
        for budget in ("", "4")}
    assert "  requeues       Slurm's requeues (node failure, preemption) are not " \
        "budgeted" in said[""]
    assert "  requeues       budget 4, apart from --resubmit: past 4 of Slurm's " \
        "requeues" in said["4"]
    with pytest.raises(UsageError, match="--max-requeues 'many' is not a number"):
        submit.read_request(["--checkpoint", "ck", "--max-requeues", "many", "job.sh"])
