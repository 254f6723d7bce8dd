"""Array jobs as first-class citizens, against the fake controller: a
failed task is resubmitted on its own (``--array=<task>`` of the same snapshot), with its own
budget, submission numbers and holds; the other tasks' lineages are unaffected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_dispatch.control import events, naming, record, sbatch_words, submit
from slurm_dispatch.control.holds import release
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_supervisor import Clock, Signal, new_job


def task_ids(cluster: FakeCluster, array: str) -> dict[int, str]:
    """Each task's own Slurm job id in the fake, by task id."""
    return {
        int(f["ArrayTaskId"]): j for j, f in cluster.jobs.items() if f.get("ArrayJobId") == array
    }


def submitted(job: record.JobRecord) -> list[tuple[int, int | None, str]]:
    return [(s.submission, s.task, s.slurm_job_id) for s in job.history().submissions]


def test_a_failed_task_is_resubmitted_on_its_own_with_its_own_budget(home: Path) -> None:
    cluster = FakeCluster(first_id=97)
    job, array = new_job(cluster, "--array=0-2", "--resubmit", "1")
    tasks = task_ids(cluster, array)
    assert sorted(tasks) == [0, 1, 2]
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    cluster.set(tasks[1], JobState="FAILED")  # task 1 exits 5 while 0 and 2 still run
    report = sup.run_pass()
    assert report.actions == [
        f"{job.id} task 1: failed: resubmitted as submission 2 (Slurm job 100_1)"
    ], report
    call = cluster.sbatch_calls()[-1]
    assert "--array=1" in call and "--array=0-2" not in call
    assert f"--comment=dispatch:{job.id}/2-t1" in call
    assert call[-1] == os.path.join(job.path, "batch-2-t1.sh")
    # The launcher learns the task's submission number from its own batch script.
    assert "--submission 2 --" in Path(job.path, "batch-2-t1.sh").read_text()
    assert submitted(job) == [(1, None, array), (2, 1, "100")]
    history = job.history()
    assert [history.lineage(t).next_submission for t in (0, 1, 2)] == [2, 3, 2]
    assert sup.run_pass().actions == []  # task 1's new run is running: nothing to do
    # Tasks 0 and 2 complete; task 1 fails again: its budget (1) is spent, its own only.
    cluster.set(tasks[0], JobState="COMPLETED")
    cluster.set(tasks[2], JobState="COMPLETED")
    cluster.set("100", JobState="FAILED")
    actions = sup.run_pass().actions
    assert sorted(actions) == [
        f"{job.id} task 0: completed: stop (done)",
        f"{job.id} task 1: failed: stop (no resubmit budget)",
        f"{job.id} task 2: completed: stop (done)",
    ]
    assert job.history().settled_tasks([0, 1, 2])
    assert sup.run_pass().actions == [] and len(cluster.sbatch_calls()) == 2


def test_two_tasks_failing_get_submission_2_each_in_their_own_lineage(home: Path) -> None:
    cluster = FakeCluster(first_id=97)
    job, array = new_job(cluster, "--array=0-2", "--resubmit", "3")
    tasks = task_ids(cluster, array)
    for t in (0, 2):
        cluster.set(tasks[t], JobState="TIMEOUT")
    Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert sorted((n, t) for n, t, _ in submitted(job)) == [(1, None), (2, 0), (2, 2)]
    assert sorted(os.listdir(Path(job.path) / "claims")) == [
        "submission-1",
        "submission-2-t0",
        "submission-2-t2",
    ]


def test_a_shared_array_task_is_held_and_asked_about_its_own_execution(home: Path) -> None:
    """A task's restart is a hold for that task, asked about that task's ended execution
    only; the other task runs on, never held nor asked about."""
    cluster, clock = FakeCluster(first_id=97), Clock()
    signal = Signal("not ceased", "ceased")
    job, array = new_job(cluster, "--shared-checkpoint", "--resubmit", "2", "--array=0-1")
    tasks = task_ids(cluster, array)
    cluster.set(tasks[1], JobState="FAILED", Restarts="0")
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), signal_runner=signal, clock=clock)
    assert [a.split(" until ")[0] for a in sup.run_pass().actions] == [
        f"{job.id} task 1: failed: submission 2 held as Slurm job 99_1",
        f"{job.id}: dispatch-cease {array}_1: not ceased",
    ]  # asked when the hold is made
    assert [a[1] for a in signal.asked] == [f"{array}_1"]
    call = cluster.sbatch_calls()[-1]
    assert "--hold" in call and "--array=1" in call
    assert cluster.jobs["99"]["Reason"] == "JobHeldUser"
    (hold,) = job.history().lineage(1).holds
    assert (hold.task, hold.ended_slurm_job_id, hold.ended_restart, hold.ended_tasks) == (
        1,
        f"{array}_1",
        0,
        [],
    )
    assert job.history().lineage(0).hold is None
    clock.now += 30
    sup.run_pass()
    assert [a[1] for a in signal.asked] == [f"{array}_1"]  # not again within the interval
    assert cluster.jobs["99"]["Reason"] == "JobHeldUser"
    clock.now += 31
    sup.run_pass()
    assert [a[1] for a in signal.asked] == [f"{array}_1"] * 2
    assert cluster.jobs["99"]["JobState"] == "RUNNING"
    assert cluster.jobs[tasks[0]]["JobState"] == "RUNNING"  # task 0 was never touched
    assert cluster.jobs["99"]["Comment"].startswith(f"dispatch:{job.id}/2-t1 released")


def test_a_person_releases_a_tasks_hold(home: Path) -> None:
    cluster = FakeCluster(first_id=97)
    job, array = new_job(cluster, "--shared-checkpoint", "--resubmit", "2", "--array=0-1")
    cluster.set(task_ids(cluster, array)[0], JobState="NODE_FAIL")
    Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    assert release(Slurm(cluster, wait=0), job) == "99"
    assert cluster.jobs["99"]["JobState"] == "RUNNING"
    assert job.history().lineage(0).hold is None


def test_a_pass_killed_after_a_tasks_sbatch_is_completed_from_its_marker(home: Path) -> None:
    cluster = FakeCluster(first_id=97)
    job, array = new_job(cluster, "--array=0-1", "--resubmit", "2")
    cluster.set(task_ids(cluster, array)[1], JobState="FAILED")
    # A pass claimed task 1's submission 2 and ran sbatch, then died.
    assert job.claim(naming.claim_name(2, 1), {"reason": "failed (budget 2)", "hold": None})
    landed = cluster.add("RUNNING", comment=naming.marker(job, 2, 1), ArrayTaskId="1")
    cluster.set(landed, ArrayJobId=landed)
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert report.actions == [
        f"{job.id}: recorded submission 2 of task 1 (Slurm job {landed}_1): found in Slurm"
    ], report
    assert submitted(job)[-1] == (2, 1, landed) and len(cluster.sbatch_calls()) == 1


def test_array_tasks_are_read_from_the_command_line_header_and_environment(home: Path) -> None:
    cluster = FakeCluster()
    (home / "arr.sh").write_text("#!/bin/bash\n#SBATCH --array=1,3-5\necho hi\n")
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck-h/%a", "arr.sh"]), Slurm(cluster, wait=0)
    )
    assert sbatch_words.array_tasks(done.job) == [1, 3, 4, 5]
    over = submit.submit_new(
        submit.read_request(["--checkpoint", "ck-o/%a", "-a", "0-4:2%1", "arr.sh"]),
        Slurm(cluster, wait=0),
    )
    assert sbatch_words.array_tasks(over.job) == [0, 2, 4]
    plain, _ = new_job(cluster)
    assert sbatch_words.array_tasks(plain) is None
    env = submit.submit_new(
        submit.read_request(["--checkpoint", "ck-e/%a", "job.sh"]),
        Slurm(cluster, wait=0),
        env={**os.environ, "SBATCH_ARRAY_INX": "7-8"},
    )
    assert sbatch_words.array_tasks(env.job) == [7, 8]


# -- jobs Slurm has forgotten ---------------------------------------------------------------


def ended_records(exit_code: str) -> list[dict[str, object]]:
    """What the site's facts say of one execution that ended with ``exit_code``."""
    return [
        {
            "restart": 0,
            "end": {"exit_code": exit_code, "source": "controller"},
            "nodes": {},
            "problems": [],
        }
    ]


def forget(
    cluster: FakeCluster,
    job: record.JobRecord,
    slurm_id: str,
    task: int | None = None,
    own: str | None = None,
) -> None:
    """The execution started (the launcher recorded it), ended, and aged out of slurmctld."""
    job.append(
        "started",
        submission=1,
        slurm_job_id=own or slurm_id,
        array_job_id=slurm_id if task is not None else "",
        array_task_id="" if task is None else str(task),
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
    del cluster.jobs[own or slurm_id]


def test_a_failed_job_forgotten_by_slurmctld_is_resubmitted_from_its_end_record(home: Path) -> None:
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "1")
    forget(cluster, job, first)
    asked: list[str] = []

    def facts(slurm_id: str) -> list[dict[str, object]]:
        asked.append(slurm_id)
        return ended_records("5:0")

    report = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=facts).run_pass()
    assert report.actions == [
        f"{job.id}: failed (known from the controller's end record (exit 5:0)): resubmitted "
        "as submission 2 (Slurm job 101)"
    ], report
    assert asked == [first]
    assert [c[0] for c in cluster.calls].count("sacct") == 1  # no accounting: asked once


@pytest.mark.parametrize("exit_code", ["0:0", "0:15", None])
def test_a_forgotten_job_whose_end_is_not_known_is_reported_every_pass(
    home: Path, exit_code: str | None
) -> None:
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "1")
    forget(cluster, job, first)
    records = [] if exit_code is None else ended_records(exit_code)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda j: records)
    for _ in range(3):
        report = sup.run_pass()
        (error,) = report.errors
        assert (
            error.startswith(
                f"{job.id}: submission 1 (Slurm job {first}) is no longer known to slurmctld"
            )
            and "nothing is decided" in error
        )
        assert (f"exit {exit_code}" in error) if exit_code else "no end of Slurm job" in error
    assert len(cluster.sbatch_calls()) == 1 and not job.history().settled


class Accounting(FakeCluster):
    """A controller whose site keeps accounting: sacct answers for jobs squeue forgot."""

    def __init__(self) -> None:
        super().__init__()
        self.accounted: dict[str, tuple[str, str]] = {}  # own id -> (shown id, state)

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        if argv[0] == "sacct":
            self.calls.append(list(argv))
            wanted = argv[argv.index("-j") + 1]
            lines = [
                f"{own}|{shown}|{state}|{os.getuid()}|2026-01-01T00:00:00|0:0"
                for own, (shown, state) in self.accounted.items()
                if wanted in (own, shown.split("_")[0])
            ]
            from slurm_dispatch.slurm.result import Result

            return Result(list(argv), 0, "".join(line + "\n" for line in lines), "")
        return super().__call__(argv, env, cwd, timeout)


def test_accounting_says_how_a_forgotten_job_ended(home: Path) -> None:
    cluster = Accounting()
    job, first = new_job(cluster, "--resubmit", "1")
    forget(cluster, job, first)
    cluster.accounted[first] = (first, "CANCELLED by 1000")
    never = lambda j: pytest.fail("the end record was read although accounting knew")  # noqa: E731
    report = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=never).run_pass()
    assert report.actions == [
        f"{job.id}: cancelled (known from Slurm's accounting (sacct)): "
        "stop (a user's cancel is never undone)"
    ], report
    assert job.history().settled and len(cluster.sbatch_calls()) == 1


def test_a_forgotten_array_task_is_resubmitted_from_accounting(home: Path) -> None:
    cluster = Accounting()
    cluster.ids = iter(range(97, 10**6))
    job, array = new_job(cluster, "--array=0-1", "--resubmit", "1")
    tasks = task_ids(cluster, array)
    forget(cluster, job, array, task=1, own=tasks[1])
    cluster.accounted[tasks[1]] = (f"{array}_1", "FAILED")
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert report.actions == [
        f"{job.id} task 1: failed (known from Slurm's accounting "
        "(sacct)): resubmitted as submission 2 (Slurm job 99_1)"
    ], report


@pytest.mark.parametrize("where", ["command line", "#SBATCH", "SBATCH_ARRAY_INX"])
@pytest.mark.parametrize("root", ["ck", "ck/%%a"])
def test_an_array_on_one_root_for_all_tasks_is_refused_before_anything_is_made(
    home: Path, where: str, root: str
) -> None:
    """Tasks on one root compare epochs across unrelated lineages (task 1
    resumed from task 0's saves, and its cleanup removed them): refused at submission, the
    message naming the root, why, and what to write; no record, folder or sbatch call.
    ``%%a`` is a literal '%a', not the task id (``%A`` and ``%j`` are refused for every job)."""
    from .test_submit import FakeController  # fails on any call to Slurm

    argv, env = ["--checkpoint", root, "job.sh"], dict(os.environ)
    if where == "command line":
        argv.insert(0, "--array=0-2")
    elif where == "#SBATCH":
        (home / "job.sh").write_text("#!/bin/bash\n#SBATCH --array=0-2\necho hi\n")
    else:
        env["SBATCH_ARRAY_INX"] = "0-2"
    fake = FakeController()
    with pytest.raises(UsageError) as refused:
        submit.submit_new(submit.read_request(argv), Slurm(fake, wait=0), env=env)
    text = str(refused.value)
    assert f"--checkpoint {root!r}" in text and "3 tasks" in text
    assert "%a" in text and f"{root}/task%a" in text
    assert fake.calls == []
    assert not (home / "ck").exists() and list(record.all_jobs()) == []


def test_an_array_root_per_task_or_an_array_of_one_task_is_accepted(home: Path) -> None:
    """``%a`` anywhere in the root (``%%%a``: a literal '%' then the task id) makes one root
    per task; an array of a single task is one lineage, on any root."""
    cluster = FakeCluster()
    for root, array in (("ck-1/task%a", "0-2"), ("ck-2/%%%a", "0-2"), ("ck-3", "5")):
        done = submit.submit_new(
            submit.read_request(["--checkpoint", root, f"--array={array}", "job.sh"]),
            Slurm(cluster, wait=0),
        )
        assert done.job.spec["checkpoint"] == str(home / root)


def test_each_task_counts_its_own_executions_without_progress(home: Path) -> None:
    """No progress (docs/user-guide.md) for an array (attacked, held): --max-no-progress counts each
    task's own executions in its own root (%a): task 1 crashing before its first save is stopped
    after the limit while task 0, publishing each time, is resubmitted for its whole budget."""
    from slurm_dispatch.checkpoint import publish as store
    from slurm_dispatch.checkpoint import roots

    cluster = FakeCluster(first_id=97)
    job, array = new_job(cluster, "--array=0-1", "--resubmit", "4", "--max-no-progress", "2")
    ids = task_ids(cluster, array)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())

    def run(task: int, publish: bool) -> None:
        line = job.history().lineage(task)
        sub = line.current
        assert sub is not None
        n, restart = sub.submission, 0
        root = roots.for_task(job.spec["checkpoint"], task)
        folder = os.path.join(root, "exec", f"a{n}t{task}")
        os.makedirs(folder)
        latest = store.latest(root) if os.path.isdir(os.path.join(root, "pub")) else None
        epoch = n * 10**6 + restart
        job.append(
            events.Started,
            submission=n,
            slurm_job_id=ids.get(task, ""),
            array_job_id=array,
            array_task_id=str(task),
            restart=restart,
            attempt=f"a{n}t{task}",
            epoch=epoch,
            exec_dir=folder,
            resume_from=latest.path if latest else "",
            node="n1",
            task=task,
        )
        if publish:
            save = os.path.join(folder, f"checkpoint-{n}")
            os.makedirs(save)
            store.publish(root, epoch, n, save)
        # The first submission's task has its own id; a task's resubmission is an array of it.
        cluster.set(sub.slurm_job_id if sub.submission > 1 else ids[task], JobState="FAILED")

    for _ in range(3):
        for task in (0, 1):
            if not job.history().lineage(task).settled:
                run(task, publish=task == 0)
        sup.run_pass()
    stops = job.history().of(events.NoProgress)
    assert [(s.task, s.executions[-1][0]) for s in stops] == [(1, 2)], stops
    assert job.history().lineage(0).current.submission == 4
