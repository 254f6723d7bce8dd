"""The job-state vocabulary has one home, slurm_dispatch/slurm/jobs.py.

What counts as a second copy: a set, tuple, list or dict literal (a ``frozenset({...})`` is one)
anywhere in slurm_dispatch/ outside slurm/jobs.py that holds two or more of Slurm's job state
names (squeue's full list, ``jobs.STATE_CODES``'s values) or its hold reasons, as string
constants, among its items, keys or values.  One comparison with one state
(``job.state == "PENDING"`` in the adapter's parsers) is a use of the vocabulary, not a copy.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slurm_dispatch.slurm import jobs

PACKAGE = Path(jobs.__file__).resolve().parents[1]
HOME = Path(jobs.__file__).resolve()
WORDS = jobs.STATE_NAMES | jobs.HOLD_REASONS


def _state_names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        items = [*node.keys, *node.values]
    elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        items = list(node.elts)
    else:
        return set()
    return {
        item.value
        for item in items
        if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in WORDS
    }


def second_copies(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.resolve() == HOME:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            names = _state_names(node)
            if len(names) >= 2:
                line = getattr(node, "lineno", 0)
                found.append(f"{path.relative_to(root.parent)}:{line}: {sorted(names)}")
    return found


def test_no_state_vocabulary_outside_its_home() -> None:
    assert second_copies() == [], (
        "Slurm job-state names are collected outside slurm_dispatch/slurm/jobs.py; "
        "name the set there and import it"
    )


def test_the_scan_sees_a_copy(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        'OPEN = ("RUNNING", "COMPLETING")\nok = x == "PENDING"\n'
        'ENDS = {"failed": "FAILED", "timeout": "TIMEOUT"}\n'
    )
    found = second_copies(tmp_path / "pkg")
    assert [line.split(":")[1] for line in found] == ["1", "3"]


def test_the_vocabulary_agrees_with_itself() -> None:
    every = jobs.STATE_NAMES
    assert set(jobs.STATE_CODES.values()) <= every
    assert jobs.WAITING_STATES <= every and jobs.PENDING in jobs.WAITING_STATES
    assert jobs.FINAL_STATES | jobs.REQUEUE_STATES | jobs.RUNNING_STATES <= every
    assert not jobs.FINAL_STATES & jobs.REQUEUE_STATES
    assert set(jobs.END_STATES) == jobs.FINAL_STATES
    # Each rule name maps back to a state that maps to it.
    assert all(jobs.END_STATES[state] == name for name, state in jobs.SLURM_END.items())
    assert set(jobs.SLURM_END) == set(jobs.END_STATES.values())
    assert jobs.end_name("SOMETHING_NEW") == "failed"
    assert jobs.is_running("SUSPENDED") and not jobs.is_running("PENDING")
    assert jobs.Job("1", "PENDING").is_pending and not jobs.Job("1", "RUNNING").is_pending


def _task(
    job_id: str, array: str, task: int, state: str = "RUNNING", comment: str = ""
) -> jobs.Job:
    return jobs.Job(job_id, state, array_job_id=array, array_task_id=task, comment=comment)


def test_one_submissions_view_in_one_read() -> None:
    read = jobs.index_jobs(
        [
            _task("98", "97", 1, "FAILED"),
            _task("97", "97", 2, "PENDING"),
            _task("97", "97", 0),
            jobs.Job("50", "RUNNING", comment="dispatch:dabc/1"),
        ]
    )
    seen = jobs.Snapshot(read)
    assert [j.display_id for j in seen.views("97")] == ["97_0", "97_1", "97_2"]
    assert [j.display_id for j in seen.views("97", 1)] == ["97_1"]
    assert seen.views("97", 5) == [] and seen.views("51") == []
    assert [j.job_id for j in seen.views("50")] == ["50"]
    assert seen.tasks("50") == []  # a plain job has no tasks
    assert [j.job_id for j in seen.marked("dispatch:dabc/1")] == ["50"]
    assert len(seen.jobs()) == 4  # one Job under two keys counts once
    assert seen.get("98") is seen.get("97_1")


def test_the_array_index_lives_with_its_read() -> None:
    first = jobs.Snapshot(jobs.index_jobs([_task("97", "97", 0)]))
    second = jobs.Snapshot(
        jobs.index_jobs([_task("97", "97", 0, "COMPLETED"), _task("97", "97", 1, "COMPLETED")])
    )
    assert [j.state for j in first.views("97")] == ["RUNNING"]
    assert [j.state for j in second.views("97")] == ["COMPLETED", "COMPLETED"]
    assert [j.state for j in first.views("97")] == ["RUNNING"]  # not the later read's


def test_no_module_level_cache_of_slurm_reads() -> None:
    """A submission's Slurm jobs are found through slurm.jobs.Snapshot, whose index is the
    read's own: no module of the control side keeps one keyed by object identity."""
    for path in sorted((PACKAGE / "control").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        calls = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "id"
        ]
        assert calls == [], f"{path}: id() at lines {calls}: use slurm.jobs.Snapshot"


def test_expediting_means_requeued_to_start_at_once() -> None:
    """25.11's EXPEDITING (--requeue=expedite) is a job whose execution ended
    (node failure, non-zero exit) and that Slurm requeued to start again at once, first in the
    queue: ended, not final, waiting, not held.  It read as an execution still under way."""
    job = jobs.Job("7", "EXPEDITING", restarts=1)
    assert jobs.execution_ended("EXPEDITING") and job.execution_ended
    assert job.is_active and not job.is_final and not jobs.is_running(job.state)
    assert job.is_pending and not job.is_held and not job.started
    assert "EXPEDITING" in jobs.STATE_NAMES and "EXPEDITING" in jobs.REQUEUE_STATES


@pytest.mark.parametrize(
    "reason,held",
    [
        ("job requeued in held state", True),  # scontrol show job, squeue
        ("job_requeued_in_held_state", True),  # pyslurm
        ("launch failure limit exceeded requeued held", True),  # MaxBatchRequeue
        ("JobHeldUser", True),
        ("None", False),  # released: REQUEUE_HOLD until it next starts
        ("BeginTime", False),
    ],
)
def test_requeue_hold_is_held_until_released(reason: str, held: bool) -> None:
    """REQUEUE_HOLD (scontrol requeuehold; from 25.11 an expedited requeue after a non-zero exit
    with no Epilog failed) waits with priority 0 until released, and keeps its name after the
    release: held is what its reason says.  It read as neither pending nor held."""
    job = jobs.Job("7", "REQUEUE_HOLD", reason=reason, restarts=1)
    assert job.is_pending and job.execution_ended and not job.is_final
    assert job.is_held is held
    assert jobs.Job("8", "SPECIAL_EXIT", reason="job requeued in special exit state").is_held
