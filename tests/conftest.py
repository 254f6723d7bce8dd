"""Shared test set-up: every test starts with no SLURM_* or DISPATCH_* in its environment."""

from __future__ import annotations

import os

import pytest

_KEEP = {"SLURM_CONF", "DISPATCH_SANDBOX_DIR", "DISPATCH_SANDBOX_USER"}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if (name.startswith("SLURM_") or name.startswith("DISPATCH_")) and name not in _KEEP:
            monkeypatch.delenv(name)
