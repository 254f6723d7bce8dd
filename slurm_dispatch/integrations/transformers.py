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
* Each save gives exactly one publication, made by the world's main process after every rank
  has synced its part of the save to disk and passed a barrier.  The main process seals the save
  (its manifest, and with a single rank the sync of every file and folder) and publishes it in
  the background (:mod:`..execution.background`) while training goes on: at most one save
  pending, the next save's publication waits for it, and ``on_train_end`` and a requeue at the
  signal wait for it too.  A process killed while a save is pending leaves it whole and
  unpublished, which cleanup keeps.
* ``resume_from_checkpoint()`` returns the save to resume from: ``$DISPATCH_RESUME_FROM``, or
  the previous save of its lineage when that one cannot be loaded (see ``saves``).
* The warning signal (the job's ``--warn-before TIME[:SIGNAL]``, SIGUSR1 unless it names
  another) only sets a flag.  At the end of the next optimizer step (``on_step_end``, every
  rank agreeing that any rank got it) the callback asks the Trainer to save and stop
  (``control.should_save``, ``control.should_training_stop``): the Trainer saves as at any
  ``save_steps``, the save is published as every save is, and then the job is requeued
  (``scontrol requeue``), by the rules the Lightning callback follows (:mod:`.requeue`): a
  ``--shared-checkpoint`` job, or one whose record cannot be read, is never requeued, and a
  job stopped at the signal and not requeued ends with :class:`NotRequeued` raised from
  ``train()`` (FAILED, never COMPLETED), once its save is published.

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

from ..errors import NotRequeued, UsageError
from ..execution.background import Publisher
from ..execution.saves import (
    Execution,
    choose_resume,
    publish_save,
    record_keep,
    relative_saves,
    seal_save,
    sync_save,
)
from .requeue import SignalFlag, is_shared_checkpoint, requeue, warning_signal

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
        from ..execution import s3saves

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

    def __init__(self, env: Optional[Mapping[str, str]] = None,
                 requeue_command: Optional[list[str]] = None,
                 requeue_signal: Optional[int] = None) -> None:
        self.execution = Execution.current(env)
        self.publications: list[str] = []
        self.user_output_dir: Optional[str] = None
        self.user_save_total_limit: Optional[int] = None
        self.requeued = False
        self._uploader: Any = None  # on an s3:// root: the staging folder's uploader
        self._requeue_command = requeue_command
        self._requeue_signal = requeue_signal  # None: the job's --warn-before signal
        self._signal = SignalFlag()
        self._stopping = False  # a save was asked for at the signal; requeue after it
        self._not_requeued: Optional[str] = None
        self._publisher = Publisher()  # seals and publishes each save off the training thread

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
            from ..execution import s3saves

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
        # The handler goes in as early as the Trainer exists: a signal before it would end
        # the process (the default action) without a save.
        self._signal.take(self._requeue_signal or warning_signal(self.execution))

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
                from ..execution import s3saves

                best = state.best_model_checkpoint
                bests = relative_saves(self.execution, [self._uploader.url_of(best)]) \
                    if best else []
                self.publications.append(s3saves.publish_local_save(
                    self.execution, self._uploader, state.global_step, save, bests))
            else:
                bests, step = self._bests(state), state.global_step
                self._publisher.submit(lambda: self._seal_and_publish(save, single, bests, step))
        if self._stopping:
            self._publisher.wait()  # requeued only once the save made at the signal is published
            self._requeue_after(args, state, save)

    def _seal_and_publish(self, save: str, single: bool, bests: list[str], step: int) -> None:
        """On the publisher's thread: make the save durable, then publish it."""
        assert self.execution is not None
        seal_save(save, single_writer=single, bests=bests)
        self.publications.append(publish_save(self.execution, step, save))

    # --- the requeue signal -----------------------------------------------------------------

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.execution is None or self._stopping:
            return
        # Every rank must take part in the save, so the ranks agree on "any rank signalled".
        if not _any_rank(self._signal.raised, args):
            return
        self._signal.raised = False
        self._stopping = True
        control.should_save = True  # the Trainer's own save, then on_save publishes it
        control.should_training_stop = True

    def _requeue_after(self, args: TrainingArguments, state: TrainerState, save: str) -> None:
        """The save made at the signal is published (on every rank's side of the barrier):
        requeue the job from the main process; every rank learns the outcome."""
        assert self.execution is not None
        self._stopping = False
        published = self._uploader.url_of(save) if self._uploader is not None else save
        why = None
        if state.is_world_process_zero:
            why = requeue(published, is_shared_checkpoint(self.execution),
                          self._requeue_command)
        why = _from_rank_zero(why, args)
        self.requeued = why is None
        self._not_requeued = why

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        try:
            self._publisher.wait()  # the last save's publication, before train() returns
        finally:
            self._signal.hand_back()
        if self._not_requeued is not None:
            # train() returning would end the job COMPLETED, where the supervisor stops.
            why, self._not_requeued = self._not_requeued, None
            raise NotRequeued(why)


def _distributed(args: TrainingArguments) -> Any:
    """torch.distributed when this run has several ranks, else None."""
    if args.world_size <= 1:
        return None
    import torch.distributed as dist  # only reached with a distributed run

    return dist if dist.is_available() and dist.is_initialized() else None


def _any_rank(flag: bool, args: TrainingArguments) -> bool:
    dist = _distributed(args)
    if dist is None:
        return flag
    import torch

    value = torch.tensor([1 if flag else 0], device=args.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _from_rank_zero(value: Optional[str], args: TrainingArguments) -> Optional[str]:
    dist = _distributed(args)
    if dist is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
