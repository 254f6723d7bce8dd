"""A save made durable and published off the training thread, one at a time.

The Trainer and Lightning callbacks hand a written save to :class:`Publisher`; its thread
syncs every file and folder of the save (with its manifest), then publishes it, while training
goes on.  Invariants:

* A save is published only after every file and folder of it is synced (the sealing and the
  publication run in that order on the publisher's one thread).
* At most one save is pending: :meth:`Publisher.submit` first waits for the one before it, so
  the next save's publication waits for the previous one's (and the store's order of
  publications is the order of the saves).
* A failure of the background work is raised in the training thread, at the next
  :meth:`~Publisher.submit` or :meth:`~Publisher.wait`: never lost, never a second save
  published past it.
* The thread is not a daemon: at a normal exit (``sys.exit``, an exception, a signal Python
  turns into one) the interpreter waits for it, so the pending publication finishes first.  A
  process killed outright (SIGKILL, a node lost) leaves the pending save whole, with its
  manifest, and unpublished: cleanup keeps such a save (``dispatch gc`` lists it as never
  published, and a person may publish it).  The callbacks also wait before a requeue and at the
  end of training, so a job requeued at its warning signal is requeued with its save published.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

THREAD_NAME = "dispatch-publish"


class Publisher:
    """Runs one piece of work (seal, then publish) at a time on a thread of its own."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    @property
    def pending(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, work: Callable[[], None]) -> None:
        """Wait for the pending work (raising its failure), then start ``work``."""
        self.wait()
        thread = threading.Thread(target=self._run, args=(work,), name=THREAD_NAME, daemon=False)
        self._thread = thread
        thread.start()

    def wait(self) -> None:
        """Return once no work is pending; raise the failure of the last one, if any."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # raised again in the training thread
            self._error = exc
