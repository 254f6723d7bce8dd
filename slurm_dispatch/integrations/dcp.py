"""``torch.distributed.checkpoint`` (DCP) inside a dispatch execution: ``save``, ``async_save``
and ``load`` as DCP spells them, each save published once every rank's part is durable.

A torchtitan-style loop changes the import, the load and the folder a save names::

    from slurm_dispatch.integrations import dcp  # was: import torch.distributed.checkpoint as dcp
    resumed = dcp.load(state_dict)  # was: if exists(f): dcp.load(state_dict, checkpoint_id=f)
    ...
    dcp.save(state_dict, step=step)  # was: dcp.save(state_dict, checkpoint_id=f"{f}/step-{step}")
    future = dcp.async_save(state_dict, step=step, process_group=gloo_group)

The stable API (what ``dispatch watch``'s DCP support and other callers may rely on):

* ``save(state_dict, *, step, checkpoint_id=None, storage_writer=None, planner=None,
  process_group=None, no_dist=False, env=None)`` returns DCP's ``Metadata``; ``async_save``
  (same arguments and ``async_checkpointer_type``, ``async_stager``) returns what DCP's returns
  (a ``Future``, or an ``AsyncSaveResponse`` with a stager that stages asynchronously).
* ``load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
  process_group=None, no_dist=False, env=None)`` loads into ``state_dict`` in place and
  returns the folder it loaded, or ``None`` for a fresh start (nothing loaded).
* ``save_folder(step, checkpoint_id=None, env=None)``: the folder a save of ``step`` goes to.
* ``env`` (each of them): the mapping that names the execution, as the launcher's variables
  do (default: ``os.environ``).
* ``METADATA`` (``.metadata``): the file whose presence makes a DCP folder complete.
* ``FRAMEWORK`` (``"dcp"``): the name recorded in the execution's resume record.

Invariants, inside a dispatch execution (``$DISPATCH_EXEC_DIR`` set, a folder root):

* A save goes to a folder of the execution's own (``step-<step>``, or ``checkpoint_id`` taken
  relative to the execution's folder; an absolute one must be inside it; a ``storage_writer``
  made for a folder, as ``FileSystemWriter(path)`` is, names that folder, which must be inside
  it too and, with a ``checkpoint_id``, the same), and never into one that holds a save
  already (its ``.metadata`` there): DCP would rewrite its files in place.
* Each save gives exactly one publication, made by DCP's coordinator inside the storage
  writer's ``finish``, after DCP wrote and renamed ``.metadata``: DCP calls ``finish`` only once
  every rank's ``write_data`` has returned, and here each rank's ``write_data`` returns only
  after every file it wrote and its folder are fsynced; the coordinator then fsyncs ``.metadata``
  and the folder, writes the manifest (each file's size), and publishes.  With ``async_save``
  all of that runs in DCP's background persistence, so training goes on and the publication is
  made when persistence has finished on every rank, never before: a job killed while a save
  persists has no publication of it and resumes from the previous one.
* ``load`` resumes from ``$DISPATCH_RESUME_FROM`` (or the latest publication), passing over a
  save whose files are missing or shorter than its manifest says, and, when DCP cannot load
  one (an exception on any rank, which DCP raises on every rank), the previous save of its
  lineage, as the other integrations do.  Every rank must call it (DCP's load is collective).
* A save ``load`` tries changes the caller's state dict only once every rank has read it
  whole (:class:`StagedLoad`): DCP reads each tensor slice into a new tensor in host memory,
  and objects into a copy of the state dict's containers; a ``Stateful`` entry is given its
  values (``load_state_dict``) only then.  A save that fails part-way leaves the state dict
  as it was, so a fresh start or a fallback never keeps a value of it, even under a key the
  fallback's save lacks (a planner with ``allow_partial_load``).  The cost: host memory as
  large as this rank's share of the tensors, until every rank has read its share (no more
  accelerator memory), and one more copy of each into the caller's tensors.  A save read
  whole that the caller's state then refuses (a ``Stateful`` entry's ``load_state_dict``
  raising, as torchtitan's dataloader does on another data-parallel degree, after the
  entries before it took their values) cannot be undone: ``load`` raises
  :class:`PartlyLoaded`, never a fallback or a fresh start over part of that save.  ``load``
  with a ``checkpoint_id`` is DCP's own (a failure raises).

Outside a dispatch execution these are DCP's own functions: ``checkpoint_id`` is then
required by ``save``, and ``load`` without one loads nothing and returns ``None``.

What DCP can reshard: a save made at one world size loads at another when the state dict's
tensors are plain tensors or DTensors (FSDP2, tensor parallel) whose global shapes match; the
ranks then read the slices their new placement needs.  It cannot reshard what it saved as an
opaque object (a non-tensor value, a ``torch.save``-able blob: ``BytesIO``): such an entry
is read whole, and a per-rank object (a dataloader's position keyed by rank) must be keyed so
that the new ranks find theirs.
"""

from __future__ import annotations

import copy
import io
import os
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any, ContextManager, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from .. import _fsio
from ..checkpoint import publish as store
from ..errors import UsageError
from ..execution import saverules, steps
from ..execution.saves import (
    Execution,
    choose_resume,
    lineage_before,
    record_choice,
    why_unloadable,
)
from .sequence import seal_and_publish

FRAMEWORK = "dcp"
METADATA = ".metadata"  # DCP's coordinator writes it last (a temporary name, then a rename)
STEP_FOLDER = "step-{step}"

__all__ = [
    "save",
    "async_save",
    "load",
    "save_folder",
    "METADATA",
    "FRAMEWORK",
    "DurableWriter",
    "StagedLoad",
    "PartlyLoaded",
]


def _execution(env: Optional[Mapping[str, str]] = None) -> Optional[Execution]:
    execution = Execution.current(env)
    if execution is not None and execution.remote:
        from ..checkpoint.stores.schemes import SCHEMES

        remote = " or ".join(row.prefix for row in SCHEMES if row.remote)
        raise UsageError(
            f"checkpoint root {execution.root!r}: the DCP integration publishes "
            f"under a folder root only (not a remote one such as {remote} yet)"
        )
    return execution


def save_folder(
    step: int, checkpoint_id: Any = None, env: Optional[Mapping[str, str]] = None
) -> str:
    """The folder a save of ``step`` goes to inside the current execution: ``checkpoint_id``
    (relative to the execution's folder, or an absolute path inside it), else ``step-<step>``."""
    execution = _execution(env)
    if execution is None:
        raise UsageError("not inside a dispatch execution ($DISPATCH_EXEC_DIR is not set)")
    return _folder(execution, step, checkpoint_id)


def _folder(
    execution: Execution, step: int, checkpoint_id: Any, named: str = "checkpoint_id"
) -> str:
    exec_dir = os.path.abspath(execution.exec_dir)
    if checkpoint_id is None:
        return os.path.join(exec_dir, STEP_FOLDER.format(step=step))
    given = os.fspath(checkpoint_id)
    full = os.path.abspath(os.path.join(exec_dir, given))
    if "://" in str(given) or not full.startswith(exec_dir.rstrip("/") + "/"):
        raise UsageError(
            f"{named} {given!r} is outside the execution's folder "
            f"{exec_dir!r}: give a name inside it (e.g. 'step-{step}'), or none"
        )
    return full


def _aimed_at(storage_writer: Optional[StorageWriter]) -> Optional[str]:
    """The folder a storage writer was made for (DCP's ``FileSystemWriter(path)``, an fsspec
    writer's URL), or None when it names none."""
    aimed = getattr(storage_writer, "path", None)
    if aimed is None:
        aimed = getattr(storage_writer, "checkpoint_id", None)
    return os.fspath(aimed) if isinstance(aimed, (str, os.PathLike)) else None


class DurableWriter(StorageWriter):
    """A storage writer around DCP's own (``FileSystemWriter`` unless one is given) that makes
    each rank's files durable before DCP gathers the ranks' results, and, on the coordinator,
    after DCP's ``finish``, makes ``.metadata`` durable and publishes the save."""

    def __init__(self, inner: StorageWriter, execution: Execution, step: int, folder: str) -> None:
        super().__init__()
        self.inner = inner
        self.execution = execution
        self.step = step
        self.folder = folder
        self.publication: Optional[str] = None
        # time.monotonic() on the coordinator: every rank's results gathered (finish called),
        # .metadata in place (DCP's finish returned), published (bench/bench_dcp.py reads them).
        self.timings: dict[str, float] = {}

    # DCP's logger reads it.
    @property
    def checkpoint_id(self) -> Any:
        return getattr(self.inner, "checkpoint_id", self.folder)

    def reset(self, checkpoint_id: Any = None) -> None:
        self.inner.reset(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.inner.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return self.inner.prepare_local_plan(plan)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return self.inner.prepare_global_plan(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Any:
        written = self.inner.write_data(plan, planner)
        written.wait()
        results: list[WriteResult] = written.value()
        names = {getattr(r.storage_data, "relative_path", None) for r in results}
        for name in sorted(n for n in names if isinstance(n, str)):
            _fsio.fsync_path(os.path.join(self.folder, name), directory=False)
        _fsio.fsync_path(self.folder, directory=True)
        done: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        self.timings["gathered"] = time.monotonic()
        self.inner.finish(metadata, results)
        self.timings["metadata"] = time.monotonic()
        # DCP's writer fsyncs .metadata's bytes before the rename; the rename lives in the folder.
        _fsio.fsync_path(os.path.join(self.folder, METADATA), directory=False)
        _fsio.fsync_path(self.folder, directory=True)
        self.publication = seal_and_publish(
            self.execution, self.folder, self.step, single=False, bests=[]
        )
        self.timings["published"] = time.monotonic()

    def storage_meta(self) -> Any:
        return self.inner.storage_meta()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return torch_dcp.FileSystemWriter.validate_checkpoint_id(checkpoint_id)


def _writer(
    execution: Execution, step: int, checkpoint_id: Any, storage_writer: Optional[StorageWriter]
) -> tuple[str, DurableWriter]:
    folder = _folder(execution, step, checkpoint_id)
    # DCP would reset a writer made for another folder to ours without a word: a writer aimed
    # outside the execution is refused as such a checkpoint_id is, and one aimed inside names
    # the save's folder as checkpoint_id would.
    aimed = _aimed_at(storage_writer)
    if aimed is not None:
        mine = _folder(execution, step, aimed, named="storage_writer's folder")
        if checkpoint_id is None:
            folder = mine
        elif mine != folder:
            raise UsageError(
                f"storage_writer is aimed at {aimed!r} but checkpoint_id "
                f"{os.fspath(checkpoint_id)!r} names {folder!r}: give one of them"
            )
    # A symlink planted as the folder (or above it) would take every rank's shards outside the
    # execution's folder; DCP then failed on our folder fsync with its own traceback.
    real_exec = os.path.realpath(execution.exec_dir).rstrip("/") + "/"
    if os.path.islink(folder) or not os.path.realpath(folder).startswith(real_exec):
        raise UsageError(
            f"save folder {folder!r} is a symlink or under one "
            f"(to {os.path.realpath(folder)!r}): a save is written only in the "
            "execution's own folder; remove the link or give another step"
        )
    # DCP's writer overwrites a folder's files in place: a save made (and maybe published and
    # being loaded) is never rewritten.  A folder without .metadata is a save that never
    # finished: writing it again is fine (nothing published it).
    if os.path.lexists(os.path.join(folder, METADATA)):
        raise UsageError(
            f"{folder!r} holds a save already (its {METADATA} is there): a "
            "save is never rewritten; give each save its own step or "
            "checkpoint_id"
        )
    os.makedirs(folder, exist_ok=True)
    inner = storage_writer if storage_writer is not None else torch_dcp.FileSystemWriter(folder)
    return folder, DurableWriter(inner, execution, step, folder)


def save(
    state_dict: dict[str, Any],
    *,
    step: Optional[int] = None,
    checkpoint_id: Any = None,
    storage_writer: Optional[StorageWriter] = None,
    planner: Optional[SavePlanner] = None,
    process_group: Optional[dist.ProcessGroup] = None,
    no_dist: bool = False,
    env: Optional[Mapping[str, str]] = None,
) -> Metadata:
    """DCP's ``save`` into the execution's folder, published once durable on every rank
    (collective: every rank calls it).  ``step`` is required inside an execution."""
    execution = _execution(env)
    if execution is None:
        return torch_dcp.save(
            state_dict,
            checkpoint_id=checkpoint_id,
            storage_writer=storage_writer,
            planner=planner,
            process_group=process_group,
            no_dist=no_dist,
        )
    folder, writer = _writer(execution, _step(step), checkpoint_id, storage_writer)
    with _save_mark(env, step):  # no stall meanwhile
        return torch_dcp.save(
            state_dict,
            checkpoint_id=folder,
            storage_writer=writer,
            planner=planner,
            process_group=process_group,
            no_dist=no_dist,
        )


def async_save(
    state_dict: dict[str, Any],
    *,
    step: Optional[int] = None,
    checkpoint_id: Any = None,
    storage_writer: Optional[StorageWriter] = None,
    planner: Optional[SavePlanner] = None,
    process_group: Optional[dist.ProcessGroup] = None,
    no_dist: bool = False,
    env: Optional[Mapping[str, str]] = None,
    **options: Any,
) -> Any:
    """DCP's ``async_save`` into the execution's folder: staged now, persisted in the background,
    published there once every rank's part is durable.  Give it a process group of its own
    (gloo) if training runs collectives meanwhile, as DCP asks; ``options``:
    ``async_checkpointer_type``, ``async_stager``."""
    execution = _execution(env)
    if execution is None:
        return torch_dcp.async_save(
            state_dict,
            checkpoint_id=checkpoint_id,
            storage_writer=storage_writer,
            planner=planner,
            process_group=process_group,
            no_dist=no_dist,
            **options,
        )
    folder, writer = _writer(execution, _step(step), checkpoint_id, storage_writer)
    # Marked while staging (training waits for it); the background persistence is not.
    with _save_mark(env, step):
        return torch_dcp.async_save(
            state_dict,
            checkpoint_id=folder,
            storage_writer=writer,
            planner=planner,
            process_group=process_group,
            no_dist=no_dist,
            **options,
        )


def _save_mark(env: Optional[Mapping[str, str]], step: Optional[int]) -> ContextManager[None]:
    """The block as a save in the progress record the stall watcher reads
    (:mod:`..execution.steps`), on rank 0; nothing elsewhere or outside an execution."""
    found = steps.recorder(env) if _records() else None
    return found.saving(step) if found is not None else nullcontext()


def _records() -> bool:
    """Whether this rank records progress: rank 0 (or a process without ranks)."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _step(step: Optional[int]) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UsageError(
            f"step {step!r}: inside a dispatch execution a save needs its "
            "training step (an integer, 0 or more), which names its publication"
        )
    return step


def load(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: Any = None,
    storage_reader: Any = None,
    planner: Any = None,
    process_group: Optional[dist.ProcessGroup] = None,
    no_dist: bool = False,
    env: Optional[Mapping[str, str]] = None,
) -> Optional[str]:
    """Load the save to resume from into ``state_dict`` (in place); returns its folder, or
    ``None`` for a fresh start.  With ``checkpoint_id``, DCP's own load of that one.

    Each save tried is read into a staging copy first (:class:`StagedLoad`) and copied into
    ``state_dict`` only once every rank has read it whole: a save that fails part-way leaves
    ``state_dict`` as it was.  The cost: host memory as large as this rank's share of the
    state dict's tensors, held until every rank has read its share (no more accelerator
    memory), and one more copy of each tensor, into the caller's."""
    execution = _execution(env)
    if checkpoint_id is not None:
        torch_dcp.load(
            state_dict,
            checkpoint_id=checkpoint_id,
            storage_reader=storage_reader,
            planner=planner,
            process_group=process_group,
            no_dist=no_dist,
        )
        return os.fspath(checkpoint_id)
    if execution is None:
        return None

    def attempt(path: str) -> None:
        _staged_load(state_dict, path, storage_reader, planner, process_group, no_dist)

    start = choose_resume(execution, required=(METADATA,), framework=FRAMEWORK).path
    if start is None:
        return None
    why = _loaded(attempt, start)
    if why is None:
        return start
    found = store.list_publications(execution.root)
    tried = start
    for candidate in lineage_before(execution.root, start, found):
        _say(tried, why, candidate)
        why = why_unloadable(candidate, (METADATA,))
        if why is None and not record_choice(execution, candidate, found, f"fallback from {start}"):
            why = "its publication was removed by cleanup while this execution chose it"
        if why is None:
            why = _loaded(attempt, candidate)
        if why is None:
            return candidate
        tried = candidate
    _say(tried, why, None)
    return None


class PartlyLoaded(RuntimeError):
    """A save was read whole and copied into part of the caller's state before the rest
    refused it: the state holds part of that save, so no other save (nor a fresh start) is
    tried over it."""


def _staged_load(
    state_dict: dict[str, Any],
    path: str,
    storage_reader: Any,
    planner: Any,
    process_group: Optional[dist.ProcessGroup],
    no_dist: bool,
) -> None:
    """DCP's load of ``path`` into ``state_dict``, which is changed only once every rank has
    read the save whole.  As DCP's own load, a ``Stateful`` entry is read through its
    ``state_dict()`` and given the result with ``load_state_dict``; here only after that."""
    plain = {
        key: value.state_dict() if isinstance(value, Stateful) else value
        for key, value in state_dict.items()
    }
    staged = StagedLoad(planner if planner is not None else DefaultLoadPlanner())
    torch_dcp.load(
        plain,
        checkpoint_id=path,
        storage_reader=storage_reader,
        planner=staged,
        process_group=process_group,
        no_dist=no_dist,
    )
    # DCP's read step gathers every rank's result and raises on all of them if one failed.
    # From here the caller's tensors change (a Stateful's state_dict() views its parameters):
    # a failure cannot leave them as they were, and must not pass for a save not loaded.
    done: list[str] = []
    try:
        loaded = staged.commit()
        for key, value in state_dict.items():
            if isinstance(value, Stateful):
                value.load_state_dict(loaded[key])
            else:
                state_dict[key] = loaded[key]
            done.append(str(key))
    except Exception as exc:
        given = ", ".join(done) if done else "the tensors"
        raise PartlyLoaded(
            f"{path} was read whole and given to {given} before {_short(exc)}: the state "
            "dict holds part of this save, so neither the previous save nor a fresh start is "
            "tried over it; fix what refused it (a Stateful's load_state_dict) and run again"
        ) from exc


class StagedLoad(LoadPlanner):
    """A load planner around DCP's (or the caller's) that leaves the state dict alone while DCP
    reads: the planner it wraps is set up on a copy of the state dict's containers (objects
    DCP loads whole land there), and each tensor slice is read into a new tensor in host
    memory; :meth:`commit` copies them into the caller's tensors and puts the objects in its
    containers.  Nothing is committed from a load that raised."""

    def __init__(self, inner: LoadPlanner) -> None:
        self.inner = inner
        self.original: Any = None
        self.shadow: Any = None
        self.resolved: dict[int, tuple[ReadItem, torch.Tensor]] = {}
        self.read: list[tuple[ReadItem, torch.Tensor, torch.Tensor]] = []

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Optional[Metadata] = None,
        is_coordinator: bool = False,
    ) -> None:
        self.original, self.shadow = state_dict, _shadow(state_dict)
        self.resolved, self.read = {}, []
        self.inner.set_up_planner(self.shadow, metadata, is_coordinator)

    def create_local_plan(self) -> LoadPlan:
        return self.inner.create_local_plan()

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return self.inner.create_global_plan(global_plan)

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return self.inner.finish_plan(central_plan)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.inner.load_bytes(read_item, value)  # into the shadow's containers

    def resolve_bytes(self, read_item: ReadItem) -> io.BytesIO:
        return self.inner.resolve_bytes(read_item)  # the shadow's own BytesIO

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = self.inner.resolve_tensor(read_item)
        self.resolved[id(read_item)] = (read_item, target)
        return torch.empty(target.size(), dtype=target.dtype, device="cpu")

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        _, target = self.resolved.pop(id(read_item))
        self.read.append((read_item, target, tensor))

    def commit(self) -> Any:
        """Copy what was read into the state dict DCP set this planner up with (once the whole
        load succeeded), and return that state dict."""
        with torch.no_grad():
            for read_item, target, tensor in self.read:
                target.detach().copy_(tensor)
                self.inner.commit_tensor(read_item, target)
        _write_back(self.original, self.shadow)
        self.read, self.shadow = [], None
        return self.original


def _shadow(value: Any) -> Any:
    """A copy of ``value``'s containers (dicts, lists) and BytesIO objects; the tensors and
    other objects in them are the same."""
    if isinstance(value, dict):
        copied = copy.copy(value)
        for key, item in value.items():
            copied[key] = _shadow(item)
        return copied
    if isinstance(value, list):
        return [_shadow(item) for item in value]
    if isinstance(value, io.BytesIO):
        return io.BytesIO(value.getvalue())
    return value


def _write_back(target: Any, shadow: Any) -> None:
    """Put into ``target``'s containers what a load put into its shadow's."""
    keys = list(shadow) if isinstance(shadow, dict) else range(len(shadow))
    for key in keys:
        now = target[key] if isinstance(shadow, list) or key in target else None
        new = shadow[key]
        if new is now:
            continue
        if (
            isinstance(now, (dict, list))
            and type(now) is type(new)
            and (isinstance(now, dict) or len(now) == len(new))
        ):
            _write_back(now, new)
        elif isinstance(now, io.BytesIO) and isinstance(new, io.BytesIO):
            now.seek(0)
            now.truncate()
            now.write(new.getvalue())
            now.seek(0)
        else:
            target[key] = new


def _loaded(attempt: Callable[[str], None], path: str) -> Optional[str]:
    """Load ``path`` (``attempt``); None when loaded, else why not.  A torn save without a
    manifest to say so (published by ``dispatch watch``) is found before DCP reads it."""
    problem = saverules.dcp_problem(path)
    if problem is not None:
        return problem
    try:
        attempt(path)
    except PartlyLoaded:
        raise  # the caller's state holds part of it: nothing else may be loaded over it
    # DCP raises the same CheckpointException (a BaseException) on every rank.
    except (Exception, CheckpointException) as exc:
        return f"DCP could not load it: {_short(exc)}"
    return None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _say(bad: str, why: str, instead: Optional[str]) -> None:
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank == 0:
        sys.stderr.write(
            f"dispatch: not resuming from {bad}: {why}; trying the previous save "
            f"of its lineage ({instead or 'none left: a fresh start'})\n"
        )
        sys.stderr.flush()
