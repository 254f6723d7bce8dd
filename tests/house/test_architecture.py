"""docs/architecture.md stays true: it names every module of the package, and every
module path it names exists, so the page answers "where does this change go?" for the code as
it is, not as it was."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "slurm_dispatch"
PAGE = REPO / "docs" / "architecture.md"
# A module path as the page writes it: `checkpoint/model.py`, `api.py`, `stores/s3.py`.
NAMED = re.compile(r"`([a-z_][a-z0-9_/]*\.py)`")


def modules() -> set[str]:
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }


def named() -> set[str]:
    """What the page names, made whole: within a side's bullet, ``stores/s3.py`` after
    ``checkpoint/`` is ``checkpoint/stores/s3.py``; a bare ``gc.py`` is found by its name."""
    found = set()
    every = modules()
    for text in NAMED.findall(PAGE.read_text()):
        if text.startswith(("tests/", "bench/", "tools/", "soak/")):
            continue  # not a module of the package (soak/'s are checked below)
        if text in every:
            found.add(text)
            continue
        matches = {m for m in every if m.endswith("/" + text)}
        found |= matches if len(matches) == 1 else {text}
    return found


def test_the_page_names_every_module() -> None:
    missing = sorted(modules() - named())
    assert not missing, f"docs/architecture.md does not say where these belong: {missing}"


def test_every_module_the_page_names_exists() -> None:
    stale = sorted(n for n in named() if not (PACKAGE / n).is_file())
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_every_soak_module_the_page_names_exists() -> None:
    """soak/ is a top-level folder beside the package; what the page names there exists."""
    stale = sorted(
        t
        for t in NAMED.findall(PAGE.read_text())
        if t.startswith("soak/") and not (REPO / t).is_file()
    )
    assert not stale, f"docs/architecture.md names soak modules that do not exist: {stale}"
