"""A job's goodput from recorded histories (docs/user-guide.md, goodput): per execution the gap
before it ran, the steps it redid, its restore and save latency; per job the restarts by cause, the
time lost and the kept share of its allocations.  Every figure below is worked out by hand from the
moments the history records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import goodput, record, status, status_text
from slurm_dispatch.control.goodput import Mark

from .test_status import fresh_job

T0 = 1_800_000_000.0


def facts(
    alloc: float, end: float, nodes: dict[str, float | None], ceased: float | None = None
) -> list[dict]:
    """One execution's facts: the controller's start and end, each node's start at the
    allocation and its end (None: the node recorded none)."""
    return [
        {
            "restart": 0,
            "end": {"time": end},
            "controller": {"start": {"time": alloc}, "end": {"time": end}},
            "nodes": {
                node: {
                    "start": {"time": alloc + 1},
                    "end": None if at is None else {"time": at},
                    "ceased": None if at is None else True,
                }
                for node, at in nodes.items()
            },
        }
    ]


def mark(at: float, folder: str, step: int) -> Mark:
    return Mark(T0 + at, f"/ck/exec/{folder}/checkpoint-{step}", step, saved=T0 + at - 3)


# A partition, then a preemption: S1 R0 on n1 is cut off at +320; Slurm ends it at +350 (the
# controller's end) and requeues it, while it goes on publishing steps 40 and 50 past its
# replacement's start (+372); its node's Epilog runs only at the heal (+600).  S1 R1 on n2
# resumes from step 30 and is preempted at +700 (its node's end at +702, before the next
# allocation); S1 R2 on n3 resumes from R1's step 50 and completes at +1000.
PARTITION = {
    "id": "dabcdefg",
    "checkpoint": "/ck",
    "submissions": [
        {
            "submission": 1,
            "slurm_job_id": "7",
            "task": None,
            "submitted": T0 - 30,
            "reason": "first",
        }
    ],
    "executions": [
        {
            "submission": 1,
            "restart": 0,
            "node": "n1",
            "started": T0,
            "state": "REQUEUED",
            "exec_dir": "/ck/exec/A",
            "resume_from": "",
            "facts": facts(T0 - 2, T0 + 350, {"n1": T0 + 600}),
        },
        {
            "submission": 1,
            "restart": 1,
            "node": "n2",
            "started": T0 + 372,
            "state": "REQUEUED",
            "exec_dir": "/ck/exec/B",
            "resume_from": "/ck/exec/A/checkpoint-30",
            "facts": facts(T0 + 370, T0 + 700, {"n2": T0 + 702}),
        },
        {
            "submission": 1,
            "restart": 2,
            "node": "n3",
            "started": T0 + 722,
            "state": "COMPLETED (recorded)",
            "exec_dir": "/ck/exec/C",
            "resume_from": "/ck/exec/B/checkpoint-50",
            "facts": facts(T0 + 720, T0 + 1000, {"n3": T0 + 1001}),
        },
    ],
    "events": [{"event": "finished", "time": T0 + 1010, "submission": 1, "end_state": "completed"}],
}
PARTITION_MARKS = [
    mark(100, "A", 10),
    mark(200, "A", 20),
    mark(300, "A", 30),
    mark(400, "A", 40),
    mark(500, "A", 50),
    mark(482, "B", 40),
    mark(582, "B", 50),
    mark(822, "C", 60),
    mark(922, "C", 70),
]


def test_a_cut_off_execution_publishing_past_its_replacements_start() -> None:
    got = goodput.figures(PARTITION, PARTITION_MARKS, now=T0 + 2000)
    old, mid, new = got["executions"]
    # Slurm requeued R0 without its node's Epilog (the node was cut off): a node failure.
    # Its two publications after Slurm ended it (steps 40, 50) are steps R1 did again.
    assert (old["cause"], old["published_after_end"], old["reached_step"]) == (
        "node failure",
        2,
        50,
    )
    assert (mid["resumed_step"], mid["redone_steps"]) == (30, 20)
    # R1's node recorded its end before R2's allocation: Slurm's preemption.
    assert mid["cause"] == "preempted"
    assert (new["resumed_step"], new["redone_steps"], new["cause"]) == (50, 0, "completed")
    # The gaps: from the predecessor's end to the allocation.
    assert [e["waited_s"] for e in got["executions"]] == [28.0, 20.0, 20.0]
    # Restore: R1's first save (+482, step 40) is 110 s after its start; 10 steps at its pace
    # of 0.1 step/s took 100 s of it.  R0 and R2 started training at once.
    assert [e["restore_s"] for e in got["executions"]] == [0.0, 10.0, 0.0]
    assert [e["first_save_s"] for e in got["executions"]] == [100.0, 110.0, 100.0]
    assert old["save_latency_s"] == {"median": 3.0, "max": 3.0, "sum": 15.0, "count": 5}
    # Allocations: 352, 330, 280 s.  Lost: R0 after step 30 (+300) to its end, and its 2 s
    # before the start (52); R1's 2 s, its 10 s of restore and everything after step 50
    # (+582 to +700) (130); R2's 2 s before its start.
    assert [e["allocated_s"] for e in got["executions"]] == [352.0, 330.0, 280.0]
    assert [e["lost_s"] for e in got["executions"]] == [52.0, 130.0, 2.0]
    assert got["restarts"] == 2
    assert got["restarts_by_cause"]["node failure"] == 1
    assert got["restarts_by_cause"]["preempted"] == 1
    assert sum(got["restarts_by_cause"].values()) == 2
    assert (got["allocated_s"], got["lost_s"], got["redone_steps"]) == (962.0, 184.0, 20)
    assert got["goodput"] == round(778 / 962, 4)
    assert json.loads(json.dumps(got)) == got


# A shared-checkpoint job: S1 R0 fails at +200 having saved step 10; the supervisor holds
# submission 2 (+230) until a person releases it (+830); it starts at +850 from step 10 and
# is still running.
HELD = {
    "id": "dheld",
    "checkpoint": "/ck",
    "submissions": [
        {
            "submission": 1,
            "slurm_job_id": "7",
            "task": None,
            "submitted": T0 - 5,
            "reason": "first",
        },
        {
            "submission": 2,
            "slurm_job_id": "8",
            "task": None,
            "submitted": T0 + 230,
            "reason": "failed: held (shared checkpoint)",
        },
    ],
    "executions": [
        {
            "submission": 1,
            "restart": 0,
            "node": "n1",
            "started": T0 + 1,
            "state": "FAILED (recorded)",
            "exec_dir": "/ck/exec/A",
            "resume_from": "",
            "facts": facts(T0, T0 + 200, {"n1": T0 + 201}),
        },
        {
            "submission": 2,
            "restart": 0,
            "node": "n2",
            "started": T0 + 852,
            "state": "RUNNING",
            "exec_dir": "/ck/exec/B",
            "resume_from": "/ck/exec/A/checkpoint-10",
            "facts": [],
        },
    ],
    "events": [
        {
            "event": "hold",
            "time": T0 + 230,
            "submission": 2,
            "slurm_job_id": "8",
            "end_state": "failed",
        },
        {"event": "released", "time": T0 + 830, "slurm_job_id": "8", "by": "alice"},
    ],
}


def test_a_job_held_then_released() -> None:
    got = goodput.figures(HELD, [mark(101, "A", 10), mark(952, "B", 20)], now=T0 + 1052)
    old, new = got["executions"]
    assert old["cause"] == "failed" and new["cause"] is None  # still running
    # The gap of 651 s (+200 to +851, its first record the launcher's start) held 600 s of it.
    assert (new["waited_s"], new["held_s"]) == (652.0, 600.0)
    assert (new["resumed_step"], new["redone_steps"]) == (10, 0)
    # A running execution's allocation runs to now; one save says no pace: no restore.
    assert (new["allocated_s"], new["restore_s"], new["lost_s"]) == (200.0, None, 0.0)
    assert (old["allocated_s"], old["lost_s"]) == (200.0, 100.0)  # after step 10 (+101)
    assert got["restarts_by_cause"]["failed"] == 1 and got["restarts"] == 1
    assert (got["waited_s"], got["held_s"]) == (5.0 + 652.0, 600.0)
    assert got["goodput"] == round(300 / 400, 4)


def test_a_job_with_no_execution_and_a_requeue_without_facts() -> None:
    empty = goodput.figures({"executions": [], "events": []}, [], now=T0)
    assert (empty["restarts"], empty["goodput"], empty["executions"]) == (0, None, [])
    bare = {
        "executions": [
            {
                "submission": 1,
                "restart": 0,
                "started": T0,
                "state": "REQUEUED (recorded)",
                "exec_dir": "/ck/exec/A",
                "facts": [],
            },
            {
                "submission": 1,
                "restart": 1,
                "started": T0 + 60,
                "state": "RUNNING",
                "exec_dir": "/ck/exec/B",
                "resume_from": "/ck/exec/gone/checkpoint-3",
                "facts": [],
            },
        ],
        "events": [],
        "submissions": [],
    }
    got = goodput.figures(bare, [], now=T0 + 100)
    first, second = got["executions"]
    # No hooks' record: the cause of Slurm's requeue is not known, and never guessed; a
    # resume source no longer published has no step, so nothing redone is computed.
    assert first["cause"] == "unknown" and got["restarts_by_cause"]["unknown"] == 1
    assert (second["resumed_step"], second["redone_steps"]) == (None, None)
    assert first["ended"] == T0 + 60  # the successor's start: an upper bound


def test_a_restart_after_a_stop_for_want_of_progress_counts_as_no_progress() -> None:
    """--max-no-progress: the supervisor held Slurm's requeued job after S1 R0;
    a person released it, S1 R1 ran and is stopped again: both count as no progress."""
    data = {
        "executions": [
            {
                "submission": 1,
                "restart": r,
                "attempt": f"a{r}",
                "started": T0 + 100 * r,
                "state": "REQUEUED (recorded)",
                "exec_dir": f"/ck/exec/a{r}",
                "facts": [],
            }
            for r in (0, 1)
        ],
        "events": [
            {
                "event": "no-progress",
                "time": T0 + 50 + 100 * r,
                "submission": 1,
                "slurm_job_id": "7",
                "executions": [[1, r, f"a{r}"]],
                "action": "held",
            }
            for r in (0, 1)
        ],
        "submissions": [],
    }
    got = goodput.figures(data, [], now=T0 + 300)
    assert [e["cause"] for e in got["executions"]] == ["no progress", "no progress"]
    assert got["restarts_by_cause"]["no progress"] == 1 and got["restarts"] == 1


def test_marks_read_publication_and_save_times(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "A" / "checkpoint-5"
    save.mkdir(parents=True)
    name = store.publish(str(tmp_path), 1_000_000, 5, str(save))
    os.utime(save, (T0 - 4, T0 - 4))
    os.utime(tmp_path / "pub" / name, (T0, T0))
    (found,) = goodput.marks(str(tmp_path))
    assert (found.time, found.saved, found.step, found.latest) == (T0, T0 - 4, 5, True)


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> record.JobRecord:
    done = fresh_job(tmp_path, monkeypatch)
    ck = tmp_path / "ck"
    for restart in (0, 1):
        folder = ck / "exec" / f"a{restart}"
        save = folder / f"checkpoint-{10 * (restart + 1)}"
        save.mkdir(parents=True)
        store.publish(str(ck), 1_000_000 + restart, 10 * (restart + 1), str(save))
        done.job.append(
            "started",
            submission=1,
            slurm_job_id="7",
            array_job_id="",
            array_task_id="",
            restart=restart,
            attempt=f"a{restart}",
            epoch=1_000_000 + restart,
            exec_dir=str(folder),
            resume_from=str(ck / "exec" / "a0" / "checkpoint-10") if restart else "",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )
    return done.job


def test_status_shows_the_summary_and_json_has_it_all(
    job: record.JobRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = status.collect(job, {}, facts_reader=lambda jobid: [])
    got = data["goodput"]
    assert [e["resumed_step"] for e in got["executions"]] == [0, 10]
    assert got["restarts"] == 1 and got["restarts_by_cause"]["unknown"] == 1
    line = next(x for x in status_text.render(data).splitlines() if x.startswith("Goodput"))
    assert "1 restart (unknown 1)" in line and "0 steps redone" in line
    monkeypatch.setattr(status, "_facts_reader", lambda: None)
    monkeypatch.setattr("slurm_dispatch.slurm.adapter.Slurm.own_jobs", lambda self, **kw: {})
    result = CliRunner().invoke(cli.main, ["status", "--json", job.id])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)["goodput"]
    assert set(shown) >= {"executions", "restarts_by_cause", "lost_s", "goodput"}
    assert set(shown["executions"][1]) >= {
        "waited_s",
        "held_s",
        "redone_steps",
        "restore_s",
        "save_latency_s",
        "cause",
        "lost_s",
    }


@pytest.mark.parametrize("state", ["COMPLETED (recorded)", "RUNNING"])
def test_a_finished_execution_whose_node_recorded_no_end_is_not_open(state: str) -> None:
    """A node cut off for good never records its end: the execution stayed open for ever,
    its progress age grew for ever and SlurmDispatchNoProgress fired for a job long done.
    An end state Slurm gave, or the lineage's finished event, closes it."""
    data = {
        "id": "dfinish",
        "checkpoint": "/ck",
        "submissions": [{"submission": 1, "task": None, "submitted": T0 - 5}],
        "events": [
            {"event": "finished", "time": T0 + 100, "submission": 1, "end_state": "completed"}
        ]
        if state == "RUNNING"
        else [],
        "executions": [
            {
                "submission": 1,
                "restart": 0,
                "node": "n1",
                "started": T0,
                "state": state,
                "exec_dir": "/ck/exec/A",
                "resume_from": "",
                "facts": [{"restart": 0, "nodes": {"n1": {"start": {"time": T0}}}}],
            }
        ],
    }
    (got,) = goodput.figures(data, [], T0 + 86400)["executions"]
    assert got["open"] is False
