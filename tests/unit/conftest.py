"""Fixtures that several of tests/unit's files use (tests/conftest.py holds the ones every test
gets).  A file that needs a variant overrides the fixture under the same name and asks for this
one, as pytest allows (test_no_progress.py's ``home`` adds an empty dispatch.conf).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder: ``DISPATCH_HOME`` under it, the working folder, and a ``job.sh``."""
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    return tmp_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A checkpoint root with one execution's folder, ``exec/a`` (the ``folder`` fixture)."""
    (tmp_path / "ck" / "exec" / "a").mkdir(parents=True)
    return tmp_path / "ck"


@pytest.fixture
def folder(root: Path) -> Path:
    """The execution folder of ``root``."""
    return root / "exec" / "a"
