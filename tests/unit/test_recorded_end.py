"""After slurmctld forgets a job (MinJobAge, no accounting), `dispatch status` and `dispatch
jobs` show the end the record holds, as sacct names it, marked as recorded:
the supervisor's decisions (what it saw and acted on) and the controller hook's end record."""

from __future__ import annotations

import json

from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import status, status_text
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401,F811 - the fixture


def test_forgotten_jobs_show_the_end_the_supervisor_saw(cluster: FakeCluster) -> None:  # noqa: F811
    failed = submit_one("ck-a", "--resubmit", "1")
    done = submit_one("ck-b")
    timed = submit_one("ck-c")
    sup = Supervisor(Slurm(), Settings())
    cluster.set(failed.slurm_job_id, JobState="FAILED")
    cluster.set(done.slurm_job_id, JobState="COMPLETED")
    cluster.set(timed.slurm_job_id, JobState="TIMEOUT")
    sup.run_pass()  # resubmits the failed one, finishes the others
    again = str(failed.job.submissions()[-1]["slurm_job_id"])
    cluster.set(again, JobState="CANCELLED")
    sup.run_pass()
    cluster.jobs.clear()  # every one aged out of slurmctld (MinJobAge), no accounting
    data = json.loads(CliRunner().invoke(cli.main, ["jobs", "--json"]).output)
    assert [d["state"] for d in data] == [
        "CANCELLED (recorded)",
        "COMPLETED (recorded)",
        "TIMEOUT (recorded)",
    ]
    shown = json.loads(CliRunner().invoke(cli.main, ["status", "--json", failed.job.id]).output)
    assert [s["state"] for s in shown["submissions"]] == [
        "FAILED (recorded)",
        "CANCELLED (recorded)",
    ]
    text = CliRunner().invoke(cli.main, ["status", failed.job.id]).output
    assert "FAILED (recorded)" in text and "UNKNOWN" not in text


def test_the_controller_hooks_end_record_gives_the_exit_code(cluster: FakeCluster) -> None:  # noqa: F811
    job = submit_one("ck-a", "--resubmit", "1")
    job.job.append(
        "started",
        submission=1,
        slurm_job_id=job.slurm_job_id,
        restart=0,
        attempt="a" * 26,
        epoch=1_000_000,
        exec_dir="/x",
        node="n1",
        nodes="n1",
    )
    facts = [
        {
            "restart": 0,
            "end": {"exit_code": "3:0", "source": "controller"},
            "nodes": {},
            "problems": [],
        }
    ]
    data = status.collect(job.job, {}, facts_reader=lambda jobid: facts)
    sub = data["submissions"][0]
    assert (sub["state"], sub["exit_code"]) == ("FAILED (recorded)", "3:0")
    assert data["executions"][0]["state"] == "FAILED (recorded)"
    assert "FAILED (recorded, exit 3:0)" in status_text.render(data)
    # 0:0 proves nothing by itself (a completion, a node failure or a cancel alike).
    facts[0]["end"]["exit_code"] = "0:0"
    data = status.collect(job.job, {}, facts_reader=lambda jobid: facts)
    assert data["submissions"][0]["state"].startswith("UNKNOWN")


def test_the_supervisor_records_slurms_own_name_for_the_end(cluster: FakeCluster) -> None:  # noqa: F811
    """DEADLINE and BOOT_FAIL share a rule with TIMEOUT and NODE_FAIL: the record keeps
    Slurm's word for what it saw."""
    late = submit_one("ck-a")
    cluster.set(late.slurm_job_id, JobState="DEADLINE")
    Supervisor(Slurm(), Settings()).run_pass()
    assert late.job.history().lineage().finished.raw["slurm_state"] == "DEADLINE"
    cluster.jobs.clear()
    data = json.loads(CliRunner().invoke(cli.main, ["jobs", "--json"]).output)
    assert data[0]["state"] == "DEADLINE (recorded)"


def test_a_reused_slurm_id_of_a_plain_job_is_not_shown_as_the_submissions_state(
    cluster: FakeCluster,
) -> None:  # noqa: F811
    """After slurmctld lost its state, the user's plain sbatch job has the id
    of the dispatch job's submission and completed; `dispatch status` and `dispatch jobs`
    must not show the dispatch job COMPLETED (nor the plain job's state at all)."""
    import itertools

    done = submit_one("ck-a", "--resubmit", "3")
    cluster.jobs.clear()
    cluster.ids = itertools.count(int(done.slurm_job_id))
    assert cluster.add("COMPLETED") == done.slurm_job_id
    data = json.loads(CliRunner().invoke(cli.main, ["jobs", "--json"]).output)
    assert "COMPLETED" not in data[0]["state"], data
    shown = json.loads(CliRunner().invoke(cli.main, ["status", "--json", done.job.id]).output)
    assert "COMPLETED" not in shown["submissions"][0]["state"], shown["submissions"]
