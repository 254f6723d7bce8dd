"""The supervisor: one idempotent pass applies every dispatch job's recovery rules.

A pass reads the user's dispatch jobs, asks Slurm once for every job it knows
(``scontrol -o show job``), and for each dispatch job whose latest submission has ended
applies the rule for its end state (:mod:`slurm_dispatch.rules`):

* isolated jobs: Slurm's own requeue covers node failure and preemption (raises R); failures
  with budget left are resubmitted (raises N);
* shared-checkpoint jobs: the next submission is made *held* (a real Slurm hold: ``squeue``
  shows it, ``scontrol release`` or ``dispatch release`` lifts it).  While the hold stands the
  site's CessationSignal is asked about the ended execution every CessationInterval; each
  answer is recorded as a cessation fact; a ceased answer releases the hold.  A hold that
  outlives SharedHoldFor is cancelled and recorded as expired: nothing more starts.

Invariants: a submission is made at most once, also with several supervisors running at once
(its claim file is created with O_EXCL before sbatch runs, and Slurm's view is searched for
its marker before a stale claim is retried); a pass killed anywhere leaves a state the next
pass completes.  A pass costs one controller call plus one per action it takes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import record, rules, submit
from .errors import DispatchError, RecordError, SlurmError
from .slurm import Job, Slurm, is_active

STALE_CLAIM_SECONDS = 300.0
FINISHED_EVENTS = {"finished"}


@dataclass(frozen=True)
class Settings:
    hold_for: float = 24 * 3600.0
    signal: Optional[str] = "dispatch-cease"
    interval: float = 60.0
    signal_timeout: float = 120.0


def site_settings() -> Settings:
    """The supervisor's settings from the site's dispatch.conf; a bad file is an error."""
    from . import config
    from .errors import ConfigError
    conf = config.load()
    if conf.problems:
        raise ConfigError("site configuration: " + "; ".join(conf.problems))
    return Settings(hold_for=float(conf.shared_hold_for),
                    signal=conf.cessation_signal or None,
                    interval=float(conf.cessation_interval))


@dataclass
class Answer:
    verdict: str  # "ceased" | "not ceased" | "error"
    code: Optional[int]
    evidence: Any


SignalRunner = Callable[[list[str], float], Answer]


def ask_signal(argv: list[str], timeout: float) -> Answer:
    """Run the site's CessationSignal: exit 0 ceased, 1 not ceased, anything else an error."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return Answer("error", None, f"{argv[0]!r} not found")
    except subprocess.TimeoutExpired:
        return Answer("error", None, f"no answer within {timeout:g} s")
    evidence: Any = proc.stdout.strip()
    try:
        evidence = json.loads(proc.stdout)
    except ValueError:
        pass
    verdict = {0: "ceased", 1: "not ceased"}.get(proc.returncode, "error")
    if verdict == "error" and proc.stderr.strip():
        evidence = {"output": evidence, "stderr": proc.stderr.strip()[-2000:]}
    return Answer(verdict, proc.returncode, evidence)


@dataclass
class PassReport:
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    controller_calls: int = 0


def _state(info: Optional[Job]) -> str:
    return info.state if info is not None else ""


def _latest(events: list[dict[str, Any]], kind: str) -> Optional[dict[str, Any]]:
    found = [e for e in events if e["event"] == kind]
    return found[-1] if found else None


class Supervisor:
    def __init__(self, slurm: Slurm, settings: Settings, home: Optional[str] = None,
                 signal_runner: SignalRunner = ask_signal,
                 clock: Callable[[], float] = time.time) -> None:
        self.slurm = slurm
        self.settings = settings
        self.home = home
        self.ask = signal_runner
        self.clock = clock

    def run_pass(self) -> PassReport:
        report = PassReport()
        jobs = record.all_jobs(self.home)
        if not jobs:
            return report
        slurm_jobs = self.slurm.own_jobs()
        report.controller_calls += 1
        for job in jobs:
            try:
                self._job(job, slurm_jobs, report)
            except DispatchError as exc:
                report.errors.append(f"{job.id}: {exc}")
        return report

    # -- one job -------------------------------------------------------------------------
    def _job(self, job: record.JobRecord, slurm_jobs: dict[str, Job],
             report: PassReport) -> None:
        events = job.events()
        if _latest(events, "finished") or _latest(events, "superseded"):
            return
        submissions = [e for e in events if e["event"] == "submitted"]
        if not submissions:
            return
        n = max(int(e["submission"]) for e in submissions)
        busy, claim = self._recover_claim(job, n + 1, slurm_jobs, report)
        if busy:
            return
        last = [e for e in submissions if int(e["submission"]) == n][-1]
        info = slurm_jobs.get(str(last["slurm_job_id"]))
        hold = _latest(events, "hold")
        if hold is not None and int(hold["submission"]) == n:
            self._hold(job, events, hold, info, report)
            return
        state = _state(info)
        if not state or is_active(state):
            return  # running, pending, or aged out of slurmctld with nothing to act on
        self._ended(job, n, str(last["slurm_job_id"]), info, report, claim)

    def _recover_claim(self, job: record.JobRecord, nxt: int,
                       slurm_jobs: dict[str, Job], report: PassReport
                       ) -> tuple[bool, Optional[str]]:
        """A claim for submission ``nxt`` with no submission recorded: finish or retry it.

        Returns (leave this job alone this pass, the claim this pass holds for ``nxt``).
        """
        if not job.has_claim(f"submission-{nxt}"):
            return False, None
        wanted = submit.marker(job, nxt)
        for jobid, info in slurm_jobs.items():
            if wanted in info.markers and "_" not in jobid:
                if job.append("submitted", once=str(nxt), submission=nxt, slurm_job_id=jobid,
                              reason="recovered", argv=[], recovered=True):
                    report.actions.append(
                        f"{job.id}: recorded submission {nxt} (Slurm job {jobid})")
                return True, None
        claim = os.path.join(job.path, "claims", f"submission-{nxt}")
        age = self.clock() - os.stat(claim).st_mtime
        if age > STALE_CLAIM_SECONDS and job.claim(f"submission-{nxt}.stale"):
            job.append("submit-lost", submission=nxt,
                       note=f"claim {age:.0f} s old and no such job in Slurm; retrying")
            return False, f"submission-{nxt}.stale"
        return True, None  # another supervisor is submitting it right now

    def _ended(self, job: record.JobRecord, n: int, slurm_id: str, info: Optional[Job],
               report: PassReport, claim: Optional[str] = None) -> None:
        end = rules.END_STATES.get(_state(info), "failed")
        spec = job.spec
        budget_left = int(spec["resubmit"]) - (n - 1)
        shared = bool(spec["shared_checkpoint"])
        rule = rules.rule_for(end, shared, budget_left)
        action = rule.action
        if action == "slurm-requeue":
            action = "resubmit" if budget_left > 0 else "stop"  # Slurm did not requeue it
        if action == "stop":
            job.append("finished", submission=n, slurm_job_id=slurm_id, end_state=end,
                       rule=rule.text)
            report.actions.append(f"{job.id}: {end}: {rule.text}")
            return
        if action == "resubmit":
            done = self._submit(job, n, f"{end} (budget {budget_left})", [], report, claim)
            if done:
                report.actions.append(f"{job.id}: {end}: resubmitted as submission {n + 1} "
                                      f"(Slurm job {done.slurm_job_id})")
            return
        # action == "hold": the next submission is made, held, for a person or the signal.
        deadline = self.clock() + self.settings.hold_for
        restart = info.restarts if info is not None else 0
        until = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(deadline))
        comment = (f"--comment={submit.marker(job, n + 1)} held: shared checkpoint; {end} of "
                   f"job {slurm_id}; waits until its processes are proven gone or a person "
                   f"releases it; expires {until}")
        done = self._submit(job, n, f"{end}: held (shared checkpoint)", ["--hold", comment],
                            report, claim)
        if done:
            job.append("hold", submission=n + 1, slurm_job_id=done.slurm_job_id,
                       ended_slurm_job_id=slurm_id, ended_restart=restart, end_state=end,
                       deadline=round(deadline, 3), instead_of=rule.instead_of)
            report.actions.append(f"{job.id}: {end}: submission {n + 1} held as Slurm job "
                                  f"{done.slurm_job_id} until "
                                  f"{time.strftime('%H:%M:%S', time.localtime(deadline))}")

    def _submit(self, job: record.JobRecord, n: int, reason: str, extra: list[str],
                report: PassReport, claim: Optional[str]) -> Optional[submit.Submitted]:
        try:
            done = submit.resubmit(self.slurm, job, reason=reason, extra=extra,
                                   expected=n + 1, claim=claim)
        except RecordError as exc:
            report.errors.append(f"{job.id}: {exc}")
            return None
        except SlurmError as exc:
            report.errors.append(f"{job.id}: submission {n + 1} failed: {exc}")
            report.controller_calls += 1
            return None
        report.controller_calls += 1
        return done

    # -- holds ---------------------------------------------------------------------------
    def _hold(self, job: record.JobRecord, events: list[dict[str, Any]], hold: dict[str, Any],
              info: Optional[Job], report: PassReport) -> None:
        held_id = str(hold["slurm_job_id"])
        for kind in ("released", "expired"):
            done = _latest(events, kind)
            if done is not None and str(done["slurm_job_id"]) == held_id:
                return
        state = _state(info)
        if info is not None and not info.is_held:
            by = "a person (scontrol release)" if state else "unknown"
            job.append("released", slurm_job_id=held_id, by=by, slurm_state=state)
            report.actions.append(f"{job.id}: hold on Slurm job {held_id} lifted by {by}")
            return
        now = self.clock()
        if now >= float(hold["deadline"]):
            try:
                self.slurm.cancel([held_id])
                report.controller_calls += 1
            except SlurmError as exc:
                report.errors.append(f"{job.id}: cannot cancel expired hold {held_id}: {exc}")
                return
            job.append("expired", slurm_job_id=held_id, deadline=hold["deadline"])
            job.append("finished", submission=hold["submission"], slurm_job_id=held_id,
                       end_state="hold expired", rule="nothing more starts")
            report.actions.append(f"{job.id}: hold on Slurm job {held_id} expired; job ended")
            return
        if not self.settings.signal:
            return  # no CessationSignal at this site: the hold waits for a person
        asked = [e for e in events if e["event"] == "cessation"
                 and e.get("held_slurm_job_id") == held_id]
        if asked and now - float(asked[-1].get("asked_at", asked[-1]["time"])) < \
                self.settings.interval:
            return
        ended = str(hold["ended_slurm_job_id"])
        argv = [*shlex.split(self.settings.signal), ended, "--restart",
                str(hold.get("ended_restart", 0)), "--json"]
        answer = self.ask(argv, self.settings.signal_timeout)
        job.append("cessation", asked_at=round(now, 3), held_slurm_job_id=held_id,
                   ended_slurm_job_id=ended,
                   verdict=answer.verdict, code=answer.code, evidence=answer.evidence,
                   command=argv)
        report.actions.append(f"{job.id}: {self.settings.signal} {ended}: {answer.verdict}")
        if answer.verdict == "ceased":
            try:
                self.slurm.release([held_id])
                report.controller_calls += 1
            except SlurmError as exc:
                report.errors.append(f"{job.id}: cannot release {held_id}: {exc}")
                return
            job.append("released", slurm_job_id=held_id, by="cessation signal")
            report.actions.append(f"{job.id}: hold on Slurm job {held_id} lifted: ceased")


def release(slurm: Slurm, job: record.JobRecord) -> str:
    """A person lifts the standing hold of ``job``; returns the released Slurm job id."""
    events = job.events()
    hold = _latest(events, "hold")
    if hold is None:
        raise RecordError(f"dispatch job {job.id} has no hold to release")
    held_id = str(hold["slurm_job_id"])
    for kind in ("released", "expired"):
        done = _latest(events, kind)
        if done is not None and str(done["slurm_job_id"]) == held_id:
            raise RecordError(f"the hold on Slurm job {held_id} of {job.id} is already {kind}")
    slurm.release([held_id])
    job.append("released", slurm_job_id=held_id, by="a person (dispatch release)")
    return held_id
