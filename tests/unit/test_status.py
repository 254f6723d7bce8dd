"""dispatch status: the record joined with one Slurm view and the site's facts, as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import record, status, status_text, submit
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.jobs import Job

from ..fakes.cluster import FakeCluster


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> record.JobRecord:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=7)
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "--resubmit", "2", "job.sh"]),
        Slurm(cluster, wait=0),
    )
    for restart, node in ((0, "n1"), (1, "n2")):
        done.job.append(
            "started",
            submission=1,
            slurm_job_id="7",
            array_job_id="",
            array_task_id="",
            restart=restart,
            attempt=f"a{restart}" * 13,
            epoch=1_000_000 + restart,
            exec_dir=f"/ck/exec/a{restart}",
            resume_from="",
            node=node,
            nodes=node,
            host="h",
            pid=1,
        )
    return done.job


FACTS: list[dict[str, Any]] = [
    {
        "restart": 0,
        "end": {"exit_code": "0:0", "requeued": True},
        "nodes": {"n1": {"ceased": False, "survivors": [{"pid": 4242}]}},
        "problems": [],
    },
    {"restart": 1, "end": None, "nodes": {"n2": {"ceased": None}}, "problems": []},
]


def test_collect_marks_the_requeued_execution_and_joins_facts(job: record.JobRecord) -> None:
    slurm_jobs = {
        "7": Job(
            "7", "RUNNING", restarts=1, reason="None", nodes=["n2"], comment=f"dispatch:{job.id}/1"
        )
    }  # the marker sbatch gave it
    data = status.collect(job, slurm_jobs, facts_reader=lambda jobid: FACTS)
    assert [e["state"] for e in data["executions"]] == ["REQUEUED", "RUNNING"]
    assert [len(e["facts"]) for e in data["executions"]] == [1, 1]
    assert data["submissions"][0]["restarts"] == 1
    assert (data["resubmit_budget"], data["resubmits_used"]) == (2, 0)
    text = status_text.render(data)
    assert "requeued exit 0:0, n1 SURVIVORS 4242" in text
    lines = text.splitlines()
    running = next(line for line in lines if line.startswith("7 ") and "RUNNING" in line)
    assert running.rstrip().endswith("RUNNING  fresh        nothing   -")


def test_decisions_render_as_readable_lines(job: record.JobRecord) -> None:
    job.append(
        "hold",
        submission=2,
        slurm_job_id="8",
        ended_slurm_job_id="7",
        ended_restart=0,
        end_state="node failure",
        deadline=1_800_000_000.0,
    )
    job.append(
        "cessation",
        ended_slurm_job_id="7",
        held_slurm_job_id="8",
        verdict="not ceased",
        code=1,
        evidence={"reason": "not proven on 1 of 1: n1"},
    )
    job.append("released", slurm_job_id="8", by="cessation signal")
    data = status.collect(job, {}, facts_reader=lambda jobid: [])
    text = status_text.render(data)
    assert "HOLD submission 2 (Slurm job 8) after node failure of job 7, until " in text
    assert "CESSATION of job 7: not ceased (not proven on 1 of 1: n1)" in text
    assert "RELEASED Slurm job 8 by cessation signal" in text
    assert "UNKNOWN (no longer known to slurmctld)" in text


def test_status_command_json_and_unknown_job(
    job: record.JobRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    monkeypatch.setattr("slurm_dispatch.slurm.adapter.Slurm.own_jobs", lambda self, **kw: {})
    runner = CliRunner()
    result = runner.invoke(cli.main, ["status", "--json", job.id])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["id"] == job.id
    by_slurm_id = runner.invoke(cli.main, ["status", "--json", "7"])
    assert json.loads(by_slurm_id.stdout)["id"] == job.id
    missing = runner.invoke(cli.main, ["status", "dnope"])
    assert missing.exit_code == 2 and "no dispatch job 'dnope'" in missing.stderr


@pytest.fixture
def array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[record.JobRecord, FakeCluster]:
    """Array 97 (tasks 97_0, 97_1, 97_2 with their own ids 97, 98, 99), each task's root
    ck/<task>; task 1 failed and was resubmitted on its own as 100_1."""
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    cluster = FakeCluster(first_id=97)
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck/%a", "--resubmit", "2", "--array=0-2", "job.sh"]),
        Slurm(cluster, wait=0),
    )
    for task in range(3):
        done.job.append(
            "started",
            submission=1,
            slurm_job_id=str(97 + task),
            array_job_id="97",
            array_task_id=str(task),
            restart=0,
            attempt=f"a{task}" * 13,
            epoch=1_000_000,
            exec_dir="/x",
            resume_from="",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    cluster.set("98", JobState="FAILED")
    from slurm_dispatch.control.supervisor import Settings, Supervisor

    Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    for task, epoch in ((0, 1_000_000), (1, 2_000_000)):
        exec_dir = tmp_path / "ck" / str(task) / "exec" / f"e{task}"
        exec_dir.mkdir(parents=True)
        (exec_dir / "save").write_text("x")
        store.publish(str(tmp_path / "ck" / str(task)), epoch, 10 + task, str(exec_dir / "save"))
    return done.job, cluster


def test_an_array_shows_each_tasks_latest_and_ids_as_slurm_shows_them(
    array: tuple[record.JobRecord, FakeCluster],
) -> None:
    """Status said "Latest publication: unreadable: checkpoint root
    '.../ck-' is not a directory" and showed task 1's job as 99_1 (its own id) not 97_1."""
    job, cluster = array
    data = status.collect(job, Slurm(cluster, wait=0).own_jobs(), facts_reader=lambda j: [])
    assert [(t["task"], t["submission"], t["display_id"], t["state"]) for t in data["tasks"]] == [
        (0, 1, "97_0", "RUNNING"),
        (1, 2, "100_1", "RUNNING"),
        (2, 1, "97_2", "RUNNING"),
    ]
    assert [t["latest"]["step"] if t["latest"] else None for t in data["tasks"]] == [10, 11, None]
    assert [e["display_id"] for e in data["executions"]] == ["97_0", "97_1", "97_2"]
    assert [(s["display_id"], s["task"]) for s in data["submissions"]] == [
        ("97", None),
        ("100_1", 1),
    ]
    text = status_text.render(data)
    assert "unreadable" not in text and "Latest publication:" not in text
    row = next(line for line in text.splitlines() if line.startswith("1 ") and "100_1" in line)
    assert "1 of 2" in row and "epoch 2000000 step 11" in row
    assert "99_1" not in text
    executions = text.split("ATTEMPT")[1]
    assert "97_1 " in executions


def test_status_of_a_tasks_own_job_id_finds_the_dispatch_job(
    array: tuple[record.JobRecord, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    job, cluster = array
    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    fake, own_jobs = Slurm(cluster, wait=0), Slurm.own_jobs
    monkeypatch.setattr(
        "slurm_dispatch.slurm.adapter.Slurm.own_jobs", lambda self, *args, **kwargs: own_jobs(fake)
    )
    runner = CliRunner()
    for ident in ("98", "97_1", "100", "100_1"):
        result = runner.invoke(cli.main, ["status", "--json", ident])
        assert result.exit_code == 0, (ident, result.output)
        assert json.loads(result.stdout)["id"] == job.id
    # A task that never recorded a start (still pending) is found through Slurm's view.
    cluster.add("PENDING", comment="", ArrayJobId="100", ArrayTaskId="1")
    pending = max(cluster.jobs, key=int)
    result = runner.invoke(cli.main, ["status", "--json", pending])
    assert result.exit_code == 0 and json.loads(result.stdout)["id"] == job.id


def test_status_says_whether_a_supervisor_passes(job: record.JobRecord) -> None:
    """--resubmit acts only when `dispatch supervise` runs; status says when
    one last passed.  Slurm's reason and ours for a submission are two columns."""
    from slurm_dispatch.control.supervisor import PassReport, mark_pass
    from slurm_dispatch.slurm.jobs import Job

    slurm_jobs = {"7": Job("7", "PENDING", reason="Resources", comment=f"dispatch:{job.id}/1")}
    text = status_text.render(status.collect(job, slurm_jobs, facts_reader=lambda j: []))
    assert "Supervisor  none has passed yet: --resubmit and holds act only while" in text
    header = next(line for line in text.splitlines() if line.startswith("SUBMISSION"))
    assert header.split() == [
        "SUBMISSION",
        "JOBID",
        "STATE",
        "RESTARTS",
        "SUBMITTED",
        "SLURM_REASON",
        "SUBMITTED_FOR",
    ]
    row = next(line for line in text.splitlines() if line.startswith("1 "))
    assert row.split()[-2:] == ["Resources", "first"]
    mark_pass(None, PassReport(), 1, job.spec.get("cluster"))  # the job's cluster's
    text = status_text.render(status.collect(job, slurm_jobs, facts_reader=lambda j: []))
    assert "Supervisor  last good pass " in text and " s ago, on " in text


def test_plan_says_the_supervisor_makes_resubmissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.control.plan import describe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    text = describe(submit.read_request(["--checkpoint", "ck", "--resubmit", "2", "job.sh"]))
    assert "Resubmissions and holds are made by `dispatch supervise`" in text


def fresh_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> submit.SubmissionMade:
    """A job submitted on root ck with no execution yet."""
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]),
        Slurm(FakeCluster(first_id=7), wait=0),
    )
    return done


def test_status_shows_what_each_execution_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An execution that published nothing is shown so, and a resumed one whose steps went
    at or below the save it resumed from is said, with the framework's option;
    accelerate's save index is never shown as a step."""
    done = fresh_job(tmp_path, monkeypatch)
    ck = tmp_path / "ck"
    saves = {"a0": "checkpoint/step-8", "a1": "checkpoint/step-2", "a3": "ckpts/checkpoint_0"}
    for restart in range(4):
        exec_dir = ck / "exec" / f"a{restart}"
        exec_dir.mkdir(parents=True)
        if f"a{restart}" in saves:
            save = exec_dir / saves[f"a{restart}"]
            save.mkdir(parents=True)
            step = int(save.name.replace("_", "-").rsplit("-", 1)[1])
            store.publish(str(ck), 1_000_000 + restart, step, str(save))
        done.job.append(
            "started",
            submission=1,
            slurm_job_id="7",
            array_job_id="",
            array_task_id="",
            restart=restart,
            attempt=f"a{restart}",
            epoch=1_000_000 + restart,
            exec_dir=str(exec_dir),
            resume_from=str(ck / "exec" / "a0" / saves["a0"]) if restart else "",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    data = status.collect(done.job, {}, facts_reader=lambda jobid: [])
    shown = [e["published"] for e in data["executions"]]
    assert [(p["count"], p["first"], p["steps_known"]) for p in shown] == [
        (1, 8, True),
        (1, 2, True),
        (0, None, True),
        (1, 0, False),
    ]
    assert [bool(p["backwards"]) for p in shown] == [False, True, False, False]
    text = status_text.render(data)
    assert [status_text.published_text(p) for p in shown] == [
        "1: step 8",
        "1: step 2 BACKWARDS",
        "nothing",
        "1: save index 0 (step not known)",
    ]
    assert (
        f"S1 R1 went backwards: step 2 ({ck}/exec/a1/checkpoint/step-2) is at or below "
        f"step 8 of the save this execution resumed from ({ck}/exec/a0/checkpoint/step-8)"
    ) in text
    assert "--checkpoint.no-initial-load-model-only" in text
    assert "nothing" in next(line for line in text.splitlines() if " a2 " in line)


def test_resumed_from_is_what_the_execution_loaded_not_only_what_the_launcher_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack on what status says an execution resumed from: the launcher names the latest save; an
    integration that finds it unloadable (torn, replaced on S3) passes it over and loads the one
    before, and records so in the execution's .dispatch-resume.json.  Status and the timeline said
    the execution resumed from the save it never loaded."""
    from slurm_dispatch.checkpoint import execdir
    from slurm_dispatch.control import timeline

    done = fresh_job(tmp_path, monkeypatch)
    root = tmp_path / "ck"
    first, second = "a0" * 13, "a1" * 13
    for attempt in (first, second):
        (root / "exec" / attempt).mkdir(parents=True)
    old, torn = root / "exec" / first / "checkpoint-400", root / "exec" / first / "checkpoint-500"
    for restart, attempt, source in ((0, first, ""), (1, second, str(torn))):
        done.job.append(
            "started",
            submission=1,
            slurm_job_id="7",
            array_job_id="",
            array_task_id="",
            restart=restart,
            attempt=attempt,
            epoch=1_000_000 + restart,
            exec_dir=str(root / "exec" / attempt),
            resume_from=source,
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    later = root / "exec" / second / "checkpoint-450"
    for epoch, save in ((1_000_000, old), (1_000_000, torn), (1_000_001, later)):
        save.mkdir()
        store.publish(str(root), epoch, int(save.name.split("-")[1]), str(save))
    (root / "exec" / second / execdir.RESUME).write_text(
        json.dumps(
            {
                "resume_from": str(old),
                "passed_over": [{"path": str(torn), "why": "torn"}],
                "launcher_resume_from": str(torn),
                "framework": "transformers",
                "attempt": second,
                "epoch": 1_000_001,
            }
        )
    )
    data = status.collect(done.job, {}, facts_reader=lambda jobid: [])
    # Step 450 is past the save it loaded (400), though not past the one passed over (500).
    assert not data["executions"][1]["published"]["backwards"], data["executions"][1]
    text = status_text.render(data)
    row = next(
        line
        for line in text.splitlines()
        if " 1 " in line and "n1" in line and "checkpoint" in line
    )
    assert "S1 R0 checkpoint-400 (passed over checkpoint-500)" in row, text
    drawn = timeline.render(data, [], width=200).splitlines()
    assert drawn[-1] == "S1 R1 resumed from S1 R0 checkpoint-400 (passed over checkpoint-500)"
