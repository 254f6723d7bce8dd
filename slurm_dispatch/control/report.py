"""``dispatch report JOB``: a dispatch job's life as one self-contained page.

The page is HTML with an inline SVG and an inline style sheet: no network, no script, no font
or image from elsewhere, so it opens from a cluster's shared folder in any browser and reads
the same printed.  It draws, over one time axis:

* a lane per execution and node (the nodes its hooks recorded, else the node its launcher ran
  on): **running** from the allocation to the end Slurm recorded (or now);
* **ended, not proven gone**: from that end to the node's proof of cessation, or to the
  page's right edge where there is none (the overlap a replacement had to survive);
* **ceased**: the moment the node was proven free of it;
* **published**: each publication of the execution at its pub/ entry's time, its step beside
  it where there is room (always in its tooltip); the lineage's latest is ringed;
* **redone**: the part of a run after the save its successor resumed from to its last sign of
  work (Slurm's end, or a later publication of a run cut off): work done again;
* a lane per hold, from the hold to its release or expiry (or now);

with a legend, the goodput figures (:mod:`slurm_dispatch.control.goodput`) beside it, and a
table per execution.

Invariants: :func:`render` is pure over the status data (whose ``goodput`` it shows), the
publications and ``now``; every shape sits where :func:`layout` puts it (``x`` from a moment,
``y`` from a lane), and carries ``data-kind`` and ``data-lane`` so a reader can find it; every
text from a record is escaped.  Fifty executions are fifty lanes of fixed height: the page
grows down, never crowds, and a publication's step label is left out (kept in its tooltip)
where it would overlap the previous one of its lane.
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import _clock
from ..slurm.jobs import is_running
from . import status_text
from .goodput import Mark, ceased_at, ended_at, owned

__all__ = ["COLOURS", "Drawing", "layout", "render"]

# Geometry of the SVG, in CSS pixels.
LEFT, RIGHT, TOP, LANE, BAR, AXIS = 190, 30, 34, 24, 12, 26
# One colour per kind of mark (the legend's order).
COLOURS = {
    "running": "#2f6fb0",
    "overlap": "#f0a030",
    "redone": "#d0403a",
    "ceased": "#111111",
    "published": "#2e9e4f",
    "hold": "#8c8c8c",
}
_LEGEND = {
    "running": "running (allocation to Slurm's end)",
    "overlap": "ended, processes not yet proven gone",
    "redone": "work its successor did again",
    "ceased": "proven ceased",
    "published": "a publication (ringed: the latest)",
    "hold": "held for a person",
}
_TICKS = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)


@dataclass
class Lane:
    """One row: an execution on one node, or a hold."""

    label: str
    kind: str  # "execution" or "hold"
    y: float
    start: float
    end: Optional[float]  # running until (an execution) or held until (a hold); None: now
    open: bool = False
    ceased: Optional[float] = None
    redone_from: Optional[float] = None
    marks: list[Mark] = field(default_factory=list)
    note: str = ""


@dataclass
class Drawing:
    """Where everything goes: the time axis and the lanes."""

    first: float
    last: float
    width: int
    lanes: list[Lane]

    @property
    def plot(self) -> int:
        return self.width - LEFT - RIGHT

    def x(self, moment: float) -> float:
        """The horizontal position of a moment."""
        span = max(self.last - self.first, 1.0)
        return LEFT + (min(max(moment, self.first), self.last) - self.first) / span * self.plot

    @property
    def height(self) -> int:
        return int(TOP + LANE * len(self.lanes) + AXIS + 8)


def _node_facts(execution: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The nodes the hooks recorded for the execution: node -> {start, end, ceased}."""
    out: dict[str, dict[str, Any]] = {}
    for fact in execution.get("facts") or []:
        nodes = fact.get("nodes") if isinstance(fact, dict) else None
        if not isinstance(nodes, dict):
            continue
        for node, seen in nodes.items():
            if not isinstance(seen, dict):
                continue
            moments = {}
            for key in ("start", "end", "recheck"):
                one = seen.get(key)
                if isinstance(one, dict) and isinstance(one.get("time"), (int, float)):
                    moments[key] = float(one["time"])
            ceased = None
            if seen.get("ceased") is True:
                ceased = moments.get("recheck", moments.get("end"))
            out[str(node)] = {**moments, "ceased": ceased}
    return out


def _taken_at(
    execution: dict[str, Any],
    successor: dict[str, Any],
    own: list[Mark],
    figures: dict[tuple[Any, Any, str], dict[str, Any]],
    started: float,
) -> float:
    """When ``execution`` published the save its ``successor`` loaded (everything after it
    was done again), or its start where the successor took up nothing of it."""
    source = str(successor.get("loaded", successor.get("resume_from")) or "")
    folder = str(execution.get("exec_dir") or "").rstrip("/") + "/"
    if not folder.strip("/") or not source.startswith(folder):
        return started
    by_path = [m for m in own if m.path == source]
    if not by_path:
        figure = (
            figures.get(
                (
                    successor.get("submission"),
                    successor.get("restart"),
                    successor.get("array_task_id") or "",
                )
            )
            or {}
        )
        by_path = [m for m in own if m.step == figure.get("resumed_step")]
    return max((m.time for m in by_path), default=started)


def layout(
    data: dict[str, Any], marks: list[Mark], now: Optional[float] = None, width: int = 1100
) -> Drawing:
    """The lanes of the job the status ``data`` describes, with ``marks`` its publications."""
    now = time.time() if now is None else now
    executions = sorted(data.get("executions") or [], key=lambda e: e.get("started") or 0)
    figures = {
        (f.get("submission"), f.get("restart"), f.get("array_task_id") or ""): f
        for f in (data.get("goodput") or {}).get("executions") or []
    }
    lanes: list[Lane] = []
    folders = owned(executions, marks)
    # Each execution's successor in its lineage (the next one of its array task).
    successors: list[Optional[dict[str, Any]]] = [None] * len(executions)
    after: dict[str, dict[str, Any]] = {}
    for i in range(len(executions) - 1, -1, -1):
        task = executions[i].get("array_task_id") or ""
        successors[i] = after.get(task)
        after[task] = executions[i]
    for i, e in enumerate(executions):
        own = folders.get(str(e.get("exec_dir") or "").rstrip("/"), [])
        figure = (
            figures.get((e.get("submission"), e.get("restart"), e.get("array_task_id") or "")) or {}
        )
        started = float(figure.get("allocated") or e.get("started") or now)
        running = is_running(str(e.get("state") or ""))
        end = ended_at(e)
        if end is None and not running:
            end = figure.get("ended")
        # The part of this run after the save its successor took up: done again.
        redone_from = None
        successor = successors[i]
        if successor is not None:
            redone_from = _taken_at(e, successor, own, figures, started)
        label = status_text.execution_label(e)
        nodes = _node_facts(e)
        if not nodes:
            nodes = {str(e.get("node") or "?"): {"ceased": ceased_at(e)}}
        for node, seen in sorted(nodes.items()):
            # Slurm's end (the controller's record) where there is one: a cut-off node's own
            # end record comes only when it rejoins, after the overlap.
            node_end = end if end is not None else seen.get("end")
            lanes.append(
                Lane(
                    label=f"{label} {node}",
                    kind="execution",
                    y=0.0,
                    start=min(seen.get("start", started), started),
                    end=node_end,
                    open=running and node_end is None,
                    ceased=seen.get("ceased"),
                    redone_from=redone_from,
                    marks=own,
                    note=str(e.get("state") or "").split(" ")[0],
                )
            )
    events = data.get("events") or []
    for hold in (h for h in events if h.get("event") == "hold"):
        lifted = [
            x
            for x in events
            if x.get("event") in ("released", "expired")
            and str(x.get("slurm_job_id")) == str(hold.get("slurm_job_id"))
        ]
        lanes.append(
            Lane(
                label=f"hold S{hold.get('submission')}",
                kind="hold",
                y=0.0,
                start=float(hold.get("time") or now),
                end=float(lifted[0]["time"]) if lifted else None,
                open=not lifted,
                note=lifted[0]["event"] if lifted else "holding",
            )
        )
    for n, lane in enumerate(lanes):
        lane.y = TOP + LANE * n + LANE / 2
    moments = [lane.start for lane in lanes] + [m.time for m in marks]
    for lane in lanes:
        moments += [t for t in (lane.end, lane.ceased) if t is not None]
    first = min(moments, default=now)
    last = max([*moments, now if any(lane.open for lane in lanes) else first])
    # A little room on the right for what is not proven yet.
    return Drawing(first, last + max(last - first, 1.0) * 0.02, width, lanes)


def _ticks(view: Drawing) -> list[float]:
    """At most nine moments to mark on the axis (none where a moment is no finite number)."""
    if not (math.isfinite(view.first) and math.isfinite(view.last)):
        return []
    span = max(view.last - view.first, 1.0)
    # Past a week per tick (a hand-edited time far off): as many weeks as keep it to nine.
    step = next((s for s in _TICKS if span / s <= 8), _TICKS[-1] * math.ceil(span / 8 / _TICKS[-1]))
    first = (int(view.first) // step + 1) * step
    return [float(t) for t in range(first, int(view.last) + 1, step)]


def _instant(moment: Optional[float]) -> str:
    """A moment as _clock shows it; ``?`` for one no clock reads (a hand-edited 1e300)."""
    try:
        return _clock.instant(moment) if moment is not None else "?"
    except (OverflowError, OSError, ValueError):
        return "?"


def _tick_text(moment: float, step_hint: float) -> str:
    shown = _instant(moment)
    return shown[11:] if step_hint < 86400 else shown[:16].replace("T", " ")


def _rect(
    kind: str, lane: int, x0: float, x1: float, y: float, h: float, title: str, extra: str = ""
) -> str:
    return (
        f'<rect data-kind="{kind}" data-lane="{lane}" x="{x0:.1f}" y="{y - h / 2:.1f}" '
        f'width="{max(x1 - x0, 2.0):.1f}" height="{h:.1f}" fill="{COLOURS[kind]}"{extra}>'
        f"<title>{html.escape(title)}</title></rect>"
    )


def _svg(view: Drawing, now: float) -> str:
    e = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{view.width}" '
        f'height="{view.height}" viewBox="0 0 {view.width} {view.height}" role="img" '
        'aria-label="the job over time">'
    ]
    axis_y = TOP + LANE * len(view.lanes) + 4
    ticks = _ticks(view)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 60.0
    for t in ticks:
        x = view.x(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{axis_y}" class="grid"/>')
        out.append(
            f'<text x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle" class="tick">'
            f"{e(_tick_text(t, step))}</text>"
        )
    for n, lane in enumerate(view.lanes):
        y = lane.y
        if n % 2:
            out.append(
                f'<rect x="0" y="{y - LANE / 2:.1f}" width="{view.width}" '
                f'height="{LANE}" class="band"/>'
            )
        out.append(f'<text x="8" y="{y + 4:.1f}" class="label">{e(lane.label)}</text>')
        x0 = view.x(lane.start)
        until = lane.end if lane.end is not None else (now if lane.open else view.last)
        x1 = view.x(until)
        if lane.kind == "hold":
            out.append(
                _rect(
                    "hold",
                    n,
                    x0,
                    x1,
                    y,
                    BAR * 0.6,
                    f"{lane.label}: {_instant(lane.start)} to "
                    f"{_instant(lane.end) if lane.end else 'now'} ({lane.note})",
                )
            )
            continue
        out.append(
            _rect(
                "running",
                n,
                x0,
                x1,
                y,
                BAR,
                f"{lane.label}: running {_instant(lane.start)} to "
                f"{_instant(lane.end) if lane.end else 'now'}",
            )
        )
        # Done again: from the save its successor took up to the run's last sign of work
        # (Slurm's end, or a later publication of a cut-off run).
        redone_to = max([m.time for m in lane.marks] + [lane.end or 0.0])
        if lane.redone_from is not None and lane.end is not None and lane.redone_from < redone_to:
            out.append(
                _rect(
                    "redone",
                    n,
                    view.x(lane.redone_from),
                    view.x(redone_to),
                    y,
                    BAR,
                    f"{lane.label}: done again by its successor after {_instant(lane.redone_from)}",
                )
            )
        if lane.end is not None and not lane.open:
            proven = lane.ceased if lane.ceased is not None else view.last
            if proven > lane.end:
                out.append(
                    _rect(
                        "overlap",
                        n,
                        x1,
                        view.x(proven),
                        y,
                        BAR * 0.5,
                        f"{lane.label}: ended {_instant(lane.end)}, "
                        + (
                            f"proven ceased {_instant(lane.ceased)}"
                            if lane.ceased is not None
                            else "not proven gone"
                        ),
                    )
                )
            if lane.ceased is not None:
                xc = view.x(lane.ceased)
                out.append(
                    f'<rect data-kind="ceased" data-lane="{n}" x="{xc - 1.5:.1f}" '
                    f'y="{y - BAR:.1f}" width="3" height="{BAR * 2}" '
                    f'fill="{COLOURS["ceased"]}"><title>{e(lane.label)}: proven ceased '
                    f"{e(_instant(lane.ceased))}</title></rect>"
                )
        labelled = -1e9
        for m in sorted(lane.marks, key=lambda m: m.time):
            xm = view.x(m.time)
            ring = ' stroke="#d4a017" stroke-width="3"' if m.latest else ""
            out.append(
                f'<circle data-kind="published" data-lane="{n}" data-step="{m.step}" '
                f'cx="{xm:.1f}" cy="{y:.1f}" r="5" fill="{COLOURS["published"]}"{ring}>'
                f"<title>{e(lane.label)}: step {m.step} published "
                f"{e(_instant(m.time))} ({e(m.path)})</title></circle>"
            )
            if xm - labelled >= 34:
                out.append(
                    f'<text x="{xm:.1f}" y="{y - 8:.1f}" text-anchor="middle" '
                    f'class="step">{m.step}</text>'
                )
                labelled = xm
        out.append(
            f'<text x="{view.width - RIGHT + 4}" y="{y + 4:.1f}" class="note">'
            f"{'★' if any(m.latest for m in lane.marks) else ''}</text>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _legend() -> str:
    items = []
    for kind, text in _LEGEND.items():
        items.append(
            f'<li><svg width="22" height="12" aria-hidden="true"><rect x="0" y="1" '
            f'width="22" height="10" fill="{COLOURS[kind]}"/></svg> '
            f"{html.escape(text)}</li>"
        )
    return '<ul class="legend">' + "".join(items) + "</ul>"


def _seconds(value: Any) -> str:
    return (
        "-"
        if not isinstance(value, (int, float))
        else _clock.duration(float(value))
        if value >= 60
        else f"{value:.1f} s"
    )


def _cell(value: Any) -> str:
    return "-" if value is None else html.escape(str(value))


def _summary(figures: dict[str, Any]) -> str:
    causes = (
        ", ".join(
            f"{cause} {count}"
            for cause, count in (figures.get("restarts_by_cause") or {}).items()
            if count
        )
        or "none"
    )
    share = figures.get("goodput")
    rows = [
        ("Goodput", "-" if share is None else f"{share * 100:.1f}% of the allocations' time kept"),
        ("Restarts", f"{figures.get('restarts', 0)} ({causes})"),
        ("Allocated", _seconds(figures.get("allocated_s"))),
        ("Lost", _seconds(figures.get("lost_s"))),
        ("Steps redone", _cell(figures.get("redone_steps"))),
        (
            "Waited (of it held)",
            f"{_seconds(figures.get('waited_s'))} ({_seconds(figures.get('held_s'))})",
        ),
    ]
    return (
        '<table class="summary">'
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def _executions_table(data: dict[str, Any]) -> str:
    figures = (data.get("goodput") or {}).get("executions") or []
    head = [
        "execution",
        "node",
        "allocated",
        "waited",
        "held",
        "resumed at",
        "redone",
        "restore",
        "first save",
        "save latency",
        "ended by",
        "lost",
    ]
    rows = []
    for f in figures:
        latency = f.get("save_latency_s") or {}
        rows.append(
            [
                status_text.execution_label(f),
                _cell(f.get("node")),
                html.escape(_instant(f["allocated"])) if f.get("allocated") else "-",
                _seconds(f.get("waited_s")),
                _seconds(f.get("held_s")),
                _cell(f.get("resumed_step")),
                _cell(f.get("redone_steps")),
                _seconds(f.get("restore_s")),
                _seconds(f.get("first_save_s")),
                _seconds(latency.get("median")),
                _cell(f.get("cause")),
                _seconds(f.get("lost_s")),
            ]
        )
    return (
        '<table class="executions"><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
        + "</table>"
    )


_STYLE = """
body { font: 14px/1.4 "DejaVu Sans", "Helvetica Neue", Arial, sans-serif; margin: 24px;
       color: #1a1a1a; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
p.meta { color: #555; margin: 0 0 16px; }
table { border-collapse: collapse; margin: 12px 0; }
th, td { text-align: left; padding: 2px 10px 2px 0; vertical-align: top; }
table.executions th { border-bottom: 1px solid #999; }
table.executions td { font-variant-numeric: tabular-nums; }
ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 4px 20px; }
svg text.label, svg text.note { font: 12px "DejaVu Sans Mono", monospace; fill: #1a1a1a; }
svg text.tick, svg text.step { font: 11px "DejaVu Sans", sans-serif; fill: #444; }
svg line.grid { stroke: #ddd; stroke-width: 1; }
svg rect.band { fill: #f6f6f6; }
.scroll { overflow-x: auto; }
"""


def render(
    data: dict[str, Any], marks: list[Mark], now: Optional[float] = None, width: int = 1100
) -> str:
    """The page for the status ``data`` (:func:`slurm_dispatch.control.status.collect`, with
    its ``goodput``) and ``marks`` (:func:`slurm_dispatch.control.goodput.marks`)."""
    now = time.time() if now is None else now
    e = html.escape
    view = layout(data, marks, now, width)
    executions = sorted(data.get("executions") or [], key=lambda x: x.get("started") or 0)
    root = str(data.get("checkpoint") or "")
    lineage = "".join(
        f"<li>{e(status_text.execution_label(x))} "
        + e(
            (
                "started "
                if status_text.resumed_text(x, executions, root).startswith("fresh")
                else "resumed from "
            )
            + status_text.resumed_text(x, executions, root)
        )
        + "</li>"
        for x in executions
    )
    title = f"Dispatch job {data.get('id')}"
    meta = " · ".join(
        e(str(v))
        for v in (
            data.get("script"),
            data.get("cluster"),
            data.get("checkpoint"),
            data.get("state"),
        )
        if v
    )
    body = (
        f'<h1>{e(title)}</h1><p class="meta">{meta}<br>made '
        f"{e(_clock.with_zone(now))} by dispatch report; times are in that zone</p>"
        + _summary(data.get("goodput") or {})
        + _legend()
        + (
            f'<div class="scroll">{_svg(view, now)}</div>'
            if view.lanes
            else "<p>No execution has started yet.</p>"
        )
        + "<h2>Executions</h2>"
        + _executions_table(data)
        + f"<h2>Where each started from</h2><ul>{lineage}</ul>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>{body}</body>"
        "</html>\n"
    )
