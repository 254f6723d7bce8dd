"""Every module path the project names still exists (docs/architecture.md, paths that never move).

The move put the package's modules into subpackages.  A path that names an old module fails only
when the code naming it runs: an import inside a function, a program in a string (``python -c``,
a subprocess script in a test), a ``-m`` target, a demo's shell line, a bench.  So every tracked
file is read here, not imported: each ``slurm_dispatch.x.y`` it names, each ``from
slurm_dispatch... import a, b`` (in Python code, in the programs its strings hold, and in any
other file's lines), each attribute used on a module imported so, and each ``-m
slurm_dispatch...`` target (a module that runs as a program) must resolve in the package as it
is now.  A name whose import fails on a third-party package not installed here (pyslurm) counts
as there."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]

DOTTED = re.compile(r"slurm_dispatch(?:\.[A-Za-z_]\w*)+")
FROM_LINE = re.compile(r"from\s+(slurm_dispatch(?:\.\w+)*)\s+import[ \t]+\(?([\w \t,]+)")
RUN_MODULE = re.compile(r"-m\s+(slurm_dispatch(?:\.\w+)*)")


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    paths = [REPO / name for name in out.stdout.decode().split("\0") if name]
    return [p for p in paths if p.is_file() and p.suffix not in (".whl", ".gz", ".png")]


def text_of(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _own_missing(exc: ModuleNotFoundError) -> bool:
    """The import failed because one of our own modules is not there (not a third party)."""
    return (exc.name or "").split(".")[0] == "slurm_dispatch"


def defined_in_source(module: ModuleType, name: str) -> bool:
    """``name`` is a class, function or assignment anywhere in the module's own source."""
    try:
        tree = ast.parse(Path(module.__file__ or "").read_text())
    except (OSError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def find(name: str) -> Optional[str]:
    """None when ``name`` (a module, or a module and attributes) exists; else what is missing."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if not _own_missing(exc):
                return None  # a third-party package missing here, not a path of ours
            continue
        for attr in parts[cut:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif isinstance(obj, ModuleType) and hasattr(obj, "__path__"):
                sub = f"{obj.__name__}.{attr}"
                if importlib.util.find_spec(sub) is None:
                    return f"{sub} (no such module)"
                obj = importlib.import_module(sub)
            elif isinstance(obj, ModuleType) and defined_in_source(obj, attr):
                return None  # defined for the type checker only (under TYPE_CHECKING)
            else:
                return f"{name} ({attr!r} is not in {getattr(obj, '__name__', obj)!r})"
        return None
    return f"{name} (no such module)"


def programs(tree: ast.AST) -> Iterator[ast.AST]:
    """The Python programs a module's string constants hold (``-c`` code, subprocess scripts)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "slurm_dispatch" in node.value
            and "import" in node.value
        ):
            try:
                yield ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue


def python_problems(tree: ast.AST) -> Iterator[str]:
    """Imports of our modules in one program, and attributes used on modules imported so."""
    modules: dict[str, ModuleType] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("slurm_dispatch"):
                    missing = find(alias.name)
                    if missing:
                        yield missing
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "slurm_dispatch"
        ):
            for alias in node.names:
                missing = find(f"{node.module}.{alias.name}")
                if missing:
                    yield missing
                    continue
                try:
                    owner = importlib.import_module(node.module or "")
                except ModuleNotFoundError:
                    continue
                value = getattr(owner, alias.name, None)
                if value is None and hasattr(owner, "__path__"):
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                if isinstance(value, ModuleType):
                    modules[alias.asname or alias.name] = value
    # A name also bound otherwise (a local `status = run(...)`) is not surely the module.
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            modules.pop(node.id, None)
        elif isinstance(node, ast.arg):
            modules.pop(node.arg, None)
    # What a test expects to be missing (`with pytest.raises(AttributeError): slurm.Nope`).
    expected = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.With)
        and any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Attribute)
            and item.context_expr.func.attr == "raises"
            for item in node.items
        )
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and isinstance(node.ctx, ast.Load)
            and id(node) not in expected
        ):
            module = modules.get(node.value.id)
            if (
                module is not None
                and not hasattr(module, node.attr)
                and not (
                    hasattr(module, "__path__")
                    and importlib.util.find_spec(f"{module.__name__}.{node.attr}")
                )
            ):
                yield f"{module.__name__}.{node.attr} ({node.value.id}.{node.attr} used)"


def line_problems(text: str) -> Iterator[str]:
    """What a non-Python file (or any file's prose and strings) names."""
    for name in DOTTED.findall(text):
        missing = find(name)
        if missing:
            yield missing
    for module, names in FROM_LINE.findall(text):
        for word in names.split(","):
            word = word.split(" as ")[0].strip()
            if word.isidentifier():
                missing = find(f"{module}.{word}")
                if missing:
                    yield missing


def runs_as_program(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:  # a package: it needs a __main__
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return spec.origin is not None and "__main__" in Path(spec.origin).read_text()


# Old paths kept on purpose, each with its reason where it stands.
KEPT = {
    # site.conf's header: its text decides whether the sandbox restarts its daemons.
    ("slurm_dispatch/sandbox/slurm_conf.py", "slurm_dispatch.sandbox.cluster.site_config_lines"),
}


def problems(path: Path) -> list[str]:
    text = text_of(path)
    if text is None or "slurm_dispatch" not in text:
        return []
    where = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else ""
    for kept_where, name in KEPT:
        if kept_where == where:
            text = text.replace(name, "")
    found = list(line_problems(text))
    if path.suffix == ".py" or text.startswith("#!/usr/bin/env python"):
        tree = ast.parse(text)
        found += python_problems(tree)
        for program in programs(tree):
            found += python_problems(program)
    for module in RUN_MODULE.findall(text):
        if not runs_as_program(module):
            found.append(f"-m {module} (not a module that runs as a program)")
    return sorted(set(found))


def test_every_kept_old_path_is_still_there() -> None:
    """A KEPT entry whose file no longer names it goes (it would hide a new mistake)."""
    for where, name in KEPT:
        assert name in (text_of(REPO / where) or ""), (where, name)


def test_the_checker_sees_what_the_move_left_behind(tmp_path: Path) -> None:
    """The forms the layout move missed are each caught (they all named old paths)."""
    bench = tmp_path / "bench.py"
    bench.write_text(
        "def f():\n    from slurm_dispatch.checkpoint import publish as s\n"
        "    s.publish_all\n    from slurm_dispatch import cli_exit\n"
    )
    script = tmp_path / "t.py"
    script.write_text('P = """\nfrom slurm_dispatch.hooks import run, work\n"""\n')
    shell = tmp_path / "demo.sh"
    shell.write_text(
        "python3 -c 'from slurm_dispatch.model import new_attempt'\n"
        "python3 -m slurm_dispatch.control jobs\n"
    )
    assert problems(bench) == [
        "slurm_dispatch.checkpoint.publish.publish_all (s.publish_all used)",
        "slurm_dispatch.cli_exit (no such module)",
    ]
    assert problems(script) == ["slurm_dispatch.hooks.work (no such module)"]
    assert problems(shell) == [
        "-m slurm_dispatch.control (not a module that runs as a program)",
        "slurm_dispatch.model (no such module)",
    ]


HERE = Path(__file__).resolve()  # names old paths on purpose, in the checker's own test


@pytest.mark.parametrize(
    "path",
    [p for p in tracked() if p != HERE and "slurm_dispatch" in (text_of(p) or "")],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_every_module_path_a_file_names_exists(path: Path) -> None:
    assert problems(path) == [], (
        f"{path.relative_to(REPO)} names what is not there (a name made up on purpose, for a "
        "checker's own test, goes into KEPT here, with its reason)"
    )
