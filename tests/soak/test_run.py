"""What the soak's runner gathers for the checker, from real records (written through
:mod:`slurm_dispatch.control.record`, as the supervisor writes them): every submission, every
hold made and every hold lifted, with when; nothing of another run's records."""

from __future__ import annotations

from pathlib import Path

from slurm_dispatch.control import events, record
from soak import run


def test_a_records_submissions_holds_and_lifts_are_read_as_stored(tmp_path: Path) -> None:
    job = record.create_job({"name": "shared-1"}, b"#!/bin/sh\n", home=str(tmp_path))
    job.append(events.Submitted, submission=1, slurm_job_id="100")
    job.append(events.Hold, submission=2, slurm_job_id="101", ended_slurm_job_id="100",
               deadline=9e9)
    job.append(events.Submitted, submission=2, slurm_job_id="101")
    job.append(events.Cessation, held_slurm_job_id="101", ended_slurm_job_id="100",
               verdict="ceased")
    job.append(events.Released, slurm_job_id="101", by="cessation signal")
    found = run.record_facts(job.id, record.JobRecord(job.path).events())
    assert [(s["submission"], s["slurm_job_id"]) for s in found["submissions"]] == \
        [(1, "100"), (2, "101")]
    (hold,) = found["holds"]
    assert (hold["slurm_job_id"], hold["ended_slurm_job_id"]) == ("101", "100")
    (lift,) = found["lifts"]
    assert (lift["kind"], lift["by"], lift["slurm_job_id"]) == \
        ("released", "cessation signal", "101")
    assert hold["t"] <= lift["t"]
