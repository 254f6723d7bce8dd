"""``dispatch watch`` on an ``s3://`` root: upload each complete local save, then publish it.

On an S3 root the framework writes its saves into a local staging folder
(``$DISPATCH_STAGE_DIR``); the :class:`~.watch.Watcher` finds the complete ones
by the same rules as on POSIX and hands each to :class:`Uploader`, which uploads it under the
execution's prefix (``$DISPATCH_EXEC_DIR``, ``s3://bucket/prefix/exec/<attempt>``) with boto3's
transfer manager and publishes the uploaded save.

Invariants:

* A save is published only after every one of its files is uploaded, and never after the
  watcher was cancelled (a scan or upload overran ``--timeout``).
* A local copy is removed only once it is uploaded and published (or found already
  published), and the newest such copy is kept, so a replacement on the same node can resume
  from local disk (:func:`stage_copy`) when the save's manifest records its files' sha256
  (the integrations' uploads do; this watcher writes no manifest, so its saves are fetched).
  A save that was never published is never removed.
* A copy left in another execution's staging folder is taken (:func:`copy_own`) only when it
  is this user's own and holds what was uploaded: every folder on the way from the staging
  folder down and every file is owned by this process's user, not writable by group or
  others, no symlink (each opened relative to the last with ``O_NOFOLLOW``), every file
  regular, at the size S3 lists and with the sha256 recorded when it was uploaded.  The bytes
  checked are the bytes copied (read once, through the file opened for the check).  Anything
  else is refused with why, and the caller fetches the save from S3 instead.
* Everything else (which names are saves, step order, the mark, first error stops) is the
  POSIX watcher's, unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
from typing import Callable, Optional

from .. import _fsio
from ..checkpoint import model
from ..checkpoint import publish as store
from ..checkpoint.stores import remote
from ..checkpoint.stores.schemes import label_of
from ..errors import OutOfBounds, OutsideRoot, UsageError

# The staging folder's folders of copies dispatch fetched from S3 (s3saves' resume-<n>/, the
# resume source; fetch's fetched/, a save fetched by name): saves already published, never this
# execution's own.  Watch never enters them (nor publishes, nor removes what is in them);
# stage.clear removes them only while they hold nothing but what S3 holds.
DOWNLOADS = re.compile(r"resume-[0-9]+|fetched")


class Uploader:
    """Uploads and publishes the saves of one local staging folder under one S3 prefix."""

    def __init__(
        self,
        root: str,
        folder: str,
        upload_to: Optional[str],
        timeout: float,
        report: Callable[[str], None],
        may_be_absent: bool = False,
    ) -> None:
        from ..checkpoint.stores.base import RemoteStore

        self.store = store.open_store(root, timeout)
        assert isinstance(self.store, RemoteStore)
        if not upload_to:
            raise UsageError(
                f"checkpoint root {root!r} is on {label_of(root)}: watch needs the execution's "
                "prefix to upload to (--to, or $DISPATCH_EXEC_DIR as the launcher "
                "sets it)"
            )
        prefix = upload_to.rstrip("/")
        try:
            self.store.relative(prefix)
        except OutsideRoot:
            raise UsageError(
                f"--to {upload_to!r} is not under the checkpoint root {root!r}"
            ) from None
        if not os.path.isdir(folder) and not (may_be_absent and not os.path.lexists(folder)):
            # (a folder inside the staging folder that the framework makes at its first save
            # may be absent: the watcher waits for it)
            raise UsageError(f"staging folder {folder!r} is not a directory")
        self.prefix = prefix
        self.folder = os.path.abspath(folder)
        self.timeout = timeout
        self.report = report
        self._kept: list[str] = []  # local copies uploaded and published, oldest first

    def url_of(self, path: str) -> str:
        """Where the save at ``path`` goes: its path below the staging folder, under the
        prefix (Lightning's lightning_logs/version_0/checkpoints/... keeps its folders)."""
        return f"{self.prefix}/{os.path.relpath(path, self.folder)}"

    def own_mark(self) -> int:
        """The greatest step published from this prefix (-1: none)."""
        mine = self.prefix + "/"
        return max(
            (f.step for f in self.store.list_publications() if f.path.startswith(mine)), default=-1
        )

    def put(self, epoch: int, step: int, path: str, cancelled: Callable[[], bool]) -> str:
        """Upload the save at ``path``, then publish it; return the publication's name ("" when
        cancelled meanwhile: nothing published)."""
        url = self.url_of(path)
        try:
            remote.upload_save(path, url, self.timeout)
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
    candidate = os.path.join(
        os.path.dirname(os.path.abspath(stage_dir)), f"dispatch-stage-{attempt}", name
    )
    return candidate if os.path.lexists(candidate) else None


class NotOwn(Exception):
    """A local copy that is not this user's own or not what was uploaded; says why."""


def _open_checked(name: str, dir_fd: Optional[int], shown: str, folder: bool) -> int:
    """Open ``name`` (relative to ``dir_fd``) without following a link; check its owner and
    mode on the open descriptor."""
    try:
        fd = (
            _fsio.open_dir(name, dir_fd) if folder else _fsio.open_file(name, dir_fd, nonblock=True)
        )  # a FIFO never blocks
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotOwn(
                f"{shown} is a symlink (or not a {'folder' if folder else 'file'})"
            ) from None
        raise NotOwn(f"cannot open {shown}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        uid = os.geteuid()
        if st.st_uid != uid:
            raise NotOwn(f"{shown} is owned by uid {st.st_uid}, not this user (uid {uid})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise NotOwn(
                f"{shown} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
            )
        if not folder and not stat.S_ISREG(st.st_mode):
            raise NotOwn(f"{shown} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def copy_own(
    candidate: str, target: str, expected: dict[str, tuple[int, str]], folder: bool
) -> Optional[str]:
    """Copy the local save ``candidate`` to ``target`` (which must not exist) when it is this
    user's own and holds what was uploaded; ``expected``: each file's name (relative to a
    folder save; a file save: its base name) with its size and sha256.  Returns None when
    copied, else why not (``target`` is then not left behind).  Only the files of
    ``expected`` are copied."""
    stage, name = os.path.split(os.path.abspath(candidate))
    base, stage_name = os.path.split(stage)
    fds: list[int] = []
    try:
        try:
            fds.append(_fsio.open_dir(base, follow=True))
        except OSError as exc:
            return f"cannot open {base}: {exc.strerror}"
        try:
            fds.append(_open_checked(stage_name, fds[-1], stage, folder=True))
            if folder:
                fds.append(_open_checked(name, fds[-1], candidate, folder=True))
            for relative, (size, digest) in sorted(expected.items()):
                _copy_one(
                    fds[-1], candidate, relative if folder else name, target, folder, size, digest
                )
        except NotOwn as exc:
            if os.path.lexists(target):
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                else:
                    os.unlink(target)
            return str(exc)
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _copy_one(
    top_fd: int, candidate: str, relative: str, target: str, folder: bool, size: int, digest: str
) -> None:
    """Copy one file of the save, from under the open ``top_fd``, checking each folder on the
    way, the file, its size and its sha256 (NotOwn otherwise)."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise NotOwn(f"the uploaded save names a file {relative!r} outside its folder")
    opened: list[int] = []
    try:
        here, shown = top_fd, candidate
        for part in parts[:-1]:
            shown = os.path.join(shown, part)
            here = _open_checked(part, here, shown, folder=True)
            opened.append(here)
        shown = os.path.join(candidate, relative) if folder else candidate
        fd = _open_checked(parts[-1], here, shown, folder=False)
        opened.append(fd)
        found = os.fstat(fd).st_size
        if found != size:
            raise NotOwn(f"{shown} is {found} bytes; the uploaded object is {size}")
        out = os.path.join(target, relative) if folder else target
        os.makedirs(os.path.dirname(out), exist_ok=True)
        hashed = hashlib.sha256()
        with open(os.dup(fd), "rb", closefd=True) as source, open(out, "xb") as sink:
            while True:
                chunk = source.read(1 << 20)
                if not chunk:
                    break
                hashed.update(chunk)
                sink.write(chunk)
        if hashed.hexdigest() != digest:
            raise NotOwn(
                f"{shown} differs from what was uploaded (sha256 {hashed.hexdigest()}, "
                f"recorded at upload {digest})"
            )
    finally:
        for each in opened:
            os.close(each)
