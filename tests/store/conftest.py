"""Store fixtures: a real SeaweedFS S3 server for the session, and one fresh root per test
of each store (the folder and each row of the table of stores: worlds.KINDS).

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

from slurm_dispatch.checkpoint.stores.schemes import SCHEMES
from tests.azurite import AzuriteServer
from tests.s3server import SeaweedServer

from .worlds import KINDS, AzureRaw, PosixRaw, Raw, S3Raw

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
def s3_env(
    seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> SeaweedServer:
    point_boto3_at(monkeypatch, seaweed, tmp_path)
    return seaweed


@pytest.fixture
def s3_root(s3_env: SeaweedServer) -> str:
    return f"s3://{BUCKET}/runs/{uuid.uuid4().hex}"


# One fixture a store: a fresh root of it, with its raw operations (worlds.py).  A row added
# to the table of stores needs its `<name>_raw` here (test_contract checks every row has one).


@pytest.fixture
def posix_raw(tmp_path: Path) -> Raw:
    return PosixRaw(tmp_path / "root")


@pytest.fixture
def s3_raw(s3_env: SeaweedServer, s3_root: str) -> Raw:
    return S3Raw(s3_root, s3_env.client())


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    server = AzuriteServer(os.environ.get("DISPATCH_S3_TEST_DIR") or None).start()
    try:
        server.make_container(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def az_raw(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> Raw:
    from azure.storage.blob import ContainerClient

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    client = ContainerClient.from_connection_string(azurite.connection_string, BUCKET)
    return AzureRaw(f"az://{BUCKET}/runs/{uuid.uuid4().hex}", client)


@pytest.fixture(params=KINDS)
def raw(request: pytest.FixtureRequest) -> Raw:
    """A fresh root of each store: the folder and every row of the table of stores."""
    found: Raw = request.getfixturevalue(f"{request.param}_raw")
    return found


@pytest.fixture(params=[row.name for row in SCHEMES if row.remote])
def remote_raw(request: pytest.FixtureRequest) -> Raw:
    """A fresh root of every remote store of the table (S3, Azure Blob)."""
    found: Raw = request.getfixturevalue(f"{request.param}_raw")
    return found


@pytest.fixture
def world(raw: Raw) -> World:
    """A checkpoint root for cleanup's tests (gc_world), on every store."""
    from .gc_world import World

    return World(raw)
