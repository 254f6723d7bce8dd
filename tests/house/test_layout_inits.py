"""The layout's ``__init__`` files import nothing (docs/architecture.md), so importing one side
never loads another: the hooks stay standard-library only, ``dispatch-sbatch`` imports no click, and
``dispatch publish`` (in the job) never loads the control side.

Two exceptions, each named here: ``slurm_dispatch/hooks/__init__.py`` is the hooks' entry point
(``from slurm_dispatch.hooks import run`` in every node's ``contrib`` part; its imports are
standard library only, which tests/house/test_hook_imports.py checks), and a package may have a
PEP 562 module ``__getattr__`` whose body imports lazily and an ``if TYPE_CHECKING:`` block for
the type checker (neither runs at import time)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"
# The hooks' entry point keeps its path and its code (docs/architecture.md, paths that never move).
ENTRY_POINTS = {"hooks/__init__.py"}


def imports_at_import_time(tree: ast.Module) -> list[str]:
    """Import statements that run when the module is imported: at module level, or inside a
    module-level ``if``/``try``/``with`` (not inside a function or class body, nor under ``if
    TYPE_CHECKING:``), apart from ``from __future__``."""
    found: list[str] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)  # its body is for the type checker only
        else:
            pending.extend(ast.iter_child_nodes(node))
    return sorted(found)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def test_every_init_file_imports_nothing() -> None:
    inits = sorted(PACKAGE.rglob("__init__.py"))
    assert len(inits) >= 10, inits  # the top level and a subpackage per side
    offenders = {}
    for path in inits:
        name = path.relative_to(PACKAGE).as_posix()
        if name in ENTRY_POINTS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        functions = [
            n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        assert set(functions) <= {"__getattr__", "__dir__"}, (name, functions)
        found = imports_at_import_time(tree)
        if found:
            offenders[name] = found
    assert offenders == {}, offenders


def test_the_check_sees_an_import_at_import_time() -> None:
    seen = imports_at_import_time(
        ast.parse(
            "from __future__ import annotations\nimport os\ntry:\n    from . import x\n"
            "except ImportError:\n    pass\n"
            "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .adapter import Slurm\n"
            "else:\n    import json\n"
            "def __getattr__(name):\n    from . import adapter\n    return adapter\n"
        )
    )
    assert seen == ["line 11: import json", "line 2: import os", "line 4: from . import x"]
