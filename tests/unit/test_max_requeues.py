"""Slurm's requeues (node failure, preemption) on a budget of their own (docs/user-guide.md).
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

from ..fakes.cluster import FakeCluster
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
    assert report.actions == [
        f"{job.id}: Slurm requeued it 2 time(s), past its "
        f"--max-requeues 1: Slurm job {slurm_id} is held; "
        f"`dispatch release {job.id}` lets it run"
    ]
    assert cluster.jobs[slurm_id]["Reason"] == "JobHeldUser"
    assert sup.run_pass().actions == []  # once
    text = status_text.render(
        status.collect(job, Slurm(cluster, wait=0).own_jobs(), facts_reader=lambda _: [])
    )
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
    said = {
        budget: plan.describe(
            submit.read_request(
                ["--checkpoint", "ck", *(["--max-requeues", budget] if budget else []), "job.sh"]
            )
        )
        for budget in ("", "4")
    }
    assert (
        "  requeues       Slurm's requeues (node failure, preemption) are not budgeted" in said[""]
    )
    assert (
        "  requeues       budget 4, apart from --resubmit: past 4 of Slurm's requeues" in said["4"]
    )
    with pytest.raises(UsageError, match="--max-requeues 'many' is not a number"):
        submit.read_request(["--checkpoint", "ck", "--max-requeues", "many", "job.sh"])


def test_the_jobs_own_requeues_at_its_warning_signal_are_not_counted(home: Path) -> None:  # noqa: F811
    """Found attacking the requeue budget: a job that goes past its time limit by its own requeue at
    the warning signal (the integrations save, publish, then `scontrol requeue`) was counted as
    bouncing: with --max-requeues 1 its third chunk was held, each chunk having gone on.  Its
    own requeues, marked by the integration in the execution's folder, are not counted."""
    from slurm_dispatch.checkpoint import execdir

    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "1", "--max-no-progress", "0")
    slurm_id = last_id(job)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    for restart in (0, 1, 2):
        folder = start(job, restart=restart, publish=(10 * (restart + 1),))
        Path(folder, execdir.REQUEUED).write_text('{"save": "x"}')
        cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts=str(restart + 1))
        assert sup.run_pass().actions == [], restart
    assert not job.history().of(events.RequeuesSpent)
    start(job, restart=3)  # preempted: Slurm's requeue, the first one counted
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="4")
    assert sup.run_pass().actions == []
    start(job, restart=4)  # preempted again: past the budget of 1
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="5")
    said = sup.run_pass().actions
    assert said and "Slurm requeued it 2 time(s), past its --max-requeues 1" in said[0], said


def test_the_budget_comes_before_the_no_progress_stop_and_a_refused_hold_is_tried_again(
    home: Path,  # noqa: F811
) -> None:
    """Past --max-requeues with no progress either: the budget's hold is the one made (a
    refused hold is said, nothing recorded, and tried again), and once a person released
    it, no stop for want of progress holds that requeue again."""
    from .test_no_progress import only_error, refusing

    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "1", "--max-no-progress", "2")
    slurm_id = last_id(job)
    refused = [False]
    sup = Supervisor(refusing(cluster, "hold", refused), Settings())
    start(job, restart=0)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    assert sup.run_pass().actions == []
    start(job, restart=1)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="2")
    refused[0] = True
    only_error(
        sup,
        f"{job.id}: its --max-requeues 1 is spent, but Slurm job {slurm_id} could not be held: ",
    )
    assert not job.history().of(events.RequeuesSpent)
    refused[0] = False
    report = sup.run_pass()
    assert "past its --max-requeues 1" in report.actions[0], report.actions
    assert len(report.actions) == 1
    assert job.history().of(events.RequeuesSpent)
    assert not job.history().of(events.NoProgress)
    assert release(Slurm(cluster, wait=0), job) == slurm_id
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime")
    assert sup.run_pass().actions == []
    assert not job.history().of(events.NoProgress)
    assert cluster.calls.count(["scontrol", "hold", slurm_id]) == 2
