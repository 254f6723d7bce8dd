"""Bad nodes avoided (docs/user-guide.md).  With --avoid-bad-nodes N (or the site's
AvoidBadNodes), a node on which an execution of the job ended by the node's failure, or on
which N of its executions failed, is kept off its next submission (sbatch --exclude, merged
with the owner's) and off Slurm's requeued pending job (ExcNodeList, merged with what it has),
never so many that the job cannot run; the decision is recorded once per node, and status and
the plan say it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.control import badnodes, events, plan, record, status, status_text, submit
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.jobs import node_lost

from ..fakes.cluster import FakeCluster
from .test_no_progress import home, last_id, new_job  # noqa: F401 - the fixture

QUIET = ("--max-no-progress", "0", "--quarantine-after", "0")


def run_on(job: record.JobRecord, node: str, restart: int = 0) -> None:
    """Record an execution's start on ``node``, as the launcher does."""
    sub = job.history().submissions[-1]
    job.append(
        events.Started,
        submission=sub.submission,
        slurm_job_id=sub.slurm_job_id,
        restart=restart,
        attempt=f"a{sub.submission}r{restart}",
        epoch=sub.submission * 10**6 + restart,
        node=node,
        nodes=node,
    )


def cut_off(slurm_id: str, node: str) -> list[dict[str, Any]]:
    """The hooks' facts of restart 0 of ``slurm_id`` on ``node``, which was cut off: its
    Epilog recorded no end."""
    return [
        {
            "job_id": slurm_id,
            "restart": 0,
            "allocated": [node],
            "controller": {"start": {"time": 1.0}, "end": {"time": 9.0}},
            "nodes": {
                node: {
                    "start": {"time": 1.0},
                    "end": None,
                    "recheck": None,
                    "survivors": [],
                    "ceased": None,
                }
            },
            "problems": [],
        }
    ]


def excludes(cluster: FakeCluster) -> list[str]:
    """The --exclude of each sbatch call, the last given, as sbatch takes it ('' for none)."""
    return [
        ([a.split("=", 1)[1] for a in call if a.startswith("--exclude=")] or [""])[-1]
        for call in cluster.sbatch_calls()
    ]


def said(job: record.JobRecord, cluster: FakeCluster, facts: Any = None) -> str:
    return status_text.render(
        status.collect(job, Slurm(cluster, wait=0).own_jobs(), facts_reader=facts or (lambda _: []))
    )


def test_a_node_where_two_executions_failed_is_kept_off_the_next_submission(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--avoid-bad-nodes", "2", *QUIET)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    run_on(job, "n1")
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    run_on(job, "n2")  # a failure elsewhere counts for that node only
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    run_on(job, "n1")
    cluster.set(last_id(job), JobState="FAILED")
    report = sup.run_pass()
    assert excludes(cluster) == ["", "", "", "n1"]
    first = cluster.jobs[last_id(job)]
    assert first["ExcNodeList"] == "n1"
    (avoided,) = job.history().of(events.NodeAvoided)
    assert (avoided.node, avoided.why) == ("n1", "failed")
    assert [e[0] for e in avoided.executions] == [1, 3]
    assert any("avoids node n1 (2 failed executions" in a for a in report.actions), report
    assert any("n1 kept off submission 4" in a for a in report.actions), report
    text = said(job, cluster)
    assert (
        "Bad nodes   avoids n1 (2 failed executions: Slurm job 100 restart 0, "
        "Slurm job 102 restart 0)" in text
    )
    assert f"Bad nodes   n1 kept off submission 4 (Slurm job {last_id(job)})" in text
    # Once per node: the next failure on n2 makes it bad too, and both are kept off.
    run_on(job, "n2")
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    assert excludes(cluster)[-1] == "n1,n2"
    assert [e.node for e in job.history().of(events.NodeAvoided)] == ["n1", "n2"]


def test_the_owners_exclusions_stay_and_the_job_keeps_a_node_to_run_on(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "9", "--avoid-bad-nodes", "1", "--exclude=n3", *QUIET)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    for node in ("n1", "n2"):
        run_on(job, node)
        cluster.set(last_id(job), JobState="FAILED")
        report = sup.run_pass()
    # n3 is the owner's, n1 ours; n2 stays in, or no node of the partition would be left.
    assert excludes(cluster) == ["n3", "n3,n1", "n3,n1"]
    assert any(
        "n2 left in: the job needs 1 of its partition's nodes" in a for a in report.actions
    ), report
    assert "left in" in said(job, cluster)


def test_a_node_failure_keeps_the_node_off_the_requeued_job(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--avoid-bad-nodes", "2", *QUIET)
    slurm_id = last_id(job)
    now = time.time()
    facts = [
        {
            "job_id": slurm_id,
            "restart": 0,
            "allocated": ["n2"],
            "controller": {"start": {"time": now - 60}, "end": {"time": now - 5}},
            # n2 was cut off: its Epilog recorded no end.
            "nodes": {
                "n2": {
                    "start": {"time": now - 59},
                    "end": None,
                    "recheck": None,
                    "survivors": [],
                    "ceased": None,
                }
            },
            "problems": [],
        }
    ]
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: facts)
    run_on(job, "n2")
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1", ExcNodeList="n9")
    cluster.node_states["n2"] = "DOWN+NOT_RESPONDING"
    report = sup.run_pass()
    assert cluster.jobs[slurm_id]["ExcNodeList"] == "n9,n2", report  # merged with its own
    assert report.errors == []
    assert report.actions == [
        f"{job.id}: avoids node n2 (node failure under Slurm job {slurm_id} restart 0) "
        "(--avoid-bad-nodes)",
        f"{job.id}: n2 kept off requeued Slurm job {slurm_id} (restart 1)",
    ]
    calls = len(cluster.calls)
    assert sup.run_pass().actions == [] and len(cluster.calls) == calls + 1  # once: squeue
    assert "Bad nodes   avoids n2 (node failure under" in said(job, cluster)


def test_a_node_whose_end_was_recorded_is_no_node_failure(home: Path) -> None:  # noqa: F811
    """A preemption's requeue: every node recorded its end, so nothing is asked or kept."""
    cluster = FakeCluster()
    job = new_job(cluster, "--avoid-bad-nodes", "2", *QUIET)
    slurm_id = last_id(job)
    facts = [
        {
            "job_id": slurm_id,
            "restart": 0,
            "allocated": ["n2"],
            "controller": {"start": {"time": 1.0}, "end": {"time": 9.0}},
            "nodes": {
                "n2": {
                    "start": {"time": 1.0},
                    "end": {"time": 10.0},
                    "recheck": None,
                    "survivors": [],
                    "ceased": True,
                }
            },
            "problems": [],
        }
    ]
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: facts)
    run_on(job, "n2")
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    assert sup.run_pass().actions == []
    assert not [c for c in cluster.calls if c[0] in ("sinfo", "scontrol")]


def test_off_by_default_and_the_site_default_turns_it_on(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", *QUIET)
    assert job.spec["avoid_bad_nodes"] == 0
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    for _ in range(3):
        run_on(job, "n1")
        cluster.set(last_id(job), JobState="FAILED")
        sup.run_pass()
    assert excludes(cluster) == ["", "", "", ""]
    assert not job.history().of(events.NodeAvoided)
    (home / "none.conf").write_text("AvoidBadNodes=2\n")
    for jobid in cluster.jobs:
        cluster.set(jobid, JobState="FAILED")  # the root is free for the next job
    on = new_job(cluster, *QUIET)
    assert on.spec["avoid_bad_nodes"] == 2
    cluster.set(last_id(on), JobState="FAILED")
    assert new_job(cluster, "--avoid-bad-nodes", "0").spec["avoid_bad_nodes"] == 0


def test_the_option_and_the_plan(home: Path) -> None:  # noqa: F811
    def planned(*options: str) -> str:
        return plan.describe(submit.read_request(["--checkpoint", "ck", *options, "job.sh"]))

    assert (
        "  bad nodes      never avoided (default 0, the site's AvoidBadNodes; "
        "--avoid-bad-nodes N sets it: " in planned()
    )
    assert (
        "  bad nodes      a node on which 2 execution(s) failed, or one ended NODE_FAIL, "
        "is excluded" in planned("--avoid-bad-nodes", "2")
    )
    assert "(--avoid-bad-nodes 2; default 0, the site's AvoidBadNodes)" in planned(
        "--avoid-bad-nodes", "2"
    )
    (home / "none.conf").write_text("AvoidBadNodes=3\n")
    assert "(default the site's AvoidBadNodes, 3; --avoid-bad-nodes N sets it)" in planned()
    assert "never avoided (--avoid-bad-nodes 0; default the site's AvoidBadNodes, 3: " in planned(
        "--avoid-bad-nodes", "0"
    )
    with pytest.raises(UsageError, match="--avoid-bad-nodes 'many' is not a number"):
        submit.read_request(["--checkpoint", "ck", "--avoid-bad-nodes", "many", "job.sh"])
    (home / "job.sh").write_text("#!/bin/bash\n#DISPATCH --avoid-bad-nodes 4\necho hi\n")
    assert "(--avoid-bad-nodes 4; default the site's AvoidBadNodes, 3)" in planned()


def test_never_so_many_that_the_job_cannot_run() -> None:
    nodes = {"debug": ["n1", "n2", "n3", "n4"]}
    assert badnodes.within(nodes, 1, [], ["n1", "n2"]) == (["n1", "n2"], [])
    assert badnodes.within(nodes, 2, ["n4"], ["n1", "n2"]) == (["n1"], ["n2"])
    assert badnodes.within(nodes, 4, [], ["n1"]) == ([], ["n1"])
    assert badnodes.within(nodes, 1, [], ["x9"]) == ([], [])  # no partition's: not named
    assert badnodes.merged(["n4"], ["n1", "n4"]) == ["n4", "n1"]
    assert node_lost("DOWN+NOT_RESPONDING") and node_lost("IDLE*") and node_lost("FAIL")
    assert not node_lost("IDLE") and not node_lost("MIXED+DRAIN")


def test_the_tools_read_a_placement_and_a_partitions_nodes() -> None:
    """squeue's placement of one job (several partitions, a node range, a host list of
    excluded nodes, none as (null)) and sinfo's nodes, each once, as the adapter reads them."""
    from slurm_dispatch.errors import SlurmError
    from slurm_dispatch.slurm.cli_backend import CliBackend
    from slurm_dispatch.slurm.result import Result

    answers = {
        "squeue": "debug,urgent|2-4|n[1-2],gpu3|n[7-8]\n",
        "sinfo": "debug|n[1-3]\nurgent|n[2-4]\ndebug|n5\n",
    }

    def run(argv: Any) -> Result:
        return Result(list(argv), 0, answers[argv[0]], "")

    tools = CliBackend(run)
    placed = tools.placement("97_1")
    assert placed is not None
    assert (placed.partitions, placed.node_count, placed.excluded, placed.required) == (
        ("debug", "urgent"),
        2,
        ("n1", "n2", "gpu3"),
        ("n7", "n8"),
    )
    assert tools.partition_nodes(["debug", "urgent"]) == {
        "debug": ["n1", "n2", "n3", "n5"],
        "urgent": ["n2", "n3", "n4"],
    }
    answers["squeue"] = "debug|1|(null)|(null)\n"
    placed = tools.placement("5")
    assert placed is not None and placed.excluded == () and placed.required == ()
    answers["squeue"] = ""
    assert tools.placement("5") is None
    answers["squeue"] = "debug|many||\n"
    with pytest.raises(SlurmError, match="placement that does not parse: node count 'many'"):
        tools.placement("5")


def test_an_array_tasks_bad_nodes_are_its_own(home: Path) -> None:  # noqa: F811
    """Task 1 failing twice on n1 is resubmitted alone with --exclude=n1; task 0, which ran
    on n1 and completed, and the whole job, avoid nothing."""
    from .test_arrays import task_ids
    from .test_supervisor import new_job as new_array

    cluster = FakeCluster()
    job, array = new_array(
        cluster, "--array=0-1", "--resubmit", "3", "--avoid-bad-nodes", "2", *QUIET
    )
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])

    def run_task(task: int, own: str) -> None:
        sub = job.history().lineage(task).current
        assert sub is not None
        job.append(
            events.Started,
            submission=sub.submission,
            slurm_job_id=own,
            array_job_id=sub.slurm_job_id,
            array_task_id=str(task),
            task=task,
            attempt=f"a{sub.submission}t{task}",
            epoch=sub.submission * 10**6,
            node="n1",
            nodes="n1",
        )

    tasks = task_ids(cluster, array)
    run_task(0, tasks[0])
    cluster.set(tasks[0], JobState="COMPLETED")
    run_task(1, tasks[1])
    cluster.set(tasks[1], JobState="FAILED")
    sup.run_pass()
    resubmitted = job.history().lineage(1).current
    assert resubmitted is not None and resubmitted.submission == 2
    again = task_ids(cluster, resubmitted.slurm_job_id)[1]
    run_task(1, again)
    cluster.set(again, JobState="FAILED")
    sup.run_pass()
    call = cluster.sbatch_calls()[-1]
    assert "--array=1" in call and call[call.index("--array=1") + 1 :].count("--exclude=n1") == 1
    (avoided,) = job.history().of(events.NodeAvoided)
    assert (avoided.node, avoided.task) == ("n1", 1)
    assert job.history().lineage(0).avoided == [] and job.history().lineage().avoided == []
    text = said(job, cluster)
    assert "Bad nodes   task 1: avoids n1 (2 failed executions: " in text, text
    assert "task 0: avoids" not in text


def test_a_node_the_job_asks_for_is_never_excluded(home: Path) -> None:  # noqa: F811
    """--nodelist=n1 (-w): sbatch refuses --exclude=n1 beside it ('Invalid node name
    specified'), so each resubmission failed and the job never ran again; and a requeued
    job given ExcNodeList=n1 pends for ever (BadConstraints).  n1 stays in, said."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--avoid-bad-nodes", "1", "--nodelist=n1", *QUIET)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    run_on(job, "n1")
    cluster.set(last_id(job), JobState="FAILED")
    report = sup.run_pass()
    assert excludes(cluster) == ["", ""], report
    assert report.errors == []
    assert any("n1 left in: the job asks for it (--nodelist)" in a for a in report.actions), report
    assert "n1 left in: the job asks for it" in said(job, cluster)
    # Slurm's requeue of a job asking for n2, after n2's failure: its ExcNodeList stays.
    for jobid in cluster.jobs:
        cluster.set(jobid, JobState="FAILED")  # the root is free for the next job
    job = new_job(cluster, "--avoid-bad-nodes", "2", "-w", "n[2-3]", *QUIET)
    slurm_id = last_id(job)
    run_on(job, "n2")
    facts = cut_off(slurm_id, "n2")
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: facts)
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    cluster.node_states["n2"] = "DOWN+NOT_RESPONDING"
    report = sup.run_pass()
    assert cluster.jobs[slurm_id].get("ExcNodeList", "") == "", report
    assert report.errors == []


def test_a_node_no_partition_has_is_not_named_to_slurm(home: Path) -> None:  # noqa: F811
    """A bad node removed from slurm.conf (or renamed): sbatch refuses --exclude naming it
    ('Invalid node name specified'), so the job could never be resubmitted."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--avoid-bad-nodes", "1", *QUIET)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    run_on(job, "n9")
    cluster.set(last_id(job), JobState="FAILED")
    report = sup.run_pass()
    assert excludes(cluster) == ["", ""], report
    run_on(job, "n1")
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    assert excludes(cluster)[-1] == "n1"


def test_with_several_partitions_one_of_them_can_still_run_the_job() -> None:
    """-p a,b: the job runs in one partition, so the nodes left usable are counted in each;
    a count over their union left the job no partition to run in."""
    parts = {"a": ["n1"], "b": ["n2", "n3"]}
    assert badnodes.within(parts, 2, [], ["n2"]) == ([], ["n2"])
    assert badnodes.within(parts, 1, [], ["n2", "n1", "n3"]) == (["n2", "n1"], ["n3"])
    assert badnodes.within(parts, 1, ["n3"], ["n1", "n2"]) == (["n1"], ["n2"])


def test_a_submission_slurm_refuses_with_the_bad_nodes_kept_off_is_made_without_them(
    home: Path,
) -> None:  # noqa: F811
    """What else the job asks for (--constraint=a100, a GRES, memory only some nodes have)
    may leave no node it can run on once its bad nodes are excluded; sbatch then refuses it
    ('Requested node configuration is not available') and the job was never submitted
    again.  It is submitted without them, and that is said and recorded."""
    from slurm_dispatch.slurm.result import Result

    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--avoid-bad-nodes", "1", "--constraint=a100", *QUIET)
    refusal = ["Batch job submission failed: Requested node configuration is not available"]

    def refusing(argv: Any, *rest: Any) -> Any:
        if argv[0] == "sbatch" and (
            refusal[0].startswith("Socket") or any(a.startswith("--exclude=n1") for a in argv)
        ):
            cluster.calls.append(list(argv))
            return Result(list(argv), 1, "", f"sbatch: error: {refusal[0]}\n")
        return cluster(argv, *rest)

    sup = Supervisor(Slurm(refusing, wait=0, attempts=1), Settings(), facts_reader=lambda _: [])
    run_on(job, "n1")
    cluster.set(last_id(job), JobState="FAILED")
    report = sup.run_pass()
    assert excludes(cluster) == ["", "n1", ""], report
    assert len(job.history().submissions) == 2, report
    assert any(
        "n1 left in: Slurm refused the job without it (Requested node configuration "
        "is not available)" in a
        for a in report.actions
    ), report
    (excluded,) = job.history().of(events.NodesExcluded)
    assert (excluded.nodes, excluded.kept, excluded.refused) == ([], [], ["n1"])
    assert "Slurm refused the job without it" in said(job, cluster)
    # A failure that is not a refusal (the job may have landed) is not retried without them.
    refusal[0] = "Socket timed out on send/recv operation"
    run_on(job, "n2")
    cluster.set(last_id(job), JobState="FAILED")
    calls = len(cluster.sbatch_calls())
    report = sup.run_pass()
    assert len(job.history().submissions) == 2 and report.errors, report
    assert len(cluster.sbatch_calls()) == calls + 1


def test_a_requeued_job_slurm_cannot_run_without_its_bad_nodes_gets_them_back(home: Path) -> None:  # noqa: F811
    """ExcNodeList of a requeued job that leaves it no node its constraint, GRES or memory
    fits: Slurm takes the update and the job pends for ever (BadConstraints, priority 0; seen
    on the sandbox with -w).  The next pass puts its own list back, once, and says so."""
    cluster = FakeCluster()
    job = new_job(cluster, "--avoid-bad-nodes", "2", "--constraint=a100", *QUIET)
    slurm_id = last_id(job)
    facts = cut_off(slurm_id, "n2")
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: facts)
    run_on(job, "n2")
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1", ExcNodeList="n9")
    cluster.node_states["n2"] = "DOWN+NOT_RESPONDING"
    sup.run_pass()
    assert cluster.jobs[slurm_id]["ExcNodeList"] == "n9,n2"
    cluster.set(slurm_id, Reason="BadConstraints")
    report = sup.run_pass()
    assert cluster.jobs[slurm_id]["ExcNodeList"] == "n9", report  # the owner's stays
    assert report.errors == []
    assert report.actions == [
        f"{job.id}: no node kept off requeued Slurm job {slurm_id} (restart 1); n2 left in: "
        "Slurm refused the job without it (it pended BadConstraints: no node it can run on)"
    ]
    assert sup.run_pass().actions == []
    assert "n2 left in: Slurm refused the job without it" in said(job, cluster)


@pytest.mark.parametrize(
    "option", ["--avoid-bad-nodes", "--max-requeues", "--resubmit", "--max-no-progress"]
)
@pytest.mark.parametrize("value", ["1_0", "٣", "+2", "0x3"])
def test_a_count_is_plain_digits_as_the_sites_avoidbadnodes_is(option: str, value: str) -> None:
    """Python's int() took '1_0' as 10 and '٣' (an Arabic-Indic three) as 3, so
    --avoid-bad-nodes 1_0 avoided a node after ten failures, where dispatch.conf's
    AvoidBadNodes=1_0 is refused."""
    with pytest.raises(UsageError, match=re.escape(f"{option} '{value}'")):
        submit.read_request(["--checkpoint", "ck", option, value, "job.sh"])


def test_a_multi_node_executions_node_failure_avoids_the_node_that_failed(home: Path) -> None:  # noqa: F811
    """A 2-node execution ended NODE_FAIL (n1 lost) where no node recorded its end (hooks
    not installed, or n2's Epilog not run yet at the pass): both nodes were avoided as
    'node failure', the healthy n2 too.  The node the controller says it lost is, and the
    decision stays as made once n1 is back."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "5", "--avoid-bad-nodes", "2", "--nodes=2", *QUIET)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    sub = job.history().submissions[-1]
    job.append(
        events.Started,
        submission=1,
        slurm_job_id=sub.slurm_job_id,
        restart=0,
        attempt="a1r0",
        epoch=10**6,
        node="n1",
        nodes="n[1-2]",
    )
    cluster.set(last_id(job), JobState="NODE_FAIL")
    cluster.node_states["n1"] = "DOWN+NOT_RESPONDING"
    report = sup.run_pass()
    assert [e.node for e in job.history().of(events.NodeAvoided)] == ["n1"], report
    assert excludes(cluster)[-1] == "n1"
    cluster.node_states["n1"] = "IDLE"  # back: the old failure is not judged again
    run_on(job, "n3")
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    assert [e.node for e in job.history().of(events.NodeAvoided)] == ["n1"]


def test_a_persons_resubmission_keeps_the_bad_nodes_off_too(home: Path) -> None:  # noqa: F811
    """dispatch resubmit (after the budget is spent, a stop for want of progress) submitted
    without the lineage's bad nodes, dispatch status still saying 'avoids n1': the job went
    back to n1.  They are kept off as the supervisor keeps them, from where its last
    exclusion found the job placed when slurmctld has forgotten the last job."""
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "1", "--avoid-bad-nodes", "1", "--exclude=n3", *QUIET)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _: [])
    run_on(job, "n1")
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    run_on(job, "n2")
    cluster.set(last_id(job), JobState="FAILED")
    sup.run_pass()
    assert job.history().of(events.Finished), "its budget is spent"
    assert excludes(cluster) == ["n3", "n3,n1"]
    del cluster.jobs[last_id(job)]  # past MinJobAge
    done, told = badnodes.resubmit(Slurm(cluster, wait=0), job, None)
    assert excludes(cluster)[-1] == "n3,n1", told
    assert told == [f"n1 kept off submission 3 (Slurm job {done.slurm_job_id})"]
    assert f"n1 kept off submission 3 (Slurm job {done.slurm_job_id})" in said(job, cluster)
