"""Job ids that start again (issue 29 item 8): a controller that lost its state numbers new jobs
from its FirstJobId again, so a recorded Slurm job id may name another job, and the hooks'
facts under that id hold two jobs' runs.  Where Slurm gives each execution a SLUID (26.05), the
launcher records it with the execution's start and the hooks with their facts, and the readers
tell the runs apart by it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_dispatch.control import events, holds, record, status, status_text, submit
from slurm_dispatch.execution import launch
from slurm_dispatch.node.executions import group_executions
from slurm_dispatch.slurm.adapter import Slurm

from .fake_cluster import FakeCluster

OLD, NEW = "s8V5M96ZGZQA00", "s8V5M96ZH42Y00"


def fact(kind: str, token: str, when: float, sluid: str, **extra: object) -> dict:
    return {"v": 1, "kind": kind, "node": "n1", "restart": 0, "token": token, "time": when,
            "uid": 1000, "gid": 1000, "job_id": "7", "sluid": sluid, "boot_id": "b",
            **extra}


# Under Slurm job id 7 on n1: the dispatch job's execution (SLUID OLD), which ended with
# nothing left; then, the controller's state lost, another job of the user's under the same
# id (SLUID NEW), still running.
FACTS = [
    fact("start", "01", 1.0, OLD),
    fact("end", "01", 2.0, OLD, start_token="01", survivors=[], scan_error=None,
         slurm={"SLURM_JOB_EXIT_CODE2": "0:0"}),
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
    plain = [{k: v for k, v in f.items() if k != "sluid"} for f in FACTS[:2]]
    grouped = group_executions("7", plain, [])
    assert len(grouped) == 1 and "sluid" not in grouped[0]
    assert grouped[0]["nodes"]["n1"]["ceased"] is True


def test_status_shows_its_own_executions_facts_after_the_ids_started_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7)
    slurm = Slurm(cluster, wait=0)
    done = submit.submit_new(submit.read_request(["--checkpoint", "ck", "job.sh"]), slurm)
    assert done.slurm_job_id == "7"
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_SLUID": OLD}
    done.job.append("started", submission=1, slurm_job_id="7", restart=0, attempt="a" * 26,
                    epoch=1_000_000, exec_dir="/ck/exec/a", node="n1", nodes="n1", host="h",
                    pid=1, **launch.execution_sluid(env))
    cluster.set("7", JobState="COMPLETED")
    cluster.lose_state()
    other = cluster.add("RUNNING", NodeList="n1")  # a plain job of the user's
    assert other == "7"
    job = record.JobRecord(done.job.path)
    data = status.collect(job, slurm.own_jobs(),
                          facts_reader=lambda jobid: group_executions(jobid, FACTS, []))
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
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor asks the CessationSignal about the execution a hold waits for by job id
    and count; once ids started again, dispatch-cease judged the id's latest run, another
    job's, and its "ceased" lifted the hold beside a live writer.  The answer names the run
    it judged (its SLUID): another than the one the launcher recorded is an error naming the
    run to ask about."""
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7)
    done = submit.submit_new(submit.read_request(["--checkpoint", "ck", "job.sh"]),
                             Slurm(cluster, wait=0))
    done.job.append("started", submission=1, slurm_job_id="7", restart=0, attempt="a" * 26,
                    epoch=1_000_000, exec_dir="/ck/exec/a", node="n1", nodes="n1", host="h",
                    pid=1, sluid=OLD)
    hold = done.job.append(events.Hold, submission=2, slurm_job_id="8",
                           ended_slurm_job_id="7", ended_restart=0, deadline=2e9,
                           end_state="NODE_FAIL")
    assert isinstance(hold, events.Hold)

    def ask(run: str) -> holds.Asked:
        [one] = holds.ask(done.job, hold, "dispatch-cease", 5.0,
                          lambda argv, timeout: holds.Answer(
                              "ceased", 0, {"uid": os.getuid(), "sluid": run}),
                          lambda: 1.0, None)
        return one
    other = ask(NEW)
    assert other.answer.verdict == "error"
    assert f"--sluid {OLD}" in json.dumps(other.answer.evidence)
    assert ask(OLD).answer.verdict == "ceased"
