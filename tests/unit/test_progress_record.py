"""The progress record (docs/user-guide.md, a stalled job): bounded writes from the training loop, a
save's beginning and end written at once, nothing raised into the loop."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_dispatch import api
from slurm_dispatch.checkpoint import execdir
from slurm_dispatch.execution import stall, steps


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_are_written_at_most_once_an_interval(tmp_path: Path) -> None:
    clock = Clock()
    rec = steps.ProgressRecorder(str(tmp_path), interval=2.0, clock=clock, wall=lambda: 5.0)
    for step in range(10_000):
        rec.step(step)
        clock.now += 0.0001  # 10,000 steps in one second
    assert rec.writes == 1
    assert steps.read(str(tmp_path))["step"] == 0
    clock.now += 1.5  # past the interval since the first write
    rec.step(10_000)
    assert rec.writes == 2
    record = steps.read(str(tmp_path))
    assert record["step"] == 10_000 and record["saving"] is False and record["time"] == 5.0
    rec.step(10_001)
    rec.flush()
    assert steps.read(str(tmp_path))["step"] == 10_001
    # Replaced in place: no temporary file is left beside it, and gc takes it for ours.
    assert sorted(os.listdir(tmp_path)) == [execdir.PROGRESS]
    assert execdir.is_own(execdir.PROGRESS) and execdir.is_own(execdir.STALLED)


def test_a_save_is_written_at_once_and_its_end_counts_as_progress(tmp_path: Path) -> None:
    clock = Clock()
    rec = steps.ProgressRecorder(str(tmp_path), interval=60.0, clock=clock)
    rec.step(1)
    with rec.saving(7):
        inside = steps.read(str(tmp_path))
        assert inside["saving"] is True and inside["step"] == 7 and inside["what"] == "save"
        with rec.saving():  # nested marks count once
            pass
        assert steps.read(str(tmp_path))["saving"] is True
    after = steps.read(str(tmp_path))
    assert after["saving"] is False and after["saves"] == 1 and rec.writes == 3


def test_a_step_reached_again_is_progress(tmp_path: Path) -> None:
    """Gradient accumulation: Lightning's batch end (the Trainer's substep end) comes at each
    micro-batch with the same global step; a micro-batch is progress, so an optimizer step of
    many micro-batches, longer than the timeout, is no stall."""
    now = [0.0]
    rec = steps.ProgressRecorder(str(tmp_path), clock=lambda: now[0])
    clock = stall.StallClock(10, lag=0)
    for t in range(0, 60, 3):  # a micro-batch every 3 s, an optimizer step every 24 s
        now[0] = t
        rec.step(t // 24)
        assert clock.observe(steps.read(str(tmp_path)), t) is None, t
    assert rec.calls == 20
    # A loop that stops calling is caught all the same.
    assert clock.observe(steps.read(str(tmp_path)), 67) == 10


def test_a_record_that_cannot_be_written_never_raises_into_the_loop(tmp_path: Path) -> None:
    rec = steps.ProgressRecorder(str(tmp_path / "gone"))
    rec.step(1)
    with rec.saving(2):
        pass
    assert rec.broken is not None and "gone" in rec.broken and rec.writes == 0


def test_the_api_records_inside_an_execution_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "_current", steps._UNSET)
    monkeypatch.delenv("DISPATCH_LOCAL_DIR", raising=False)
    api.progress(3)  # outside an execution: nothing, no error
    with api.saving(3):
        pass
    assert steps.recorder() is None
    monkeypatch.setattr(steps, "_current", steps._UNSET)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(tmp_path))
    api.progress(4)
    assert json.loads((tmp_path / execdir.PROGRESS).read_text())["step"] == 4
    with api.saving(5):
        assert steps.read(str(tmp_path))["saving"] is True
    assert steps.read(str(tmp_path))["saves"] == 1
    monkeypatch.setattr(steps, "_current", steps._UNSET)
