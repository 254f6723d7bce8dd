"""Many jobs at once: `dispatch cancel` of several jobs, `dispatch jobs`
filters as Slurm's tools spell them, and `dispatch forget` for old records."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.cli.dispatch import parse_since
from slurm_dispatch.control import record
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401,F811 - the fixture


def ids_of(output: str) -> list[str]:
    return [line.split()[0] for line in output.splitlines()[1:]]


def test_cancel_takes_several_jobs_and_a_task(cluster: FakeCluster) -> None:  # noqa: F811
    one, two = submit_one("ck-a"), submit_one("ck-b")
    array = submit_one("ck-t%a", "--array=0-2")
    tasks = {f["ArrayTaskId"]: j for j, f in cluster.jobs.items() if "ArrayTaskId" in f}
    result = CliRunner().invoke(
        cli.main, ["cancel", one.slurm_job_id, two.job.id, f"{array.slurm_job_id}_2"]
    )
    assert result.exit_code == 0, result.output + result.stderr
    assert [cluster.jobs[j]["JobState"] for j in (one.slurm_job_id, two.slurm_job_id)] == [
        "CANCELLED",
        "CANCELLED",
    ]
    assert [cluster.jobs[tasks[t]]["JobState"] for t in "012"] == [
        "RUNNING",
        "RUNNING",
        "CANCELLED",
    ]
    assert f"{array.slurm_job_id}_2" in result.output and len(result.output.splitlines()) == 3
    # One bad id: one line naming it, and nothing cancelled.
    before = len([c for c in cluster.calls if c[0] == "scancel"])
    bad = CliRunner().invoke(cli.main, ["cancel", array.job.id, "dnope"])
    assert bad.exit_code == 2 and "'dnope'" in bad.stderr
    assert len([c for c in cluster.calls if c[0] == "scancel"]) == before
    assert CliRunner().invoke(cli.main, ["cancel"]).exit_code == 2


def test_jobs_filters_by_state_name_and_since(
    cluster: FakeCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    (tmp_path / "other.sh").write_text("#!/bin/bash\necho hi\n")
    running, failed = submit_one("ck-a"), submit_one("ck-b")
    from slurm_dispatch.control import submit

    named = submit.submit_new(submit.read_request(["--checkpoint", "ck-c", "other.sh"]), Slurm())
    cluster.set(failed.slurm_job_id, JobState="FAILED")
    run = CliRunner().invoke
    assert ids_of(run(cli.main, ["jobs", "--state=FAILED"]).output) == [failed.job.id]
    assert ids_of(run(cli.main, ["jobs", "-t", "f,r"]).output) == [
        running.job.id,
        failed.job.id,
        named.job.id,
    ]
    assert ids_of(run(cli.main, ["jobs", "--name", "other.sh"]).output) == [named.job.id]
    bad = run(cli.main, ["jobs", "--state=FINISHD"])
    assert bad.exit_code == 2 and "'FINISHD'" in bad.stderr
    assert ids_of(run(cli.main, ["jobs", "--since", "now-1hours"]).output) == [
        running.job.id,
        failed.job.id,
        named.job.id,
    ]
    tomorrow = time.strftime("%Y-%m-%d", time.localtime(time.time() + 86400))
    assert run(cli.main, ["jobs", "-H", "--since", tomorrow]).output == ""


def test_since_reads_what_sacct_s_reads() -> None:
    now = time.mktime((2026, 12, 2, 10, 30, 0, 0, 0, -1))
    assert parse_since("2026-12-01", now) == time.mktime((2026, 12, 1, 0, 0, 0, 0, 0, -1))
    assert parse_since("2026-12-01T08:15", now) == time.mktime((2026, 12, 1, 8, 15, 0, 0, 0, -1))
    assert parse_since("2026-12-01T08:15:07", now) == time.mktime((2026, 12, 1, 8, 15, 7, 0, 0, -1))
    assert parse_since("now-2days", now) == now - 2 * 86400
    assert parse_since("now-90", now) == now - 90
    assert parse_since("now-3hours", now) == now - 3 * 3600
    assert parse_since("today", now) == time.mktime((2026, 12, 2, 0, 0, 0, 0, 0, -1))
    assert parse_since("12/01", now) == time.mktime((2026, 12, 1, 0, 0, 0, 0, 0, -1))
    for bad in ("yesterday", "2026-13-01", "now-2fortnights", "13/45"):
        with pytest.raises(UsageError, match=repr(bad)):
            parse_since(bad, now)


def test_forget_removes_only_settled_jobs_slurm_has_forgotten(cluster: FakeCluster) -> None:  # noqa: F811
    done, running = submit_one("ck-a"), submit_one("ck-b")
    pending = submit_one("ck-c", "--resubmit", "1")
    cluster.set(done.slurm_job_id, JobState="COMPLETED")
    cluster.set(pending.slurm_job_id, JobState="FAILED")
    Supervisor(Slurm(), Settings()).run_pass()  # done: finished; pending: resubmitted
    del cluster.jobs[done.slurm_job_id]
    unsupervised = submit_one("ck-d")
    del cluster.jobs[unsupervised.slurm_job_id]  # ended and forgotten, never settled
    run = CliRunner().invoke
    dry = run(cli.main, ["forget", "--dry-run", "--before", "now"])
    assert dry.exit_code == 0, dry.output + dry.stderr
    assert f"would forget {done.job.id}" in dry.output
    for job, why in (
        (running, "still known to Slurm"),
        (pending, "still known to Slurm"),
        (unsupervised, "not settled"),
    ):
        assert any(job.job.id in line and why in line for line in dry.output.splitlines()), (
            job.job.id,
            why,
            dry.output,
        )
    assert os.path.isdir(done.job.path)
    refused = run(cli.main, ["forget", running.job.id, done.job.id])
    assert refused.exit_code == 1 and running.job.id in refused.stderr
    assert os.path.isdir(done.job.path)  # named jobs: all or none
    gone = run(cli.main, ["forget", done.job.id])
    assert gone.exit_code == 0 and not os.path.exists(done.job.path), gone.output
    assert [j.id for j in record.all_jobs()] == sorted(
        [running.job.id, pending.job.id, unsupervised.job.id]
    )
    nothing = run(cli.main, ["forget", "--before", "2000-01-01"])
    assert nothing.exit_code == 0 and "forgot 0 job(s)" in nothing.output
    assert run(cli.main, ["forget"]).exit_code == 2  # --before or JOB...


def test_forget_keeps_a_held_job_and_an_upstream_others_wait_for(cluster: FakeCluster) -> None:  # noqa: F811
    upstream = submit_one("ck-a")
    cluster.set(upstream.slurm_job_id, JobState="COMPLETED")
    downstream = submit_one("ck-b", f"--dependency=afterok:{upstream.job.id}")
    held = submit_one("ck-c", "--shared-checkpoint", "--resubmit", "1")
    cluster.set(held.slurm_job_id, JobState="FAILED")
    Supervisor(Slurm(), Settings(signal=None)).run_pass()
    cluster.jobs = {
        k: v for k, v in cluster.jobs.items() if k not in (upstream.slurm_job_id, held.slurm_job_id)
    }
    held_now = str(held.job.submissions()[-1]["slurm_job_id"])
    del cluster.jobs[held_now]  # even forgotten by Slurm, the hold stands
    out = CliRunner().invoke(cli.main, ["forget", "--dry-run", "--before", "now"]).output
    assert any(
        upstream.job.id in line and downstream.job.id in line for line in out.splitlines()
    ), out
    assert any(held.job.id in line and "hold" in line for line in out.splitlines()), out
    data = json.loads(
        CliRunner().invoke(cli.main, ["forget", "--dry-run", "--json", "--before", "now"]).output
    )
    assert {k["id"] for k in data["kept"]} >= {upstream.job.id, held.job.id}


def test_jobs_shows_and_filters_expediting(cluster: FakeCluster) -> None:  # noqa: F811
    """25.11's EXPEDITING (a --requeue=expedite job requeued to start again at
    once) is a job state `dispatch jobs --state` takes; it was "not a job state"."""
    requeued, other = submit_one("ck-a"), submit_one("ck-b")
    cluster.set(requeued.slurm_job_id, JobState="EXPEDITING", Restarts="1")
    run = CliRunner().invoke
    listed = run(cli.main, ["jobs", "--state=EXPEDITING"])
    assert listed.exit_code == 0, listed.output
    assert ids_of(listed.output) == [requeued.job.id] and "EXPEDITING" in listed.output
    assert other.job.id in run(cli.main, ["jobs", "--state=R"]).output
