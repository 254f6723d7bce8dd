"""The supervisor's passes against a fake controller: rules, budgets, holds, cessation."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from slurm_dispatch.control import events, naming, record, submit
from slurm_dispatch.control.holds import Answer, release
from slurm_dispatch.control.supervisor import (
    LAUNCH_RELEASED_BY,
    LAUNCH_RELEASES,
    Settings,
    Supervisor,
)
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes.cluster import FakeCluster


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Signal:
    """A scripted CessationSignal that records what it was asked."""

    def __init__(self, *verdicts: str) -> None:
        self.verdicts = list(verdicts)
        self.asked: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> Answer:
        self.asked.append(argv)
        verdict = self.verdicts.pop(0)
        return Answer(
            verdict,
            {"ceased": 0, "not ceased": 1}.get(verdict, 2),
            {"nodes": [{"node": "n1", "evidence": verdict}]},
        )


ROOTS = itertools.count()


def new_job(cluster: FakeCluster, *options: str) -> tuple[record.JobRecord, str]:
    root = f"ck-{next(ROOTS)}"  # a root of its own: one live dispatch job per root
    if any(o.startswith("--array") for o in options):
        root += "/t%a"  # and one per task of an array
    done = submit.submit_new(
        submit.read_request(["--checkpoint", root, *options, "job.sh"]), Slurm(cluster, wait=0)
    )
    return done.job, done.slurm_job_id


def last_slurm_id(job: record.JobRecord) -> str:
    return str(job.submissions()[-1]["slurm_job_id"])


def kinds(job: record.JobRecord) -> list[str]:
    return [e["event"] for e in job.events()]


def test_failing_isolated_job_is_resubmitted_until_budget_is_spent(home: Path) -> None:
    cluster = FakeCluster()
    job, first = new_job(cluster, "--resubmit", "2")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    assert sup.run_pass().actions == []  # running: nothing to do
    for n in (1, 2):
        cluster.set(last_slurm_id(job), JobState="FAILED")
        report = sup.run_pass()
        assert f"resubmitted as submission {n + 1}" in report.actions[0]
        assert sup.run_pass().actions == []  # idempotent: the new submission is running
    cluster.set(last_slurm_id(job), JobState="FAILED")
    report = sup.run_pass()
    assert "stop (no resubmit budget)" in report.actions[0]
    assert [s["submission"] for s in job.submissions()] == [1, 2, 3]
    assert kinds(job)[-1] == "finished"
    assert sup.run_pass().actions == []
    assert len(cluster.sbatch_calls()) == 3


@pytest.mark.parametrize("state", ["CANCELLED", "COMPLETED"])
def test_cancel_and_completion_are_never_undone(home: Path, state: str) -> None:
    cluster = FakeCluster()
    job, slurm_id = new_job(cluster, "--resubmit", "5")
    cluster.set(slurm_id, JobState=state)
    Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert len(cluster.sbatch_calls()) == 1 and kinds(job)[-1] == "finished"


def test_isolated_job_keeps_slurms_requeue(home: Path) -> None:
    cluster = FakeCluster()
    job, slurm_id = new_job(cluster, "--resubmit", "1")
    cluster.set(slurm_id, JobState="PENDING", Reason="BeginTime", Restarts="1")
    assert Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions == []
    assert "--no-requeue" not in cluster.sbatch_calls()[0]


def shared_job(cluster: FakeCluster) -> tuple[record.JobRecord, str]:
    job, slurm_id = new_job(cluster, "--shared-checkpoint", "--resubmit", "3")
    assert "--no-requeue" in cluster.sbatch_calls()[0]
    cluster.set(slurm_id, JobState="NODE_FAIL", Restarts="0")
    return job, slurm_id


def test_shared_job_is_held_and_ceased_answer_lifts_the_hold(home: Path) -> None:
    cluster, clock, signal = FakeCluster(), Clock(), Signal("not ceased", "ceased")
    job, ended = shared_job(cluster)
    sup = Supervisor(
        Slurm(cluster, wait=0), Settings(interval=60), signal_runner=signal, clock=clock
    )
    sup.run_pass()
    held = last_slurm_id(job)
    assert "--hold" in cluster.sbatch_calls()[-1]
    assert cluster.jobs[held]["Reason"] == "JobHeldUser"
    assert "held: shared checkpoint" in cluster.jobs[held]["Comment"]
    hold = [e for e in job.events() if e["event"] == "hold"][0]
    assert hold["deadline"] == clock.now + 24 * 3600 and hold["ended_slurm_job_id"] == ended
    # Asked in the pass that made the hold, then every CessationInterval.
    assert signal.asked == [["dispatch-cease", ended, "--restart", "0", "--json"]]
    sup.run_pass()
    assert len(signal.asked) == 1, "asked again before CessationInterval"
    clock.now += 30
    sup.run_pass()
    assert len(signal.asked) == 1, "asked again before CessationInterval"
    clock.now += 31
    sup.run_pass()
    assert len(signal.asked) == 2
    facts = [e for e in job.events() if e["event"] == "cessation"]
    assert [f["verdict"] for f in facts] == ["not ceased", "ceased"]
    assert facts[0]["evidence"]["nodes"][0]["node"] == "n1"
    assert cluster.jobs[held]["JobState"] == "RUNNING"
    assert kinds(job)[-1] == "released"
    sup.run_pass()
    assert len(cluster.sbatch_calls()) == 2 and len(signal.asked) == 2


def test_a_hold_already_proven_ceased_is_lifted_in_the_pass_that_made_it(home: Path) -> None:
    """The ended execution's node had proven it gone before the pass; the
    held submission no longer waits a whole pass (the loop's interval) for its first
    question."""
    cluster, clock, signal = FakeCluster(), Clock(), Signal("ceased")
    job, ended = shared_job(cluster)
    sup = Supervisor(
        Slurm(cluster, wait=0), Settings(interval=60), signal_runner=signal, clock=clock
    )
    report = sup.run_pass()
    held = last_slurm_id(job)
    assert signal.asked == [["dispatch-cease", ended, "--restart", "0", "--json"]]
    assert cluster.jobs[held]["JobState"] == "RUNNING", report.actions
    assert "released" in kinds(job)
    assert any("lifted: ceased" in a for a in report.actions), report.actions


def test_hold_without_signal_waits_for_a_person(home: Path) -> None:
    cluster, signal = FakeCluster(), Signal()
    job, _ = shared_job(cluster)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(signal=None), signal_runner=signal)
    for _ in range(3):
        sup.run_pass()
    assert signal.asked == [] and cluster.jobs[last_slurm_id(job)]["JobState"] == "PENDING"
    assert release(Slurm(cluster, wait=0), job) == last_slurm_id(job)
    assert cluster.jobs[last_slurm_id(job)]["JobState"] == "RUNNING"
    sup.run_pass()
    assert [e["by"] for e in job.events() if e["event"] == "released"] == [
        "a person (dispatch release)"
    ]


def test_scontrol_release_by_a_person_is_recorded(home: Path) -> None:
    cluster = FakeCluster()
    job, _ = shared_job(cluster)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(signal=None))
    sup.run_pass()
    cluster.set(last_slurm_id(job), JobState="RUNNING", Reason="None")
    sup.run_pass()
    assert [e["by"] for e in job.events() if e["event"] == "released"] == [
        "a person (scontrol release)"
    ]


def test_hold_expires_and_nothing_more_starts(home: Path) -> None:
    cluster, clock = FakeCluster(), Clock()
    job, _ = shared_job(cluster)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(hold_for=600, signal=None), clock=clock)
    sup.run_pass()
    held = last_slurm_id(job)
    clock.now += 601
    report = sup.run_pass()
    assert "expired" in report.actions[0]
    assert cluster.jobs[held]["JobState"] == "CANCELLED"
    assert kinds(job)[-2:] == ["expired", "finished"]
    sup.run_pass()
    assert len(cluster.sbatch_calls()) == 2


def test_signal_error_is_recorded_and_hold_stands(home: Path) -> None:
    cluster, clock = FakeCluster(), Clock()
    job, _ = shared_job(cluster)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), signal_runner=Signal("error"), clock=clock)
    sup.run_pass()
    sup.run_pass()
    assert [e["verdict"] for e in job.events() if e["event"] == "cessation"] == ["error"]
    assert cluster.jobs[last_slurm_id(job)]["JobState"] == "PENDING"


def test_pass_costs_one_controller_call_for_many_jobs(home: Path) -> None:
    cluster = FakeCluster()
    for _ in range(200):
        new_job(cluster, "--resubmit", "1")
    cluster.calls.clear()
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert report.actions == [] and [c[:2] for c in cluster.calls] == [["squeue", "--me"]]


def test_killed_after_claim_is_finished_by_next_pass(home: Path) -> None:
    cluster = FakeCluster()
    job, slurm_id = new_job(cluster, "--resubmit", "1")
    cluster.set(slurm_id, JobState="FAILED")
    # A pass died after claiming submission 2 and running sbatch, before recording it.
    assert job.claim("submission-2")
    cluster.add("RUNNING", comment=naming.marker(job, 2))
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert "recorded submission 2" in report.actions[0]
    assert len(cluster.sbatch_calls()) == 1
    assert [s["submission"] for s in job.submissions()] == [1, 2]


def test_an_old_claim_without_evidence_is_stuck_and_reported_every_pass(home: Path) -> None:
    cluster, clock = FakeCluster(), Clock()
    job, slurm_id = new_job(cluster, "--resubmit", "1")
    cluster.set(slurm_id, JobState="FAILED")
    assert job.claim("submission-2")  # a pass died around its sbatch
    clock.now = os.stat(Path(job.path) / "claims" / "submission-2").st_mtime + 10
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), clock=clock)
    assert sup.run_pass().actions == []  # fresh claim: someone may be submitting
    clock.now += 1000  # older than MinJobAge: a job it made could have aged out unseen
    for _ in range(2):
        errors = sup.run_pass().errors
        assert len(errors) == 1 and "STUCK: submission 2" in errors[0]
        assert f"{job.path}/claims/submission-2*" in errors[0]
    assert len(cluster.sbatch_calls()) == 1
    for name in os.listdir(Path(job.path) / "claims"):  # what the message tells a person
        if name.startswith("submission-2"):
            os.unlink(Path(job.path) / "claims" / name)
    assert "resubmitted as submission 2" in sup.run_pass().actions[0]


class FileCluster(FakeCluster):
    """A FakeCluster kept in a file, shared by processes under an flock: one controller."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        import fcntl
        import json

        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(Path(self.path).read_text())
            self.jobs, self.calls = state["jobs"], state["calls"]
            self.ids = iter(range(state["next"], 10**9))
            result = super().__call__(argv, env, cwd, timeout)
            if argv[0] == "sbatch":
                self.set(result.stdout.split()[-1], JobState="FAILED")  # every run fails
            state = {"jobs": self.jobs, "calls": self.calls, "next": next(self.ids)}
            Path(self.path).write_text(json.dumps(state))
        return result


def _supervise_many(home: str, state_file: str, passes: int) -> None:
    os.environ["DISPATCH_HOME"] = home
    sup = Supervisor(Slurm(FileCluster(state_file), wait=0), Settings(signal=None))
    for _ in range(passes):
        sup.run_pass()


def test_two_supervisors_never_double_submit(home: Path) -> None:
    import json

    cluster = FakeCluster()
    jobs = [new_job(cluster, "--resubmit", "5")[0] for _ in range(10)]
    for jobid in cluster.jobs:
        cluster.set(jobid, JobState="FAILED")
    state = home / "cluster.json"
    state.write_text(json.dumps({"jobs": cluster.jobs, "calls": [], "next": 1000}))
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_supervise_many, args=(os.environ["DISPATCH_HOME"], str(state), 15))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for job in jobs:
        numbers = [s["submission"] for s in job.submissions()]
        assert numbers == list(range(1, 7)), f"{job.id}: {numbers}"
        assert kinds(job)[-1] == "finished"
    calls = json.loads(state.read_text())["calls"]
    assert sum(1 for c in calls if c[0] == "sbatch") == 10 * 5


def test_another_users_job_carrying_our_marker_is_never_adopted(home: Path) -> None:
    """Finding 5b: comments are public; another user planted a held job with our marker."""

    class WholeQueue(FakeCluster):  # a controller that ignores --me: the uid check remains
        def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
            return super().__call__([a for a in argv if a != "--me"], env, cwd, timeout)

    for cluster in (FakeCluster(), WholeQueue()):
        job, slurm_id = new_job(cluster, "--resubmit", "1")
        cluster.set(slurm_id, JobState="FAILED")
        assert job.claim("submission-2")  # our pass died before its sbatch
        planted = cluster.add(
            "PENDING", comment=naming.marker(job, 2), Reason="JobHeldUser", UserId="mallory(4242)"
        )
        report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
        assert [s["slurm_job_id"] for s in job.submissions()] == [slurm_id], report
        assert planted not in " ".join(report.actions)


def test_a_released_hold_lets_the_rules_apply_again(home: Path) -> None:
    cluster, clock = FakeCluster(), Clock()
    job, _ = shared_job(cluster)
    sup = Supervisor(
        Slurm(cluster, wait=0), Settings(), signal_runner=Signal("ceased"), clock=clock
    )
    sup.run_pass()
    clock.now += 61
    sup.run_pass()
    assert kinds(job)[-1] == "released"
    cluster.set(last_slurm_id(job), JobState="NODE_FAIL")  # the released submission fails
    clock.now += 61
    assert "submission 3 held" in " ".join(sup.run_pass().actions)


class MailingCluster(FakeCluster):
    """Also answers `scontrol show config`, as 22.05 prints it."""

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        if list(argv) == ["scontrol", "show", "config"]:
            self.calls.append(list(argv))
            return Result(
                list(argv),
                0,
                "Configuration data as of 2026-01-01T00:00:00\n"
                "MailDomain              = (null)\n"
                "MailProg                = /usr/bin/mail\n",
                "",
            )
        return super().__call__(argv, env, cwd, timeout)


class Notifier:
    def __init__(self, ok: bool = True) -> None:
        self.sent: list[list[str]] = []
        self.texts: list[str] = []
        self.ok = ok

    def __call__(self, argv: list[str], text: str, timeout: float) -> tuple[bool, str]:
        self.sent.append(argv)
        self.texts.append(text)
        return self.ok, "" if self.ok else "mail: cannot send"


def test_a_hold_is_told_when_made_and_before_it_expires(home: Path) -> None:
    cluster, clock, notifier = MailingCluster(), Clock(), Notifier()
    job, ended = new_job(
        cluster, "--shared-checkpoint", "--resubmit", "1", "--mail-user=ann@example.org"
    )
    cluster.set(ended, JobState="NODE_FAIL")
    settings = Settings(
        signal=None, hold_for=10 * 3600, mail=True, notify="/site/tell -v", warn_before=2 * 3600
    )
    sup = Supervisor(Slurm(cluster, wait=0), settings, clock=clock, notifier=notifier)
    report = sup.run_pass()
    held = last_slurm_id(job)
    deadline = clock.now + 10 * 3600
    day = time.strftime("%Y-%m-%d", time.localtime(deadline))
    assert f"until {day} " in report.actions[0]  # a date, not only a time of day
    assert f"expires {day} " in cluster.jobs[held]["Comment"]  # what squeue shows
    mail, site = notifier.sent
    assert mail[:2] == ["/usr/bin/mail", "-s"] and mail[3] == "ann@example.org"
    assert held in mail[2] and day in mail[2] and f"dispatch release {job.id}" in notifier.texts[0]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(deadline))
    assert site == [
        "/site/tell",
        "-v",
        "made",
        job.id,
        held,
        stamp,
        job.spec["user"],
        "ann@example.org",
    ]
    for _ in range(2):
        clock.now += 3600
        sup.run_pass()
    assert len(notifier.sent) == 2, "warned too early or told twice"
    clock.now += 6 * 3600 + 1  # now within 2 h of the deadline
    sup.run_pass()
    sup.run_pass()
    assert [a[2] for a in notifier.sent[2:]][1:] == ["expiring"] and len(notifier.sent) == 4
    assert "expires" in notifier.sent[2][2]
    assert [c for c in cluster.calls if c[:2] == ["scontrol", "show"]] == [
        ["scontrol", "show", "config"]
    ] * 2  # once per pass that mailed, not per job


def test_a_failing_mailer_is_reported_and_never_blocks_the_pass(home: Path) -> None:
    cluster, clock, signal = MailingCluster(), Clock(), Signal("not ceased", "not ceased")
    job, ended = shared_job(cluster)
    sup = Supervisor(
        Slurm(cluster, wait=0),
        Settings(mail=True),
        signal_runner=signal,
        clock=clock,
        notifier=Notifier(ok=False),
    )
    report = sup.run_pass()
    assert "held" in " ".join(report.actions)
    assert any("could not tell" in e and "mail: cannot send" in e for e in report.errors)
    told = [e for e in job.events() if e["event"] == "notified"]
    assert [(t["channel"], t["ok"]) for t in told] == [("mail", False)]
    clock.now += 61
    report = sup.run_pass()
    assert signal.asked and not report.errors  # asked about; the failed mail is not retried


def test_release_by_a_person_shows_the_evidence_and_asks_for_force(home: Path) -> None:
    """`dispatch release` of a job whose old execution still has survivors
    released it silently; now the evidence is shown and --force asked for."""
    from slurm_dispatch.errors import RefusedError

    cluster = FakeCluster()
    job, ended = shared_job(cluster)
    Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    held = last_slurm_id(job)
    settings = Settings(signal="dispatch-cease")
    with pytest.raises(RefusedError) as info:
        release(Slurm(cluster, wait=0), job, settings, signal_runner=Signal("not ceased"))
    text = str(info.value)
    assert f"{ended}: not ceased" in text and "n1: not ceased" in text
    assert f"dispatch release --force {job.id}" in text
    assert cluster.jobs[held]["Reason"] == "JobHeldUser"  # still held
    assert [e["verdict"] for e in job.events() if e["event"] == "cessation"] == ["not ceased"]
    assert release(Slurm(cluster, wait=0), job, settings, force=True) == held
    assert cluster.jobs[held]["JobState"] == "RUNNING"
    released = [e for e in job.events() if e["event"] == "released"]
    assert released[-1]["by"] == "a person (dispatch release --force)"
    # The comment no longer says "held" once the hold is over.
    comment = cluster.jobs[held]["Comment"]
    assert comment.startswith(f"dispatch:{job.id}/2 released by a person") and "held" not in comment


def test_a_ceased_answer_lets_a_person_release_without_force(home: Path) -> None:
    cluster = FakeCluster()
    job, _ = shared_job(cluster)
    Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    held = last_slurm_id(job)
    assert release(Slurm(cluster, wait=0), job, Settings(), signal_runner=Signal("ceased")) == held


def test_a_held_job_cancelled_is_not_a_release_and_the_job_finishes(home: Path) -> None:
    """`scancel` of a held job was logged "hold lifted by a person (scontrol
    release)" and the job never got a finished record."""
    cluster = FakeCluster()
    job, _ = shared_job(cluster)
    sup = Supervisor(Slurm(cluster, wait=0), Settings(signal=None))
    sup.run_pass()
    held = last_slurm_id(job)
    cluster.set(held, JobState="CANCELLED", Reason="None")
    for _ in range(2):
        sup.run_pass()
    released = [e for e in job.events() if e["event"] == "released"]
    assert [e["by"] for e in released] == ["Slurm: CANCELLED while held"]
    finished = [e for e in job.events() if e["event"] == "finished"]
    assert len(finished) == 1 and finished[0]["end_state"] == "cancelled"
    assert len(cluster.sbatch_calls()) == 2  # a user's cancel is never undone


LAUNCH_HELD = {"JobState": "PENDING", "Reason": "launch failed requeued held"}


def test_slurms_hold_after_a_failed_launch_is_released_a_few_times(home: Path) -> None:
    """Slurm's own hold (priority 0 after a failed launch) is released for an isolated job,
    once per requeue, at most LAUNCH_RELEASES times a submission; then a person looks."""
    cluster = FakeCluster()
    job, slurm_id = new_job(cluster)
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    for restart in range(1, LAUNCH_RELEASES + 1):
        cluster.set(slurm_id, **LAUNCH_HELD, Restarts=str(restart))
        report = sup.run_pass()
        assert report.actions == [
            f"{job.id}: lifted Slurm's hold on job {slurm_id}, made after a failed launch "
            f"(launch failed requeued held, restart {restart})"
        ], report
        assert cluster.jobs[slurm_id]["JobState"] == "RUNNING"
    cluster.set(slurm_id, **LAUNCH_HELD, Restarts=str(LAUNCH_RELEASES + 1))
    report = sup.run_pass()
    assert report.actions == [] and cluster.jobs[slurm_id]["JobState"] == "PENDING"
    assert (
        f"after {LAUNCH_RELEASES} releases by dispatch, so dispatch leaves it to you"
        in report.errors[0]
        and f"scontrol release {slurm_id}" in report.errors[0]
    ), report
    assert [e["by"] for e in job.events() if e["event"] == "released"] == [
        LAUNCH_RELEASED_BY
    ] * LAUNCH_RELEASES
    assert len(cluster.sbatch_calls()) == 1  # Slurm's requeue, never a resubmission


def test_a_shared_jobs_hold_after_a_failed_launch_is_left_to_a_person(home: Path) -> None:
    cluster = FakeCluster()
    job, slurm_id = new_job(cluster, "--shared-checkpoint", "--resubmit", "1")
    cluster.set(slurm_id, **LAUNCH_HELD, Restarts="1")
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert report.actions == [] and cluster.jobs[slurm_id]["JobState"] == "PENDING"
    assert (
        "shared-checkpoint job, so dispatch leaves it to a person" in report.errors[0]
        and f"scontrol release {slurm_id}" in report.errors[0]
    ), report
    assert "released" not in kinds(job)


@pytest.mark.parametrize("claimed", [True, False])
def test_a_launch_held_shared_job_whose_submission_already_ran_is_not_advised_a_release(
    home: Path, claimed: bool
) -> None:
    """Slurm's hold after a failed launch of a job its node still ran ("Duplicate jobid"): the
    submission's first execution claimed it, so a released relaunch would be refused by the
    launcher (it never runs the script twice).  The advice is the way that works: scancel,
    then a resubmission once dispatch-cease proves the first execution gone (found by the
    attack on 865ad2b)."""
    from slurm_dispatch.execution import launch

    cluster = FakeCluster()
    job, slurm_id = new_job(cluster, "--shared-checkpoint", "--resubmit", "1")
    if claimed:
        launch.claim_shared(job, 1, {"SLURM_JOB_ID": slurm_id, "SLURMD_NODENAME": "n1"})
    else:  # its execution was the release before the claim's: a recorded start, no claim
        job.append(
            "started",
            submission=1,
            slurm_job_id=slurm_id,
            restart=0,
            attempt="a" * 26,
            epoch=1_000_000,
            exec_dir="/x",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    cluster.set(slurm_id, **LAUNCH_HELD, Restarts="1")
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert report.actions == [] and cluster.jobs[slurm_id]["JobState"] == "PENDING"
    (said,) = report.errors
    assert "scontrol release" not in said, said
    assert "already ran on n1" in said and f"`scancel {slurm_id}`" in said, said
    assert f"`dispatch-cease {slurm_id}`" in said and f"`dispatch resubmit {job.id}`" in said


class OwnedSignal(Signal):
    """dispatch-cease's answer names whose facts it judged (its JSON's uid)."""

    def __init__(self, uid: int, *verdicts: str) -> None:
        super().__init__(*verdicts)
        self.uid = uid

    def __call__(self, argv: list[str], timeout: float) -> Answer:
        answer = super().__call__(argv, timeout)
        return Answer(answer.verdict, answer.code, {**answer.evidence, "uid": self.uid})


def test_a_ceased_answer_about_another_users_job_lifts_no_hold(home: Path) -> None:
    """Job ids are used twice (slurmctld's state started anew, MaxJobId wrapped): the ended
    execution's id now names another user's job, which dispatch-cease judges and may find
    ceased.  That is no proof about this user's execution, which may still be writing; where
    users share their primary group, the user may even read the other's facts."""
    cluster, clock = FakeCluster(), Clock()
    signal = OwnedSignal(os.getuid() + 1, "ceased")
    job, ended = shared_job(cluster)
    sup = Supervisor(
        Slurm(cluster, wait=0), Settings(interval=60), signal_runner=signal, clock=clock
    )
    sup.run_pass()
    held = last_slurm_id(job)
    sup.run_pass()
    assert len(signal.asked) == 1
    (fact,) = [e for e in job.events() if e["event"] == "cessation"]
    assert fact["verdict"] == "error"
    assert (
        f"Slurm job {ended} was judged from uid {os.getuid() + 1}'s facts, not uid {os.getuid()}'s"
    ) in json.dumps(fact["evidence"])
    assert cluster.jobs[held]["Reason"] == "JobHeldUser" and kinds(job)[-1] != "released"
    # Its own uid's answer lifts it, as any ceased answer does.
    signal.uid, signal.verdicts = os.getuid(), ["ceased"]
    clock.now += 61
    sup.run_pass()
    assert kinds(job)[-1] == "released"


# -- a superseded job that Slurm runs again (soak seed 905155, 2026-12-03) -----------------
#
# dispatch-sbatch --supersede cancelled Slurm job 97; slurmctld, killed 4 s later before it
# saved that, recovered 97 as running, found it missing from its node and requeued it.
# Nothing cancelled it again, and the superseded job ran twice more beside its successor.


@pytest.mark.parametrize(
    "again",
    [
        {"JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1"},
        {"JobState": "RUNNING", "Restarts": "2"},
    ],
)
def test_a_superseded_job_that_slurm_runs_again_is_cancelled_again_and_says_why(
    home: Path, again: dict[str, str]
) -> None:
    from slurm_dispatch.control import status_text

    cluster = FakeCluster()
    old, slurm_id = new_job(cluster)
    new = submit.submit_new(
        submit.read_request(["--supersede", old.id, "job.sh"]), Slurm(cluster, wait=0)
    ).job
    assert cluster.jobs[slurm_id]["JobState"] == "CANCELLED"
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    assert sup.run_pass().actions == []  # cancelled and gone: nothing to do
    cluster.set(slurm_id, **again)  # the controller's restart undid the cancel
    report = sup.run_pass()
    assert report.errors == []
    assert (
        len(report.actions) == 1
        and f"cancelled Slurm job {slurm_id} again" in report.actions[0]
        and new.id in report.actions[0]
    ), report.actions
    assert cluster.jobs[slurm_id]["JobState"] == "CANCELLED"
    assert [c for c in cluster.calls if c[0] == "scancel"] == [["scancel", slurm_id]] * 2
    assert sup.run_pass().actions == []  # once: the cancel holds now
    # dispatch status says why the superseded job's Slurm job was cancelled a second time.
    lines = [status_text.event_text(e) for e in old.history().decisions()]
    assert any(
        f"cancelled Slurm job {slurm_id} again" in line and "active again" in line for line in lines
    ), lines


def test_a_superseded_job_still_completing_from_its_cancel_is_not_cancelled_again(
    home: Path,
) -> None:
    cluster = FakeCluster()
    old, slurm_id = new_job(cluster)
    submit.submit_new(
        submit.read_request(["--supersede", old.id, "job.sh"]), Slurm(cluster, wait=0)
    )
    cluster.set(slurm_id, JobState="COMPLETING")  # its processes are being killed
    assert Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions == []
    assert [c for c in cluster.calls if c[0] == "scancel"] == [["scancel", slurm_id]]


@pytest.mark.parametrize("comment", ["", "a person's own words"])
def test_a_superseded_jobs_slurm_id_now_anothers_unmarked_job_is_not_cancelled(
    home: Path, comment: str
) -> None:
    # Job ids restart when slurmctld loses its state: the superseded record's Slurm job id is
    # then a new job's, one the user submitted with plain sbatch (no dispatch marker).  That
    # job is not the superseded one; the supervisor must never cancel it.
    cluster = FakeCluster()
    old, slurm_id = new_job(cluster)
    submit.submit_new(
        submit.read_request(["--supersede", old.id, "job.sh"]), Slurm(cluster, wait=0)
    )
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    assert sup.run_pass().actions == []
    cluster.jobs[slurm_id] = {
        "JobId": slurm_id,
        "JobState": "RUNNING",
        "Reason": "None",
        "Restarts": "0",
        "Comment": comment,
    }
    report = sup.run_pass()
    assert [c for c in cluster.calls if c[0] == "scancel"] == [["scancel", slurm_id]]
    assert cluster.jobs[slurm_id]["JobState"] == "RUNNING"
    assert report.actions == [], report.actions


def test_a_superseded_arrays_tasks_all_run_again_are_cancelled_and_recorded(home: Path) -> None:
    # A controller that lost the cancel of a 40-task array requeues every task: the event that
    # records the second cancel was keyed by every task's id and restart count, a file name
    # longer than a file system takes ('File name too long'), so nothing said why.
    cluster = FakeCluster(first_id=1_000_000)
    old, slurm_id = new_job(cluster, "--array=1-40")
    submit.submit_new(
        submit.read_request(["--supersede", old.id, "--array=1-40", "job.sh"]),
        Slurm(cluster, wait=0),
    )
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    assert sup.run_pass().actions == []
    tasks = [j for j, f in cluster.jobs.items() if f.get("ArrayJobId") == slurm_id]
    for task in tasks:
        cluster.set(task, JobState="PENDING", Restarts="1")
    report = sup.run_pass()
    assert report.errors == [] and len(report.actions) == 1, report
    assert all(cluster.jobs[t]["JobState"] == "CANCELLED" for t in tasks)
    again = [e for e in old.history().of(events.Superseded) if e.again]
    assert len(again) == 1 and len(again[0].cancelled) == 40
    assert sup.run_pass().actions == []


def test_a_superseded_jobs_submission_that_landed_unrecorded_is_cancelled(home: Path) -> None:
    # A pass resubmitting the old job was killed after its sbatch landed, before it recorded
    # the submission (its claim says so); the user superseded the job meanwhile.  That Slurm
    # job carries the old job's marker but is in none of its submissions: --supersede did not
    # cancel it, and no pass recovers a superseded job's claim, so it ran beside its successor.
    cluster = FakeCluster()
    old, slurm_id = new_job(cluster)
    cluster.set(slurm_id, JobState="CANCELLED")
    landed = cluster.add("RUNNING", naming.marker(old, 2))
    submit.submit_new(
        submit.read_request(["--supersede", old.id, "job.sh"]), Slurm(cluster, wait=0)
    )
    assert cluster.jobs[landed]["JobState"] == "RUNNING"  # not one of its submissions
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert cluster.jobs[landed]["JobState"] == "CANCELLED", report
    assert any(f"cancelled Slurm job {landed}" in a for a in report.actions), report.actions


def lose_state(cluster: FakeCluster, first_id: int) -> None:
    """slurmctld lost its state: it knows no job, and its ids start again at ``first_id``."""
    cluster.jobs.clear()
    cluster.ids = itertools.count(first_id)


class AccountingCluster(FakeCluster):
    """A site with accounting: sacct answers with the newest job of an id, as it does."""

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        if argv[0] == "sacct":
            self.calls.append(list(argv))
            wanted = argv[argv.index("-j") + 1]
            found = getattr(self, "accounted", self.jobs).get(wanted)
            text = (
                f"{wanted}|{wanted}|{found['JobState']}|{os.getuid()}|"
                f"{found.get('SubmitTime', '2026-01-01T00:00:00')}\n"
                if found is not None
                else ""
            )
            return Result(list(argv), 0, text, "")
        return super().__call__(argv, env, cwd, timeout)


@pytest.mark.parametrize("comment", ["", "a person's own words"])
@pytest.mark.parametrize("accounting", [False, True])
def test_a_reused_slurm_id_of_a_plain_job_never_settles_the_dispatch_job(
    home: Path, comment: str, accounting: bool
) -> None:
    # Dispatch job D is Slurm job 70; slurmctld loses its state and ids start
    # again; the user's plain sbatch job becomes 70 and completes.  It is not D's submission
    # (no marker of D's): D is not recorded completed, and its budget stays; nor is what
    # sacct and the controller's end record say of id 70 (the newest job of the id: the plain
    # one, which exited 1 here).
    cluster = (AccountingCluster if accounting else FakeCluster)(first_id=70)
    job, slurm_id = new_job(cluster, "--resubmit", "3")
    assert slurm_id == "70"
    ends = [
        {
            "restart": 0,
            "end": {"exit_code": "1:0", "source": "controller"},
            "nodes": {},
            "problems": [],
        }
    ]
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _id: ends)
    assert sup.run_pass().actions == []
    lose_state(cluster, 70)
    assert cluster.add("COMPLETED", comment) == "70"
    report = sup.run_pass()
    assert report.actions == [], report.actions
    assert "finished" not in kinds(job)
    assert any("no longer known to slurmctld" in e for e in report.errors), report.errors
    if accounting:
        # The plain job ages out of squeue; sacct keeps it, submitted after D's submission.
        later = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 600))
        cluster.set("70", SubmitTime=later)
        sup.facts = lambda _id: []
        cluster.accounted = dict(cluster.jobs)  # type: ignore[attr-defined]
        cluster.jobs.clear()
        report = sup.run_pass()
        assert report.actions == [], report.actions
        assert "finished" not in kinds(job)


def test_a_submission_made_without_a_marker_falls_back_to_times(home: Path) -> None:
    # A submission whose comment is the user's own carries no marker: a Slurm job under its id
    # submitted well after it is another job; one submitted before it was recorded is its own.
    cluster = FakeCluster(first_id=70)
    job, slurm_id = new_job(cluster, "--resubmit", "3", "--comment=mine")
    submitted = job.history().lineage().current
    assert submitted is not None
    later = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(submitted.time + 3600))
    sup = Supervisor(Slurm(cluster, wait=0), Settings(), facts_reader=lambda _id: [])
    lose_state(cluster, 70)
    cluster.add("COMPLETED", "mine", SubmitTime=later)
    assert sup.run_pass().actions == []
    assert "finished" not in kinds(job)
    before = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(submitted.time - 1))
    cluster.set(slurm_id, SubmitTime=before)
    assert "COMPLETED" in " ".join(sup.run_pass().actions).upper()
    assert kinds(job)[-1] == "finished"


def test_a_reused_slurm_id_of_a_plain_job_is_never_cancelled_nor_live_for_the_record(
    home: Path,
) -> None:
    # After slurmctld lost its state, the user's plain sbatch job 70 runs under the id of
    # dispatch job D's submission: `dispatch cancel D` must not cancel it, and a person's
    # resubmission of D is not refused as if D still ran.
    cluster = FakeCluster(first_id=70)
    job, slurm_id = new_job(cluster, "--resubmit", "3")
    lose_state(cluster, 70)
    cluster.add("RUNNING")
    slurm = Slurm(cluster, wait=0)
    assert submit.live_slurm_jobs(slurm, job) == []
    assert submit.cancel_job(slurm, job) == []
    assert cluster.jobs[slurm_id]["JobState"] == "RUNNING"
    submit.refuse_while_live(slurm, job)  # no UsageError


def test_a_hold_lifted_in_the_pass_that_made_it_is_told_to_nobody(home: Path) -> None:
    """Attack on asking at once: the hold is asked about in the pass that makes it, but the
    owner was mailed (and the site's HoldNotify run) 'held until <deadline>; dispatch release
    once...' first, for a hold lifted a moment later: every restart of a shared job whose
    node had proven its execution gone mailed about a hold there never was to act on."""
    cluster, clock, notifier = MailingCluster(), Clock(), Notifier()
    job, ended = new_job(
        cluster, "--shared-checkpoint", "--resubmit", "1", "--mail-user=ann@example.org"
    )
    cluster.set(ended, JobState="NODE_FAIL")
    sup = Supervisor(
        Slurm(cluster, wait=0),
        Settings(mail=True, notify="/site/tell"),
        signal_runner=Signal("ceased"),
        clock=clock,
        notifier=notifier,
    )
    report = sup.run_pass()
    assert cluster.jobs[last_slurm_id(job)]["JobState"] == "RUNNING", report.actions
    assert notifier.sent == [], notifier.sent
    assert [e for e in job.events() if e["event"] == "notified"] == []
