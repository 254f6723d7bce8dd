"""No layer leak through a private name: no module of slurm_dispatch imports a
``_name`` from another of its modules (``from x import _y``) nor reaches one through a module
it imported (``x._y``).  A name another module needs is public in its home, with a docstring
(s3.client_for and s3.store_error, once s3._client and s3._describe used from transfer and the
S3 saves; sbatch_args.resolve_long and directive_words; saves.file_sizes and lineage_before).

Allowed, and why: private *modules* (``_fsio``, ``_clock``) are the package's shared helpers,
imported as modules by design (their names are public within them); dunder names
(``__version__``) are not private.  No other exception."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str, package: Path) -> bool:
    place = package.parent.joinpath(*dotted.split("."))
    return place.with_suffix(".py").exists() or (place / "__init__.py").exists()


def _source(current: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if path.name != "__init__.py":
        base = base[:-1]  # a module's own package
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def leaks(package: Path = PACKAGE) -> list[str]:
    """Every use of another module's private name in ``package``, as ``file:line: what``."""
    top = package.name
    found = []
    for path in sorted(package.rglob("*.py")):
        current, tree = _module_name(path, package), ast.parse(path.read_text())
        modules: dict[str, str] = {}  # a local name -> the module of ours it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _source(current, path, node)
                if source != top and not source.startswith(top + "."):
                    continue
                for alias in node.names:
                    if _is_module(f"{source}.{alias.name}", package):
                        modules[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif _private(alias.name) and source != current:
                        found.append(
                            f"{path.relative_to(package)}:{node.lineno}: "
                            f"from {source} import {alias.name}"
                        )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.startswith(top + "."):
                        modules[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and modules.get(node.value.id, current) != current
                and _private(node.attr)
            ):
                found.append(
                    f"{path.relative_to(package)}:{node.lineno}: "
                    f"{modules[node.value.id]}.{node.attr}"
                )
    return found


def test_no_module_uses_another_modules_private_name() -> None:
    assert leaks() == []


def test_the_scan_finds_each_kind_of_leak(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py", "_helper.py", "sub/own.py"):
        (package / name).write_text("")
    (package / "home.py").write_text("_secret = 1\n__version__ = '1'\n")
    (package / "sub" / "user.py").write_text(
        "from .. import home, _helper\n"
        "from ..home import _secret, __version__\n"
        "from . import own\n"
        "import pkg.home as h\n"
        "def f():\n"
        "    from pkg.home import _secret as s\n"
        "    return home._secret, h._secret, _helper.anything, own.public, s\n"
    )
    (package / "sub" / "own.py").write_text("_mine = 1\nimport os\nx = os._exit\n")
    assert leaks(package) == [
        "sub/user.py:2: from pkg.home import _secret",
        "sub/user.py:6: from pkg.home import _secret",
        "sub/user.py:7: pkg.home._secret",
        "sub/user.py:7: pkg.home._secret",
    ]
