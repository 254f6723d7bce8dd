"""The sandbox package keeps one home per idea: read from its source (ast), nothing is run.

``slurm_dispatch/sandbox/`` was one module of six ideas; it is a module per idea now (layout,
state_folder, clients, daemons, nodes, install, machine, slurm_conf, root, and cluster with the
verbs).  These checks fail when a second copy of a name, or of the state folder's open flags,
appears in another module, when ``up`` grows back into a long body instead of a sequence of
named steps, or when the library outside the sandbox starts to depend on the dev cluster.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"
SANDBOX = PACKAGE / "sandbox"


def modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(SANDBOX.glob("*.py"))}


def top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_each_name_of_the_sandbox_is_defined_in_one_module() -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for module, tree in modules().items():
        for name in top_level_names(tree):
            homes[name].append(module)
    twice = {name: where for name, where in homes.items() if len(where) > 1}
    assert not twice, f"defined in more than one sandbox module: {twice}"


def test_only_the_state_folder_module_opens_files_in_the_state_folder() -> None:
    # Its open flags come from slurm_dispatch._fsio (tests/unit/test_fsio.py keeps them there);
    # appending, locking and the fresh temporary name of a replaced file are state_folder's.
    for module, tree in modules().items():
        if module == "state_folder":
            continue
        spelled = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr in ("O_APPEND", "O_CREAT", "mkstemp", "flock", "fdopen")
        }
        assert not spelled, (
            f"sandbox/{module}.py spells {sorted(spelled)}: files under the "
            "state folder are opened through state_folder"
        )


def test_up_is_a_short_sequence_of_named_steps() -> None:
    tree = modules()["cluster"]
    up = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "up")
    body = up.body[1:]  # the docstring
    assert isinstance(up.body[0], ast.Expr)
    # Statements, not lines: the formatter spreads one call over several lines.
    statements = sum(isinstance(node, ast.stmt) for step in body for node in ast.walk(step))
    assert statements <= 12, f"up is {statements} statements again: give the new part a named step"


def imported(path: Path, tree: ast.Module) -> set[str]:
    """The absolute names of the modules ``path`` imports (``from X import y`` gives X.y too)."""
    package = ["slurm_dispatch", *path.relative_to(PACKAGE).parent.parts]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_library_outside_the_sandbox_does_not_import_it() -> None:
    # The dev cluster is the CLI's and the tests': no other side of the library depends on it.
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent == SANDBOX or path == PACKAGE / "cli" / "sandbox.py":
            continue
        found = sorted(
            name
            for name in imported(path, ast.parse(path.read_text()))
            if name == "slurm_dispatch.sandbox" or name.startswith("slurm_dispatch.sandbox.")
        )
        assert not found, f"{path.relative_to(PACKAGE)} imports {found}"
