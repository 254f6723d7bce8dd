"""``dispatch report``: a job's life as one self-contained page (docs/user-guide.md).  The shapes
are read back from the page itself (an HTML parser, as a browser would) and compared with the
moments the recorded history holds; test_report_browser.py renders it in a real browser."""

from __future__ import annotations

import dataclasses
import json
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import goodput, report, status

from .test_goodput import HELD, PARTITION, PARTITION_MARKS, T0, job, mark  # noqa: F401


class Shapes(HTMLParser):
    """Every SVG shape with a data-kind, and whether the page asks the network or a script."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[dict[str, str]] = []
        self.external: list[str] = []
        self.scripts = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if "data-kind" in found:
            self.shapes.append({"tag": tag, **found})
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if key in found:
                self.external.append(found[key])

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def shapes(page: str) -> Shapes:
    parsed = Shapes()
    parsed.feed(page)
    return parsed


def with_figures(data: dict, marks: list, now: float) -> dict:
    return {**data, "goodput": goodput.figures(data, marks, now)}


def of(found: Shapes, kind: str, lane: int) -> list[dict[str, str]]:
    return [s for s in found.shapes if s["data-kind"] == kind and s["data-lane"] == str(lane)]


def spans(shape: dict[str, str]) -> tuple[float, float]:
    return float(shape["x"]), float(shape["x"]) + float(shape["width"])


MARKS = [*PARTITION_MARKS[:-1], dataclasses.replace(PARTITION_MARKS[-1], latest=True)]


def test_shapes_sit_where_the_records_put_them() -> None:
    now = T0 + 2000
    data = with_figures(PARTITION, MARKS, now)
    page = report.render(data, MARKS, now=now)
    view = report.layout(data, MARKS, now=now)
    found = shapes(page)
    assert [lane.label for lane in view.lanes] == ["S1 R0 n1", "S1 R1 n2", "S1 R2 n3"]
    # R0 ran from its allocation (-2) to Slurm's end (+350); its node proved it gone only at
    # the heal (+600): the overlap its replacement survived runs from +350 to +600.
    (run,) = of(found, "running", 0)
    assert spans(run) == pytest.approx((view.x(T0 - 2), view.x(T0 + 350)), abs=0.11)
    (overlap,) = of(found, "overlap", 0)
    assert spans(overlap) == pytest.approx((view.x(T0 + 350), view.x(T0 + 600)), abs=0.11)
    (ceased,) = of(found, "ceased", 0)
    assert float(ceased["x"]) + 1.5 == pytest.approx(view.x(T0 + 600), abs=0.11)
    # R1 resumed from R0's step 30 (+300): R0's run after it was done again, to its last
    # publication (+500, step 50), made while cut off.
    (redone,) = of(found, "redone", 0)
    assert spans(redone) == pytest.approx((view.x(T0 + 300), view.x(T0 + 500)), abs=0.11)
    # R0's five publications at their pub/ entries' times, two of them after Slurm's end.
    dots = of(found, "published", 0)
    assert [(d["data-step"], float(d["cx"])) for d in dots] == [
        (str(s), pytest.approx(view.x(T0 + 100 * s / 10), abs=0.11)) for s in (10, 20, 30, 40, 50)
    ]
    # The last execution completed: nothing of it was redone; its latest save is ringed.
    assert of(found, "redone", 2) == []
    assert [d["data-step"] for d in of(found, "published", 2) if "stroke" in d] == ["70"]
    # Its goodput beside it: two restarts, by cause.
    text = " ".join(found.text)
    assert "node failure 1" in text and "preempted 1" in text and "80.9%" in text


def test_a_hold_and_its_release_have_a_lane() -> None:
    marks = [mark(101, "A", 10), mark(952, "B", 20)]
    now = T0 + 1052
    data = with_figures(HELD, marks, now)
    view = report.layout(data, marks, now=now)
    found = shapes(report.render(data, marks, now=now))
    assert [lane.label for lane in view.lanes][-1] == "hold S2"
    (held,) = of(found, "hold", len(view.lanes) - 1)
    assert spans(held) == pytest.approx((view.x(T0 + 230), view.x(T0 + 830)), abs=0.11)
    # The running execution runs to now; nothing of it is redone or ended.
    (run,) = of(found, "running", 1)
    assert spans(run)[1] == pytest.approx(view.x(now), abs=0.11)
    assert of(found, "overlap", 1) == []


def test_the_page_needs_nothing_else_and_escapes_what_a_record_holds() -> None:
    hostile = json.loads(json.dumps(PARTITION))
    hostile["id"] = "<script>alert(1)</script>"
    hostile["executions"][0]["node"] = '"><img src=x onerror=alert(1)>'
    hostile["executions"][0]["facts"] = []
    page = report.render(with_figures(hostile, [], T0 + 2000), [], now=T0 + 2000)
    found = shapes(page)
    assert found.scripts == 0 and found.external == []
    assert "<script>alert" not in page and "<img" not in page


def test_fifty_executions_render_fast_and_stay_readable() -> None:
    executions, marks = [], []
    for r in range(50):
        start = T0 + 600 * r
        executions.append(
            {
                "submission": 1,
                "restart": r,
                "node": f"n{r % 7}",
                "started": start,
                "state": "REQUEUED" if r < 49 else "RUNNING",
                "exec_dir": f"/ck/exec/a{r}",
                "resume_from": f"/ck/exec/a{r - 1}/checkpoint-{r * 100 - 20}" if r else "",
                "facts": []
                if r == 49
                else [
                    {
                        "restart": r,
                        "end": {"time": start + 580},
                        "controller": {"start": {"time": start}, "end": {"time": start + 580}},
                        "nodes": {
                            f"n{r % 7}": {
                                "start": {"time": start},
                                "end": {"time": start + 581},
                                "ceased": True,
                            }
                        },
                    }
                ],
            }
        )
        marks += [mark(600 * r + 100 * k, f"a{r}", r * 100 + 20 * k - 20) for k in (1, 2, 3, 4, 5)]
    data = {
        "id": "dmany",
        "checkpoint": "/ck",
        "submissions": [],
        "events": [],
        "executions": executions,
    }
    now = T0 + 600 * 50
    started = time.perf_counter()
    page = report.render(with_figures(data, marks, now), marks, now=now)
    took = time.perf_counter() - started
    assert took < 1.0, f"{took:.2f} s"
    view = report.layout(data, marks, now=now)
    # A lane each, of fixed height: the page grows down.
    assert len(view.lanes) == 50 and view.height >= 50 * report.LANE
    found = shapes(page)
    assert len([s for s in found.shapes if s["data-kind"] == "published"]) == 250


def test_dispatch_report_writes_the_page(
    job,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    monkeypatch.setattr("slurm_dispatch.slurm.adapter.Slurm.own_jobs", lambda self, **kw: {})
    target = tmp_path / "out" / "job.html"
    result = CliRunner().invoke(cli.main, ["report", job.id, "-o", str(target)])
    assert result.exit_code != 0 and str(target) in result.output  # no such folder: named
    target.parent.mkdir()
    result = CliRunner().invoke(cli.main, ["report", job.id, "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert "2 execution(s)" in result.output
    found = shapes(target.read_text())
    assert len([s for s in found.shapes if s["data-kind"] == "published"]) == 2
    assert [p.name for p in target.parent.iterdir()] == ["job.html"]  # no temporary left
    result = CliRunner().invoke(cli.main, ["report", job.id, "-o", "-"])
    assert result.exit_code == 0 and result.output.startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("where", ["hold", "end", "publication"])
def test_a_time_edited_far_off_renders_at_once(where: str) -> None:
    """A record edited by hand with a time the schema takes (any number: 1e300, a year
    past 9999) drew an axis of one tick a week to it: the page never came (a hang), and no
    clock reads such a moment.  The axis keeps at most nine ticks; such a time reads '?'."""
    data = json.loads(json.dumps(PARTITION))
    found_marks = list(PARTITION_MARKS)
    if where == "hold":
        data["events"].append(
            {"event": "hold", "time": 1e300, "submission": 1, "slurm_job_id": "7"}
        )
    elif where == "end":
        data["executions"][1]["facts"][0]["end"] = {"time": 1e300}
    else:
        found_marks.append(dataclasses.replace(PARTITION_MARKS[0], time=1e18))
    now = T0 + 2000
    started = time.perf_counter()
    page = report.render(with_figures(data, found_marks, now), found_marks, now=now)
    assert time.perf_counter() - started < 2.0
    view = report.layout(data, found_marks, now=now)
    assert len(report._ticks(view)) <= 9
    assert "step 10 published" in page


def test_an_array_of_thousands_of_tasks_is_figured_and_drawn_in_linear_time() -> None:
    """Each task's lineage took every execution, event and publication of the job again (and
    the page each execution's publications and successor likewise): 1000 tasks of 5
    publications took 3.2 s to figure and 1.7 s to draw, 4000 ten times that, for each
    dispatch status and report.  Now one pass groups them."""
    executions, marks, events = [], [], []
    for t in range(2000):
        executions.append(
            {
                "submission": 1,
                "restart": 0,
                "node": "n1",
                "started": T0 + t,
                "state": "COMPLETED",
                "exec_dir": f"/ck/exec/t{t}",
                "resume_from": "",
                "array_task_id": str(t),
                "facts": [{"end": {"time": T0 + t + 100}}],
            }
        )
        events.append({"event": "started", "time": T0 + t, "task": t, "submission": 1})
        marks += [
            goodput.Mark(T0 + t + 10 * k, f"/ck/exec/t{t}/checkpoint-{k}", k) for k in range(1, 6)
        ]
    data = {
        "id": "darray",
        "checkpoint": "/ck",
        "events": events,
        "executions": executions,
        "submissions": [{"submission": 1, "task": None, "submitted": T0 - 5}],
    }
    now = T0 + 5000
    started = time.perf_counter()
    page = report.render(with_figures(data, marks, now), marks, now=now)
    took = time.perf_counter() - started
    assert took < 2.0, f"{took:.2f} s"
    figures = goodput.figures(data, marks, now)
    assert figures["restarts"] == 0 and len(figures["executions"]) == 2000
    assert [e["reached_step"] for e in figures["executions"][:3]] == [5, 5, 5]
    assert len([s for s in shapes(page).shapes if s["data-kind"] == "published"]) == 10000


def test_a_root_per_array_task_has_its_publications_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root with %a (each task its own) was drawn with no publication at all, and no work
    done again, while the page's own goodput table (status's, which lists each task's root)
    counted them: the page now draws the publications its figures were made from."""
    done = per_task_job(tmp_path, monkeypatch)
    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    monkeypatch.setattr("slurm_dispatch.slurm.adapter.Slurm.own_jobs", lambda self, **kw: {})
    result = CliRunner().invoke(cli.main, ["report", done.job.id, "-o", "-"])
    assert result.exit_code == 0, result.output
    drawn = [s for s in shapes(result.output).shapes if s["data-kind"] == "published"]
    assert sorted(s["data-step"] for s in drawn) == ["10", "11"]


def test_a_page_written_onto_a_device_goes_through_it(
    job,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """-o onto what is not a regular file (a terminal, /dev/stdout, /dev/null) writes through
    it.  The page replaced whatever had the name: run as root, -o /dev/null left a regular
    file as /dev/null (seen), and -o /dev/stdout replaced the link."""
    import os

    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    monkeypatch.setattr("slurm_dispatch.slurm.adapter.Slurm.own_jobs", lambda self, **kw: {})
    reader, writer = os.openpty()
    try:
        os.set_blocking(reader, False)
        terminal = os.ttyname(writer)
        result = CliRunner().invoke(cli.main, ["report", job.id, "-o", terminal])
        assert result.exit_code == 0, result.output
        got = b""
        while True:
            try:
                chunk = os.read(reader, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            got += chunk
        assert got.startswith(b"<!DOCTYPE html>")
        assert not Path(terminal).is_file()
    finally:
        os.close(reader)
        os.close(writer)


def per_task_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An array of two tasks on root ck/%a, each task's execution running and publishing
    step 10 + task in its own root."""
    from slurm_dispatch.checkpoint import publish as store
    from slurm_dispatch.control import submit
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck/%a", "--array=0-1", "job.sh"]),
        Slurm(FakeCluster(), wait=0),
    )
    for task in (0, 1):
        exec_dir = tmp_path / "ck" / str(task) / "exec" / f"e{task}"
        (exec_dir / "save").mkdir(parents=True)
        done.job.append(
            "started",
            submission=1,
            slurm_job_id=str(1 + task),
            array_job_id="1",
            array_task_id=str(task),
            restart=0,
            attempt=f"a{task}",
            epoch=1_000_000,
            exec_dir=str(exec_dir),
            resume_from="",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
        store.publish(
            str(tmp_path / "ck" / str(task)), 1_000_000, 10 + task, str(exec_dir / "save")
        )
    return done
