"""A dispatch job's status: its record joined with one view of Slurm and the site's facts.

Costs one ``squeue`` call (the caller's own jobs) whatever the number of submissions.  Pure
over its inputs apart from reading the record, the store and the site facts.
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable, Optional

from . import record, store
from .errors import DispatchError
from .slurm import Job

FactsReader = Callable[[str], list[dict[str, Any]]]


def _state(info: Optional[Job]) -> str:
    if info is None:
        return "UNKNOWN (no longer known to slurmctld)"
    return info.state or "?"


def _facts_reader() -> Optional[FactsReader]:
    try:
        facts = importlib.import_module(f"{__package__}.facts")
    except ImportError:
        return None
    reader = getattr(facts, "execution_facts", None)
    return reader if callable(reader) else None


def collect(job: record.JobRecord, slurm_jobs: dict[str, Job],
            facts_reader: Optional[FactsReader] = None) -> dict[str, Any]:
    spec = job.spec
    events = job.events()
    reader = facts_reader if facts_reader is not None else _facts_reader()
    submissions = []
    for ev in events:
        if ev["event"] != "submitted":
            continue
        info = slurm_jobs.get(str(ev["slurm_job_id"]))
        submissions.append({
            "submission": ev["submission"], "slurm_job_id": str(ev["slurm_job_id"]),
            "reason": ev.get("reason", ""), "submitted": ev["time"], "state": _state(info),
            "restarts": info.restarts if info else None,
            "slurm_reason": info.reason if info else "",
        })
    executions = []
    facts_cache: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        if ev["event"] != "started":
            continue
        slurm_id = str(ev.get("slurm_job_id", ""))
        array = ev.get("array_task_id") or ""
        key = f"{ev.get('array_job_id')}_{array}" if array else slurm_id
        info = slurm_jobs.get(key) or slurm_jobs.get(slurm_id)
        restart = int(ev.get("restart", 0))
        if info is not None and info.restarts > restart:
            state = "REQUEUED"
        else:
            state = _state(info)
        execution = {k: ev.get(k) for k in ("submission", "restart", "attempt", "epoch", "node",
                                            "nodes", "exec_dir", "resume_from")}
        execution.update({"slurm_job_id": slurm_id, "array_task_id": array, "started": ev["time"],
                          "state": state})
        if info is not None and info.restarts == restart and info.end_time is not None \
                and info.execution_ended:
            execution["ended"] = clock(info.end_time)
        if reader is not None and slurm_id:
            if slurm_id not in facts_cache:
                try:
                    facts_cache[slurm_id] = reader(slurm_id)
                except Exception as exc:  # noqa: BLE001 - status still shows the rest
                    facts_cache[slurm_id] = [{"error": str(exc)}]
            execution["facts"] = [f for f in facts_cache[slurm_id]
                                  if f.get("restart") in (None, restart)]
        executions.append(execution)
    try:
        found = store.latest(_root_for_status(spec["checkpoint"]))
        latest: Any = found.as_json() if found else None
    except DispatchError as exc:
        latest = {"error": str(exc)}
    others = [ev for ev in events if ev["event"] not in ("submitted", "started")]
    return {
        "id": job.id, "generation": spec["generation"], "checkpoint": spec["checkpoint"],
        "shared_checkpoint": spec["shared_checkpoint"], "resubmit_budget": spec["resubmit"],
        "resubmits_used": max(0, len(submissions) - 1), "supersedes": spec.get("supersedes"),
        "script": spec["script_name"], "user": spec.get("user"), "created": spec["created"],
        "submissions": submissions, "executions": executions, "events": others,
        "latest": latest,
    }


def _root_for_status(root: str) -> str:
    # An array job's root has per-task patterns; status shows the static part's store then.
    return root.split("%", 1)[0].rstrip("/") if "%" in root else root


def clock(seconds: Optional[float]) -> str:
    if not seconds:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def job_lines(jobs: list[record.JobRecord], slurm_jobs: dict[str, Job]) -> list[dict[str, Any]]:
    """One summary per dispatch job, for ``dispatch jobs``: the latest submission and what
    Slurm says of it (or what the record says once Slurm has forgotten it).  A record that
    cannot be read is a line saying so, never a silent gap."""
    lines: list[dict[str, Any]] = []
    for job in jobs:
        try:
            spec = job.spec
            history = job.history()
        except DispatchError as exc:
            lines.append({"id": job.id, "error": str(exc)})
            continue
        current = history.lineage().current
        info = slurm_jobs.get(current.slurm_job_id) if current is not None else None
        tasks = [j for j in slurm_jobs.values() if current is not None
                 and j.array_job_id == current.slurm_job_id and j.array_task_id is not None]
        if history.lineage().superseded is not None:
            state = "SUPERSEDED"
        elif history.hold is not None and (info is None or info.is_held):
            state = "HELD"
        elif tasks:
            state = "+".join(sorted({t.state for t in tasks}))
        elif info is not None:
            state = info.state
        elif history.settled:
            state = "FINISHED"
        else:
            state = "UNKNOWN"  # ended and forgotten by slurmctld, not yet settled
        lines.append({
            "id": job.id, "script": spec.get("script_name"), "generation": spec["generation"],
            "submission": current.submission if current is not None else 0,
            "slurm_job_id": current.slurm_job_id if current is not None else None,
            "state": state, "checkpoint": spec["checkpoint"], "created": spec.get("created"),
        })
    return lines
