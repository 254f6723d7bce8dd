"""dispatch status --timeline: the overlap and the lineage that won, seen at a glance, in 80
columns of plain ASCII."""

from __future__ import annotations

from typing import Any

from slurm_dispatch.control.timeline import Mark, render

T0 = 1_800_000_000.0


def seen(start: float, end: float | None, ceased: float | None) -> list[dict]:
    if end is None:
        return []
    node = {"ceased": ceased is not None, "end": {"time": end}}
    if ceased is not None and ceased != end:
        node["recheck"] = {"time": ceased}
    return [{"restart": 0, "end": {"time": end}, "nodes": {"n1": node}}]


DATA: dict[str, Any] = {
    "id": "dabcdefg",
    "checkpoint": "/ck",
    "executions": [
        {
            "submission": 1,
            "restart": 0,
            "node": "n1",
            "started": T0,
            "state": "REQUEUED",
            "exec_dir": "/ck/exec/A",
            "facts": seen(T0, T0 + 300, T0 + 450),
        },
        {
            "submission": 1,
            "restart": 1,
            "node": "n2",
            "started": T0 + 320,
            "state": "RUNNING",
            "exec_dir": "/ck/exec/B",
            "facts": [],
            "resume_from": "/ck/exec/A/checkpoint-5",
        },
    ],
    "events": [
        {"event": "hold", "time": T0 + 310, "submission": 2, "slurm_job_id": "8"},
        {"event": "released", "time": T0 + 460, "slurm_job_id": "8"},
    ],
}
MARKS = [
    Mark(T0 + 100, "/ck/exec/A/checkpoint-5", 5),
    Mark(T0 + 400, "/ck/exec/A/c-9", 9),
    Mark(T0 + 500, "/ck/exec/B/checkpoint-7", 7, latest=True),
]


def test_overlap_and_lineage_are_drawn() -> None:
    text = render(DATA, MARKS, width=80, now=T0 + 600)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), text
    old = next(line for line in lines if line.startswith("S1 R0 n1"))
    new = next(line for line in lines if line.startswith("S1 R1 n2"))
    # The old execution ran, ended, and was not proven gone for a while: the overlap.
    assert "=" in old and "~" in old and "|" in old and old.count("*") == 2
    assert old.index("=") < old.index("~") < old.index("|")
    # Its late save (step 9, inside the overlap) did not win: the replacement's did.
    assert new.endswith("<- latest") and not old.endswith("<- latest")
    assert new.index("=") > old.index("=")
    hold = next(line for line in lines if line.startswith("hold S2"))
    assert "." in hold and hold.endswith("released")
    legend = next(i for i, line in enumerate(lines) if "~ ended, not proven gone" in line)
    # Below the legend, where each execution took up the lineage.
    assert lines[legend + 1 :] == ["S1 R0 started fresh", "S1 R1 resumed from S1 R0 checkpoint-5"]


def test_narrow_terminals_and_no_execution() -> None:
    assert all(len(line) <= 60 for line in render(DATA, MARKS, 60, T0 + 600).splitlines())
    assert "no execution has started" in render(
        {"id": "x", "executions": [], "events": []}, [], 80, T0
    )


def test_marks_read_the_publications_and_their_times(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from slurm_dispatch.checkpoint import publish as store
    from slurm_dispatch.control.timeline import marks

    save = tmp_path / "exec" / "A" / "checkpoint-5"
    save.mkdir(parents=True)
    name = store.publish(str(tmp_path), 1_000_000, 5, str(save))
    os.utime(tmp_path / "pub" / name, (T0, T0))
    (found,) = marks(str(tmp_path))
    assert (found.time, found.step, found.path, found.latest) == (T0, 5, str(save), True)


def test_a_save_named_with_a_line_break_stays_on_its_line() -> None:
    """Found attacking what the timeline prints: what an execution resumed from is a save's
    path the trainer named; one with a line break or a terminal escape started a line of its
    own below the legend (or moved the terminal), where status's table escapes it."""
    data = {
        **DATA,
        "executions": [
            DATA["executions"][0],
            {**DATA["executions"][1], "resume_from": "/ck/exec/A/ck\npt-5\x1b[2J"},
        ],
    }
    lines = render(data, MARKS, width=120, now=T0 + 600).splitlines()
    assert lines[-1] == "S1 R1 resumed from S1 R0 ck\\npt-5\\x1b[2J", lines[-2:]
