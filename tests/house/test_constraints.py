"""tests/constraints.txt pins the test environment (make install-test, make bench, the real
tier's installs into the sandbox's venv): every package the extras name is pinned there, at a
version the extras allow, so that pip resolves at once instead of backtracking for minutes and
a pin can never contradict pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (REPO / "tests/constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
        assert match, f"not a pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"pinned twice: {name}"
        found[name] = Version(match.group(2))
    return found


def test_every_requirement_of_the_tested_extras_is_pinned_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [
        Requirement(r)
        for name in ("test", "lint", "transformers", "lightning", "s3", "azure")
        for r in extras[name]
    ]
    pinned = pins()
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not in tests/constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"tests/constraints.txt pins {name}=={pinned[name]}, outside {req}"
        )
