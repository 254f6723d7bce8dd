"""Issue 33 item 1: no progress, no more restarts.  After --max-no-progress executions in a
row that published nothing past the save each resumed from, the supervisor restarts the job no
more: Slurm's requeued job is held, an ended one is not resubmitted; `dispatch status` names the
executions and the save they started from; a person's release or resubmission goes on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.checkpoint import progress
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.control import events, plan, record, rules, status, status_text, submit
from slurm_dispatch.control.holds import release
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm

from .fake_cluster import FakeCluster


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(tmp_path / "none.conf"))
    (tmp_path / "none.conf").write_text("")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    return tmp_path


def new_job(cluster: FakeCluster, *options: str) -> record.JobRecord:
    done = submit.submit_new(submit.read_request(["--checkpoint", "ck", *options, "job.sh"]),
                             Slurm(cluster, wait=0))
    return done.job


def start(job: record.JobRecord, restart: int = 0, publish: tuple[int, ...] = (),
          submission: Optional[int] = None) -> str:
    """Record an execution's start as the launcher does, resuming from the root's latest
    publication, and publish saves of ``publish``'s steps from its folder; its folder."""
    root = job.spec["checkpoint"]
    sub = job.history().submissions[-1] if submission is None else \
        job.history().lineage().submission(submission)
    assert sub is not None
    attempt = f"a{sub.submission}r{restart}"
    folder = os.path.join(root, "exec", attempt)
    os.makedirs(folder)
    latest = store.latest(root)
    epoch = sub.submission * 10**6 + restart
    job.append(events.Started, submission=sub.submission, slurm_job_id=sub.slurm_job_id,
               restart=restart, attempt=attempt, epoch=epoch, exec_dir=folder,
               resume_from=latest.path if latest else "", node="n1")
    for step in publish:
        save = os.path.join(folder, f"checkpoint-{step}")
        os.makedirs(save)
        store.publish(root, epoch, step, save)
    return folder


def last_id(job: record.JobRecord) -> str:
    return str(job.submissions()[-1]["slurm_job_id"])


def test_progress_is_a_publication_past_the_save_resumed_from() -> None:
    assert progress.went_on(None, "", [("e/a/checkpoint-1", 1)])  # a fresh start's first save
    assert not progress.went_on(None, "", [])  # published nothing
    assert progress.went_on(10, "e/a/checkpoint-10", [("e/b/checkpoint-11", 11)])
    # Back at or below the save it loaded (torchtitan's model-only load): no progress.
    assert not progress.went_on(10, "e/a/checkpoint-10", [("e/b/checkpoint-5", 5),
                                                          ("e/b/checkpoint-10", 10)])
    # accelerate's save index is no step: any save counts.
    assert progress.went_on(10, "e/a/checkpoint-10", [("e/b/checkpoint_0", 0)])
    assert rules.stalled([True, False, False], 2) and not rules.stalled([False, True], 2)
    assert not rules.stalled([False], 2) and not rules.stalled([False, False], 0)


def test_an_ended_job_that_makes_no_progress_is_not_resubmitted(home: Path) -> None:
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--max-no-progress", "2")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, publish=(10,))  # progress: a fresh start's first save
    cluster.set(last_id(job), JobState="FAILED")
    assert "resubmitted as submission 2" in sup.run_pass().actions[0]
    start(job)  # resumes from checkpoint-10, crashes before publishing
    cluster.set(last_id(job), JobState="FAILED")
    assert "resubmitted as submission 3" in sup.run_pass().actions[0]  # one in a row
    start(job, publish=(7,))  # went backwards: nothing past step 10
    cluster.set(last_id(job), JobState="FAILED")
    report = sup.run_pass()
    assert len(cluster.sbatch_calls()) == 3, report.actions
    said = report.actions[0]
    assert "failed: stop: 2 execution(s) in a row (S2 R0, S3 R0) published nothing past " \
        "the save they resumed from" in said and "checkpoint-10" in said
    assert f"`dispatch resubmit {job.id}`" in said
    stop = job.history().of(events.NoProgress)
    assert len(stop) == 1 and stop[0].action == "not resubmitted"
    assert [e[:2] for e in stop[0].executions] == [[2, 0], [3, 0]]
    assert stop[0].resumed_from[0].endswith("exec/a1r0/checkpoint-10")
    assert job.history().settled and sup.run_pass().actions == []
    data = status.collect(job, {}, facts_reader=lambda _: [])
    text = status_text.render(data)
    assert "NO-PROGRESS 2 execution(s) in a row (S2 R0, S3 R0)" in text, text
    # A person's resubmission goes on.
    submit.resubmit(Slurm(cluster, wait=0), job)
    assert len(cluster.sbatch_calls()) == 4


def test_a_job_that_crashes_before_its_first_save_stops_after_the_limit(home: Path) -> None:
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "9")  # the default limit: 3
    assert job.spec["max_no_progress"] == 3
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    for _ in (1, 2, 3):
        start(job)
        cluster.set(last_id(job), JobState="FAILED")
        sup.run_pass()
    assert len(cluster.sbatch_calls()) == 3
    assert job.history().of(events.NoProgress)[0].resumed_from == [""]
    assert "nothing (a fresh start)" in job.history().of(events.Finished)[-1].rule


def test_slurms_requeued_job_is_held_until_a_person_releases_it(home: Path) -> None:
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "2")
    slurm_id = last_id(job)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, restart=0)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    assert sup.run_pass().actions == []  # one execution: not yet the limit
    start(job, restart=1)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="2")
    report = sup.run_pass()
    assert ["scontrol", "hold", slurm_id] in cluster.calls
    assert cluster.jobs[slurm_id]["Reason"] == "JobHeldUser"
    assert f"Slurm job {slurm_id} is held: `dispatch release {job.id}`" in report.actions[0]
    assert sup.run_pass().actions == []  # recorded once
    line = job.history().lineage()
    assert line.stopped is not None and line.stopped.action == "held"
    data = status.collect(job, {k: v for k, v in Slurm(cluster, wait=0).own_jobs().items()},
                          facts_reader=lambda _: [])
    assert "No progress" in status_text.render(data)
    # A person's release goes on, and the next pass does not hold it again.
    assert release(Slurm(cluster, wait=0), job) == slurm_id
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime")
    assert sup.run_pass().actions == []
    assert cluster.calls.count(["scontrol", "hold", slurm_id]) == 1
    assert job.history().lineage().stopped is None


def test_a_pass_killed_after_the_hold_records_it(home: Path) -> None:
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "1")
    slurm_id = last_id(job)
    start(job)
    cluster.set(slurm_id, JobState="PENDING", Reason="JobHeldUser", Restarts="1")
    Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert ["scontrol", "hold", slurm_id] not in cluster.calls
    assert job.history().of(events.NoProgress)[0].action == "held"


def test_the_option_its_default_and_the_plan(home: Path) -> None:
    assert "no more restarts" in plan.describe(submit.read_request(["--checkpoint", "ck",
                                                                     "job.sh"]))
    text = plan.describe(submit.read_request(["--checkpoint", "ck", "--max-no-progress", "0",
                                              "job.sh"]))
    assert "(--max-no-progress 0)" in text
    (home / "d.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck --max-no-progress 5\n")
    assert submit.read_request(["d.sh"]).options.max_no_progress == 5
    assert "after 5 execution(s) in a row" in plan.describe(submit.read_request(["d.sh"]))
    with pytest.raises(UsageError, match="--max-no-progress 'x' is not a number"):
        submit.read_request(["--checkpoint", "ck", "--max-no-progress", "x", "job.sh"])
    with pytest.raises(UsageError, match="outside 0..999999"):
        submit.read_request(["--checkpoint", "ck", "--max-no-progress=-1", "job.sh"])


def test_an_old_record_without_the_option_is_restarted_as_before(home: Path) -> None:
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "2")
    spec = dict(job.spec)
    del spec["max_no_progress"]
    path = os.path.join(job.path, "job.json")
    os.chmod(path, 0o644)
    Path(path).write_text(__import__("json").dumps(spec))
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    for _ in range(3):
        start(job)
        cluster.set(last_id(job), JobState="FAILED")
        sup.run_pass()
    assert len(cluster.sbatch_calls()) == 3
    assert not job.history().of(events.NoProgress)
