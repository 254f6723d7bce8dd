"""The event schema and the per-job history: versions, validation per job, array tasks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_dispatch import _fsio
from slurm_dispatch.control import events, record
from slurm_dispatch.errors import RecordError


@pytest.fixture
def job(tmp_path: Path) -> record.JobRecord:
    return record.create_job({"resubmit": 1}, b"#!/bin/bash\n", str(tmp_path / "home"))


def store_raw(job: record.JobRecord, name: str, data: object) -> Path:
    path = Path(job.path) / "events" / name
    path.write_text(json.dumps(data))
    return path


# Events as version 1 wrote them (no "v", no "task"), one of each kind the supervisor made.
V1 = [
    {
        "event": "submitted",
        "time": 1.0,
        "ns": 1_000_000_000,
        "submission": 1,
        "slurm_job_id": "7",
        "reason": "first",
        "argv": ["sbatch", "x"],
    },
    {
        "event": "started",
        "time": 2.0,
        "ns": 2_000_000_000,
        "submission": 1,
        "slurm_job_id": "7",
        "array_job_id": "",
        "array_task_id": "",
        "restart": 0,
        "attempt": "a" * 26,
        "epoch": 1_000_000,
        "exec_dir": "/ck/exec/a",
        "resume_from": "",
        "node": "n1",
        "nodes": "n1",
        "host": "h",
        "pid": 9,
    },
    {
        "event": "submitted",
        "time": 3.0,
        "ns": 3_000_000_000,
        "submission": 2,
        "slurm_job_id": "8",
        "reason": "node failure: held",
        "argv": [],
    },
    {
        "event": "hold",
        "time": 3.1,
        "ns": 3_100_000_000,
        "submission": 2,
        "slurm_job_id": "8",
        "ended_slurm_job_id": "7",
        "ended_restart": 0,
        "end_state": "node failure",
        "deadline": 90_000.0,
        "instead_of": "resubmit",
    },
    {
        "event": "cessation",
        "time": 4.0,
        "ns": 4_000_000_000,
        "asked_at": 4.0,
        "held_slurm_job_id": "8",
        "ended_slurm_job_id": "7",
        "verdict": "not ceased",
        "code": 1,
        "evidence": {"nodes": []},
        "command": ["dispatch-cease", "7"],
    },
]


def test_version_1_records_are_read_and_answer_the_history(job: record.JobRecord) -> None:
    for i, data in enumerate(V1):
        store_raw(job, f"{i:020d}-{data['event']}-old.json", data)
    history = job.history()
    assert [e.v for e in history.events] == [1] * len(V1)
    assert [type(e) for e in history.events] == [
        events.Submitted,
        events.Started,
        events.Submitted,
        events.Hold,
        events.Cessation,
    ]
    assert history.next_submission == 3 and not history.settled
    hold = history.hold
    assert hold is not None and (hold.slurm_job_id, hold.deadline) == ("8", 90_000.0)
    assert [a.verdict for a in history.lineage().answers_for("8")] == ["not ceased"]
    job.append(events.Released, slurm_job_id="8", by="cessation signal")
    assert job.history().hold is None
    assert job.events()[0] == V1[0]  # the stored objects, for readers of raw records


def test_new_events_carry_the_format_version(job: record.JobRecord) -> None:
    made = job.append("submitted", once="1", submission=1, slurm_job_id="7", reason="first")
    assert made is not None and made.v == events.VERSION == 2
    stored = json.loads((Path(job.path) / "events" / "submitted-1.json").read_text())
    assert stored["v"] == 2 and stored["event"] == "submitted" and "task" not in stored
    assert job.append("submitted", once="1", submission=1, slurm_job_id="9") is None


@pytest.mark.parametrize(
    "data, says",
    [
        ([1, 2], "a JSON object, not list"),
        ({"time": 1.0, "ns": 1, "submission": 1}, "no 'event' kind"),
        (
            {"event": "submitted", "time": 1.0, "ns": 1, "submission": "2a", "slurm_job_id": "7"},
            "field 'submission' is '2a', not int",
        ),
        (
            {"event": "submitted", "time": 1.0, "ns": 1, "submission": True, "slurm_job_id": "7"},
            "field 'submission' is True, not int",
        ),
        (
            {"event": "submitted", "time": 1.0, "ns": 1, "submission": 0, "slurm_job_id": "7"},
            "not a number from 1",
        ),
        (
            {
                "event": "hold",
                "time": 1.0,
                "ns": 1,
                "submission": 2,
                "slurm_job_id": "8",
                "ended_slurm_job_id": "7",
            },
            "'hold' event has no 'deadline'",
        ),
        ({"event": "teleported", "time": 1.0, "ns": 1}, "unknown event kind 'teleported'"),
        (
            {"event": "released", "v": 9, "time": 1.0, "ns": 1, "slurm_job_id": "8"},
            "format version 9, newer than this slurm-dispatch reads (2): upgrade",
        ),
        (
            {
                "event": "submitted",
                "v": 2,
                "time": 1.0,
                "ns": 1,
                "submission": 2,
                "slurm_job_id": "8",
                "hold": {"deadline": "soon"},
            },
            "field 'deadline' is 'soon'",
        ),
    ],
)
def test_an_event_of_the_wrong_shape_is_an_error_naming_its_file(
    job: record.JobRecord, data: object, says: str
) -> None:
    path = store_raw(job, "00000000000000000001-x-bad.json", data)
    with pytest.raises(RecordError) as caught:
        job.history()
    assert str(path) in str(caught.value) and says in str(caught.value)


def test_a_bad_event_is_refused_when_written(job: record.JobRecord) -> None:
    with pytest.raises(RecordError, match="field 'submission' is '2a', not int"):
        job.append("submitted", submission="2a", slurm_job_id="7")
    with pytest.raises(RecordError, match="unknown event kind 'nope'"):
        job.append("nope")
    assert os.listdir(Path(job.path) / "events") == []


def test_array_tasks_have_lineages_of_their_own(job: record.JobRecord) -> None:
    job.append("submitted", once="1", submission=1, slurm_job_id="97", reason="first")
    for task in (0, 1):
        job.append(
            "started",
            submission=1,
            slurm_job_id=str(98 + task),
            array_job_id="97",
            array_task_id=str(task),
            restart=0,
        )
    job.append(
        "submitted",
        once="2-t1",
        submission=2,
        slurm_job_id="120",
        task=1,
        hold={
            "deadline": 5.0,
            "ended_slurm_job_id": "97_1",
            "ended_restart": 0,
            "end_state": "failed",
        },
    )
    job.append(
        "finished",
        submission=1,
        slurm_job_id="97",
        task=0,
        end_state="completed",
        rule="stop (done)",
    )
    history = job.history()
    assert history.tasks == [0, 1]
    zero, one = history.lineage(0), history.lineage(1)
    assert (zero.settled, zero.next_submission, zero.hold) == (True, 2, None)
    assert not one.settled and one.next_submission == 3
    assert [s.slurm_job_id for s in one.started] == ["99"]
    hold = one.hold
    assert hold is not None and hold.recovered and hold.ended_slurm_job_id == "97_1"
    # A whole-job submission is numbered above every task's: task 1 already has a 2.
    assert not history.settled and history.next_submission == 3
    assert not history.settled_tasks([0, 1])
    job.append(
        "finished",
        submission=2,
        slurm_job_id="120",
        task=1,
        end_state="completed",
        rule="stop (done)",
    )
    assert job.history().settled_tasks([0, 1]) and not job.history().settled
    assert history.submission_of("99") is not None  # a task's own job id finds the job
    assert history.submission_of("97_1") is not None


def test_a_held_submission_without_its_hold_event_keeps_its_hold(job: record.JobRecord) -> None:
    # A pass killed between recording the submission and its hold event.
    job.append(
        "submitted",
        once="2",
        submission=2,
        slurm_job_id="8",
        reason="held",
        hold={
            "deadline": 123.0,
            "ended_slurm_job_id": "7",
            "ended_restart": 1,
            "end_state": "node failure",
            "instead_of": "resubmit",
        },
    )
    hold = job.history().hold
    assert hold is not None and (hold.deadline, hold.ended_restart) == (123.0, 1)


def test_claims_hold_their_intent_and_appear_whole(job: record.JobRecord) -> None:
    assert job.claim("submission-2", {"reason": "failed"}, now=50.0)
    assert not job.claim("submission-2", {"reason": "other"})
    (Path(job.path) / "claims" / "submission-2.stale").write_text("1234\n")  # version 1
    claims = job.claims("submission-2")
    assert [name for name, _ in claims] == ["submission-2", "submission-2.stale"]
    assert claims[0][1]["reason"] == "failed" and claims[0][1]["time"] == 50.0
    assert claims[1][1]["v"] == 1 and "reason" not in claims[1][1]
    assert job.claims("submission-3") == []
    assert not [n for n in os.listdir(Path(job.path) / "claims") if n.startswith(".")]


def test_write_loops_on_a_short_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls = []

    def short(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:3]))  # at most 3 bytes per call

    monkeypatch.setattr(os, "write", short)
    _fsio.write_new(str(tmp_path / "f"), b"0123456789")
    assert (tmp_path / "f").read_bytes() == b"0123456789" and len(calls) == 4


def test_events_are_frozen_records_compared_by_value() -> None:
    """Plain classes, not dataclasses (start-up speed), with what dataclasses gave: frozen,
    equal by fields (the stored object aside), a list default of their own each, every field
    checked against JSON, and an unknown field an error naming it."""
    a = events.new(events.Submitted, 1_700_000_000_000_000_000, submission=1, slurm_job_id="5")
    assert isinstance(a, events.Submitted), a
    b = events.parse({**a.fields(), "extra": "kept in raw"})
    assert a == b and b.raw["extra"] == "kept in raw" and hash(a) == hash(b)
    assert a != events.parse({**a.fields(), "submission": 2})
    with pytest.raises(AttributeError, match="frozen"):
        a.submission = 2  # type: ignore[misc]
    fresh = events.Submitted()
    fresh.argv.append("x")
    assert events.Submitted().argv == [] and a.argv == []
    for field, bad in [
        ("time", "noon"),
        ("task", -1),
        ("argv", "x"),
        ("hold", [1]),
        ("recovered", 1),
    ]:
        with pytest.raises(events.EventError, match=repr(field)):
            events.parse({**b.fields(), field: bad})
    assert events.parse({**b.fields(), "time": 3}).time == 3.0  # an int is a float
    with pytest.raises(TypeError, match="'colour'"):
        events.Submitted(colour="blue")
    intent = events.HoldIntent(
        deadline=1.0, ended_slurm_job_id="4", ended_restart=0, end_state="NODE_FAIL"
    )
    assert events.intent(intent.as_dict()) == intent
    with pytest.raises(events.EventError, match="'deadline'"):
        events.intent({"ended_slurm_job_id": "4", "ended_restart": 0, "end_state": "X"})


def test_a_record_that_cannot_be_written_whole_is_not_left_half_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = _fsio.write_new

    def write(path: str, data: bytes, mode: int) -> None:
        if path.endswith("job.json"):
            raise OSError(28, "No space left on device")
        real_write(path, data, mode)

    monkeypatch.setattr(_fsio, "write_new", write)
    home = tmp_path / "home"
    with pytest.raises(RecordError, match="cannot write the record .*No space left"):
        record.create_job({"resubmit": 1}, b"#!/bin/bash\n", str(home))
    assert os.listdir(record.jobs_dir(str(home))) == []
