"""Saves between local disk and a remote root, whatever its store: the one interface the
in-job half (:mod:`slurm_dispatch.execution.staging`'s implementation) moves bytes through.

Each function takes a URL under a remote root and hands the call to the transfers of that
root's store: the module the row of the table of stores names (:attr:`.schemes.Scheme.transfers`:
S3's is :mod:`.transfer`, with boto3's transfer manager).  A store's transfers provide
``put_json_once``, ``read_json``, ``upload_save``, ``save_listing`` and ``fetch_save`` with the
meanings written here; nothing else of the in-job half names a store.  Importing this module
imports no store and no SDK.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
from types import ModuleType
from typing import Any, Optional

from ...errors import StoreError
from .schemes import scheme_of

# What XML 1.0 cannot hold (S3's DeleteObjects and every listing are XML): the control characters
# but tab, newline and return, U+FFFE and U+FFFF; and the lone surrogates os.walk makes of bytes
# that are not UTF-8.
_UNCARRIED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _transfers(url: str) -> ModuleType:
    row = scheme_of(url)
    if row is None or not row.remote:
        raise StoreError(f"{url!r} is not under a remote root: it has no transfers")
    return importlib.import_module(f"{__package__}.{row.transfers or row.module}")


def put_json_once(url: str, data: dict[str, Any], timeout: float) -> bool:
    """Create the object ``url`` holding ``data`` as JSON, once; False when it exists."""
    return bool(_transfers(url).put_json_once(url, data, timeout))


def read_json(url: str, timeout: float) -> Optional[Any]:
    """The JSON object at ``url``; None when there is none or it does not parse."""
    return _transfers(url).read_json(url, timeout)


def upload_save(local: str, url: str, timeout: float) -> dict[str, int]:
    """Upload the save at ``local`` to ``url`` (a folder's files under ``url/``, a file at
    ``url``); each uploaded object's name (relative to ``url``; a file save: its base name)
    and size.  A save or file whose name no store's XML can carry is refused before anything
    is put."""
    for name, _full in [("", url), *local_files(local)]:
        if _UNCARRIED.search(name or url):
            what = f"{name!r} of the save {local!r} to {url}" if name else f"the save to {url!r}"
            raise StoreError(
                f"cannot upload {what}: the name holds a character that no listing or delete "
                "of a remote store can carry (a control character, U+FFFE or U+FFFF, or bytes "
                "that are not UTF-8); rename it"
            )
    try:
        sizes: dict[str, int] = _transfers(url).upload_save(local, url, timeout)
    except OSError as exc:  # the save changed on local disk meanwhile (a file removed)
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"uploading {local} to {url} failed: {exc}") from None
    return sizes


def save_listing(url: str, timeout: float) -> tuple[bool, dict[str, tuple[int, str]]]:
    """What the save at ``url`` holds: (whether it is a folder, each object's name with its
    size and its ETag, which changes when the object is replaced).  A folder save's names are
    relative to ``url/``; a file save is one entry named by its base name; nothing found:
    ``(False, {})``."""
    found: tuple[bool, dict[str, tuple[int, str]]] = _transfers(url).save_listing(url, timeout)
    return found


def save_objects(url: str, timeout: float) -> tuple[bool, dict[str, int]]:
    """As :func:`save_listing`, each object with its size only."""
    folder, listed = save_listing(url, timeout)
    return folder, {name: size for name, (size, _etag) in listed.items()}


def fetch_save(url: str, local: str, timeout: float) -> str:
    """Download the save at ``url`` to ``local`` (which must not exist), every object at its
    listed size; return ``local`` (a folder, or the file of a file save).  A fetch that fails
    leaves nothing at ``local``: no part of a save that could pass for the whole."""
    there = os.path.lexists(local)
    try:
        return str(_transfers(url).fetch_save(url, local, timeout))
    except BaseException:
        if not there and os.path.isdir(local) and not os.path.islink(local):
            shutil.rmtree(local, ignore_errors=True)
        elif not there and os.path.lexists(local):
            os.unlink(local)
        raise


def local_files(path: str) -> list[tuple[str, str]]:
    """(relative name, absolute path) of each regular file of a save, sorted; a file save is
    one entry named by its base name.  Symlinks are skipped, never followed, and so is what is
    not a regular file (a named pipe would hold the upload until its deadline)."""
    if os.path.islink(path):
        return []
    if not os.path.isdir(path):
        return [(os.path.basename(path), path)] if os.path.isfile(path) else []
    found = []
    for folder, _dirs, files in os.walk(path):  # os.walk does not descend into linked folders
        for name in files:
            full = os.path.join(folder, name)
            if os.path.isfile(full) and not os.path.islink(full):
                found.append((os.path.relpath(full, path), full))
    return sorted(found)


def fetch_targets(
    url: str, local: str, folder: bool, sizes: dict[str, int]
) -> list[tuple[str, str, int]]:
    """Where each object of the save at ``url`` lands under ``local`` (made ready: a folder
    save's folders made, a file save's target absent): (its name under ``url``, "" for a file
    save; the local file; its listed size).  A name that would land outside is refused."""
    if not sizes:
        raise StoreError(f"the save {url} holds no object (deleted?)")
    if not folder:
        if os.path.lexists(local):
            raise StoreError(f"cannot fetch {url} to {local!r}: it exists")
        os.makedirs(os.path.dirname(os.path.abspath(local)), exist_ok=True)
        return [("", local, next(iter(sizes.values())))]
    os.makedirs(local)
    targets = []
    for name, size in sorted(sizes.items()):
        if name.startswith("/") or ".." in name.split("/"):
            raise StoreError(f"the save {url} holds {name!r}, which would land outside its folder")
        target = os.path.join(local, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        targets.append((name, target, size))
    return targets


def check_fetched(url: str, targets: list[tuple[str, str, int]]) -> None:
    """Refuse a fetch whose file is not at its object's listed size."""
    for name, target, size in targets:
        got = os.path.getsize(target)
        if got != size:
            where = f"{url}/{name}" if name else url
            raise StoreError(f"fetched {where} to {target!r}: {got} bytes, the object has {size}")
