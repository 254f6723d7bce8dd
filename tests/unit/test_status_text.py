"""dispatch status's text, pinned byte for byte: every line kind the renderer has (submissions,
array tasks, executions with each sort of hook facts, every recorded decision, the supervisor's
passes, the launcher's problem, the latest publication) over hand-made status data; and
dispatch jobs' table.

Re-bless after an intended change of the text with
``BLESS_GOLDEN=1 python -m pytest tests/unit/test_status_text.py`` and read the diff.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from slurm_dispatch.control import status_text

GOLDEN = Path(__file__).parent / "golden" / "status-text.txt"
NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def utc_now(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(time, "time", lambda: NOW)
    yield
    monkeypatch.undo()
    time.tzset()


def ev(kind: str, t: float, **fields: Any) -> dict[str, Any]:
    return {"event": kind, "time": t, "ns": int(t * 1e9), "v": 2, **fields}


def plain() -> dict[str, Any]:
    """A shared-checkpoint job resubmitted by hand and by the supervisor, every decision."""
    return {
        "id": "dab2cd3e",
        "cluster": "alpha",
        "script": "train.sh",
        "generation": 1,
        "checkpoint": "/ck/run1",
        "shared_checkpoint": True,
        "resubmit_budget": 3,
        "resubmits_used": 2,
        "resubmits_by_hand": 1,
        "supersedes": "c0ffee01",
        "launcher_problem": "the interpreter /venv/bin/python is gone: give --python",
        "supervisor": {
            "time": NOW - 90,
            "host": "login1",
            "failing_since": NOW - 30,
            "failures": 2,
            "failed_at": NOW - 10000,
            "error": "slurmctld down",
        },
        "submissions": [
            {
                "submission": 1,
                "slurm_job_id": "7",
                "display_id": "7",
                "task": None,
                "state": "FAILED (recorded)",
                "exit_code": "3:0",
                "restarts": None,
                "submitted": NOW - 7200,
                "slurm_reason": "",
                "reason": "",
            },
            {
                "submission": 2,
                "slurm_job_id": "8",
                "display_id": None,
                "task": None,
                "state": "PENDING",
                "exit_code": None,
                "restarts": 0,
                "submitted": NOW - 3600,
                "slurm_reason": "JobHeldUser",
                "reason": "manual",
            },
            {
                "submission": 3,
                "slurm_job_id": "9",
                "task": None,
                "state": "TIMEOUT (recorded)",
                "exit_code": "0:15",
                "restarts": 2,
                "submitted": 0,
                "slurm_reason": "",
                "reason": "failed (budget 3)",
            },
        ],
        "tasks": None,
        "executions": [
            {
                "slurm_job_id": "7",
                "display_id": "7",
                "restart": 0,
                "epoch": 1000000,
                "submission": 1,
                "exec_dir": "/ck/run1/exec/a0",
                "attempt": "a0",
                "node": "n1",
                "started": NOW - 7000,
                "state": "REQUEUED",
                "published": {
                    "count": 2,
                    "first": 400,
                    "last": 500,
                    "steps_known": True,
                    "backwards": None,
                },
                "facts": [
                    {
                        "restart": 0,
                        "end": {"exit_code": "0:0", "requeued": True},
                        "nodes": {
                            "n1": {"ceased": False, "survivors": [{"pid": 4242}, {"pid": 17}]},
                            "n0": {"ceased": True},
                            "n2": {"ceased": None},
                        },
                        "problems": ["unreadable: x", "untrusted: y"],
                    }
                ],
            },
            {
                "slurm_job_id": "7",
                "restart": 1,
                "epoch": 1000001,
                "attempt": "a1",
                "submission": 1,
                "exec_dir": "/ck/run1/exec/a1",
                "resume_from": "/ck/run1/exec/a0/checkpoint-500",
                "node": None,
                "started": NOW - 6000,
                "state": "FAILED (recorded)",
                "published": {
                    "count": 1,
                    "first": 2,
                    "last": 2,
                    "steps_known": True,
                    "backwards": "step 2 (/ck/run1/exec/a1/step-2) is at or below "
                    "step 500 of the save this execution resumed from",
                },
                "facts": [
                    {
                        "restart": 1,
                        "end": {"state": "failed", "exit_code": "3:0"},
                        "nodes": {"n3": {"ceased": False, "survivors": ["odd"]}},
                    },
                    {"error": "StateDir /var/lib/dispatch is not readable"},
                ],
            },
            {
                "slurm_job_id": "8",
                "restart": 0,
                "epoch": 2000000,
                "attempt": "b0",
                "resume_from": "/ck/run1/exec/zz/step-9",
                "node": "n4",
                "started": NOW - 100,
                "state": "RUNNING",
                "published": {
                    "count": 3,
                    "first": 0,
                    "last": 2,
                    "steps_known": False,
                    "backwards": None,
                },
                "facts": [{"restart": 0, "end": None, "nodes": {"n4": {"ceased": None}}}],
            },
            {
                "slurm_job_id": "9",
                "restart": 0,
                "epoch": 3000000,
                "attempt": "c0",
                "node": "n5",
                "started": NOW - 50,
                "state": "RUNNING",
                "published": {
                    "count": 0,
                    "first": None,
                    "last": None,
                    "steps_known": True,
                    "backwards": None,
                },
                "facts": [{"restart": 0, "end": {}, "nodes": {}}],
            },
        ],
        "events": [
            ev(
                "hold",
                NOW - 5000,
                submission=2,
                slurm_job_id="8",
                ended_slurm_job_id="7",
                ended_restart=1,
                end_state="node failure",
                deadline=NOW + 3600,
            ),
            ev(
                "cessation",
                NOW - 4900,
                held_slurm_job_id="8",
                ended_slurm_job_id="7",
                verdict="not ceased",
                code=1,
                evidence={"reason": "not proven on 1 of 1: n3"},
            ),
            ev(
                "cessation",
                NOW - 4800,
                held_slurm_job_id="8",
                ended_slurm_job_id="7",
                verdict="ceased",
                code=0,
                evidence="all gone",
            ),
            ev(
                "cessation",
                NOW - 4700,
                held_slurm_job_id="8",
                ended_slurm_job_id="7",
                verdict="ceased",
                code=0,
                evidence={"nodes": []},
            ),
            ev("released", NOW - 4600, slurm_job_id="8", by="cessation signal"),
            ev("expired", NOW - 4500, slurm_job_id="8", deadline=NOW - 4500),
            ev(
                "notified",
                NOW - 4400,
                slurm_job_id="8",
                about="hold",
                channel="mail",
                ok=False,
                detail="no sendmail",
            ),
            ev("submit-failed", NOW - 4300, submission=3, error="sbatch: error: x"),
            ev(
                "finished",
                NOW - 4200,
                submission=3,
                slurm_job_id="9",
                end_state="timeout",
                rule="no budget left",
                slurm_state="TIMEOUT",
            ),
            ev("superseded", NOW - 4100, by="feedf00d"),
        ],
        "latest": {
            "epoch": 3000000,
            "step": 500,
            "path": "/ck/run1/exec/c0/checkpoint-500",
            "name": "x",
        },
    }


def array(root: str) -> dict[str, Any]:
    """An array job: each task's line, task events with their ids as Slurm writes them."""
    per_task = "%a" in root
    latest = {"epoch": 1000000, "step": 20, "path": "/ck/a/1/checkpoint-20", "name": "y"}
    return {
        "id": "0a0a0a0a",
        "cluster": None,
        "script": "sweep.sh",
        "generation": 0,
        "checkpoint": root,
        "shared_checkpoint": False,
        "resubmit_budget": 0,
        "resubmits_used": 1,
        "supersedes": None,
        "launcher_problem": None,
        "supervisor": None,
        "submissions": [
            {
                "submission": 1,
                "slurm_job_id": "80",
                "display_id": "80",
                "task": None,
                "state": "COMPLETED+FAILED",
                "exit_code": None,
                "restarts": None,
                "submitted": NOW - 900,
                "slurm_reason": "",
                "reason": "",
            },
            {
                "submission": 2,
                "slurm_job_id": "85",
                "display_id": "85_1",
                "task": 1,
                "state": "RUNNING",
                "exit_code": None,
                "restarts": 0,
                "submitted": NOW - 300,
                "slurm_reason": "None",
                "reason": "failed (budget 1)",
            },
        ],
        "tasks": [
            {
                "task": 0,
                "submission": 1,
                "display_id": "80_0",
                "settled": True,
                "state": "UNKNOWN (no longer known to slurmctld)",
                "resubmits_used": 0,
                "latest": None,
            },
            {
                "task": 1,
                "submission": 2,
                "display_id": "85_1",
                "settled": False,
                "state": "RUNNING",
                "resubmits_used": 1,
                "latest": latest if per_task else {"error": "bucket gone"},
            },
            {
                "task": 2,
                "submission": 1,
                "display_id": "80_2",
                "settled": False,
                "state": "UNKNOWN (no longer known to slurmctld)",
                "resubmits_used": 0,
                "latest": latest,
            },
        ],
        "executions": [],
        "events": [
            ev(
                "hold",
                NOW - 800,
                task=1,
                submission=2,
                slurm_job_id="85",
                ended_slurm_job_id="81",
                ended_restart=0,
                end_state="failed",
                deadline=NOW + 60,
            ),
            ev(
                "cessation",
                NOW - 700,
                task=1,
                held_slurm_job_id="85",
                ended_slurm_job_id="80_1",
                verdict="ceased",
                code=0,
                evidence=None,
            ),
            ev("released", NOW - 600, task=1, slurm_job_id="85_1", by="alice"),
            ev("expired", NOW - 500, task=2, slurm_job_id="86", deadline=NOW),
            ev("notified", NOW - 450, task=2, slurm_job_id="86", about="expiring", channel="site"),
            ev(
                "finished",
                NOW - 400,
                task=0,
                submission=1,
                slurm_job_id="80",
                end_state="completed",
                rule="done",
            ),
        ],
        "latest": None if per_task else latest,
    }


def rendered() -> str:
    cases = {
        "shared checkpoint, every decision": status_text.render(plain()),
        "... whose home holds several clusters' jobs": status_text.render(
            plain(), several_clusters=True
        ),
        "array, a root per task": status_text.render(array("/ck/a/%a")),
        "array, one root": status_text.render(array("/ck/a/100%%")),
        "no supervisor, nothing to wait for": status_text.render(
            {
                **array("/ck/b"),
                "tasks": None,
                "resubmits_by_hand": 0,
                "events": [],
                "latest": {"error": "Permission denied"},
            }
        ),
        "no supervisor, rules that wait for one": status_text.render(
            {
                **array("/ck/b"),
                "tasks": None,
                "resubmit_budget": 1,
                "latest": None,
                "supervisor": {"time": None},
                "events": [],
            }
        ),
        "no supervisor pass yet, a budget": status_text.render(
            {
                **array("/ck/b"),
                "tasks": None,
                "resubmit_budget": 1,
                "resubmits_used": 0,
                "events": [],
            }
        ),
        "supervisor passing": status_text.render(
            {
                **plain(),
                "supervisor": {"time": NOW - 9000},
                "events": [],
                "launcher_problem": None,
                "supersedes": None,
                "resubmits_by_hand": 2,
                "resubmits_used": 2,
            }
        ),
    }
    jobs: list[dict[str, Any]] = [
        {
            "id": "dab2cd3e",
            "script": "train.sh",
            "generation": 1,
            "submission": 3,
            "slurm_job_id": "9",
            "state": "TIMEOUT (recorded)",
            "checkpoint": "/ck/run1",
            "cluster": "alpha",
        },
        {"id": "0a0a0a0a", "error": "cannot read spec.json: truncated", "cluster": None},
        {
            "id": "feedf00d",
            "script": "a long script name.sh",
            "generation": 0,
            "submission": 1,
            "slurm_job_id": None,
            "state": "UNKNOWN",
            "checkpoint": "s3://b/p",
            "cluster": "beta",
        },
    ]
    cases.update(
        {
            "dispatch jobs": status_text.jobs_table(jobs),
            "dispatch jobs, several clusters": status_text.jobs_table(jobs, several_clusters=True),
            "dispatch jobs --noheader": status_text.jobs_table(jobs, noheader=True),
            "dispatch jobs, none": status_text.jobs_table([]),
        }
    )
    return "".join(f"==== {name}\n{text}\n" for name, text in cases.items())


def test_status_text_is_pinned() -> None:
    text = rendered()
    if os.environ.get("BLESS_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), (
        "dispatch status's text changed; if intended, re-bless with BLESS_GOLDEN=1 "
        f"python -m pytest {__file__} and read the diff"
    )


def test_status_is_put_into_words_in_one_place() -> None:
    """The CLI only prints: no module but status_text writes status lines, and neither cli/
    nor the status (control/status.py, status_text.py) reads an event by its kind string
    (``ev["event"] == "hold"``): they take typed events."""
    import ast

    package = Path(status_text.__file__).resolve().parents[1]
    marks = (
        "Latest publication: ",
        "No execution has started yet.",
        "Supervisor  ",
        "CESSATION ",
        "facts unreadable: ",
    )
    homes: dict[str, set[str]] = {mark: set() for mark in marks}
    kind_reads = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(package))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for mark in marks:
                    if node.value.startswith(mark):
                        homes[mark].add(name)
            if (
                name.startswith(("cli/", "control/status"))
                and isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant)
                and node.slice.value == "event"
            ):
                kind_reads.append(f"{name}:{node.lineno}")
    assert {mark: sorted(found) for mark, found in homes.items()} == {
        mark: ["control/status_text.py"] for mark in marks
    }
    assert not kind_reads, f"events read by their kind strings: {kind_reads}"


def test_a_superseded_events_hand_edited_cancelled_list_is_shown_not_raised() -> None:
    from slurm_dispatch.control import events

    event = events.parse(
        {
            "event": "superseded",
            "time": 1.0,
            "ns": 1,
            "v": 2,
            "by": "b",
            "cancelled": [97, None],
            "again": "97 RUNNING, restart 1",
        }
    )
    line = status_text.event_text(event)
    assert line.startswith("SUPERSEDED by b: cancelled Slurm job 97, None again"), line


def test_the_header_shows_a_script_name_with_control_characters_on_one_line() -> None:
    """Found attacking what status prints: a script named with a line break and a terminal escape
    (its file name: sbatch takes it) split dispatch status's first line in two, and the
    escape reached the terminal (click strips it only where stdout is not one): every table
    cell was escaped, the header's script and root were not."""
    data = plain()
    data["script"] = "e\x1b[31mvil\nx.sh"
    data["checkpoint"] = "/ck/a\x1b[2Jb"  # a record written before roots were judged
    lines = status_text.render(data).splitlines()
    assert lines[0].startswith("Dispatch job dab2cd3e: e\\x1b[31mvil\\nx.sh, generation 1, "), (
        lines[0]
    )
    assert lines[1] == "Checkpoint  /ck/a\\x1b[2Jb", lines[1]
    assert "\x1b" not in status_text.render(data)
