"""dispatch jobs and dispatch cancel: one line per dispatch job, whichever Slurm job is current
cancelled (what users ask for first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import record, status, submit
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    fake = FakeCluster(first_id=50)
    # The CLI builds its own adapter: give it this fake controller.
    original = Slurm.__init__

    def init(self: Slurm, runner: object = fake, **kwargs: object) -> None:
        original(self, fake, wait=0)  # type: ignore[arg-type]

    monkeypatch.setattr(Slurm, "__init__", init)
    return fake


def submit_one(root: str, *extra: str) -> submit.SubmissionMade:
    return submit.submit_new(submit.read_request(["--checkpoint", root, *extra, "job.sh"]), Slurm())


def test_jobs_lists_each_dispatch_job_with_its_current_state(cluster: FakeCluster) -> None:
    running = submit_one("ck-a")
    ended = submit_one("ck-b")
    cluster.set(ended.slurm_job_id, JobState="FAILED")
    forgotten = submit_one("ck-c")
    del cluster.jobs[forgotten.slurm_job_id]
    result = CliRunner().invoke(cli.main, ["jobs"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["DISPATCH_JOB", "SCRIPT", "G/N", "SLURM_JOB", "STATE", "CHECKPOINT"]
    by_id = {line.split()[0]: line.split() for line in lines[1:]}
    assert by_id[running.job.id][1:5] == ["job.sh", "0/1", running.slurm_job_id, "RUNNING"]
    assert by_id[ended.job.id][4] == "FAILED"
    assert by_id[forgotten.job.id][4] == "UNKNOWN"
    data = json.loads(CliRunner().invoke(cli.main, ["jobs", "--json"]).output)
    assert [d["id"] for d in data] == [running.job.id, ended.job.id, forgotten.job.id]
    for flag in ("-H", "--noheader"):
        assert CliRunner().invoke(cli.main, ["jobs", flag]).output.count("\n") == 3


@pytest.mark.parametrize(
    "command",
    [["jobs"], ["list"], ["status"], ["cancel"], ["latest"], ["supervise"], ["resubmit"], []],
)
def test_dash_h_is_help_on_every_command(cluster: FakeCluster, command: list[str]) -> None:
    """-h is help everywhere, as on every other dispatch command (squeue's -h is its
    --noheader; ours is -H, as `dispatch list` has it)."""
    result = CliRunner().invoke(cli.main, [*command, "-h"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ")


def test_an_unreadable_record_is_a_line_not_a_crash(cluster: FakeCluster) -> None:
    job = submit_one("ck-a").job
    events = Path(job.path) / "events"
    (events / "00000000000000000001-submitted-ffff.json").write_text('["not", "an event"]')
    lines = status.job_lines(record.all_jobs(), Slurm().own_jobs())
    assert "error" in lines[0] and "ffff" in lines[0]["error"]
    # dispatch jobs' table too: its short row for the record crashed the table (IndexError).
    shown = CliRunner().invoke(cli.main, ["jobs"])
    assert shown.exit_code == 0, shown.output
    row = shown.output.splitlines()[1].split()
    assert row[:5] == [job.id, "-", "-", "-", "unreadable:"], shown.output


def test_cancel_cancels_whichever_slurm_job_is_current(cluster: FakeCluster) -> None:
    done = submit_one("ck-a")
    result = CliRunner().invoke(cli.main, ["cancel", done.job.id])
    assert result.exit_code == 0, result.output
    assert f"cancelled Slurm job(s) {done.slurm_job_id}" in result.output
    assert cluster.jobs[done.slurm_job_id]["JobState"] == "CANCELLED"
    again = CliRunner().invoke(cli.main, ["cancel", done.slurm_job_id])
    assert "has no active Slurm job" in again.output
    missing = CliRunner().invoke(cli.main, ["cancel", "dnope"])
    assert missing.exit_code == 2 and "no dispatch job 'dnope'" in missing.stderr


def test_latest_of_a_job_needs_no_root(cluster: FakeCluster, tmp_path: Path) -> None:
    from slurm_dispatch.checkpoint import model
    from slurm_dispatch.checkpoint import publish as store

    done = submit_one("ck-a")
    save = tmp_path / "ck-a" / "exec" / model.new_attempt() / "checkpoint-3"
    save.mkdir(parents=True)
    store.publish(str(tmp_path / "ck-a"), 1_000_000, 3, str(save))
    for ident in (done.job.id, done.slurm_job_id):
        result = CliRunner().invoke(cli.main, ["latest", ident])
        assert result.exit_code == 0 and result.output.strip() == str(save), result.output
    wrong = CliRunner().invoke(cli.main, ["latest", done.job.id, "--task", "1"])
    assert wrong.exit_code == 2 and "one for all tasks" in wrong.stderr


def publish_save(root: Path, step: int) -> Path:
    """A save at ``step`` in a new execution folder of ``root``, published at epoch 10^6."""
    from slurm_dispatch.checkpoint import model
    from slurm_dispatch.checkpoint import publish as store

    save = root / "exec" / model.new_attempt() / f"checkpoint-{step}"
    save.mkdir(parents=True)
    store.publish(str(root), 1_000_000, step, str(save))
    return save


def test_latest_of_an_array_job_looks_in_the_tasks_root(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    done = submit_one("ck-t%a", "--array=0-1")
    save = publish_save(tmp_path / "ck-t1", 8)
    result = CliRunner().invoke(cli.main, ["latest", done.job.id, "--task", "1"])
    assert result.output.strip() == str(save), result.output
    assert CliRunner().invoke(cli.main, ["latest", done.job.id, "--task", "0"]).output == ""
    missing = CliRunner().invoke(cli.main, ["latest", done.job.id])
    assert missing.exit_code == 2 and "give --task T" in missing.stderr


def test_an_array_is_live_while_any_task_runs_and_a_task_resubmits_alone(
    cluster: FakeCluster,
) -> None:
    """An array's id alone says nothing of its tasks (a started task has an id of its own):
    `dispatch resubmit` is refused while any task runs; `--task T` looks at that task only
    and resubmits it on its own (--array=T)."""
    done = submit_one("ck-t%a", "--array=0-1")
    tasks = {f["ArrayTaskId"]: jobid for jobid, f in cluster.jobs.items()}
    cluster.set(tasks["0"], JobState="COMPLETED")  # the task that kept the array's id
    refused = CliRunner().invoke(cli.main, ["resubmit", done.job.id])
    assert refused.exit_code == 2 and f"{done.slurm_job_id}_1 (RUNNING)" in refused.stderr
    cluster.set(tasks["1"], JobState="FAILED")
    cluster.set(tasks["0"], JobState="RUNNING")
    again = CliRunner().invoke(cli.main, ["resubmit", done.job.id, "--task", "1"])
    assert again.exit_code == 0, again.output + again.stderr
    assert "--array=1" in cluster.sbatch_calls()[-1]
    bad = CliRunner().invoke(cli.main, ["resubmit", done.job.id, "--task", "7"])
    assert bad.exit_code == 2 and "no such array task" in bad.stderr
