"""Store fixtures: a real SeaweedFS S3 server for the session, and one fresh root per test.

The server is started by the suite and stopped at its end; it is never skipped (a missing
``weed`` binary fails with what to install).  Each S3 test gets its own prefix in a shared
bucket and boto3's environment pointing at the server, with the machine's own ~/.aws files
out of the way.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

from tests.s3server import SeaweedServer

if TYPE_CHECKING:
    from .gc_world import World

BUCKET = "dispatch-tests"


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    server = SeaweedServer(os.environ.get("DISPATCH_S3_TEST_DIR") or None).start()
    try:
        server.make_bucket(BUCKET)
        yield server
    finally:
        server.stop()


def point_boto3_at(monkeypatch: pytest.MonkeyPatch, server: SeaweedServer, tmp: Path) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-aws-credentials"))


@pytest.fixture
def s3_env(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path) -> SeaweedServer:
    point_boto3_at(monkeypatch, seaweed, tmp_path)
    return seaweed


@pytest.fixture
def s3_root(s3_env: SeaweedServer) -> str:
    return f"s3://{BUCKET}/runs/{uuid.uuid4().hex}"


@pytest.fixture(params=["posix", "s3"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    """A checkpoint root for cleanup's tests (gc_world), on a folder and on SeaweedFS."""
    from .gc_world import World, posix_world

    if request.param == "posix":
        return posix_world(tmp_path)
    server = request.getfixturevalue("s3_env")
    return World(request.getfixturevalue("s3_root"), server.client())
