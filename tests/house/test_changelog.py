"""CHANGELOG.md and the kept names agree (docs/development.md, "Versions and this changelog"):
every module the package keeps for one release names, in its docstring, the release that removes
it, the changelog names the same under Deprecated, and that release comes after the version
pyproject.toml says (a release that has come must have removed it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "slurm_dispatch"
REMOVED_IN = re.compile(r"removed\s+in\s+(\d+\.\d+\.\d+)")


def kept_modules() -> dict[str, str]:
    """Each module of the package whose docstring says it is kept for one release: its docstring."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if re.search(r"kept\s+for\s+one\s+release", doc, re.IGNORECASE):
            found[str(path.relative_to(REPO))] = doc
    return found


def test_the_kept_modules_name_the_release_that_removes_them_as_the_changelog_does() -> None:
    kept = kept_modules()
    assert {
        "slurm_dispatch/cli_cease.py",
        "slurm_dispatch/cli_sbatch.py",
        "slurm_dispatch/cli_sandbox.py",
    } <= set(kept), sorted(kept)
    changelog = (REPO / "CHANGELOG.md").read_text()
    deprecated = changelog.split("### Deprecated", 1)[1].split("\n## ", 1)[0]
    planned = set(REMOVED_IN.findall(deprecated))
    version = Version(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])
    for path, doc in kept.items():
        named = REMOVED_IN.findall(doc)
        assert named, f"{path} is kept for one release but names no release that removes it"
        for release in named:
            assert release in planned, (
                f"{path} says removed in {release}; CHANGELOG.md's Deprecated says {planned}"
            )
            assert Version(release) > version, (
                f"{path} should have gone in {release}; pyproject.toml says {version}"
            )
