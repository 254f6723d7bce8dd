"""``dispatch fetch``: a save as a local folder, for trainers that read only local disk (a
shell script on an ``s3://`` root, where ``$DISPATCH_RESUME_FROM`` is a URL).

* With no SAVE, inside an execution: the execution's resume source, chosen as the framework
  integrations choose it (``$DISPATCH_RESUME_FROM``, the previous save of its lineage when that
  one cannot be loaded; the choice recorded create-once, so cleanup spares it).  On S3 it is
  fetched into the staging folder (``resume-<n>/<name>``; a copy an earlier execution left on
  this node is taken only when it is this user's own and matches the sha256 recorded at
  upload); asked again, the copy already made is given.  None: a fresh start.
* A save on a folder root is already local: its path is given as it is, unless DEST asks for
  a copy.
* Every copy is checked before its path is given: each file at the size S3 lists (and its
  manifest records), and at the sha256 its manifest records when it records them (a local
  copy: the same bytes as the source).  A copy that does not check out is removed, never
  given; DEST must not exist (nothing is overwritten).
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

from ..checkpoint import publish as store
from ..checkpoint.stores.schemes import label_of
from ..errors import StoreError, UsageError
from . import saves, staging
from .saves import file_hashes

FETCHED = "fetched"  # in the staging folder: saves fetched by name (never a save of its own)

FRAMEWORK = "shell"


def fetch(save: Optional[str] = None, dest: Optional[str] = None) -> Optional[str]:
    """The local path of ``save`` (default: this execution's resume source), copied to
    ``dest`` when given or when the save is on S3; None for a fresh start."""
    execution = saves.Execution.current()
    if save is None:
        if execution is None:
            raise UsageError(
                "no SAVE given and not inside a dispatch execution "
                "($DISPATCH_EXEC_DIR unset): give the save's path, or its URL on a remote root"
            )
        save = _resume_source(execution, copy_here=dest is None)
        if save is None or not store.is_remote_root(save) and dest is None:
            return save
    elif not store.is_remote_root(save):
        why = saves.why_unloadable(save)
        if why is not None:
            raise StoreError(f"cannot fetch {save}: {why}")
        if dest is None:
            return os.path.abspath(save)
    if dest is None:
        dest = os.path.join(_local_base(execution), save.rstrip("/").rsplit("/", 1)[-1])
    if os.path.lexists(dest):
        raise UsageError(
            f"DEST {dest!r} exists: give a path that does not (nothing is overwritten)"
        )
    try:
        if store.is_remote_root(save):
            return staging.of(save).fetch_checked(save, dest)
        return _copy_checked(save, dest)
    except BaseException:
        saves.remove_copy(dest)
        raise


def _resume_source(execution: saves.Execution, copy_here: bool) -> Optional[str]:
    if not execution.remote:
        return saves.choose_resume(execution, framework=FRAMEWORK).path
    if copy_here:
        # Asked again in this execution: the copy it made (checked again), not a second one.
        made = staging.of(execution.root).read_json(f"{execution.exec_dir}/{saves.RESUME_RECORD}")
        local = made.get("local_copy") if isinstance(made, dict) else None
        if isinstance(local, str) and saves.why_unloadable(local) is None:
            return local
        if isinstance(made, dict) and made.get("resume_from") == "":
            return None
        if not execution.stage_dir:
            raise UsageError(
                f"a root on {label_of(execution.root)} needs $DISPATCH_STAGE_DIR (the "
                "launcher sets it) to fetch into; or give DEST"
            )
    resume = staging.of(execution.root).choose_resume(
        execution, framework=FRAMEWORK, fetch=copy_here
    )
    return resume.path


def _local_base(execution: Optional[saves.Execution]) -> str:
    if execution is not None and execution.stage_dir:
        # Beside the execution's own saves, never among them (watch would publish them).
        return os.path.join(execution.stage_dir, FETCHED)
    return os.getcwd()


def _copy_checked(save: str, dest: str) -> str:
    source = os.path.abspath(save)
    if os.path.isdir(source):
        shutil.copytree(source, dest, symlinks=True)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(dest)) or ".", exist_ok=True)
        shutil.copy2(source, dest)
    why = saves.why_unloadable(dest) or _differs(file_hashes(source), file_hashes(dest), save)
    if why is not None:
        raise StoreError(f"copied {save} to {dest}, but {why}; the copy was removed")
    return dest


def _differs(expected: dict[str, str], found: dict[str, str], source: str) -> Optional[str]:
    for name in sorted(set(expected) | set(found)):
        if expected.get(name) != found.get(name):
            return (
                f"its file {name!r} has sha256 {found.get(name) or 'none'}, "
                f"{source} records {expected.get(name) or 'none'}"
            )
    return None
