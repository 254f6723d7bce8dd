"""The supervisor: one idempotent pass applies every dispatch job's recovery rules.

A pass reads the user's dispatch jobs and the user's own Slurm jobs (one ``squeue --me``
call), and for each dispatch job whose latest submission has ended applies the rule for its end
state (:mod:`.rules`).  An array job is as many lineages as it has tasks: rules,
budgets, submission numbers and holds are per task, and a failed task is resubmitted on its
own (``--array=<task>``, ``batch-<N>-t<task>.sh``), the other tasks untouched.  A submission
slurmctld has forgotten (MinJobAge) ended as Slurm's accounting says (``sacct``, where the site
keeps it) or as the controller hook's end record proves (a non-zero exit); one whose end
cannot be known is an error in every pass's report, never dropped.

* isolated jobs: Slurm's own requeue covers node failure and preemption (raises R); failures
  with budget left are resubmitted (raises N);
* by exit code (Slurm's, the script's own status): one of the job's ``--stop-on-exit`` codes
  stops it, one of its ``--restart-on-exit`` codes restarts it without spending the budget
  (:func:`.rules.exit_rule`), said in the submission's reason or the end's rule; an
  execution the stall watcher ended never restarts free (its status answers the watcher's
  signals: it spends the budget);
* shared-checkpoint jobs: the next submission is made *held* (a real Slurm hold: ``squeue``
  shows it with its deadline, ``scontrol release`` or ``dispatch release`` lifts it).  While the
  hold stands the site's CessationSignal is asked about the ended execution (that task's, for
  an array task's hold) in the pass that makes the hold, then every CessationInterval; each
  answer is recorded as a cessation fact; ceased answers for every one release the hold.  A
  hold that outlives SharedHoldFor is cancelled and recorded as expired: nothing more starts.
  The owner is told when a hold is made (unless the answer in that pass lifted it) and
  HoldWarning before it expires (Slurm's MailProg, and the site's HoldNotify command).
  The question itself (asking the signal, recording its answers, the held job's comments) is
  :mod:`.holds`'s, which ``dispatch release`` asks through too.
* a job Slurm itself requeued held after its launch failed (``launch failed requeued held``:
  a failed Prolog, a rejoining node that refused a second launch of a job it still ran) runs
  only once released; that hold is Slurm's, not ours, and Slurm's advice is the owner's
  ``scontrol release``: the pass releases an isolated job's, at most LAUNCH_RELEASES times a
  submission (then it is an error naming the nodes to look at).  A shared-checkpoint job's
  is left to a person (every restart of such a job is a person's), said in the report.

Invariants:

* A submission is made at most once.  Its claim (created once, holding what the pass means to
  do: the reason, and for a hold its deadline) comes before ``sbatch``.  A claim with no
  recorded submission is completed from evidence that the submission landed (a job of the
  user's own carrying its marker, or an execution that recorded a start), with the claim's
  hold; it is retried only when no ``sbatch`` can have landed unseen: the newest attempt is
  older than any ``sbatch`` in flight (SBATCH_SETTLE) and the oldest younger than MinJobAge
  (a landed job would still be known to slurmctld).  Otherwise the job is *stuck*: an error in
  every pass's report until a person settles it, never a silent skip.
* Only the user's own Slurm jobs are theirs: a job of another uid carrying our marker is
  ignored (comments are public).  And only a job carrying a submission's marker is that
  submission (:func:`.naming.is_submission`): job ids start again when slurmctld loses its
  state, so a plain ``sbatch`` job of the user's may have a recorded id; its end settles
  nothing, and neither does what ``sacct`` or the controller's end record says of that id
  (a forgotten submission's accounting job is judged by its submit time alone).
* A pass killed anywhere leaves a state the next pass completes.  An unreadable record is an
  error for that job only.  A pass costs one controller call plus one per action it takes
  (and, at a site with accounting, one ``sacct`` per submission slurmctld forgot).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from .. import _clock
from ..checkpoint import quarantine
from ..errors import DispatchError, RecordError, SlurmError
from ..slurm.adapter import Slurm
from ..slurm.jobs import LAUNCH_FAILED_HOLD, Job, Snapshot, end_name, exit_code_text
from . import (
    badnodes,
    dependency,
    events,
    heartbeat,
    holds,
    naming,
    noprogress,
    record,
    rules,
    sbatch_words,
    submit,
)
from .holds import SignalRunner, ask_signal
from .settings import Settings

# An sbatch in flight (the adapter's attempts, timeouts and waits) has answered by then.
SBATCH_SETTLE = 150.0
NOTIFY_TIMEOUT = 20.0
# Releases of Slurm's hold after a failed launch, per submission, before a person must look.
LAUNCH_RELEASES = 3
LAUNCH_RELEASED_BY = "dispatch supervise (Slurm held it after a failed launch)"


# (argv, text on stdin, timeout) -> (it worked, what it said)
Notifier = Callable[[list[str], str, float], tuple[bool, str]]


def run_notifier(argv: list[str], text: str, timeout: float) -> tuple[bool, str]:
    """Run a mailer or the site's HoldNotify; any failure is an answer, never an exception."""
    try:
        proc = subprocess.run(
            argv,
            input=text,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{argv[0]}: {exc}"
    said = (proc.stderr + proc.stdout).strip()[-500:]
    if proc.returncode != 0:
        return False, f"{argv[0]} exited {proc.returncode}" + (f": {said}" if said else "")
    return True, said


@dataclass
class PassReport:
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    controller_calls: int = 0


@dataclass
class PassState:
    """What one pass reads once and keeps until the next pass starts afresh: this cluster's
    records and Slurm's view of them (read at its start), which jobs wait for which (read
    when a resubmission first needs it), Slurm's MailProg and MinJobAge and whether the
    site keeps accounting (asked when first needed), and what the pass did and found wrong,
    its report (what :meth:`Supervisor.run_pass` returns)."""

    records: Optional[list[record.JobRecord]] = None
    slurm_jobs: Optional[Snapshot] = None
    waiting: Optional[dict[str, list[record.JobRecord]]] = None
    mail_prog: Optional[str] = None
    min_age: Optional[float] = None
    accounting: bool = True  # False once sacct said the site keeps no accounting
    report: PassReport = field(default_factory=PassReport)


def _stall_of(job: record.JobRecord, n: int, task: Optional[int]) -> Optional[events.Stalled]:
    """The stall the launcher's watcher recorded for submission ``n``'s last execution (the
    one that just ended), if any."""
    lineage = job.history().lineage(task)
    mine = [s for s in lineage.started if s.submission == n]
    if not mine:
        return None
    last = max(mine, key=lambda s: (s.epoch, s.ns))
    found = [
        e
        for e in job.history().of(events.Stalled)
        if e.submission == n and e.attempt == last.attempt
    ]
    return found[-1] if found else None


def exit_end(exit_code: Any) -> Optional[str]:
    """The Slurm state an end record's ``exit:signal`` code proves, if any.  Slurm 22.05
    gives the controller's EpilogSlurmctld no state name: a script that exited non-zero
    on its own (signal 0) is FAILED; ``0:0`` is a completion, a node failure or a cancel
    alike, and a signal is a cancel, a time limit or a preemption alike: not known."""
    status, _, signal = str(exit_code or "").partition(":")
    if status.isdigit() and int(status) != 0 and signal in ("", "0"):
        return "FAILED"
    return None


FactsReader = Callable[[str], Sequence[Mapping[str, Any]]]


def site_facts(slurm_job_id: str) -> Sequence[Mapping[str, Any]]:
    """What the site's hooks recorded about a Slurm job's executions (its StateDir)."""
    from ..node.executions import execution_facts

    return execution_facts(slurm_job_id)


class Supervisor:
    def __init__(
        self,
        slurm: Slurm,
        settings: Settings,
        home: Optional[str] = None,
        signal_runner: SignalRunner = ask_signal,
        clock: Callable[[], float] = time.time,
        notifier: Notifier = run_notifier,
        facts_reader: FactsReader = site_facts,
    ) -> None:
        self.slurm = slurm
        self.settings = settings
        self.home = home
        self.ask = signal_runner
        self.clock = clock
        self.notifier = notifier
        self.facts = facts_reader
        self.this_pass = PassState()
        self.every: Optional[float] = None  # a loop's interval, for the heartbeat

    @property
    def report(self) -> PassReport:
        """What the pass under way did and found wrong (its :class:`PassState`'s)."""
        return self.this_pass.report

    def run_pass(self) -> PassReport:
        self.this_pass = PassState()  # what a pass reads once, read again by the next
        report = self.this_pass.report
        # This cluster's jobs only: another cluster's, over the same home, are its own
        # supervisor's (their ids repeat here, and this controller knows none of them).
        jobs = record.cluster_jobs(self.slurm.cluster(), self.home)
        if self.slurm.cluster() is None:
            named = record.clusters(jobs, None)
            if named:
                # A configless site whose controller did not answer scontrol show config:
                # every cluster's records would look like this one's.
                raise SlurmError(
                    "cannot tell which cluster this is (no ClusterName in a "
                    "slurm.conf here, and scontrol show config did not answer), "
                    f"and this home holds jobs of cluster(s) {', '.join(named)}: "
                    "no pass until the controller says"
                )
        if not jobs:
            # A supervisor runs: dispatch-sbatch reads it.
            mark_pass(self.home, report, 0, self.slurm.cluster(), self.every)
            return report
        seen_at = time.time_ns()  # what was recorded later, Slurm was not asked about
        me = os.getuid()
        # Comments are public: a job of another uid carrying our marker is not ours.
        slurm_jobs = Snapshot(
            {
                k: j
                for k, j in self.slurm.own_jobs(sluids=naming.wants_sluids(jobs)).items()
                if j.uid == me
            }
        )
        report.controller_calls += 1
        self.this_pass.records, self.this_pass.slurm_jobs = jobs, slurm_jobs
        for job in jobs:
            try:
                self._job(job, slurm_jobs, seen_at)
            except DispatchError as exc:
                report.errors.append(f"{job.id}: {exc}")
            except Exception as exc:  # noqa: BLE001 - one job's failure is that job's
                report.errors.append(f"{job.id}: unexpected {type(exc).__name__}: {exc}")
        # One line each: Slurm's own words follow ours on the same line.
        report.errors[:] = [" ".join(error.split()) for error in report.errors]
        mark_pass(self.home, report, len(jobs), self.slurm.cluster(), self.every)
        return report

    # -- one job ---------------------------------------------------------------------------
    def _job(self, job: record.JobRecord, slurm_jobs: Snapshot, seen_at: int) -> None:
        history = job.history()
        whole = history.lineage()
        if whole.superseded is not None:
            self._superseded(job, whole.superseded, slurm_jobs, seen_at)
            return
        if whole.settled:
            return
        tasks = sbatch_words.array_tasks(job)
        if tasks is not None and history.settled_tasks(tasks):
            return
        # The whole job first: its claims (a person's resubmission) and its hold (a
        # superseding generation).  An array's tasks act only once it has neither, each
        # on its own: rules, budgets, submission numbers and holds are per task.
        if not self._lineage(job, history, None, tasks, slurm_jobs, seen_at):
            return
        for task in tasks or []:
            self._lineage(job, history, task, tasks, slurm_jobs, seen_at)

    def _lineage(
        self,
        job: record.JobRecord,
        history: events.History,
        task: Optional[int],
        tasks: Optional[list[int]],
        slurm_jobs: Snapshot,
        seen_at: int,
    ) -> bool:
        """Apply the rules to one lineage: the whole job (``task`` None) or one array task.
        For an array's whole job: True when its tasks may act."""
        line = history.lineage(task)
        if line.settled:
            return False
        current = line.current
        nxt = history.next_submission if task is None else line.next_submission
        busy, claim = self._recover_claim(job, line, nxt, task, slurm_jobs)
        if busy == "recovered":  # go on with the submission found
            return self._lineage(job, job.history(), task, tasks, slurm_jobs, seen_at)
        if busy or current is None:
            return False
        n = current.submission
        hold = line.hold_for(n)
        if hold is not None and hold.recovered:
            # A pass was killed between the held submission and its hold event.
            job.append(events.Hold, once=naming.once_key(n, hold.task), **_hold_fields(hold))
            self.report.actions.append(
                f"{job.id}: recorded the hold on {_what(n, hold.task)} "
                f"(Slurm job {hold.slurm_job_id}) from its submission"
            )
        if hold is not None and line.lifted(hold.slurm_job_id) is None:
            self._hold(job, line, hold, slurm_jobs)
            return False
        if task is None and tasks is not None:
            return True  # an array's ends are its tasks'
        # Only a job carrying this submission's marker is its own: ids repeat across clusters
        # and start again when slurmctld loses its state (a plain sbatch job may have it now).
        under_id = slurm_jobs.views(current.slurm_job_id, task)
        views = [v for v in under_id if naming.is_submission(job, current, v)]
        how = ""
        if not views:
            if current.ns >= seen_at:
                return False  # recorded after Slurm was read: seen by the next pass
            if under_id:
                # sacct and the controller's end record would give that job's end (the newest
                # of the id): nothing recorded by id alone is this submission's now.
                views, how = (
                    [],
                    (
                        f"Slurm job {_shown(current.slurm_job_id, task)} is now "
                        f"another job of yours (no {naming.marker(job, n, current.task)}"
                        " in its comment: job ids start again when slurmctld loses "
                        "its state), so neither Slurm's accounting nor the "
                        "controller's end record of that id is this submission's"
                    ),
                )
            else:
                views, how = self._recorded_end(job, line, current, task)
            if not views:
                self.report.errors.append(
                    f"{job.id}: {_what(n, task)} (Slurm job "
                    f"{_shown(current.slurm_job_id, task)}) is no longer known to slurmctld "
                    f"and {how}: nothing is decided for it until its end is known (look it "
                    f"up with `sacct -j {current.slurm_job_id}`; `dispatch resubmit {job.id}` "
                    "submits it again)"
                )
                return False
        if any(not v.is_final for v in views):
            self._requeued(job, line, current, views)
            self._failed_launches(job, line, current, views)
            return False  # running, pending, requeued: Slurm is not done with it
        self._ended(job, n, current.slurm_job_id, task, views, claim, how)
        return False

    def _superseded(
        self,
        job: record.JobRecord,
        superseded: events.Superseded,
        slurm_jobs: Snapshot,
        seen_at: int,
    ) -> None:
        """A superseded job's Slurm jobs stay cancelled.  slurmctld acknowledges a cancel
        before it saves it; killed in between, it recovers the job as running and may requeue
        and run it again (the soak saw it run twice more beside its successor).  Each active
        one is cancelled again, once per execution, and recorded; one still completing (its
        processes being killed) is left to end."""
        if superseded.ns >= seen_at:
            return  # superseded after Slurm was read: what the read shows predates the cancel
        # Only a job that carries this record's marker is its own: job ids restart when
        # slurmctld loses its state, and a job without one (plain sbatch) may be another job of
        # the user's that now has a recorded id.  The marker also finds a submission whose
        # sbatch landed after its pass was killed, never recorded (no pass recovers a
        # superseded job's claims, and --supersede cancelled only what was recorded).
        again = sorted(
            (
                (v.display_id, v)
                for v in slurm_jobs.jobs()
                if v.is_active and v.state != "COMPLETING" and v.marks(job.id)
            ),
            key=lambda found: found[0],
        )
        if not again:
            return
        ids = [slurm_id for slurm_id, _ in again]
        try:
            self.slurm.cancel(ids)
        except DispatchError as exc:
            self.report.errors.append(
                f"{job.id}: superseded by {superseded.by}, yet Slurm job(s) "
                f"{', '.join(ids)} active again; scancel failed: {exc}"
            )
            return
        said = "; ".join(
            f"{slurm_id} {view.state}, restart {view.restarts}" for slurm_id, view in again
        )
        once = "-".join(f"{slurm_id}r{view.restarts}" for slurm_id, view in again)
        if len(once) > 120:  # an array's many tasks: the key is a file's name, kept short
            import hashlib

            once = hashlib.sha256(once.encode()).hexdigest()[:32]
        once = "again-" + once
        job.append(events.Superseded, once=once, by=superseded.by, cancelled=ids, again=said)
        self.report.actions.append(
            f"{job.id}: cancelled Slurm job {', '.join(ids)} again: "
            f"superseded by {superseded.by}, it was active again ({said}) "
            "after its cancel (a controller that restarted before it saved "
            "the cancel)"
        )

    def _failed_launches(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        current: events.Submitted,
        views: list[Job],
    ) -> None:
        """Release what Slurm held after a failed launch (see the module docstring)."""
        for view in views:
            if not view.held_after_failed_launch:
                continue
            shown = view.display_id
            said = f"Slurm holds job {shown} after a failed launch ({LAUNCH_FAILED_HOLD})"
            if job.spec["shared_checkpoint"]:
                self.report.errors.append(
                    f"{job.id}: {said}; "
                    + _launch_held_shared(
                        job,
                        current.submission,
                        view.array_task_id if view.array_task_id is not None else line.task,
                        shown,
                    )
                )
                continue
            done = [
                e
                for e in line.ends
                if isinstance(e, events.Released)
                and e.slurm_job_id == current.slurm_job_id
                and e.by == LAUNCH_RELEASED_BY
            ]
            if len(done) >= LAUNCH_RELEASES:
                self.report.errors.append(
                    f"{job.id}: {said} again, after {len(done)} releases by dispatch, "
                    "so dispatch leaves it to you now; look at the nodes it was sent to "
                    f"(`sinfo -R`), then `scontrol release {shown}`"
                )
                continue
            self.slurm.release([shown])
            self.report.controller_calls += 1
            job.append(
                events.Released,
                once=f"launch-{shown}-{view.restarts}",
                slurm_job_id=current.slurm_job_id,
                by=LAUNCH_RELEASED_BY,
                task=line.task,
            )
            self.report.actions.append(
                f"{job.id}: lifted Slurm's hold on job {shown}, made after "
                f"a failed launch ({LAUNCH_FAILED_HOLD}, restart "
                f"{view.restarts})"
            )

    def _requeued(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        current: events.Submitted,
        views: list[Job],
    ) -> None:
        """Slurm's requeued job, pending again: its bad nodes kept off, then the rule table's
        decision (:func:`rules.after_requeue`) applied: held past --max-requeues or for want
        of progress (--max-no-progress), our hold lifted after a late save, or left."""
        again = [
            v for v in views if v.is_pending and v.restarts > 0 and not v.held_after_failed_launch
        ]
        if len(again) != 1:
            return
        view = again[0]
        self._avoid_requeued(job, line, current.submission, view)
        budget = job.spec.get("max_requeues")
        if not isinstance(budget, int) or isinstance(budget, bool):
            budget = None
        spent_before = budget is not None and any(
            e.slurm_job_id == view.display_id and e.restarts == view.restarts
            for e in line.requeues_spent
        )
        facts = rules.Requeued(
            held=view.is_held,
            budget=budget,
            used=0
            if budget is None or spent_before
            else noprogress.requeues_used(job, line, current.submission, view.restarts, budget),
            spent_before=spent_before,
            limit=noprogress.limit_of(job),
        )
        decision = rules.after_requeue(facts)
        found = noprogress.Finding()
        if decision.reads_progress:
            found = noprogress.finding(job, line)
            facts = replace(
                facts,
                progress_read=True,
                late_save=self._late_save(job, line, view),
                without_progress=found.stop,
                progress_unknown=found.unknown,
            )
            decision = rules.after_requeue(facts)
        if decision.unknown:
            self.report.errors.append(f"{job.id}: {decision.unknown}")
        if decision.action is rules.OnRequeue.RELEASE:
            self._release_late(job, line, view)
        elif decision.action is rules.OnRequeue.HOLD and decision.requeues_spent:
            self._hold_spent(job, line, current, view, facts, decision.hold_now)
        elif decision.action is rules.OnRequeue.HOLD:
            self._hold_no_progress(job, line, current, view, found, decision.hold_now)

    @staticmethod
    def _late_save(job: record.JobRecord, line: events.Lineage, view: Job) -> Optional[bool]:
        """None where no hold of ours for want of progress stands on ``view``; else whether
        an execution it counted has published past its source since (a node cut off
        publishes after Slurm requeued its job); not knowing is no proof of progress."""
        stop = line.stopped
        if (
            stop is None
            or stop.action != "held"
            or stop.slurm_job_id != view.display_id
            or view.reason != "JobHeldUser"
        ):
            return None
        try:
            return noprogress.streak(job, line, stop.limit) is None
        except DispatchError:
            return False

    def _release_late(self, job: record.JobRecord, line: events.Lineage, view: Job) -> None:
        """Lift our hold of ``view`` for want of progress: a late save showed progress."""
        stop = line.stopped
        assert stop is not None  # rules.after_requeue releases only a standing hold
        try:
            self.slurm.release([view.display_id])
        except SlurmError as exc:
            self.report.errors.append(
                f"{job.id}: an execution held for want of progress has "
                f"published since, but Slurm job {view.display_id} could "
                f"not be released: {exc}"
            )
            return
        self.report.controller_calls += 1
        job.append(
            events.Released,
            slurm_job_id=stop.slurm_job_id,
            task=stop.task,
            by="dispatch supervise: progress published since its no-progress hold",
        )
        self.report.actions.append(
            f"{job.id}: lifted the hold on Slurm job {view.display_id} made for want of "
            f"progress: an execution it counted ({rules.runs_text(stop.executions)}) "
            "has published past the save it resumed from since (a late save)"
        )

    def _hold_spent(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        current: events.Submitted,
        view: Job,
        facts: rules.Requeued,
        hold_now: bool,
    ) -> None:
        """Hold Slurm's requeued job past its --max-requeues and record it, once per requeue
        (a person's release lets it run); a refused hold records nothing."""
        budget = facts.budget
        if hold_now and not self._held(
            job, view.display_id, f"its --max-requeues {budget} is spent"
        ):
            return
        job.append(
            events.RequeuesSpent,
            once=f"requeues-{view.display_id}-{view.restarts}".replace("_", "t"),
            submission=current.submission,
            slurm_job_id=view.display_id,
            restarts=view.restarts,
            used=facts.used,
            budget=budget,
            task=line.task,
        )
        self.report.actions.append(
            f"{job.id}: Slurm requeued it {facts.used} time(s), past its "
            f"--max-requeues {budget}: Slurm job {view.display_id} is "
            f"held; `dispatch release {job.id}` lets it run"
        )

    # -- bad nodes (--avoid-bad-nodes) ----------------------------------------------------
    def _bad_nodes(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        limit: int,
        current_end: Optional[tuple[int, str]] = None,
        pending: bool = False,
    ) -> list[str]:
        """The lineage's bad nodes: those recorded, then those found now (each recorded
        once: a node-avoided event, said in the pass)."""

        def lost(names: list[str]) -> list[str]:
            try:
                found = self.slurm.nodes(names)
            except SlurmError as exc:
                self.report.errors.append(
                    f"{job.id}: cannot read the state of node(s) {', '.join(names)}: {exc}"
                )
                return []
            finally:
                self.report.controller_calls += 1
            return [name for name in names if name in found and found[name].lost]

        known = [e.node for e in line.avoided]
        ended = badnodes.ends(line, self.facts, lost, current_end, pending)
        for bad in badnodes.bad_nodes(ended, limit):
            if bad.node in known:
                continue
            key = f"avoid-{'' if line.task is None else f't{line.task}-'}{bad.node}"
            made = job.append(
                events.NodeAvoided,
                once=key.replace("/", "_"),
                node=bad.node,
                why=bad.why,
                task=line.task,
                executions=[[e.submission, e.restart, e.slurm_job_id] for e in bad.executions],
            )
            known.append(bad.node)
            if made is not None:
                self.report.actions.append(
                    f"{job.id}: avoids node {bad.text()} (--avoid-bad-nodes)"
                )
        return known

    def _placed(
        self,
        job: record.JobRecord,
        slurm_id: str,
        line: events.Lineage,
        nodes: list[str],
    ) -> Optional[badnodes.Exclusion]:
        """What keeping ``nodes`` off Slurm job ``slurm_id`` comes to, as it is placed (or
        as the lineage's last exclusion recorded it, for a job slurmctld forgot: the
        supervisor down past MinJobAge) and its partitions are; or None, said."""
        try:
            avoid, why, calls = badnodes.placed(self.slurm, slurm_id, line, nodes)
            self.report.controller_calls += calls
            if avoid is not None:
                return avoid
        except SlurmError as exc:
            self.report.controller_calls += 1
            why = str(exc)
        self.report.errors.append(
            f"{job.id}: cannot read where Slurm job {slurm_id} may run, so "
            f"its bad node(s) {', '.join(nodes)} are not kept off: {why}"
        )
        return None

    def _avoid_next(
        self,
        job: record.JobRecord,
        n: int,
        slurm_id: str,
        task: Optional[int],
        end: str,
    ) -> Optional[badnodes.Exclusion]:
        """For the submission after ``n`` (ended ``end``): what its --exclude is, or None
        with nothing to keep off."""
        limit = badnodes.limit_of(job.spec)
        if limit <= 0:
            return None
        line = job.history().lineage(task)
        bad = self._bad_nodes(job, line, limit, (n, end))
        return self._placed(job, _shown(slurm_id, task), line, bad) if bad else None

    def _excluded(
        self,
        job: record.JobRecord,
        done: submit.SubmissionMade,
        task: Optional[int],
        avoid: badnodes.Exclusion,
        refused: list[str],
    ) -> None:
        """Record what the submission ``done`` kept off; ``refused``: Slurm's words where
        it refused the submission with our exclusions, which was then made without them."""
        event = badnodes.record(
            job,
            "resubmission",
            done.slurm_job_id,
            done.submission,
            0,
            task,
            avoid,
            refused[0] if refused else "",
        )
        if event is not None:
            self.report.actions.append(f"{job.id}: {badnodes.excluded_text(event)}")

    def _avoid_requeued(
        self, job: record.JobRecord, line: events.Lineage, n: int, view: Job
    ) -> None:
        """Keep the lineage's bad nodes off Slurm's requeued pending job (ExcNodeList,
        merged with what it has), once per requeue."""
        limit = badnodes.limit_of(job.spec)
        done = [
            e
            for e in line.excluded
            if e.how == "requeued"
            and e.slurm_job_id == view.display_id
            and e.restarts == view.restarts
        ]
        if done:
            if done[-1].nodes and view.reason == badnodes.CANNOT_RUN:
                self._put_back(job, line, view, done[-1])
            return
        if limit <= 0:
            return
        bad = self._bad_nodes(job, line, limit, pending=True)
        avoid = self._placed(job, view.display_id, line, bad) if bad else None
        if avoid is None:
            return
        if avoid.ours:
            try:
                self.slurm.set_excluded(view.display_id, avoid.given)
            except SlurmError as exc:
                self.report.errors.append(
                    f"{job.id}: cannot keep node(s) "
                    f"{', '.join(avoid.ours)} off the requeued Slurm job "
                    f"{view.display_id}: {exc}"
                )
                return
            finally:
                self.report.controller_calls += 1
        event = badnodes.record(
            job,
            "requeued",
            view.display_id,
            n,
            view.restarts,
            line.task,
            avoid,
            once=f"excluded-{view.display_id}-r{view.restarts}",
        )
        if event is not None:
            self.report.actions.append(f"{job.id}: {badnodes.excluded_text(event)}")

    def _put_back(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        view: Job,
        done: events.NodesExcluded,
    ) -> None:
        """Slurm cannot run the requeued job with the bad nodes ``done`` kept off (it pends
        BadConstraints: what else it asks for only they have): its list without them, once."""
        back: list[str] = []
        try:
            placement = self.slurm.placement(view.display_id)
            if placement is not None:
                self.report.controller_calls += 1
                back = [n for n in placement.excluded if n not in done.nodes]
                self.slurm.set_excluded(view.display_id, back)
        except SlurmError as exc:
            self.report.errors.append(
                f"{job.id}: cannot put node(s) {', '.join(done.nodes)} back "
                f"for the requeued Slurm job {view.display_id}, which "
                f"pends {badnodes.CANNOT_RUN} without them: {exc}"
            )
            return
        finally:
            self.report.controller_calls += 1
        if placement is None:
            return
        event = job.append(
            events.NodesExcluded,
            once=f"excluded-{view.display_id}-r{view.restarts}-back",
            slurm_job_id=view.display_id,
            how="requeued",
            submission=done.submission,
            restarts=view.restarts,
            nodes=[],
            refused=done.nodes,
            refusal=f"it pended {badnodes.CANNOT_RUN}: no node it can run on",
            node_count=done.node_count,
            given=back,
            partitions=done.partitions,
            asked=done.asked,
            task=line.task,
        )
        if isinstance(event, events.NodesExcluded):
            self.report.actions.append(f"{job.id}: {badnodes.excluded_text(event)}")

    def _held(self, job: record.JobRecord, slurm_id: str, why: str) -> bool:
        """Hold Slurm's requeued job ``slurm_id`` (counted); False, the refusal reported with
        ``why`` it was asked, when Slurm refused it."""
        try:
            self.slurm.hold([slurm_id])
        except SlurmError as exc:
            self.report.errors.append(
                f"{job.id}: {why}, but Slurm job {slurm_id} could not be held: {exc}"
            )
            return False
        self.report.controller_calls += 1
        return True

    def _hold_no_progress(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        current: events.Submitted,
        view: Job,
        found: noprogress.Finding,
        hold_now: bool,
    ) -> None:
        """Hold Slurm's requeued job for want of progress (``found``) and record the stop:
        held first, so a pass killed before the record finds it held and records it; a
        refused hold records nothing."""
        stop = found.stop
        assert stop is not None  # rules.after_requeue holds only for a stop found now
        if hold_now and not self._held(
            job, view.display_id, f"its last {stop.limit} executions made no progress"
        ):
            return
        made = job.append(
            events.NoProgress,
            once=found.key,
            submission=current.submission,
            slurm_job_id=view.display_id,
            limit=stop.limit,
            action="held",
            end_state="requeued by Slurm",
            task=line.task,
            executions=stop.executions,
            resumed_from=stop.resumed_from,
        )
        if isinstance(made, events.NoProgress):  # not where the launcher recorded it first
            self.report.actions.append(f"{job.id}: {noprogress.stop_text(made, job.id)}")

    def _quarantine(self, job: record.JobRecord, line: events.Lineage, n: int, end: str) -> None:
        """Quarantine the save the lineage's last executions all resumed from and failed
        before publishing anything (--quarantine-after), once per last execution, so the
        restart about to be made falls back past it."""
        limit = noprogress.limit_of(job, "quarantine_after")
        newest = max(line.started, key=lambda s: (s.epoch, s.ns), default=None)
        if (
            limit <= 0
            or newest is None
            or any(
                e.executions and e.executions[-1][2:3] == [newest.attempt] for e in line.quarantined
            )
        ):
            return
        root = noprogress.root_of(job, line.task)
        try:
            found = noprogress.poisoned(job, line, limit, n)
            if found is None:
                return
            if not quarantine.fallback(root, found.resumed_from[0]):
                # Past the last save a fresh start: a person's choice, never made here.
                self.report.actions.append(f"{job.id}: " + noprogress.kept_text(found, root))
                return
            quarantine.mark(root, found.resumed_from[0])
        except DispatchError as exc:
            self.report.errors.append(
                f"{job.id}: cannot tell or mark whether the save its last "
                f"{limit} executions resumed from made them fail, so it is "
                f"restarted from it as before: {exc}"
            )
            return
        event = job.append(
            events.Quarantined,
            once=f"quarantined-{newest.attempt}",
            save=found.resumed_from[0],
            root=root,
            end_state=end,
            task=line.task,
            **{"executions": found.fields()["executions"]},
        )
        if isinstance(event, events.Quarantined):
            self.report.actions.append(
                f"{job.id}: quarantined {noprogress.quarantine_text(event, root)}"
            )

    def _recorded_end(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        current: events.Submitted,
        task: Optional[int],
    ) -> tuple[list[Job], str]:
        """How a submission slurmctld has forgotten (MinJobAge) ended, from what is
        recorded: Slurm's accounting where the site keeps it, else the controller hook's end
        record.  Returns (its views, where the end was read), or ([], why it is not known)."""
        slurm_id = current.slurm_job_id
        started = line.started_for(current.submission)
        restart = max((s.restart for s in started), default=0)
        if self.this_pass.accounting:
            try:
                found = self.slurm.accounting(slurm_id)
            except SlurmError as exc:
                found = None
                self.report.errors.append(f"{job.id}: cannot read Slurm's accounting: {exc}")
            self.report.controller_calls += 1
            if found is None:
                self.this_pass.accounting = False  # no accounting at this site: not asked again
            else:
                views = [
                    j
                    for j in found
                    if j.uid in (-1, os.getuid())
                    and (
                        j.job_id == slurm_id
                        if task is None
                        else j.array_job_id == slurm_id and j.array_task_id == task
                    )
                ]
                if any(not naming.accounted_as(current, v, restart > 0) for v in views):
                    return [], (
                        f"Slurm's accounting has a job {_shown(slurm_id, task)} "
                        "submitted after this submission was recorded (job ids start "
                        "again when slurmctld loses its state): another job, not this "
                        "submission, so neither it nor the controller's end record of "
                        "that id decides anything"
                    )
                if views and all(v.is_final for v in views):
                    for view in views:
                        view.restarts = restart
                    return views, "Slurm's accounting (sacct)"
        own = started[-1].slurm_job_id if started else (slurm_id if task is None else "")
        if not own:
            return [], "none of its executions recorded a start, so no end record is found"
        try:
            executions = self.facts(own)
        except Exception as exc:  # noqa: BLE001 - a site without readable facts says so
            return [], f"the controller's end record cannot be read ({exc})"
        end = executions[-1].get("end") if executions else None
        if not end:
            return [], (
                f"no end of Slurm job {own} is recorded by the site's hooks, nor by "
                "Slurm's accounting"
            )
        code = end.get("exit_code")
        state = exit_end(code)
        if state is None:
            return [], (
                f"the end record of Slurm job {own} (exit {code}) does not say how it "
                "ended (0:0 is a completion, a node failure or a cancel alike)"
            )
        view = Job(
            own,
            state,
            array_job_id=slurm_id if task is not None else None,
            array_task_id=task,
            restarts=int(executions[-1].get("restart") or 0),
            exit_code=exit_code_text(code),
        )
        return [view], f"the controller's end record (exit {code})"

    def _recover_claim(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        nxt: int,
        task: Optional[int],
        slurm_jobs: Snapshot,
    ) -> tuple[str, Optional[str]]:
        """Claims for submission ``nxt`` with no submission recorded: complete, retry or
        report them.  Returns ("recovered" | "busy" | "", the claim a retry must make)."""
        name = naming.claim_name(nxt, task)
        claims = job.claims(name)
        if not claims:
            return "", None
        meant = claims[-1][1]
        wanted = naming.marker(job, nxt, task)
        landed = slurm_jobs.marked(wanted)
        if landed:
            first = landed[0]
            self._recovered(
                job, nxt, task, first.array_job_id or first.job_id, meant, "found in Slurm"
            )
            return "recovered", None
        started = line.started_for(nxt)
        if started:
            self._recovered(
                job,
                nxt,
                task,
                started[0].array_job_id or started[0].slurm_job_id,
                meant,
                "its execution recorded a start",
            )
            return "recovered", None
        now = self.clock()
        newest, oldest = meant["time"], claims[0][1]["time"]
        if now - newest < SBATCH_SETTLE:
            return "busy", None  # an sbatch may be in flight (another supervisor, or ours)
        min_age = self._min_job_age()
        if now - oldest >= min_age:
            folder = os.path.join(job.path, "claims")
            self.report.errors.append(
                f"{job.id}: STUCK: {_what(nxt, task)} was claimed {now - oldest:.0f} s ago "
                f"({len(claims)} attempt(s)); no job of yours carries {wanted} and none "
                "recorded a start, but one may have run and aged out of slurmctld "
                f"(MinJobAge {min_age:g} s), so it is not submitted again. "
                f"Check `sacct -X -o JobID,State,Comment%60 | grep {wanted}`; if none ran, "
                f"remove {folder}/{name}* and the next pass submits it"
            )
            return "busy", None
        # No attempt can have landed unseen: it would still be known to slurmctld.
        return "", f"{name}.retry-{len(claims)}"

    def _recovered(
        self,
        job: record.JobRecord,
        nxt: int,
        task: Optional[int],
        slurm_id: str,
        meant: dict[str, Any],
        how: str,
    ) -> None:
        hold = meant.get("hold")
        if job.append(
            events.Submitted,
            once=naming.once_key(nxt, task),
            submission=nxt,
            slurm_job_id=slurm_id,
            reason=str(meant.get("reason", "recovered")),
            recovered=True,
            hold=hold,
            task=task,
        ):
            self.report.actions.append(
                f"{job.id}: recorded {_what(nxt, task)} (Slurm job {_shown(slurm_id, task)}): {how}"
            )

    def _ended(
        self,
        job: record.JobRecord,
        n: int,
        slurm_id: str,
        task: Optional[int],
        views: list[Job],
        claim: Optional[str],
        how: str = "",
    ) -> None:
        stalled = _stall_of(job, n, task)
        spec = job.spec
        line = job.history().lineage(task)
        found = noprogress.finding(job, line)
        decision = rules.decide(
            rules.Facts(
                ends=[(end_name(v.state), v.exit_status) for v in views],
                shared=bool(spec["shared_checkpoint"]),
                expedited=sbatch_words.expedited_requeue(job),
                resubmit=int(spec["resubmit"]),
                submission=n,
                reasons=[s.reason for s in line.submissions if s.submission <= n],
                stop_on_exit=spec.get("stop_on_exit") or [],
                restart_on_exit=spec.get("restart_on_exit") or [],
                stalled=stalled is not None,
                without_progress=found.stop,
                progress_unknown=found.unknown,
            )
        )
        end, rule, action, spent = decision.end, decision.rule, decision.action, decision.spent
        who = f"{job.id}" + ("" if task is None else f" task {task}")
        seen = f" (known from {how})" if how else ""
        if stalled is not None:
            seen = f" ({stalled.reason})" + seen
        if decision.quarantines:
            self._quarantine(job, job.history().lineage(task), n, end)
        if decision.unknown:
            self.report.errors.append(f"{job.id}: {decision.unknown}")
        if decision.no_progress and found.key and found.stop is not None:
            job.append(
                events.NoProgress,
                once=found.key,
                submission=n,
                slurm_job_id=slurm_id,
                limit=found.stop.limit,
                action="not resubmitted",
                end_state=end,
                task=task,
                executions=found.stop.executions,
                resumed_from=found.stop.resumed_from,
            )
        avoid = (
            self._avoid_next(job, n, slurm_id, task, end)
            if action in (rules.Action.RESUBMIT, rules.Action.HOLD)
            else None
        )
        words = [f"--exclude={','.join(avoid.given)}"] if avoid and avoid.given else []
        refused: list[str] = []  # Slurm's words, where it refused the job with them
        if action == rules.Action.STOP:
            said = [v.state for v in views if end_name(v.state) == end]
            job.append(
                events.Finished,
                submission=n,
                slurm_job_id=slurm_id,
                end_state=end,
                rule=rule.text + (f" ({stalled.reason})" if stalled else ""),
                task=task,
                slurm_state=said[0] if said else "",
            )
            self.report.actions.append(f"{who}: {end}{seen}: {rule.text}")
            return
        if action == rules.Action.RESUBMIT:
            done = self._submit(
                job,
                n,
                f"{end} ({spent}){seen}",
                words,
                None,
                claim,
                task,
                plain=[] if avoid and avoid.ours else None,
                refused=refused,
            )
            if done and avoid:
                self._excluded(job, done, task, avoid, refused)
            if done:
                unspent = "" if spent.startswith("budget") else f" ({spent}: --restart-on-exit)"
                self.report.actions.append(
                    f"{who}: {end}{seen}: resubmitted as submission {n + 1} "
                    f"(Slurm job {_shown(done.slurm_job_id, task)}){unspent}"
                )
            return
        # action is HOLD: the next submission is made, held, for a person or the signal.
        deadline = round(self.clock() + self.settings.hold_for, 3)
        array = task is None and (len(views) > 1 or views[0].array_task_id is not None)
        ended = views[0].display_id if task is not None else slurm_id
        intent = events.HoldIntent(
            deadline=deadline,
            ended_slurm_job_id=ended,
            ended_restart=0 if array else views[0].restarts,
            end_state=end,
            instead_of=rule.instead_of,
            ended_tasks=[[v.display_id, v.restarts] for v in views] if array else [],
        )
        comment = holds.hold_comment(job, n + 1, task, f"{end} of job {ended}", deadline)
        shown = "" if spent.startswith("budget") else f" ({spent})"
        done = self._submit(
            job,
            n,
            f"{end}{shown}: held (shared checkpoint){seen}",
            ["--hold", comment, *words],
            intent.as_dict(),
            claim,
            task,
            plain=["--hold", comment] if avoid and avoid.ours else None,
            refused=refused,
        )
        if done and avoid:
            self._excluded(job, done, task, avoid, refused)
        if done:
            hold = job.append(
                events.Hold,
                once=naming.once_key(n + 1, task),
                submission=n + 1,
                slurm_job_id=done.slurm_job_id,
                task=task,
                **intent.as_dict(),
            )
            self.report.actions.append(
                f"{who}: {end}{seen}: submission {n + 1} held as Slurm job "
                f"{_shown(done.slurm_job_id, task)} until "
                f"{_clock.with_zone(deadline)}"
            )
            if isinstance(hold, events.Hold):
                if self.settings.signal:
                    # Asked at once: an execution already proven gone (its node's Epilog ran
                    # before this pass) is not held a whole pass longer.
                    self._ask_signal(job, job.history().lineage(task), hold, task, self.clock())
                if job.history().lineage(task).lifted(hold.slurm_job_id) is None:
                    # Told only of a hold that stands: one lifted at once has nothing to do.
                    self._tell(job, hold, "made")

    def _submit(
        self,
        job: record.JobRecord,
        n: int,
        reason: str,
        extra: list[str],
        hold: Optional[dict[str, Any]],
        claim: Optional[str],
        task: Optional[int] = None,
        plain: Optional[list[str]] = None,
        refused: Optional[list[str]] = None,
    ) -> Optional[submit.SubmissionMade]:
        """Submission ``n + 1`` with ``extra``; where sbatch refuses it (Slurm's
        'Batch job submission failed: ...', nothing submitted) and ``plain`` is given (the
        words without the bad nodes kept off), made again with ``plain``, Slurm's words put
        in ``refused``."""
        from .interpreter import problem

        why = problem(job)
        if why is not None:
            # It would fail at once, in the batch shell: no submission, no budget spent.
            self.report.errors.append(
                f"{job.id}: submission {n + 1} not made, nothing of its "
                f"budget spent ({reason}): {why}"
            )
            return None
        name = claim or naming.claim_name(n + 1, task)
        # The claim holds what this pass means to do, before sbatch: a pass killed after
        # sbatch leaves the next one everything it needs (the hold and its deadline).
        if not job.claim(
            name,
            {"submission": n + 1, "reason": reason, "hold": hold, "task": task},
            now=self.clock(),
        ):
            return None  # another supervisor made this claim first: it submits
        try:
            try:
                done = submit.resubmit(
                    self.slurm,
                    job,
                    reason=reason,
                    extra=extra,
                    expected=n + 1,
                    claim=name,
                    hold=hold,
                    task=task,
                )
            except SlurmError as exc:
                said = badnodes.refusal(exc)
                if plain is None or said is None:
                    raise
                self.report.controller_calls += 1
                if refused is not None:
                    refused.append(said)
                done = submit.resubmit(
                    self.slurm,
                    job,
                    reason=reason,
                    extra=plain,
                    expected=n + 1,
                    claim=name,
                    hold=hold,
                    task=task,
                )
        except RecordError as exc:
            self.report.errors.append(f"{job.id}: {exc}")
            return None
        except SlurmError as exc:
            self.report.errors.append(f"{job.id}: submission {n + 1} failed: {exc}")
            self.report.controller_calls += 1
            return None
        self.report.controller_calls += 1
        self._follow(job, done)
        return done

    def _follow(self, job: record.JobRecord, done: submit.SubmissionMade) -> None:
        """Jobs that wait for ``job`` (``--dependency=afterok:<its id>``) now wait for its new
        submission; a failure to tell one is reported, never stops the pass."""
        try:
            now = self.this_pass
            if now.waiting is None:
                now.waiting = dependency.dependents(now.records or record.all_jobs(self.home))
            waiting = now.waiting.get(job.id, [])
            if not waiting:
                return
            seen = now.slurm_jobs
            moved = dependency.follow(
                self.slurm,
                job,
                done.slurm_job_id,
                self.home,
                jobs=seen.keyed if seen is not None else None,
                waiting=waiting,
            )
        except (DispatchError, OSError) as exc:
            self.report.errors.append(
                f"{job.id}: could not move its dependents to Slurm job {done.slurm_job_id}: {exc}"
            )
            return
        self.report.errors.extend(f"{job.id}: {refused}" for refused in moved.refused)
        self.report.controller_calls += len(moved.updated)
        for slurm_id in moved.updated:
            self.report.actions.append(
                f"{job.id}: Slurm job {slurm_id} now waits for its "
                f"submission {done.submission} (Slurm job "
                f"{done.slurm_job_id})"
            )

    # -- holds ---------------------------------------------------------------------------
    def _hold(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        hold: events.Hold,
        slurm_jobs: Snapshot,
    ) -> None:
        held_id, task = hold.slurm_job_id, line.task
        held = slurm_jobs.views(held_id, task)
        made = line.submission(hold.submission)
        if made is not None:
            held = [v for v in held if naming.is_submission(job, made, v)]
        moved = [v for v in held if not v.is_held]
        if moved:
            state = moved[0].state
            by = (
                f"Slurm: {state} while held" if moved[0].is_final else "a person (scontrol release)"
            )
            job.append(events.Released, slurm_job_id=held_id, by=by, slurm_state=state, task=task)
            self.report.actions.append(
                f"{job.id}: hold on Slurm job {_shown(held_id, task)} lifted by {by}"
            )
            return
        if not held:
            self.report.errors.append(
                f"{job.id}: the held Slurm job {held_id} is no longer known "
                "to slurmctld; the hold stands until it expires "
                f"{_clock.with_zone(hold.deadline)}"
            )
        now = self.clock()
        if now >= hold.deadline:
            self._expire(job, hold, task, bool(held))
            return
        if now >= hold.deadline - self.settings.warn_before:
            self._tell(job, hold, "expiring")
        if not self.settings.signal or not held:
            # No CessationSignal at this site: the hold waits for a person.  A held job the
            # controller forgot cannot be released: asking about it would only fail again.
            return
        self._ask_signal(job, line, hold, task, now)

    def _ask_signal(
        self,
        job: record.JobRecord,
        line: events.Lineage,
        hold: events.Hold,
        task: Optional[int],
        now: float,
    ) -> None:
        """Ask the CessationSignal about the execution a hold waits for (again once
        CessationInterval has passed since the last answer), and lift the hold on a ceased
        answer."""
        held_id = hold.slurm_job_id
        answers = line.answers_for(held_id)
        if answers and now - answers[-1].asked < self.settings.interval:
            return
        signal = self.settings.signal
        if not signal:
            return  # no CessationSignal at this site: the hold waits for a person

        def heard(one: holds.Asked) -> None:
            reason = holds.why(one.answer)
            self.report.actions.append(
                f"{job.id}: {signal} {one.target}: {one.answer.verdict}"
                + (f" ({reason})" if reason else "")
            )

        if holds.ceased(
            holds.ask(
                job, hold, signal, self.settings.signal_timeout, self.ask, lambda: now, task, heard
            )
        ):
            try:
                self.slurm.release([held_id])
                self.report.controller_calls += 1
            except SlurmError as exc:
                self.report.errors.append(
                    f"{job.id}: cannot release Slurm job {held_id} (the hold stands): {exc}"
                )
                return
            job.append(events.Released, slurm_job_id=held_id, by="cessation signal", task=task)
            holds.mark_released(self.slurm, job, hold, "(ceased)")
            self.report.actions.append(
                f"{job.id}: hold on Slurm job {_shown(held_id, task)} lifted: ceased"
            )

    def _expire(
        self,
        job: record.JobRecord,
        hold: events.Hold,
        task: Optional[int],
        known: bool,
    ) -> None:
        if known:
            try:
                self.slurm.cancel([hold.slurm_job_id])
                self.report.controller_calls += 1
            except SlurmError as exc:
                self.report.errors.append(
                    f"{job.id}: cannot cancel expired hold {hold.slurm_job_id}: {exc}"
                )
                return
        job.append(
            events.Expired, slurm_job_id=hold.slurm_job_id, deadline=hold.deadline, task=task
        )
        job.append(
            events.Finished,
            submission=hold.submission,
            slurm_job_id=hold.slurm_job_id,
            end_state="hold expired",
            rule="nothing more starts",
            task=task,
        )
        self.report.actions.append(
            f"{job.id}: hold on Slurm job {hold.slurm_job_id} expired; job ended"
        )

    # -- telling people ------------------------------------------------------------------
    def _tell(self, job: record.JobRecord, hold: events.Hold, about: str) -> None:
        """Tell the job's owner about a hold, once per channel; best effort: a failure is
        recorded and reported, never retried in a loop, never blocks the pass."""
        told = {
            e.channel
            for e in job.history().of(events.Notified)
            if e.slurm_job_id == hold.slurm_job_id and e.about == about
        }
        spec = job.spec
        user = str(spec.get("user") or os.getuid())
        to = _mail_user(spec) or user
        subject = (
            f"slurm-dispatch {job.id}: submission {hold.submission} held (Slurm job "
            f"{hold.slurm_job_id}) until {_clock.with_zone(hold.deadline)}"
        )
        if about == "expiring":
            subject = (
                f"slurm-dispatch {job.id}: the hold on Slurm job {hold.slurm_job_id} "
                f"expires {_clock.with_zone(hold.deadline)}"
            )
        body = (
            f"{subject}\n\nAfter {hold.end_state} of Slurm job {hold.ended_slurm_job_id} "
            f"the next submission of dispatch job {job.id} ({spec.get('script_name')}) "
            "waits until the ended execution's processes are proven gone, or a person "
            f"releases it (`dispatch release {job.id}`).  Unreleased, it is cancelled at "
            f"{_clock.with_zone(hold.deadline)} and the job ends.\n"
            f"`dispatch status {job.id}` shows the evidence.\n"
        )
        channels: list[tuple[str, list[str]]] = []
        if self.settings.mail and "mail" not in told:
            mail_prog = self._mailer()
            if mail_prog:
                channels.append(("mail", [mail_prog, "-s", subject, to]))
        if self.settings.notify and "site" not in told:
            channels.append(
                (
                    "site",
                    [
                        *shlex.split(self.settings.notify),
                        about,
                        job.id,
                        hold.slurm_job_id,
                        _clock.for_program(hold.deadline),
                        user,
                        to,
                    ],
                )
            )
        for channel, argv in channels:
            ok, said = self.notifier(argv, body, NOTIFY_TIMEOUT)
            job.append(
                events.Notified,
                slurm_job_id=hold.slurm_job_id,
                about=about,
                channel=channel,
                ok=ok,
                detail=said,
                task=hold.task,
            )
            if not ok:
                self.report.errors.append(
                    f"{job.id}: could not tell {to} about the hold on Slurm "
                    f"job {hold.slurm_job_id} ({channel}): {said}"
                )

    def _min_job_age(self) -> float:
        """MinJobAge: the settings', else the controller's (read once a pass), else 300 s,
        Slurm's default; an unreadable value counts as 0 (no retry is ever proven safe)."""
        if self.settings.min_job_age is not None:
            return self.settings.min_job_age
        now = self.this_pass
        if now.min_age is None:
            try:
                value = self.slurm.config_value("MinJobAge") or "300 sec"
                now.min_age = float(value.split()[0])
            except (SlurmError, ValueError) as exc:
                self.report.errors.append(f"cannot read Slurm's MinJobAge: {exc}")
                now.min_age = 0.0
            self.report.controller_calls += 1
        return now.min_age

    def _mailer(self) -> Optional[str]:
        """Slurm's MailProg (``scontrol show config``), read once a pass, when first needed."""
        now = self.this_pass
        if now.mail_prog is None:
            try:
                now.mail_prog = self.slurm.config_value("MailProg") or ""
            except SlurmError as exc:
                self.report.errors.append(f"cannot read Slurm's MailProg: {exc}")
                now.mail_prog = ""
            self.report.controller_calls += 1
        return now.mail_prog or None


def _what(submission: int, task: Optional[int]) -> str:
    return f"submission {submission}" + ("" if task is None else f" of task {task}")


def _shown(slurm_id: str, task: Optional[int]) -> str:
    """A Slurm job id as squeue shows it: ``97_1`` for one task of array 97."""
    return slurm_id if task is None or "_" in slurm_id else f"{slurm_id}_{task}"


def _hold_fields(hold: events.Hold) -> dict[str, Any]:
    return {k: v for k, v in hold.fields().items() if k not in ("event", "time", "ns", "v")}


def _mail_user(spec: dict[str, Any]) -> Optional[str]:
    """The job's --mail-user, from its command line or its #SBATCH lines, if given."""
    words = list(spec.get("sbatch", []))
    for line in spec.get("header", []):
        words.extend(
            shlex.split(line.partition("#SBATCH")[2], comments=True)
            if line.lstrip().startswith("#SBATCH")
            else []
        )
    found = None
    for i, word in enumerate(words):
        if word.startswith("--mail-user="):
            found = word.split("=", 1)[1]
        elif word == "--mail-user" and i + 1 < len(words):
            found = words[i + 1]
    return found or None


PASS_FILE = heartbeat.PASS_FILE


def mark_pass(
    home: Optional[str],
    report: PassReport,
    jobs: int,
    cluster: Optional[str] = None,
    every: Optional[float] = None,
) -> None:
    """Say when a supervisor last passed over the user's jobs (:mod:`heartbeat`:
    ``dispatch status`` shows it, and ``dispatch-sbatch`` warns when none has passed lately:
    resubmissions and holds happen only while one runs)."""
    heartbeat.good(home, cluster, jobs, len(report.actions), len(report.errors), every)


def mark_failure(
    home: Optional[str], cause: str, cluster: Optional[str] = None, every: Optional[float] = None
) -> dict[str, Any]:
    """Say that a pass failed as a whole (:func:`heartbeat.failed`)."""
    return heartbeat.failed(home, cluster, cause, every)


def last_pass(
    home: Optional[str] = None, cluster: Optional[str] = None
) -> Optional[dict[str, Any]]:
    """What the last pass left (:func:`heartbeat.read`), or None."""
    return heartbeat.read(home, cluster)


def retry_pause(failures: int, interval: float) -> float:
    """Seconds before the next pass after ``failures`` failed ones in a row: an eighth of the
    interval (at least 1 s), doubling, never more than the interval."""
    first = max(1.0, interval / 8)
    return min(interval, first * 2 ** min(max(failures - 1, 0), 30))


def _launch_held_shared(
    job: record.JobRecord, submission: int, task: Optional[int], shown: str
) -> str:
    """What a person does about Slurm's hold after a failed launch of a shared job: a release
    once its last execution stopped, unless the submission already ran (the node that refused
    the launch was still running it: "Duplicate jobid"), whose relaunch the launcher refuses
    (a submission of a shared job runs its script once): then a cancel, and a resubmission
    once the site's signal proves the first execution gone.  A recorded start of the
    submission counts as its claim, as the launcher has it (an execution of the release
    before the claim recorded a start and no claim)."""
    claims = job.claims(naming.execution_claim_name(submission, task))
    started = job.history().lineage(task).started_for(submission) if not claims else []
    if not claims and not started:
        return (
            "it is a shared-checkpoint job, so dispatch leaves it to a person: once its "
            f"last execution has stopped, `scontrol release {shown}`"
        )
    first = (
        claims[0][1]
        if claims
        else {"node": started[0].node or started[0].host, "restart": started[0].restart}
    )
    return (
        f"it is a shared-checkpoint job whose submission {submission} already ran on "
        f"{first.get('node') or '?'} (restart {first.get('restart', '?')}), and a "
        "relaunch of it would stop before its script (a submission of a shared job runs "
        f"once), so dispatch leaves it to a person: `scancel {shown}`, then, once "
        f"`dispatch-cease {shown}` answers ceased, `dispatch resubmit "
        + ("" if task is None else f"--task {task} ")
        + f"{job.id}`"
    )
