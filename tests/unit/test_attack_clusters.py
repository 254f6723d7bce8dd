"""Attack on two clusters over one home: a record made before records carried the cluster belongs to
every cluster, so over one home its Slurm job id may be another job's on this cluster (ids repeat
across clusters).  Slurm's view of that other job must not decide the old record's end."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import record, submit
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import SlurmError
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture


def _without_cluster(job: record.JobRecord) -> None:
    path = os.path.join(job.path, "job.json")
    with open(path, encoding="utf-8") as handle:
        spec = json.load(handle)
    spec.pop("cluster", None)
    os.chmod(path, 0o644)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    os.chmod(path, 0o444)


def _old_and_mine(cluster: FakeCluster) -> tuple[submit.SubmissionMade, submit.SubmissionMade]:  # noqa: F811
    """An old record (no cluster) whose Slurm job id is, here, a job of another record."""
    old = submit_one("ck-old", "--resubmit", "2")
    _without_cluster(old.job)
    assert record.JobRecord(old.job.path).cluster is None
    # It ran on the other cluster: here its id is free, then taken by a job of this one.
    del cluster.jobs[old.slurm_job_id]
    cluster.ids = itertools.count(int(old.slurm_job_id))
    mine = submit_one("ck-mine")
    assert mine.slurm_job_id == old.slurm_job_id
    return old, mine


def test_cancelling_an_old_record_never_cancels_another_job_with_its_slurm_id(
    cluster: FakeCluster,
) -> None:  # noqa: F811
    old, mine = _old_and_mine(cluster)
    done = CliRunner().invoke(cli.main, ["cancel", old.job.id])
    assert done.exit_code == 0, done.output + done.stderr
    assert not [c for c in cluster.calls if c[0] == "scancel"], cluster.calls
    assert cluster.jobs[mine.slurm_job_id]["JobState"] == "RUNNING"
    assert f"dispatch job {old.job.id} has no active Slurm job" in done.output


def test_an_old_record_is_not_ended_by_another_job_with_its_slurm_id(cluster: FakeCluster) -> None:  # noqa: F811
    old, mine = _old_and_mine(cluster)
    cluster.set(mine.slurm_job_id, JobState="FAILED")
    before = len(cluster.sbatch_calls())
    report = Supervisor(Slurm(), Settings()).run_pass()
    assert len(cluster.sbatch_calls()) == before, report.actions  # nothing resubmitted
    assert not any(old.job.id in line and "resubmit" in line for line in report.actions), (
        report.actions
    )
    assert record.JobRecord(old.job.path).history().submissions[-1].submission == 1


def test_a_pass_that_cannot_tell_its_cluster_acts_on_no_other_clusters_job(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    # A configless site in an outage: scontrol show config does not answer (this fake
    # controller refuses it), squeue does.  The other cluster's record must not be read as a
    # job of this one that slurmctld forgot.
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "other")
    theirs = submit_one("ck-theirs")
    monkeypatch.delenv("SLURM_CLUSTER_NAME")
    assert record.JobRecord(theirs.job.path).cluster == "other"
    del cluster.jobs[theirs.slurm_job_id]
    answer = FakeCluster.__call__

    def outage(self: FakeCluster, argv: list[str], *rest: object) -> Result:
        if argv[:3] == ["scontrol", "show", "config"]:
            return Result(
                argv,
                1,
                "",
                "slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)\n",
            )
        return answer(self, argv, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(FakeCluster, "__call__", outage)
    with pytest.raises(SlurmError, match="cannot tell which cluster"):
        Supervisor(Slurm(), Settings()).run_pass()
    assert len(record.JobRecord(theirs.job.path).history().events) == len(
        theirs.job.history().events
    )


def test_jobs_and_status_never_show_another_jobs_state_for_an_old_record(
    cluster: FakeCluster,
) -> None:  # noqa: F811
    old, mine = _old_and_mine(cluster)
    lines = CliRunner().invoke(cli.main, ["jobs"]).output.splitlines()
    row = {line.split()[0]: line.split() for line in lines[1:]}
    assert row[mine.job.id][4] == "RUNNING"
    assert row[old.job.id][4] != "RUNNING", lines
    shown = CliRunner().invoke(cli.main, ["status", "--json", old.job.id])
    assert shown.exit_code == 0, shown.output + shown.stderr
    assert "RUNNING" not in json.dumps(json.loads(shown.output)["submissions"]), shown.output
