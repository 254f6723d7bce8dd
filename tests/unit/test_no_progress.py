"""No progress, no more restarts (docs/user-guide.md).  After --max-no-progress executions in a
row that published nothing past the save each resumed from, the supervisor restarts the job no
more: Slurm's requeued job is held, an ended one is not resubmitted; `dispatch status` names the
executions and the save they started from; a person's release or resubmission goes on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pytest

from slurm_dispatch.checkpoint import progress
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.control import events, plan, record, rules, status, status_text, submit
from slurm_dispatch.control.holds import release
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster


@pytest.fixture
def home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tests/unit/conftest.py's, with an empty dispatch.conf: no site settings."""
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(home / "none.conf"))
    (home / "none.conf").write_text("")
    return home


def new_job(cluster: FakeCluster, *options: str) -> record.JobRecord:
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", *options, "job.sh"]), Slurm(cluster, wait=0)
    )
    return done.job


def start(
    job: record.JobRecord,
    restart: int = 0,
    publish: tuple[int, ...] = (),
    submission: Optional[int] = None,
) -> str:
    """Record an execution's start as the launcher does, resuming from the root's latest
    publication, and publish saves of ``publish``'s steps from its folder; its folder."""
    root = job.spec["checkpoint"]
    sub = (
        job.history().submissions[-1]
        if submission is None
        else job.history().lineage().submission(submission)
    )
    assert sub is not None
    attempt = f"a{sub.submission}r{restart}"
    folder = os.path.join(root, "exec", attempt)
    os.makedirs(folder)
    latest = store.latest(root)
    epoch = sub.submission * 10**6 + restart
    job.append(
        events.Started,
        submission=sub.submission,
        slurm_job_id=sub.slurm_job_id,
        restart=restart,
        attempt=attempt,
        epoch=epoch,
        exec_dir=folder,
        resume_from=latest.path if latest else "",
        node="n1",
    )
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
    assert not progress.went_on(
        10, "e/a/checkpoint-10", [("e/b/checkpoint-5", 5), ("e/b/checkpoint-10", 10)]
    )
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
    assert (
        "failed: stop: 2 execution(s) in a row (S2 R0, S3 R0) published nothing past "
        "the save they resumed from"
        in said
        and "checkpoint-10" in said
    )
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
    data = status.collect(
        job, {k: v for k, v in Slurm(cluster, wait=0).own_jobs().items()}, facts_reader=lambda _: []
    )
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
    assert "no more restarts" in plan.describe(
        submit.read_request(["--checkpoint", "ck", "job.sh"])
    )
    text = plan.describe(
        submit.read_request(["--checkpoint", "ck", "--max-no-progress", "0", "job.sh"])
    )
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


def test_a_save_published_outside_the_execution_folder_is_progress(home: Path) -> None:
    """Found attacking the no-progress rule: only a save under the execution's folder counted as its
    own, so a job that publishes its saves elsewhere under its root (`dispatch publish` takes any
    path inside it) was stopped, each execution having gone on, as if it had published nothing."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--max-no-progress", "2")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    root = job.spec["checkpoint"]
    for n in (1, 2, 3):
        start(job)
        epoch = job.history().of(events.Started)[-1].epoch
        save = os.path.join(root, "saves", f"step-{10 * n}")
        os.makedirs(save)
        store.publish(root, epoch, 10 * n, save)
        cluster.set(last_id(job), JobState="FAILED")
        assert f"resubmitted as submission {n + 1}" in sup.run_pass().actions[0]
    assert not job.history().of(events.NoProgress)
    # dispatch status says what each published, as the supervisor judged it.
    data = status.collect(job, {}, facts_reader=lambda _: [])
    assert [e["published"]["count"] for e in data["executions"]] == [1, 1, 1]


def test_progress_counts_from_the_save_the_integration_loaded(home: Path) -> None:
    """Found attacking the no-progress rule: the launcher's choice was torn, the Trainer fell back
    to the save below it (its .dispatch-resume.json says so) and published past that one; it was
    counted as no progress (its step below the launcher's choice), and with --max-no-progress 1
    stopped."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--max-no-progress", "1")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    first = start(job, publish=(10, 20))
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    folder = start(job)  # the launcher chose checkpoint-20; it is torn
    Path(folder, ".dispatch-resume.json").write_text(
        __import__("json").dumps(
            {
                "resume_from": os.path.join(first, "checkpoint-10"),
                "passed_over": [{"path": os.path.join(first, "checkpoint-20"), "why": "torn"}],
            }
        )
    )
    save = os.path.join(folder, "checkpoint-15")
    os.makedirs(save)
    store.publish(job.spec["checkpoint"], job.history().of(events.Started)[-1].epoch, 15, save)
    cluster.set(last_id(job), JobState="FAILED")
    assert "resubmitted as submission 3" in sup.run_pass().actions[0]
    assert not job.history().of(events.NoProgress)


def test_a_hold_for_no_progress_is_lifted_once_a_late_save_shows_progress(home: Path) -> None:
    """Found attacking the no-progress rule: a node cut off keeps training and publishes after Slurm
    requeued its job (about 140 s later in the spike behind the design); the pass that saw the
    requeued job pending had counted that execution as having published nothing and held the
    job, which then waited for a person though it had gone on.  Its late save lifts the hold."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "2")
    slurm_id = last_id(job)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, restart=0)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    sup.run_pass()
    folder = start(job, restart=1)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="2")
    sup.run_pass()
    assert cluster.jobs[slurm_id]["Reason"] == "JobHeldUser"
    assert sup.run_pass().actions == []  # nothing new: still held
    save = os.path.join(folder, "checkpoint-5")
    os.makedirs(save)
    store.publish(job.spec["checkpoint"], job.history().of(events.Started)[-1].epoch, 5, save)
    report = sup.run_pass()
    assert ["scontrol", "release", slurm_id] in cluster.calls, report
    assert report.actions == [
        f"{job.id}: lifted the hold on Slurm job {slurm_id} made for "
        "want of progress: an execution it counted (S1 R0, S1 R1) has "
        "published past the save it resumed from since (a late save)"
    ], report.actions
    assert job.history().lineage().stopped is None
    cluster.set(slurm_id, Reason="BeginTime")
    assert sup.run_pass().actions == []  # not held again
    assert cluster.calls.count(["scontrol", "hold", slurm_id]) == 1


def test_a_root_that_cannot_be_listed_restarts_a_failure_and_a_completion_says_nothing(
    home: Path,
) -> None:
    """Not knowing is no proof of a loop: where the root cannot be listed, a failed execution
    is resubmitted as before and the pass says why it could not tell; an execution that
    completed is not restarted anyway, so nothing is said of its root."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--max-no-progress", "1", "--quarantine-after", "0")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    bad = Path(job.spec["checkpoint"], "pub", "not-a-publication")

    def ended(state: str) -> list[str]:
        bad.unlink(missing_ok=True)
        start(job)
        bad.parent.mkdir(exist_ok=True)
        bad.write_text("")
        cluster.set(last_id(job), JobState=state)
        report = sup.run_pass()
        assert not job.history().of(events.NoProgress)
        return report.errors

    (error,) = ended("FAILED")
    assert error.startswith(
        f"{job.id}: cannot tell whether its last 1 executions made progress, so it is "
        "restarted as before: "
    ), error
    assert len(cluster.sbatch_calls()) == 2
    assert ended("COMPLETED") == []
    assert len(cluster.sbatch_calls()) == 2 and job.history().settled


def test_a_stop_for_want_of_progress_comes_after_the_quarantine_it_also_found(
    home: Path,
) -> None:
    """Where the same executions both failed from one save and made no progress, the save is
    quarantined first (recorded, said) and then the job stops: the quarantine looks only at
    the rule's restart, not at the stop that follows it."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--max-no-progress", "2", "--quarantine-after", "2")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, publish=(10, 20))
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    for _ in (1, 2):
        start(job)
        cluster.set(last_id(job), JobState="FAILED")
        report = sup.run_pass()
    assert len(cluster.sbatch_calls()) == 3
    assert [a.split(":")[1].strip().split()[0] for a in report.actions] == [
        "quarantined",
        "failed",
    ], report.actions
    assert "failed: stop: 2 execution(s) in a row (S2 R0, S3 R0)" in report.actions[1]
    kinds = [type(e).__name__ for e in job.history().events[-3:]]
    assert kinds == ["Quarantined", "NoProgress", "Finished"], kinds


def refusing(cluster: FakeCluster, command: str, refused: list[bool]) -> Slurm:
    """The cluster behind a controller that refuses ``scontrol command`` while ``refused[0]``."""
    from slurm_dispatch.slurm.result import Result

    def run(argv: Any, *rest: Any) -> Any:
        if refused[0] and argv[:2] == ["scontrol", command]:
            cluster.calls.append(list(argv))
            return Result(list(argv), 1, "", "scontrol: error: Access/permission denied\n")
        return cluster(argv, *rest)

    return Slurm(run, wait=0, attempts=1)


def only_error(sup: Supervisor, start: str) -> None:
    """A pass that does nothing and says one error, which starts with ``start``."""
    report = sup.run_pass()
    assert report.actions == [], report.actions
    (error,) = report.errors
    assert error.startswith(start), error


def test_a_refused_hold_for_want_of_progress_is_said_and_tried_again(home: Path) -> None:
    """Slurm refusing the hold of its requeued job: the pass says so and records nothing,
    so the next pass holds it and records the stop."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "1")
    slurm_id = last_id(job)
    refused = [True]
    sup = Supervisor(refusing(cluster, "hold", refused), Settings())
    start(job)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    only_error(
        sup,
        f"{job.id}: its last 1 executions made no progress, but Slurm job {slurm_id} "
        "could not be held: ",
    )
    assert not job.history().of(events.NoProgress)
    refused[0] = False
    report = sup.run_pass()
    assert f"Slurm job {slurm_id} is held" in report.actions[0], report.actions
    assert cluster.jobs[slurm_id]["Reason"] == "JobHeldUser"
    assert job.history().of(events.NoProgress)[0].action == "held"


def test_a_refused_release_after_a_late_save_is_said_and_tried_again(home: Path) -> None:
    """The hold for want of progress whose late save shows progress, its release refused:
    the pass says so, the stop stands, and the next pass releases it."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "1")
    slurm_id = last_id(job)
    refused = [True]
    sup = Supervisor(refusing(cluster, "release", refused), Settings())
    folder = start(job)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    sup.run_pass()
    assert cluster.jobs[slurm_id]["Reason"] == "JobHeldUser"
    save = os.path.join(folder, "checkpoint-5")
    os.makedirs(save)
    store.publish(job.spec["checkpoint"], job.history().of(events.Started)[-1].epoch, 5, save)
    only_error(
        sup,
        f"{job.id}: an execution held for want of progress has published since, but "
        f"Slurm job {slurm_id} could not be released: ",
    )
    assert job.history().lineage().stopped is not None
    assert not job.history().of(events.Released)
    refused[0] = False
    report = sup.run_pass()
    assert "lifted the hold on Slurm job" in report.actions[0], report.actions
    assert job.history().lineage().stopped is None


def test_a_root_that_cannot_be_listed_leaves_slurms_requeued_job_as_it_is(home: Path) -> None:
    """Not knowing is no proof of a loop: Slurm's requeued job is not held where the root
    cannot be listed (said), and a hold made before stands while it cannot be told
    whether a late save lifted it (nothing said)."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "1")
    slurm_id = last_id(job)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    bad = Path(job.spec["checkpoint"], "pub", "not-a-publication")
    start(job)
    bad.parent.mkdir(exist_ok=True)
    bad.write_text("")
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    only_error(
        sup,
        f"{job.id}: cannot tell whether its last 1 executions made progress, so it is "
        "restarted as before: ",
    )
    assert ["scontrol", "hold", slurm_id] not in cluster.calls
    bad.unlink()
    assert "is held" in sup.run_pass().actions[0]
    bad.write_text("")
    report = sup.run_pass()
    assert (report.actions, report.errors) == ([], [])
    assert ["scontrol", "release", slurm_id] not in cluster.calls
    assert job.history().lineage().stopped is not None
