"""The sides import one another only as docs/architecture.md draws them.

Every import of one module of ours by another (at any depth: lazy imports inside functions
count, as they run when that path runs) is an edge from the importer's side to the imported
one's.  ``ALLOWED`` is the whole drawing; an edge outside it fails, naming the import, so a
layer leak is a test failure, not a review comment.  The sides are the subpackages, and the
top-level modules each stand for themselves (``errors``, ``config``, ``_fsio``, ``_clock``,
``_table``, ``_account``, ``api``, ``launch``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"
BASE = {"errors", "config", "_fsio", "_clock", "_table", "package"}
ALLOWED: dict[str, set[str]] = {
    # The protocol knows nothing of Slurm, the job, the control side or the commands.
    "checkpoint": BASE,
    # The one adapter: nothing of ours above it.
    "slurm": BASE,
    # Root-run evidence: the adapter (dispatch-cease asks Slurm what ran where), and work as
    # another account (the doctor probes as SlurmUser), nothing else.
    "node": BASE | {"slurm", "_account"},
    # What Slurm's hooks run: the node side's stores and the host-list reader only (their
    # standard-library budget is tests/house/test_hook_imports.py's).
    "hooks": BASE | {"node", "slurm"},
    # The login node, as the job's user: it reads facts (node) and publications (checkpoint);
    # root's site view reads each user's records as that user (_account).
    "control": BASE | {"checkpoint", "slurm", "node", "_account"},
    # Inside the job: the launcher reads its job's record and resubmits (control), and asks
    # Slurm; never the framework integrations, which build on it.
    "execution": BASE | {"checkpoint", "control", "slurm"},
    # The framework callbacks: in-job save rules (execution), publication (checkpoint), the
    # requeue's record (control), and the requeue itself (slurm: the job asks scontrol).
    "integrations": BASE | {"checkpoint", "execution", "control", "slurm"},
    "api": BASE | {"checkpoint", "control", "execution", "slurm"},
    "launch": {"execution"},
    # Entry points of before the move, kept for one release (console scripts an editable install
    # wrote then still import them): each is the command it was.
    "cli_sbatch": {"cli"},
    "cli_cease": {"cli"},
    "cli_sandbox": {"cli"},
    "cli": BASE | {"checkpoint", "control", "execution", "node", "slurm", "sandbox", "_account"},
    "sandbox": BASE,
}
for _side in ("errors", "config", "_fsio", "_clock", "_table", "_account", "package"):
    ALLOWED[_side] = {"errors"} if _side != "errors" else set()


def side_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    return parts[1]


def edges() -> list[tuple[str, str, str]]:
    """(importer, imported, where) for every import of one of our modules by another."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        module = ".".join(parts)
        package = parts if is_package else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                if full == "slurm_dispatch":
                    targets = [f"{full}.{a.name}" for a in node.names]
                else:
                    targets = [full]
            else:
                targets = [a.name for a in node.names]
            for target in targets:
                if target.split(".")[0] != "slurm_dispatch":
                    continue
                found.append((module, target, f"{path.relative_to(PACKAGE)}:{node.lineno}"))
    return found


def test_every_side_imports_only_what_the_drawing_allows() -> None:
    wrong = []
    for importer, imported, where in edges():
        a, b = side_of(importer), side_of(imported)
        if b == "__version__":
            b = "package"
        if a != b and b not in ALLOWED[a]:
            wrong.append(f"{where}: {importer} ({a}) imports {imported} ({b})")
    assert not wrong, "\n".join(wrong)


def test_the_scan_sees_lazy_and_relative_imports() -> None:
    found = {(i, t) for i, t, _ in edges()}
    # a relative import at module level, and a lazy one inside a function
    assert ("slurm_dispatch.hooks.evidence", "slurm_dispatch.node.factstore") in found or (
        "slurm_dispatch.hooks.evidence",
        "slurm_dispatch.node",
    ) in found
    assert any(
        i == "slurm_dispatch.hooks" and t.startswith("slurm_dispatch.hooks") for i, t in found
    )
    assert all(
        set(ALLOWED) >= {side_of(i), side_of(t)} or side_of(t) == "__version__" for i, t in found
    ), "a module of a side the drawing does not know"
