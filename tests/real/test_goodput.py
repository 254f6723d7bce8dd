"""A job's goodput on the real sandbox (docs/user-guide.md, goodput): a partition and a preemption
made by the test, and ``dispatch status --json``'s figures say what happened, within one save
interval.

The toy trainer prints every save; the test makes the restarts happen: its node cut off (Slurm
requeues it as a node failure, while the cut-off execution goes on saving past its
replacement's start until the heal), then an urgent job on the replacement's node (Slurm
preempts and requeues it).  The steps the trainer printed are what it really reached; the
figures are computed from the record, the hooks' facts and the publications alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import slurm_conf as sandbox_slurm_conf
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.test_dispatch_sbatch import Workdir, published_steps, wait_executions

pytestmark = pytest.mark.real
work = sbatch_tests.work  # the fixture, used by name

SAVE_EVERY = 5
RUN = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.1", "TOY_SAVE_EVERY": str(SAVE_EVERY)}


def _saved(out: Path, attempt: str) -> list[int]:
    """The steps execution ``attempt`` printed as saved and published."""
    text = out.read_text() if out.exists() else ""
    return [
        int(m)
        for m in re.findall(
            rf"\[{attempt}\] epoch \d+ saved and published step "
            r"(\d+)",
            text,
        )
    ]


def test_a_partition_then_a_preemption_give_the_figures_that_happened(work: Workdir) -> None:
    sandbox: Any = work.sandbox
    job, slurm_id = work.submit("--checkpoint", "ck", "-o", "out-%j.txt", "trainer.sh", env=RUN)
    out = work.path / f"out-{slurm_id}.txt"
    first = wait_executions(work, job, 1)[0]
    cut = first["node"]
    urgent = ""
    healed = False
    try:
        sandbox.wait_for(lambda: published_steps(first["exec_dir"]), 60, "a first save")
        sandbox_lib.partition(cut, sandbox.dir)
        second = wait_executions(work, job, 2, timeout=150)[1]
        assert second["restart"] == 1 and second["node"] != cut
        # The cut-off execution publishes past its replacement's start.
        before = published_steps(first["exec_dir"])
        sandbox.wait_for(
            lambda: published_steps(first["exec_dir"])[-1:] > before[-1:],
            60,
            "the cut-off execution saving again",
        )
        sandbox.wait_for(lambda: published_steps(second["exec_dir"]), 60, "a replacement save")
        sandbox_lib.heal(cut, sandbox.dir)
        healed = True
        # Preemption: an urgent job needs the whole node the replacement runs on.
        urgent = sandbox.submit(
            "#!/bin/sh\nsleep 10\n",
            "-p",
            sandbox_slurm_conf.URGENT_PARTITION,
            "--exclusive",
            "-w",
            second["node"],
            "-t",
            "2",
            "-o",
            "/dev/null",
        )
        third = wait_executions(work, job, 3, timeout=180)[2]
        assert third["restart"] == 2
        sandbox.wait_for(lambda: published_steps(third["exec_dir"]), 60, "a third save")
        data = work.status(job)
        got = data["goodput"]
        old, mid, new = got["executions"]
        assert got["restarts_by_cause"]["node failure"] == 1, got
        assert got["restarts_by_cause"]["preempted"] == 1, got
        assert got["restarts"] == 2
        # What happened: the steps each execution printed as saved, and where its
        # successor resumed from.
        resumed_1 = int(Path(second["resume_from"]).name.split("-")[1])
        resumed_2 = int(Path(third["resume_from"]).name.split("-")[1])
        reached_0 = max(_saved(out, first["attempt"]) + published_steps(first["exec_dir"]))
        reached_1 = max(_saved(out, second["attempt"]) + published_steps(second["exec_dir"]))
        assert (mid["resumed_step"], new["resumed_step"]) == (resumed_1, resumed_2)
        # The cut-off execution went on past the step its replacement resumed from.
        assert reached_0 > resumed_1 and old["published_after_end"] >= 1
        assert abs(mid["redone_steps"] - (reached_0 - resumed_1)) <= SAVE_EVERY, got
        assert abs(new["redone_steps"] - (reached_1 - resumed_2)) <= SAVE_EVERY, got
        assert got["redone_steps"] == mid["redone_steps"] + new["redone_steps"]
        assert 0 < got["goodput"] < 1 and got["lost_s"] > 0
        assert mid["waited_s"] is not None and mid["waited_s"] >= 0
        text = work.run("dispatch", "status", job).stdout
        print(next(line for line in text.splitlines() if line.startswith("Goodput")))
        print(
            [
                (
                    e["cause"],
                    e["resumed_step"],
                    e["redone_steps"],
                    e["waited_s"],
                    e["restore_s"],
                    e["lost_s"],
                )
                for e in got["executions"]
            ],
            reached_0,
            reached_1,
        )
        assert "restarts (" in text and "node failure 1" in text and "preempted 1" in text
        _the_report_draws_it(work, job)
    finally:
        if not healed:
            sandbox_lib.heal(cut, sandbox.dir)
        sandbox.run(["scancel", slurm_id], check=False)
        if urgent:
            sandbox.run(["scancel", urgent], check=False)


def _the_report_draws_it(work: Workdir, job: str) -> None:
    """``dispatch report`` of that job: the cut-off execution's lane shows
    its overlap and its publications after Slurm ended it; a real browser renders the page
    (kept as ``TEST_REPORT_SHOT``, the user guide's picture, where that is set)."""
    import os
    import shutil

    from PIL import Image

    from slurm_dispatch.control import report
    from tests.browser import screenshot
    from tests.unit.test_report import of, shapes

    done = work.run("dispatch", "report", job, "-o", "job.html")
    assert "execution(s) drawn" in done.stdout, done.stdout
    page = work.path / "job.html"
    found = shapes(page.read_text())
    lanes = sorted({s["data-lane"] for s in found.shapes if s["data-kind"] == "running"})
    assert len(lanes) >= 3, found.shapes
    # Lane 0 is the cut-off execution: its overlap, and a publication inside it.
    (overlap,) = of(found, "overlap", 0)
    lo, hi = float(overlap["x"]), float(overlap["x"]) + float(overlap["width"])
    inside = [d for d in of(found, "published", 0) if lo <= float(d["cx"]) <= hi]
    assert inside, (overlap, of(found, "published", 0))
    # Its replacement resumed from an earlier save than it went on to publish: redone.
    assert of(found, "redone", 0), found.shapes
    shot = screenshot(page, work.path / "job.png", 1200, 900)
    pixels = Image.open(shot).convert("RGB").getcolors(1 << 20) or []
    colours = {colour for _, colour in pixels}
    wanted = {
        k: tuple(int(report.COLOURS[k][i : i + 2], 16) for i in (1, 3, 5))
        for k in ("running", "overlap", "published", "redone", "ceased")
    }
    assert all(c in colours for c in wanted.values()), wanted
    keep = os.environ.get("TEST_REPORT_SHOT")
    if keep:
        shutil.copyfile(shot, keep)
