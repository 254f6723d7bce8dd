"""One job's failed action is that job's: reported naming the job and the
action, and the pass goes on for the others, as it does for an unreadable record.  Both
backends' shapes: scontrol's refusal (the command-line tools, at the process boundary) and
pyslurm's (``RPCError``, and the ``TypeError`` pyslurm 24.11.0's old API raises), the latter
through the real :class:`PyslurmBackend` over a stand-in ``pyslurm`` module."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pytest

from slurm_dispatch.control import record
from slurm_dispatch.control.holds import Answer
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes.cluster import FakeCluster
from .test_supervisor import last_slurm_id, new_job

INVALID = "Invalid job id specified"


def ceased(argv: list[str], timeout: float) -> Answer:
    return Answer("ceased", 0, {})


class Refusing:
    """The fake controller, but ``scontrol release`` of the ids in ``refused`` fails as
    scontrol does for a job slurmctld no longer knows."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.refused: set[str] = set()

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        if list(argv[:2]) == ["scontrol", "release"] and set(argv[2].split(",")) & self.refused:
            return Result(list(argv), 1, "", f"scontrol: error: {INVALID}\n")
        return self.cluster(argv, env, cwd, timeout)


def two_held(cluster: FakeCluster, sup: Supervisor) -> tuple[list[record.JobRecord], list[str]]:
    jobs = []
    for _ in range(2):
        job, first = new_job(cluster, "--shared-checkpoint", "--resubmit", "3")
        cluster.set(first, JobState="NODE_FAIL")
        jobs.append(job)
    # Both held by a pass that asks no signal (one that does asks at once): the test's own
    # pass asks and releases.
    Supervisor(sup.slurm, dataclasses.replace(sup.settings, signal=None)).run_pass()
    held = [last_slurm_id(job) for job in jobs]
    assert all(cluster.jobs[h]["Reason"] == "JobHeldUser" for h in held)
    return jobs, held


def test_a_refused_release_is_that_jobs_error_and_the_pass_goes_on(home: Path) -> None:
    cluster = FakeCluster()
    runner = Refusing(cluster)
    sup = Supervisor(Slurm(runner, wait=0), Settings(interval=0), signal_runner=ceased)
    (first, second), (held1, held2) = two_held(cluster, sup)
    runner.refused.add(held1)
    report = sup.run_pass()
    (error,) = report.errors
    assert (
        error.startswith(f"{first.id}: ")
        and f"release Slurm job {held1}" in error
        and INVALID in error
        and "\n" not in error
    ), error
    assert any(
        a.startswith(f"{second.id}: hold on Slurm job {held2} lifted") for a in report.actions
    ), report.actions
    assert cluster.jobs[held2]["JobState"] == "RUNNING"
    assert [e["event"] for e in first.events()][-1] == "cessation"  # no release recorded


class StandIn:
    """A stand-in ``pyslurm``: ``Job(n).release()`` fails for the ids in ``failing`` with the
    exception given, and releases the fake controller's job otherwise."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.failing: dict[str, BaseException] = {}
        module = types.ModuleType("pyslurm")

        class RPCError(Exception):
            pass

        stand_in = self

        class Job:
            def __init__(self, job_id: int) -> None:
                self.job_id = str(job_id)

            def release(self) -> None:
                if self.job_id in stand_in.failing:
                    raise stand_in.failing[self.job_id]
                stand_in.cluster.set(self.job_id, JobState="RUNNING", Reason="None")

            def modify(self, changes: Any) -> None:
                stand_in.cluster.set(self.job_id, Comment=changes.comment)

        class JobSubmitDescription:
            def __init__(self, comment: str = "") -> None:
                self.comment = comment

        module.RPCError = RPCError  # type: ignore[attr-defined]
        module.Job = Job  # type: ignore[attr-defined]
        module.JobSubmitDescription = JobSubmitDescription  # type: ignore[attr-defined]
        self.module = module


class Hybrid:
    """The adapter's backend: reads from the fake controller, actions through the real
    PyslurmBackend (over the stand-in module)."""

    def __init__(self, cluster: FakeCluster, backend: Any) -> None:
        self.tools, self.backend = Slurm(cluster, wait=0), backend

    def user_jobs(self, uid: int) -> list[Any]:
        return list({id(j): j for j in self.tools.own_jobs().values()}.values())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


@pytest.mark.parametrize("shape", ["rpc", "type"])
def test_pyslurms_failed_release_is_that_jobs_error(
    home: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    cluster = FakeCluster()
    stand_in = StandIn(cluster)
    monkeypatch.setitem(sys.modules, "pyslurm", stand_in.module)
    monkeypatch.delitem(sys.modules, "slurm_dispatch.slurm.pyslurm_backend", raising=False)
    backend_module = importlib.import_module("slurm_dispatch.slurm.pyslurm_backend")
    from slurm_dispatch.slurm.release import Probe

    backend = backend_module.PyslurmBackend(Probe(True, "", "22.5.3", "22.05.8"))
    slurm = Slurm(cluster, wait=0)
    slurm._chosen = Hybrid(cluster, backend)
    sup = Supervisor(slurm, Settings(interval=0), signal_runner=ceased)
    (first, second), (held1, held2) = two_held(cluster, sup)
    stand_in.failing[held1] = (
        stand_in.module.RPCError(INVALID)
        if shape == "rpc"  # type: ignore[attr-defined]
        else TypeError("an integer is required")
    )
    report = sup.run_pass()
    (error,) = report.errors
    said = INVALID if shape == "rpc" else "an integer is required"
    assert (
        error.startswith(f"{first.id}: ")
        and f"release Slurm job {held1}" in error
        and said in error
        and "\n" not in error
    ), error
    assert any(
        a.startswith(f"{second.id}: hold on Slurm job {held2} lifted") for a in report.actions
    ), report.actions
    assert cluster.jobs[held2]["JobState"] == "RUNNING"
    monkeypatch.delitem(sys.modules, "slurm_dispatch.slurm.pyslurm_backend")


def test_an_unexpected_error_in_one_job_is_that_jobs(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever one job's handling raises (a bug, a full disk) is reported for that job; the
    others are still handled."""
    cluster = FakeCluster()
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    jobs = []
    for _ in range(2):
        job, first = new_job(cluster, "--resubmit", "1")
        cluster.set(first, JobState="FAILED")
        jobs.append(job)
    original = Supervisor._job
    bad = jobs[0].id

    def failing(self: Supervisor, job: record.JobRecord, *args: Any) -> None:
        if job.id == bad:
            raise OSError(28, "No space left on device")
        original(self, job, *args)

    monkeypatch.setattr(Supervisor, "_job", failing)
    report = sup.run_pass()
    (error,) = report.errors
    assert error.startswith(f"{bad}: ") and "No space left on device" in error, error
    assert any(a.startswith(f"{jobs[1].id}: ") and "resubmitted" in a for a in report.actions)


def test_a_forgotten_held_job_is_one_error_and_no_release_is_tried(home: Path) -> None:
    """The held job slurmctld forgot: its job's one line each pass (the hold stands until it
    expires), no release that can only fail; the other job's hold is lifted."""
    cluster = FakeCluster()
    runner = Refusing(cluster)
    sup = Supervisor(Slurm(runner, wait=0), Settings(interval=0), signal_runner=ceased)
    (first, second), (held1, held2) = two_held(cluster, sup)
    runner.refused.add(held1)
    del cluster.jobs[held1]
    report = sup.run_pass()
    (error,) = report.errors
    assert error.startswith(f"{first.id}: the held Slurm job {held1} is no longer known")
    assert not [c for c in cluster.calls if c[:2] == ["scontrol", "release"] and held1 in c[2]]
    assert cluster.jobs[held2]["JobState"] == "RUNNING"
