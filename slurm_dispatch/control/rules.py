"""Recovery rules: what happens after each end state, and how a shared checkpoint changes it.

Pure.  The rule table is the single source for the plan (printed before a job starts) and
the supervisor (which applies it), so what a user is shown is what is done.  After an
execution ended, the supervisor gathers what it read (:class:`Facts`: the views' ends and exit
statuses, the stall, the budget's inputs, the stop for want of progress it found) and
:func:`decide` returns the whole :class:`Decision`, which the supervisor applies and never
revises: a new rule is this module, its test and the user guide's table
(``docs/architecture.md``, "Adding a resubmit rule").  So with Slurm's requeued job, pending
again: the supervisor gathers :class:`Requeued` and :func:`after_requeue` returns the whole
:class:`RequeueDecision` (hold it, lift our hold, or leave it).

* Isolated jobs keep Slurm's own requeue for node failure and preemption (raises R); the
  other failures are resubmitted by the supervisor while budget lasts (raises N).  Slurm's
  requeued job may start again only after the requeue delay (``requeue_delay`` in
  SlurmctldParameters from 25.11, AuthInfo's ``cred_expire`` before; 120 s by default).
* A job submitted ``--requeue=expedite`` (25.11, where SlurmctldParameters has
  ``enable_expedited_requeue``) is requeued by Slurm with no delay: after a node failure it is
  EXPEDITING, first in the queue; after preemption it is eligible at once; and a non-zero exit
  is Slurm's requeue too, EXPEDITING while its Epilog runs, then held (REQUEUE_HOLD) until
  someone runs ``scontrol release`` unless an Epilog failed on one of its nodes (then it starts
  again at once).  A job Slurm requeues is not ended, so dispatch does not resubmit it.
* A shared-checkpoint job is submitted with ``--no-requeue`` (Slurm must not restart it behind
  dispatch's back), and every restart becomes a hold for a person, lifted early only by a
  ceased answer from the site's CessationSignal.
* A user's cancel and a completion are never undone.
* Over every restart (Slurm's requeue, a resubmission, a hold standing in for one): after
  ``--max-no-progress`` executions in a row that published nothing past the save each resumed
  from (:func:`stalled`), the job is restarted no more and waits for a person: Slurm's
  requeued job is held (``scontrol hold``), an ended one is not resubmitted.
* Before a restart after a failure (:data:`POISON_ENDS`): when the last
  ``--quarantine-after`` executions all resumed from one save and each failed (not requeued,
  not a time limit, not a restart ``--restart-on-exit`` made free) before publishing
  anything, that save is quarantined, so the restart falls back past it
  (:func:`quarantine_rule`).
* Slurm's requeues (node failure, preemption) are not budgeted unless the job gives
  ``--max-requeues N``, apart from ``--resubmit``: past N of them in a lineage, the next
  requeued job is held for a person (:func:`requeues_spent`).  The job's own requeue at its
  warning signal (an integration's, marked in its execution's folder) is not counted.
* A stalled execution (``--stall-timeout``, default the site's ``StallTimeout``, off): one
  whose progress record stopped for that long, not counting time inside a save, is asked to
  save and ended by the launcher's watcher (:mod:`slurm_dispatch.execution.stall`); its end is
  a failure whatever its exit status, and the failure's rule applies (:func:`stall_text`).
* By exit code, over a failure's rule (:func:`exit_rule`): a script's own exit status in
  ``--stop-on-exit`` stops the job (never restarted); one in ``--restart-on-exit`` restarts it
  without spending the resubmit budget (a shared job's restart is still a hold).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Optional, Sequence

# The end state names rules speak of (slurm.jobs.END_STATES maps Slurm's states to them).
ORDER = [
    "node failure",
    "preempted",
    "failed",
    "timeout",
    "out of memory",
    "cancelled",
    "completed",
]
SLURM_REQUEUES = {"node failure", "preempted"}
# Ends that may be a save's doing (--quarantine-after): not a requeue, a time limit or a cancel.
POISON_ENDS = {"failed", "out of memory"}
# Where --requeue=expedite makes an end Slurm's requeue, and what Slurm then does.
DELAYED = "Slurm requeues it (R+1); it may start again after the requeue delay (120 s by default)"
EXPEDITED = {
    "node failure": "Slurm requeues it (R+1), EXPEDITING: it starts again at once, first in the "
    "queue (--requeue=expedite)",
    "preempted": "Slurm requeues it (R+1), eligible again at once (--requeue=expedite)",
    "failed": "Slurm requeues it (R+1; --requeue=expedite): held (REQUEUE_HOLD) until "
    "`scontrol release`, or started again at once if an Epilog failed on its nodes; "
    "no resubmission",
}


class Action(Enum):
    """What a rule does.  After an execution ended the supervisor applies STOP, RESUBMIT or
    HOLD (:func:`decide` turns the others into one of them); QUARANTINE comes before a
    restart, over the rest."""

    STOP = "stop"
    SLURM_REQUEUE = "slurm-requeue"  # Slurm requeues it; where it did not, decide() resubmits
    RESUBMIT = "resubmit"
    HOLD = "hold"  # the next submission, held for a person or the site's signal
    FREE_RESUBMIT = "free-resubmit"  # --restart-on-exit: a restart that spends no budget
    QUARANTINE = "quarantine"


@dataclass(frozen=True)
class Rule:
    end_state: str
    action: Action
    text: str
    instead_of: Optional[str] = None  # for a hold: the rule it stands in for


def rules_for(
    shared: bool, budget: int, hold_for: str, signal: Optional[str], expedited: bool = False
) -> list[Rule]:
    """The rule of each end; ``expedited``: the job was submitted ``--requeue=expedite``."""
    lifted = f"lifted by {signal}" if signal else "lifted by a person (no CessationSignal)"
    out = []
    for state in ORDER:
        if state in ("cancelled", "completed"):
            why = "a user's cancel is never undone" if state == "cancelled" else "done"
            out.append(Rule(state, Action.STOP, f"stop ({why})"))
            continue
        if not shared and expedited and state in EXPEDITED:
            out.append(Rule(state, Action.SLURM_REQUEUE, EXPEDITED[state]))
            continue
        if not shared and state in SLURM_REQUEUES:
            out.append(Rule(state, Action.SLURM_REQUEUE, DELAYED))
            continue
        base = f"resubmit (budget {budget})" if budget > 0 else "stop (no resubmit budget)"
        if not shared:
            out.append(Rule(state, Action.RESUBMIT if budget > 0 else Action.STOP, base))
            continue
        if budget <= 0:
            out.append(Rule(state, Action.STOP, base))
            continue
        out.append(
            Rule(
                state,
                Action.HOLD,
                f"{base} -> hold for a person, up to {hold_for}; {lifted}",
                instead_of="resubmit",
            )
        )
    return out


def rule_for(state: str, shared: bool, budget: int, expedited: bool = False) -> Rule:
    for rule in rules_for(shared, budget, "", None, expedited):
        if rule.end_state == state:
            return rule
    return Rule(state, Action.STOP, f"stop (unknown end state {state!r})")


def no_progress_rule(limit: int) -> Optional[Rule]:
    """The rule over every restart for ``--max-no-progress limit`` (None where 0: off)."""
    if limit <= 0:
        return None
    return Rule(
        "no progress",
        Action.STOP,
        f"after {limit} execution(s) in a row that published nothing past the save "
        "each resumed from: no more restarts (Slurm's requeued job held, an ended one "
        "not resubmitted) until a person's `dispatch release` or `dispatch resubmit`",
    )


def stalled(progress: Sequence[bool], limit: int) -> bool:
    """``progress``: whether each execution of a lineage, oldest first, published past the
    save it resumed from.  True when the last ``limit`` of them (at least that many) made
    none; never where ``limit`` is 0."""
    return limit > 0 and len(progress) >= limit and not any(progress[-limit:])


def quarantine_rule(after: int) -> Optional[Rule]:
    """The rule before a restart after a failure, for ``--quarantine-after after`` (None
    where 0: off)."""
    if after <= 0:
        return None
    return Rule(
        "poisoned save",
        Action.QUARANTINE,
        f"after {after} execution(s) in a row that resumed from one save and failed "
        "before publishing anything: that save is quarantined and the restart "
        "resumes from the publication below it, until `dispatch unquarantine` (the "
        "last save there is stays: past it a fresh start, a person's choice)",
    )


FREE = "budget not spent"  # in the reason of a restart that --restart-on-exit made


def codes_text(codes: Sequence[int]) -> str:
    """``3, 5-7`` for [3, 5, 6, 7]."""
    spans: list[list[int]] = []
    for code in sorted(codes):
        if spans and code == spans[-1][1] + 1:
            spans[-1][1] = code
        else:
            spans.append([code, code])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def exit_rule(
    end: str, status: Optional[int], stop: Sequence[int], free: Sequence[int]
) -> Optional[Rule]:
    """The rule a failure's exit ``status`` (the script's own, None where it ended by a
    signal or is not known) gives over ``end``'s: ``stop`` for one of ``--stop-on-exit``,
    ``free-resubmit`` (restart, the budget not spent) for one of ``--restart-on-exit``; None
    where neither applies (the end state's rule stands)."""
    if end != "failed" or status is None:
        return None
    if status in stop:
        return Rule(end, Action.STOP, f"stop (exit code {status}: --stop-on-exit)")
    if status in free:
        return Rule(
            end, Action.FREE_RESUBMIT, f"resubmit, {FREE} (exit code {status}: --restart-on-exit)"
        )
    return None


def end_of(end: str, stalled: bool) -> str:
    """The end a rule is chosen by: an execution ended for want of progress (``stalled``) was
    never done, whatever it exited with."""
    return "failed" if stalled and end == "completed" else end


def first_end(
    ends: Sequence[tuple[str, Optional[int]]], stalled: bool
) -> tuple[str, Optional[int]]:
    """The end a rule is chosen by, of ``ends`` (each ended view's end and the script's own
    exit status; an array's tasks, or the one job): the first in rule order (a failed task
    outranks completed ones; an end the rules do not name first of all), as :func:`end_of`
    has it; and the exit status the views of that end give, where one and only one."""
    names = [name for name, _ in ends]
    end = end_of(min(names, key=lambda e: ORDER.index(e) if e in ORDER else -1), stalled)
    found = {status for name, status in ends if name == end}
    return end, found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class WithoutProgress:
    """A lineage's last executions that published nothing past the save each resumed from
    (``--max-no-progress``), as the supervisor found them: ``executions`` [submission,
    restart, attempt] each, oldest first, ``resumed_from`` the saves they started from ('' a
    fresh start), the job's ``limit``, and the job and task a person names to go on;
    ``recorded``: the words of the stop already recorded for the newest of them ('' where
    found now, to be recorded with this decision)."""

    executions: list[list[object]]
    resumed_from: list[str]
    limit: int
    job_id: str = ""
    task: Optional[int] = None
    recorded: str = ""


@dataclass(frozen=True)
class Facts:
    """What the supervisor read of a lineage's submission ``submission`` whose execution (an
    array's tasks) ended: everything the decision is made by, gathered before anything is
    done.  ``ends``: each ended view's end (:data:`ORDER`'s names) and the script's own exit
    status (None for a signal or not known); the budget as ``--resubmit`` and the reasons of
    the lineage's submissions up to this one; ``stalled``: the launcher's watcher ended it for
    want of progress (``--stall-timeout``); ``without_progress``: its stop for want of
    progress, found before the restart (``--max-no-progress``), and ``progress_unknown`` why
    that could not be told ('' where it could)."""

    ends: Sequence[tuple[str, Optional[int]]]
    shared: bool = False
    expedited: bool = False
    resubmit: int = 0
    submission: int = 1
    reasons: Sequence[str] = ()
    stop_on_exit: Sequence[int] = ()
    restart_on_exit: Sequence[int] = ()
    stalled: bool = False
    without_progress: Optional[WithoutProgress] = None
    progress_unknown: str = ""


@dataclass(frozen=True)
class Decision:
    """What happens after a lineage's execution ended, whole: the end it was chosen by, the
    rule (its action and its words), what a restart spends (``budget N``, or ``exit S, budget
    not spent``), whether the save the executions failed from is looked at first
    (``quarantines``), whether the stop is for want of progress (``no_progress``: recorded
    with it) and, where that could not be told, why (``unknown``: said; restarted as
    before)."""

    rule: Rule
    spent: str
    end: str = ""
    quarantines: bool = False
    no_progress: bool = False
    unknown: str = ""

    @property
    def action(self) -> Action:
        return self.rule.action

    @property
    def free(self) -> bool:
        """A restart --restart-on-exit made: nothing of the budget spent."""
        return not self.spent.startswith("budget")

    @property
    def restarts(self) -> bool:
        """The lineage goes on: a resubmission, held or not."""
        return self.action in (Action.RESUBMIT, Action.HOLD)


def budget_left(budget: int, n: int, reasons: Sequence[str]) -> int:
    """Resubmissions left of ``budget`` once a lineage's submission ``n`` ended, its
    submissions up to ``n`` made for ``reasons``: restarts --restart-on-exit made spend
    nothing."""
    free = sum(1 for reason in reasons if FREE in reason)
    return budget - (n - 1) + free


def decide(ended: Facts) -> Decision:
    """The decision after an execution of a lineage ended (:func:`first_end`): the end's
    rule, over it the exit codes' (a stalled execution's status answers the watcher's
    signals, not the script's verdict: a stall never restarts free, as each hang restarting
    free went on for ever), and, the execution having ended, an end Slurm would have requeued
    (it did not) resubmitted as any other, within the budget.  A restart --restart-on-exit
    made is a resubmission, held for a shared checkpoint, that spends nothing.  Before a
    restart after a failure that may be a save's doing (:data:`POISON_ENDS`, not a free
    restart: a transient error, the script says) the save the executions failed from is
    looked at (--quarantine-after); then the stop for want of progress, where found, stops the
    restart."""
    end, status = first_end(ended.ends, ended.stalled)
    left = budget_left(ended.resubmit, ended.submission, ended.reasons)
    decision = _by_rule(ended, end, status, left)
    if not decision.restarts:
        return decision
    decision = replace(
        decision,
        quarantines=end in POISON_ENDS and not decision.free,
        unknown=ended.progress_unknown,
    )
    stop = ended.without_progress
    if stop is None:
        return decision
    why = stop.recorded or no_progress_text(
        stop.executions,
        stop.resumed_from,
        stop.limit,
        "not resubmitted",
        end,
        task=stop.task,
        job_id=stop.job_id,
    )
    return replace(decision, rule=Rule(end, Action.STOP, "stop: " + why), no_progress=True)


def _by_rule(ended: Facts, end: str, status: Optional[int], left: int) -> Decision:
    """The end's rule and the exit codes' over it (see :func:`decide`)."""
    rule = rule_for(end, ended.shared, left, ended.expedited)
    free = [] if ended.stalled else ended.restart_on_exit
    by_code = exit_rule(end, status, ended.stop_on_exit, free)
    if by_code is not None:
        rule = by_code
    if rule.action == Action.SLURM_REQUEUE:  # Slurm did not requeue it
        rule = replace(rule, action=Action.RESUBMIT if left > 0 else Action.STOP)
    if rule.action == Action.FREE_RESUBMIT:
        return Decision(
            Rule(
                end,
                Action.HOLD if ended.shared else Action.RESUBMIT,
                rule.text,
                instead_of="resubmit",
            ),
            f"exit {status}, {FREE}",
            end,
        )
    return Decision(rule, f"budget {left}", end)


class OnRequeue(Enum):
    """What is done with Slurm's requeued job, pending again (:func:`after_requeue`)."""

    LEAVE = "leave"  # it starts when Slurm starts it, or a stop made before stands
    HOLD = "hold"  # held for a person: past --max-requeues, or for want of progress
    RELEASE = "release"  # our hold for want of progress lifted: a late save showed progress


@dataclass(frozen=True)
class Requeued:
    """What the supervisor read of Slurm's requeued job of a lineage, pending again:
    ``held`` (by anyone, already); the budget's inputs (``--max-requeues`` ``budget``, None
    where unbudgeted; the requeues ``used``; ``spent_before``: held past the budget for this
    requeue before, so a person's release goes on) and ``--max-no-progress``'s ``limit``;
    then, where :func:`after_requeue` asks for them (``progress_read``), the stop for want of
    progress: ``late_save``, None where no hold of ours for want of progress stands on the
    job, else whether an execution it counted has published past its source since;
    ``without_progress`` the stop found now or recorded before, and ``progress_unknown`` why
    that could not be told ('' where it could)."""

    held: bool = False
    budget: Optional[int] = None
    used: int = 0
    spent_before: bool = False
    limit: int = 0
    progress_read: bool = False
    late_save: Optional[bool] = None
    without_progress: Optional[WithoutProgress] = None
    progress_unknown: str = ""


@dataclass(frozen=True)
class RequeueDecision:
    """What happens to Slurm's requeued job, whole: the action; for a hold, whose it is
    (``requeues_spent``: the budget's, else for want of progress) and whether Slurm is asked
    (``hold_now``: not where the job is held already); ``unknown``, said, where progress
    could not be told; ``reads_progress``: nothing decided yet, the stop for want of progress
    is to be read and the facts decided again."""

    action: OnRequeue = OnRequeue.LEAVE
    requeues_spent: bool = False
    hold_now: bool = False
    unknown: str = ""
    reads_progress: bool = False


def after_requeue(found: Requeued) -> RequeueDecision:
    """The decision on Slurm's requeued job, pending again: past ``--max-requeues`` it is
    held for a person once per requeue (:func:`requeues_spent`; released by a person, that
    requeue is not stopped again, for want of progress either); else, after
    ``--max-no-progress`` executions without progress (:func:`stalled`), it is held, and our
    hold is lifted once a late save shows progress.  Not knowing is no proof of a loop: a
    root that cannot be listed leaves the job as it is (said), and our hold stands."""
    if found.budget is not None:
        if found.spent_before:
            return RequeueDecision()
        if requeues_spent(found.used, found.budget):
            return RequeueDecision(OnRequeue.HOLD, requeues_spent=True, hold_now=not found.held)
    if found.limit <= 0:
        return RequeueDecision()
    if not found.progress_read:
        return RequeueDecision(reads_progress=True)
    if found.late_save is not None:
        return RequeueDecision(OnRequeue.RELEASE if found.late_save else OnRequeue.LEAVE)
    if found.progress_unknown:
        return RequeueDecision(unknown=found.progress_unknown)
    stop = found.without_progress
    if stop is None or stop.recorded:
        return RequeueDecision()
    return RequeueDecision(OnRequeue.HOLD, hold_now=not found.held)


def runs_text(executions: Sequence[object]) -> str:
    """``S1 R0, S2 R0`` for [submission, restart, attempt] lists."""
    return ", ".join(
        f"S{e[0]} R{e[1]}" if isinstance(e, list) and len(e) > 1 else str(e) for e in executions
    )


def no_progress_text(
    executions: Sequence[object],
    resumed_from: Sequence[str],
    limit: int,
    action: str,
    end: str,
    slurm_job_id: str = "",
    task: Optional[int] = None,
    job_id: str = "",
) -> str:
    """One line for a person about a stop for want of progress: which executions, from which
    save, and what was done (``held``: Slurm's requeued job ``slurm_job_id``; else not
    resubmitted after ``end``); with ``job_id``, the command that goes on."""
    saves = " or ".join(s or "nothing (a fresh start)" for s in resumed_from) or "?"
    if action == "held":
        done = f"Slurm job {slurm_job_id} is held"
        go_on = f": `dispatch release {job_id}` lets it run again"
    else:
        done = f"not resubmitted after {end or 'its end'}"
        on = "" if task is None else f"--task {task} "
        go_on = f": `dispatch resubmit {on}{job_id}` submits it again"
    return (
        f"{len(executions)} execution(s) in a row ({runs_text(executions)}) published nothing "
        f"past the save they resumed from, {saves} (--max-no-progress {limit}); {done}"
        + (go_on if job_id else "")
    )


def exit_codes_text(stop: Sequence[int], free: Sequence[int]) -> str:
    """The plan's line for the exit-code options."""
    if not stop and not free:
        return (
            "none named: a non-zero exit is 'failed' (--stop-on-exit, --restart-on-exit name codes)"
        )
    said = []
    if stop:
        said.append(f"{codes_text(stop)}: stop, never restarted (--stop-on-exit)")
    if free:
        said.append(
            f"{codes_text(free)}: restarted without spending the resubmit budget "
            "(--restart-on-exit)"
        )
    return "; ".join(said)


def requeues_spent(used: int, budget: Optional[int]) -> bool:
    """Slurm has requeued the lineage ``used`` times, past ``--max-requeues`` (None:
    unbudgeted)."""
    return budget is not None and used > budget


def max_requeues_text(budget: Optional[int]) -> str:
    """The plan's line for ``--max-requeues``."""
    if budget is None:
        return (
            "Slurm's requeues (node failure, preemption) are not budgeted "
            "(--max-requeues N budgets them, apart from --resubmit)"
        )
    return (
        f"budget {budget}, apart from --resubmit: past {budget} of Slurm's requeues "
        "(node failure, preemption), the requeued job is held for a person; `dispatch "
        "release` lets it run, once per requeue"
    )


def stall_text(timeout: int, source: str, warn: Optional[tuple[str, int]]) -> str:
    """The plan's line for ``--stall-timeout``."""
    if timeout <= 0:
        return (
            "not watched (--stall-timeout TIME: an execution without progress that long "
            "is asked to save and ended; default off, the site's StallTimeout)"
        )
    signal, grace = (warn[0], warn[1]) if warn else ("USR1", 60)
    return (
        f"an execution whose progress stops for {timeout} s (from its first progress "
        f"record; never inside a save) is sent SIG{signal}, given {grace} s to save, then "
        f"ended: it counts as failed, whose rule applies (--stall-timeout {timeout}, from "
        f"{source})"
    )
