"""slurm_dispatch/_clock.py is the one home of time formatted for people and programs."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import slurm_dispatch
from slurm_dispatch import _clock

PACKAGE = Path(slurm_dispatch.__file__).parent
# sandbox/ keeps its own log stamps: it is the test cluster's own program, not what users read.
EXCEPT_FOLDERS = {"sandbox"}


def test_strftime_appears_only_in_clock() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if str(relative) == "_clock.py" or relative.parts[0] in EXCEPT_FOLDERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "strftime"
                or isinstance(node, ast.Name)
                and node.id == "strftime"
                or isinstance(node, ast.alias)
                and node.name == "strftime"
            ):
                found.append(f"{relative}:{getattr(node, 'lineno', '?')}")
    assert not found, f"format times with slurm_dispatch._clock instead: {found}"


def test_each_kind_of_time_reads_as_it_always_has() -> None:
    moment = time.mktime((2026, 12, 2, 6, 10, 5, 0, 0, -1))
    assert _clock.instant(moment) == "2026-12-02T06:10:05"
    assert _clock.with_zone(moment).startswith("2026-12-02 06:10 ")
    assert _clock.for_program(moment)[:19] == "2026-12-02T06:10:05"
    assert _clock.for_program(moment)[19] in "+-"
    assert [_clock.duration(s) for s in (0, 247, 3600 + 300)] == ["0m00s", "4m07s", "1h05m"]
    now = 10_000.0
    assert [_clock.ago(now - s, now) for s in (40, 720, 3 * 3600, -5)] == [
        "40 s",
        "12 min",
        "3 h",
        "0 s",
    ]
    assert _clock.ago(None) == "?"
    assert len(_clock.instant()) == 19  # now
