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

from slurm_dispatch.slurm import jobs

PACKAGE = Path(jobs.__file__).resolve().parents[1]
HOME = Path(jobs.__file__).resolve()
WORDS = frozenset(jobs.STATE_CODES.values()) | jobs.HOLD_REASONS


def _state_names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Dict):
        items = [*node.keys, *node.values]
    elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        items = list(node.elts)
    else:
        return set()
    return {item.value for item in items
            if isinstance(item, ast.Constant) and isinstance(item.value, str)
            and item.value in WORDS}


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
        "name the set there and import it")


def test_the_scan_sees_a_copy(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        'OPEN = ("RUNNING", "COMPLETING")\nok = x == "PENDING"\n'
        'ENDS = {"failed": "FAILED", "timeout": "TIMEOUT"}\n')
    found = second_copies(tmp_path / "pkg")
    assert [line.split(":")[1] for line in found] == ["1", "3"]


def test_the_vocabulary_agrees_with_itself() -> None:
    every = set(jobs.STATE_CODES.values())
    assert jobs.FINAL_STATES | jobs.REQUEUE_STATES | jobs.RUNNING_STATES <= every
    assert not jobs.FINAL_STATES & jobs.REQUEUE_STATES
    assert set(jobs.END_STATES) == jobs.FINAL_STATES
    # Each rule name maps back to a state that maps to it.
    assert all(jobs.END_STATES[state] == name for name, state in jobs.SLURM_END.items())
    assert set(jobs.SLURM_END) == set(jobs.END_STATES.values())
    assert jobs.end_name("SOMETHING_NEW") == "failed"
    assert jobs.is_running("SUSPENDED") and not jobs.is_running("PENDING")
    assert jobs.Job("1", "PENDING").is_pending and not jobs.Job("1", "RUNNING").is_pending
