"""What the soak's runner gathers for the checker, from real records (written through
:mod:`slurm_dispatch.control.record`, as the supervisor writes them): every submission, every
hold made and every hold lifted, with when; nothing of another run's records."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

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


class Workload(run.Soak):
    """The runner with squeue and dispatch-sbatch answered at the process boundary."""

    def __init__(self, squeue: str) -> None:
        super().__init__(argparse.Namespace(seed=5, minutes=30.0, nodes=8, jobs=14, drain=240))
        self.user, self.squeue = "u", squeue
        self.submitted: list[tuple[str, tuple[str, ...]]] = []

    def slurm(self, argv: list[str], timeout: float = 20) -> str:
        assert argv[0] == "squeue", argv
        return self.squeue

    def submit(self, kind: str, *extra: str, root: Optional[str] = None,
               env: Optional[dict[str, str]] = None) -> Optional[str]:
        self.submitted.append((kind, extra))
        return None


def test_the_workload_keeps_a_shared_job_going_all_the_run() -> None:
    """Seed 239998's 30-minute run had its shared jobs of the first wave only, over 5 minutes
    in: lifted-while-writing examined 1 lift, shared-overlap 1 pair.  Now the workload submits
    a --shared-checkpoint job whenever none of its shared ones is pending or running, and
    others while one is."""
    soak = Workload(squeue="publish-3\nwatch-4\n")
    soak.jobs = {"j1": {"name": "shared-12", "shared": True},
                 "j2": {"name": "publish-3", "shared": False}}
    soak.submit_some()
    ((kind, extra),) = soak.submitted
    assert kind == "shared-failing" and "--shared-checkpoint" in extra
    soak.squeue = "shared-12\npublish-3\n"
    soak.submitted.clear()
    for _ in range(20):
        soak.submit_some()
    assert len(soak.submitted) == 20
    assert not [kind for kind, _ in soak.submitted if kind.startswith("shared")]
