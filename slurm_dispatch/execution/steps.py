"""An execution's progress record: the step it reached and when, and whether it is inside a
save, written cheaply from the training loop for the launcher's stall watcher
(:mod:`.stall`) to read.

The record is ``<local dir>/.dispatch-progress.json`` (:data:`..checkpoint.execdir.PROGRESS`,
in ``DISPATCH_LOCAL_DIR``: the execution's folder, or an ``s3://`` root's staging folder), a
small JSON object::

    {"step": 120, "calls": 480, "time": 1733550000.5, "saving": false, "saves": 3,
     "pid": 4242}

``calls`` counts the loop's step marks (:meth:`ProgressRecorder.step`), also those that
repeat a step: with gradient accumulation the callbacks mark each micro-batch (Lightning's
batch end, the Trainer's substep end) under the same global step, and each is progress.

Invariants:

* Cheap on the hot path: :meth:`ProgressRecorder.step` only remembers the step and reads a
  monotonic clock; it writes at most once every :data:`INTERVAL` seconds.  A write is one
  small file replaced in place (written under a temporary name, renamed over the record),
  never synced: a reader sees the old record or the new one, never half of one, and a crash
  loses at most the last few seconds, which nobody needs after the execution.
* The beginning and the end of a save (:meth:`ProgressRecorder.saving`) are written at once,
  whatever the interval: the watcher never counts time inside a save as time without
  progress.  The end of a save counts as progress (the clock starts again there).
* Nothing here raises into the training loop: a record that cannot be written (a full disk,
  a folder gone) is given up on quietly for the rest of the process, and training goes on.
* The end of the loop (:meth:`ProgressRecorder.ended`: the callbacks' end of training, the
  API's ``progress_ended``) is written at once, ``"ended": true``: what the script does after
  it (a final evaluation on the test set, an export, a second phase's set-up) is never a
  stall, as before the first record.  The next step clears it.
* Several processes may write the record (``dispatch watch`` and a loop under it that
  records its own progress): watch never writes over another's save or end
  (:meth:`ProgressRecorder.another_pauses`).
* Outside a dispatch execution (no ``DISPATCH_LOCAL_DIR``) :func:`recorder` is None and the
  integrations record nothing.

Only one process of a job should record (rank 0): the integrations do so; the API's
:func:`slurm_dispatch.api.progress` leaves that to its caller.  Standard library only.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional

from ..checkpoint import execdir
from . import contract

INTERVAL = 2.0  # seconds: at most one write of a step this often


class ProgressRecorder:
    """Writes one execution's progress record into ``folder``."""

    def __init__(
        self,
        folder: str,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = os.path.join(folder, execdir.PROGRESS)
        # A temporary name of our own (the pid), one per process: see execdir's own-file names.
        self._tmp = f"{self.path}.{os.getpid()}.0.tmp"
        self.interval = interval
        self._clock, self._wall = clock, wall
        self._step: Optional[int] = None
        self._step_wall = 0.0
        self._written_step: Optional[int] = None
        self._next = 0.0  # the monotonic time before which no step is written
        self._saving = 0  # saves begun and not ended (nested marks count once)
        self._what = "save"
        self._saves = 0
        self._ended = False  # the loop ended (until its next step)
        self.calls = 0  # step marks, a step reached again (a micro-batch) counted too
        self.writes = 0
        self.broken: Optional[str] = None  # why recording was given up, if it was

    def step(self, step: int) -> None:
        """The loop reached ``step`` (again, for a micro-batch of gradient accumulation:
        progress too): remembered, and written when :data:`INTERVAL` has passed since the last
        write."""
        self._step = step
        self.calls += 1
        now = self._clock()
        if self._ended:
            self._ended = False  # a new loop: written at once, the clock starts again
            self._step_wall = self._wall()
            self._write(now)
        elif now >= self._next:
            self._step_wall = self._wall()
            self._write(now)

    def flush(self) -> None:
        """Write the last step remembered, if it is not written yet."""
        if self._step != self._written_step:
            self._step_wall = self._wall()
            self._write(self._clock())

    def save_began(self, step: Optional[int] = None, what: str = "save") -> None:
        """A save (or another pause the loop makes on purpose, ``what``: an evaluation)
        begins: written at once."""
        if step is not None:
            self._step = step
        self._saving += 1
        if self._saving == 1:
            self._what = what
            self._write(self._clock())

    def save_ended(self, step: Optional[int] = None) -> None:
        """The save begun last ended: written at once, and counted as progress."""
        if step is not None:
            self._step = step
        if self._saving == 0:
            return
        self._saving -= 1
        if self._saving == 0:
            self._saves += 1
            self._step_wall = self._wall()
            self._write(self._clock())

    def ended(self, step: Optional[int] = None) -> None:
        """The loop ended (training returned): written at once; until the next step nothing
        the script does is a stall."""
        if step is not None:
            self._step = step
        self._ended = True
        self._step_wall = self._wall()
        self._write(self._clock())

    def another_pauses(self) -> bool:
        """Whether the record is another process's and says it is inside a save or its loop
        ended: ``dispatch watch`` then leaves it be (its publication is no news to a loop
        that records its own progress, and writing 'not saving' over the loop's mark would
        count the rest of that save)."""
        found = read(os.path.dirname(self.path))
        return (
            found is not None
            and found.get("pid") != os.getpid()
            and bool(found.get("saving") or found.get("ended"))
        )

    @contextmanager
    def saving(self, step: Optional[int] = None, what: str = "save") -> Iterator[None]:
        """``with recorder.saving(step): ...`` marks the block as a save."""
        self.save_began(step, what)
        try:
            yield
        finally:
            self.save_ended()

    def _write(self, now: float) -> None:
        self._next = now + self.interval
        if self.broken is not None:
            return
        data: dict[str, Any] = {
            "step": self._step,
            "calls": self.calls,
            "time": round(self._step_wall, 3),
            "saving": self._saving > 0,
            "saves": self._saves,
            "pid": os.getpid(),
        }
        if self._saving:
            data["what"] = self._what
        if self._ended:
            data["ended"] = True
        try:
            with open(self._tmp, "w") as handle:
                handle.write(json.dumps(data))
            os.replace(self._tmp, self.path)
        except OSError as exc:  # never into the training loop: give up recording
            self.broken = f"{self.path}: {exc.strerror or exc}"
            return
        self._written_step = self._step
        self.writes += 1


def read(folder: str, name: str = execdir.PROGRESS) -> Optional[dict[str, Any]]:
    """The progress record in ``folder`` (or the small JSON file ``name`` there), or None
    while there is none (or it cannot be read: the watcher then waits as before any
    record)."""
    try:
        with open(os.path.join(folder, name), "rb") as handle:
            data = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_recorders: dict[str, ProgressRecorder] = {}
_UNSET: Any = object()
_current: Any = _UNSET  # this process's, from os.environ: looked up once


def recorder(env: Optional[Mapping[str, str]] = None) -> Optional[ProgressRecorder]:
    """This process's recorder for its execution (one per folder, shared by every caller in
    the process: the API, a callback, the DCP helper), or None outside an execution.  From
    ``os.environ`` (no ``env``) it is looked up once: an execution's contract never changes."""
    global _current
    if env is None and _current is not _UNSET:
        return _current  # type: ignore[no-any-return]
    folder = contract.Contract.read(env).local_dir
    found = None
    if folder:
        found = _recorders.get(folder)
        if found is None:
            found = _recorders[folder] = ProgressRecorder(folder)
    if env is None:
        _current = found
    return found
