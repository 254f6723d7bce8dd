"""A fresh root of each store, with the raw operations the store tests need from outside the
store (write bytes at a path under the root, ask whether a path holds anything, read it back).

The stores are the folder and each row of the table of stores
(``slurm_dispatch/checkpoint/stores/schemes.py``): :data:`KINDS` is built from it, and the
fixture ``<kind>_raw`` (``tests/store/conftest.py``) makes a root of each.  A new store joins
the contract suite (``test_contract.py``) and cleanup's (``gc_world.py``) with that one fixture
and a :class:`Raw` of its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from slurm_dispatch.checkpoint.stores.schemes import SCHEMES

POSIX = "posix"
KINDS = [POSIX, *(row.name for row in SCHEMES)]


class Raw:
    """A root of one store, written and read around the store."""

    root: str

    def put(self, relative: str, data: bytes) -> None:
        raise NotImplementedError

    def exists(self, relative: str) -> bool:
        """True when ``relative`` is a file, object or folder holding any."""
        raise NotImplementedError

    def read(self, relative: str) -> Optional[bytes]:
        raise NotImplementedError


class PosixRaw(Raw):
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = str(root)

    def put(self, relative: str, data: bytes) -> None:
        path = Path(self.root, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def exists(self, relative: str) -> bool:
        return os.path.lexists(os.path.join(self.root, relative))

    def read(self, relative: str) -> Optional[bytes]:
        try:
            return Path(self.root, relative).read_bytes()
        except OSError:
            return None


def raw_of(root: str) -> Raw:
    """A :class:`Raw` of ``root`` made from the environment the store itself reads (in a child
    process of a test, where the fixtures' clients are not at hand)."""
    from slurm_dispatch.checkpoint.stores.schemes import scheme_of

    row = scheme_of(root)
    if row is None:
        return PosixRaw(Path(root))
    return RAWS[row.name].from_env(root)


class S3Raw(Raw):
    """An ``s3://bucket/prefix`` root, through a boto3 client of the test server."""

    def __init__(self, root: str, client: Any) -> None:
        from slurm_dispatch.checkpoint.stores.s3 import parse_root

        self.root = root
        self.client = client
        where = parse_root(root)
        self.bucket, self.prefix = where.bucket, where.prefix

    @classmethod
    def from_env(cls, root: str) -> S3Raw:
        import boto3

        return cls(root, boto3.client("s3"))

    def put(self, relative: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{relative}", Body=data)

    def exists(self, relative: str) -> bool:
        key = f"{self.prefix}/{relative}"
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key)
        return any(
            o["Key"] == key or o["Key"].startswith(key + "/") for o in page.get("Contents", ())
        )

    def read(self, relative: str) -> Optional[bytes]:
        try:
            body: bytes = self.client.get_object(
                Bucket=self.bucket, Key=f"{self.prefix}/{relative}"
            )["Body"].read()
        except Exception:  # noqa: BLE001 - a missing key is what the caller checks
            return None
        return body


class AzureRaw(Raw):
    """An ``az://container/prefix`` root, through a ContainerClient of the test server."""

    def __init__(self, root: str, client: Any) -> None:
        from slurm_dispatch.checkpoint.stores.azure import parse_root

        self.root = root
        self.client = client
        self.prefix = parse_root(root).prefix

    @classmethod
    def from_env(cls, root: str) -> AzureRaw:
        from azure.storage.blob import ContainerClient

        from slurm_dispatch.checkpoint.stores.azure import CONNECTION_ENV, parse_root

        conn = os.environ[CONNECTION_ENV]
        return cls(root, ContainerClient.from_connection_string(conn, parse_root(root).bucket))

    def put(self, relative: str, data: bytes) -> None:
        self.client.upload_blob(f"{self.prefix}/{relative}", data, overwrite=True)

    def exists(self, relative: str) -> bool:
        key = f"{self.prefix}/{relative}"
        return any(
            b.name == key or b.name.startswith(key + "/")
            for b in self.client.list_blobs(name_starts_with=key)
        )

    def read(self, relative: str) -> Optional[bytes]:
        try:
            return bytes(self.client.download_blob(f"{self.prefix}/{relative}").readall())
        except Exception:  # noqa: BLE001 - a missing blob is what the caller checks
            return None


RAWS: dict[str, Any] = {"s3": S3Raw, "az": AzureRaw}  # each row's Raw, by the row's name
