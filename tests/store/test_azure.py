"""The Azure Blob store's own ways, on Azurite: how cleanup's deletes reach the service.

The contract every store passes is test_contract.py and the gc_* tests; here, what only an
az:// root does: cleanup removes blobs in Blob Batch requests (256 a request, the service's
most), as the S3 store does in DeleteObjects requests of 1,000, not one request a blob.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.azure import CONNECTION_ENV
from slurm_dispatch.checkpoint.stores.open import open_store
from slurm_dispatch.errors import OutsideRoot, StoreError, StoreTimeout, UsageError
from tests.azurite import KEY, AzuriteServer

from .conftest import BUCKET
from .worlds import Raw


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The method and URL of every HTTP request the SDK sends, from here on."""
    from azure.core.pipeline.transport import RequestsTransport

    seen: list[str] = []
    send = RequestsTransport.send

    def counting(self: Any, request: Any, **kwargs: Any) -> Any:
        seen.append(f"{request.method} {request.url}")
        return send(self, request, **kwargs)

    monkeypatch.setattr(RequestsTransport, "send", counting)
    return seen


def _put_save(raw: Raw, relative: str, files: int) -> None:
    for i in range(files):
        raw.put(f"{relative}/shard-{i:04d}", b"x" * 10)


def test_removing_a_save_of_600_blobs_takes_three_delete_requests(
    az_raw: Raw, sent: list[str]
) -> None:
    relative = "exec/1000000-a/step-5"
    _put_save(az_raw, relative, 600)
    store = open_store(az_raw.root, timeout=60)
    sent.clear()
    removed = store.remove_save(relative)  # type: ignore[attr-defined]
    assert removed == 600 * 10
    assert not az_raw.exists(relative)
    batches = [line for line in sent if "comp=batch" in line]
    single = [line for line in sent if line.startswith("DELETE")]
    # 600 blobs: batches of 256, 256 and 88 (one blob a request was 600 requests).
    assert (len(batches), len(single)) == (3, 0), sent[:5]


def test_a_blob_the_service_refuses_to_delete_is_an_error_naming_it(az_raw: Raw) -> None:
    relative = "exec/1000000-a/step-7"
    _put_save(az_raw, relative, 3)
    leased = f"{az_raw.prefix}/{relative}/shard-0001"  # type: ignore[attr-defined]
    az_raw.client.get_blob_client(leased).acquire_lease()  # type: ignore[attr-defined]
    store = open_store(az_raw.root, timeout=60)
    with pytest.raises(StoreError) as caught:
        store.remove_save(relative)  # type: ignore[attr-defined]
    assert leased in str(caught.value) and "(HTTP 412)" in str(caught.value), caught.value
    assert "LeaseIdMissing" in str(caught.value), caught.value
    # The others in its batch are gone; the leased one is kept, nothing else touched.
    assert az_raw.read(f"{relative}/shard-0001") == b"x" * 10
    assert az_raw.read(f"{relative}/shard-0000") is None


def test_deleting_blobs_already_gone_is_fine(az_raw: Raw) -> None:
    relative = "exec/1000000-a/step-9"
    _put_save(az_raw, relative, 2)
    store = open_store(az_raw.root, timeout=60)
    store.delete_intents(["no-such-intent", "nor-this"])  # type: ignore[attr-defined]
    assert store.remove_save(relative) == 20  # type: ignore[attr-defined]
    assert not az_raw.exists(relative)


@pytest.mark.parametrize(
    "wrong",
    [
        lambda conn: "AccountName=x;garbage",  # not a connection string at all
        lambda conn: conn.replace(KEY, KEY[:-8] + "AAAAAAA="),  # a key the account refuses
        lambda conn: conn.replace(KEY, "not-base64!"),  # a key that is not one
    ],
    ids=["malformed", "wrong-key", "not-base64"],
)
def test_a_wrong_connection_string_is_an_error_naming_the_variable(
    azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch, wrong: Callable[[str], str]
) -> None:
    """Each is a StoreError naming $AZURE_STORAGE_CONNECTION_STRING, never the key (a malformed
    one was the SDK's bare ValueError; a refused key said only its code)."""
    monkeypatch.setenv(CONNECTION_ENV, wrong(azurite.connection_string))
    with pytest.raises(StoreError) as caught:
        store.latest(f"az://{BUCKET}/runs/{uuid.uuid4().hex}", timeout=30)
    said = str(caught.value)
    assert f"${CONNECTION_ENV}" in said, said
    assert KEY[:12] not in said and KEY[-12:] not in said, said
    assert "StorageErrorCode." not in said, said  # the service's own code, not the SDK's enum


def test_an_upload_past_its_deadline_stops_there(
    az_raw: Raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After StoreTimeout the upload puts no more blobs: its worker went on putting the save's
    files one by one after the caller was told it had failed (S3's transfer manager cancels
    what has not started)."""
    from azure.core.pipeline.transport import RequestsTransport

    from slurm_dispatch.checkpoint.stores import azure

    send = RequestsTransport.send

    def slow(self: Any, request: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)
        return send(self, request, **kwargs)

    save = tmp_path / "checkpoint-1"
    save.mkdir()
    for i in range(30):
        (save / f"shard-{i:02d}").write_bytes(b"x")
    azure.container_for(BUCKET, 1.0)  # a client made before the clock starts
    monkeypatch.setattr(RequestsTransport, "send", slow)
    with pytest.raises(StoreTimeout):
        azure.upload_save(str(save), f"{az_raw.root}/exec/a/checkpoint-1", 1.0)
    at_timeout = len(list(az_raw.client.list_blobs(name_starts_with=f"{az_raw.prefix}/")))  # type: ignore[attr-defined]
    time.sleep(2.0)
    later = len(list(az_raw.client.list_blobs(name_starts_with=f"{az_raw.prefix}/")))  # type: ignore[attr-defined]
    assert at_timeout < 30 and later <= at_timeout + 1, (at_timeout, later)


def test_a_backslash_in_a_save_is_refused_not_stored_under_another_name(
    az_raw: Raw, tmp_path: Path
) -> None:
    """The service stores a '\\' in a blob's name as '/': a save's file 'a\\b' landed as the
    folder 'a' holding 'b' (the manifest's name no longer found), and a save published at
    'exec/a/b\\c' was a publication whose save was nowhere, its blobs under 'exec/a/b/c'."""
    from slurm_dispatch.checkpoint.stores import azure

    save = tmp_path / "checkpoint-1"
    save.mkdir()
    (save / "a\\b").write_bytes(b"x")
    with pytest.raises(StoreError, match=re.escape(repr("a\\b"))):
        azure.upload_save(str(save), f"{az_raw.root}/exec/a/checkpoint-1", 30)
    where = f"{az_raw.root}/exec/a/b\\c"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "model.bin").write_bytes(b"x")
    with pytest.raises(StoreError, match=re.escape(repr(where))):
        azure.upload_save(str(tmp_path / "plain"), where, 30)
    assert not az_raw.exists("exec/a")
    with pytest.raises(OutsideRoot, match=re.escape(repr(where))):
        store.publish(az_raw.root, 1_000_000, 1, where)
    assert store.list_publications(az_raw.root) == []


def test_a_409_that_is_not_blob_already_exists_is_an_error_not_a_publication_there(
    az_raw: Raw, azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only BlobAlreadyExists says a create-once blob is there: a put refused with another 409
    (a container being deleted) was taken as one, and publish said AlreadyPublished ('published
    before this call, or by it...') for a publication that was nowhere, which the integrations
    take as done."""
    from .faulty_proxy import FaultyProxy

    upstream = f"http://127.0.0.1:{azurite.port}"
    with FaultyProxy(upstream) as proxy:
        conn = azurite.connection_string.replace(upstream + "/", proxy.endpoint + "/")
        monkeypatch.setenv(CONNECTION_ENV, conn)
        proxy.fail_next("PUT", 409, "ContainerBeingDeleted")
        with pytest.raises(StoreError, match=r"ContainerBeingDeleted \(HTTP 409\)"):
            store.publish(az_raw.root, 1_000_000, 1, f"{az_raw.root}/exec/a/c1")
        proxy.fail_next("PUT", 409, "ContainerBeingDeleted")
        with pytest.raises(StoreError, match="ContainerBeingDeleted"):
            open_store(az_raw.root, timeout=30).create_mark("pins", "x")  # type: ignore[attr-defined]
    assert store.list_publications(az_raw.root) == []


@pytest.mark.parametrize("container", ["c", "My-Runs", "runs_1", "-runs", "runs--1", "x" * 64])
def test_a_container_name_azure_cannot_have_is_refused_when_the_root_is_read(
    container: str, az_raw: Raw
) -> None:
    """Refused where dispatch-sbatch checks the root (checked_root), naming the rule: such a
    root was accepted, and each request under it failed in the job with only the service's code
    (OutOfRangeInput (HTTP 400) for 'c')."""
    from slurm_dispatch.checkpoint.stores.azure import AzureStore

    root = f"az://{container}/runs"
    with pytest.raises(UsageError, match=re.escape(repr(container))):
        AzureStore.checked_root(root)
    with pytest.raises(UsageError, match="3 to 63"):
        store.latest(root, timeout=30)
    for fine in ("runs", "r-1-x", "abc", "x" * 63, "$root"):
        assert AzureStore.checked_root(f"az://{fine}/runs") == f"az://{fine}/runs"


def test_a_root_whose_prefix_holds_a_backslash_is_refused(az_raw: Raw) -> None:
    """The service stores the '\\' as '/': a publication made under such a root landed under
    another prefix, and latest() under the root found none (a job that never resumes)."""
    from slurm_dispatch.checkpoint.stores.azure import AzureStore

    root = az_raw.root + "\\b"
    with pytest.raises(UsageError, match=re.escape(repr(root))):
        AzureStore.checked_root(root)
    with pytest.raises(UsageError, match="as '/'"):
        store.publish(root, 1_000_000, 1, root + "/exec/a/c1")
    assert not az_raw.exists("pub") and store.list_publications(az_raw.root) == []
