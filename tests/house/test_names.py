"""Names that mislead: no two classes of the package share a name unless listed here with
why (the layout move found two ``Submitted`` classes, the recorded event and what a submission
returns, and two ``Runner`` names, now ``submit.SubmissionMade`` and ``watch.WatchLoop``)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"

# Class name: the modules that may each define it, and why the name is shared.
SHARED = {
    # Each command's private click group or command with the shell mixed in.
    "_Shell": {"cli/admin.py", "cli/cease.py", "cli/dispatch.py", "cli/sandbox.py"},
    # One callback per framework, each in its framework's integration module.
    "DispatchCallback": {"integrations/lightning.py", "integrations/transformers.py"},
    # Two views of the launcher's environment, both read by one execution.contract.Contract:
    # the public identity (api.Execution) and the integrations' save-time view.
    "Execution": {"execution/contract.py", "execution/saves.py"},
}


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].add(str(path.relative_to(PACKAGE)))
    shared = {name: found for name, found in where.items() if len(found) > 1}
    unexplained = {
        name: sorted(found)
        for name, found in shared.items()
        if not found <= SHARED.get(name, set())
    }
    assert not unexplained, (
        f"classes of one name in several modules: {unexplained}; give "
        "each its own name, or list it in SHARED with why"
    )
