"""The publish sequence every framework's callback shares, so that a callback keeps only its
framework's hooks: the resume choice (:func:`resume_path`), the keep record
(:meth:`Sequence.keep`), each save synced on every rank, the barrier, then sealed and
published by the main process off the training thread (:meth:`Sequence.publish`), the
requeue once the save made at the signal is published (:meth:`Sequence.requeue_at_signal`),
and the end of training (:meth:`Sequence.finish`: the last publication waited for, the
signal handed back, :class:`NotRequeued` raised for a job stopped at the signal and not
requeued).  The framework says when (its hooks), where its save is, which rank is the main
one, how its ranks meet (a barrier, a broadcast) and which saves it keeps as its best.

Imports no training library (the callbacks give their own barrier and broadcast).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Callable, Optional

from ..errors import NotRequeued
from ..execution import staging, steps
from ..execution.background import Publisher
from ..execution.saves import (
    Execution,
    choose_resume,
    publish_save,
    record_keep,
    seal_save,
    sync_save,
)
from .requeue import SignalFlag, requeue


def resume_path(
    execution: Execution, framework: str, required: tuple[str, ...] = (), fetch: bool = False
) -> Optional[str]:
    """The save the execution resumes from (None: a fresh start): its choice, recorded
    (:func:`..execution.saves.choose_resume`); on a remote root (:mod:`..execution.staging`)
    checked there, and with ``fetch`` copied to local disk first (a framework that loads only
    from a file system)."""
    if execution.remote:
        return (
            staging.of(execution.root)
            .choose_resume(execution, required=required, framework=framework, fetch=fetch)
            .path
        )
    return choose_resume(execution, required=required, framework=framework).path


def seal_and_publish(
    execution: Execution, save: str, step: int, single: bool, bests: list[str]
) -> str:
    """Make the save durable (its manifest naming ``bests``; with a ``single`` writer every
    file and folder synced too), then publish it: the publication's name."""
    seal_save(save, single_writer=single, bests=bests)
    return publish_save(execution, step, save)


class Sequence:
    """One callback's side of the sequence, for the execution it runs in (None outside one:
    then only the signal flag and the progress recorder, both idle, are there).

    ``publications`` lists the names this process published (the main process only);
    ``requeued`` says whether the job was requeued at the signal; ``not_requeued`` why a job
    stopped at the signal was not (raised by :meth:`finish`)."""

    def __init__(
        self,
        execution: Optional[Execution],
        env: Optional[Mapping[str, str]],
        requeue_command: Optional[list[str]] = None,
    ) -> None:
        self.execution = execution
        self.publications: list[str] = []
        self.requeued = False
        self.not_requeued: Optional[str] = None
        self.requeue_command = requeue_command
        self.signal = SignalFlag()  # the requeue signal, taken as a flag
        self.publisher = Publisher()  # seals and publishes each save off the training thread
        # The progress record the launcher's stall watcher reads (--stall-timeout).
        self.progress = (
            steps.recorder(os.environ if env is None else env) if execution is not None else None
        )

    def keep(self, framework: str, option: str, limit: Optional[int], every: bool = False) -> None:
        """Record the framework's rotation limit for dispatch's cleanup (the framework's own
        rotation is turned off by its callback)."""
        assert self.execution is not None
        keep = record_keep
        if self.execution.remote:
            keep = staging.of(self.execution.root).record_keep
        keep(self.execution, framework, option, limit, every)

    def publish(
        self,
        save: str,
        step: int,
        *,
        ranks: int,
        main: bool,
        barrier: Callable[[], None],
        bests: Callable[[], list[str]],
    ) -> None:
        """A save every rank has written its part of: with several ranks each syncs what it
        wrote and all meet at ``barrier``; then the main process seals and publishes it in
        the background (the previous save's publication waited for first)."""
        assert self.execution is not None
        single = ranks <= 1
        if not single:
            if os.path.exists(save):  # each rank syncs what it wrote (none on a node apart)
                sync_save(save)
            barrier()
        if main:
            found, execution = bests(), self.execution
            self.publisher.submit(
                lambda: self.publications.append(
                    seal_and_publish(execution, save, step, single, found)
                )
            )

    def requeue_at_signal(
        self,
        save: str,
        shared: Callable[[], Optional[bool]],
        main: bool,
        from_main: Callable[[Optional[str]], Optional[str]],
    ) -> None:
        """The save made at the signal is published (waited for here): the main process
        requeues the job unless it shares its checkpoint (``shared``, asked there only), and
        every rank learns the outcome (``from_main``: the main process's value, on every
        rank)."""
        self.publisher.wait()
        why = requeue(save, shared(), self.requeue_command, self.execution) if main else None
        why = from_main(why)
        self.requeued = why is None
        self.not_requeued = why

    def finish(self) -> None:
        """At the end of training: the last save's publication waited for, the signal handed
        back, and, for a job stopped at the signal and not requeued, :class:`NotRequeued`
        (returning would end the job COMPLETED, where the supervisor stops for good)."""
        try:
            self.publisher.wait()
        finally:
            self.signal.hand_back()
        if self.not_requeued is not None:
            why, self.not_requeued = self.not_requeued, None
            raise NotRequeued(why)
