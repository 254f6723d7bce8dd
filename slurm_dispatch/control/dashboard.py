"""The numbers of one user's records for a dashboard: ``dispatch-admin metrics`` asks a child
running as the user (:func:`siteview.as_user`) and writes every user's into node_exporter's
textfile format (:mod:`slurm_dispatch.node.metrics`).

Per user: the standing shared-checkpoint holds and those expiring within ``HoldWarning``, the
CessationSignal's answers the records hold, by verdict (``ceased``, ``not ceased``,
``error``: a counter, since records only grow until ``dispatch forget``), and per cluster
the supervisor's last good pass and how many passes have failed since (its heartbeat).
Read-only.

Every label value comes from a bounded set, since the records are the user's to write: a
verdict no CessationSignal gives is counted as ``other``, and clusters are the names the
supervisor writes (letters, digits, ``-_.``), at most :data:`MAX_CLUSTERS` of them (more is
an error of that user's, named: a home shared by that many clusters is not a real one).
"""

from __future__ import annotations

import os
from typing import Any

from . import events, heartbeat, record, submit

VERDICTS = ("ceased", "not ceased", "error")  # what holds.ask records; anything else: other
MAX_CLUSTERS = 64


def numbers(home: str, warning: float, now: float) -> dict[str, Any]:
    """What the records under ``home`` say (run as their user); JSON-ready."""
    standing = expiring = 0
    answers: dict[str, int] = {}
    for job in record.all_jobs(home):
        history = job.history()
        tasks = submit.array_tasks(job)
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
            cluster = name[len("supervisor-pass@"):-len(".json")]
            if cluster and heartbeat.path(home, cluster) == os.path.join(home, name):
                clusters.append(cluster)  # a name the supervisor writes, nothing else
    errors = []
    if len(clusters) > MAX_CLUSTERS:
        errors.append(f"{len(clusters)} supervisor-pass@<cluster>.json files in {home}, more "
                      f"than {MAX_CLUSTERS} clusters: only the first {MAX_CLUSTERS} by name "
                      "are read")
    for cluster in clusters[:MAX_CLUSTERS]:
        seen = heartbeat.read(home, cluster or None)
        if seen is not None:
            passes[cluster] = {"time": seen.get("time"),
                               "failures": int(seen.get("failures") or 0)}
    found: dict[str, Any] = {"holds": standing, "expiring": expiring, "answers": answers,
                             "passes": passes}
    if errors:
        found["errors"] = errors
    return found
