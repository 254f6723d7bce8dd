"""Hugging Face ``Trainer`` inside a dispatch execution: one callback and one resume helper.

A training script adds two things and keeps its own arguments::

    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    trainer = Trainer(model=model, args=args, ..., callbacks=[DispatchCallback()])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())

Invariants, inside a dispatch execution (``$DISPATCH_EXEC_DIR`` set):

* Saves go to the execution's own folder (``args.output_dir`` becomes ``$DISPATCH_EXEC_DIR``),
  so another execution's saves are never seen, resumed from, or rotated away.
* ``save_total_limit`` deletes nothing: it is recorded for dispatch's cleanup and turned off,
  because the Trainer's rotation sees one folder while a replacement may be loading from it.
* Each save gives exactly one publication, made in ``on_save`` by the world's main process after
  every rank has synced its part of the save to disk and passed a barrier.
* ``resume_from_checkpoint()`` returns the save to resume from: ``$DISPATCH_RESUME_FROM``, or
  the previous save of its lineage when that one cannot be loaded (see ``saves``).

On an ``s3://`` root the Trainer's saves go to the local staging folder (``$DISPATCH_STAGE_DIR``);
each is uploaded under the execution's prefix, then published, and the resume source is a local
copy of the S3 save (:mod:`.s3saves`).  Its ranks must then share one node.

Outside a dispatch execution the callback does nothing and ``resume_from_checkpoint(default)``
returns ``default``: the same script runs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..errors import UsageError
from .saves import (
    Execution,
    choose_resume,
    publish_save,
    record_keep,
    relative_saves,
    seal_save,
    sync_save,
)

TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last into a checkpoint folder
CHECKPOINT_PREFIX = "checkpoint"
FRAMEWORK = "transformers"


def resume_from_checkpoint(default: Union[str, bool, None] = None,
                           env: Optional[Mapping[str, str]] = None) -> Union[str, bool, None]:
    """What to pass to ``Trainer.train(resume_from_checkpoint=...)``.

    Inside a dispatch execution: the save to resume from, or ``None`` for a fresh start.
    Outside one: ``default`` (what the script passed before, e.g. ``True`` or a path).
    """
    execution = Execution.current(env)
    if execution is None:
        return default
    if execution.on_s3:  # the Trainer loads from local disk: a local copy of the S3 save
        from . import s3saves

        return s3saves.choose_resume(execution, required=(TRAINER_STATE,), framework=FRAMEWORK,
                                     fetch=True).path
    return choose_resume(execution, required=(TRAINER_STATE,), framework=FRAMEWORK).path


def _barrier(args: TrainingArguments) -> None:
    """Wait for every rank: the Trainer's own (accelerate's) where it has one."""
    state = getattr(args, "distributed_state", None)
    if state is not None and getattr(state, "num_processes", 1) > 1:
        state.wait_for_everyone()
        return
    import torch.distributed as dist  # only reached with a distributed run

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class DispatchCallback(TrainerCallback):  # type: ignore[misc]
    """Publishes each save of a ``Trainer`` and keeps its rotation from deleting any save.

    ``publications`` lists the names this process published (the main process only).
    """

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        self.execution = Execution.current(env)
        self.publications: list[str] = []
        self.user_output_dir: Optional[str] = None
        self.user_save_total_limit: Optional[int] = None
        self._uploader: Any = None  # on an s3:// root: the staging folder's uploader

    def on_init_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.execution is None:
            return
        self.user_output_dir = args.output_dir
        args.output_dir = self.execution.exec_dir
        self.user_save_total_limit = args.save_total_limit
        keep = record_keep
        if self.execution.on_s3:
            # The Trainer writes local disk only: its saves go to the staging folder, each is
            # uploaded under the execution's prefix, then published.  That folder is the
            # node's own, so every rank must be on one node.
            from . import s3saves

            ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size))
            if args.world_size > ranks_here:
                raise UsageError(
                    f"an s3:// root with {args.world_size} ranks over several nodes: the "
                    "staging folder is each node's own, so a save would be split across "
                    "nodes; run on one node, or use a folder root on a shared file system")
            self._uploader = s3saves.uploader(self.execution)
            args.output_dir = self.execution.stage_dir
            keep = s3saves.record_keep
        if args.save_total_limit is not None and args.save_total_limit > 0:
            # The Trainer's rotation keeps its best_model_checkpoint too: each manifest names
            # it, and cleanup keeps it while this execution's lineage is live.
            keep(self.execution, FRAMEWORK, "save_total_limit", args.save_total_limit)
        args.save_total_limit = None

    def _bests(self, state: TrainerState) -> list[str]:
        """The Trainer's best model (``metric_for_best_model``), which its own rotation keeps."""
        assert self.execution is not None
        best = state.best_model_checkpoint
        return relative_saves(self.execution, [best]) if best else []

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self.execution is None:
            return
        save = os.path.join(args.output_dir or self.execution.exec_dir,
                            f"{CHECKPOINT_PREFIX}-{state.global_step}")
        single = args.world_size <= 1
        if not single:
            if os.path.isdir(save):  # each rank syncs what it wrote (none on a node apart)
                sync_save(save)
            _barrier(args)
        if state.is_world_process_zero:
            if self._uploader is not None:
                from . import s3saves

                best = state.best_model_checkpoint
                bests = relative_saves(self.execution, [self._uploader.url_of(best)]) \
                    if best else []
                self.publications.append(s3saves.publish_local_save(
                    self.execution, self._uploader, state.global_step, save, bests))
                return
            seal_save(save, single_writer=single, bests=self._bests(state))
            self.publications.append(publish_save(self.execution, state.global_step, save))
