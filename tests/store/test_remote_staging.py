"""The in-job half on every remote store of the table (S3 on SeaweedFS, Azure Blob on
Azurite), through ``execution/staging.py``'s one interface and the store's transfers
(``checkpoint/stores/remote.py``): ``dispatch watch`` uploads each complete save, then
publishes it; a save is fetched whole and checked; an object replaced since its save was
sealed is caught; a record is created once.  S3's own cases are in test_watch_s3.py,
test_integrations_s3.py and test_fetch.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores import remote
from slurm_dispatch.errors import StoreError
from slurm_dispatch.execution import staging
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Watcher

from .worlds import Raw

EPOCH = model.Epoch(0, 1, 0).value
ATTEMPT = "0" * 26


def hf_save(stage: Path, step: int, weights: bytes = b"w" * 1000) -> Path:
    save = stage / f"checkpoint-{step}"
    (save / "sub").mkdir(parents=True)
    (save / "model.safetensors").write_bytes(weights)
    (save / "sub" / "optimizer.pt").write_bytes(b"o" * 10)
    (save / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return save


def watched(root: str, stage: Path, lines: list[str]) -> list[int]:
    """Two scans of a watcher of ``stage`` (a save is published at the second scan that
    finds it unchanged); the steps published."""
    w = Watcher(
        root,
        str(stage),
        EPOCH,
        SaveRule.make(),
        lines.append,
        upload_to=f"{root}/exec/{ATTEMPT}",
        timeout=30,
    )
    assert w.scan() == []
    return [p.step for p in w.scan()]


def test_watch_uploads_each_complete_save_then_publishes_it(
    remote_raw: Raw, tmp_path: Path
) -> None:
    root, prefix = remote_raw.root, f"{remote_raw.root}/exec/{ATTEMPT}"
    hf_save(tmp_path, 10)
    hf_save(tmp_path, 5)
    lines: list[str] = []
    assert watched(root, tmp_path, lines) == [5, 10]
    assert [(f.step, f.path) for f in store.list_publications(root)] == [
        (5, f"{prefix}/checkpoint-5"),
        (10, f"{prefix}/checkpoint-10"),
    ]
    assert remote_raw.read(f"exec/{ATTEMPT}/checkpoint-10/model.safetensors") == b"w" * 1000
    assert remote_raw.read(f"exec/{ATTEMPT}/checkpoint-10/sub/optimizer.pt") == b"o" * 10
    assert lines[:2] == [
        f"published step 5: {prefix}/checkpoint-5",
        f"published step 10: {prefix}/checkpoint-10",
    ]
    assert remote.save_objects(f"{prefix}/checkpoint-10", 10) == (
        True,
        {"model.safetensors": 1000, "sub/optimizer.pt": 10, "trainer_state.json": 19},
    )


def test_a_fetched_save_is_whole_and_a_replaced_object_is_caught(
    remote_raw: Raw, tmp_path: Path
) -> None:
    root = remote_raw.root
    hf_save(tmp_path / "stage", 7, weights=b"a" * 5000)
    assert watched(root, tmp_path / "stage", []) == [7]
    url = f"{root}/exec/{ATTEMPT}/checkpoint-7"
    ours = staging.of(root)
    ours.seal_remote_save(url)  # the manifest with each object's ETag
    assert ours.why_unloadable_remote(url) is None
    local = Path(ours.fetch_checked(url, str(tmp_path / "copy")))
    assert (local / "model.safetensors").read_bytes() == b"a" * 5000
    assert (local / "sub" / "optimizer.pt").read_bytes() == b"o" * 10
    # Other bytes of the same size: only the ETag tells.
    remote_raw.put(f"exec/{ATTEMPT}/checkpoint-7/model.safetensors", b"b" * 5000)
    why = ours.why_unloadable_remote(url)
    assert why is not None and "'model.safetensors'" in why and "was replaced" in why
    with pytest.raises(StoreError, match="was replaced"):
        ours.fetch_checked(url, str(tmp_path / "again"))


def test_a_record_is_created_once_and_read_back(remote_raw: Raw) -> None:
    url = f"{remote_raw.root}/exec/{ATTEMPT}/keep.json"
    assert remote.put_json_once(url, {"keep": 2}, 10) is True
    assert remote.put_json_once(url, {"keep": 3}, 10) is False
    assert remote.read_json(url, 10) == {"keep": 2}
    assert remote.read_json(url + ".absent", 10) is None


def test_a_read_in_a_bucket_that_does_not_exist_is_an_error_not_an_absent_object(
    remote_raw: Raw,
) -> None:
    """A container (a bucket) that is not there is not an object that is not there: an az://
    root's record reads answered None (no record) for a container that does not exist."""
    from slurm_dispatch.checkpoint.stores.open import open_store

    scheme, rest = remote_raw.root.split("://", 1)
    root = f"{scheme}://no-such-bucket-{ATTEMPT[:8]}/{rest.split('/', 1)[1]}"
    with pytest.raises(StoreError, match="no-such-bucket"):
        remote.read_json(f"{root}/exec/{ATTEMPT}/keep.json", 10)
    with pytest.raises(StoreError, match="no-such-bucket"):
        open_store(root, timeout=10).read_exec_file(ATTEMPT, "dispatch-exec.json")  # type: ignore[attr-defined]


def test_a_fetch_that_fails_leaves_nothing_at_its_target(
    remote_raw: Raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object replaced by a shorter one between the listing and its download (the trainer's
    rotation, a careless hand): the fetch fails and leaves no folder behind, whole-looking or
    not (both stores left the folder, the replaced file at its new size among the others)."""
    url = f"{remote_raw.root}/exec/{ATTEMPT}/checkpoint-3"
    remote.upload_save(str(hf_save(tmp_path / "stage", 3)), url, 30)
    transfers = remote._transfers(url)
    listing = transfers.save_listing

    def then_replaced(at: str, timeout: float) -> tuple[bool, dict[str, tuple[int, str]]]:
        found = listing(at, timeout)
        remote_raw.put(f"exec/{ATTEMPT}/checkpoint-3/model.safetensors", b"short")
        return found

    monkeypatch.setattr(transfers, "save_listing", then_replaced)
    target = tmp_path / "copy" / "checkpoint-3"
    with pytest.raises(StoreError, match="model.safetensors"):
        remote.fetch_save(url, str(target), 30)
    assert not target.exists(), sorted(p.name for p in target.rglob("*"))
    # A target that was there before is refused, and left as it was.
    target.mkdir(parents=True)
    (target / "mine").write_text("kept")
    monkeypatch.setattr(transfers, "save_listing", listing)
    with pytest.raises((StoreError, OSError)):
        remote.fetch_save(url, str(target), 30)
    assert (target / "mine").read_text() == "kept"


ODD_NAMES = ["a%b", "a%2Fb", "sp ace", "q?x", "hash#x", "uni-\u00e9", "nfd-e\u0301", "plus+x"]
ODD_NAMES += ["amp&x", "semi;x", "tilde~x", "quote'x", "lt<x>", "deep/er/\u00fcml"]


def test_a_save_of_names_that_need_escaping_goes_up_comes_back_and_is_removed_whole(
    remote_raw: Raw, tmp_path: Path
) -> None:
    """Pinned: each name as it was, through the upload, the listing, the fetch and cleanup's
    removal (on Azure, in Blob Batch requests, where each blob's URL is escaped again)."""
    from slurm_dispatch.checkpoint.stores.open import open_store

    save = tmp_path / "checkpoint-2"
    for i, name in enumerate(ODD_NAMES):
        (save / name).parent.mkdir(parents=True, exist_ok=True)
        (save / name).write_bytes(b"x" * (i + 1))
    relative = f"exec/{ATTEMPT}/checkpoint-2"
    url = f"{remote_raw.root}/{relative}"
    sizes = {name: i + 1 for i, name in enumerate(ODD_NAMES)}
    assert remote.upload_save(str(save), url, 30) == sizes
    assert remote.save_objects(url, 30) == (True, sizes)
    back = Path(remote.fetch_save(url, str(tmp_path / "back"), 30))
    assert {n: (back / n).read_bytes() for n in ODD_NAMES} == {
        n: b"x" * s for n, s in sizes.items()
    }
    assert open_store(remote_raw.root, timeout=30).remove_save(relative) == sum(sizes.values())  # type: ignore[attr-defined]
    assert not remote_raw.exists(relative)


@pytest.mark.parametrize(
    "name", ["ctl\x01x", "nc\ufffex", "bytes-\udcffx"], ids=["control", "noncharacter", "not-utf8"]
)
def test_a_file_name_no_listing_can_carry_is_refused_at_upload(
    remote_raw: Raw, tmp_path: Path, name: str
) -> None:
    """A name XML cannot carry (a control character, U+FFFE) went up, and then no cleanup
    could remove it (S3's DeleteObjects: MalformedXML (HTTP 400)) or no listing could show it
    (Azurite: HTTP 500), every run; a name that is not UTF-8 could not go up at all.  Now the
    upload refuses the save, naming the file, before anything is put."""
    save = tmp_path / "checkpoint-4"
    save.mkdir()
    (save / "model.bin").write_bytes(b"w")
    (save / name).write_bytes(b"x")
    url = f"{remote_raw.root}/exec/{ATTEMPT}/checkpoint-4"
    with pytest.raises(StoreError, match=re.escape(repr(name))):
        remote.upload_save(str(save), url, 30)
    assert not remote_raw.exists(f"exec/{ATTEMPT}/checkpoint-4")


def test_a_save_whose_own_name_no_listing_can_carry_is_refused_at_upload(
    remote_raw: Raw, tmp_path: Path
) -> None:
    """As a file's name inside it: the save's own folder, the last part of its URL."""
    save = tmp_path / "checkpoint-\x015"
    save.mkdir()
    (save / "model.bin").write_bytes(b"w")
    url = f"{remote_raw.root}/exec/{ATTEMPT}/checkpoint-\x015"
    with pytest.raises(StoreError, match=re.escape(repr(url))):
        remote.upload_save(str(save), url, 30)
    assert not remote_raw.exists(f"exec/{ATTEMPT}")


def test_a_fetched_copy_that_differs_is_removed_as_said(remote_raw: Raw, tmp_path: Path) -> None:
    """``dispatch fetch`` of a save one of whose objects was replaced by other bytes of the
    same size: refused with 'the copy was removed', and it is (it was left at dest, whole to
    the eye)."""
    import hashlib
    import json

    from slurm_dispatch.checkpoint.execdir import MANIFEST_SUFFIX

    url = f"{remote_raw.root}/exec/{ATTEMPT}/checkpoint-6"
    save = hf_save(tmp_path / "stage", 6)
    files = {p.relative_to(save).as_posix(): p for p in save.rglob("*") if p.is_file()}
    manifest = {
        "format": 1,
        "files": {n: p.stat().st_size for n, p in files.items()},
        "sha256": {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items()},
    }
    (save / MANIFEST_SUFFIX[1:]).write_text(json.dumps(manifest))
    remote.upload_save(str(save), url, 30)
    remote_raw.put(f"exec/{ATTEMPT}/checkpoint-6/model.safetensors", b"v" * 1000)
    dest = tmp_path / "dest"
    with pytest.raises(StoreError, match="the copy was removed"):
        staging.of(remote_raw.root).fetch_checked(url, str(dest))
    assert not dest.exists(), sorted(p.name for p in dest.rglob("*"))


def test_a_save_holding_a_file_and_a_folder_of_one_name_is_a_store_error_at_fetch(
    remote_raw: Raw, tmp_path: Path
) -> None:
    """An object store may hold 'x' and 'x/y' at once, which no folder can: the fetch is a
    StoreError naming the save (the resume passes such a save over) and leaves nothing; on
    Azure it was a bare IsADirectoryError."""
    relative = f"exec/{ATTEMPT}/checkpoint-8"
    remote_raw.put(f"{relative}/x/y", b"1")
    remote_raw.put(f"{relative}/x", b"2")
    target = tmp_path / "copy"
    with pytest.raises(StoreError, match="checkpoint-8"):
        remote.fetch_save(f"{remote_raw.root}/{relative}", str(target), 30)
    assert not target.exists()


def test_a_file_gone_during_the_upload_is_a_store_error_naming_it(
    remote_raw: Raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's rotation removed a file of the save after it was listed: a StoreError
    naming it (dispatch watch and the integrations catch those); on Azure it was a bare
    FileNotFoundError."""
    save = hf_save(tmp_path / "stage", 9)
    listed = remote.local_files(str(save))

    def then_gone(path: str) -> list[tuple[str, str]]:
        (save / "trainer_state.json").unlink(missing_ok=True)
        return listed

    transfers = remote._transfers(remote_raw.root)
    monkeypatch.setattr(remote, "local_files", then_gone)
    if hasattr(transfers, "local_files"):
        monkeypatch.setattr(transfers, "local_files", then_gone)
    with pytest.raises(StoreError, match="trainer_state.json"):
        remote.upload_save(str(save), f"{remote_raw.root}/exec/{ATTEMPT}/checkpoint-9", 30)


def test_a_fifo_in_a_save_is_not_uploaded_and_does_not_hang_the_upload(
    remote_raw: Raw, tmp_path: Path
) -> None:
    """Only regular files go up (local_files says so): a named pipe in a save was opened for
    its bytes, and the upload waited on it until its deadline (StoreTimeout)."""
    save = hf_save(tmp_path / "stage", 11)
    os.mkfifo(save / "pipe")
    url = f"{remote_raw.root}/exec/{ATTEMPT}/checkpoint-11"
    sizes = remote.upload_save(str(save), url, 5)
    assert "pipe" not in sizes and "model.safetensors" in sizes
    assert not remote_raw.exists(f"exec/{ATTEMPT}/checkpoint-11/pipe")
