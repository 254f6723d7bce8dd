"""What the package's docstrings name exists, and they cite pages of the repository.

A docstring that names a module, class or function in backquotes (```control.submit.submit_new```,
``:func:`slurm_dispatch.api.submit```) sends its reader there; after a move the name may be
gone while the docstring still says it.  Every dotted name whose first part is the package or
one of its top-level modules or subpackages is resolved: the longest importable module, then
its attributes.  And a docstring points at a page in docs/ (``docs/invariants.md, 9``), never
at a design note or an issue that the repository does not hold; nor does a docstring or a
comment of the tests, the soak or the benches, whose reader has no tracker either.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import slurm_dispatch

PACKAGE = Path(slurm_dispatch.__file__).resolve().parent
REPO = PACKAGE.parent
TOP = {p.stem for p in PACKAGE.glob("*.py")} | {
    p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
}
TOP.discard("__init__")
# A dotted name in single or double backquotes, with or without a Sphinx role before it.
NAMED = re.compile(r"`{1,2}~?(?:slurm_dispatch\.)?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`{1,2}")
NOT_NAMES = {"py", "conf", "json", "md", "toml", "txt", "sh", "service", "timer", "log", "tmp"}
CITES = re.compile(r"DESIGN(?:\.md)?\b|\b[Ii]ssues? #?\d+")
# Names that read as ours and are not: the Trainer's ``control`` argument (a TrainerControl).
NOT_OURS = {"control.should_save", "control.should_training_stop"}


# The developers' side of the repository, held to the same names and citations as the package.
BESIDE = ("tests", "soak", "bench")


def beside() -> list[Path]:
    return sorted(p for folder in BESIDE for p in (REPO / folder).rglob("*.py"))


def docstrings(paths: list[Path] | None = None) -> list[tuple[str, str, str]]:
    """(where: path:line and the owner's name, docstring) of every module, class and function
    of the package (or of ``paths``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")) if paths is None else paths:
        tree = ast.parse(path.read_text())
        rel = path.relative_to(REPO)
        for node in ast.walk(tree):
            if not isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ):
                continue
            doc = ast.get_docstring(node, clean=False)
            if doc:
                line = getattr(node, "lineno", 1)
                owner = getattr(node, "name", "module")
                found.append((f"{rel}:{line} ({owner})", doc, str(rel)))
    return found


def comments(path: Path) -> list[tuple[str, str]]:
    """(where: path:line, text) of every comment in ``path``."""
    rel = path.relative_to(REPO)
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(f"{rel}:{t.start[0]}", t.string) for t in tokens if t.type == tokenize.COMMENT]


def declared(module: object, name: str) -> bool:
    """Whether ``module``'s source defines ``name`` at its top, ``if TYPE_CHECKING:`` blocks
    included (a TypedDict declared for the type checker only is no attribute at run time)."""
    tree = ast.parse(Path(getattr(module, "__file__", "") or "").read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name:
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(["slurm_dispatch", *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for i, name in enumerate(parts[cut:]):
            if hasattr(target, name):
                target = getattr(target, name)
            else:  # declared for the type checker only: the rest is not checked
                return i == 0 and declared(target, name)
        return True
    return False


def named(doc: str) -> list[str]:
    return [
        m
        for m in NAMED.findall(doc)
        if m.split(".")[0] in TOP and m.split(".")[-1] not in NOT_NAMES and m not in NOT_OURS
    ]


def test_the_name_pattern_reads_the_forms_docstrings_use() -> None:
    assert named(
        "see ``control.submit.submit_new`` and :func:`slurm_dispatch.api.submit`, "
        "`slurm.conf`, ``checkpoint.model.Epoch()``"
    ) == ["control.submit.submit_new", "api.submit", "checkpoint.model.Epoch"]
    assert resolves("checkpoint.model.Epoch") and not resolves("checkpoint.model.Nothing")
    assert not resolves("control.no_such_module.x")
    assert resolves("node.executions.ExecutionFacts")  # for the type checker only


def test_every_module_or_function_a_docstring_names_exists() -> None:
    """The package's docstrings, and those of the tests, the soak and the benches."""
    missing = [
        f"{where}: `{name}`"
        for where, doc, _ in docstrings() + docstrings(beside())
        for name in named(doc)
        if not resolves(name)
    ]
    assert not missing, (
        "docstrings name what does not exist (moved or renamed?); "
        "say the new name:\n" + "\n".join(missing)
    )


def test_no_docstring_cites_a_design_note_or_an_issue() -> None:
    cited = [
        f"{where}: {found.group(0)!r}"
        for where, doc, _ in docstrings()
        if (found := CITES.search(doc))
    ]
    assert not cited, (
        "point at the page in docs/ that says it (docs/invariants.md for the "
        "invariants) instead:\n" + "\n".join(cited)
    )


def test_the_citation_pattern_reads_the_forms_tests_used() -> None:
    cited = [
        "Attack on issue 31 item 1: a hook",
        "(issue 22 item 2: every hook <= 1.5x)",
        "Issue 33's cases",
        "issues 9 and 18",
        "DESIGN.md invariant 7",
    ]
    assert all(CITES.search(text) for text in cited)
    assert not CITES.search("docs/invariants.md, 7: hooks fail open; an issue with the node")


def test_no_test_soak_or_bench_cites_an_issue() -> None:
    paths = beside()
    texts = [(where, doc) for where, doc, _ in docstrings(paths)]
    texts += [found for path in paths for found in comments(path)]
    cited = [
        f"{where}: {found.group(0)!r}" for where, text in texts if (found := CITES.search(text))
    ]
    assert not cited, (
        "say what it is about in words, and point at the page in docs/ that holds the rule "
        "(docs/invariants.md for the invariants); the tracker is not in the repository:\n"
        + "\n".join(cited)
    )
