"""dispatch status: the record joined with one Slurm view and the site's facts, as a table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch import cli, record, status, submit
from slurm_dispatch.slurm import Job, Slurm

from .fake_cluster import FakeCluster


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> record.JobRecord:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7)
    done = submit.submit_new(submit.read_request(["--checkpoint", "ck", "--resubmit", "2",
                                                  "job.sh"]), Slurm(cluster, wait=0))
    for restart, node in ((0, "n1"), (1, "n2")):
        done.job.append("started", submission=1, slurm_job_id="7", array_job_id="",
                        array_task_id="", restart=restart, attempt=f"a{restart}" * 13,
                        epoch=1_000_000 + restart, exec_dir=f"/ck/exec/a{restart}",
                        resume_from="", node=node, nodes=node, host="h", pid=1)
    return done.job


FACTS = [
    {"restart": 0, "end": {"exit_code": "0:0", "requeued": True},
     "nodes": {"n1": {"ceased": False, "survivors": [{"pid": 4242}]}}, "problems": []},
    {"restart": 1, "end": None, "nodes": {"n2": {"ceased": None}}, "problems": []},
]


def test_collect_marks_the_requeued_execution_and_joins_facts(job: record.JobRecord) -> None:
    slurm_jobs = {"7": Job("7", "RUNNING", restarts=1, reason="None", nodes=["n2"])}
    data = status.collect(job, slurm_jobs, facts_reader=lambda jobid: FACTS)
    assert [e["state"] for e in data["executions"]] == ["REQUEUED", "RUNNING"]
    assert [len(e["facts"]) for e in data["executions"]] == [1, 1]
    assert data["submissions"][0]["restarts"] == 1
    assert (data["resubmit_budget"], data["resubmits_used"]) == (2, 0)
    text = cli._render_status(data)
    assert "requeued exit 0:0, n1 SURVIVORS 4242" in text
    lines = text.splitlines()
    running = next(line for line in lines if line.startswith("7 ") and "RUNNING" in line)
    assert running.rstrip().endswith("RUNNING  -")


def test_decisions_render_as_readable_lines(job: record.JobRecord) -> None:
    job.append("hold", submission=2, slurm_job_id="8", ended_slurm_job_id="7",
               ended_restart=0, end_state="node failure", deadline=1_800_000_000.0)
    job.append("cessation", ended_slurm_job_id="7", held_slurm_job_id="8",
               verdict="not ceased", code=1, evidence={"reason": "not proven on 1 of 1: n1"})
    job.append("released", slurm_job_id="8", by="cessation signal")
    data = status.collect(job, {}, facts_reader=lambda jobid: [])
    text = cli._render_status(data)
    assert "HOLD submission 2 (Slurm job 8) after node failure of job 7, until " in text
    assert "CESSATION of job 7: not ceased (not proven on 1 of 1: n1)" in text
    assert "RELEASED Slurm job 8 by cessation signal" in text
    assert "UNKNOWN (no longer known to slurmctld)" in text


def test_status_command_json_and_unknown_job(job: record.JobRecord,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    monkeypatch.setattr("slurm_dispatch.slurm.Slurm.own_jobs", lambda self: {})
    runner = CliRunner()
    result = runner.invoke(cli.main, ["status", "--json", job.id])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["id"] == job.id
    by_slurm_id = runner.invoke(cli.main, ["status", "--json", "7"])
    assert json.loads(by_slurm_id.stdout)["id"] == job.id
    missing = runner.invoke(cli.main, ["status", "dnope"])
    assert missing.exit_code == 2 and "no dispatch job 'dnope'" in missing.stderr
