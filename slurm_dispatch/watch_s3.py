"""``dispatch watch`` on an ``s3://`` root: upload each complete local save, then publish it.

On an S3 root the framework writes its saves into a local staging folder
(``$DISPATCH_STAGE_DIR``); the :class:`~slurm_dispatch.watch.Watcher` finds the complete ones
by the same rules as on POSIX and hands each to :class:`Uploader`, which uploads it under the
execution's prefix (``$DISPATCH_EXEC_DIR``, ``s3://bucket/prefix/exec/<attempt>``) with boto3's
transfer manager and publishes the uploaded save.

Invariants:

* A save is published only after every one of its files is uploaded, and never after the
  watcher was cancelled (a scan or upload overran ``--timeout``).
* A local copy is removed only once it is uploaded and published (or found already
  published), and the newest such copy is kept, so a replacement on the same node can resume
  from local disk (:func:`stage_copy`).  A save that was never published is never removed.
* Everything else (which names are saves, step order, the mark, first error stops) is the
  POSIX watcher's, unchanged.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Optional

from . import model, store
from .errors import OutOfBounds, OutsideRoot, UsageError
from .stores import transfer


class Uploader:
    """Uploads and publishes the saves of one local staging folder under one S3 prefix."""

    def __init__(self, root: str, folder: str, upload_to: Optional[str], timeout: float,
                 report: Callable[[str], None]) -> None:
        from .stores.s3 import S3Store

        self.store = store.open_store(root, timeout)
        assert isinstance(self.store, S3Store)
        if not upload_to:
            raise UsageError(f"checkpoint root {root!r} is on S3: watch needs the execution's "
                             "prefix to upload to (--to, or $DISPATCH_EXEC_DIR as the launcher "
                             "sets it)")
        prefix = upload_to.rstrip("/")
        try:
            self.store.relative(prefix)
        except OutsideRoot:
            raise UsageError(f"--to {upload_to!r} is not under the checkpoint root "
                             f"{root!r}") from None
        if not os.path.isdir(folder):
            raise UsageError(f"staging folder {folder!r} is not a directory")
        self.prefix = prefix
        self.timeout = timeout
        self.report = report
        self._kept: list[str] = []  # local copies uploaded and published, oldest first

    def url_of(self, path: str) -> str:
        return f"{self.prefix}/{os.path.basename(path)}"

    def own_mark(self) -> int:
        """The greatest step published from this prefix (-1: none)."""
        mine = self.prefix + "/"
        return max((f.step for f in self.store.list_publications() if f.path.startswith(mine)),
                   default=-1)

    def put(self, epoch: int, step: int, path: str, cancelled: Callable[[], bool]) -> str:
        """Upload the save at ``path``, then publish it; return the publication's name ("" when
        cancelled meanwhile: nothing published)."""
        url = self.url_of(path)
        try:
            transfer.upload_save(path, url, self.timeout)
        except Exception:
            if not os.path.lexists(path):
                # The watcher's branch for a save deleted before it could be published.
                raise OutsideRoot(f"save {path!r} was deleted during its upload") from None
            raise
        if cancelled():
            return ""
        return self.store.publish(epoch, step, url)

    def published(self, path: str) -> None:
        """``path`` is uploaded and published: remove the older local copies, keep it."""
        self._kept.append(path)
        while len(self._kept) > 1:
            old = self._kept.pop(0)
            try:
                if os.path.isdir(old) and not os.path.islink(old):
                    shutil.rmtree(old)
                else:
                    os.unlink(old)
            except FileNotFoundError:
                pass
            except OSError as exc:  # disk housekeeping: said, never a publishing error
                self.report(f"could not remove the local copy {old}: {exc}")
                continue
            self.report(f"removed the local copy {old} (published as {self.url_of(old)})")


def stage_copy(url: str, stage_dir: str) -> Optional[str]:
    """A local copy of the save at ``url`` left by an earlier execution's watch on this node
    (``<stage base>/dispatch-stage-<attempt>/<name>``), or None.  The caller checks it."""
    relative_parts = url.rstrip("/").split("/")
    if len(relative_parts) < 3 or relative_parts[-3] != store.EXEC:
        return None
    attempt, name = relative_parts[-2], relative_parts[-1]
    try:
        model.check_attempt(attempt)
    except OutOfBounds:  # not an execution's folder: nothing to look for
        return None
    # The launcher names each execution's staging folder so (launch.make_stage_dir).
    candidate = os.path.join(os.path.dirname(os.path.abspath(stage_dir)),
                             f"dispatch-stage-{attempt}", name)
    return candidate if os.path.lexists(candidate) else None
