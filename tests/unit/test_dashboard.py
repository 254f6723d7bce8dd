"""The users' records' numbers for a dashboard (docs/admin-guide.md, metrics):
``dispatch-admin metrics`` reads each user's records as that user and writes holds standing and
expiring, the CessationSignal's answers by verdict ("not ceased": not proven) and the supervisor's
passes and failures into MetricsDir, whole, in node_exporter's textfile format (read back with
prometheus_client's parser)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from slurm_dispatch.cli import admin
from slurm_dispatch.control import dashboard, goodput, heartbeat, record, siteview
from slurm_dispatch.control.supervisor import Settings
from slurm_dispatch.node import metrics

from ..fakes.cluster import FakeCluster
from .test_holds import held_job
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture
from .test_supervisor import Clock, Signal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs children as another user")


def test_holds_answers_and_passes_are_counted_and_written(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    clock, signal = Clock(), Signal("not ceased", "error")
    job, ended, held, sup = held_job(cluster, clock, signal, Settings(interval=60))
    sup.run_pass()
    clock.now += 61
    sup.run_pass()
    home = record.home_dir()
    heartbeat.good(home, "alpha", 1, 0, 0)
    heartbeat.failed(home, "alpha", "the controller did not answer")
    heartbeat.failed(home, "alpha", "the controller did not answer")
    hold = job.history().lineage().hold
    assert hold is not None
    got = dashboard.numbers(home, warning=7200, now=clock.now)
    assert got["holds"] == 1 and got["expiring"] == 0
    assert got["answers"] == {"not ceased": 1, "error": 1}
    assert got["passes"]["alpha"]["failures"] == 2 and got["passes"]["alpha"]["time"] > 0
    assert dashboard.numbers(home, warning=7200, now=hold.deadline - 60)["expiring"] == 1

    out = tmp_path / "textfile"
    out.mkdir(mode=0o755)
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"MetricsDir={out}\n")
    monkeypatch.setattr(siteview, "records_of", lambda pattern, user: home)
    done = CliRunner().invoke(admin.main, ["metrics", "--user", "root", "--config", str(conf)])
    assert done.exit_code == 0, done.output
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families((out / metrics.RECORDS_FILE).read_text())
        for s in family.samples
    }
    assert samples[("slurm_dispatch_holds_standing", (("user", "root"),))] == 1
    assert (
        samples[
            (
                "slurm_dispatch_cessation_answers_total",
                (("user", "root"), ("verdict", "not ceased")),
            )
        ]
        == 1
    )
    assert (
        samples[
            ("slurm_dispatch_supervisor_failed_passes", (("cluster", "alpha"), ("user", "root")))
        ]
        == 2
    )
    assert samples[("slurm_dispatch_records_unreadable", (("user", "root"),))] == 0
    # A user whose records cannot be read is named and marked, and the file still written.
    for path in Path(home, "jobs").rglob("*.json"):
        os.chmod(path, 0o644)
        path.write_text("{garbled")
    done = CliRunner().invoke(admin.main, ["metrics", "--user", "root", "--config", str(conf)])
    assert done.exit_code == 1 and "dispatch-admin: root: " in done.output, done.output
    assert (
        'slurm_dispatch_records_unreadable{user="root"} 1'
        in (out / metrics.RECORDS_FILE).read_text()
    )


def test_a_user_the_account_list_does_not_enumerate_is_counted_through_facts(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """Where sssd does not enumerate, getpwall lists only local accounts (faked here to leave
    root out); root's jobs ran under the hooks (a real fact in StateDir), so root is counted."""
    import pwd

    from slurm_dispatch.node import factstore

    clock, signal = Clock(), Signal("not ceased")
    job, ended, held, sup = held_job(cluster, clock, signal, Settings(interval=60))
    sup.run_pass()
    home = record.home_dir()
    listed = pwd.getpwall
    monkeypatch.setattr(pwd, "getpwall", lambda: [u for u in listed() if u.pw_uid != 0])
    monkeypatch.setattr(
        siteview, "records_of", lambda pattern, user: home if user.pw_uid == 0 else "/nonexistent"
    )
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    factstore.write_fact(str(state), 0, 0, ended, "start", "n1", {"restart": 0})
    out = tmp_path / "textfile"
    out.mkdir(mode=0o755)
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"MetricsDir={out}\nStateDir={state}\n")
    done = CliRunner().invoke(admin.main, ["metrics", "--config", str(conf)])
    assert done.exit_code == 0, done.output
    assert (
        'slurm_dispatch_holds_standing{user="root"} 1' in (out / metrics.RECORDS_FILE).read_text()
    )


def test_without_metrics_dir_it_says_so(tmp_path: Path) -> None:
    conf = tmp_path / "dispatch.conf"
    conf.write_text("")
    done = CliRunner().invoke(admin.main, ["metrics", "--config", str(conf)])
    assert done.exit_code == 2 and "MetricsDir is not set in" in done.output, done.output


READ_PASSES = """
import sys
from slurm_dispatch.control import dashboard, heartbeat
print(heartbeat.read(sys.argv[1]), dashboard.numbers(sys.argv[1], 60, 0)["passes"])
"""


def test_a_fifo_as_the_supervisors_pass_file_reads_as_no_pass(tmp_path: Path) -> None:
    # Attack: heartbeat.read opened it and waited for a writer, so dispatch-admin
    # metrics' child for that user hung (and every user after it waited) until its alarm.
    import subprocess
    import sys

    os.mkfifo(tmp_path / heartbeat.PASS_FILE)
    os.mkfifo(tmp_path / "supervisor-pass@alpha.json")
    done = subprocess.run(
        [sys.executable, "-c", READ_PASSES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "None {}\n"), done.stderr


def test_a_user_cannot_blow_up_the_series_of_the_records_file(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """Attack, as a hostile user: each answer's verdict (an event the user may write)
    and each supervisor-pass@<cluster>.json file name became a label value, so a user's
    records made as many series as they liked in the file node_exporter serves, and so in
    Prometheus (here 300 forged verdicts and 300 cluster names: 600 series more)."""
    import json as json_module

    clock, signal = Clock(), Signal("not ceased")
    job, ended, held, sup = held_job(cluster, clock, signal, Settings(interval=60))
    sup.run_pass()
    home = record.home_dir()
    events = Path(job.path) / "events"
    answer = json_module.loads(
        next(p for p in events.iterdir() if "-cessation-" in p.name).read_text()
    )
    for i in range(300):
        forged = {**answer, "verdict": f"forged {i}"}
        (events / f"{answer['ns'] + 1 + i:019d}-cessation-f{i:07x}.json").write_text(
            json_module.dumps(forged)
        )
    heartbeat.good(home, "alpha", 1, 0, 0)
    for i in range(300):
        (Path(home) / f"supervisor-pass@c{i}.json").write_text('{"time": 1.0}')
    (Path(home) / "supervisor-pass@bad name.json").write_text('{"time": 1.0}')
    got = dashboard.numbers(home, warning=7200, now=clock.now)
    assert got["answers"] == {"not ceased": 1, "other": 300}, got["answers"]
    assert len(got["passes"]) <= dashboard.MAX_CLUSTERS, len(got["passes"])
    assert "alpha" in got["passes"] and "bad name" not in got["passes"]
    assert any("supervisor-pass@" in error for error in got["errors"]), got


def test_what_restarts_cost_is_written_per_user_with_bounded_labels(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """Per user, restarts by cause, seconds allocated and lost, steps redone,
    restore and save latency, holds by age and the soonest deadline, read back by
    prometheus_client's parser; no label is a job's (a user's records make no new series)."""
    import time

    from slurm_dispatch.checkpoint import publish as store

    clock, signal = Clock(), Signal("not ceased")
    job, ended, held, sup = held_job(cluster, clock, signal, Settings(interval=60))
    home = record.home_dir()
    heartbeat.good(home, "alpha", 1, 0, 0)  # a timer's passes: every minute
    # A second job: S1 R0 saved steps 10 and 20, failed; S2 resumed from step 10 (20 was
    # published after the resubmission was made: redone 10) and runs.
    other = submit_one("ck-g", "--resubmit", "3")
    ck = Path("ck-g").resolve()
    now = time.time()
    for sub, steps in ((1, (10, 20)), (2, (30,))):
        folder = ck / "exec" / f"a{sub}"
        for step in steps:
            save = folder / f"checkpoint-{step}"
            save.mkdir(parents=True)
            name = store.publish(str(ck), sub * 1_000_000, step, str(save))
            os.utime(save, (now - 100 + step, now - 100 + step))
            os.utime(ck / "pub" / name, (now - 99 + step, now - 99 + step))
        if sub == 2:
            other.job.append(
                "submitted", submission=2, slurm_job_id="99", reason="failed (budget 3)"
            )
        other.job.append(
            "started",
            submission=sub,
            slurm_job_id=other.slurm_job_id if sub == 1 else "99",
            array_job_id="",
            array_task_id="",
            restart=0,
            attempt=f"a{sub}",
            epoch=sub * 1_000_000,
            exec_dir=str(folder),
            resume_from=str(ck / "exec" / "a1" / "checkpoint-10") if sub == 2 else "",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    # ... and S2 made no progress either: --max-no-progress stopped its restarts.
    other.job.append(
        "no-progress",
        submission=2,
        slurm_job_id="99",
        executions=[[2, 0, "a2"]],
        action="not resubmitted",
        end_state="failed",
        limit=1,
    )
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    out = tmp_path / "textfile"
    out.mkdir(mode=0o755)
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"MetricsDir={out}\nStateDir={state}\n")
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    got = dashboard.numbers(home, warning=7200, now=now)["costs"]
    assert got["restarts"]["failed"] == 1 and sum(got["restarts"].values()) == 1
    assert got["redone"] == 10 and got["stopped_no_progress"] == 1 and got["active"] == 2
    assert got["save_latency"] == {"sum": 3.0, "count": 3}
    assert got["hold_ages"]["more"] + got["hold_ages"]["1h"] == 1  # the held job's hold
    assert got["next_deadline"] == job.history().lineage().hold.deadline  # type: ignore[union-attr]

    monkeypatch.setattr(siteview, "records_of", lambda pattern, user: home)
    done = CliRunner().invoke(admin.main, ["metrics", "--user", "root", "--config", str(conf)])
    assert done.exit_code == 0, done.output
    families = list(text_string_to_metric_families((out / metrics.RECORDS_FILE).read_text()))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
    }
    root = (("user", "root"),)
    assert samples[("slurm_dispatch_restarts_total", (("cause", "failed"), *root))] == 1
    assert samples[("slurm_dispatch_steps_redone_total", root)] == 10
    assert samples[("slurm_dispatch_jobs_stopped_no_progress", root)] == 1
    assert (
        samples[("slurm_dispatch_supervisor_interval_seconds", (("cluster", "alpha"), *root))] == 60
    )
    assert samples[("slurm_dispatch_save_latency_seconds_count", root)] == 3
    assert ("slurm_dispatch_lost_seconds_total", root) in samples
    assert samples[("slurm_dispatch_hold_next_deadline_timestamp_seconds", root)] > 0
    kinds = {f.name: f.type for f in families}
    assert kinds["slurm_dispatch_save_latency_seconds"] == "summary"
    assert kinds["slurm_dispatch_restarts"] == "counter"
    # Every label is the user's name, a cause, an age, a verdict or a cluster: bounded sets.
    allowed = {"user", "cause", "age", "verdict", "cluster"}
    assert all(set(dict(labels)) <= allowed for _, labels in samples)
    assert {
        dict(labels)["cause"] for name, labels in samples if name == "slurm_dispatch_restarts_total"
    } == set(goodput.CAUSES)


def test_the_costs_of_a_root_per_array_task_count_its_publications(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --checkpoint ck/%a job's costs were figured with no publication at all (the records
    file read only a root without patterns): a running task publishing every minute showed
    the time since its start as its progress age, and SlurmDispatchNoProgress fired for it
    after an hour.  They are now figured from the publications dispatch status lists."""
    import time as clock

    from .test_report import per_task_job

    now = clock.time()
    per_task_job(tmp_path, monkeypatch)
    home = tmp_path / "home"
    monkeypatch.setattr(
        "slurm_dispatch.control.status._facts_reader",
        lambda: lambda jobid: [{"restart": 0, "nodes": {"n1": {"start": {"time": now}}}}],
    )
    for task in (0, 1):  # published a minute and a half before the metrics run, 2 h on
        for entry in (tmp_path / "ck" / str(task) / "pub").iterdir():
            os.utime(entry, (now + 7110, now + 7110))
    costs = dashboard.job_costs(str(home), now + 7200)
    assert "errors" not in costs, costs
    assert costs["progress_age"] is not None and costs["progress_age"] < 600
