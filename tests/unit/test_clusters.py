"""Two clusters, one home: records carry the cluster they were submitted
to, and every command acts on its own cluster's jobs only.

Two fake controllers stand for the two clusters; the cluster a command runs on is named the
way a job's environment names it (``SLURM_CLUSTER_NAME``), or by the slurm.conf it reads.
Their job ids repeat, as two clusters' do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import record, submit
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import SlurmError, UsageError
from slurm_dispatch.slurm.adapter import Slurm, local_cluster_name

from ..fakes.cluster import FakeCluster


@pytest.fixture
def two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeCluster]:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    fakes = {"alpha": FakeCluster(first_id=50), "beta": FakeCluster(first_id=50)}
    original = Slurm.__init__

    def init(self: Slurm, runner: object = None, **kwargs: object) -> None:
        import os

        original(self, fakes[os.environ["SLURM_CLUSTER_NAME"]], wait=0)  # type: ignore

    monkeypatch.setattr(Slurm, "__init__", init)
    return fakes


def on(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("SLURM_CLUSTER_NAME", name)


def submit_one(root: str) -> submit.SubmissionMade:
    return submit.submit_new(
        submit.read_request(["--checkpoint", root, "--resubmit", "1", "job.sh"]), Slurm()
    )


def test_the_cluster_is_read_from_the_job_environment_then_slurm_conf(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("# ClusterName=commented\nclustername = Alpha  # comment\n")
    assert local_cluster_name({"SLURM_CONF": str(conf)}) == "alpha"
    assert local_cluster_name({"SLURM_CONF": str(conf), "SLURM_CLUSTER_NAME": "Beta"}) == "beta"
    assert local_cluster_name({"SLURM_CONF": str(tmp_path / "missing")}) is None


def test_a_supervisor_never_touches_nor_warns_about_another_clusters_jobs(
    two: dict[str, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "alpha")
    a = submit_one("ck-a")
    assert a.job.cluster == "alpha"
    on(monkeypatch, "beta")
    b = submit_one("ck-b")
    assert b.slurm_job_id == a.slurm_job_id  # ids repeat across clusters
    two["beta"].set(b.slurm_job_id, JobState="FAILED")
    report = Supervisor(Slurm(), Settings()).run_pass()
    assert report.errors == []
    assert [x.split(":")[0] for x in report.actions] == [b.job.id]  # beta's own job only
    assert [e["event"] for e in a.job.events()] == ["submitted"]
    # Alpha's supervisor: its job is running there; beta's job (unknown to alpha) is not its.
    on(monkeypatch, "alpha")
    del two["beta"].jobs[b.slurm_job_id]
    report = Supervisor(Slurm(), Settings()).run_pass()
    assert report.errors == [] and report.actions == []
    assert all(c[0] == "squeue" for c in two["alpha"].calls[1:])


def test_commands_act_on_their_own_clusters_jobs_and_name_the_other(
    two: dict[str, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "alpha")
    a = submit_one("ck-a")
    other = submit_one("ck-a2")
    on(monkeypatch, "beta")
    b = submit_one("ck-b")
    run = CliRunner().invoke
    # The same Slurm id on both: each cluster's own.
    shown = json.loads(run(cli.main, ["status", "--json", a.slurm_job_id]).output)
    assert shown["id"] == b.job.id and shown["cluster"] == "beta"
    # A Slurm id only alpha's record has: said so, naming the cluster.
    for command in (["status"], ["cancel"], ["latest"], ["resubmit"], ["release"]):
        result = run(cli.main, [*command, other.slurm_job_id])
        assert result.exit_code == 2, (command, result.output)
        assert f"dispatch job {other.job.id} of cluster 'alpha'" in result.stderr, command
    result = run(cli.main, ["cancel", a.job.id])
    assert result.exit_code == 2 and "submitted to cluster 'alpha'" in result.stderr
    assert two["alpha"].jobs[a.slurm_job_id]["JobState"] == "RUNNING"
    # jobs: this cluster's only, with a CLUSTER column since two are known; -M all: both.
    lines = run(cli.main, ["jobs"]).output.splitlines()
    assert lines[0].split()[:2] == ["DISPATCH_JOB", "CLUSTER"]
    assert [line.split()[:2] for line in lines[1:]] == [[b.job.id, "beta"]]
    every = run(cli.main, ["jobs", "--clusters", "all"]).output.splitlines()[1:]
    assert sorted(line.split()[1] for line in every) == ["alpha", "alpha", "beta"]
    assert run(cli.main, ["jobs", "-M", "alpha", "--json"]).exit_code == 0


def test_an_old_record_without_a_cluster_is_the_current_clusters(
    two: dict[str, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "alpha")
    a = submit_one("ck-a")
    spec = Path(a.job.path) / "job.json"
    data = json.loads(spec.read_text())
    del data["cluster"]
    spec.chmod(0o644)
    spec.write_text(json.dumps(data))
    record.open_job(a.slurm_job_id, cluster="alpha")
    result = CliRunner().invoke(cli.main, ["jobs"])
    assert result.exit_code == 0 and result.stderr == ""
    assert "CLUSTER" not in result.output and a.job.id in result.output
    on(monkeypatch, "beta")
    assert a.job.id in CliRunner().invoke(cli.main, ["jobs"]).output


def test_a_job_of_another_cluster_is_not_superseded_from_this_one(
    two: dict[str, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    on(monkeypatch, "alpha")
    a = submit_one("ck-a")
    on(monkeypatch, "beta")
    with pytest.raises(UsageError, match="submitted to cluster 'alpha'"):
        submit.submit_new(submit.read_request(["--supersede", a.job.id, "job.sh"]), Slurm())
    assert two["alpha"].jobs[a.slurm_job_id]["JobState"] == "RUNNING"
    assert [j.id for j in record.all_jobs()] == [a.job.id]


def test_a_dependency_on_another_clusters_job_is_refused(
    two: dict[str, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its Slurm job ids are another controller's: here they name other jobs, or none."""
    on(monkeypatch, "alpha")
    a = submit_one("ck-a")
    on(monkeypatch, "beta")
    submit_one("ck-b")  # beta's own job with the same Slurm id as alpha's
    with pytest.raises(UsageError, match="submitted to cluster 'alpha'"):
        submit.submit_new(
            submit.read_request(
                ["--checkpoint", "ck-c", f"--dependency=afterok:{a.job.id}", "job.sh"]
            ),
            Slurm(),
        )
    assert not [c for c in two["beta"].sbatch_calls() if any("afterok" in w for w in c)]


def test_a_controller_down_at_the_first_ask_is_asked_again_for_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A configless site (no slurm.conf here, no job environment): the cluster comes from the
    # controller.  One that is down at a supervisor's first pass must not leave that supervisor
    # without a cluster for life (it would then take every cluster's records for its own).
    env = {"SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    answers: list[object] = [SlurmError("scontrol show config failed: Socket timed out"), "Alpha"]

    def config_value(self: Slurm, key: str, env: object = None) -> object:
        assert key == "ClusterName"
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(Slurm, "config_value", config_value)
    slurm = Slurm()
    assert slurm.cluster(env) is None
    assert slurm.cluster(env) == "alpha"
    assert slurm.cluster(env) == "alpha" and not answers
