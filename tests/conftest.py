"""Shared test set-up: every test starts with no SLURM_* or DISPATCH_* in its environment.

Tests below the real tier talk to fakes (a fake controller, fake Slurm commands on PATH): they
use the command-line backend, whatever pyslurm the machine may have, so a fake is never passed
by for a real controller that `SLURM_CONF` happens to name.
"""

from __future__ import annotations

import os

import pytest

_KEEP = {"SLURM_CONF", "DISPATCH_SANDBOX_DIR", "DISPATCH_SANDBOX_USER"}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    for name in list(os.environ):
        if (name.startswith("SLURM_") or name.startswith("DISPATCH_")) and name not in _KEEP:
            monkeypatch.delenv(name)
    if request.node.get_closest_marker("real") is None:
        monkeypatch.setenv("DISPATCH_SLURM_BACKEND", "cli")
