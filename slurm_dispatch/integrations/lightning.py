"""Lightning's ``Trainer`` inside a dispatch execution: one callback and one resume helper.

A training script adds two things and keeps its own ``ModelCheckpoint`` and arguments::

    from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(...), DispatchCallback()])
    trainer.fit(model, data, ckpt_path=resume_from_checkpoint())

Invariants, inside a dispatch execution (``$DISPATCH_EXEC_DIR`` set):

* Every ``ModelCheckpoint`` writes into the execution's own folder (``checkpoints/``) and
  deletes nothing (``save_top_k`` is recorded for dispatch's cleanup, then set to keep every save).
* Each save made through ``Trainer.save_checkpoint`` inside that folder gives exactly one
  publication, by the global-zero process after every rank synced its part and the strategy's
  barrier passed.  Global zero seals the save (its manifest, and with a single rank the sync of
  every file and folder) and publishes it in the background
  (:mod:`..execution.background`) while training goes on: at most one save pending, the next
  save's publication waits for it, and the requeue at the signal and ``teardown`` wait for it.
  A process killed while a save is pending leaves it whole and unpublished, which cleanup
  keeps.  A ``last`` checkpoint, which Lightning rewrites in place, is never published.
* The requeue signal (SIGUSR1 unless the ``SLURMEnvironment`` names another) only sets a flag:
  Lightning's own handler, which saves inside the handler and requeues, is not installed.  At the
  end of the next training batch every rank saves, the save is published, and the job is
  requeued (``scontrol requeue``) and stopped.  A ``--shared-checkpoint`` job (or one whose
  record cannot be read) saves and publishes but is never requeued: such a job restarts only
  after a proof or a person (docs/invariants.md, 6).
* A job that stopped at the signal and was not requeued (a shared checkpoint, or a requeue
  Slurm refused: ``--no-requeue``, ``JobRequeue=0``) never ends as if it had finished: once its
  save is published and the loop has stopped, ``fit`` raises :class:`NotRequeued` on every
  rank, so the job ends FAILED and dispatch's rule for a failed job applies (a resubmission
  while the budget lasts; a hold for a shared checkpoint), never COMPLETED, where the
  supervisor stops for good.
* A stop at ``max_time`` (Lightning's ``Timer``) before ``max_steps`` or ``max_epochs`` is the
  end of the run's time budget, counted across executions (each save carries the Timer's
  elapsed time, and a run resumed from it stops at once): it is not requeued, and the job ends
  COMPLETED as Lightning means it.  But it is never quiet, and what was trained since the last
  save is not lost: every rank saves ``max_time-step=<N>.ckpt`` (unless a save of that step
  was just made), it is published, and global zero says what happened and how to stop before
  Slurm's limit and go on instead (the warning signal) or train on (``--supersede`` with a
  larger ``max_time``).
* A process that Lightning stops at SIGTERM never exits 0 (Lightning raises ``SystemExit``
  with no code, and ``--signal=TERM@`` sends TERM before the limit: the job would end
  COMPLETED, its training unfinished): the callback makes the exit 128+15 and says so, so
  the job ends FAILED and the resubmit rule applies.

On a remote root (``s3://``, ``az://``) Lightning writes its saves under the execution's
prefix itself (fsspec, which needs s3fs or adlfs: the ``lightning-s3`` and ``lightning-azure``
extras); each is published once its manifest object is written, and
``resume_from_checkpoint()`` gives the URL, checked on the store (:mod:`..execution.staging`).

Outside a dispatch execution the callback does nothing (Lightning's own SLURM support stays as
it was) and ``resume_from_checkpoint(default)`` returns ``default``.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..execution import staging
from ..execution.saves import Execution, publish_save, relative_saves
from .requeue import is_shared_checkpoint
from .sequence import Sequence, resume_path

FRAMEWORK = "lightning"
REQUEUE_SAVE = "requeue-step={step}.ckpt"
MAX_TIME_SAVE = "max_time-step={step}.ckpt"  # the state at a stop at max_time
CHECKPOINTS = "checkpoints"  # under the execution's folder
TERMED_CODE = 128 + signal.SIGTERM  # the exit of a process stopped at SIGTERM, as a shell says


def resume_from_checkpoint(
    default: Optional[str] = None, env: Optional[Mapping[str, str]] = None
) -> Optional[str]:
    """What to pass to ``Trainer.fit(ckpt_path=...)``.

    Inside a dispatch execution: the save to resume from, or ``None`` for a fresh start.
    Outside one: ``default`` (what the script passed before, e.g. ``"last"`` or a path).
    """
    execution = Execution.current(env)
    if execution is None:
        return default
    # Lightning loads s3:// itself (fsspec): on S3 the URL, checked there.
    return resume_path(execution, FRAMEWORK)


def _last_pattern(callback: ModelCheckpoint) -> re.Pattern[str]:
    """File names the callback's ``last`` save takes (``last.ckpt``, ``last-v1.ckpt``, or a
    formatted name such as ``{epoch}-last``)."""
    parts = re.split(r"\{[^}]*\}", callback.CHECKPOINT_NAME_LAST)
    body = ".*".join(re.escape(p) for p in parts)
    return re.compile(
        f"(?:.*{re.escape(callback.CHECKPOINT_JOIN_CHAR)})?{body}"
        rf"(?:-v[0-9]+)?{re.escape(callback.FILE_EXTENSION)}"
    )


class DispatchCallback(Callback):  # type: ignore[misc]
    """Publishes each save of a Lightning ``Trainer``, turns its rotation and its own SLURM
    requeue off inside a dispatch execution, and answers the requeue signal at a safe point.

    ``publications`` lists the names this process published (global zero only).
    """

    def __init__(
        self, env: Optional[Mapping[str, str]] = None, requeue_command: Optional[list[str]] = None
    ) -> None:
        self.execution = Execution.current(env)
        self._sequence = Sequence(self.execution, env, requeue_command)
        self.publications = self._sequence.publications
        self._signal = self._sequence.signal  # the requeue signal, taken as a flag
        self._last_names: list[re.Pattern[str]] = []
        self._published_paths: set[str] = set()
        self._shared: Optional[bool] = None
        self._tops: dict[int, int] = {}  # each ModelCheckpoint's own save_top_k
        self._publisher = self._sequence.publisher
        self._progress = self._sequence.progress

    @property
    def requeued(self) -> bool:
        """The job was requeued at the signal."""
        return self._sequence.requeued

    # --- set-up and tear-down ---------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.execution is None or stage != "fit":
            return
        # A folder of their own: Lightning warns about a non-empty one, and the execution's
        # folder holds dispatch's records.
        ckpt_dir = os.path.join(self.execution.exec_dir, CHECKPOINTS)  # s3://... on S3
        checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        tops = [c.save_top_k for c in checkpoints]
        if any(top != -1 for top in tops):
            # One record for all of them: the largest limit, none when one keeps every save
            # (each one's bests go into every manifest and stay: _bests).
            every = -1 in tops
            limit = None if every else max(tops)
            self._sequence.keep(FRAMEWORK, "save_top_k", limit if limit else None, every)
        for callback in checkpoints:
            self._tops[id(callback)] = callback.save_top_k
            callback.save_top_k = -1
            callback.dirpath = ckpt_dir
            self._last_names.append(_last_pattern(callback))
        self._shared = is_shared_checkpoint(self.execution)
        self._take_requeue_signal(trainer)
        self._wrap_save(trainer)

    def _take_requeue_signal(self, trainer: pl.Trainer) -> None:
        # Lightning installs its SIGUSR1 handler (save inside the handler, then requeue) only
        # where none is installed and auto_requeue is on; both are made so here.
        cluster = getattr(trainer._accelerator_connector, "cluster_environment", None)
        signum = signal.SIGUSR1
        if isinstance(cluster, SLURMEnvironment):
            cluster.auto_requeue = False
            signum = cluster.requeue_signal or signal.SIGUSR1
        # Nothing else happens inside the handler: the save waits for a safe point of the loop.
        self._signal.take(int(signum))

    def _wrap_save(self, trainer: pl.Trainer) -> None:
        original = trainer.save_checkpoint

        def save_and_publish(
            filepath: Any,
            weights_only: Optional[bool] = None,
            storage_options: Optional[Any] = None,
        ) -> None:
            progress = self._progress if trainer.is_global_zero else None
            if progress is not None:
                progress.save_began(trainer.global_step)  # a save's time is no stall
            try:
                original(filepath, weights_only, storage_options)
                # Its publication's part in this thread too (the wait for the last one's
                # seal, every rank's sync, an S3 seal): a busy file system's slow save.
                self._publish(trainer, os.fspath(filepath))
            finally:
                if progress is not None:
                    progress.save_ended(trainer.global_step)

        # Every save goes through Trainer.save_checkpoint, which ends with the strategy's
        # barrier: after it, every rank's part is written.  Lightning's Callback API has no
        # hook after a save, so the instance's method is wrapped (undone in teardown).
        trainer.save_checkpoint = save_and_publish  # type: ignore[method-assign]

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.execution is None or stage != "fit":
            return
        trainer.__dict__.pop("save_checkpoint", None)
        self._sequence.finish()  # the last save's publication, before fit returns

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if (
            self.execution is None
            or not isinstance(exception, SIGTERMException)
            or exception.code not in (None, 0)
        ):
            return
        # Lightning re-raises this very exception once the hooks have run: its code is the
        # process's exit status.
        exception.code = TERMED_CODE
        sys.stderr.write(
            f"dispatch: the trainer stopped at SIGTERM with status 0: its work is "
            f"not done, so the process exits {TERMED_CODE} (a failure: the job's "
            "resubmit rule applies, its next execution resumes from the newest "
            "published save)\n"
        )
        sys.stderr.flush()

    # --- publication ----------------------------------------------------------------------

    def _publish(self, trainer: pl.Trainer, path: str) -> None:
        assert self.execution is not None
        remote = self.execution.remote
        # On S3 the save is an s3:// URL Lightning wrote through fsspec; no local path.
        absolute = path.rstrip("/") if remote else os.path.abspath(path)
        exec_dir = self.execution.exec_dir if remote else os.path.abspath(self.execution.exec_dir)
        inside = absolute.startswith(exec_dir.rstrip("/") + "/")
        name = absolute.rsplit("/", 1)[-1]
        if (
            not inside
            or absolute in self._published_paths
            or any(p.fullmatch(name) for p in self._last_names)
        ):
            return  # not ours to publish, or a name Lightning rewrites in place
        if remote:
            if trainer.world_size > 1:  # every rank's part is written once all are here
                trainer.strategy.barrier("dispatch.publish")
            self._published_paths.add(absolute)
            self._saved = (trainer.global_step, absolute)
            if trainer.is_global_zero:
                staging.of(absolute).seal_remote_save(
                    absolute, relative_saves(self.execution, self._bests(trainer))
                )
                self.publications.append(
                    publish_save(self.execution, trainer.global_step, absolute)
                )
            return
        execution = self.execution
        self._sequence.publish(
            absolute,
            trainer.global_step,
            ranks=trainer.world_size,
            main=trainer.is_global_zero,
            barrier=lambda: trainer.strategy.barrier("dispatch.publish"),
            bests=lambda: relative_saves(execution, self._bests(trainer)),
        )
        self._published_paths.add(absolute)
        self._saved = (trainer.global_step, absolute)

    def _bests(self, trainer: pl.Trainer) -> list[str]:
        """The saves Lightning keeps as its best now: each monitoring ModelCheckpoint's top k
        by its mode (it ranks every save it made, its own rotation being off) and its
        ``best_model_path``."""
        found: list[str] = []
        for callback in trainer.checkpoint_callbacks:
            top = self._tops.get(id(callback), 0)
            if not isinstance(callback, ModelCheckpoint) or not callback.monitor:
                continue
            if top > 0:
                ranked = sorted(
                    (
                        (float(v), os.fspath(p))
                        for p, v in callback.best_k_models.items()
                        if float(v) == float(v)
                    ),
                    reverse=callback.mode == "max",
                )
                found.extend(path for _value, path in ranked[:top])
            if callback.best_model_path:
                found.append(os.fspath(callback.best_model_path))
        return found

    # --- a stop at max_time -----------------------------------------------------------------

    _saved: Optional[tuple[int, str]] = None  # (step, path) of the last save published

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._progress is not None and trainer.is_global_zero:
            # What the script does after fit() (trainer.test(), an export) is no stall.
            self._progress.ended(trainer.global_step)
        if self.execution is None or self._stopped:
            return
        timer = next((c for c in getattr(trainer, "callbacks", ()) if isinstance(c, Timer)), None)
        remaining = timer.time_remaining() if timer is not None else None
        # The Timer's duration: what has passed plus what remains (negative after the stop).
        budget = (
            timedelta(seconds=round(timer.time_elapsed() + remaining))
            if timer is not None and remaining is not None
            else None
        )
        # Each rank's Timer reads its own clock: the ranks take global zero's answer.
        spent = trainer.strategy.broadcast(remaining is not None and remaining <= 0, src=0)
        if not spent or _limit_reached(trainer):
            return
        step = trainer.global_step
        if self._saved is not None and self._saved[0] == step:
            path = self._saved[1]
        else:
            path = os.path.join(
                self.execution.exec_dir, CHECKPOINTS, MAX_TIME_SAVE.format(step=step)
            )
            trainer.save_checkpoint(path)
        if not trainer.is_global_zero:
            return
        self._publisher.wait()  # published before it is said
        sys.stderr.write(
            f"dispatch: training stopped at max_time (Lightning's Timer, {budget} of training "
            f"counted across executions) at step {step}, before max_steps or max_epochs: its "
            f"state is saved and published ({path}).  The job ends done (COMPLETED) and is "
            "not resubmitted: every save carries the Timer's time, so a next execution would "
            "stop at once.  To stop before Slurm's time limit and go on in a new execution, "
            "leave max_time out and submit with --warn-before (or #SBATCH --signal=USR1@90): "
            "the callback saves, publishes and requeues at the signal; to train longer, "
            "submit again with a larger max_time (dispatch-sbatch --supersede), which resumes "
            "from this save\n"
        )
        sys.stderr.flush()

    # --- the requeue signal -----------------------------------------------------------------

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._progress is not None and trainer.is_global_zero and not trainer.sanity_checking:
            self._progress.save_began(trainer.global_step, "evaluation")  # no stall either

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._progress is not None and trainer.is_global_zero and not trainer.sanity_checking:
            self._progress.save_ended(trainer.global_step)

    _stopped = False  # the loop was stopped at the requeue signal

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._progress is not None and trainer.is_global_zero:
            self._progress.step(trainer.global_step)
        if self.execution is None or self._stopped:
            return
        # Every rank must take part in the save, so the ranks agree on "any rank signalled".
        if not trainer.strategy.reduce_boolean_decision(self._signal.raised, all=False):
            return
        self._signal.raised = False
        path = os.path.join(
            self.execution.exec_dir, CHECKPOINTS, REQUEUE_SAVE.format(step=trainer.global_step)
        )
        trainer.save_checkpoint(path)
        self._stopped = True
        # Requeued only once this save is published; every rank ends the same way: all with
        # NotRequeued (raised at teardown), or all requeued.
        self._sequence.requeue_at_signal(
            path,
            lambda: self._shared,
            trainer.is_global_zero,
            lambda why: trainer.strategy.broadcast(why, src=0),
        )
        trainer.should_stop = True


def _limit_reached(trainer: pl.Trainer) -> bool:
    """The fit reached ``max_steps`` or ``max_epochs`` (-1 or None: no limit)."""
    loop = trainer.fit_loop
    steps, epochs = loop.max_steps, loop.max_epochs
    return (steps not in (None, -1) and trainer.global_step >= steps) or (
        epochs not in (None, -1) and trainer.current_epoch >= epochs
    )
