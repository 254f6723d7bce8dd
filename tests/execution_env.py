"""The launcher's environment of one execution, for tests of the in-job integrations."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest


def dispatch_env(
    root: Path, attempt: str, epoch: int, resume: Optional[str], monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Set what the launcher gives execution ``attempt`` of ``root`` (no resume when
    ``resume`` is None) and make its folder; returns the folder."""
    exec_dir = root / "exec" / attempt
    exec_dir.mkdir(parents=True)
    for name, value in (
        ("DISPATCH_CHECKPOINT", str(root)),
        ("DISPATCH_EXEC_DIR", str(exec_dir)),
        ("DISPATCH_EPOCH", str(epoch)),
        ("DISPATCH_ATTEMPT", attempt),
    ):
        monkeypatch.setenv(name, value)
    if resume is None:
        monkeypatch.delenv("DISPATCH_RESUME_FROM", raising=False)
    else:
        monkeypatch.setenv("DISPATCH_RESUME_FROM", resume)
    return exec_dir
