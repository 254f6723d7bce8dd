"""The rule table's whole decision after an execution ended (rules.decide): the end's rule,
the exit codes over it, the budget, and an end Slurm would have requeued but did not.  The
supervisor applies it (test_supervisor, test_exit_codes, test_max_requeues pin what it then
does); these rows pin the decision itself, one per case the supervisor once worked out.  So
do REQUEUED_ROWS for Slurm's requeued job, pending again (rules.after_requeue: the budget of
--max-requeues, the stop for want of progress, our hold lifted after a late save)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest

from slurm_dispatch.control import rules
from slurm_dispatch.slurm.jobs import Job, end_name

FREE = rules.FREE
A = rules.Action

# end, shared, budget left, expedited, status, stop codes, restart codes, stalled (what
# ended() gathers) -> action, spent, the rule's text (its start), instead_of
ROWS = [
    ("completed", False, 2, False, 0, [], [], False, A.STOP, "budget 2", "stop (done)", None),
    (
        "cancelled",
        False,
        2,
        False,
        None,
        [],
        [],
        False,
        A.STOP,
        "budget 2",
        "stop (a user's cancel",
        None,
    ),
    (
        "failed",
        False,
        2,
        False,
        1,
        [],
        [],
        False,
        A.RESUBMIT,
        "budget 2",
        "resubmit (budget 2)",
        None,
    ),
    (
        "failed",
        False,
        0,
        False,
        1,
        [],
        [],
        False,
        A.STOP,
        "budget 0",
        "stop (no resubmit budget)",
        None,
    ),
    (
        "failed",
        True,
        1,
        False,
        1,
        [],
        [],
        False,
        A.HOLD,
        "budget 1",
        "resubmit (budget 1) -> hold",
        "resubmit",
    ),
    (
        "failed",
        True,
        0,
        False,
        1,
        [],
        [],
        False,
        A.STOP,
        "budget 0",
        "stop (no resubmit budget)",
        None,
    ),
    # Slurm would have requeued it, but the execution ended: resubmitted within the budget.
    (
        "node failure",
        False,
        1,
        False,
        None,
        [],
        [],
        False,
        A.RESUBMIT,
        "budget 1",
        "Slurm requeues it (R+1)",
        None,
    ),
    (
        "preempted",
        False,
        0,
        False,
        None,
        [],
        [],
        False,
        A.STOP,
        "budget 0",
        "Slurm requeues it (R+1)",
        None,
    ),
    (
        "failed",
        False,
        1,
        True,
        1,
        [],
        [],
        False,
        A.RESUBMIT,
        "budget 1",
        "Slurm requeues it (R+1; --requeue=expedite)",
        None,
    ),
    (
        "node failure",
        True,
        1,
        False,
        None,
        [],
        [],
        False,
        A.HOLD,
        "budget 1",
        "resubmit (budget 1) -> hold",
        "resubmit",
    ),
    # The exit codes over the end's rule.
    (
        "failed",
        False,
        2,
        False,
        3,
        [3],
        [],
        False,
        A.STOP,
        "budget 2",
        "stop (exit code 3: --stop-on-exit)",
        None,
    ),
    (
        "failed",
        False,
        0,
        False,
        75,
        [],
        [75],
        False,
        A.RESUBMIT,
        f"exit 75, {FREE}",
        "resubmit, budget not spent (exit code 75",
        "resubmit",
    ),
    (
        "failed",
        True,
        0,
        False,
        75,
        [],
        [75],
        False,
        A.HOLD,
        f"exit 75, {FREE}",
        "resubmit, budget not spent (exit code 75",
        "resubmit",
    ),
    (
        "timeout",
        False,
        2,
        False,
        75,
        [],
        [75],
        False,
        A.RESUBMIT,
        "budget 2",
        "resubmit (budget 2)",
        None,
    ),
    (
        "failed",
        False,
        2,
        False,
        None,
        [3],
        [75],
        False,
        A.RESUBMIT,
        "budget 2",
        "resubmit (budget 2)",
        None,
    ),
    # A stall never restarts free: its status answers the watcher's signals.
    (
        "failed",
        False,
        1,
        False,
        75,
        [],
        [75],
        True,
        A.RESUBMIT,
        "budget 1",
        "resubmit (budget 1)",
        None,
    ),
    (
        "failed",
        False,
        1,
        False,
        3,
        [3],
        [],
        True,
        A.STOP,
        "budget 1",
        "stop (exit code 3: --stop-on-exit)",
        None,
    ),
    (
        "lost",
        False,
        2,
        False,
        None,
        [],
        [],
        False,
        A.STOP,
        "budget 2",
        "stop (unknown end state 'lost')",
        None,
    ),
]


def ended(
    end: str,
    shared: bool,
    left: int,
    expedited: bool,
    status: Optional[int],
    stop: list[int],
    restart: list[int],
    stalled: bool,
    **more: Any,
) -> rules.Facts:
    """What the supervisor gathers, for one execution that ended ``end`` with ``left``
    resubmissions left (its first submission, given a budget of ``left``)."""
    return rules.Facts(
        ends=[(end, status)],
        shared=shared,
        expedited=expedited,
        resubmit=left,
        submission=1,
        reasons=["first"],
        stop_on_exit=stop,
        restart_on_exit=restart,
        stalled=stalled,
        **more,
    )


@pytest.mark.parametrize(
    "given,action,spent,text,instead_of", [(row[:8], *row[8:]) for row in ROWS]
)
def test_the_decision(
    given: tuple[Any, ...],
    action: rules.Action,
    spent: str,
    text: str,
    instead_of: Optional[str],
) -> None:
    end = given[0]
    decision = rules.decide(ended(*given))
    assert (decision.action, decision.spent, decision.end) == (action, spent, end)
    assert decision.rule.text.startswith(text), decision.rule.text
    assert decision.rule.instead_of == instead_of
    assert decision.free == (not spent.startswith("budget"))


def test_a_stalled_completion_is_a_failure() -> None:
    assert rules.end_of("completed", True) == "failed"
    assert rules.end_of("completed", False) == "completed"
    assert rules.end_of("timeout", True) == "timeout"


def test_the_budget_left_counts_restarts_that_spent_nothing_apart() -> None:
    assert rules.budget_left(2, 1, ["first"]) == 2
    assert rules.budget_left(2, 3, ["first", "failed (budget 2)", "failed (budget 1)"]) == 0
    assert rules.budget_left(1, 3, ["first", f"failed (exit 75, {FREE})", "failed (budget 1)"]) == 0
    assert rules.budget_left(0, 2, ["first", f"failed (exit 75, {FREE})"]) == 0


def test_no_progress_stops_a_restart_and_quarantine_comes_before_a_budgeted_one() -> None:
    found = rules.WithoutProgress(
        [[2, 0, "a2"], [3, 0, "a3"]], ["/ck/exec/a1/checkpoint-10"], 2, "j1", None
    )
    failed = rules.decide(ended("failed", False, 2, False, 1, [], [], False))
    assert failed.restarts and failed.quarantines and not failed.no_progress
    stopped = rules.decide(
        ended("failed", False, 2, False, 1, [], [], False, without_progress=found)
    )
    assert (stopped.action, stopped.rule.text, stopped.spent) == (
        A.STOP,
        "stop: 2 execution(s) in a row (S2 R0, S3 R0) published nothing past the save "
        "they resumed from, /ck/exec/a1/checkpoint-10 (--max-no-progress 2); not "
        "resubmitted after failed: `dispatch resubmit j1` submits it again",
        "budget 2",
    )
    assert not stopped.restarts and stopped.no_progress and stopped.quarantines
    # A stop recorded before is said in its own words; over a stop, nothing is found.
    recorded = rules.WithoutProgress([], [], 2, recorded="held before")
    again = rules.decide(
        ended("timeout", False, 2, False, None, [], [], False, without_progress=recorded)
    )
    assert again.rule.text == "stop: held before" and not again.quarantines
    done = rules.decide(
        ended("completed", False, 2, False, 0, [], [], False, without_progress=found)
    )
    assert (done.rule.text, done.no_progress) == ("stop (done)", False)
    # Where it cannot be told, a restart goes on as before, said; a stop says nothing.
    unknown = {"progress_unknown": "cannot tell"}
    assert rules.decide(ended("failed", False, 2, False, 1, [], [], False, **unknown)).unknown
    assert not rules.decide(
        ended("completed", False, 2, False, 0, [], [], False, **unknown)
    ).unknown
    free = rules.decide(ended("failed", False, 0, False, 75, [], [75], False))
    assert free.restarts and not free.quarantines
    assert not rules.decide(ended("timeout", False, 2, False, None, [], [], False)).quarantines
    assert not rules.decide(ended("completed", False, 2, False, 0, [], [], False)).restarts


# An array's ended tasks, each (Slurm's state, its exit code) -> the end its rule is chosen by
# (the first in rule order: a failed task outranks completed ones) and the script's exit
# status that end's tasks give (one only, else none).
ARRAY_ROWS = [
    ([("COMPLETED", "0:0"), ("FAILED", "3:0")], "failed", 3),
    ([("COMPLETED", "0:0"), ("TIMEOUT", "0:15"), ("OUT_OF_MEMORY", "0:125")], "timeout", None),
    ([("FAILED", "3:0"), ("FAILED", "4:0")], "failed", None),
    ([("FAILED", "3:0"), ("COMPLETED", "0:0"), ("FAILED", "3:0")], "failed", 3),
    ([("PREEMPTED", None), ("NODE_FAIL", None)], "node failure", None),
    ([("CANCELLED", "0:15"), ("COMPLETED", "0:0")], "cancelled", None),
    ([("COMPLETED", "0:0")], "completed", 0),
]


@pytest.mark.parametrize("tasks,end,status", ARRAY_ROWS)
def test_an_arrays_end_is_its_first_tasks_in_rule_order(
    tasks: list[tuple[str, Optional[str]]], end: str, status: Optional[int]
) -> None:
    views = [Job(f"9_{i}", state, exit_code=code) for i, (state, code) in enumerate(tasks)]
    ends = [(end_name(v.state), v.exit_status) for v in views]
    assert rules.first_end(ends, False) == (end, status)
    # That end's one exit status is what the exit codes' rule reads.
    decision = rules.decide(rules.Facts(ends, resubmit=1, restart_on_exit=[3]))
    assert decision.end == end
    assert decision.spent == (f"exit 3, {FREE}" if (end, status) == ("failed", 3) else "budget 1")
    # A stalled completion is a failure, whose exit status no completed task gives.
    assert rules.first_end([("completed", 0)], True) == ("failed", None)


R = rules.OnRequeue
STOP = rules.WithoutProgress([[1, 0, "a1r0"]], [""], 1)

# Slurm's requeued job, pending again (what _requeued gathers) -> action, the budget's hold,
# Slurm asked to hold it, said, progress still to be read
REQUEUED_ROWS = [
    (rules.Requeued(), R.LEAVE, False, False, "", False),
    (rules.Requeued(budget=1, used=1), R.LEAVE, False, False, "", False),
    (rules.Requeued(budget=1, used=2), R.HOLD, True, True, "", False),
    (rules.Requeued(held=True, budget=1, used=2), R.HOLD, True, False, "", False),
    (
        rules.Requeued(budget=1, used=2, spent_before=True, limit=1),
        R.LEAVE,
        False,
        False,
        "",
        False,
    ),
    (rules.Requeued(budget=1, used=2, limit=1), R.HOLD, True, True, "", False),
    (rules.Requeued(budget=1, used=1, limit=1), R.LEAVE, False, False, "", True),
    (rules.Requeued(limit=1, progress_read=True), R.LEAVE, False, False, "", False),
    (
        rules.Requeued(limit=1, progress_read=True, without_progress=STOP),
        R.HOLD,
        False,
        True,
        "",
        False,
    ),
    (
        rules.Requeued(held=True, limit=1, progress_read=True, without_progress=STOP),
        R.HOLD,
        False,
        False,
        "",
        False,
    ),
    (
        rules.Requeued(
            limit=1, progress_read=True, without_progress=replace(STOP, recorded="held")
        ),
        R.LEAVE,
        False,
        False,
        "",
        False,
    ),
    (
        rules.Requeued(limit=1, progress_read=True, progress_unknown="x"),
        R.LEAVE,
        False,
        False,
        "x",
        False,
    ),
    (
        rules.Requeued(limit=1, progress_read=True, late_save=True),
        R.RELEASE,
        False,
        False,
        "",
        False,
    ),
    (
        rules.Requeued(limit=1, progress_read=True, late_save=False),
        R.LEAVE,
        False,
        False,
        "",
        False,
    ),
]


@pytest.mark.parametrize("found,action,spent,hold_now,unknown,reads", REQUEUED_ROWS)
def test_the_decision_on_slurms_requeued_job(
    found: rules.Requeued,
    action: rules.OnRequeue,
    spent: bool,
    hold_now: bool,
    unknown: str,
    reads: bool,
) -> None:
    assert rules.after_requeue(found) == rules.RequeueDecision(
        action, spent, hold_now, unknown, reads
    )
