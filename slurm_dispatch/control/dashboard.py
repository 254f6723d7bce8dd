"""The numbers of one user's records for a dashboard: ``dispatch-admin metrics`` asks a child
running as the user (:func:`siteview.as_user`) and writes every user's into node_exporter's
textfile format (:mod:`slurm_dispatch.node.metrics`).

Per user: the standing shared-checkpoint holds and those expiring within ``HoldWarning``, the
CessationSignal's answers the records hold, by verdict (``ceased``, ``not ceased``,
``error``: a counter, since records only grow until ``dispatch forget``), and per cluster
the supervisor's last good pass and how many passes have failed since (its heartbeat).
Read-only.
"""

from __future__ import annotations

import os
from typing import Any

from . import events, heartbeat, record, submit


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
            answers[answer.verdict] = answers.get(answer.verdict, 0) + 1
    passes = {}
    for name in sorted(os.listdir(home)):
        if name == heartbeat.PASS_FILE:
            cluster = ""
        elif name.startswith("supervisor-pass@") and name.endswith(".json"):
            cluster = name[len("supervisor-pass@"):-len(".json")]
        else:
            continue
        seen = heartbeat.read(home, cluster or None)
        if seen is not None:
            passes[cluster] = {"time": seen.get("time"),
                               "failures": int(seen.get("failures") or 0)}
    return {"holds": standing, "expiring": expiring, "answers": answers, "passes": passes}
