"""What the framework integrations share: the execution they run in, durable publication of a
save, and the choice of the save to resume from (with its fallback).  Imports no training
library.

Invariants kept here:

* A save is published only after its files and folders are fsynced and a create-once manifest
  (each file's size) is written beside it: a publication then promises a whole save, not a
  name (the seed says a publication is not a data sync; with the integrations it is one).
* The resume source is ``$DISPATCH_RESUME_FROM`` as the launcher chose it (empty: a fresh
  start), or the latest publication when the variable is absent.  A source that cannot be
  loaded (a file shorter than its manifest says, a folder deleted by hand) is passed over for
  the previous save *of its lineage*: the execution's own earlier publications, then the save
  that execution resumed from; only where no record says what an execution resumed from, the
  previous publication in (epoch, step) order.  An old execution's late saves are therefore not
  taken for the lineage's.  Each pass-over is said on stderr once and recorded, create-once, in
  the execution's folder (``.dispatch-resume.json``).
* A save other than the launcher's choice is recorded as chosen (``.dispatch-choice-*.json``,
  :mod:`..checkpoint.execdir`) *before* it is loaded, and then a publication of it must still
  be there, else it is passed over (cleanup unpublished it meanwhile): cleanup, which removes
  publications first and then reads every live execution's choices again, spares every save so
  chosen.  The ranks of one execution load the same save: the first to record the resume
  takes it, the others take what it recorded.
* The framework's own rotation limit is recorded, create-once, in the execution's folder
  (``.dispatch-keep.json``), and each save's manifest lists the saves the framework keeps as
  its best at that moment; after each publication the limit is applied across the store as
  ``dispatch gc --keep`` would (:func:`apply_limit`), keeping the live lineage's bests too.  A
  cleanup that fails is said once on stderr and not tried again; training goes on.

Outside a dispatch execution (no ``DISPATCH_EXEC_DIR``) nothing here is used: ``current()``
returns ``None`` and the integrations leave the framework alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import _fsio
from ..checkpoint import execdir, quarantine
from ..checkpoint import publish as store
from ..checkpoint.stores.schemes import SCHEMES
from ..errors import DispatchError, UsageError
from . import contract

MANIFEST_SUFFIX = execdir.MANIFEST_SUFFIX  # a folder save holds MANIFEST_SUFFIX[1:]
RESUME_RECORD = execdir.RESUME
KEEP_RECORD = execdir.KEEP
LAUNCH_RECORD = execdir.RECORD  # the launcher's create-once record of the execution
MANIFEST_FORMAT = execdir.MANIFEST_FORMAT


@dataclass(frozen=True)
class Execution:
    """The dispatch execution this process runs in, from the launcher's environment (read
    by :class:`..execution.contract.Contract`, as ``api.execution()`` reads it)."""

    root: str
    exec_dir: str
    epoch: int
    attempt: str
    job: str
    # None: the variable is absent (ask the store); "": the launcher found nothing to resume.
    resume_from: Optional[str]
    # On a remote root (s3://): exec_dir is the execution's prefix, and this its local
    # staging folder.
    stage_dir: Optional[str] = None

    @property
    def remote(self) -> bool:
        """True on a remote root (the table of stores says which): saves are staged locally."""
        return store.is_remote_root(self.root)

    @property
    def on_s3(self) -> bool:
        """0.1.0's name of :attr:`remote`; kept in 0.2.0, removed in 0.3.0 (CHANGELOG.md)."""
        import warnings

        warnings.warn(
            "Execution.on_s3 is Execution.remote (true for every remote store of the table, "
            "s3:// and az://); the old name goes in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.remote

    @classmethod
    def current(cls, env: Optional[Mapping[str, str]] = None) -> Optional[Execution]:
        """The execution named by ``env`` (default: ``os.environ``), or ``None`` outside one."""
        found = contract.Contract.read(env)
        exec_dir, root = found.text("exec_dir"), found.text("checkpoint")
        if not exec_dir or not root:
            return None
        if "://" in root and store.scheme_of(root) is None:
            kinds = ["a folder", *(f"an {row.prefix} root" for row in SCHEMES)]
            raise UsageError(
                f"checkpoint root {root!r}: the framework integrations publish "
                f"under {', '.join(kinds[:-1])} or {kinds[-1]} only"
            )
        try:
            epoch = found.number("epoch")
        except contract.NotANumber as exc:
            raise UsageError(f"{exc.name} {exc.raw!r} is not an integer") from None
        return cls(
            root=root,
            exec_dir=exec_dir,
            epoch=epoch,
            attempt=found.text("attempt"),
            job=found.text("job"),
            resume_from=found.resume_from,
            stage_dir=found.stage_dir or None,
        )


# --- durability ---------------------------------------------------------------------------


def file_hashes(save: str, skip: str = "") -> dict[str, str]:
    """The sha256 of each regular file of a local save (as :func:`remote.local_files` names
    them; ``skip``: a name left out), for its manifest at upload and to check a copy."""
    from ..checkpoint.stores import remote  # local_files: the same walk as an upload's

    out: dict[str, str] = {}
    for relative, full in remote.local_files(save):
        if relative == skip:
            continue
        hashed = hashlib.sha256()
        with open(full, "rb") as source:
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                hashed.update(chunk)
        out[relative] = hashed.hexdigest()
    return out


def sync_save(path: str) -> None:
    """fsync every regular file of the save at ``path`` (a file or a folder), then its folders
    bottom-up, then the folder holding it; symlinks are not followed."""
    if os.path.isdir(path) and not os.path.islink(path):
        for folder, _dirs, files in os.walk(path, topdown=False):
            for name in files:
                full = os.path.join(folder, name)
                if not os.path.islink(full):
                    _fsio.fsync_path(full, directory=False)
            _fsio.fsync_path(folder, directory=True)
    else:
        _fsio.fsync_path(path, directory=False)
    _fsio.fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)


def manifest_path(save: str) -> str:
    """Where the manifest of ``save`` lives: inside a folder save, beside a file save."""
    if os.path.isdir(save):
        return os.path.join(save, MANIFEST_SUFFIX[1:])
    return save + MANIFEST_SUFFIX


def file_sizes(save: str) -> dict[str, int]:
    """Each file of ``save`` (a file, or a folder walked) by its path inside it, with its size:
    what a manifest lists (the manifest itself and links left out)."""
    if not os.path.isdir(save):
        return {os.path.basename(save): os.lstat(save).st_size}
    sizes: dict[str, int] = {}
    for folder, _dirs, files in os.walk(save):
        for name in files:
            full = os.path.join(folder, name)
            if name != MANIFEST_SUFFIX[1:] and not os.path.islink(full):
                sizes[os.path.relpath(full, save)] = os.lstat(full).st_size
    return sizes


def write_create_once(path: str, data: dict[str, Any], sync: bool = True) -> bool:
    """Write ``data`` as JSON to a new file at ``path`` (synced with its folder unless the
    caller syncs them itself); False when it exists."""
    try:
        # A failed write leaves what it wrote (discard_partial=False), as it always has: the
        # name is the claim, and a later writer must not take it over.
        _fsio.write_new(
            path,
            (json.dumps(data, sort_keys=True) + "\n").encode(),
            0o444,
            sync=sync,
            discard_partial=False,
        )
    except FileExistsError:
        return False
    if sync:
        _fsio.fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)
    return True


def relative_saves(execution: Execution, paths: list[str]) -> list[str]:
    """``paths`` (absolute paths or URLs of saves) relative to the execution's root, for a
    manifest's ``bests``; a path outside the root is left out."""
    base = execution.root.rstrip("/") + "/"
    if not execution.remote:
        base = os.path.abspath(execution.root).rstrip("/") + "/"
    out = []
    for path in paths:
        full = path if execution.remote else os.path.abspath(path)
        if full.startswith(base) and full.rstrip("/") != base.rstrip("/"):
            out.append(full[len(base) :].rstrip("/"))
    return sorted(set(out))


def seal_save(save: str, single_writer: bool, bests: Optional[list[str]] = None) -> None:
    """Make the save durable and write its manifest, on the process that will publish it.

    A single writer writes the manifest first and syncs it with the save in one pass.  With
    several ranks, each rank has already synced its own part (:func:`sync_save`, then a
    barrier); the manifest is then written and synced on its own.  ``bests``: the saves the
    framework keeps as its best now (relative to the root, :func:`relative_saves`), which
    cleanup keeps while this execution is live.
    """
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "files": file_sizes(save)}
    if bests:
        manifest["bests"] = bests
    if single_writer:
        write_create_once(manifest_path(save), manifest, sync=False)
        sync_save(save)
    else:
        write_create_once(manifest_path(save), manifest)


def publish_save(execution: Execution, step: int, save: str) -> str:
    """Publish a sealed save (:func:`seal_save`), then apply the framework's limit
    (:func:`apply_limit`); returns the publication's name.  Its publication found already
    there is this save's (:func:`store.publish_done`): said, never an error that ends a run."""
    name = store.publish_done(execution.root, execution.epoch, step, save, said=say_published)
    apply_limit(execution)
    return name


def say_published(text: str) -> None:
    sys.stderr.write(f"dispatch: already published, nothing to do: {text}\n")
    sys.stderr.flush()


_LIMITS: dict[str, Optional[int]] = {}  # exec_dir -> the limit recorded (None: none, or off)


def apply_limit(execution: Execution) -> None:
    """After a publication: remove what ``dispatch gc --keep K`` would, K being the limit the
    framework was given (recorded in the execution's keep record); nothing without one.  What
    cleanup keeps (every save a live execution chose, pins, the framework's bests) stays.  A
    failure is said once and ends this process's cleanup, never its training."""
    if execution.exec_dir not in _LIMITS:
        try:
            _LIMITS[execution.exec_dir] = execdir.keep_of(
                store.open_store(execution.root).read_exec_file(_attempt_of(execution), KEEP_RECORD)
            )
        except DispatchError:
            _LIMITS[execution.exec_dir] = None
    keep = _LIMITS[execution.exec_dir]
    if keep is None:
        return
    from ..checkpoint import gc

    # The listing lag's wait runs beside the training (and at once without a lag).
    gc.collect_in_background(execution.root, keep, gc.say_on_stderr)


def _attempt_of(execution: Execution) -> str:
    return execution.attempt or execution.exec_dir.rstrip("/").rsplit("/", 1)[-1]


def record_choice(execution: Execution, path: str, found: list[store.Found], why: str) -> bool:
    """Record, before loading it, that this execution chose the save at ``path`` (a path or
    URL under the root), then say whether a publication of it is still there: when it is,
    cleanup spares it (it reads the choices again after unpublishing); when not, it may be
    going, and the caller passes it over."""
    st = store.open_store(execution.root)
    base = st.locate("")
    full = path if execution.remote else os.path.abspath(path)
    relative = full[len(base) :].rstrip("/") if full.startswith(base) else full
    try:
        st.create_exec_file(
            _attempt_of(execution),
            execdir.choice_name(relative),
            execdir.choice_bytes(relative, _attempt_of(execution), why),
        )
    except FileExistsError:
        pass  # another rank chose it too
    return any(st.has_publication(f.name) for f in found if f.path.rstrip("/") == path.rstrip("/"))


# --- loading ---------------------------------------------------------------------------------


def why_unloadable(save: str, required: tuple[str, ...] = ()) -> Optional[str]:
    """Why the save at ``save`` cannot be loaded, or ``None`` when it looks whole.

    With a manifest, every file it lists must exist at its size; without one (a save published
    by hand or by watch), the ``required`` files of a folder save must exist.
    """
    if not os.path.exists(save):
        return f"save {save!r} does not exist (deleted?)"
    manifest = manifest_path(save)
    try:
        with open(manifest, encoding="utf-8") as handle:
            listed = json.load(handle).get("files", {})
    except FileNotFoundError:
        listed = None
    except (OSError, ValueError, AttributeError) as exc:
        return f"manifest {manifest!r} cannot be read: {exc}"
    if listed is None:
        if os.path.isdir(save):
            for name in required:
                if not os.path.exists(os.path.join(save, name)):
                    return f"save {save!r} has no {name!r}"
        elif os.path.getsize(save) == 0:
            return f"save {save!r} is empty"
        return None
    base = save if os.path.isdir(save) else os.path.dirname(save)
    for name, size in sorted(listed.items()):
        full = os.path.join(base, name)
        try:
            actual = os.lstat(full).st_size
        except FileNotFoundError:
            return f"file {full!r} of the save is missing"
        if actual != size:
            return f"file {full!r} is {actual} bytes; its manifest says {size} (truncated?)"
    return None


def remove_copy(path: str) -> None:
    """Remove a local copy of a save (a folder or a file) that must not be loaded."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


@dataclass
class Resume:
    """The save to resume from (``None``: a fresh start) and the saves passed over, with why."""

    path: Optional[str]
    passed_over: list[dict[str, str]] = field(default_factory=list)


def _exec_folder(root: str, path: str) -> Optional[str]:
    parts = os.path.relpath(path, os.path.abspath(root)).split(os.sep)
    if len(parts) >= 3 and parts[0] == store.EXEC:
        return os.path.join(os.path.abspath(root), store.EXEC, parts[1])
    return None


def _recorded_source(exec_folder: str) -> Optional[str]:
    """What the execution owning ``exec_folder`` resumed from, as recorded there (ours first,
    then the launcher's record); ``None`` when nothing says."""
    for name in (RESUME_RECORD, LAUNCH_RECORD):
        try:
            with open(os.path.join(exec_folder, name), encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "resume_from" in data:
            source = data["resume_from"]
            # The launcher writes null for a fresh start: the lineage ends there.
            return source if isinstance(source, str) else ""
    return None


def lineage_before(
    root: str,
    bad: str,
    found: list[store.Found],
    folder_of: Callable[[str, str], Optional[str]] = _exec_folder,
    recorded: Callable[[str], Optional[str]] = _recorded_source,
) -> Iterator[str]:
    """The saves to try after ``bad``, nearest first, along its lineage.  ``folder_of`` gives
    a save's execution folder (on S3: its prefix), ``recorded`` what that execution resumed
    from."""
    by_path = {f.path: f for f in found}
    seen = {bad}
    current = bad
    while True:
        mine = by_path.get(current)
        folder = folder_of(root, current)
        own = [
            f
            for f in found
            if folder is not None
            and folder_of(root, f.path) == folder
            and mine is not None
            and (f.epoch, f.step) < (mine.epoch, mine.step)
        ]
        for each in sorted(own, key=lambda f: f.name, reverse=True):
            if each.path not in seen:
                seen.add(each.path)
                yield each.path
        source = recorded(folder) if folder is not None else None
        if source:  # the lineage goes on in the save this execution resumed from
            if source in seen:
                return
            seen.add(source)
            yield source
            current = source
            continue
        if source == "":
            return  # that execution started fresh: the lineage ends here
        # No record: the plain order of publications is all there is to go by.
        below = [f for f in found if mine is None or f.name < mine.name]
        for each in sorted(below, key=lambda f: f.name, reverse=True):
            if each.path not in seen:
                seen.add(each.path)
                yield each.path
        return


def choose_resume(
    execution: Execution, required: tuple[str, ...] = (), framework: str = ""
) -> Resume:
    """The save this execution resumes from, passing over saves that cannot be loaded.

    The choice is recorded in the execution's folder; the first process to record it also says
    on stderr which saves it passed over and why (one message per execution, not per rank).
    """
    launcher_choice = execution.resume_from
    if launcher_choice is None:
        latest = quarantine.resumable(execution.root)  # passing over a quarantined save
        start = latest.path if latest is not None else ""
    else:
        start = launcher_choice
    resume = Resume(path=start or None)
    found: Optional[list[store.Found]] = None
    if start and launcher_choice is None:
        # Not the launcher's choice (its record already protects that one): record it.
        found = store.list_publications(execution.root)
        if not record_choice(execution, start, found, "the latest publication"):
            resume.passed_over.append(
                {
                    "path": start,
                    "why": "its publication was removed by cleanup while this execution chose it",
                }
            )
            resume.path = None
    if start:
        why = why_unloadable(start, required) if resume.path else "passed over"
        if why is not None:
            if resume.path:
                resume.passed_over.append({"path": start, "why": why})
            resume.path = None
            found = store.list_publications(execution.root) if found is None else found
            for candidate in lineage_before(execution.root, start, found):
                why = why_unloadable(candidate, required)
                if why is None and not record_choice(
                    execution, candidate, found, f"fallback from {start}"
                ):
                    why = "its publication was removed by cleanup while this execution chose it"
                if why is None:
                    resume.path = candidate
                    break
                resume.passed_over.append({"path": candidate, "why": why})
    record = {
        "resume_from": resume.path or "",
        "passed_over": resume.passed_over,
        "launcher_resume_from": launcher_choice,
        "framework": framework,
        "attempt": execution.attempt,
        "epoch": execution.epoch,
    }
    path = os.path.join(execution.exec_dir, RESUME_RECORD)
    if write_create_once(path, record):
        for skipped in resume.passed_over:
            instead = resume.path or "nothing (a fresh start)"
            sys.stderr.write(
                f"dispatch: not resuming from {skipped['path']}: {skipped['why']}; "
                f"trying the previous save of its lineage (resuming from "
                f"{instead})\n"
            )
        sys.stderr.flush()
    else:
        # Another rank recorded the resume first: load what it chose, so the ranks agree.
        try:
            with open(path, encoding="utf-8") as handle:
                first = json.load(handle)
        except (OSError, ValueError):
            first = None
        if isinstance(first, dict) and isinstance(first.get("resume_from"), str):
            resume.path = first["resume_from"] or None
    return resume


def record_keep(
    execution: Execution, framework: str, setting: str, value: Any, every: bool = False
) -> None:
    """Record the framework's own rotation limit, turned off here, for dispatch's cleanup
    (``every``: one of its checkpoint callbacks keeps every save, so no limit applies)."""
    # Every rank may record it; the first one does, the others find it there.
    write_create_once(
        os.path.join(execution.exec_dir, KEEP_RECORD), keep_record(framework, setting, value, every)
    )


def keep_record(framework: str, setting: str, value: Any, every: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"framework": framework, "setting": setting, "keep": value}
    if every:
        data["every"] = True
    return data
