"""A poisoned save is passed over (docs/user-guide.md).  After --quarantine-after executions in a
row resumed from one save and failed before publishing anything, the supervisor quarantines it
(a create-once mark in the root); the next execution's resume falls back past it and says so;
`dispatch status` and `dispatch list` show it; `dispatch unquarantine` lifts it; cleanup keeps
it while it is the latest publication."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import gc, quarantine
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.cli.dispatch import main
from slurm_dispatch.control import events, plan, status, status_text, submit
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.execution import launch
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_no_progress import home, last_id, new_job, start  # noqa: F401 - the fixture


def test_a_save_every_resume_from_which_fails_is_quarantined_and_passed_over(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5")  # the defaults: 2, and 3 without progress
    assert (job.spec["quarantine_after"], job.spec["max_no_progress"]) == (2, 3)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, publish=(10, 20))
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    for _ in (1, 2):  # two executions from checkpoint-20, each failing before any save
        assert start(job) and job.history().of(events.Started)[-1].resume_from.endswith(
            "checkpoint-20"
        )
        cluster.set(last_id(job), JobState="FAILED")
        report = sup.run_pass()
    root = job.spec["checkpoint"]
    twenty = os.path.join(root, "exec", "a1r0", "checkpoint-20")
    assert any(
        a.startswith(
            f"{job.id}: quarantined {twenty}: 2 execution(s) in a row "
            "(S2 R0, S3 R0) resumed from it"
        )
        for a in report.actions
    ), report
    assert "resubmitted as submission 4" in report.actions[-1]  # 2 without progress, not 3
    (event,) = job.history().of(events.Quarantined)
    assert event.save == twenty and event.root == root
    assert sup.run_pass().actions == []  # once
    # The next execution falls back past it, and says so.
    said: list[str] = []
    values = launch.identity(job, 4, {"SLURM_JOB_ID": "9"}, said)
    assert values["DISPATCH_RESUME_FROM"] == os.path.join(root, "exec", "a1r0", "checkpoint-10")
    assert said == [
        f"passed over quarantined save(s) {twenty}; `dispatch unquarantine SAVE` lifts a mark"
    ]
    record = launch.read_exec_record(values["DISPATCH_EXEC_DIR"])
    assert record["passed_over_quarantined"] == [twenty]
    text = status_text.render(status.collect(job, {}, facts_reader=lambda _: []))
    assert f"Quarantined {twenty}: passed over" in text
    assert f"`dispatch unquarantine --root {root} {twenty}` lifts it" in text
    assert "QUARANTINED " + twenty in text


def test_a_save_whose_executions_published_or_were_preempted_is_not_quarantined(home: Path) -> None:  # noqa: F811
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
    text = plan.describe(
        submit.read_request(["--checkpoint", "ck", "--quarantine-after", "0", "job.sh"])
    )
    assert "(--quarantine-after 0)" in text
    with pytest.raises(Exception, match="--quarantine-after 'two' is not a number"):
        submit.read_request(["--checkpoint", "ck", "--quarantine-after", "two", "job.sh"])


def ended(cluster: FakeCluster, job: Any, sup: Supervisor, state: str, **more: str) -> list[str]:
    """The job's last submission ended ``state``: the pass's actions."""
    cluster.set(last_id(job), JobState=state, **more)
    return sup.run_pass().actions


def after_a_save(
    *options: str, steps: tuple[int, ...] = (5, 10)
) -> tuple[FakeCluster, Any, Supervisor]:
    """A job whose first execution published ``steps`` (checkpoint-10 last) and failed,
    resubmitted."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--max-no-progress", "0", *options)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    start(job, publish=steps)
    ended(cluster, job, sup, "FAILED")
    return cluster, job, sup


def test_only_failures_quarantine_a_save_not_a_time_limit_nor_a_free_restart(home: Path) -> None:  # noqa: F811
    """Found attacking the quarantine: the executions in a row were counted whatever their own end,
    so one time limit and one crash from a save quarantined it, and --restart-on-exit's
    codes (a transient error, the script says) quarantined it."""
    cluster, job, sup = after_a_save()
    start(job)  # from checkpoint-10: a time limit before its first save
    ended(cluster, job, sup, "TIMEOUT")
    start(job)  # from checkpoint-10: a crash
    ended(cluster, job, sup, "FAILED")
    assert not job.history().of(events.Quarantined)
    start(job)  # crashes: now two failures in a row, and the save is quarantined
    ended(cluster, job, sup, "FAILED")
    assert len(job.history().of(events.Quarantined)) == 1

    cluster, job, sup = after_a_save(
        "--restart-on-exit", "75", "--checkpoint", "ck2", "--quarantine-after", "1"
    )
    for _ in (1, 2, 3):
        start(job)
        assert "budget not spent" in ended(cluster, job, sup, "FAILED", ExitCode="75:0")[-1]
    assert not job.history().of(events.Quarantined)
    assert not quarantine.located(store.open_store(job.spec["checkpoint"]))


def test_a_requeued_execution_before_a_crash_does_not_quarantine(home: Path) -> None:  # noqa: F811
    cluster, job, sup = after_a_save()
    slurm_id = last_id(job)
    start(job, restart=0)  # from checkpoint-10, preempted: Slurm requeues it
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    sup.run_pass()
    start(job, restart=1)  # from checkpoint-10, crashes
    cluster.set(slurm_id, JobState="FAILED", Restarts="1")
    sup.run_pass()
    assert not job.history().of(events.Quarantined)


def test_cleanup_keeps_the_save_below_a_quarantined_latest(home: Path) -> None:  # noqa: F811
    """Found attacking the quarantine: gc --keep 1 kept the quarantined latest as the one of K and
    removed the save below it, the one the next execution resumes from, so that execution
    started afresh."""
    root = home / "ck"
    for step in (10, 20, 30):
        save = root / "exec" / "a" / f"checkpoint-{step}"
        save.mkdir(parents=True)
        (save / "w.bin").write_bytes(b"w")
        store.publish(str(root), 10**6, step, str(save))
    (root / "exec" / "a" / ".dispatch").write_text(json.dumps({"epoch": 10**6}))
    thirty = str(root / "exec" / "a" / "checkpoint-30")
    assert quarantine.mark(str(root), thirty)
    report = gc.collect(str(root), 1)
    assert "exec/a/checkpoint-20" in report.kept, report.kept
    st = store.open_store(str(root))
    found, passed = quarantine.choose(st)
    assert found is not None and found.path.endswith("checkpoint-20")
    assert os.path.isdir(found.path)


def test_the_only_save_is_not_quarantined_into_a_fresh_start(home: Path) -> None:  # noqa: F811
    """Found attacking the quarantine: a poisoned-looking save with no publication below it was
    quarantined, so the next execution started afresh and redid everything, its saves then
    outranking the quarantined one (a newer epoch) even once a person lifted the mark.  The
    supervisor leaves that choice to a person: the pass says so, --max-no-progress stops."""
    cluster, job, sup = after_a_save(steps=(10,))
    for _ in (1, 2):
        start(job)  # from checkpoint-10, the only save: crashes
        said = ended(cluster, job, sup, "FAILED")
    assert not job.history().of(events.Quarantined)
    ten = os.path.join(job.spec["checkpoint"], "exec", "a1r0", "checkpoint-10")
    assert any(
        f"{ten}: 2 execution(s) in a row (S2 R0, S3 R0) resumed from it and failed "
        "before publishing anything, but it is not quarantined: no save is published "
        "below it, so the next execution would start afresh" in a
        for a in said
    ), said
    assert any(f"`dispatch quarantine --root {job.spec['checkpoint']} {ten}`" in a for a in said), (
        said
    )
    values = launch.identity(job, 4, {"SLURM_JOB_ID": "9"}, [])
    assert values["DISPATCH_RESUME_FROM"] == ten


def test_the_python_api_and_the_integrations_pass_over_a_quarantined_save(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """Found attacking the quarantine: api.latest() and api.resume_from() (the Python side of
    `dispatch latest`), and an integration asked to choose where the launcher gave no choice,
    read the latest publication as it is, quarantined or not."""
    from slurm_dispatch import api
    from slurm_dispatch.execution.saves import Execution, choose_resume

    root = home / "ck"
    for step in (10, 20):
        save = root / "exec" / "a" / f"checkpoint-{step}"
        save.mkdir(parents=True)
        (save / "w.bin").write_bytes(b"w")
        store.publish(str(root), 10**6, step, str(save))
    twenty, ten = (str(root / "exec" / "a" / f"checkpoint-{s}") for s in (20, 10))
    assert quarantine.mark(str(root), twenty)
    found = api.latest(str(root))
    assert found is not None and found.path == ten
    monkeypatch.setenv("DISPATCH_CHECKPOINT", str(root))
    monkeypatch.setenv("DISPATCH_RESUME_FROM", "")
    assert api.resume_from() == ten
    (root / "exec" / "b").mkdir()
    execution = Execution(
        root=str(root),
        exec_dir=str(root / "exec" / "b"),
        epoch=2 * 10**6,
        attempt="b",
        job="",
        resume_from=None,
    )
    assert choose_resume(execution).path == ten


def test_a_person_quarantining_the_last_save_is_told_the_next_start_is_fresh(home: Path) -> None:  # noqa: F811
    """Found attacking the quarantine as a new user: `dispatch quarantine` of the only save said
    'quarantined' and nothing else, and the job's next execution started afresh."""
    root = home / "ck"
    for step in (10, 20):
        save = root / "exec" / "a" / f"checkpoint-{step}"
        save.mkdir(parents=True)
        store.publish(str(root), 10**6, step, str(save))
    runner = CliRunner()
    out = runner.invoke(main, ["quarantine", "--root", "ck", "ck/exec/a/checkpoint-20"])
    assert out.exit_code == 0 and out.stderr == "", out.output
    out = runner.invoke(main, ["quarantine", "--root", "ck", "ck/exec/a/checkpoint-10"])
    assert out.exit_code == 0 and out.stdout == "quarantined ck/exec/a/checkpoint-10\n"
    assert (
        "no other save of ck is published and not quarantined, so the next execution "
        "starts afresh" in out.stderr
    ), out.stderr
