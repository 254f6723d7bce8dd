"""The framework integrations on an ``s3://`` root: saves and resume through S3.  Imports no
training library; boto3 only through :mod:`slurm_dispatch.checkpoint.stores`.

* Hugging Face ``Trainer`` writes only to local disk: its saves go to the execution's staging
  folder (``$DISPATCH_STAGE_DIR``), and :func:`publish_local_save` writes the manifest, uploads
  the save under the execution's prefix with boto3's transfer manager, then publishes it (the
  same :class:`~..execution.watch_s3.Uploader` as ``dispatch watch``, which also removes
  the older local copies and keeps the newest); the manifest records each file's size and
  sha256.  It resumes from a local copy (:func:`choose_resume` with ``fetch=True``): the save
  fetched from S3, or a copy of the one an earlier execution left on this node, taken only
  when it is this user's own (owner, mode, no symlink on the way, opened without following
  one) and every file has S3's size and the sha256 recorded at upload (:func:`own_copy`;
  multipart ETags are not the content's MD5, so they are not used); otherwise it is fetched,
  and why is said.  A fetched copy is checked as ``dispatch fetch`` checks one: every file at
  the sha256 the manifest records, when it records them (:func:`why_copy_differs`); a copy
  that differs (an object replaced on S3 by other bytes of the same size) is removed, and the
  save is passed over along its lineage, stderr naming the file and the save.
* Lightning writes ``s3://`` itself (fsspec, s3fs); :func:`seal_remote_save` writes the
  manifest object beside a written save before it is published (each object's size and the
  ETag S3 lists for it), and it resumes from the URL, which Lightning reads itself: before
  that each object must have the size and the ETag its manifest records
  (:func:`why_unloadable_remote`; an object replaced by other bytes has another ETag,
  whatever its size), else the save is passed over along its lineage, as a copy is.

Invariants, as on POSIX (:mod:`.saves`): a publication promises a whole save (every object is
uploaded, and the manifest lists their sizes, before the publication is created); nothing is
resumed from without comparing it with what its manifest records (sizes; sha256 where it has
them, for every local copy; ETags where it has them, for a save read from S3); a resume source
that cannot be loaded is passed over for the previous save of its lineage, and the choice is
recorded create-once (on S3: an object under the execution's prefix, made with
``If-None-Match: *``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any, Callable, Optional

from ..checkpoint import publish as store
from ..checkpoint import quarantine
from ..checkpoint.stores import remote
from ..checkpoint.stores.schemes import label_of
from ..errors import AlreadyPublished, StoreError
from . import stage
from .saves import (
    LAUNCH_RECORD,
    MANIFEST_FORMAT,
    MANIFEST_SUFFIX,
    RESUME_RECORD,
    Execution,
    Resume,
    apply_limit,
    file_hashes,
    file_sizes,
    lineage_before,
    manifest_path,
    record_choice,
    remove_copy,
    say_published,
    why_unloadable,
    write_create_once,
)
from .watch_s3 import DOWNLOADS, Uploader, copy_own, stage_copy

__all__ = [
    "DOWNLOADS",
    "uploader",
    "watch_uploader",
    "clear_stage",
    "publish_local_save",
    "seal_remote_save",
    "record_keep",
    "choose_resume",
    "read_json",
    "why_unloadable_remote",
    "why_copy_differs",
    "fetch_checked",
    "put_once",
    "local_copy",
    "own_copy",
]

RESUME_FOLDER = "resume"  # in the staging folder: fetched resume sources
SHA256_KEY = "sha256"  # in the manifest of a save uploaded from local disk: each file's hash
ETAG_KEY = "etag"  # in the manifest of a save a framework wrote to S3: each object's ETag


def _timeout() -> float:
    return store.store_timeout()


def put_once(url: str, data: dict[str, Any]) -> bool:
    """Create the object ``url`` holding ``data`` as JSON, once (``If-None-Match: *``); False
    when it exists."""
    return remote.put_json_once(url, data, _timeout())


def read_json(url: str) -> Optional[Any]:
    """The JSON object at ``url``; None when there is none or it does not parse."""
    return remote.read_json(url, _timeout())


def record_keep(
    execution: Execution, framework: str, setting: str, value: Any, every: bool = False
) -> None:
    """The framework's rotation limit, for dispatch's cleanup: an object under the prefix."""
    from .saves import KEEP_RECORD, keep_record

    put_once(f"{execution.exec_dir}/{KEEP_RECORD}", keep_record(framework, setting, value, every))


# --- saving ----------------------------------------------------------------------------------


def _say(line: str) -> None:
    sys.stderr.write(f"dispatch: {line}\n")
    sys.stderr.flush()


def uploader(execution: Execution, report: Callable[[str], None] = _say) -> Uploader:
    """The uploader of this execution's staging folder to its prefix."""
    if not execution.stage_dir:
        raise StoreError(
            f"a root on {label_of(execution.root)} needs $DISPATCH_STAGE_DIR (the launcher "
            "sets it) for a framework that writes only to local disk"
        )
    return Uploader(execution.root, execution.stage_dir, execution.exec_dir, _timeout(), report)


def watch_uploader(
    root: str,
    folder: str,
    upload_to: Optional[str],
    timeout: float,
    report: Callable[[str], None],
    may_be_absent: bool = False,
) -> Uploader:
    """``dispatch watch``'s uploader of the staging ``folder`` to the prefix ``upload_to``."""
    return Uploader(root, folder, upload_to, timeout, report, may_be_absent=may_be_absent)


def clear_stage(
    root: str, stage_dir: str, prefix: str, timeout: float, report: Callable[[str], None]
) -> bool:
    """Remove what of ``stage_dir`` is on S3, then the folder if nothing else is left
    (:func:`.stage.clear`); True when the folder is gone."""
    return stage.clear(root, stage_dir, prefix, timeout, report)


def publish_local_save(
    execution: Execution, up: Uploader, step: int, save: str, bests: Optional[list[str]] = None
) -> str:
    """Write the manifest of the local ``save``, upload the save, then publish it; remove the
    older local copies (the newest stays).  Returns the publication's name."""
    # No fsync: the local copy is not what the publication promises; the uploaded one is.
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "files": file_sizes(save),
        SHA256_KEY: file_hashes(save, MANIFEST_SUFFIX[1:]),
    }
    if bests:
        manifest["bests"] = bests  # relative to the root (saves.relative_saves)
    write_create_once(manifest_path(save), manifest, sync=False)
    try:
        name = up.put(execution.epoch, step, save, lambda: False)
    except AlreadyPublished as exc:  # this save's own publication (store.publish_done)
        say_published(str(exc))
        name = store.publication_name(execution.root, execution.epoch, step, up.url_of(save))
    up.published(save)
    apply_limit(execution)
    return name


def seal_remote_save(url: str, bests: Optional[list[str]] = None) -> None:
    """Write the manifest object of a file save that the framework wrote to ``url``
    (``bests``: the saves the framework keeps as its best now, relative to the root)."""
    folder, listed = remote.save_listing(url, _timeout())
    if not listed:
        raise StoreError(f"the save {url} is not on {label_of(url)} after it was written")
    target = f"{url}/{MANIFEST_SUFFIX[1:]}" if folder else url + MANIFEST_SUFFIX
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "files": {name: size for name, (size, _) in listed.items()},
        ETAG_KEY: {name: etag for name, (_, etag) in listed.items()},
    }
    if bests:
        manifest["bests"] = bests
    put_once(target, manifest)


# --- loading ---------------------------------------------------------------------------------


def why_unloadable_remote(url: str, required: tuple[str, ...] = ()) -> Optional[str]:
    """Why the save at ``url`` cannot be loaded from S3, or None when it looks whole: each
    object the manifest lists at its size, and at the ETag it records when it records them
    (:func:`seal_remote_save` does)."""
    folder, found = remote.save_listing(url, _timeout())
    if not found:
        return f"save {url} does not exist on {label_of(url)} (deleted?)"
    listed = read_json(f"{url}/{MANIFEST_SUFFIX[1:]}" if folder else url + MANIFEST_SUFFIX)
    if not isinstance(listed, dict):
        missing = [name for name in required if folder and name not in found]
        return f"save {url} has no {missing[0]!r}" if missing else None
    etags = listed.get(ETAG_KEY)
    etags = etags if isinstance(etags, dict) else {}
    for name, size in sorted(dict(listed.get("files", {})).items()):
        if name not in found:
            return f"object {name!r} of the save {url} is missing"
        actual, etag = found[name]
        if actual != size:
            return f"object {name!r} of the save {url} is {actual} bytes; its manifest says {size}"
        if name in etags and etags[name] != etag:
            return (
                f"object {name!r} of the save {url} was replaced on {label_of(url)} since it "
                f"was saved (ETag {etag}; its manifest records {etags[name]})"
            )
    return None


def local_copy(execution: Execution, url: str, number: int) -> str:
    """A local copy of the save at ``url`` in the staging folder: a copy of the one an earlier
    execution's upload left on this node when it is this user's own and holds what was
    uploaded (:func:`own_copy`), else fetched from S3 and checked against the sha256 its
    manifest records (:func:`why_copy_differs`; a copy that differs is removed and a
    :class:`StoreError` says why)."""
    assert execution.stage_dir is not None
    target = os.path.join(
        execution.stage_dir, f"{RESUME_FOLDER}-{number}", url.rstrip("/").rsplit("/", 1)[-1]
    )
    near = stage_copy(url, execution.stage_dir)
    if near is not None:
        why = own_copy(url, near, target)
        if why is None:
            return target
        _say(f"not using the local copy {near}: {why}; fetching {url} from {label_of(url)} instead")
    local = remote.fetch_save(url, target, _timeout())
    why = why_unloadable(local) or why_copy_differs(url, local)  # sizes said first
    if why is not None:
        remove_copy(local)
        raise StoreError(f"fetched {url}, but {why}; the copy was removed")
    return local


def why_copy_differs(url: str, local: str) -> Optional[str]:
    """Why the local copy ``local`` of the save at ``url`` is not what was uploaded: a file
    whose sha256 is not the one the save's manifest on S3 records (when it records them:
    saves uploaded from local disk do; ``dispatch watch``'s and Lightning's record sizes
    only, which the fetch compares).  None when it is."""
    manifest_url = f"{url}/{MANIFEST_SUFFIX[1:]}" if os.path.isdir(local) else url + MANIFEST_SUFFIX
    manifest = read_json(manifest_url)
    hashes = manifest.get(SHA256_KEY) if isinstance(manifest, dict) else None
    if not isinstance(hashes, dict) or not hashes:
        return None
    found = file_hashes(local, MANIFEST_SUFFIX[1:])
    for name in sorted(set(hashes) | set(found)):
        if hashes.get(name) != found.get(name):
            return (
                f"its file {name!r} has sha256 {found.get(name) or 'none'}; its manifest "
                f"records {hashes.get(name) or 'none'} ({manifest_url})"
            )
    return None


def fetch_checked(url: str, dest: str) -> str:
    """``dispatch fetch``'s copy of the save at ``url`` in ``dest``, checked as a resume copy
    is (:func:`why_unloadable_remote` before, the sizes and sha256 after)."""
    why = why_unloadable_remote(url)
    if why is not None:
        raise StoreError(f"cannot fetch {url}: {why}")
    local = remote.fetch_save(url, dest, _timeout())  # sizes as S3 lists them
    why = why_unloadable(local) or why_copy_differs(url, local)
    if why is not None:
        remove_copy(local)
        raise StoreError(f"fetched {url} to {dest}, but {why}; the copy was removed")
    return local


def own_copy(url: str, near: str, target: str) -> Optional[str]:
    """Copy ``near`` to ``target`` when it holds exactly the uploaded save at ``url``: each of
    S3's objects at its listed size with the sha256 its manifest recorded at upload (folders
    and files this user's own, no link: :func:`watch_s3.copy_own`).  None when copied, else why
    not."""
    folder, objects = remote.save_objects(url, _timeout())
    manifest_url = f"{url}/{MANIFEST_SUFFIX[1:]}" if folder else url + MANIFEST_SUFFIX
    manifest = read_json(manifest_url)
    hashes = manifest.get(SHA256_KEY) if isinstance(manifest, dict) else None
    if not isinstance(hashes, dict) or not hashes:
        return (
            f"the uploaded save's manifest ({manifest_url}) records no sha256 of its files "
            "(uploaded by dispatch watch or an older release), so the copy cannot be "
            "checked"
        )
    uploaded = {
        name: size for name, size in objects.items() if not (folder and name == MANIFEST_SUFFIX[1:])
    }
    if set(uploaded) != set(hashes):
        return (
            f"{label_of(url)} holds {sorted(uploaded)} but the manifest {manifest_url} records the "
            f"sha256 of {sorted(hashes)}"
        )
    why = copy_own(
        near, target, {name: (size, str(hashes[name])) for name, size in uploaded.items()}, folder
    )
    if why is None and folder and isinstance(manifest, dict):  # as uploaded, not the local one
        write_create_once(manifest_path(target), manifest, sync=False)
    return why


def _exec_prefix(root: str, url: str) -> Optional[str]:
    head = root.rstrip("/") + f"/{store.EXEC}/"
    if not url.startswith(head):
        return None
    attempt = url[len(head) :].split("/", 1)[0]
    return head + attempt


def _recorded_source(prefix: str) -> Optional[str]:
    """What the execution at ``prefix`` resumed from, as recorded under it (ours first, then
    the launcher's copy of its record); None when nothing says, "" for a fresh start."""
    for name in (RESUME_RECORD, LAUNCH_RECORD):
        record = read_json(f"{prefix}/{name}")
        if isinstance(record, dict) and "resume_from" in record:
            source = record["resume_from"]
            return source if isinstance(source, str) else ""
    return None


def choose_resume(
    execution: Execution, required: tuple[str, ...] = (), framework: str = "", fetch: bool = False
) -> Resume:
    """The save this execution resumes from: its URL, or with ``fetch`` a local copy of it.
    A save that cannot be loaded is passed over for the previous one of its lineage."""
    if execution.resume_from is None:
        latest = quarantine.resumable(execution.root)  # passing over a quarantined save
        start = latest.path if latest is not None else ""
    else:
        start = execution.resume_from
    resume = Resume(path=None)
    source_url = ""
    candidates: Iterator[str] = iter([start] if start else [])
    found: Optional[list[store.Found]] = None  # set once the lineage is tried
    listing: list[store.Found] = []
    number = 0
    while True:
        url = next(candidates, None)
        if url is None:
            if found is not None or not start:
                break
            found = store.list_publications(execution.root)
            candidates = lineage_before(
                execution.root, start, found, folder_of=_exec_prefix, recorded=_recorded_source
            )
            continue
        number += 1
        if url != execution.resume_from:  # the launcher's record protects its own choice
            listing = found or listing or store.list_publications(execution.root)
            if not record_choice(execution, url, listing, f"resuming (first choice {start})"):
                resume.passed_over.append(
                    {
                        "path": url,
                        "why": "its publication was removed "
                        "by cleanup while this execution chose it",
                    }
                )
                continue
        try:
            if fetch:
                local = local_copy(execution, url, number)
                why = why_unloadable(local, required)
            else:
                local, why = url, why_unloadable_remote(url, required)
        except StoreError as exc:
            why = str(exc)
        if why is None:
            resume.path, source_url = local, url
            break
        resume.passed_over.append({"path": url, "why": why})
    record = {
        "resume_from": source_url,
        "local_copy": resume.path if fetch else None,
        "passed_over": resume.passed_over,
        "launcher_resume_from": execution.resume_from,
        "framework": framework,
        "attempt": execution.attempt,
        "epoch": execution.epoch,
    }
    if put_once(f"{execution.exec_dir}/{RESUME_RECORD}", record):
        for skipped in resume.passed_over:
            instead = source_url or "nothing (a fresh start)"
            _say(
                f"not resuming from {skipped['path']}: {skipped['why']}; trying the previous "
                f"save of its lineage (resuming from {instead})"
            )
    return resume
