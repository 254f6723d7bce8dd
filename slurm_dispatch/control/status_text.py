"""dispatch status's and dispatch jobs' text: a job's status
(:func:`slurm_dispatch.control.status.collect`) or the jobs' lines (``status.job_lines``) as
the lines people read.  The CLI only prints what :func:`render` and :func:`jobs_table` return.

Role: the one place the status is put into words.  Recorded decisions are read as typed events
(:func:`slurm_dispatch.control.events.parse`, dispatched on their classes, never on kind
strings); the hooks' facts of an execution through their typed views
(:class:`slurm_dispatch.node.executions.ExecutionFacts`, for the type checker only).

Invariant: pure over the status data (apart from the clock for "N ago"), no I/O; the text is
pinned byte for byte by tests/unit/test_status_text.py, whose golden file says what each case
looks like.  Every line is one line: what a user named (a script, a root, a path) is shown
with its line breaks and terminal escapes escaped (``\\n``, ``\\x1b``), in the header and the
event lines as in each table's cells.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .._clock import ago, duration
from .._table import one_line, render_table
from ..checkpoint import roots
from . import events
from .badnodes import avoided_text, excluded_text
from .noprogress import quarantine_text, stop_text
from .status import clock, requeues_text

if TYPE_CHECKING:
    from ..node.executions import ExecutionFacts

    # An execution's facts in the status: what the hooks recorded, or why it is unreadable.
    FactsView = Union[ExecutionFacts, dict[str, str]]


def render(data: dict[str, Any], several_clusters: bool = False) -> str:
    """The status text; with ``several_clusters`` (the home holds records of more than one
    cluster), a line naming the job's cluster under the first."""
    text = _render(data)
    if several_clusters:  # whose job it is
        head, _, rest = text.partition("\n")
        text = f"{head}\nCluster     {data['cluster']}\n{rest}"
    return text


def jobs_table(
    lines: list[dict[str, Any]], several_clusters: bool = False, noheader: bool = False
) -> str:
    """``dispatch jobs``' table of :func:`slurm_dispatch.control.status.job_lines` (each with
    its ``cluster``); a CLUSTER column where the home holds more than one cluster's jobs."""
    rows = [
        [line["id"], "-", "-", "-", f"unreadable: {line['error']}"]
        if "error" in line
        else [
            line["id"],
            line["script"],
            f"{line['generation']}/{line['submission']}",
            line["slurm_job_id"] or "-",
            line["state"],
            line["checkpoint"],
        ]
        for line in lines
    ]
    headers = ["DISPATCH_JOB", "SCRIPT", "G/N", "SLURM_JOB", "STATE", "CHECKPOINT"]
    if several_clusters:
        headers.insert(1, "CLUSTER")
        for row, line in zip(rows, lines):
            row.insert(1, line.get("cluster") or "-")
    return render_table(headers, rows, noheader)


def _render(data: dict[str, Any]) -> str:
    mode = "shared checkpoint" if data["shared_checkpoint"] else "isolated"
    tasks = data.get("tasks")
    used = (
        resubmits_text(data)
        if tasks is None
        else f"an array of {len(tasks)} task(s), each with a resubmit budget of "
        f"{data['resubmit_budget']}"
    )
    out = [
        f"Dispatch job {data['id']}: {data['script']}, generation {data['generation']}, "
        f"{mode}, {used}",
        f"Checkpoint  {data['checkpoint']}",
    ]
    if data.get("supersedes"):
        out.append(f"Supersedes  {data['supersedes']}")
    out.append("")
    out.append(supervisor_text(data))
    if data.get("launcher_problem"):
        out.append(f"Launcher    {data['launcher_problem']}")
    out.extend(
        slurm_hold_text(hold, data["shared_checkpoint"]) for hold in data.get("slurm_holds") or []
    )
    out.extend(f"No progress {line}" for line in data.get("no_progress") or [])
    out.extend(f"Requeues    {line}" for line in data.get("requeues_spent") or [])
    out.extend(f"Bad nodes   {line}" for line in data.get("bad_nodes") or [])
    out.extend(quarantined_text(mark) for mark in data.get("quarantined") or [])
    out.append("")
    # Slurm's reason for the job's state, and ours for making the submission, apart.
    out.append(
        _Table(
            render_table(
                [
                    "SUBMISSION",
                    "JOBID",
                    "STATE",
                    "RESTARTS",
                    "SUBMITTED",
                    "SLURM_REASON",
                    "SUBMITTED_FOR",
                ],
                [
                    [
                        s["submission"],
                        s.get("display_id") or s["slurm_job_id"],
                        state_text(s),
                        "-" if s["restarts"] is None else s["restarts"],
                        clock(s["submitted"]),
                        s["slurm_reason"] or "-",
                        s["reason"] or "-",
                    ]
                    for s in data["submissions"]
                ],
            )
        )
    )
    if tasks:
        out.append("")
        out.append(
            _Table(
                render_table(
                    ["TASK", "SUBMISSION", "JOBID", "STATE", "RESUBMITS", "LATEST PUBLICATION"],
                    [
                        [
                            t["task"],
                            t["submission"],
                            t["display_id"],
                            "FINISHED"
                            if t["settled"] and t["state"].startswith("UNKNOWN")
                            else t["state"],
                            f"{t['resubmits_used']} of {data['resubmit_budget']}",
                            latest_text(t["latest"]),
                        ]
                        for t in tasks
                    ],
                )
            )
        )
    out.append("")
    rows = []
    for e in data["executions"]:
        jobid = e.get("display_id") or e["slurm_job_id"]
        evidence = "; ".join(fact_text(f) for f in e.get("facts", [])) or "-"
        rows.append(
            [
                jobid,
                e["restart"],
                e["epoch"],
                e["attempt"],
                e["node"] or "-",
                clock(e["started"]),
                e["state"],
                resumed_text(e, data["executions"], data["checkpoint"]),
                published_text(e.get("published")),
                evidence,
            ]
        )
    out.append(
        _Table(
            render_table(
                [
                    "JOBID",
                    "R",
                    "EPOCH",
                    "ATTEMPT",
                    "NODE",
                    "STARTED",
                    "STATE",
                    "RESUMED_FROM",
                    "PUBLISHED",
                    "END/CESSATION",
                ],
                rows,
            )
        )
        if rows
        else "No execution has started yet."
    )
    out.extend(
        f"{execution_label(e)} went backwards: {e['published']['backwards']}"
        for e in data["executions"]
        if (e.get("published") or {}).get("backwards")
    )
    if data.get("goodput") and data["executions"]:
        out.append(goodput_text(data["goodput"]))
    if data["events"]:
        out.append("")
        out.extend(
            f"{clock(raw['time'])} {event_text(events.parse(raw))}" for raw in data["events"]
        )
    if tasks and roots.per_task(data["checkpoint"]):
        return _joined(out)  # each task's root, its latest: in the task table
    out.append("")
    out.append(f"Latest publication: {latest_text(data['latest'])}")
    return _joined(out)


class _Table(str):
    """A rendered table among status's lines: its rows are its own lines, each cell already
    on one line (:func:`render_table`)."""


def _joined(out: list[str]) -> str:
    """Status's lines: each line of free text on one line (a script, root or path a user
    named, with a line break or a terminal escape, :func:`one_line`), each table as it is."""
    return "\n".join(text if isinstance(text, _Table) else one_line(text) for text in out)


def goodput_text(got: dict[str, Any]) -> str:
    """The goodput summary (:func:`slurm_dispatch.control.goodput.figures`) in a line:
    ``Goodput     81% of 16m02s allocated; 2 restarts (node failure 1, preempted 1); 3m04s
    lost, 20 steps redone; 40 s waited (0 s held)``."""
    share = "-" if got.get("goodput") is None else f"{got['goodput']:.0%}"
    causes = ", ".join(
        f"{cause} {count}" for cause, count in (got.get("restarts_by_cause") or {}).items() if count
    )
    restarts = got.get("restarts") or 0
    said = f"{restarts} restart{'' if restarts == 1 else 's'}" + (f" ({causes})" if causes else "")
    return (
        f"Goodput     {share} of {duration(got.get('allocated_s') or 0)} allocated; "
        f"{said}; {duration(got.get('lost_s') or 0)} lost, "
        f"{got.get('redone_steps') or 0} steps redone; "
        f"{duration(got.get('waited_s') or 0)} waited ({duration(got.get('held_s') or 0)} "
        "held)"
    )


def quarantined_text(mark: dict[str, str]) -> str:
    """One quarantined save of the job's root: passed over by the launcher until lifted."""
    if "error" in mark:
        return f"Quarantine  unreadable in {mark['root']}: {mark['error']}"
    return (
        f"Quarantined {mark['save']}: passed over when an execution chooses the save to "
        f"resume from; `dispatch unquarantine --root {mark['root']} {mark['save']}` "
        "lifts it"
    )


def execution_label(execution: dict[str, Any]) -> str:
    """``S2 R1`` (submission 2, restart 1), ``S2/t3 R0`` for an array task's."""
    task = execution.get("array_task_id")
    shown_task = f"/t{task}" if task not in (None, "") else ""
    return f"S{execution.get('submission', '?')}{shown_task} R{execution.get('restart', '?')}"


def resumed_text(execution: dict[str, Any], executions: list[dict[str, Any]], root: str) -> str:
    """What an execution resumed from: ``fresh`` (nothing was published), or the save named by
    the execution that wrote it (``S1 R0 checkpoint-500``), else its path below the root (a
    save of an execution this record does not hold).  The launcher's choice, unless its
    integration recorded loading another (``loaded``: the choice was unloadable), which is
    then shown with the saves it passed over: ``S1 R0 checkpoint-400 (passed over
    checkpoint-500)``."""

    def named(source: str, short: bool = False) -> str:
        for other in executions:
            folder = str(other.get("exec_dir") or "").rstrip("/")
            if folder and source.startswith(folder + "/"):
                return (
                    source[len(folder) + 1 :]
                    if short
                    else f"{execution_label(other)} {source[len(folder) + 1 :]}"
                )
        prefix = root.rstrip("/") + "/"
        return source[len(prefix) :] if source.startswith(prefix) else source

    source = str(execution.get("resume_from") or "")
    passed = ""
    if "loaded" in execution:
        source = str(execution["loaded"] or "")
        skipped = [named(str(p), True) for p in execution.get("passed_over") or []]
        passed = f" (passed over {', '.join(skipped)})" if skipped else ""
    return (named(source) if source else "fresh") + passed


def published_text(published: Optional[dict[str, Any]]) -> str:
    """What an execution published: ``nothing``, ``3: steps 2-6``, ``2: save index 0-1 (step
    not known)`` (accelerate's), ``... BACKWARDS`` when a step is at or below the one it
    resumed from (said in full below the table), or why the store cannot say."""
    if published is None:
        return "-"
    if "error" in published:
        return "unreadable"
    if not published["count"]:
        return "nothing"
    first, last = published["first"], published["last"]
    span = f" {first}" if first == last else f"s {first}-{last}"
    text = (
        f"{published['count']}: step{span}"
        if published["steps_known"]
        else f"{published['count']}: save index{span.lstrip('s')} (step not known)"
    )
    return text + (" BACKWARDS" if published.get("backwards") else "")


def resubmits_text(data: dict[str, Any]) -> str:
    """``resubmits 1 of 3``, or, where a person resubmitted, what was whose: the supervisor
    counts every resubmission against the budget."""
    used, budget = data["resubmits_used"], data["resubmit_budget"]
    by_hand = data.get("resubmits_by_hand", 0)
    free = data.get("resubmits_free", 0)
    also = f" (and {free} by --restart-on-exit, budget not spent)" if free else ""
    if not by_hand:
        return f"resubmits {used} of {budget}{also}"
    times = "time" if by_hand == 1 else "times"
    rest = f" and {used - by_hand} by dispatch supervise" if used > by_hand else ""
    return (
        f"resubmitted {by_hand} {times} by hand (dispatch resubmit){rest}; resubmit "
        f"budget {budget}, {max(0, budget - used)} left for dispatch supervise{also}"
    )


def state_text(sub: dict[str, Any]) -> str:
    """A submission's state; a recorded end with the hook's exit code, as sacct's ExitCode."""
    state = str(sub["state"])
    if sub.get("exit_code") and state.endswith(" (recorded)"):
        return f"{state[:-1]}, exit {sub['exit_code']})"
    return state


def supervisor_text(data: dict[str, Any]) -> str:
    """When a supervisor last passed: resubmissions and holds happen only while one runs."""
    seen = data.get("supervisor")
    rules_wait = data["resubmit_budget"] > 0 or data["shared_checkpoint"]
    if not seen:
        return "Supervisor  none has passed yet" + (
            ": --resubmit and holds act only while `dispatch supervise` runs (a systemd user "
            "timer: contrib/systemd; scrontab; or --loop)"
            if rules_wait
            else ""
        )
    good = (
        f"last good pass {clock(seen['time'])} ({ago(seen['time'])} ago, on "
        f"{seen.get('host', '?')})"
        if seen.get("time")
        else "no good pass yet"
    )
    if not seen.get("failing_since"):
        return f"Supervisor  {good}"
    return (
        f"Supervisor  {good}; passes failing since {clock(seen['failing_since'])} "
        f"({seen.get('failures', '?')} failed, the latest {ago(seen.get('failed_at'))} "
        f"ago): {seen.get('error', '?')}"
    )


def slurm_hold_text(hold: dict[str, Any], shared: bool) -> str:
    """Slurm's own hold after a failed launch, and what to do about it."""
    shown = hold["display_id"]
    then = (
        " It is a shared-checkpoint job: the supervisor leaves it to you; release it once "
        "its last execution has stopped"
        if shared
        else " `dispatch supervise` releases it at its next pass; or release it yourself"
    )
    return (
        f"Held        Slurm holds job {shown} after a failed launch ({hold['reason']}): "
        f"it runs only once someone releases it.{then}: scontrol release {shown} (if it fails "
        "again, look at its nodes: sinfo -R)"
    )


def latest_text(latest: Optional[dict[str, Any]]) -> str:
    if latest is None:
        return "none"
    if "error" in latest:
        return f"unreadable: {latest['error']}"
    return f"epoch {latest['epoch']} step {latest['step']} {latest['path']}"


def superseded_text(event: events.Superseded) -> str:
    """A superseded event in words: by which job, and which Slurm jobs its cancel took."""
    jobs = ", ".join(str(j) for j in event.cancelled)  # a hand edit may put anything
    if event.again:
        return (
            f"SUPERSEDED by {event.by}: cancelled Slurm job {jobs} again, active again "
            f"({event.again}) after its cancel (a controller restarted before it saved "
            "the cancel)"
        )
    return f"SUPERSEDED by {event.by}" + (f" (cancelled Slurm job {jobs})" if jobs else "")


# The decisions whose line is their word, the task, and what their own module says of them.
_IN_WORDS: tuple[tuple[type, str, Callable[[Any], str]], ...] = (
    (events.Quarantined, "QUARANTINED", quarantine_text),
    (events.RequeuesSpent, "REQUEUES-SPENT", requeues_text),
    (events.NoProgress, "NO-PROGRESS", stop_text),
    (events.NodeAvoided, "NODE-AVOIDED", avoided_text),
    (events.NodesExcluded, "NODES-EXCLUDED", excluded_text),
)


def event_text(event: events.Event) -> str:
    """One line for a recorded decision: holds, cessation facts, releases, ends.  One array
    task's: named, and its Slurm jobs as Slurm shows them (``80_1``)."""
    task = event.task

    def shown(slurm_id: str) -> str:
        """A task's Slurm job as Slurm writes it (``80_1``), unless it is written so."""
        return (
            f"{slurm_id}_{task}"
            if task is not None and slurm_id and "_" not in slurm_id
            else slurm_id
        )

    named = "" if task is None else f"task {task} "
    if isinstance(event, events.Hold):
        return (
            f"HOLD {named}submission {event.submission} (Slurm job "
            f"{shown(event.slurm_job_id)}) after {event.end_state} of job "
            f"{event.ended_slurm_job_id}, until {clock(event.deadline)}"
        )
    if isinstance(event, events.Cessation):
        evidence = event.evidence
        reason = evidence.get("reason", "") if isinstance(evidence, dict) else str(evidence)
        return f"CESSATION {named}of job {event.ended_slurm_job_id}: {event.verdict}" + (
            f" ({reason})" if reason else ""
        )
    if isinstance(event, events.Released):
        return f"RELEASED Slurm job {shown(event.slurm_job_id)} by {event.by}"
    if isinstance(event, events.Expired):
        return f"EXPIRED hold on Slurm job {shown(event.slurm_job_id)}: nothing more starts"
    if isinstance(event, events.Stalled):
        return (
            f"STALLED {named}submission {event.submission}: {event.reason} (attempt "
            f"{event.attempt}, --stall-timeout {event.timeout} s): asked to save "
            f"({event.signal}), then ended"
        )
    if isinstance(event, events.Finished):
        return f"FINISHED {named}after {event.end_state}: {event.rule}"
    for kind, word, said in _IN_WORDS:
        if isinstance(event, kind):
            return f"{word} {named}{said(event)}"
    if isinstance(event, events.Superseded):
        return superseded_text(event)
    # Any other kind (a notification, a failed submission): its stored fields, by name.
    extra = {k: v for k, v in event.raw.items() if k not in ("event", "time", "ns")}
    for key in ("slurm_job_id", "held_slurm_job_id"):
        if extra.get(key):
            extra[key] = shown(str(extra[key]))
    return f"{event.kind.upper()} " + " ".join(f"{k}={v}" for k, v in sorted(extra.items()))


def fact_text(fact: FactsView) -> str:
    """One execution's hook facts in a few words: its end, then each node's cessation."""
    if "error" in fact:
        return f"facts unreadable: {fact['error']}"  # type: ignore[typeddict-item]
    seen: ExecutionFacts = fact  # type: ignore[assignment]
    parts: list[str] = []
    nodes = seen.get("nodes") or {}
    end = seen.get("end")
    if not end and all(node.get("ceased") is None for node in nodes.values()):
        return "-"  # still running: nothing has ended yet
    if end:
        state = end.get("state") or ("requeued" if end.get("requeued") else "ended")
        parts.append(f"{state} exit {end.get('exit_code', '?')}")
    for name, node in sorted(nodes.items()):
        ceased = node.get("ceased")
        if ceased is True:
            parts.append(f"{name} ceased")
        elif ceased is False:
            pids = [str(p.get("pid")) for p in node.get("survivors", []) if isinstance(p, dict)]
            parts.append(f"{name} SURVIVORS {','.join(pids) or '?'}")
        else:
            parts.append(f"{name} no end record")
    if seen.get("problems"):
        parts.append(f"{len(seen['problems'])} problem(s)")
    return ", ".join(parts) or "-"
