"""Slurm's array-range grammar has one home, slurm_dispatch/slurm/arrays.py: a user's
``--array`` (control/submit.py) and the controller's array task string (the pyslurm backend)
are read by it, and each caller's error names the bad value as it did."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path

import pytest

from slurm_dispatch.control import sbatch_words
from slurm_dispatch.errors import SlurmError, UsageError
from slurm_dispatch.slurm import arrays


@pytest.mark.parametrize(
    "value, tasks",
    [
        ("0-15,20%4", [*range(16), 20]),
        ("1-7:2", [1, 3, 5, 7]),
        ("3", [3]),
        ("0-15:4%2", [0, 4, 8, 12]),
        ("5,1,3-4", [1, 3, 4, 5]),
        ("2-2", [2]),
        ("1,1", [1]),
    ],
)
def test_task_ids(value: str, tasks: list[int]) -> None:
    assert arrays.task_ids(value) == tasks == sbatch_words.parse_array(value)


@pytest.mark.parametrize("value", ["", "a", "3-1", "-1", "1-3:0", "1,,2", "1-3:x", "%4"])
def test_a_bad_value_names_itself(value: str) -> None:
    with pytest.raises(arrays.ArrayRangeError) as caught:
        arrays.task_ids(value)
    assert caught.value.value == value
    with pytest.raises(UsageError) as user:
        sbatch_words.parse_array(value)
    assert str(user.value) == (
        f"--array {value!r} is not a list of task ids (like 0-15:4%2 or 1,3,5-7)"
    )


def test_spans_keep_the_order_written() -> None:
    assert [list(s) for s in arrays.spans("4-5,0-1:1%9")] == [[4, 5], [0, 1]]


def test_the_pyslurm_backend_reads_task_strings_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", types.ModuleType("pyslurm"))
    monkeypatch.delitem(sys.modules, "slurm_dispatch.slurm.pyslurm_backend", raising=False)
    backend = importlib.import_module("slurm_dispatch.slurm.pyslurm_backend")
    try:
        assert backend.task_ids("2-5%1") == [2, 3, 4, 5]
        assert backend.task_ids("4-10:3,1") == [4, 7, 10, 1]  # as the controller wrote it
        with pytest.raises(SlurmError) as caught:
            backend.task_ids("2-x")
        assert str(caught.value).startswith(
            "pyslurm gave the array task string '2-x', which does not parse"
        )
    finally:
        monkeypatch.delitem(sys.modules, "slurm_dispatch.slurm.pyslurm_backend")


def _splits(func: ast.AST) -> set[str]:
    return {
        arg.value
        for node in ast.walk(func)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("split", "partition", "rpartition")
        for arg in node.args[:1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def test_no_other_range_parser() -> None:
    """What counts as a range parser: a function that splits text on ",", "-" and ":" (a
    list of ranges with steps; a duration's D-H:M:S has no ","), outside slurm/arrays.py."""
    package = Path(arrays.__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "arrays.py" and path.parent.name == "slurm":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for func in ast.walk(tree):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and {
                ",",
                "-",
                ":",
            } <= _splits(func):
                found.append(f"{path.relative_to(package)}:{func.lineno} {func.name}")
    assert found == [], "array ranges are parsed by slurm_dispatch/slurm/arrays.py only"


def test_an_id_beyond_any_slurms_max_array_size_is_refused_at_once() -> None:
    # sbatch(1) takes task ids below MaxArraySize, which slurm.conf(5) caps at 4000001: a
    # larger id (a typo, 0-10000000000) is refused by every Slurm.  Read as it was, it made a
    # set of ten billion ids and dispatch-sbatch ate memory until killed; now it is a
    # UsageError naming the value and the limit, before anything is made.
    assert arrays.MAX_TASK_ID == 4_000_000
    assert arrays.task_ids("3999999-4000000") == [3_999_999, 4_000_000]
    assert arrays.task_ids("0-4000005:2000000") == [0, 2_000_000, 4_000_000]  # ids, not ends
    for value in ("0-10000000000", "4000001", "0-10000000000:1000000000", "1,99999999999%2"):
        with pytest.raises(arrays.ArrayRangeError) as caught:
            arrays.spans(value)
        assert caught.value.value == value
        with pytest.raises(UsageError) as user:
            sbatch_words.parse_array(value)
        assert str(user.value) == (
            f"--array {value!r}: a task id above 4000000 is beyond every Slurm's "
            "MaxArraySize (at most 4000001), so sbatch would refuse it"
        )
