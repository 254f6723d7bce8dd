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
copy of the S3 save (:mod:`..execution.staging`).  Its ranks must then share one node.

Outside a dispatch execution the callback does nothing and ``resume_from_checkpoint(default)``
returns ``default``: the same script runs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..checkpoint.stores.schemes import label_of
from ..errors import UsageError
from ..execution import staging
from ..execution.saves import Execution, relative_saves, sync_save
from .requeue import is_shared_checkpoint, warning_signal
from .sequence import Sequence, resume_path

TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last into a checkpoint folder
CHECKPOINT_PREFIX = "checkpoint"
FRAMEWORK = "transformers"


def resume_from_checkpoint(
    default: Union[str, bool, None] = None, env: Optional[Mapping[str, str]] = None
) -> Union[str, bool, None]:
    """What to pass to ``Trainer.train(resume_from_checkpoint=...)``.

    Inside a dispatch execution: the save to resume from, or ``None`` for a fresh start.
    Outside one: ``default`` (what the script passed before, e.g. ``True`` or a path).
    """
    execution = Execution.current(env)
    if execution is None:
        return default
    # The Trainer loads from local disk: on S3, a local copy of the save.
    return resume_path(execution, FRAMEWORK, required=(TRAINER_STATE,), fetch=True)


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

    def __init__(
        self,
        env: Optional[Mapping[str, str]] = None,
        requeue_command: Optional[list[str]] = None,
        requeue_signal: Optional[int] = None,
    ) -> None:
        self.execution = Execution.current(env)
        self._sequence = Sequence(self.execution, env, requeue_command)
        self.publications = self._sequence.publications
        self.user_output_dir: Optional[str] = None
        self.user_save_total_limit: Optional[int] = None
        self._uploader: Any = None  # on an s3:// root: the staging folder's uploader
        self._requeue_signal = requeue_signal  # None: the job's --warn-before signal
        self._signal = self._sequence.signal
        self._stopping = False  # a save was asked for at the signal; requeue after it
        self._publisher = self._sequence.publisher
        self._progress = self._sequence.progress
        self._paused = False  # a save or evaluation is marked in the record

    @property
    def requeued(self) -> bool:
        """The job was requeued at the signal."""
        return self._sequence.requeued

    def on_init_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.execution is None:
            return
        self.user_output_dir = args.output_dir
        args.output_dir = self.execution.exec_dir
        self.user_save_total_limit = args.save_total_limit
        if self.execution.remote:
            # The Trainer writes local disk only: its saves go to the staging folder, each is
            # uploaded under the execution's prefix, then published.  That folder is the
            # node's own, so every rank must be on one node.
            ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", args.world_size))
            if args.world_size > ranks_here:
                raise UsageError(
                    f"a root on {label_of(self.execution.root)} with {args.world_size} ranks "
                    "over several nodes: the staging folder is each node's own, so a save "
                    "would be split across nodes; run on one node, or use a folder root on a "
                    "shared file system"
                )
            self._uploader = staging.of(self.execution.root).uploader(self.execution)
            args.output_dir = self.execution.stage_dir
        if args.save_total_limit is not None and args.save_total_limit > 0:
            # The Trainer's rotation keeps its best_model_checkpoint too: each manifest names
            # it, and cleanup keeps it while this execution's lineage is live.
            self._sequence.keep(FRAMEWORK, "save_total_limit", args.save_total_limit)
        args.save_total_limit = None
        # The handler goes in as early as the Trainer exists: a signal before it would end
        # the process (the default action) without a save.
        self._signal.take(self._requeue_signal or warning_signal(self.execution))

    def _bests(self, state: TrainerState) -> list[str]:
        """The Trainer's best model (``metric_for_best_model``), which its own rotation keeps."""
        assert self.execution is not None
        best = state.best_model_checkpoint
        return relative_saves(self.execution, [best]) if best else []

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.execution is None:
            return
        save = os.path.join(
            args.output_dir or self.execution.exec_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}"
        )
        if self._uploader is not None:
            self._upload(args, state, save)
        else:
            self._sequence.publish(
                save,
                state.global_step,
                ranks=args.world_size,
                main=state.is_world_process_zero,
                barrier=lambda: _barrier(args),
                bests=lambda: self._bests(state),
            )
        self._resume(state)
        if self._stopping:
            self._requeue_after(args, state, save)

    def _upload(self, args: TrainingArguments, state: TrainerState, save: str) -> None:
        """On an s3:// root: the save in the staging folder, uploaded and published."""
        assert self.execution is not None
        if args.world_size > 1:
            if os.path.isdir(save):  # each rank syncs what it wrote (none on a node apart)
                sync_save(save)
            _barrier(args)
        if state.is_world_process_zero:
            best = state.best_model_checkpoint
            bests = relative_saves(self.execution, [self._uploader.url_of(best)]) if best else []
            self.publications.append(
                staging.of(self.execution.root).publish_local_save(
                    self.execution, self._uploader, state.global_step, save, bests
                )
            )

    # --- the requeue signal -----------------------------------------------------------------

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._answer_signal(args, control)
        progress = self._progress
        if progress is not None and state.is_world_process_zero:
            progress.step(state.global_step)
            # The Trainer evaluates and saves right after this hook (DefaultFlowCallback,
            # first of the callbacks, has decided): that time is no stall.
            if control.should_save or control.should_evaluate:
                self._pause(state, control)

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # A micro-batch of gradient accumulation (the last one ends the step): progress too.
        if self._progress is not None and state.is_world_process_zero:
            self._progress.step(state.global_step)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        progress = self._progress
        # save_strategy/eval_strategy "epoch": decided here, made right after.
        if (
            progress is not None
            and state.is_world_process_zero
            and (control.should_save or control.should_evaluate)
        ):
            self._pause(state, control)

    def _pause(self, state: TrainerState, control: TrainerControl) -> None:
        """The save or evaluation the Trainer decided is marked, once until it ends."""
        if self._progress is not None and not self._paused:
            self._paused = True
            self._progress.save_began(
                state.global_step, "save" if control.should_save else "evaluation"
            )

    def _resume(self, state: TrainerState) -> None:
        if self._progress is not None and self._paused:
            self._paused = False
            self._progress.save_ended(state.global_step)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not control.should_save:
            self._resume(state)  # no save follows the evaluation

    def _answer_signal(self, args: TrainingArguments, control: TrainerControl) -> None:
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
        execution = self.execution
        assert execution is not None
        self._stopping = False
        published = self._uploader.url_of(save) if self._uploader is not None else save
        self._sequence.requeue_at_signal(
            published,
            lambda: is_shared_checkpoint(execution),
            state.is_world_process_zero,
            lambda why: _from_rank_zero(why, args),
        )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._progress is not None and state.is_world_process_zero:
            # What the script does after train() (evaluate, save_model, an export) is no stall.
            self._progress.ended(state.global_step)
        self._sequence.finish()  # the last save's publication, before train() returns


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
