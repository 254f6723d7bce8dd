"""``dispatch status --timeline``: a dispatch job's executions as bars over time.

One row per execution (submission, restart, node), drawn over the same time axis::

    =====   running (start to the end Slurm or the hooks recorded)
    ~~~~~   ended, processes not yet proven gone (the overlap a replacement must survive)
    |       proven ceased (the node's post-kill record, a re-check or a reboot)
    *       a publication of this execution's (its pub/ entry's time)
    ....    a hold, from the moment it was made to its release or expiry

and, below the legend, what each execution resumed from (``S1 R1 resumed from S1 R0
checkpoint-500``, or ``started fresh``).

The execution whose publication is the latest gets ``<- latest``: the lineage that won.
:func:`render` is pure over its inputs (the status data and the publications with their times):
ASCII only, so it reads the same on a terminal, in a log or in a mail; it fits ``width``
columns, each line one line (a save a user named with a line break or a terminal escape is
shown escaped, as status's cells are).  :func:`marks` reads the publications (names and
pub/ entry times, never a save), as :mod:`slurm_dispatch.control.goodput` does for the
figures.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .. import _clock
from .._table import one_line
from ..slurm.jobs import is_running
from . import status_text
from .goodput import Mark, ceased_at, ended_at, marks

__all__ = ["LABEL", "Mark", "marks", "render"]

LABEL = 16


def render(
    data: dict[str, Any], marks: list[Mark], width: int = 80, now: Optional[float] = None
) -> str:
    """The timeline of the status ``data`` (:func:`slurm_dispatch.control.status.collect`)."""
    now = time.time() if now is None else now
    executions = sorted(data.get("executions") or [], key=lambda e: e.get("started") or 0)
    holds = [e for e in data.get("events") or [] if e.get("event") == "hold"]
    if not executions and not holds:
        return f"Dispatch job {data.get('id')}: no execution has started yet"
    moments = [float(e["started"]) for e in executions if e.get("started")]
    moments += [m.time for m in marks] + [float(h["time"]) for h in holds if h.get("time")]
    for e in executions:
        moments += [t for t in (ended_at(e), ceased_at(e)) if t is not None]
    first = min(moments)
    last = max([*moments, now if any(_open(e) for e in executions) else first])
    span = max(last - first, 1.0)
    bar = max(width - LABEL - 11, 20)

    def column(moment: float) -> int:
        return min(bar - 1, max(0, int((moment - first) / span * (bar - 1) + 0.5)))

    lines = [
        f"Dispatch job {data.get('id')}: {len(executions)} execution(s), "
        f"{_clock.instant(first)} to {_clock.instant(last)[11:]} "
        f"({_clock.duration(span)})"
    ]
    for e in executions:
        cells = [" "] * bar
        start = column(float(e.get("started") or first))
        end_t = ended_at(e)
        ceased = ceased_at(e)
        stop = column(now) if _open(e) or end_t is None else column(end_t)
        for i in range(start, stop + 1):
            cells[i] = "="
        if end_t is not None and not _open(e):
            proven = column(ceased) if ceased is not None else column(last)
            for i in range(stop + 1, proven + 1):
                cells[i] = "~"
            if ceased is not None:
                cells[proven] = "|"
        mine = [
            m
            for m in marks
            if e.get("exec_dir") and m.path.startswith(str(e["exec_dir"]).rstrip("/") + "/")
        ]
        for m in mine:
            cells[column(m.time)] = "*"
        label = f"{status_text.execution_label(e)} {e.get('node') or '?'}"[: LABEL - 1]
        state = str(e.get("state") or "").split(" ")[0]
        note = "<- latest" if any(m.latest for m in mine) else state[:10]
        lines.append(f"{label:<{LABEL}}{''.join(cells)} {note}".rstrip())
    for hold in holds:
        cells = [" "] * bar
        made = column(float(hold.get("time") or first))
        lifted = [
            e
            for e in data.get("events") or []
            if e.get("event") in ("released", "expired")
            and str(e.get("slurm_job_id")) == str(hold.get("slurm_job_id"))
        ]
        until = column(float(lifted[0]["time"])) if lifted else column(now)
        for i in range(made, until + 1):
            cells[i] = "."
        how = lifted[0]["event"] if lifted else "holding"
        label = f"hold S{hold.get('submission')}"[: LABEL - 1]
        lines.append(f"{label:<{LABEL}}{''.join(cells)} {how}".rstrip())
    lines.append("= running  ~ ended, not proven gone  | ceased  * published  . held")
    # Where each execution started from: the lineage a replacement took up.
    root = str(data.get("checkpoint") or "")
    for e in executions:
        source = status_text.resumed_text(e, executions, root)
        lines.append(
            f"{status_text.execution_label(e)} "
            + (f"started {source}" if source.split(" ")[0] == "fresh" else f"resumed from {source}")
        )
    # A save or job name a user chose may hold a line break or a terminal escape: each line is
    # one line (escaped as status's cells are), then cut to the width.
    return "\n".join(one_line(line)[:width] for line in lines)


def _open(execution: dict[str, Any]) -> bool:
    return is_running(str(execution.get("state") or ""))
