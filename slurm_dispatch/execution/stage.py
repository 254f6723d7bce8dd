"""Removing an execution's local staging folder (an ``s3://`` root's ``$DISPATCH_STAGE_DIR``)
once its contents are on S3.

The launcher makes one such folder per execution, on the node's local disk (StageDir in
dispatch.conf, else ``$TMPDIR``, else /tmp).  ``dispatch watch`` calls :func:`clear` when its
command ended with status 0 (the execution's work is done).  A run stopped early (a requeue,
a preemption, a failure) keeps its folder: its newest save is what a replacement on the same
node copies instead of fetching (:func:`slurm_dispatch.execution.watch_s3.stage_copy`).

Invariant: nothing is removed that is not on S3.  An entry of the folder is removed only when
it is

* a save published from the execution's prefix, every file of it regular and on S3 at its
  size (a folder holding a symlink or anything else is kept);
* the launcher's record ``.dispatch``, when S3 holds the same bytes under the prefix;
* the execution's progress record ``.dispatch-progress.json``, which only its own stall
  watcher reads while it runs (no work of the trainer's);
* a copy dispatch fetched from S3 (``resume-<n>/``, ``fetched/``) holding only files of a
  save of this root by its name, each on S3 at its size (a file a trainer added keeps it).

Anything else (a log, a final model never uploaded, a save not yet published) stays, with the
folder, and is named on stderr.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Optional

from ..checkpoint import execdir
from ..checkpoint import publish as store
from ..checkpoint.stores import remote
from ..checkpoint.stores.base import Store
from ..checkpoint.stores.schemes import label_of
from .watch_s3 import DOWNLOADS


def clear(
    root: str, stage_dir: str, prefix: str, timeout: float, report: Callable[[str], None]
) -> bool:
    """Remove what of ``stage_dir`` is in the root's store, then the folder if nothing else is
    left; True when the folder is gone."""
    st = store.open_store(root, timeout)
    prefix = prefix.rstrip("/")
    every = [f.path.rstrip("/") for f in st.list_publications()]
    published = {path for path in every if path.startswith(prefix + "/")}
    attempt = prefix.rsplit("/", 1)[-1]
    kept: list[str] = []
    for name in sorted(os.listdir(stage_dir)):
        path = os.path.join(stage_dir, name)
        why = _why_kept(st, attempt, name, path, f"{prefix}/{name}", published, every, timeout)
        if why is not None:
            kept.append(f"{name} ({why})")
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    if kept:
        report(f"kept the staging folder {stage_dir}: {', '.join(kept)}")
        return False
    os.rmdir(stage_dir)
    report(
        f"removed the staging folder {stage_dir} (its saves are on {label_of(root)} under {prefix})"
    )
    return True


def _why_kept(
    st: Store,
    attempt: str,
    name: str,
    path: str,
    url: str,
    published: set[str],
    every: list[str],
    timeout: float,
) -> Optional[str]:
    if DOWNLOADS.fullmatch(name) and os.path.isdir(path) and not os.path.islink(path):
        return _download_kept(
            path, every, timeout, label_of(url)
        )  # fetched: there still, unless added to
    if name == execdir.PROGRESS and os.path.isfile(path) and not os.path.islink(path):
        return None  # read by the execution's stall watcher alone, and the command has ended
    if name == execdir.RECORD:
        try:
            with open(path, "rb") as handle:
                mine = handle.read()
            return (
                None
                if st.read_exec_file(attempt, name) == mine
                else f"not on {label_of(url)} as here"
            )
        except Exception as exc:  # a record not readable there is kept, whatever the cause
            return f"not read back from {label_of(url)}: {exc}"
    if url not in published:
        return "not published"
    if not _regular_only(path):
        return "holds something other than regular files and folders"
    _folder, objects = remote.save_objects(url, timeout)
    for relative, full in remote.local_files(path):
        if objects.get(relative) != os.lstat(full).st_size:
            return f"{relative} is not on {label_of(url)} at its size"
    return None


def _download_kept(folder: str, saves: list[str], timeout: float, label: str) -> Optional[str]:
    """Why a download folder stays, or None: each entry must be a copy of a save of this root
    (``saves``, every publication's URL) by its name, each of its files an object of that save
    at its size (``label``: the root's store, as messages name it).  A file a trainer wrote
    into the copy, or beside it, was never uploaded."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not _regular_only(path):
            return f"{name} holds something other than regular files and folders"
        urls = [url for url in saves if url.rsplit("/", 1)[-1] == name]
        if not urls:
            return f"{name} is not a save of this root on {label}"
        why = ""
        for url in urls:
            _folder, objects = remote.save_objects(url, timeout)
            why = next(
                (
                    f"{name}/{relative} is not on {label} at its size"
                    for relative, full in remote.local_files(path)
                    if objects.get(relative) != os.lstat(full).st_size
                ),
                "",
            )
            if not why:
                break
        if why:
            return why
    return None


def _regular_only(path: str) -> bool:
    if os.path.islink(path):
        return False
    if not os.path.isdir(path):
        return os.path.isfile(path)
    for folder, dirs, files in os.walk(path):
        for each in dirs + files:
            full = os.path.join(folder, each)
            if os.path.islink(full) or not (os.path.isdir(full) or os.path.isfile(full)):
                return False
    return True
