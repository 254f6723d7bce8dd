"""Dependencies on dispatch jobs follow their current submission (a resubmission gets a new
Slurm job id, so `--dependency=afterok:<id>` of a downstream job never started)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from slurm_dispatch.control import dependency, submit
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster

IDS = {"dabcdefg": "101", "dhjkmnpq": None}


def table(ident: str, kind: str, delay: str) -> str | None:
    return IDS.get(ident)


@pytest.mark.parametrize(
    "value,expected",
    [
        ("afterok:dabcdefg", "afterok:101"),
        ("afterok:dabcdefg:55,afterany:dhjkmnpq", "afterok:101:55"),
        ("afterany:dhjkmnpq,afterok:dabcdefg+5", "afterok:101+5"),
        ("afterok:dabcdefg?afterany:dhjkmnpq", ""),  # one alternative satisfied: all are
        ("afterok:77,singleton", "afterok:77,singleton"),
        ("afterok:dhjkmnpq", ""),
    ],
)
def test_rewrite_keeps_slurms_grammar(value: str, expected: str) -> None:
    assert dependency.rewrite(value, table) == expected


def test_only_dispatch_ids_are_names() -> None:
    assert dependency.named_jobs("afterok:dabcdefg:123:dlooooo1,singleton") == ["dabcdefg"]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    return FakeCluster(first_id=70)


def submit_one(cluster: FakeCluster, root: str, *extra: str) -> submit.SubmissionMade:
    return submit.submit_new(
        submit.read_request(["--checkpoint", root, *extra, "job.sh"]), Slurm(cluster, wait=0)
    )


def test_a_downstream_job_follows_its_upstreams_resubmission(cluster: FakeCluster) -> None:
    up = submit_one(cluster, "ck-up", "--resubmit", "1")
    down = submit_one(cluster, "ck-down", f"--dependency=afterok:{up.job.id}")
    assert f"--dependency=afterok:{up.slurm_job_id}" in cluster.sbatch_calls()[-1]
    cluster.set(down.slurm_job_id, JobState="PENDING", Reason="Dependency")
    cluster.set(up.slurm_job_id, JobState="FAILED")
    again = submit.resubmit(Slurm(cluster, wait=0), up.job)
    moved = dependency.follow(Slurm(cluster, wait=0), up.job, again.slurm_job_id)
    assert moved.updated == [down.slurm_job_id] and moved.refused == []
    assert cluster.calls[-1] == [
        "scontrol",
        "update",
        f"jobid={down.slurm_job_id}",
        f"dependency=afterok:{again.slurm_job_id}",
    ]


def test_an_upstream_that_ended_for_good_is_named(cluster: FakeCluster) -> None:
    up = submit_one(cluster, "ck-up")
    up.job.append(
        "finished",
        submission=1,
        slurm_job_id=up.slurm_job_id,
        end_state="failed",
        rule="stop (no resubmit budget)",
    )
    del cluster.jobs[up.slurm_job_id]
    with pytest.raises(UsageError, match=f"dispatch job {up.job.id} ended failed for good"):
        submit_one(cluster, "ck-down", "-d", f"afterok:{up.job.id}")


def test_an_upstream_that_completed_and_was_forgotten_is_satisfied(cluster: FakeCluster) -> None:
    up = submit_one(cluster, "ck-up")
    up.job.append(
        "finished",
        submission=1,
        slurm_job_id=up.slurm_job_id,
        end_state="completed",
        rule="stop (done)",
    )
    del cluster.jobs[up.slurm_job_id]
    submit_one(cluster, "ck-down", "-d", f"afterok:{up.job.id}")
    argv = cluster.sbatch_calls()[-1]
    assert not any("dependency" in a or a == "-d" for a in argv), argv


def test_a_dispatch_id_in_an_sbatch_line_is_refused(cluster: FakeCluster) -> None:
    Path("job.sh").write_text("#!/bin/bash\n#SBATCH --dependency=afterok:dabcdefg\necho\n")
    with pytest.raises(UsageError, match="on the command line"):
        submit_one(cluster, "ck")


def test_the_supervisors_resubmission_moves_the_dependents(cluster: FakeCluster) -> None:
    from slurm_dispatch.control.supervisor import Settings, Supervisor

    up = submit_one(cluster, "ck-up", "--resubmit", "1")
    down = submit_one(cluster, "ck-down", f"--dependency=afterok:{up.job.id}")
    cluster.set(down.slurm_job_id, JobState="PENDING", Reason="DependencyNeverSatisfied")
    cluster.set(up.slurm_job_id, JobState="FAILED")
    report = Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    new = up.job.history().lineage().current
    assert new is not None and new.submission == 2
    assert cluster.jobs[down.slurm_job_id]["Dependency"] == f"afterok:{new.slurm_job_id}"
    assert any(f"Slurm job {down.slurm_job_id} now waits" in a for a in report.actions)


def forgotten(
    cluster: FakeCluster, end_state: str | None, started: bool = False
) -> submit.SubmissionMade:
    """An upstream dispatch job whose Slurm job ended and aged out of slurmctld; its record's
    final outcome is ``end_state`` (None: no pass judged it yet)."""
    up = submit_one(cluster, f"ck-up-{len(cluster.jobs)}")
    if started:
        up.job.append(
            "started",
            submission=1,
            slurm_job_id=up.slurm_job_id,
            restart=0,
            attempt="a" * 26,
            epoch=1_000_000,
            exec_dir="/x",
            resume_from="",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    if end_state is not None:
        up.job.append(
            "finished", submission=1, slurm_job_id=up.slurm_job_id, end_state=end_state, rule="stop"
        )
    del cluster.jobs[up.slurm_job_id]
    return up


@pytest.mark.parametrize(
    "kind,end_state,satisfied",
    [
        ("afterok", "completed", True),
        ("afterok", "failed", False),
        ("afterok", "cancelled", False),
        ("afternotok", "completed", False),
        ("afternotok", "failed", True),
        ("afternotok", "timeout", True),
        ("afternotok", "node failure", True),
        ("afternotok", "cancelled", True),
        ("afternotok", "hold expired", True),
        ("afterany", "completed", True),
        ("afterany", "failed", True),
        ("afterany", "cancelled", True),
        ("afterburstbuffer", "out of memory", True),
        ("after", "failed", True),
        ("after", "completed", True),
        ("aftercorr", "completed", True),
        ("aftercorr", "timeout", False),
    ],
)
def test_a_forgotten_upstream_resolves_each_type_by_its_meaning(
    cluster: FakeCluster, kind: str, end_state: str, satisfied: bool
) -> None:
    """A term on an upstream Slurm has forgotten is dropped when its type is
    satisfied by the upstream's final outcome (afternotok after a failure, afterany after
    anything), refused when it never can be (afternotok after a success), as sbatch(1) says:
    such a job would stay pending with DependencyNeverSatisfied for ever."""
    up = forgotten(cluster, end_state)
    other = submit_one(cluster, "ck-other")  # a live upstream, kept as Slurm's id
    value = f"{kind}:{up.job.id},afterany:{other.job.id}"
    if satisfied:
        submit_one(cluster, "ck-down", f"--dependency={value}")
        assert f"--dependency=afterany:{other.slurm_job_id}" in cluster.sbatch_calls()[-1]
    else:
        calls = len(cluster.sbatch_calls())
        with pytest.raises(UsageError) as refused:
            submit_one(cluster, "ck-down", f"--dependency={value}")
        text = str(refused.value)
        assert f"{kind}:{up.job.id}" in text and f"ended {end_state}" in text, text
        assert "never" in text and "DependencyNeverSatisfied" in text, text
        assert len(cluster.sbatch_calls()) == calls


def test_a_forgotten_upstream_without_a_known_outcome_is_an_error(cluster: FakeCluster) -> None:
    up = forgotten(cluster, None)
    with pytest.raises(UsageError) as refused:
        submit_one(cluster, "ck-down", f"--dependency=afternotok:{up.job.id}")
    text = str(refused.value)
    assert up.job.id in text and up.slurm_job_id in text and "not known" in text, text
    assert "dispatch supervise" in text


def test_after_with_a_delay_counts_from_the_upstreams_start(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``after:JOB+MIN``: MIN minutes from the start; passed: satisfied; still ahead: refused
    with when (Slurm no longer knows the job, so the term cannot be left to it)."""
    up = forgotten(cluster, "failed", started=True)
    start = up.job.history().lineage().started[-1].time
    monkeypatch.setattr(dependency.time, "time", lambda: start + 60)
    with pytest.raises(UsageError, match=rf"after:{up.job.id}\+30.*--begin"):
        submit_one(cluster, "ck-down-1", f"--dependency=after:{up.job.id}+30")
    monkeypatch.setattr(dependency.time, "time", lambda: start + 31 * 60)
    submit_one(cluster, "ck-down-2", f"--dependency=after:{up.job.id}+30")
    assert not any("dependency" in a for a in cluster.sbatch_calls()[-1])


def test_any_of_drops_the_alternatives_that_can_never_be_satisfied(cluster: FakeCluster) -> None:
    """With '?' one satisfied alternative is enough, so one that never can be is dropped; all
    of them never satisfiable: refused."""
    done = forgotten(cluster, "completed")
    live = submit_one(cluster, "ck-live")
    submit_one(cluster, "ck-down-1", f"--dependency=afternotok:{done.job.id}?afterok:{live.job.id}")
    assert f"--dependency=afterok:{live.slurm_job_id}" in cluster.sbatch_calls()[-1]
    failed = forgotten(cluster, "failed")
    with pytest.raises(UsageError, match="never"):
        submit_one(
            cluster, "ck-down-2", f"--dependency=afternotok:{done.job.id}?afterok:{failed.job.id}"
        )


def test_a_forgotten_array_upstream_is_judged_by_all_its_tasks(cluster: FakeCluster) -> None:
    """An array's outcome is its tasks': completed only when every task completed."""
    up = submit_one(cluster, "ck-up/t%a", "--array=0-1")
    for task, end in ((0, "completed"), (1, "failed")):
        up.job.append(
            "finished",
            submission=1,
            slurm_job_id=up.slurm_job_id,
            end_state=end,
            rule="stop",
            task=task,
        )
    for slurm_id in [
        j
        for j, f in cluster.jobs.items()
        if f.get("ArrayJobId") == up.slurm_job_id or j == up.slurm_job_id
    ]:
        del cluster.jobs[slurm_id]
    with pytest.raises(UsageError, match=f"afterok:{up.job.id} can never.*ended failed"):
        submit_one(cluster, "ck-down-1", f"--dependency=afterok:{up.job.id}")
    submit_one(cluster, "ck-down-2", f"--dependency=afternotok:{up.job.id}")
    assert not any("dependency" in a for a in cluster.sbatch_calls()[-1])


def test_a_reused_slurm_id_of_a_plain_job_does_not_satisfy_afterok(cluster: FakeCluster) -> None:
    """After slurmctld lost its state, the upstream's Slurm job id is a plain
    job's of the user's: that job is not the upstream's, so its end satisfies no term."""
    up = submit_one(cluster, "ck-up", "--resubmit", "3")
    assert up.slurm_job_id == "70"
    cluster.jobs.clear()
    cluster.ids = itertools.count(70)
    cluster.add("COMPLETED")  # the user's plain sbatch job, now job 70
    calls = len(cluster.sbatch_calls())
    with pytest.raises(UsageError, match="not known"):
        submit_one(cluster, "ck-down", f"--dependency=afterok:{up.job.id}")
    assert len(cluster.sbatch_calls()) == calls


def unreadable_submission(job_path: str) -> None:
    """One of a record's files cannot be read for a moment (a full disk, an NFS hiccup): its
    submission's event is, for now, no file one can read."""
    events = Path(job_path, "events")
    for path in events.iterdir():
        if "submitted" in path.name:
            path.rename(events / f".{path.name}")
            path.mkdir()


@pytest.mark.parametrize("sep", [":", "?afterok:"])
def test_an_unreadable_upstream_record_never_drops_its_term(cluster: FakeCluster, sep: str) -> None:
    """``afterok:A:B``; A fails and is resubmitted while B's record cannot be
    read.  B's term is not known, never satisfied: the downstream's dependency is left as Slurm
    has it (no rewrite to A's new job alone, no empty dependency with '?'), and the pass says
    why, naming B and the downstream."""
    from slurm_dispatch.control.supervisor import Settings, Supervisor

    a = submit_one(cluster, "ck-a", "--resubmit", "1")
    b = submit_one(cluster, "ck-b")
    down = submit_one(cluster, "ck-down", f"--dependency=afterok:{a.job.id}{sep}{b.job.id}")
    cluster.set(down.slurm_job_id, JobState="PENDING", Reason="Dependency")
    cluster.set(a.slurm_job_id, JobState="FAILED")
    unreadable_submission(b.job.path)
    report = Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    again = a.job.history().lineage().current
    assert again is not None and again.submission == 2  # A's resubmission is not held up
    assert "Dependency" not in cluster.jobs[down.slurm_job_id], cluster.jobs[down.slurm_job_id]
    assert not [
        c for c in cluster.calls if c[:2] == ["scontrol", "update"] and "dependency=" in c[-1]
    ]
    said = [e for e in report.errors if down.slurm_job_id in e]
    assert said and b.job.id in said[0] and "keeps its dependency" in said[0], report.errors
