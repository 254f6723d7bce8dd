"""What the soak's runner gathers for the checker, from real records (written through
:mod:`slurm_dispatch.control.record`, as the supervisor writes them): every submission, every
hold made and every hold lifted, with when; nothing of another run's records."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from slurm_dispatch.control import events, record
from soak import cases, run


def test_a_records_submissions_holds_and_lifts_are_read_as_stored(tmp_path: Path) -> None:
    job = record.create_job({"name": "shared-1"}, b"#!/bin/sh\n", home=str(tmp_path))
    job.append(events.Submitted, submission=1, slurm_job_id="100")
    job.append(
        events.Hold, submission=2, slurm_job_id="101", ended_slurm_job_id="100", deadline=9e9
    )
    job.append(events.Submitted, submission=2, slurm_job_id="101")
    job.append(
        events.Cessation, held_slurm_job_id="101", ended_slurm_job_id="100", verdict="ceased"
    )
    job.append(events.Released, slurm_job_id="101", by="cessation signal")
    found = run.record_facts(job.id, record.JobRecord(job.path).events())
    assert [(s["submission"], s["slurm_job_id"]) for s in found["submissions"]] == [
        (1, "100"),
        (2, "101"),
    ]
    (hold,) = found["holds"]
    assert (hold["slurm_job_id"], hold["ended_slurm_job_id"]) == ("101", "100")
    (lift,) = found["lifts"]
    assert (lift["kind"], lift["by"], lift["slurm_job_id"]) == (
        "released",
        "cessation signal",
        "101",
    )
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

    def submit(
        self,
        kind: str,
        *extra: str,
        root: Optional[str] = None,
        env: Optional[dict[str, str]] = None,
    ) -> Optional[str]:
        self.submitted.append((kind, extra))
        return None


def test_the_workload_keeps_a_shared_job_going_all_the_run() -> None:
    """Seed 239998's 30-minute run had its shared jobs of the first wave only, over 5 minutes
    in: lifted-while-writing examined 1 lift, shared-overlap 1 pair.  Now the workload submits
    a --shared-checkpoint job whenever none of its shared ones is pending or running, and
    others while one is."""
    soak = Workload(squeue="publish-3\nwatch-4\n")
    soak.jobs = {
        "j1": {"name": "shared-12", "shared": True},
        "j2": {"name": "publish-3", "shared": False},
    }
    soak.submit_some()
    ((kind, extra),) = soak.submitted
    assert kind == "shared-failing" and "--shared-checkpoint" in extra
    soak.squeue = "shared-12\npublish-3\n"
    soak.submitted.clear()
    for _ in range(20):
        soak.submit_some()
    assert len(soak.submitted) == 20
    assert not [kind for kind, _ in soak.submitted if kind.startswith("shared")]


def test_a_records_executions_stops_and_quarantines_are_read_as_stored(tmp_path: Path) -> None:
    """The recovery rules' cases (docs/user-guide.md): the checker counts a job's executions, its
    stop for want of progress and its quarantined saves from the record the supervisor wrote."""
    job = record.create_job({"name": "noprogress-1"}, b"#!/bin/sh\n", home=str(tmp_path))
    job.append(events.Started, submission=1, attempt="a1", resume_from="")
    job.append(events.Started, submission=2, attempt="a2", resume_from="/ck/exec/a0/s-10")
    job.append(
        events.NoProgress,
        submission=2,
        slurm_job_id="101",
        limit=2,
        action="not resubmitted",
        executions=[[1, 0, "a1"], [2, 0, "a2"]],
    )
    job.append(events.Quarantined, save="/ck/exec/a0/s-10", root="/ck", executions=[[2, 0, "a2"]])
    found = run.record_facts(job.id, record.JobRecord(job.path).events())
    assert [(s["attempt"], s["resume_from"]) for s in found["started"]] == [
        ("a1", ""),
        ("a2", "/ck/exec/a0/s-10"),
    ]
    (stop,) = found["stops"]
    assert (stop["action"], stop["limit"], stop["executions"][-1]) == (
        "not resubmitted",
        2,
        [2, 0, "a2"],
    )
    (quarantined,) = found["quarantines"]
    assert (quarantined["save"], quarantined["root"]) == ("/ck/exec/a0/s-10", "/ck")


def test_the_nemesis_never_cancels_or_requeues_the_jobs_of_issue_33s_cases() -> None:
    """A cancel ends the no-progress or the poisoned job before its case is made."""
    soak = Workload(squeue="101 publish-3\n102 noprogress-4\n103 poisoned-5\n")
    soak.jobs = {
        "j1": {"name": "publish-3", "kind": "publish"},
        "j2": {"name": "noprogress-4", "kind": "noprogress"},
        "j3": {"name": "poisoned-5", "kind": "poisoned"},
    }
    assert soak.running() == ["101"]


def test_every_shared_job_is_submitted_without_a_stop_for_want_of_progress() -> None:
    """A shared job's trainer publishes nothing (one state file in the root): under issue
    33's default (--max-no-progress 3) each execution counts as one without progress, and
    its restarts, the holds and pairs of executions lifted-while-writing and shared-overlap
    examine, stop after three."""
    soak = Workload(squeue="")
    soak.run_dir = "/run"
    soak.first_wave()
    soak.jobs = {}
    soak.submit_some()  # no shared job pending or running: another is submitted
    shared = [extra for _, extra in soak.submitted if "--shared-checkpoint" in extra]
    assert len(shared) == 3
    for extra in shared:
        assert extra[extra.index("--max-no-progress") + 1] == "0", extra


def test_an_overlap_job_restarted_before_its_cut_is_given_up_for_a_new_one() -> None:
    """Seed 186313's 5-minute run (make soak, as .ci/run runs it) failed: 'isolated-overlap NOT
    MADE'.  The job the case follows was requeued by another fault (its node cut for the
    shared-relaunch case) before it had published twice; the case waited for a first execution
    that was gone for the rest of the run.  Now it submits another job to follow, and the
    nemesis's requeues and cancels spare the one it follows."""
    soak = Workload(squeue="")
    soak.jobs = {"j1": {"name": "overlap-2", "root": "/ck", "kind": "overlap", "shared": False}}
    follow = cases.Cases(soak)
    follow.overlap_job, follow.overlap = "overlap-2", {"job": "j1"}
    facts = [
        {"ev": "start", "job": "j1", "attempt": "a1", "t": 1.0},
        {"ev": "start", "job": "j1", "attempt": "a2", "t": 2.0},
    ]
    follow.isolated_overlap(facts)
    assert [kind for kind, _ in soak.submitted] == ["overlap"]
    assert "overlap" in cases.SPARED_KINDS
