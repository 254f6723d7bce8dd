"""The numbers of one user's records for a dashboard: ``dispatch-admin metrics`` asks a child
running as the user (:func:`siteview.as_user`) and writes every user's into node_exporter's
textfile format (:mod:`slurm_dispatch.node.metrics`).

Per user: the standing shared-checkpoint holds and those expiring within ``HoldWarning``, the
CessationSignal's answers the records hold, by verdict (``ceased``, ``not ceased``,
``error``: a counter, since records only grow until ``dispatch forget``), and per cluster
the supervisor's last good pass, how many passes have failed since, and its interval (its
heartbeat: ``--loop``'s, else a timer's minute).
Per user too, what each restart cost (:mod:`slurm_dispatch.control.goodput`, over every job's
record, facts and publications): restarts by cause, the seconds allocated and lost, steps
redone, the restore, save latency and end-to-ceased seconds as summaries (sum and count), the
jobs the supervisor stopped for lack of progress, the jobs (array tasks) it still acts for,
the longest any running execution has gone
without a publication, and the standing holds by age (:data:`HOLD_AGES`) with the soonest
deadline.  These are computed afresh from the records at each run: a ``dispatch forget`` (or a
``gc`` that removes a resume source's publication) may lower a count, which Prometheus reads
as a counter reset.  Read-only.

Every label value comes from a bounded set, since the records are the user's to write: a
verdict no CessationSignal gives is counted as ``other``, a cause is one of
:data:`goodput.CAUSES`, a hold's age one of :data:`HOLD_AGES`, and clusters are the names the
supervisor writes (letters, digits, ``-_.``), at most :data:`MAX_CLUSTERS` of them (more is
an error of that user's, named: a home shared by that many clusters is not a real one).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import DispatchError
from . import events, goodput, heartbeat, record, sbatch_words, status

VERDICTS = ("ceased", "not ceased", "error")  # what holds.ask records; anything else: other
MAX_CLUSTERS = 64
# A standing hold's age, by its upper bound in seconds (the last: older than every bound).
HOLD_AGES = (("1h", 3600.0), ("6h", 6 * 3600.0), ("24h", 24 * 3600.0), ("more", float("inf")))


def _age_label(age: float) -> str:
    return next(name for name, bound in HOLD_AGES if age < bound)


def _summary() -> dict[str, float]:
    return {"sum": 0.0, "count": 0}


def job_costs(home: str, now: float) -> dict[str, Any]:
    """What the restarts of the jobs under ``home`` cost, summed over the jobs (run as
    their user; one job whose record cannot be read is named in ``errors``, the rest are
    counted)."""
    costs: dict[str, Any] = {
        "restarts": {cause: 0 for cause in goodput.CAUSES},
        "allocated": 0.0,
        "lost": 0.0,
        "redone": 0,
        "restore": _summary(),
        "save_latency": _summary(),
        "to_ceased": _summary(),
        "stopped_no_progress": 0,
        "progress_age": None,
        "hold_ages": {name: 0 for name, _ in HOLD_AGES},
        "next_deadline": None,
        "active": 0,
    }
    errors: list[str] = []
    for job in record.all_jobs(home):
        try:
            # The publications status figured from: every root's, each task's of a %a root.
            found: list[goodput.Mark] = []
            got = goodput.figures(status.collect(job, {}, marks=found), found, now)
            history = job.history()
        except (DispatchError, OSError, ValueError) as exc:
            errors.append(f"{job.id}: {exc}")
            continue
        _add_job(costs, got, now)
        tasks = sbatch_words.array_tasks(job)
        lines = [history.lineage(t) for t in tasks] if tasks else [history.lineage()]
        costs["active"] += sum(1 for line in lines if not line.settled)
        for line in lines:
            if line.stopped is not None:  # --max-no-progress: restarts stopped, standing
                costs["stopped_no_progress"] += 1
            hold = line.hold
            if hold is not None:
                costs["hold_ages"][_age_label(max(0.0, now - hold.time))] += 1
                soonest = costs["next_deadline"]
                costs["next_deadline"] = (
                    hold.deadline if soonest is None else min(soonest, hold.deadline)
                )
    if errors:
        costs["errors"] = errors
    return costs


def _add_job(costs: dict[str, Any], got: dict[str, Any], now: float) -> None:
    for cause, count in got["restarts_by_cause"].items():
        costs["restarts"][cause] += count
    costs["allocated"] += got["allocated_s"]
    costs["lost"] += got["lost_s"]
    costs["redone"] += got["redone_steps"]
    for e in got["executions"]:
        if e["restore_s"] is not None:
            costs["restore"]["sum"] += e["restore_s"]
            costs["restore"]["count"] += 1
        if e["save_latency_s"]:
            costs["save_latency"]["sum"] += e["save_latency_s"]["sum"]
            costs["save_latency"]["count"] += e["save_latency_s"]["count"]
        if e["ceased"] is not None and e["ended"] is not None:
            costs["to_ceased"]["sum"] += max(0.0, e["ceased"] - e["ended"])
            costs["to_ceased"]["count"] += 1
        if e["open"]:
            age = max(0.0, now - e["last_progress"])
            costs["progress_age"] = max(costs["progress_age"] or 0.0, age)


def numbers(home: str, warning: float, now: float) -> dict[str, Any]:
    """What the records under ``home`` say (run as their user); JSON-ready."""
    standing = expiring = 0
    answers: dict[str, int] = {}
    for job in record.all_jobs(home):
        history = job.history()
        tasks = sbatch_words.array_tasks(job)
        for line in [history.lineage()] + [history.lineage(t) for t in tasks or []]:
            hold = line.hold
            if hold is not None:
                standing += 1
                expiring += 1 if hold.deadline - now <= warning else 0
        for answer in history.of(events.Cessation):
            verdict = answer.verdict if answer.verdict in VERDICTS else "other"
            answers[verdict] = answers.get(verdict, 0) + 1
    passes = {}
    clusters = []
    for name in sorted(os.listdir(home)):
        if name == heartbeat.PASS_FILE:
            clusters.append("")
        elif name.startswith("supervisor-pass@") and name.endswith(".json"):
            cluster = name[len("supervisor-pass@") : -len(".json")]
            if cluster and heartbeat.path(home, cluster) == os.path.join(home, name):
                clusters.append(cluster)  # a name the supervisor writes, nothing else
    errors = []
    if len(clusters) > MAX_CLUSTERS:
        errors.append(
            f"{len(clusters)} supervisor-pass@<cluster>.json files in {home}, more "
            f"than {MAX_CLUSTERS} clusters: only the first {MAX_CLUSTERS} by name "
            "are read"
        )
    for cluster in clusters[:MAX_CLUSTERS]:
        seen = heartbeat.read(home, cluster or None)
        if seen is not None:
            every = seen.get("every")
            passes[cluster] = {
                "time": seen.get("time"),
                "failures": int(seen.get("failures") or 0),
                # A timer's or scrontab's pass (no --loop) comes every minute.
                "every": float(every) if isinstance(every, (int, float)) and every > 0 else 60.0,
            }
    costs = job_costs(home, now)
    errors += costs.pop("errors", [])
    found: dict[str, Any] = {
        "holds": standing,
        "expiring": expiring,
        "answers": answers,
        "passes": passes,
        "costs": costs,
    }
    if errors:
        found["errors"] = errors
    return found
