"""``dispatch report``'s page in a real browser (headless Chromium): it renders, and its lanes
and marks are drawn where the recorded history puts them (the pixels at each shape's place
have its colour)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.control import report

from ..browser import browser, screenshot
from .test_goodput import T0
from .test_report import MARKS, PARTITION, with_figures

pytestmark = pytest.mark.skipif(
    browser() is None,
    reason="no headless Chromium (apt-get install chromium-headless-shell; .ci/run installs it)",
)


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def near(got: tuple[int, ...], want: tuple[int, int, int], slack: int = 24) -> bool:
    return all(abs(a - b) <= slack for a, b in zip(got[:3], want))


def test_the_page_renders_and_each_shape_is_where_the_records_say(tmp_path: Path) -> None:
    from PIL import Image

    now = T0 + 2000
    data = with_figures(PARTITION, MARKS, now)
    page = tmp_path / "job.html"
    page.write_text(report.render(data, MARKS, now=now))
    view = report.layout(data, MARKS, now=now)
    shot = Image.open(screenshot(page, tmp_path / "job.png", 1200, 1000)).convert("RGB")
    pixels = shot.load()
    assert pixels is not None
    # Where the drawing begins on the page: the first pixel of lane 0's running bar, whose
    # top-left corner is at (x of its allocation, the lane's middle less half a bar).
    running = rgb(report.COLOURS["running"])
    # (The legend's swatch has that colour too, but is 22 pixels wide.)
    first = next(
        (
            (x, y)
            for y in range(shot.height)
            for x in range(shot.width - 60)
            if near(pixels[x, y], running, 4) and near(pixels[x + 60, y], running, 4)
        ),
        None,
    )
    assert first is not None, "no running bar drawn"
    lane0 = view.lanes[0]
    ox, oy = first[0] - view.x(lane0.start), first[1] - (lane0.y - report.BAR / 2)

    def colour_at(x: float, y: float) -> tuple[int, ...]:
        return pixels[int(round(ox + x)), int(round(oy + y))]

    checks = {
        # R0 runs to Slurm's end (+350), is not proven gone until its node's Epilog at the
        # heal (+600), and its run after step 30 (+300, what R1 resumed from) was redone.
        "R0 running at +150": (view.x(T0 + 150), lane0.y + 4, "running"),
        "R0 redone at +325": (view.x(T0 + 325), lane0.y + 4, "redone"),
        "R0 overlap at +475": (view.x(T0 + 475), lane0.y, "overlap"),
        "R0 ceased at +600": (view.x(T0 + 600), lane0.y - report.BAR + 2, "ceased"),
        "R0 step 40 published at +400": (view.x(T0 + 400), lane0.y, "published"),
        "R1 running at +450": (view.x(T0 + 450), view.lanes[1].y + 4, "running"),
        # R2 resumed from R1's step 50 (+582): R1's run after it, to Slurm's end, was redone.
        "R1 redone at +650": (view.x(T0 + 650), view.lanes[1].y + 4, "redone"),
        "R1 step 50 published at +582": (view.x(T0 + 582), view.lanes[1].y, "published"),
        "R2 running at +950": (view.x(T0 + 950), view.lanes[2].y + 4, "running"),
    }
    wrong = {
        name: colour_at(x, y)[:3]
        for name, (x, y, kind) in checks.items()
        if not near(colour_at(x, y), rgb(report.COLOURS[kind]))
    }
    assert wrong == {}, wrong
    # And where nothing is: between R2's allocation and the axis' start, its lane is blank.
    blank = colour_at(view.x(T0 + 100), view.lanes[2].y)
    assert not near(blank, running) and not near(blank, rgb(report.COLOURS["published"]))
