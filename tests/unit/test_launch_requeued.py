"""The requeue budget's last gap (docs/user-guide.md): a requeued execution that starts before a
supervisor pass can hold it.

The supervisor holds Slurm's requeued job, pending, once its --max-requeues budget is spent or
its last executions made no progress.  An expedited requeue (--requeue=expedite) starts again
at once, a site's requeue delay may be shorter than the pass interval, and no supervisor may
run at all: the job then bounced past both for ever.  The launcher is the gate every
execution passes, so there a requeued execution whose record already says a stop applies does
not run the script: it records the supervisor's event, requeues itself held (`scontrol
requeuehold`) and ends with exit 2; `dispatch release` lifts it as it lifts the supervisor's
hold.  Tests failed before: the script ran.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.control import events, noprogress, record, status, status_text
from slurm_dispatch.control.holds import release
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import RecordError, SlurmError
from slurm_dispatch.execution import gate, launch
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_no_progress import home, last_id, new_job, start  # noqa: F401 - the fixture


class Ran(Exception):
    """The launcher replaced itself with the script."""


def execution(
    job: record.JobRecord, cluster: FakeCluster, restart: int, monkeypatch: pytest.MonkeyPatch
) -> Optional[str]:
    """Start an execution of the job's latest submission at ``restart`` as Slurm would, the
    controller being ``cluster``: None where it ran the script, else what it said."""
    slurm_id = last_id(job)
    cluster.set(slurm_id, JobState="RUNNING", Reason="None", Restarts=str(restart))
    env = {
        **os.environ,
        "SLURM_JOB_ID": slurm_id,
        "SLURM_RESTART_COUNT": str(restart),
        "SLURMD_NODENAME": "n1",
    }

    def execve(*_: object) -> None:
        raise Ran()

    monkeypatch.setattr(os, "execve", execve)
    try:
        launch.launch(
            job.path,
            job.history().submissions[-1].submission,
            [],
            env=env,
            slurm=Slurm(cluster, wait=0),
        )
    except Ran:
        return None
    except gate.StoppedAtStart as exc:
        return str(exc)
    raise AssertionError("the launcher neither ran the script nor stopped")


def refused_hold(
    job: record.JobRecord,
    cluster: FakeCluster,
    restart: int,
    monkeypatch: pytest.MonkeyPatch,
    why: str,
) -> Optional[str]:
    """:func:`execution`, with the controller refusing `scontrol requeuehold` (``why``)."""

    def refused(*_: object) -> None:
        raise SlurmError(f"scontrol: error: {why}")

    with monkeypatch.context() as patched:
        patched.setattr(Slurm, "requeue_hold", refused)
        return execution(job, cluster, restart, monkeypatch)


def publish(job: record.JobRecord, step: int) -> None:
    """The last execution the launcher started publishes a save of ``step``."""
    last = job.history().lineage().started[-1]
    save = os.path.join(last.exec_dir, f"checkpoint-{step}")
    os.makedirs(save)
    store.publish(job.spec["checkpoint"], last.epoch, step, save)


@pytest.fixture(autouse=True)
def term_put_back() -> Iterator[None]:
    """A launcher that holds its own execution ignores SIGTERM from then on (Slurm ends the
    batch step once it takes the requeue, and the launcher still has to say why): in this test
    process that would pass on to every command a later test starts, so it is put back."""
    yield
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_requeue_past_the_budget_does_not_run_the_script_until_a_release(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "1", "--max-no-progress", "0")
    slurm_id = last_id(job)
    start(job, restart=0, publish=(1,))
    assert execution(job, cluster, 1, monkeypatch) is None  # one requeue: within the budget
    publish(job, 2)
    # The node fails again and Slurm starts the job again at once (expedited): no pass ran.
    said = execution(job, cluster, 2, monkeypatch)
    assert said is not None, "the script ran past --max-requeues 1"
    assert "Slurm requeued it 2 time(s), past its --max-requeues 1" in said, said
    assert f"`dispatch release {job.id}` lets it run" in said
    assert f"`scontrol requeuehold {slurm_id}`" in said and "restart 2" in said
    assert ["scontrol", "requeuehold", slurm_id] in cluster.calls
    (held,) = job.history().of(events.RequeuesSpent)
    assert (held.used, held.budget, held.restarts, held.at_start) == (2, 1, 3, 2)
    # The supervisor's pass finds the job pending, held, and recorded: nothing more to do.
    assert cluster.jobs[slurm_id]["Restarts"] == "3"
    assert Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions == []
    assert ["scontrol", "hold", slurm_id] not in cluster.calls
    assert len(job.history().of(events.RequeuesSpent)) == 1
    text = status_text.render(
        status.collect(job, Slurm(cluster, wait=0).own_jobs(), facts_reader=lambda _: [])
    )
    assert "past its --max-requeues 1" in text, text
    # A person's release lets it run.
    assert release(Slurm(cluster, wait=0), job) == slurm_id
    assert execution(job, cluster, 3, monkeypatch) is None
    assert cluster.calls.count(["scontrol", "requeuehold", slurm_id]) == 1


def test_a_requeue_with_budget_left_runs_the_script(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "2", "--max-no-progress", "2")
    start(job, restart=0, publish=(1,))
    assert execution(job, cluster, 1, monkeypatch) is None
    publish(job, 2)
    assert execution(job, cluster, 2, monkeypatch) is None
    assert not [c for c in cluster.calls if c[:2] == ["scontrol", "requeuehold"]]
    assert not job.history().of(events.RequeuesSpent) and not job.history().of(events.NoProgress)


def test_a_requeue_after_executions_without_progress_waits_for_a_person(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "2", "--max-requeues", "3")
    slurm_id = last_id(job)
    start(job, restart=0)  # each crashes (its node fails) before its first save
    assert execution(job, cluster, 1, monkeypatch) is None  # one in a row: not the limit
    said = execution(job, cluster, 2, monkeypatch)
    assert said is not None, "the script ran past --max-no-progress 2"
    assert (
        "2 execution(s) in a row (S1 R0, S1 R1) published nothing past the save they "
        f"resumed from, nothing (a fresh start) (--max-no-progress 2); Slurm job {slurm_id} "
        f"is held: `dispatch release {job.id}` lets it run again" in said
    ), said
    (stop,) = job.history().of(events.NoProgress)
    assert (stop.action, stop.at_start, stop.slurm_job_id) == ("held", 2, slurm_id)
    assert job.history().lineage().stopped == stop
    assert Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions == []
    assert len(job.history().of(events.NoProgress)) == 1
    assert release(Slurm(cluster, wait=0), job) == slurm_id
    assert execution(job, cluster, 3, monkeypatch) is None  # released: it runs
    # It publishes, then its node fails: the launcher's own requeue (2 -> 3) is no requeue
    # of Slurm's, so 3 of them are used, not 4: within --max-requeues 3.
    publish(job, 5)
    assert execution(job, cluster, 4, monkeypatch) is None
    assert not job.history().of(events.RequeuesSpent)


def test_a_first_execution_is_not_gated(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--max-no-progress", "1", "--max-requeues", "0")
    start(job, restart=0)
    # Restart 0 is a submission dispatch or a person made: the supervisor decided it.
    assert execution(job, cluster, 0, monkeypatch) is None


def test_the_launcher_says_why_on_stderr_and_ends_with_exit_2(tmp_path: Path) -> None:
    """At the process boundary: the launcher's own process, a fake scontrol on PATH."""
    spec = {
        "generation": 0,
        "checkpoint": str(tmp_path / "ck"),
        "script": "job.sh",
        "shared_checkpoint": False,
        "max_requeues": 0,
        "max_no_progress": 0,
    }
    job = record.create_job(spec, b'#!/bin/sh\necho ran >> "$RAN"\n', home=str(tmp_path / "home"))
    job.append(events.Submitted, once="1", submission=1, slurm_job_id="41", reason="new")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {
        **os.environ,
        "DISPATCH_HOME": str(tmp_path / "home"),
        "SLURM_JOB_ID": "41",
        "SLURM_RESTART_COUNT": "1",
        "SLURMD_NODENAME": "n1",
        "RAN": str(tmp_path / "ran"),
        "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            job.path,
            "--submission",
            "1",
            "--",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "ran").exists(), "the script ran"
    assert (
        "past its --max-requeues 0" in done.stderr and "does not run the script" in done.stderr
    ), done.stderr
    assert (tmp_path / "calls").read_text() == "requeuehold 41\n"


def test_a_fault_in_the_gate_runs_the_script(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # noqa: F811
    """The gate is a fault of ours where it cannot decide (a bug, a record event it does not
    expect): the launcher fails open, as the hooks do, and the script runs as it did before the
    gate; it said why on stderr.  It failed before: the traceback ended the execution, exit 1."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "0", "--max-no-progress", "2")
    start(job, restart=0)

    def fault(*_: object) -> int:
        raise KeyError("restarts")

    monkeypatch.setattr(noprogress, "requeues_used", fault)
    assert execution(job, cluster, 1, monkeypatch) is None, "the script did not run"
    err = capsys.readouterr().err
    assert "dispatch-launch: cannot tell whether this requeued execution" in err, err
    assert "KeyError" in err and "so it runs" in err, err
    assert not [c for c in cluster.calls if c[:2] == ["scontrol", "requeuehold"]]
    assert not job.history().of(events.RequeuesSpent)


@pytest.mark.parametrize(
    "options",
    [("--max-requeues", "0", "--max-no-progress", "0"), ("--max-no-progress", "1")],
    ids=["requeues-spent", "no-progress"],
)
def test_a_failed_requeuehold_leaves_no_record_that_the_job_is_held(
    home: Path, monkeypatch: pytest.MonkeyPatch, options: tuple[str, ...]
) -> None:  # noqa: F811
    """The stop is recorded before the requeue (the end Slurm gives the execution must not
    lose it); where `scontrol requeuehold` then fails, the execution ends with exit 2, its job
    ends, and nothing holds it.  It failed before: the record kept saying the job was held, so
    the supervisor's pass said "is held" of an ended job and did not resubmit it, and status
    and `dispatch release` offered a release of a job no one held."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "3", *options)
    slurm_id = last_id(job)
    start(job, restart=0)
    said = refused_hold(job, cluster, 1, monkeypatch, "Unable to contact slurm controller")
    assert said is not None and "failed (scontrol: error: Unable to contact" in said, said
    assert "ends with exit 2" in said, said
    line = job.history().lineage()
    assert line.spent is None and (line.stopped is None or line.stopped.action != "held")
    cluster.set(slurm_id, JobState="FAILED", Reason="None", ExitCode="2:0")
    actions = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions
    assert not any("is held" in action for action in actions), actions
    text = status_text.render(
        status.collect(job, Slurm(cluster, wait=0).own_jobs(), facts_reader=lambda _: [])
    )
    standing = text.split("SUBMISSION")[0]  # the record's events below keep their history
    assert "held" not in standing, text
    with pytest.raises(RecordError, match="has no hold to release"):
        release(Slurm(cluster, wait=0), job)
    assert ["scontrol", "release", slurm_id] not in cluster.calls
    # Its end is judged as any other: past --max-requeues a failure resubmits (budget 3);
    # without progress it is not resubmitted, and the pass says why.
    wanted = "resubmitted as submission 2" if "--max-requeues" in options else "not resubmitted"
    assert any(wanted in action for action in actions), actions


def test_two_executions_of_one_requeue_record_one_hold(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """Two executions of one requeue (a controller that restarted from older state runs it
    again): the first records the stop and holds the job; the second finds the stop recorded
    and its `scontrol requeuehold` fails (the job is pending now), which is no proof that
    the first's hold did not take: the record still says held.  It failed before: the second
    said the hold did not take."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "0", "--max-no-progress", "0")
    slurm_id = last_id(job)
    start(job, restart=0)
    assert execution(job, cluster, 1, monkeypatch) is not None
    assert cluster.calls.count(["scontrol", "requeuehold", slurm_id]) == 1
    said = refused_hold(job, cluster, 1, monkeypatch, "Job is pending execution")
    assert said is not None and "Job is pending execution" in said, said
    line = job.history().lineage()
    assert len(line.requeues_spent) == 1 and line.spent is not None, job.events()
    assert not job.history().of(events.Released)


def test_a_record_that_cannot_be_read_runs_the_script(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # noqa: F811
    """A record event the gate cannot read (a garbled file, a disk that returned part of it)
    is no proof that a budget is spent: the execution runs its script, as the supervisor
    restarts a job whose root cannot be listed, and says why on stderr.  It failed before
    f48db1d: the launcher ended with exit 2 and the script never ran."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "1", "--max-no-progress", "2")
    slurm_id = last_id(job)
    start(job, restart=0)
    with open(os.path.join(job.path, "events", "submitted-1.json"), "w") as garbled:
        garbled.write('{"event": "subm')

    def execve(*_: object) -> None:
        raise Ran()

    monkeypatch.setattr(os, "execve", execve)
    env = {**os.environ, "SLURM_JOB_ID": slurm_id, "SLURM_RESTART_COUNT": "1"}
    with pytest.raises(Ran):  # the script ran
        launch.launch(job.path, 1, [], env=env, slurm=Slurm(cluster, wait=0))
    err = capsys.readouterr().err
    assert "so it runs: RecordError: cannot read" in err and "submitted-1.json" in err, err
    assert not [c for c in cluster.calls if c[:2] == ["scontrol", "requeuehold"]]


def test_a_requeuehold_that_timed_out_may_have_held_the_job(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """A controller that did not answer in time may still have taken the requeue: the job may
    be pending, held, so the record keeps the stop as recorded (held), as the supervisor's pass
    and `dispatch release` then find it.  It failed before: the record said the hold did not
    take, and a held job had no hold `dispatch release` could lift."""
    cluster = FakeCluster()
    job = new_job(cluster, "--max-requeues", "0", "--max-no-progress", "0")
    start(job, restart=0)
    said = refused_hold(job, cluster, 1, monkeypatch, "Socket timed out on send/recv operation")
    assert said is not None and "Socket timed out" in said, said
    assert job.history().lineage().spent is not None
    assert not job.history().of(events.Released)
