"""Recovery rules: what happens after each end state, and how a shared checkpoint changes it.

Pure.  The rule table is the single source for the plan (printed before a job starts) and
the supervisor (which applies it), so what a user is shown is what is done.

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
  ``--quarantine-after`` executions all resumed from one save and failed before publishing
  anything, that save is quarantined, so the restart falls back past it
  (:func:`quarantine_rule`).
* Slurm's requeues (node failure, preemption) are not budgeted unless the job gives
  ``--max-requeues N``, apart from ``--resubmit``: past N of them in a lineage, the next
  requeued job is held for a person (:func:`requeues_spent`).
* By exit code, over a failure's rule (:func:`exit_rule`): a script's own exit status in
  ``--stop-on-exit`` stops the job (never restarted); one in ``--restart-on-exit`` restarts it
  without spending the resubmit budget (a shared job's restart is still a hold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

# The end state names rules speak of (slurm.jobs.END_STATES maps Slurm's states to them).
ORDER = ["node failure", "preempted", "failed", "timeout", "out of memory", "cancelled",
         "completed"]
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


@dataclass(frozen=True)
class Rule:
    end_state: str
    action: str  # "stop" | "slurm-requeue" | "resubmit" | "hold"; over them: "quarantine"
    text: str
    instead_of: Optional[str] = None  # for a hold: the rule it stands in for


def rules_for(shared: bool, budget: int, hold_for: str, signal: Optional[str],
              expedited: bool = False) -> list[Rule]:
    """The rule of each end; ``expedited``: the job was submitted ``--requeue=expedite``."""
    lifted = f"lifted by {signal}" if signal else "lifted by a person (no CessationSignal)"
    out = []
    for state in ORDER:
        if state in ("cancelled", "completed"):
            why = "a user's cancel is never undone" if state == "cancelled" else "done"
            out.append(Rule(state, "stop", f"stop ({why})"))
            continue
        if not shared and expedited and state in EXPEDITED:
            out.append(Rule(state, "slurm-requeue", EXPEDITED[state]))
            continue
        if not shared and state in SLURM_REQUEUES:
            out.append(Rule(state, "slurm-requeue", DELAYED))
            continue
        base = f"resubmit (budget {budget})" if budget > 0 else "stop (no resubmit budget)"
        if not shared:
            out.append(Rule(state, "resubmit" if budget > 0 else "stop", base))
            continue
        if budget <= 0:
            out.append(Rule(state, "stop", base))
            continue
        out.append(Rule(state, "hold", f"{base} -> hold for a person, up to {hold_for}; {lifted}",
                        instead_of="resubmit"))
    return out


def rule_for(state: str, shared: bool, budget: int, expedited: bool = False) -> Rule:
    for rule in rules_for(shared, budget, "", None, expedited):
        if rule.end_state == state:
            return rule
    return Rule(state, "stop", f"stop (unknown end state {state!r})")


def no_progress_rule(limit: int) -> Optional[Rule]:
    """The rule over every restart for ``--max-no-progress limit`` (None where 0: off)."""
    if limit <= 0:
        return None
    return Rule("no progress", "stop",
                f"after {limit} execution(s) in a row that published nothing past the save "
                "each resumed from: no more restarts (Slurm's requeued job held, an ended one "
                "not resubmitted) until a person's `dispatch release` or `dispatch resubmit`")


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
    return Rule("poisoned save", "quarantine",
                f"after {after} execution(s) in a row that resumed from one save and failed "
                "before publishing anything: that save is quarantined and the restart "
                "resumes from the publication below it, until `dispatch unquarantine`")


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


def exit_rule(end: str, status: Optional[int], stop: Sequence[int],
              free: Sequence[int]) -> Optional[Rule]:
    """The rule a failure's exit ``status`` (the script's own, None where it ended by a
    signal or is not known) gives over ``end``'s: ``stop`` for one of ``--stop-on-exit``,
    ``free-resubmit`` (restart, the budget not spent) for one of ``--restart-on-exit``; None
    where neither applies (the end state's rule stands)."""
    if end != "failed" or status is None:
        return None
    if status in stop:
        return Rule(end, "stop", f"stop (exit code {status}: --stop-on-exit)")
    if status in free:
        return Rule(end, "free-resubmit",
                    f"resubmit, {FREE} (exit code {status}: --restart-on-exit)")
    return None


def exit_codes_text(stop: Sequence[int], free: Sequence[int]) -> str:
    """The plan's line for the exit-code options."""
    if not stop and not free:
        return ("none named: a non-zero exit is 'failed' (--stop-on-exit, --restart-on-exit "
                "name codes)")
    said = []
    if stop:
        said.append(f"{codes_text(stop)}: stop, never restarted (--stop-on-exit)")
    if free:
        said.append(f"{codes_text(free)}: restarted without spending the resubmit budget "
                    "(--restart-on-exit)")
    return "; ".join(said)


def requeues_spent(used: int, budget: Optional[int]) -> bool:
    """Slurm has requeued the lineage ``used`` times, past ``--max-requeues`` (None:
    unbudgeted)."""
    return budget is not None and used > budget


def max_requeues_text(budget: Optional[int]) -> str:
    """The plan's line for ``--max-requeues``."""
    if budget is None:
        return ("Slurm's requeues (node failure, preemption) are not budgeted "
                "(--max-requeues N budgets them, apart from --resubmit)")
    return (f"budget {budget}, apart from --resubmit: past {budget} of Slurm's requeues "
            "(node failure, preemption), the requeued job is held for a person; `dispatch "
            "release` lets it run, once per requeue")
