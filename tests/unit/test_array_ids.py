"""Array task ids as Slurm shows them, ``ARRAYJOB_TASK``, everywhere: in
the launcher's header, in the commands that take a job id (``dispatch latest 14_2`` names the
task), and in the status lines about one task."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import status, status_text
from slurm_dispatch.execution.launch import header_line
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, publish_save, submit_one  # noqa: F401,F811 - the fixture

VALUES = {"DISPATCH_RESUME_FROM": "", "DISPATCH_EPOCH": "1000000", "DISPATCH_ATTEMPT": "a"}


def test_the_launchers_header_names_an_array_task_as_slurm_does() -> None:
    env = {
        "SLURM_JOB_ID": "19",
        "SLURM_ARRAY_JOB_ID": "18",
        "SLURM_ARRAY_TASK_ID": "0",
        "SLURMD_NODENAME": "n1",
    }
    assert "Slurm job 18_0 restart 0 on n1" in header_line("dabc", 1, env, VALUES)
    plain = {"SLURM_JOB_ID": "19", "SLURMD_NODENAME": "n1"}
    assert "Slurm job 19 restart" in header_line("dabc", 1, plain, VALUES)


def test_latest_takes_the_task_from_a_job_task_id(
    cluster: FakeCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    done = submit_one("ck-t%a", "--array=0-2")
    save = publish_save(tmp_path / "ck-t2", 8)
    result = CliRunner().invoke(cli.main, ["latest", f"{done.slurm_job_id}_2"])
    assert result.exit_code == 0 and result.output.strip() == str(save), result.output
    # The task's own Slurm job id, once its execution recorded it, names the task too.
    own = str(int(done.slurm_job_id) + 2)
    done.job.append(
        "started",
        submission=1,
        slurm_job_id=own,
        array_job_id=done.slurm_job_id,
        array_task_id="2",
        restart=0,
        attempt="a" * 26,
        epoch=1_000_000,
        exec_dir=str(save.parent),
    )
    assert CliRunner().invoke(cli.main, ["latest", own]).output.strip() == str(save)
    clash = CliRunner().invoke(cli.main, ["latest", f"{done.slurm_job_id}_2", "--task", "1"])
    assert clash.exit_code == 2 and "names task 2" in clash.stderr
    assert CliRunner().invoke(cli.main, ["latest", f"{done.slurm_job_id}_1"]).output == ""


def test_status_lines_about_one_task_name_it_as_slurm_does(cluster: FakeCluster) -> None:  # noqa: F811
    done = submit_one("ck-t%a", "--array=0-1", "--resubmit", "1")
    job = done.job
    job.append(
        "hold",
        submission=2,
        slurm_job_id="80",
        ended_slurm_job_id="51",
        ended_restart=0,
        end_state="failed",
        deadline=1_800_000_000.0,
        task=1,
    )
    job.append("released", slurm_job_id="80", by="cessation signal", task=1)
    job.append(
        "finished",
        submission=2,
        slurm_job_id="80",
        end_state="completed",
        rule="stop (done)",
        task=1,
    )
    data = status.collect(job, Slurm().own_jobs(), facts_reader=lambda jobid: [])
    text = status_text.render(data)
    assert "HOLD task 1 submission 2 (Slurm job 80_1)" in text, text
    assert "RELEASED Slurm job 80_1 " in text and "FINISHED task 1 after completed" in text


def test_release_of_a_job_task_id_lifts_that_tasks_hold_only(cluster: FakeCluster) -> None:  # noqa: F811
    from slurm_dispatch.control.supervisor import Settings, Supervisor

    done = submit_one("ck-t%a", "--shared-checkpoint", "--resubmit", "2", "--array=0-1")
    for jobid in list(cluster.jobs):
        cluster.set(jobid, JobState="NODE_FAIL")
    Supervisor(Slurm(), Settings(signal=None)).run_pass()
    history = done.job.history()
    held = {t: history.lineage(t).hold.slurm_job_id for t in (0, 1)}  # type: ignore[union-attr]
    result = CliRunner().invoke(cli.main, ["release", "--force", f"{done.slurm_job_id}_1"])
    assert result.exit_code == 0, result.output + result.stderr
    assert f"released Slurm job {held[1]} " in result.output
    assert cluster.jobs[held[1]]["JobState"] == "RUNNING"
    assert cluster.jobs[held[0]]["Reason"] == "JobHeldUser"
    assert done.job.history().lineage(0).hold is not None
