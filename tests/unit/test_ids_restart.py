"""Job ids that start again (docs/invariants.md, 1): a controller that lost its state numbers new
jobs from its FirstJobId again, so a recorded Slurm job id may name another job, and the hooks'
facts under that id hold two jobs' runs.  Where Slurm gives each execution a SLUID (26.05), the
launcher records it with the execution's start and the hooks with their facts, and the readers
tell the runs apart by it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.control import events, holds, naming, record, status, status_text, submit
from slurm_dispatch.execution import launch
from slurm_dispatch.node.executions import group_executions
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster

if TYPE_CHECKING:
    from typing import Unpack

    from slurm_dispatch.node.factstore import Fact

OLD, NEW = "s8V5M96ZGZQA00", "s8V5M96ZH42Y00"


def fact(kind: str, token: str, when: float, sluid: str, /, **extra: Unpack[Fact]) -> Fact:
    return {
        "v": 1,
        "kind": kind,
        "node": "n1",
        "restart": 0,
        "token": token,
        "time": when,
        "uid": 1000,
        "gid": 1000,
        "job_id": "7",
        "sluid": sluid,
        "boot_id": "b",
        **extra,
    }


# Under Slurm job id 7 on n1: the dispatch job's execution (SLUID OLD), which ended with
# nothing left; then, the controller's state lost, another job of the user's under the same
# id (SLUID NEW), still running.
FACTS = [
    fact("start", "01", 1.0, OLD),
    fact(
        "end",
        "01",
        2.0,
        OLD,
        start_token="01",
        survivors=[],
        scan_error=None,
        slurm={"SLURM_JOB_EXIT_CODE2": "0:0"},
    ),
    fact("start", "03", 3.0, NEW),
]


def test_two_jobs_under_one_id_are_two_executions_by_their_sluid() -> None:
    grouped = group_executions("7", FACTS, [])
    assert [(e["restart"], e.get("sluid")) for e in grouped] == [(0, OLD), (0, NEW)]
    old, new = grouped
    assert old["nodes"]["n1"]["start"]["token"] == "01" and old["nodes"]["n1"]["ceased"]
    assert new["nodes"]["n1"]["start"]["token"] == "03"
    assert new["nodes"]["n1"]["end"] is None and new["nodes"]["n1"]["ceased"] is None


def test_facts_without_a_sluid_group_by_restart_count_as_before() -> None:
    plain = [f.copy() for f in FACTS[:2]]
    for f in plain:
        f.pop("sluid", None)
    grouped = group_executions("7", plain, [])
    assert len(grouped) == 1 and "sluid" not in grouped[0]
    assert grouped[0]["nodes"]["n1"]["ceased"] is True


def test_status_shows_its_own_executions_facts_after_the_ids_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7)
    slurm = Slurm(cluster, wait=0)
    done = submit.submit_new(submit.read_request(["--checkpoint", "ck", "job.sh"]), slurm)
    assert done.slurm_job_id == "7"
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_SLUID": OLD}
    done.job.append(
        "started",
        submission=1,
        slurm_job_id="7",
        restart=0,
        attempt="a" * 26,
        epoch=1_000_000,
        exec_dir="/ck/exec/a",
        node="n1",
        nodes="n1",
        host="h",
        pid=1,
        **launch.execution_sluid(env),
    )
    cluster.set("7", JobState="COMPLETED")
    cluster.lose_state()
    other = cluster.add("RUNNING", NodeList="n1")  # a plain job of the user's
    assert other == "7"
    job = record.JobRecord(done.job.path)
    data = status.collect(
        job, slurm.own_jobs(), facts_reader=lambda jobid: group_executions(jobid, FACTS, [])
    )
    [execution] = data["executions"]
    assert [f.get("sluid") for f in execution["facts"]] == [OLD]
    assert execution["facts"][0]["nodes"]["n1"]["ceased"] is True
    assert execution["state"] != "RUNNING"
    text = status_text.render(data)
    assert "n1 ceased" in text, text


def test_the_launcher_records_a_plain_sluid_only() -> None:
    assert launch.execution_sluid({"SLURM_JOB_SLUID": OLD}) == {"sluid": OLD}
    for value in ("", "s8/../x", "x" * 65):
        assert launch.execution_sluid({"SLURM_JOB_SLUID": value}) == {}
    assert launch.execution_sluid({}) == {}


def test_a_ceased_answer_about_another_run_of_the_job_id_lifts_no_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor asks the CessationSignal about the execution a hold waits for by job id
    and count; once ids started again, dispatch-cease judged the id's latest run, another
    job's, and its "ceased" lifted the hold beside a live writer.  The answer names the run
    it judged (its SLUID): another than the one the launcher recorded is an error naming the
    run to ask about."""
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7)
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(cluster, wait=0)
    )
    done.job.append(
        "started",
        submission=1,
        slurm_job_id="7",
        restart=0,
        attempt="a" * 26,
        epoch=1_000_000,
        exec_dir="/ck/exec/a",
        node="n1",
        nodes="n1",
        host="h",
        pid=1,
        sluid=OLD,
    )
    hold = done.job.append(
        events.Hold,
        submission=2,
        slurm_job_id="8",
        ended_slurm_job_id="7",
        ended_restart=0,
        deadline=2e9,
        end_state="NODE_FAIL",
    )
    assert isinstance(hold, events.Hold)

    def ask(run: str) -> holds.Asked:
        [one] = holds.ask(
            done.job,
            hold,
            "dispatch-cease",
            5.0,
            lambda argv, timeout: holds.Answer("ceased", 0, {"uid": os.getuid(), "sluid": run}),
            lambda: 1.0,
            None,
        )
        return one

    other = ask(NEW)
    assert other.answer.verdict == "error"
    assert f"--sluid {OLD}" in json.dumps(other.answer.evidence)
    assert ask(OLD).answer.verdict == "ceased"


def _submitted_with_own_comment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> tuple[FakeCluster, Slurm, submit.SubmissionMade]:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7, version=version)
    slurm = Slurm(cluster, wait=0)
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "--comment=my own note", "job.sh"]), slurm
    )
    assert done.slurm_job_id == "7"
    assert not cluster.jobs["7"]["Comment"].startswith("dispatch:")  # no marker to go by
    return cluster, slurm, done


def _another_job_under_the_id(cluster: FakeCluster) -> str:
    """The controller loses its state within SUBMIT_SLACK of the submission; a plain job of
    the user's, submitted just now with a comment of its own too, gets the id again."""
    cluster.lose_state()
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    other = cluster.add("RUNNING", "my own note", NodeList="n1", SubmitTime=now)
    assert other == "7"
    return other


def test_a_submission_with_the_users_own_comment_is_told_from_another_job_by_its_sluid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a marker (the user gave --comment), a Slurm job under the submission's id was
    the submission when Slurm took it within SUBMIT_SLACK: after the controller lost its
    state, `dispatch cancel` cancelled the user's other job under the id, `dispatch jobs` and
    status showed it as the dispatch job's.  On 26.05 the submission records the job's SLUID
    right after sbatch (squeue by id), and the readers tell the jobs apart by it."""
    cluster, slurm, done = _submitted_with_own_comment(tmp_path, monkeypatch, "26.05.5")
    job = record.JobRecord(done.job.path)
    assert submit.live_slurm_jobs(slurm, job) == ["7"]  # before: the submission itself
    sluid = cluster.jobs["7"]["SLUID"]
    _another_job_under_the_id(cluster)
    assert submit.cancel_job(slurm, job) == []
    assert cluster.jobs["7"]["JobState"] == "RUNNING"
    assert naming.wants_sluids([job])
    views = slurm.own_jobs(sluids=True)  # as `dispatch jobs` and the supervisor read them
    assert views["7"].sluid == cluster.jobs["7"]["SLUID"] != sluid
    assert naming.own_views(job, views) == {}
    data = status.collect(job, views, facts_reader=lambda jobid: [])
    assert "RUNNING" not in json.dumps(data["submissions"]), data["submissions"]
    [sub] = done.job.history().of(events.Submitted)
    assert sub.sluid == sluid and data["submissions"][0]["sluid"] == sluid


def test_a_requeued_submission_under_a_new_sluid_is_still_the_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, slurm, done = _submitted_with_own_comment(tmp_path, monkeypatch, "26.05.5")
    cluster.set("7", SLUID="s8V5M96ZZZZZ99", Restarts="1", JobState="PENDING")
    assert submit.live_slurm_jobs(slurm, record.JobRecord(done.job.path)) == ["7"]


def test_before_26_05_no_sluid_is_asked_for_and_times_decide_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, slurm, done = _submitted_with_own_comment(tmp_path, monkeypatch, "24.11.5")
    [sub] = done.job.history().of(events.Submitted)
    assert getattr(sub, "sluid", "") == ""
    assert not any("SLUID" in " ".join(c) for c in cluster.calls)
    _another_job_under_the_id(cluster)
    # The release gives nothing to tell them apart: within SUBMIT_SLACK the job is taken
    # for the submission, as before.
    assert submit.live_slurm_jobs(slurm, record.JobRecord(done.job.path)) == ["7"]


def _two_jobs_under_id_7(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeCluster, Slurm, record.JobRecord, record.JobRecord]:
    """Dispatch job A submitted as Slurm job 7 from a login node whose clock runs an hour
    ahead; the controller loses its state; dispatch job B is then submitted, as job 7 again."""
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7, version="26.05.5")
    slurm = Slurm(cluster, wait=0)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    a = submit.submit_new(submit.read_request(["--checkpoint", "ck", "job.sh"]), slurm)
    monkeypatch.setattr(time, "time", real)
    cluster.lose_state()
    b = submit.submit_new(submit.read_request(["--checkpoint", "ck2", "job.sh"]), slurm)
    assert a.slurm_job_id == b.slurm_job_id == "7"
    return cluster, slurm, record.JobRecord(a.job.path), record.JobRecord(b.job.path)


def test_status_of_a_slurm_id_two_dispatch_jobs_had_opens_the_one_slurm_runs_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dispatch status 7` went by the records' times alone: with A's record made on a clock
    ahead, it showed A while Slurm's job 7 is B's submission.  Slurm's view of the id (its
    marker, else its SLUID) decides; times only where Slurm knows the id no more."""
    cluster, slurm, a, b = _two_jobs_under_id_7(tmp_path, monkeypatch)
    assert a.created > b.created
    chosen = status.open_job("7", slurm.own_jobs(sluids=True))
    assert chosen.id == b.id
    cluster.lose_state()  # Slurm knows job 7 no more: the newest record, as before
    assert status.open_job("7", slurm.own_jobs(sluids=True)).id == a.id


def test_status_opens_a_job_by_the_sluid_of_its_submission_or_execution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On 26.05 squeue and sacct show SLUIDs; one names a single run, so `dispatch status
    <SLUID>` opens the dispatch job it belongs to (a submission's or an execution's)."""
    cluster, slurm, a, b = _two_jobs_under_id_7(tmp_path, monkeypatch)
    b.append(
        "started",
        submission=1,
        slurm_job_id="7",
        restart=0,
        attempt="b" * 26,
        epoch=2_000_000,
        exec_dir="/ck2/exec/b",
        node="n1",
        nodes="n1",
        host="h",
        pid=1,
        sluid=NEW,
    )
    assert status.open_job(NEW, {}).id == b.id
    with pytest.raises(Exception, match=OLD):
        status.open_job(OLD, {})
