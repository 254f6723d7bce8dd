"""Dependencies on dispatch jobs follow their current submission (issue 9: a resubmission gets
a new Slurm job id, so `--dependency=afterok:<id>` of a downstream job never started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch import dependency, submit
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm import Slurm

from .fake_cluster import FakeCluster

LOOKUP = {"dabcdefg": "101", "dhjkmnpq": None}.get


@pytest.mark.parametrize("value,expected", [
    ("afterok:dabcdefg", "afterok:101"),
    ("afterok:dabcdefg:55,afterany:dhjkmnpq", "afterok:101:55"),
    ("afterany:dhjkmnpq,afterok:dabcdefg+5", "afterok:101+5"),
    ("afterok:dabcdefg?afterany:dhjkmnpq", ""),  # one alternative satisfied: all are
    ("afterok:77,singleton", "afterok:77,singleton"),
    ("afterok:dhjkmnpq", ""),
])
def test_rewrite_keeps_slurms_grammar(value: str, expected: str) -> None:
    assert dependency.rewrite(value, LOOKUP) == expected


def test_only_dispatch_ids_are_names() -> None:
    assert dependency.named_jobs("afterok:dabcdefg:123:dlooooo1,singleton") == ["dabcdefg"]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    return FakeCluster(first_id=70)


def submit_one(cluster: FakeCluster, root: str, *extra: str) -> submit.Submitted:
    return submit.submit_new(submit.read_request(["--checkpoint", root, *extra, "job.sh"]),
                             Slurm(cluster, wait=0))


def test_a_downstream_job_follows_its_upstreams_resubmission(cluster: FakeCluster) -> None:
    up = submit_one(cluster, "ck-up", "--resubmit", "1")
    down = submit_one(cluster, "ck-down", f"--dependency=afterok:{up.job.id}")
    assert f"--dependency=afterok:{up.slurm_job_id}" in cluster.sbatch_calls()[-1]
    cluster.set(down.slurm_job_id, JobState="PENDING", Reason="Dependency")
    cluster.set(up.slurm_job_id, JobState="FAILED")
    again = submit.resubmit(Slurm(cluster, wait=0), up.job)
    updated = dependency.follow(Slurm(cluster, wait=0), up.job, again.slurm_job_id)
    assert updated == [down.slurm_job_id]
    assert cluster.calls[-1] == ["scontrol", "update", f"jobid={down.slurm_job_id}",
                                 f"dependency=afterok:{again.slurm_job_id}"]


def test_an_upstream_that_ended_for_good_is_named(cluster: FakeCluster) -> None:
    up = submit_one(cluster, "ck-up")
    up.job.append("finished", submission=1, slurm_job_id=up.slurm_job_id,
                  end_state="failed", rule="stop (no resubmit budget)")
    del cluster.jobs[up.slurm_job_id]
    with pytest.raises(UsageError, match=f"dispatch job {up.job.id} ended failed for good"):
        submit_one(cluster, "ck-down", "-d", f"afterok:{up.job.id}")


def test_an_upstream_that_completed_and_was_forgotten_is_satisfied(cluster: FakeCluster
                                                                   ) -> None:
    up = submit_one(cluster, "ck-up")
    up.job.append("finished", submission=1, slurm_job_id=up.slurm_job_id,
                  end_state="completed", rule="stop (done)")
    del cluster.jobs[up.slurm_job_id]
    submit_one(cluster, "ck-down", "-d", f"afterok:{up.job.id}")
    argv = cluster.sbatch_calls()[-1]
    assert not any("dependency" in a or a == "-d" for a in argv), argv


def test_a_dispatch_id_in_an_sbatch_line_is_refused(cluster: FakeCluster) -> None:
    Path("job.sh").write_text("#!/bin/bash\n#SBATCH --dependency=afterok:dabcdefg\necho\n")
    with pytest.raises(UsageError, match="on the command line"):
        submit_one(cluster, "ck")


def test_the_supervisors_resubmission_moves_the_dependents(cluster: FakeCluster) -> None:
    from slurm_dispatch.supervisor import Settings, Supervisor
    up = submit_one(cluster, "ck-up", "--resubmit", "1")
    down = submit_one(cluster, "ck-down", f"--dependency=afterok:{up.job.id}")
    cluster.set(down.slurm_job_id, JobState="PENDING", Reason="DependencyNeverSatisfied")
    cluster.set(up.slurm_job_id, JobState="FAILED")
    report = Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    new = up.job.history().lineage().current
    assert new is not None and new.submission == 2
    assert cluster.jobs[down.slurm_job_id]["Dependency"] == f"afterok:{new.slurm_job_id}"
    assert any(f"Slurm job {down.slurm_job_id} now waits" in a for a in report.actions)
