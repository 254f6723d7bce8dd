"""A finished job's last execution is no live one: `dispatch gc` kept its
resume source and its unpublished saves for good, its epoch being the latest publication's,
though the job's record says it ended.  What a later submission of the same job runs stays
live, whenever it was made."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import gc
from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import forget, record

from .gc_world import World, epoch, posix_world

E1, E2 = epoch(1), epoch(1, 1)  # submission 1, then its requeue


def finished_lineage(world: World, job: str = "j") -> tuple[str, list[str], str, list[str]]:
    """A published 1..5; B, its requeue, resumed from A's step 3 and published 6 and 7."""
    a = world.execution(E1, job=job)
    a_pubs = [world.saved(a, E1, step) for step in range(1, 6)]
    b = world.execution(E2, resume=a_pubs[2], job=job)
    b_pubs = [world.saved(b, E2, step) for step in (6, 7)]
    return a, a_pubs, b, b_pubs


def test_a_finished_jobs_last_resume_source_and_folder_go(world: World) -> None:
    a, a_pubs, b, b_pubs = finished_lineage(world)
    kept = gc.collect(world.root, 1, lag=0, dry_run=True)
    assert f"exec/{a}/checkpoint-3" in kept.kept  # without the records: B may be live
    report = gc.collect(
        world.root, 1, lag=0, ended=lambda job: frozenset({a, b} if job == "j" else ())
    )
    assert not world.exists(f"exec/{a}"), "a finished job's last resume source stayed"
    assert world.names() == [b_pubs[-1]]
    assert world.exists(f"exec/{b}/checkpoint-7") and not world.exists(f"exec/{b}/checkpoint-6")
    assert next(f for f in report.folders if f.attempt == b).ended


def test_a_later_execution_of_an_ended_job_is_live(world: World) -> None:
    """Submission 2 (a person's dispatch resubmit) started from B's step 6 and has published
    nothing yet; its start is not in the record before the end: it and its source stay."""
    a, a_pubs, b, b_pubs = finished_lineage(world)
    c = world.execution(epoch(2), resume=b_pubs[0])
    world.put(f"exec/{c}/checkpoint-8/model.bin", 40)  # being written
    gc.collect(world.root, 1, lag=0, ended=lambda job: frozenset({a, b} if job == "j" else ()))
    assert world.exists(f"exec/{b}/checkpoint-6"), "a live execution's resume source went"
    assert world.exists(f"exec/{c}/checkpoint-8/model.bin")
    assert not world.exists(f"exec/{a}")


# --- the records, as dispatch gc reads them ------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "home")
    monkeypatch.setenv("DISPATCH_HOME", path)
    monkeypatch.setenv("DISPATCH_LISTING_LAG", "0")
    return path


def finished_job(home: str, root: str, started: tuple[str, ...] = ()) -> record.JobRecord:
    """A record of one submission whose executions ``started`` (attempts) ran, then finished."""
    job = record.create_job(
        {"generation": 0, "checkpoint": root, "cwd": home, "array_tasks": None},
        b"#!/bin/sh\n",
        home,
    )
    job.append("submitted", submission=1, slurm_job_id="50", reason="new", argv=[])
    for restart, attempt in enumerate(started):
        job.append(
            "started",
            submission=1,
            slurm_job_id="50",
            restart=restart,
            attempt=attempt,
            epoch=epoch(1, restart),
        )
    job.append(
        "finished", submission=1, slurm_job_id="50", end_state="completed", rule="stop (completed)"
    )
    return job


def test_dispatch_gc_reads_the_jobs_record(tmp_path: Path, home: str) -> None:
    """The execution that resumed from A's step 3 was the job's last: the job finished."""
    world = posix_world(tmp_path)
    job = record.create_job(
        {"generation": 0, "checkpoint": world.root, "cwd": home, "array_tasks": None},
        b"#!/bin/sh\n",
        home,
    )
    a, a_pubs, b, b_pubs = finished_lineage(world, job.id)
    for restart, attempt in enumerate((a, b)):
        job.append(
            "started",
            submission=1,
            slurm_job_id="50",
            restart=restart,
            attempt=attempt,
            epoch=epoch(1, restart),
        )
    job.append(
        "finished", submission=1, slurm_job_id="50", end_state="completed", rule="stop (completed)"
    )
    done = CliRunner().invoke(cli.main, ["gc", "--root", world.root, "--keep", "1"])
    assert done.exit_code == 0, done.output
    assert not world.exists(f"exec/{a}"), "a finished job's last resume source stayed"
    assert world.names() == [b_pubs[-1]]


def test_what_a_record_says_of_its_end(home: str) -> None:
    job = finished_job(home, "/nowhere", ("a" * 26, "b" * 26))
    assert forget.ended_attempts(job) == {"a" * 26, "b" * 26}
    assert forget.ended_executions(home)(job.id) == {"a" * 26, "b" * 26}
    assert forget.ended_executions(home)("j") == frozenset()  # no record here: may still run
    # A person's dispatch resubmit after the end: its execution is not ended, the others are.
    job.append("submitted", submission=2, slurm_job_id="51", reason="manual", argv=[])
    job.append("started", submission=2, slurm_job_id="51", attempt="c" * 26, epoch=epoch(2))
    assert forget.ended_attempts(job) == {"a" * 26, "b" * 26}
    # Not settled at all: an end the supervisor has not decided.
    other = record.create_job(
        {"generation": 0, "checkpoint": "/nowhere", "cwd": home, "array_tasks": None},
        b"#!/bin/sh\n",
        home,
    )
    other.append("submitted", submission=1, slurm_job_id="60", reason="new", argv=[])
    other.append("started", submission=1, slurm_job_id="60", attempt="d" * 26, epoch=E1)
    assert forget.ended_attempts(other) == frozenset()
