"""The S3 store against a real SeaweedFS server: a server that stops answering,
wrong credentials, a missing bucket, keys that are not publications, paging, boto3 absent.

The contract both stores keep is in test_contract.py; these are the S3 store's own promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.s3 import parse_root
from slurm_dispatch.errors import (
    AlreadyPublished,
    BadPublicationName,
    StoreError,
    StoreTimeout,
    UsageError,
)
from tests.s3server import SeaweedServer

from .conftest import BUCKET
from .faulty_proxy import FaultyProxy

E1 = model.Epoch(0, 1, 0).value
E2 = model.Epoch(0, 2, 0).value
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-c", "from slurm_dispatch.cli.dispatch import main; main()"]


def prefix_of(root: str) -> str:
    return parse_root(root).prefix


def run_cli(*args: str, timeout: float = 60) -> tuple[int, str, str, float]:
    start = time.monotonic()
    proc = subprocess.run(
        CLI + list(args), capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


# --------------------------------------------------------------------------- timeouts


def test_latest_on_a_stopped_server_fails_within_the_timeout(
    s3_env: SeaweedServer, s3_root: str
) -> None:
    store.publish(s3_root, E1, 1, s3_root + "/exec/a/c1")
    with s3_env.frozen():
        for command in (
            ["latest"],
            ["list"],
            ["publish", "--epoch", str(E1), "--step", "2", s3_root + "/exec/a/c2"],
        ):
            code, out, err, took = run_cli(*command, "--root", s3_root, "--timeout", "2")
            assert code == 2, (command, out, err)
            print(f"{command[0]} gave up after {took:.2f} s")
            # Bounded by the timeout, plus the command's own start (an interpreter and boto3's
            # import: a second or more on a loaded machine); botocore's defaults alone would
            # retry for minutes (60 s a connection and read, several attempts).
            assert took < 2 + 6.0, f"{command} took {took:.2f} s with --timeout 2"
            assert "within the timeout of 2 s" in err and out == ""
        assert "whether it was published is unknown" in err
        start = time.monotonic()
        with pytest.raises(StoreTimeout, match="timeout of 1 s"):
            store.latest(s3_root, timeout=1)
        assert time.monotonic() - start < 1 + 3.0
    # Continued, the server answers again and nothing partial was ever reported.
    assert [f.step for f in store.list_publications(s3_root)] in ([1], [1, 2])


def test_the_timeout_comes_from_the_environment_then_dispatch_conf(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "dispatch.conf"
    conf.write_text("StoreTimeout=1\n")
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    with s3_env.frozen():
        with pytest.raises(StoreTimeout, match="timeout of 1 s"):
            store.latest(s3_root)
        monkeypatch.setenv("DISPATCH_STORE_TIMEOUT", "0.5")
        with pytest.raises(StoreTimeout, match="timeout of 0.5 s"):
            store.latest(s3_root)
    monkeypatch.setenv("DISPATCH_STORE_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="'soon'"):
        store.latest(s3_root)


# --------------------------------------------------------------------------- errors


def test_wrong_credentials_are_a_clear_error(s3_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StoreError, match=r"SignatureDoesNotMatch \(HTTP 403\).*credentials"):
        store.latest(s3_root)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    with pytest.raises(
        StoreError,
        match=re.escape(f"s3://{BUCKET}/{prefix_of(s3_root)}/pub/") + r".*InvalidAccessKeyId",
    ):
        store.publish(s3_root, E1, 1, s3_root + "/exec/a/c1")
    code, _, err, _ = run_cli("list", "--root", s3_root)
    assert code == 2 and err.startswith("dispatch: listing s3://") and "InvalidAccessKeyId" in err


def test_a_missing_bucket_is_a_clear_error(s3_env: SeaweedServer) -> None:
    root = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/runs/x"
    for call in (
        lambda: store.latest(root),
        lambda: store.list_publications(root),
        lambda: store.publish(root, E1, 1, root + "/exec/a/c1"),
    ):
        with pytest.raises(StoreError, match=r"NoSuchBucket.*the bucket 'no-such-bucket-"):
            call()
    code, _, err, _ = run_cli("latest", "--root", root)
    assert code == 2 and "NoSuchBucket" in err


def test_a_key_in_a_deeper_folder_of_pub_is_an_error_naming_it(
    s3_env: SeaweedServer, s3_root: str
) -> None:
    store.publish(s3_root, E1, 1, s3_root + "/exec/a/c1")
    good = model.format_name(E2, 1, "exec/b/c1")
    s3_env.client().put_object(Bucket=BUCKET, Key=f"{prefix_of(s3_root)}/pub/old/{good}", Body=b"")
    for read in (store.latest, store.list_publications):
        with pytest.raises(BadPublicationName, match=re.escape(repr("old/" + good))):
            read(s3_root)
    code, _, err, _ = run_cli("latest", "--root", s3_root)
    assert code == 2 and "old/" + good in err


def test_the_folder_marker_of_pub_is_not_an_entry(s3_env: SeaweedServer, s3_root: str) -> None:
    s3_env.client().put_object(Bucket=BUCKET, Key=f"{prefix_of(s3_root)}/pub/", Body=b"")
    assert store.latest(s3_root) is None
    store.publish(s3_root, E1, 3, s3_root + "/exec/a/c3")
    assert [f.step for f in store.list_publications(s3_root)] == [3]


def test_a_conflict_on_a_concurrent_create_is_retried(
    s3_env: SeaweedServer, s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FaultyProxy(s3_env.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.fail_next("PUT", 409, "ConditionalRequestConflict", times=3)
        name = store.publish(s3_root, E1, 5, s3_root + "/exec/a/c5")
        puts = [status for method, _, status in proxy.seen if method == "PUT"]
        assert puts == [409, 409, 409, 200]
        # The conflict settled as a create: a second publisher now meets 412.
        proxy.fail_next("PUT", 409, "ConditionalRequestConflict")
        with pytest.raises(AlreadyPublished, match=name):
            store.publish(s3_root, E1, 5, s3_root + "/exec/a/c5")


def test_any_other_server_error_names_bucket_key_and_code(
    s3_env: SeaweedServer, s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FaultyProxy(s3_env.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.fail_next("PUT", 403, "AccessDenied")
        name = model.format_name(E1, 6, "exec/a/c6")
        key = f"s3://{BUCKET}/{prefix_of(s3_root)}/pub/{name}"
        with pytest.raises(StoreError, match=re.escape(key) + r".*AccessDenied \(HTTP 403\)"):
            store.publish(s3_root, E1, 6, s3_root + "/exec/a/c6")
        proxy.fail_next("GET", 500, "InternalError", times=10)  # more than boto3 retries
        with pytest.raises(StoreError, match=r"pub/.*InternalError"):
            store.latest(s3_root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.endpoint)
    assert store.latest(s3_root) is None


def test_bad_roots_are_refused_naming_them() -> None:
    for root, why in (
        ("s3://", "names no bucket"),
        ("s3:///x", "names no bucket"),
        ("s3://b/a//c", "normal form"),
        ("s3://b/a/../c", "climbs"),
        ("gs://bucket/x", "not supported"),
    ):
        with pytest.raises(UsageError, match=re.escape(repr(root)) + ".*" + why):
            store.latest(root)


# --------------------------------------------------------------------------- paging


def test_latest_pages_through_thousands_of_publications(
    s3_env: SeaweedServer, s3_root: str
) -> None:
    client = s3_env.client()
    prefix = prefix_of(s3_root)
    names = [model.format_name(E1 + (i % 3), i, f"exec/a/checkpoint-{i}") for i in range(2345)]
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda n: client.put_object(Bucket=BUCKET, Key=f"{prefix}/pub/{n}", Body=b""), names
            )
        )
    found = store.list_publications(s3_root)
    assert [f.name for f in found] == sorted(names)
    assert store.latest(s3_root).name == max(names)  # type: ignore[union-attr]
    # A bad name on the last page still stops latest.
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/pub/zzz-not-a-name", Body=b"")
    with pytest.raises(BadPublicationName, match="zzz-not-a-name"):
        store.latest(s3_root)


# --------------------------------------------------------------------------- the extra

NO_BOTO3 = r"""
import sys
sys.modules["boto3"] = None  # as if the s3 extra were not installed
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import StoreError
try:
    store.latest("s3://bucket/prefix")
except StoreError as exc:
    print(exc)
"""

CORE_IMPORTS = r"""
import sys
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.cli import dispatch, sbatch
from slurm_dispatch.control import status, submit
from slurm_dispatch.execution import launch
store.latest(sys.argv[1])
print(sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore", "s3transfer")))
"""


def test_a_missing_boto3_is_an_error_naming_the_extra() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_BOTO3], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    assert "the 's3' extra" in out and ".whl[s3]" in out and "boto3" in out


def test_the_core_and_a_folder_root_never_import_boto3(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CORE_IMPORTS, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout
    assert out.strip() == "[]"


def test_cli_round_trip_on_s3(s3_root: str) -> None:
    code, out, _, _ = run_cli(
        "publish",
        "--root",
        s3_root,
        "--epoch",
        str(E1),
        "--step",
        "9",
        s3_root + "/exec/a/checkpoint-9",
    )
    assert code == 0 and out.strip() == model.format_name(E1, 9, "exec/a/checkpoint-9")
    code, out, err, _ = run_cli(
        "publish",
        "--root",
        s3_root,
        "--epoch",
        str(E1),
        "--step",
        "9",
        s3_root + "/exec/a/checkpoint-9",
    )
    assert code == 0 and "already published, nothing to do" in err  # the same save's
    code, out, _, _ = run_cli("latest", "--root", s3_root)
    assert code == 0 and out.strip() == s3_root + "/exec/a/checkpoint-9"
    code, out, _, _ = run_cli("list", "--root", s3_root, "--noheader")
    assert code == 0 and out.split() == [str(E1), "9", s3_root + "/exec/a/checkpoint-9"]
    env_root = os.environ.get("AWS_ENDPOINT_URL")
    assert env_root is not None  # the endpoint came from boto3's chain, nothing of ours
