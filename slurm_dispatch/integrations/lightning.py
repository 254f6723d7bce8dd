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
  after a proof or a person (DESIGN invariant 6).
* A job that stopped at the signal and was not requeued (a shared checkpoint, or a requeue
  Slurm refused: ``--no-requeue``, ``JobRequeue=0``) never ends as if it had finished: once its
  save is published and the loop has stopped, ``fit`` raises :class:`NotRequeued` on every
  rank, so the job ends FAILED and dispatch's rule for a failed job applies (a resubmission
  while the budget lasts; a hold for a shared checkpoint), never COMPLETED, where the
  supervisor stops for good.
* A process that Lightning stops at SIGTERM never exits 0 (Lightning raises ``SystemExit``
  with no code, and ``--signal=TERM@`` sends TERM before the limit: the job would end
  COMPLETED, its training unfinished): the callback makes the exit 128+15 and says so, so
  the job ends FAILED and the resubmit rule applies.

On an ``s3://`` root Lightning writes its saves under the execution's prefix itself (fsspec,
which needs s3fs); each is published once its manifest object is written, and
``resume_from_checkpoint()`` gives the URL, checked on S3 (:mod:`.s3saves`).

Outside a dispatch execution the callback does nothing (Lightning's own SLURM support stays as
it was) and ``resume_from_checkpoint(default)`` returns ``default``.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from typing import Any, Optional

import lightning.pytorch as pl
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..errors import NotRequeued
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
from .requeue import SignalFlag, is_shared_checkpoint, requeue

FRAMEWORK = "lightning"
REQUEUE_SAVE = "requeue-step={step}.ckpt"
CHECKPOINTS = "checkpoints"  # under the execution's folder
TERMED_CODE = 128 + signal.SIGTERM  # the exit of a process stopped at SIGTERM, as a shell says


def resume_from_checkpoint(default: Optional[str] = None,
                           env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """What to pass to ``Trainer.fit(ckpt_path=...)``.

    Inside a dispatch execution: the save to resume from, or ``None`` for a fresh start.
    Outside one: ``default`` (what the script passed before, e.g. ``"last"`` or a path).
    """
    execution = Execution.current(env)
    if execution is None:
        return default
    if execution.on_s3:  # Lightning loads s3:// itself (fsspec): the URL, checked on S3
        from ..execution import s3saves

        return s3saves.choose_resume(execution, framework=FRAMEWORK).path
    return choose_resume(execution, framework=FRAMEWORK).path


def _last_pattern(callback: ModelCheckpoint) -> re.Pattern[str]:
    """File names the callback's ``last`` save takes (``last.ckpt``, ``last-v1.ckpt``, or a
    formatted name such as ``{epoch}-last``)."""
    parts = re.split(r"\{[^}]*\}", callback.CHECKPOINT_NAME_LAST)
    body = ".*".join(re.escape(p) for p in parts)
    return re.compile(f"(?:.*{re.escape(callback.CHECKPOINT_JOIN_CHAR)})?{body}"
                      rf"(?:-v[0-9]+)?{re.escape(callback.FILE_EXTENSION)}")


class DispatchCallback(Callback):  # type: ignore[misc]
    """Publishes each save of a Lightning ``Trainer``, turns its rotation and its own SLURM
    requeue off inside a dispatch execution, and answers the requeue signal at a safe point.

    ``publications`` lists the names this process published (global zero only).
    """

    def __init__(self, env: Optional[Mapping[str, str]] = None,
                 requeue_command: Optional[list[str]] = None) -> None:
        self.execution = Execution.current(env)
        self.publications: list[str] = []
        self.requeued = False
        self._requeue_command = requeue_command
        self._signal = SignalFlag()  # the requeue signal, taken as a flag
        self._last_names: list[re.Pattern[str]] = []
        self._published_paths: set[str] = set()
        self._shared: Optional[bool] = None
        self._tops: dict[int, int] = {}  # each ModelCheckpoint's own save_top_k
        self._publisher = Publisher()  # seals and publishes each save off the training thread

    # --- set-up and tear-down ---------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.execution is None or stage != "fit":
            return
        # A folder of their own: Lightning warns about a non-empty one, and the execution's
        # folder holds dispatch's records.
        ckpt_dir = os.path.join(self.execution.exec_dir, CHECKPOINTS)  # s3://... on S3
        keep = record_keep
        if self.execution.on_s3:
            from ..execution import s3saves

            keep = s3saves.record_keep
        checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        tops = [c.save_top_k for c in checkpoints]
        if any(top != -1 for top in tops):
            # One record for all of them: the largest limit, none when one keeps every save
            # (each one's bests go into every manifest and stay: _bests).
            every = -1 in tops
            limit = None if every else max(tops)
            keep(self.execution, FRAMEWORK, "save_top_k", limit if limit else None, every)
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

        def save_and_publish(filepath: Any, weights_only: Optional[bool] = None,
                             storage_options: Optional[Any] = None) -> None:
            original(filepath, weights_only, storage_options)
            self._publish(trainer, os.fspath(filepath))

        # Every save goes through Trainer.save_checkpoint, which ends with the strategy's
        # barrier: after it, every rank's part is written.  Lightning's Callback API has no
        # hook after a save, so the instance's method is wrapped (undone in teardown).
        trainer.save_checkpoint = save_and_publish  # type: ignore[method-assign]

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.execution is None or stage != "fit":
            return
        trainer.__dict__.pop("save_checkpoint", None)
        try:
            self._publisher.wait()  # the last save's publication, before fit returns
        finally:
            self._signal.hand_back()
        if self._not_requeued is not None:
            # Last, once everything above is undone: fit returning would end the job
            # COMPLETED, and the supervisor stops a completed job for good.
            why, self._not_requeued = self._not_requeued, None
            raise NotRequeued(why)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        if self.execution is None or not isinstance(exception, SIGTERMException) \
                or exception.code not in (None, 0):
            return
        # Lightning re-raises this very exception once the hooks have run: its code is the
        # process's exit status.
        exception.code = TERMED_CODE
        sys.stderr.write(f"dispatch: the trainer stopped at SIGTERM with status 0: its work is "
                         f"not done, so the process exits {TERMED_CODE} (a failure: the job's "
                         "resubmit rule applies, its next execution resumes from the newest "
                         "published save)\n")
        sys.stderr.flush()

    # --- publication ----------------------------------------------------------------------

    def _publish(self, trainer: pl.Trainer, path: str) -> None:
        assert self.execution is not None
        on_s3 = self.execution.on_s3
        # On S3 the save is an s3:// URL Lightning wrote through fsspec; no local path.
        absolute = path.rstrip("/") if on_s3 else os.path.abspath(path)
        exec_dir = self.execution.exec_dir if on_s3 else os.path.abspath(
            self.execution.exec_dir)
        inside = absolute.startswith(exec_dir.rstrip("/") + "/")
        name = absolute.rsplit("/", 1)[-1]
        if (not inside or absolute in self._published_paths
                or any(p.fullmatch(name) for p in self._last_names)):
            return  # not ours to publish, or a name Lightning rewrites in place
        if on_s3:
            if trainer.world_size > 1:  # every rank's part is written once all are here
                trainer.strategy.barrier("dispatch.publish")
            self._published_paths.add(absolute)
            if trainer.is_global_zero:
                from ..execution import s3saves

                s3saves.seal_remote_save(absolute, relative_saves(self.execution,
                                                                  self._bests(trainer)))
                self.publications.append(
                    publish_save(self.execution, trainer.global_step, absolute))
            return
        single = trainer.world_size <= 1
        if not single:
            if os.path.exists(absolute):  # each rank syncs what it wrote
                sync_save(absolute)
            trainer.strategy.barrier("dispatch.publish")
        self._published_paths.add(absolute)
        if trainer.is_global_zero:
            bests = relative_saves(self.execution, self._bests(trainer))
            step = trainer.global_step
            self._publisher.submit(lambda: self._seal_and_publish(absolute, single, bests, step))

    def _seal_and_publish(self, save: str, single: bool, bests: list[str], step: int) -> None:
        """On the publisher's thread: make the save durable, then publish it."""
        assert self.execution is not None
        seal_save(save, single_writer=single, bests=bests)
        self.publications.append(publish_save(self.execution, step, save))

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
                ranked = sorted(((float(v), os.fspath(p)) for p, v in
                                 callback.best_k_models.items() if float(v) == float(v)),
                                reverse=callback.mode == "max")
                found.extend(path for _value, path in ranked[:top])
            if callback.best_model_path:
                found.append(os.fspath(callback.best_model_path))
        return found

    # --- the requeue signal -----------------------------------------------------------------

    # Why a job that stopped at the requeue signal was not requeued (raised at teardown).
    _not_requeued: Optional[str] = None
    _stopped = False  # the loop was stopped at the requeue signal

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.execution is None or self._stopped:
            return
        # Every rank must take part in the save, so the ranks agree on "any rank signalled".
        if not trainer.strategy.reduce_boolean_decision(self._signal.raised, all=False):
            return
        self._signal.raised = False
        path = os.path.join(self.execution.exec_dir, CHECKPOINTS,
                            REQUEUE_SAVE.format(step=trainer.global_step))
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            self._publisher.wait()  # requeued only once this save is published
        self._stopped = True
        why = requeue(path, self._shared, self._requeue_command) if trainer.is_global_zero \
            else None
        # Every rank ends the same way: all with NotRequeued, or all requeued.
        why = trainer.strategy.broadcast(why, src=0)
        self.requeued = why is None
        self._not_requeued = why
        trainer.should_stop = True
