"""Recovery rules: what happens after each end state, and how a shared checkpoint changes it.

Pure.  The rule table is the single source for the plan (printed before a job starts) and
the supervisor (which applies it), so what a user is shown is what is done.

* Isolated jobs keep Slurm's own requeue for node failure and preemption (raises R); the
  other failures are resubmitted by the supervisor while budget lasts (raises N).
* A shared-checkpoint job is submitted with ``--no-requeue`` (Slurm must not restart it behind
  dispatch's back), and every restart becomes a hold for a person, lifted early only by a
  ceased answer from the site's CessationSignal.
* A user's cancel and a completion are never undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# The end state names rules speak of (slurm.jobs.END_STATES maps Slurm's states to them).
ORDER = ["node failure", "preempted", "failed", "timeout", "out of memory", "cancelled",
         "completed"]
SLURM_REQUEUES = {"node failure", "preempted"}


@dataclass(frozen=True)
class Rule:
    end_state: str
    action: str  # "stop" | "slurm-requeue" | "resubmit" | "hold"
    text: str
    instead_of: Optional[str] = None  # for a hold: the rule it stands in for


def rules_for(shared: bool, budget: int, hold_for: str, signal: Optional[str]) -> list[Rule]:
    lifted = f"lifted by {signal}" if signal else "lifted by a person (no CessationSignal)"
    out = []
    for state in ORDER:
        if state in ("cancelled", "completed"):
            why = "a user's cancel is never undone" if state == "cancelled" else "done"
            out.append(Rule(state, "stop", f"stop ({why})"))
            continue
        if not shared and state in SLURM_REQUEUES:
            out.append(Rule(state, "slurm-requeue",
                            "Slurm requeues it (R+1); the replacement starts at once"))
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


def rule_for(state: str, shared: bool, budget: int) -> Rule:
    for rule in rules_for(shared, budget, "", None):
        if rule.end_state == state:
            return rule
    return Rule(state, "stop", f"stop (unknown end state {state!r})")
