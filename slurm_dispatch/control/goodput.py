"""A dispatch job's goodput: what each restart cost, from its record, its facts and its
publications.

Role: the one place these figures are computed, for ``dispatch status`` (its summary line and
``--json``), the metrics (``dispatch-admin metrics``) and any later picture of a job.
:func:`figures` is pure over the status data (:func:`slurm_dispatch.control.status.collect`)
and the publications with their times (:func:`marks`, the one reader here: names, the pub/
entry's time and the save's own, never a save's content).

Each execution of a lineage (the whole job, or one array task), in the order they started:

* ``allocated``: when its allocation began (the controller's or a node's Prolog record, else
  the launcher's start); ``ended``: when Slurm ended it (the controller's or a node's end
  record; for one with a successor and no end record, the successor's allocation: an upper
  bound); ``ceased``: when every node proved its processes gone (the overlap a replacement
  survived runs from ``ended`` to it);
* ``waited_s``: the gap before it ran, from its predecessor's end (the first: from its
  submission), and ``held_s`` the part of it under a shared-checkpoint hold;
* ``resumed_step``: the step of the save it loaded; ``redone_steps``: the steps it did again,
  from that save to the last step its predecessor reached (its highest publication, including
  those a cut-off predecessor published after this execution started, else the step it resumed
  from).  Steps between a predecessor's last save and its end are not recorded anywhere: the
  figure is low by at most one save interval;
* ``first_save_s``: from its start to its first publication; ``restore_s``: an estimate of the
  time to its first step after resuming, that time less the steps to the first save at the
  pace of its own later saves (None with fewer than two saves); ``save_latency_s``: from a
  save's last write (its own mtime) to its publication: median, greatest, sum and count;
* ``open``: it runs (Slurm says so, or the hooks recorded its start and no end, and neither
  Slurm gave an end state nor the supervisor recorded the lineage finished), and
  ``last_progress`` the time of its latest publication (else its start);
* ``cause``: why it ended, one of :data:`CAUSES`: for a Slurm requeue (the same submission
  ran again) the controller's end state where Slurm gave one, else ``node failure`` where a
  node of it recorded no end before its successor's allocation began (the node was cut off:
  Slurm requeued it without that node's Epilog) and ``preempted`` where every node did; for a
  resubmission or a hold, the rule's end the supervisor recorded; ``by hand`` for a person's
  ``dispatch resubmit``; ``no progress`` where the supervisor stopped restarting after it
  (``--max-no-progress``: a person's release or resubmission restarted it);
* ``lost_s``: the part of its allocation that the lineage did not keep: its start-up and
  restore, and everything after the save its successor resumed from (all of it where the
  successor took up nothing of it).  ``goodput`` is the kept share of all allocations.

Invariant: every figure is computed from recorded moments only; one that cannot be is None,
never guessed.  The cause is one of :data:`CAUSES` (a bounded set: it becomes a metric label).
The work grows with the executions, events and publications, not with their product
(:func:`owned` finds each execution's publications in one walk): an array of thousands of tasks
is figured in a fraction of a second.
"""

from __future__ import annotations

import heapq
import os
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..checkpoint import progress
from ..slurm.jobs import END_STATES, is_running

# Why an execution was followed by another one; the metrics' ``cause`` label values.
CAUSES = (
    "preempted",
    "node failure",
    "failed",
    "timeout",
    "out of memory",
    "no progress",
    "by hand",
    "unknown",
)
# A rule's end names (rules.ORDER) and the cause each counts as.
_RULE_CAUSES = {
    "node failure": "node failure",
    "preempted": "preempted",
    "failed": "failed",
    "timeout": "timeout",
    "out of memory": "out of memory",
    "no progress": "no progress",
}


@dataclass(frozen=True)
class Mark:
    """A publication on the time axis: when its pub/ entry was made, what it names, and when
    the save it names was last written (None where that cannot be read: an S3 root)."""

    time: float
    path: str
    step: int
    latest: bool = False
    saved: Optional[float] = None


def marks(root: str, found: Optional[Iterable[Any]] = None) -> list[Mark]:
    """The publications under ``root`` (``found``: already listed) with the time each pub/
    entry was made and the time its save was last written (a POSIX root's; an S3 root's have
    none and are left out)."""
    from ..checkpoint import publish as store

    listed = list(store.list_publications(root) if found is None else found)
    best = max(listed, key=lambda f: (f.epoch, f.step, f.name), default=None)
    out = []
    for f in listed:
        try:
            when = os.stat(os.path.join(root, "pub", f.name), follow_symlinks=False).st_mtime
        except OSError:
            continue
        try:
            saved: Optional[float] = os.stat(f.path, follow_symlinks=False).st_mtime
        except (OSError, ValueError):
            saved = None
        out.append(Mark(when, f.path, f.step, latest=f is best, saved=saved))
    return out


def ended_at(execution: dict[str, Any]) -> Optional[float]:
    """When Slurm ended the execution, as its hooks recorded it."""
    for fact in execution.get("facts") or []:
        end = fact.get("end") if isinstance(fact, dict) else None
        if isinstance(end, dict) and isinstance(end.get("time"), (int, float)):
            return float(end["time"])
    return None


def ceased_at(execution: dict[str, Any]) -> Optional[float]:
    """When every node of the execution was proven free of it, if that is recorded."""
    moments = []
    for fact in execution.get("facts") or []:
        nodes = fact.get("nodes") if isinstance(fact, dict) else None
        if not isinstance(nodes, dict) or not nodes:
            continue
        for seen in nodes.values():
            if not isinstance(seen, dict) or seen.get("ceased") is not True:
                return None
            source = seen.get("recheck") or seen.get("end") or {}
            when = source.get("time") if isinstance(source, dict) else None
            if isinstance(when, (int, float)):
                moments.append(float(when))
    return max(moments) if moments else None


def _time_of(fact: Any) -> Optional[float]:
    when = fact.get("time") if isinstance(fact, dict) else None
    return float(when) if isinstance(when, (int, float)) else None


def _allocated_at(execution: dict[str, Any]) -> float:
    """The earliest Prolog record of the execution (controller's or a node's), else its
    launcher's start."""
    moments = []
    for fact in execution.get("facts") or []:
        if not isinstance(fact, dict):
            continue
        moments.append(_time_of((fact.get("controller") or {}).get("start")))
        for seen in (fact.get("nodes") or {}).values():
            if isinstance(seen, dict):
                moments.append(_time_of(seen.get("start")))
    known = [m for m in moments if m is not None]
    started = float(execution.get("started") or 0)
    return min(known + [started]) if known else started


def _begun(execution: dict[str, Any]) -> bool:
    """The hooks recorded the execution's start (its controller's or a node's Prolog)."""
    for fact in execution.get("facts") or []:
        if not isinstance(fact, dict):
            continue
        if (fact.get("controller") or {}).get("start") or any(
            isinstance(seen, dict) and seen.get("start")
            for seen in (fact.get("nodes") or {}).values()
        ):
            return True
    return False


def _node_ends(execution: dict[str, Any]) -> Optional[list[Optional[float]]]:
    """Each node's recorded end time (None: that node recorded none); None without node
    facts."""
    ends: list[Optional[float]] = []
    for fact in execution.get("facts") or []:
        nodes = fact.get("nodes") if isinstance(fact, dict) else None
        for seen in (nodes or {}).values():
            if isinstance(seen, dict):
                ends.append(_time_of(seen.get("end")))
    return ends or None


def _slurm_end_state(execution: dict[str, Any]) -> Optional[str]:
    for fact in execution.get("facts") or []:
        end = ((fact.get("controller") or {}).get("end") or {}) if isinstance(fact, dict) else {}
        state = str((end.get("slurm") or {}).get("SLURM_JOB_STATE") or "").split(" ")[0]
        # Slurm's end state in a controller's end record (releases that give hooks
        # SLURM_JOB_STATE), as the rules name it, where that is a cause.
        if END_STATES.get(state) in _RULE_CAUSES:
            return END_STATES[state]
    return None


def _rule_cause(text: str) -> Optional[str]:
    """The cause a rule's end name, or a reason starting with one, names."""
    for name, cause in _RULE_CAUSES.items():
        if text == name or text.startswith((name + " ", name + ":")):
            return cause
    return None


def _in_lane(execution: dict[str, Any]) -> str:
    return str(execution.get("array_task_id") or "")


def _task_of(event: dict[str, Any]) -> str:
    task = event.get("task")
    return "" if task is None else str(task)


class _Lane:
    """One lineage's executions, oldest first, with what the record says about them."""

    def __init__(
        self,
        executions: list[dict[str, Any]],
        events: list[dict[str, Any]],
        submissions: list[dict[str, Any]],
        owned: dict[str, list[Mark]],
        by_path: dict[str, Mark],
        now: float,
    ) -> None:
        self.executions = sorted(executions, key=lambda e: float(e.get("started") or 0))
        self.now = now
        self.events = events
        self.submissions = {int(s.get("submission") or 0): s for s in submissions}
        self.marks = [owned.get(_folder(e), []) for e in self.executions]
        self.by_path = by_path

    def holds(self) -> list[tuple[float, float]]:
        """Each hold's span, from when it was made to its release or expiry (or now)."""
        spans = []
        for hold in (e for e in self.events if e.get("event") == "hold"):
            lifted = [
                float(e["time"])
                for e in self.events
                if e.get("event") in ("released", "expired")
                and str(e.get("slurm_job_id")) == str(hold.get("slurm_job_id"))
            ]
            spans.append((float(hold.get("time") or 0), min(lifted) if lifted else self.now))
        return spans


def _folder(execution: dict[str, Any]) -> str:
    return str(execution.get("exec_dir") or "").rstrip("/")


def owned(executions: Iterable[dict[str, Any]], found: Iterable[Mark]) -> dict[str, list[Mark]]:
    """Each execution folder's publications (those below it), in ``found``'s order: one walk
    up each publication's path, so an array of thousands of tasks costs no more per task."""
    out: dict[str, list[Mark]] = {f: [] for f in map(_folder, executions) if f}
    for m in found:
        head = m.path
        while "/" in head:
            head = head.rpartition("/")[0]
            if head in out:
                out[head].append(m)
    return out


def _by_lane(items: Iterable[Any], lane_of: Any) -> tuple[list[Any], dict[str, list[Any]]]:
    """(the items of every lane, {lane: its own}): ``lane_of`` gives "" for every lane."""
    common: list[Any] = []
    own: dict[str, list[Any]] = {}
    for n, item in enumerate(items):
        lane = lane_of(item)
        (common if lane == "" else own.setdefault(lane, [])).append((n, item))
    return common, own


def _merged(common: list[Any], own: list[Any]) -> list[Any]:
    return [item for _, item in heapq.merge(common, own, key=lambda pair: pair[0])]


def _source(execution: dict[str, Any]) -> str:
    """The save the execution loaded (an integration's choice over the launcher's)."""
    return str(execution.get("loaded", execution.get("resume_from")) or "")


def _stopped(lane: _Lane, execution: dict[str, Any]) -> bool:
    """The supervisor stopped restarting the lane after this execution for want of progress
    (``--max-no-progress``: a no-progress event whose last execution it is)."""
    attempt = str(execution.get("attempt") or "")
    for stop in (e for e in lane.events if e.get("event") == "no-progress"):
        counted = stop.get("executions") or []
        last = counted[-1] if counted else []
        if attempt and isinstance(last, list) and len(last) > 2 and str(last[2]) == attempt:
            return True
    return False


def _cause(lane: _Lane, i: int) -> Optional[str]:
    """Why execution ``i`` of the lane ended, where a later one followed it."""
    this, after = lane.executions[i], lane.executions[i + 1]
    if _stopped(lane, this):
        return "no progress"  # restarted only by a person's release or resubmission
    if after.get("submission") == this.get("submission"):
        # Slurm ran the same submission again: a requeue.
        said = _slurm_end_state(this)
        if said:
            return said
        ends = _node_ends(this)
        if ends is None:
            return "unknown"
        begun = _allocated_at(after)
        return "node failure" if any(t is None or t > begun for t in ends) else "preempted"
    sub = lane.submissions.get(int(after.get("submission") or 0)) or {}
    reason = str(sub.get("reason") or "")
    if reason == "manual":
        return "by hand"
    hold = next(
        (
            e
            for e in lane.events
            if e.get("event") == "hold" and e.get("submission") == after.get("submission")
        ),
        None,
    )
    found = _rule_cause(str((hold or {}).get("end_state") or "")) or _rule_cause(reason)
    return found or "unknown"


def _last_cause(lane: _Lane) -> Optional[str]:
    """How the lane's last execution ended, where the supervisor finished the lineage."""
    done = [e for e in lane.events if e.get("event") == "finished"]
    return str(done[-1].get("end_state") or "") or None if done else None


def _restore(execution: dict[str, Any], own: list[Mark], resumed: Optional[int]) -> Optional[float]:
    """The estimated time from the start to the first step after resuming: the time to the
    first save less the steps to it at the pace of the later saves."""
    timed = sorted(
        (m for m in own if m.time >= float(execution.get("started") or 0)),
        key=lambda m: (m.time, m.step),
    )
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    if last.time <= first.time or last.step <= first.step:
        return None
    pace = (last.step - first.step) / (last.time - first.time)
    base = resumed if resumed is not None else 0
    return max(0.0, first.time - float(execution["started"]) - (first.step - base) / pace)


def _latency(own: list[Mark]) -> Optional[dict[str, Any]]:
    spans = [max(0.0, m.time - m.saved) for m in own if m.saved is not None]
    if not spans:
        return None
    return {
        "median": round(statistics.median(spans), 3),
        "max": round(max(spans), 3),
        "sum": round(sum(spans), 3),
        "count": len(spans),
    }


def _overlap(lo: float, hi: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in spans)


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def _lane_figures(lane: _Lane) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    holds = lane.holds()
    count = len(lane.executions)
    reached_before: Optional[int] = None
    for i, execution in enumerate(lane.executions):
        own = lane.marks[i]
        after = lane.executions[i + 1] if i + 1 < count else None
        started = float(execution.get("started") or 0)
        allocated = _allocated_at(execution)
        ended = ended_at(execution)
        running = is_running(str(execution.get("state") or "").split(" ")[0])
        # Running as Slurm says, or (where Slurm was not asked) begun and not ended as the
        # hooks recorded it.
        # Never open once Slurm gave an end state or the supervisor finished the lineage: a
        # node cut off for good records no end, and the execution would age for ever.
        said_ended = str(execution.get("state") or "").split(" ")[0] in END_STATES
        finished = any(e.get("event") == "finished" for e in lane.events)
        is_open = (
            after is None
            and ended is None
            and not said_ended
            and not finished
            and (running or _begun(execution))
        )
        if ended is None and after is not None:
            ended = _allocated_at(after)
        if ended is None and running:
            ended = lane.now
        source = _source(execution)
        loaded = lane.by_path.get(source) if source else None
        resumed = loaded.step if loaded is not None else (None if source else 0)
        steps = [m.step for m in own]
        reached = max(steps + ([resumed] if resumed is not None else []), default=None)
        if i == 0:
            sub = lane.submissions.get(int(execution.get("submission") or 0)) or {}
            since = sub.get("submitted")
        else:
            before = out[-1]
            since = before["ended"] if before["ended"] is not None else before["started"]
        waited = None if since is None else max(0.0, allocated - float(since))
        held = _overlap(float(since), allocated, holds) if since is not None else 0.0
        redone = None
        if i > 0:
            redone = (
                None
                if resumed is None
                else 0
                if reached_before is None
                else max(0, reached_before - resumed)
            )
        restore = _restore(execution, own, resumed)
        first = min((m.time for m in own if m.time >= started), default=None)
        figure: dict[str, Any] = {
            "submission": execution.get("submission"),
            "restart": execution.get("restart"),
            "array_task_id": execution.get("array_task_id") or "",
            "display_id": execution.get("display_id"),
            "node": execution.get("node"),
            "allocated": allocated,
            "started": started,
            "ended": ended,
            "ceased": ceased_at(execution),
            "waited_s": _round(waited),
            "held_s": _round(held),
            "resumed_step": resumed,
            "reached_step": reached,
            "redone_steps": redone,
            "steps_known": all(progress.step_known(m.path) for m in own),
            "first_save_s": _round(None if first is None else first - started),
            "restore_s": _round(restore),
            "save_latency_s": _latency(own),
            "published_after_end": sum(1 for m in own if ended is not None and m.time > ended),
            "open": is_open,
            "last_progress": max([m.time for m in own] + [started]),
            "cause": None,
        }
        if after is not None:
            figure["cause"] = _cause(lane, i)
        elif _stopped(lane, execution):
            figure["cause"] = "no progress"
        elif ended is not None and not running:
            figure["cause"] = _last_cause(lane)
        figure.update(_time(execution, figure, after, own, lane))
        out.append(figure)
        reached_before = reached
    return out


def _time(
    execution: dict[str, Any],
    figure: dict[str, Any],
    after: Optional[dict[str, Any]],
    own: list[Mark],
    lane: _Lane,
) -> dict[str, Any]:
    """The allocation's seconds and the part the lineage did not keep."""
    ended, allocated = figure["ended"], figure["allocated"]
    if ended is None:
        return {"allocated_s": None, "lost_s": None}
    held = max(0.0, ended - allocated)
    if after is None:
        kept_until = ended
    else:
        taken = lane.by_path.get(_source(after))
        kept_until = min(taken.time, ended) if taken is not None and taken in own else allocated
    useful_from = figure["started"] + (figure["restore_s"] or 0.0)
    kept = max(0.0, kept_until - useful_from)
    return {"allocated_s": _round(held), "lost_s": _round(max(0.0, held - kept))}


def figures(data: dict[str, Any], found: list[Mark], now: float) -> dict[str, Any]:
    """The goodput of the job the status ``data`` describes, with ``found`` its publications
    (:func:`marks`) and ``now`` the end of a running execution.  JSON-ready."""
    by_lane: dict[str, list[dict[str, Any]]] = {}
    for e in data.get("executions") or []:
        by_lane.setdefault(_in_lane(e), []).append(e)
    all_events, lane_events = _by_lane(data.get("events") or [], _task_of)
    all_subs, lane_subs = _by_lane(
        data.get("submissions") or [],
        lambda s: str(s.get("task") if s.get("task") is not None else ""),
    )
    folders = owned(data.get("executions") or [], found)
    by_path = {m.path: m for m in found}
    executions: list[dict[str, Any]] = []
    causes = {cause: 0 for cause in CAUSES}
    for lane in sorted(by_lane):
        these = _lane_figures(
            _Lane(
                by_lane[lane],
                _merged(all_events, lane_events.get(lane, [])),
                _merged(all_subs, lane_subs.get(lane, [])),
                folders,
                by_path,
                now,
            )
        )
        # The last execution's cause is how the lineage ended, no restart.
        for e in these[:-1]:
            if e["cause"] is not None:
                causes[e["cause"]] += 1
        executions += these
    allocated = sum(e["allocated_s"] for e in executions if e["allocated_s"] is not None)
    lost = sum(e["lost_s"] for e in executions if e["lost_s"] is not None)
    redone = [e["redone_steps"] for e in executions if e["redone_steps"] is not None]
    return {
        "executions": executions,
        "restarts": sum(causes.values()),
        "restarts_by_cause": causes,
        "allocated_s": round(allocated, 3),
        "lost_s": round(lost, 3),
        "goodput": round((allocated - lost) / allocated, 4) if allocated > 0 else None,
        "redone_steps": sum(redone),
        "waited_s": round(sum(e["waited_s"] or 0.0 for e in executions), 3),
        "held_s": round(sum(e["held_s"] or 0.0 for e in executions), 3),
    }
