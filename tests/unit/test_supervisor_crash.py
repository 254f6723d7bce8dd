"""The supervisor killed at the worst moment, against the fake controller.

First one test per crash window found, with the kill placed by hand; then a property test:
passes killed by SIGKILL at random steps (a forked pass that ``os._exit``s at its k-th Slurm
call or record write), over many jobs (half of them arrays of three tasks, each task a lineage
of its own) whose Slurm jobs fail, end, are held, released and age out of the controller, with
invariants checked after every pass (per task for an array):

* no submission is made twice (the controller counts ``sbatch`` per marker);
* none is silently lost: after a pass that ran to its end, every dispatch job is settled, has
  a live Slurm job, is being submitted (a claim younger than an ``sbatch`` can take), or is an
  error in that pass's report;
* every held Slurm job of ours is a hold the record knows, with its deadline, and a hold that
  stood through a whole pass was asked about.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import sys
import traceback
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pytest

from slurm_dispatch.control import events, naming, record, sbatch_words, supervisor
from slurm_dispatch.control.holds import Answer
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes.cluster import FakeCluster
from .test_supervisor import Clock, new_job


class Killed(BaseException):
    """The pass dies here (BaseException: no handler of the supervisor's may catch it)."""


class KillAt:
    """A runner that dies just before or just after the first Slurm call named ``command``."""

    def __init__(self, cluster: FakeCluster, command: str, after: bool) -> None:
        self.cluster, self.command, self.after = cluster, command, after

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        if argv[0] == self.command and not self.after:
            raise Killed()
        result = self.cluster(argv, env, cwd, timeout)
        if argv[0] == self.command:
            raise Killed()
        return result


def of_kind(job: record.JobRecord, kind: str) -> list[dict[str, Any]]:
    return [e for e in job.events() if e["event"] == kind]


def sbatch_per_marker(cluster: FakeCluster) -> dict[str, int]:
    counts: dict[str, int] = {}
    for call in cluster.sbatch_calls():
        for word in " ".join(a for a in call if a.startswith("--comment=")).split():
            if "dispatch:" in word:
                marker = word.split("dispatch:", 1)[1]
                counts[marker] = counts.get(marker, 0) + 1
    return counts


def test_killed_right_after_a_held_sbatch_keeps_the_hold(home: Path) -> None:
    cluster, clock = FakeCluster(), Clock()
    job, ended = new_job(cluster, "--shared-checkpoint", "--resubmit", "3")
    cluster.set(ended, JobState="NODE_FAIL")
    asked: list[list[str]] = []

    def signal(argv: list[str], timeout: float) -> Answer:
        asked.append(argv)
        return Answer("not ceased", 1, {})

    settings = Settings(hold_for=600, interval=60)
    killed = Supervisor(
        Slurm(KillAt(cluster, "sbatch", after=True), wait=0),
        settings,
        signal_runner=signal,
        clock=clock,
    )
    with pytest.raises(Killed):
        killed.run_pass()
    held = max(cluster.jobs, key=int)
    assert cluster.jobs[held]["Reason"] == "JobHeldUser"
    sup = Supervisor(Slurm(cluster, wait=0), settings, signal_runner=signal, clock=clock)
    for _ in range(3):
        clock.now += 61
        sup.run_pass()
    assert [s["slurm_job_id"] for s in job.submissions()][-1] == held
    holds = of_kind(job, "hold")
    assert len(holds) == 1 and holds[0]["deadline"] == 1_000_000.0 + 600
    assert asked and asked[0][1] == ended, "the recovered hold was never asked about"
    clock.now += 600
    sup.run_pass()
    assert cluster.jobs[held]["JobState"] == "CANCELLED" and of_kind(job, "expired")
    assert sbatch_per_marker(cluster) == {f"{job.id}/1": 1, f"{job.id}/2": 1}


def test_two_killed_attempts_are_reported_never_silent(home: Path) -> None:
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "1")
    cluster.set(first, JobState="FAILED")
    clock = Clock(os.stat(Path(job.path) / "claims" / "submission-1").st_mtime)
    for _ in range(2):  # each attempt dies just before its sbatch
        killer = Supervisor(
            Slurm(KillAt(cluster, "sbatch", after=False), wait=0), Settings(), clock=clock
        )
        clock.now += 301
        try:
            killer.run_pass()
        except Killed:
            pass
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), clock=clock)
    for _ in range(3):
        clock.now += 301
        report = sup.run_pass()
        said = report.actions + report.errors
        assert any(job.id in line for line in said), "the job was silently left alone"
    assert len(cluster.sbatch_calls()) <= 2


def test_a_retry_within_min_job_age_is_made_once(home: Path) -> None:
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "1")
    cluster.set(first, JobState="FAILED")
    clock = Clock(os.stat(Path(job.path) / "claims" / "submission-1").st_mtime)
    killer = Supervisor(
        Slurm(KillAt(cluster, "sbatch", after=False), wait=0), Settings(), clock=clock
    )
    with pytest.raises(Killed):
        killer.run_pass()
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), clock=clock)
    clock.now += 60
    assert sup.run_pass().actions == []  # an sbatch may still be in flight
    clock.now += 100  # past any sbatch in flight, and no landed job can have aged out yet
    assert "resubmitted as submission 2" in sup.run_pass().actions[0]
    assert sbatch_per_marker(cluster) == {f"{job.id}/1": 1, f"{job.id}/2": 1}


def test_killed_after_sbatch_then_aged_out_is_never_submitted_again(home: Path) -> None:
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "2")
    cluster.set(first, JobState="FAILED")
    clock = Clock(os.stat(Path(job.path) / "claims" / "submission-1").st_mtime)
    killer = Supervisor(
        Slurm(KillAt(cluster, "sbatch", after=True), wait=0), Settings(), clock=clock
    )
    with pytest.raises(Killed):
        killer.run_pass()
    second = max(cluster.jobs, key=int)
    # Submission 2 started (the launcher records it), failed, and aged out of slurmctld.
    job.append(
        "started",
        submission=2,
        slurm_job_id=second,
        array_job_id="",
        array_task_id="",
        restart=0,
        attempt="b" * 26,
        epoch=2_000_000,
        exec_dir="/ck/exec/b",
        resume_from="",
        node="n1",
        nodes="n1",
        host="h",
        pid=1,
    )
    del cluster.jobs[second]
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), clock=clock)
    for _ in range(3):
        clock.now += 1000
        report = sup.run_pass()
    assert sbatch_per_marker(cluster) == {f"{job.id}/1": 1, f"{job.id}/2": 1}
    assert [s["slurm_job_id"] for s in job.submissions()] == [first, second]
    assert any(job.id in e and "no longer known to slurmctld" in e for e in report.errors)


def test_an_event_of_the_wrong_shape_is_an_error_for_its_job_only(home: Path) -> None:
    cluster = FakeCluster()
    bad, bad_id = new_job(cluster, "--resubmit", "1")
    good, good_id = new_job(cluster, "--resubmit", "1")
    for jobid in (bad_id, good_id):
        cluster.set(jobid, JobState="FAILED")
    for data in (
        [1, 2],
        {"time": 1, "ns": 1},
        {"event": "submitted", "time": 1.0, "ns": 1, "submission": "2a", "slurm_job_id": "9"},
    ):
        path = Path(bad.path) / "events" / "00000000000000000002-x.json"
        path.write_text(json.dumps(data))
        report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
        assert [e for e in report.errors if str(path) in e and e.startswith(bad.id)], report
        path.unlink()
    assert len(good.submissions()) == 2 and len(bad.submissions()) == 1


# -- the property test -----------------------------------------------------------------------


class World(FakeCluster):
    """The fake controller kept in a file under a lock, so a forked pass and the test share
    it; it counts sbatch per marker and stamps each job's end on the test's clock."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.sbatch: dict[str, int] = {}
        self.now = 0.0
        path.write_text(json.dumps(self.state(1000)))

    def state(self, next_id: int) -> dict[str, Any]:
        return {"jobs": self.jobs, "next": next_id, "sbatch": self.sbatch, "now": self.now}

    def load(self) -> int:
        data = json.loads(self.path.read_text())
        self.jobs, self.sbatch, self.now = data["jobs"], data["sbatch"], data["now"]
        self.calls = []
        return int(data["next"])

    def save(self, next_id: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state(next_id)))
        tmp.replace(self.path)

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            first = self.load()
            self.ids = iter(range(first, 10**9))
            result = super().__call__(argv, env, cwd, timeout)
            if argv[0] == "sbatch":
                jobid = result.stdout.split()[-1]
                for marker in self.jobs[jobid]["Comment"].split():
                    if marker.startswith("dispatch:"):
                        self.sbatch[marker] = self.sbatch.get(marker, 0) + 1
            if argv[0] == "scancel":
                for jobid in argv[1:]:
                    self.jobs[jobid]["Ended"] = str(self.now)
            self.save(next(self.ids) if argv[0] == "sbatch" else first)
        return result


class Steps:
    """Counts a pass's steps (every Slurm call and record write, before and after) and
    SIGKILLs the process at step ``kill_at``: what a crash there would leave."""

    def __init__(self, kill_at: Optional[int]) -> None:
        self.kill_at, self.count = kill_at, 0

    def tick(self) -> None:
        self.count += 1
        if self.count == self.kill_at:
            os.kill(os.getpid(), 9)

    def around(self, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.tick()
            try:
                return fn(*args, **kwargs)
            finally:
                self.tick()

        return wrapped


def run_pass_in_child(
    world: World, now: float, kill_at: Optional[int], seed: int, out: Path
) -> bool:
    """One pass in a forked process, killed at step ``kill_at``; True if it ran to its end."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            steps = Steps(kill_at)
            record.JobRecord.append = steps.around(record.JobRecord.append)  # type: ignore
            record.JobRecord.claim = steps.around(record.JobRecord.claim)  # type: ignore
            rng = random.Random(seed)

            def signal(argv: list[str], timeout: float) -> Answer:
                verdict = rng.choice(["ceased", "not ceased", "not ceased", "error"])
                return Answer(verdict, {"ceased": 0, "not ceased": 1}.get(verdict, 2), {})

            sup = Supervisor(
                Slurm(steps.around(world), wait=0),
                Settings(hold_for=900, interval=60),
                signal_runner=signal,
                clock=lambda: now,
                facts_reader=lambda slurm_id: [],
            )
            report = sup.run_pass()
            out.write_text(json.dumps({"actions": report.actions, "errors": report.errors}))
            code = 0
        except BaseException:  # shown with the failure: the pass failed on its own
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == 9
        return False
    assert os.WEXITSTATUS(status) == 0, "the pass failed on its own (not killed)"
    return True


def evolve(world: World, jobs: dict[str, record.JobRecord], rng: random.Random, now: float) -> None:
    """Slurm moves on between passes: jobs start (the launcher records it), end, are
    released by a person now and then, and age out MinJobAge after their end."""
    first = world.load()
    world.now = now
    for jobid, fields in list(world.jobs.items()):
        words = [w for w in fields["Comment"].split() if w.startswith("dispatch:")]
        ident, _, number = words[0][len("dispatch:") :].partition("/") if words else ("", "", "")
        state = fields["JobState"]
        if state == "PENDING" and fields["Reason"] == "JobHeldUser" and rng.random() < 0.03:
            fields.update(JobState="RUNNING", Reason="None")  # a person's scontrol release
            state = "RUNNING"
        elif state == "PENDING" and fields["Reason"] != "JobHeldUser":
            fields.update(JobState="RUNNING")
            state = "RUNNING"
        if state == "RUNNING" and not fields.get("Started") and ident in jobs:
            fields["Started"] = "1"
            task = fields.get("ArrayTaskId", "")  # an array task: its own id, its array's
            submission = int(number.partition("-t")[0])
            jobs[ident].append(
                "started",
                submission=submission,
                slurm_job_id=jobid,
                array_job_id=fields.get("ArrayJobId", "") if task else "",
                array_task_id=task,
                restart=0,
                attempt="a" * 26,
                epoch=submission * 10**6,
                exec_dir="/x",
                resume_from="",
                node="n1",
                nodes="n1",
                host="h",
                pid=1,
            )
        elif state == "RUNNING" and rng.random() < 0.3:
            end = rng.choice(["FAILED", "FAILED", "NODE_FAIL", "NODE_FAIL", "COMPLETED", "TIMEOUT"])
            fields.update(JobState=end, Ended=str(now))
        elif fields.get("Ended") and now - float(fields["Ended"]) > 300:
            del world.jobs[jobid]  # aged out of slurmctld (MinJobAge)
    world.save(first)


def check(
    world: World,
    jobs: dict[str, record.JobRecord],
    report: Optional[dict[str, Any]],
    now: float,
    passed_holds: set[str],
    figures: dict[str, Any],
) -> None:
    world.load()
    doubled = {m: c for m, c in world.sbatch.items() if c > 1}
    assert not doubled, f"submissions made twice: {doubled}"
    if report is None:
        return
    held_ids = {
        j
        for j, f in world.jobs.items()
        if f["JobState"] == "PENDING" and f["Reason"] == "JobHeldUser"
    }
    for ident, job in jobs.items():
        history = job.history()
        said = [e for e in report["errors"] + report["actions"] if e.startswith(ident)]
        if any("STUCK" in e for e in report["errors"] if e.startswith(ident)):
            figures["stuck"].add(ident)
        tasks = sbatch_words.array_tasks(job)
        # Every lineage: the job's, or each task's of an array (each on its own).
        for task in [None] if tasks is None else tasks:
            line = history.lineage(task)
            if line.settled or said:
                continue
            current = line.current
            assert current is not None
            live = any(
                f["JobState"] in ("PENDING", "RUNNING")
                for j, f in world.jobs.items()
                if (
                    j == current.slurm_job_id
                    if task is None
                    else f.get("ArrayJobId") == current.slurm_job_id
                    and f.get("ArrayTaskId") == str(task)
                )
            )
            claims = job.claims(naming.claim_name(current.submission + 1, task))
            in_flight = bool(claims) and now - claims[-1][1]["time"] < supervisor.SBATCH_SETTLE
            assert live or in_flight, (
                f"{ident} task {task} silently lost: submission "
                f"{current.submission} ({current.slurm_job_id}); "
                f"{report}"
            )
            hold = line.hold
            if hold is not None:
                assert hold.deadline > hold.time, hold
                if hold.slurm_job_id in passed_holds:
                    assert line.answers_for(hold.slurm_job_id), (
                        f"{ident} task {task}: hold never asked about"
                    )
    for jobid in held_ids:
        ident, _, number = (
            world.jobs[jobid]["Comment"].split()[0][len("dispatch:") :].partition("/")
        )
        n, _, task_id = number.partition("-t")
        line = jobs[ident].history().lineage(int(task_id) if task_id else None)
        hold = line.hold_for(int(n))
        assert hold is not None and hold.deadline > 0, f"held {jobid} unknown to {ident}"
    passed_holds.clear()
    passed_holds.update(held_ids)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sigkills_never_double_nor_lose_a_submission(home: Path, seed: int) -> None:
    rng = random.Random(seed)
    world = World(home / "world.json")
    jobs = {}
    for i in range(16):
        options = ["--resubmit", str(rng.randint(2, 8))]
        if i % 2:
            options.append("--shared-checkpoint")
        if i % 4 >= 2:
            options.append("--array=0-2")  # each task a lineage of its own
        job, _ = new_job(world, *options)
        jobs[job.id] = job
    now = os.stat(Path(next(iter(jobs.values())).path) / "claims" / "submission-1").st_mtime
    figures: dict[str, Any] = {"passes": 0, "kills": 0, "stuck": set()}
    passed_holds: set[str] = set()
    out = home / "report.json"
    for step in range(150):
        # Passes every minute or so (scrontab, --loop); now and then the supervisor is down
        # long enough for ended jobs to age out of slurmctld.
        now += rng.choice([20, 45, 60, 60, 90]) if rng.random() > 0.04 else 900
        evolve(world, jobs, rng, now)
        # Most steps that change anything come early in a pass (its first actions).
        kill_at = rng.randint(1, rng.choice([6, 12, 30])) if rng.random() < 0.7 else None
        out.unlink(missing_ok=True)
        whole = run_pass_in_child(world, now, kill_at, seed * 1000 + step, out)
        figures["passes"] += 1
        figures["kills"] += not whole
        report = json.loads(out.read_text()) if whole else None
        check(world, jobs, report, now, passed_holds, figures)
    world.load()
    figures["sbatch"] = sum(world.sbatch.values())
    figures["settled"] = sum(
        j.history().settled_tasks(sbatch_words.array_tasks(j) or []) for j in jobs.values()
    )
    figures["holds"] = sum(len(j.history().of(events.Hold)) for j in jobs.values())
    figures["task submissions"] = sum(
        s.task is not None for j in jobs.values() for s in j.history().submissions
    )
    figures["stuck"] = len(figures["stuck"])
    print(f"seed {seed}: {figures} over {len(jobs)} jobs")
    assert figures["kills"] > 20 and figures["sbatch"] > 1.5 * len(jobs) and figures["holds"]
    assert figures["task submissions"] > 4, "the world's arrays never resubmitted a task"
