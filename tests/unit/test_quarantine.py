"""Issue 33 item 2: a poisoned save is passed over.  After --quarantine-after executions in a
row resumed from one save and failed before publishing anything, the supervisor quarantines it
(a create-once mark in the root); the next execution's resume falls back past it and says so;
`dispatch status` and `dispatch list` show it; `dispatch unquarantine` lifts it; cleanup keeps
it while it is the latest publication."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import gc, quarantine
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.cli.dispatch import main
from slurm_dispatch.control import events, plan, status, status_text, submit
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.execution import launch
from slurm_dispatch.slurm.adapter import Slurm

from .fake_cluster import FakeCluster
from .test_no_progress import home, last_id, new_job, start  # noqa: F401 - the fixture


def test_a_save_every_resume_from_which_fails_is_quarantined_and_passed_over(
        home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5")  # the defaults: 2, and 3 without progress
    assert (job.spec["quarantine_after"], job.spec["max_no_progress"]) == (2, 3)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, publish=(10, 20))
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    for _ in (1, 2):  # two executions from checkpoint-20, each failing before any save
        assert start(job) and job.history().of(events.Started)[-1].resume_from.endswith(
            "checkpoint-20")
        cluster.set(last_id(job), JobState="FAILED")
        report = sup.run_pass()
    root = job.spec["checkpoint"]
    twenty = os.path.join(root, "exec", "a1r0", "checkpoint-20")
    assert any(a.startswith(f"{job.id}: quarantined {twenty}: 2 execution(s) in a row "
                            "(S2 R0, S3 R0) resumed from it") for a in report.actions), report
    assert "resubmitted as submission 4" in report.actions[-1]  # 2 without progress, not 3
    (event,) = job.history().of(events.Quarantined)
    assert event.save == twenty and event.root == root
    assert sup.run_pass().actions == []  # once
    # The next execution falls back past it, and says so.
    said: list[str] = []
    values = launch.identity(job, 4, {"SLURM_JOB_ID": "9"}, said)
    assert values["DISPATCH_RESUME_FROM"] == os.path.join(root, "exec", "a1r0", "checkpoint-10")
    assert said == [f"passed over quarantined save(s) {twenty}; `dispatch unquarantine SAVE` "
                    "lifts a mark"]
    record = launch.read_exec_record(values["DISPATCH_EXEC_DIR"])
    assert record["passed_over_quarantined"] == [twenty]
    text = status_text.render(status.collect(job, {}, facts_reader=lambda _: []))
    assert f"Quarantined {twenty}: passed over" in text
    assert f"`dispatch unquarantine --root {root} {twenty}` lifts it" in text
    assert "QUARANTINED " + twenty in text


def test_a_save_whose_executions_published_or_were_preempted_is_not_quarantined(
        home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, publish=(10,))
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    start(job, publish=(11,))  # went on from checkpoint-10
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    start(job)  # from checkpoint-11, nothing
    cluster.set(last_id(job), JobState="TIMEOUT")  # a time limit is no save's doing
    sup.run_pass()
    start(job)
    cluster.set(last_id(job), JobState="TIMEOUT")
    sup.run_pass()
    assert not job.history().of(events.Quarantined)
    assert not quarantine.located(store.open_store(job.spec["checkpoint"]))


def test_cleanup_keeps_a_quarantined_latest_and_the_commands(home: Path) -> None:  # noqa: F811
    root = home / "ck"
    for step in (10, 20, 30):
        save = root / "exec" / "a" / f"checkpoint-{step}"
        save.mkdir(parents=True)
        store.publish(str(root), 10**6, step, str(save))
    (root / "exec" / "a" / ".dispatch").write_text(json.dumps({"epoch": 10**6}))
    thirty = str(root / "exec" / "a" / "checkpoint-30")
    runner = CliRunner()
    out = runner.invoke(main, ["quarantine", "--root", str(root), thirty])
    assert out.exit_code == 0 and out.output == f"quarantined {thirty}\n"
    assert runner.invoke(main, ["quarantine", "--root", str(root)]).output == thirty + "\n"
    listed = runner.invoke(main, ["list", "--root", str(root)]).output.splitlines()
    assert listed[0].split() == ["EPOCH", "STEP", "PATH", "NOTE"]
    assert listed[-1].split()[-1] == "quarantined" and listed[1].split()[-1] == "-"
    as_json = json.loads(runner.invoke(main, ["list", "--json", "--root", str(root)]).output)
    assert [p.get("quarantined", False) for p in as_json] == [False, False, True]
    latest = runner.invoke(main, ["latest", "--root", str(root)])
    assert latest.stdout == str(root / "exec" / "a" / "checkpoint-20") + "\n"
    assert "passed over quarantined save(s)" in latest.stderr
    report = gc.collect(str(root), 1, dry_run=True)
    assert report.kept["exec/a/checkpoint-30"].startswith("quarantined, the latest")
    out = runner.invoke(main, ["unquarantine", "--root", str(root), thirty])
    assert out.output == f"lifted the quarantine of {thirty}\n"
    assert runner.invoke(main, ["latest", "--root", str(root)]).stdout == thirty + "\n"


def test_the_option_and_the_plan(home: Path) -> None:  # noqa: F811
    text = plan.describe(submit.read_request(["--checkpoint", "ck", "job.sh"]))
    assert "  poisoned save  after 2 execution(s) in a row that resumed from one save" in text
    text = plan.describe(submit.read_request(["--checkpoint", "ck", "--quarantine-after", "0",
                                              "job.sh"]))
    assert "(--quarantine-after 0)" in text
    with pytest.raises(Exception, match="--quarantine-after 'two' is not a number"):
        submit.read_request(["--checkpoint", "ck", "--quarantine-after", "two", "job.sh"])
