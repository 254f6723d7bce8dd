"""slurm_dispatch/checkpoint/roots.py is the one home of the checkpoint-root patterns."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import slurm_dispatch
from slurm_dispatch.checkpoint import roots
from slurm_dispatch.errors import UsageError

PACKAGE = Path(slurm_dispatch.__file__).parent
# A string that is exactly a pattern or its '%' is a reading of the patterns; messages and help
# texts that mention them are longer strings and are let through.
PATTERN_PIECES = {"%", "%a", "%A", "%j", "%%"}
EXCEPT = {
    "checkpoint/roots.py",
    "slurm/arrays.py",  # its '%' is sbatch --array's throttle (0-15%4), not a root's pattern
    # Its %u and %h are dispatch-admin's --records pattern (a user's record home), not a root's.
    "control/siteview.py",
}


def test_root_patterns_are_read_only_in_roots() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if relative in EXCEPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), relative)):
            if isinstance(node, ast.Constant) and node.value in PATTERN_PIECES:
                found.append(f"{relative}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.FunctionDef) and node.name in ("expand_root", "per_task"):
                found.append(f"{relative}:{node.lineno} def {node.name}")
    assert not found, f"use slurm_dispatch.checkpoint.roots instead: {found}"


def test_patterns_expand_left_to_right() -> None:
    env = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_JOB_ID": "40", "SLURM_JOB_ID": "43"}
    assert roots.expand("ck/t%a/%A/%j/%%a/%x/%", env) == "ck/t3/40/43/%a/%x/%"
    assert roots.expand("ck/%A", {"SLURM_JOB_ID": "7"}) == "ck/7"
    assert roots.for_task("ck/t%a", 5) == "ck/t5" and roots.one_root("ck/100%%") == "ck/100%"
    assert [
        roots.per_task(r) for r in ("ck/%a", "ck/%%a", "ck/%%%a", "ck/%x%a", "ck/a%", "ck")
    ] == [True, False, True, True, False, False]
    assert roots.fixed_folder("/s/ck/task%a") == "/s/ck"
    assert roots.fixed_folder("/s/ck%a") == "/s" and roots.fixed_folder("/s/ck") == "/s/ck"
    assert roots.fixed_folder("%a") == "/"
    assert roots.has_patterns("ck/100%%") and not roots.has_patterns("ck")


def test_a_changing_root_is_refused_in_the_same_words() -> None:
    roots.refuse_changing("ck/%%j/t%a")
    with pytest.raises(
        UsageError,
        match=r"'ck/%j-%A': %j and %A would give every submission "
        r"a new root",
    ):
        roots.refuse_changing("ck/%j-%A")
