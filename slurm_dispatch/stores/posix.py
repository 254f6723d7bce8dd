"""The POSIX publication store: ``publish``, ``latest`` and ``list_publications`` on ``pub/``.

:class:`PosixStore` is the :class:`~.base.Store` for a root that is a local or shared file
system folder; the module functions are its body.  Invariants kept here (the seed's rules):

* A publication is an empty file created with ``O_CREAT|O_EXCL``; ``pub/`` and the root are
  fsynced before :func:`publish` returns.  Nothing here renames, rewrites, appends or deletes.
* No locks and no pointer file: the latest save is the greatest name in ``pub/``
  (greatest epoch, then step, then encoded path in byte order for exact ties).
* A name in ``pub/`` that is not a publication is an error naming it, never skipped; so is
  a ``pub/`` that is a symlink or not a directory.
* ``pub/`` is opened with ``O_NOFOLLOW`` and publications are created relative to that open
  directory, so a symlink planted in place of ``pub/`` is never followed.
* The symlink rule, at publish time and again at read time: the root itself may be a symlink
  (``/scratch/me -> /lustre/...``); a symlink below it (``exec/``, a save's folder) is allowed
  only while it resolves inside the root.  ``publish`` refuses a save that leads out;
  ``latest`` and ``list_publications`` refuse to return one (:class:`OutsideRoot`), for a
  folder swapped for a symlink after publishing.  A save that no longer exists (pruned) is
  returned as recorded.

``latest`` checks the shape of every name with one scan and decodes the path of the one it
returns; ``list_publications`` decodes every name.
"""

from __future__ import annotations

import errno
import os
import stat

from .. import model
from ..errors import (
    AlreadyPublished,
    OutsideRoot,
    StoreError,
    StoreFull,
)
from .base import EXEC, PUB, Found, Store, check_names

__all__ = ["PosixStore", "publish", "latest", "list_publications", "Found", "PUB", "EXEC"]


def _open_pub_dir(pub_path: str, dir_fd: int | None = None) -> int:
    """Open ``pub/`` without following a symlink; FileNotFoundError passes through.

    With ``dir_fd`` (the open root), ``pub/`` is opened relative to it.
    """
    target = PUB if dir_fd is not None else pub_path
    try:
        return os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            if os.path.islink(pub_path):
                raise StoreError(f"pub/ {pub_path!r} is a symlink; refusing to follow it") from None
            raise StoreError(f"pub/ {pub_path!r} is not a directory") from None
        raise StoreError(f"cannot open {pub_path!r}: {exc.strerror}") from None


def _fsync_dir(fd: int, path: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise StoreError(f"cannot sync {path!r}: {exc.strerror}") from None


def publish(root: str, epoch: int, step: int, path: str) -> str:
    """Publish the save at ``path`` (which must exist inside ``root``); return the name.

    The save's path is recorded relative to the root as the root was spelled; it must also
    lie inside the root once symlinks are resolved, so a link leading out is refused.  The
    root itself may be a symlink (``/scratch/me -> /lustre/...``); ``pub/`` may not.
    """
    root_abs = os.path.abspath(root)
    path_abs = os.path.abspath(path)
    name, relative = model.format_name_inside(root_abs, path_abs, epoch, step)
    root_fd = _open_root(root_abs, root)
    try:
        _check_inside(root_fd, root_abs, relative, path)
        pub_path = os.path.join(root_abs, PUB)
        pub_fd = _open_pub(root_fd, pub_path)
        try:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o444, dir_fd=pub_fd)
            except FileExistsError:
                raise AlreadyPublished(
                    f"publication {name!r} already exists in {pub_path!r} "
                    f"(epoch {epoch}, step {step}, path {relative!r})") from None
            except OSError as exc:
                _raise_write_error(exc, os.path.join(pub_path, name))
            os.close(fd)
            _fsync_dir(pub_fd, pub_path)
        finally:
            os.close(pub_fd)
        _fsync_dir(root_fd, root_abs)
    finally:
        os.close(root_fd)
    return name


def _open_root(root_abs: str, given: str) -> int:
    try:
        return os.open(root_abs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise StoreError(f"checkpoint root {given!r} is not a directory") from None
        raise StoreError(f"cannot open checkpoint root {given!r}: {exc.strerror}") from None


def _walk(root_fd: int, relative: str, given: str) -> tuple[bool, bool]:
    """(a symlink is on the way, the save exists): one lstat per component below the root,
    stopping at the first missing one."""
    parts = relative.split("/")
    linked = False
    for i in range(1, len(parts) + 1):
        try:
            st = os.lstat("/".join(parts[:i]), dir_fd=root_fd)
        except FileNotFoundError:
            return linked, False
        except OSError as exc:
            raise StoreError(f"cannot inspect save {given!r}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            linked = True
    return linked, True


def _escape(root_abs: str, relative: str) -> tuple[str, str] | None:
    """(resolved save, resolved root) when the save resolves outside the root, else None."""
    real_root = os.path.realpath(root_abs)
    real_path = os.path.realpath(os.path.join(root_abs, relative))
    if real_path.startswith(real_root.rstrip("/") + "/"):
        return None
    return real_path, real_root


def _check_inside(root_fd: int, root_abs: str, relative: str, given: str) -> None:
    """The save exists, and no symlink on its way leads out of the root.

    Only when a component below the root is a symlink are both paths resolved and compared.
    """
    linked, exists = _walk(root_fd, relative, given)
    if not exists:
        raise OutsideRoot(f"save {given!r} does not exist")
    if linked:
        escape = _escape(root_abs, relative)
        if escape is not None:
            raise OutsideRoot(f"save {given!r} resolves to {escape[0]!r}, outside the "
                              f"checkpoint root {escape[1]!r}")
        if not os.path.exists(os.path.join(root_abs, relative)):
            raise OutsideRoot(f"save {given!r} is a dangling symlink")


def _check_still_inside(root_fd: int, root_abs: str, found: Found) -> None:
    """At read time: refuse a save that a symlink below the root now leads out of (a folder
    under exec/ swapped for a link after publishing).  A save that is gone (pruned) passes:
    nothing on its way leads out."""
    relative = os.path.relpath(found.path, root_abs)
    linked, _ = _walk(root_fd, relative, found.path)
    if linked:
        escape = _escape(root_abs, relative)
        if escape is not None:
            raise OutsideRoot(
                f"publication {found.name!r}: save {found.path!r} resolves to "
                f"{escape[0]!r}, outside the checkpoint root {escape[1]!r} (a symlink below "
                "the root leads out of it); refusing to return it")


def _open_pub(root_fd: int, pub_path: str) -> int:
    try:
        return _open_pub_dir(pub_path, root_fd)
    except FileNotFoundError:
        pass
    try:
        os.mkdir(PUB, 0o755, dir_fd=root_fd)
    except FileExistsError:
        pass  # another publisher made it meanwhile
    except OSError as exc:
        _raise_write_error(exc, pub_path)
    return _open_pub_dir(pub_path, root_fd)


def _raise_write_error(exc: OSError, path: str) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise StoreFull(exc.errno, f"no space left to publish {path!r}: {exc.strerror}") from None
    raise StoreError(f"cannot create {path!r}: {exc.strerror}") from None


def _names(root: str) -> list[str]:
    pub_path = os.path.join(os.path.abspath(root), PUB)
    try:
        fd = _open_pub_dir(pub_path)
    except FileNotFoundError:
        if not os.path.isdir(root):
            raise StoreError(f"checkpoint root {root!r} is not a directory") from None
        return []
    try:
        return os.listdir(fd)
    except OSError as exc:
        raise StoreError(f"cannot list {pub_path!r}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _found(root: str, publication: model.Publication, name: str) -> Found:
    return Found(publication.epoch, publication.step, name,
                 os.path.join(os.path.abspath(root), publication.path))


def latest(root: str) -> Found | None:
    """The latest publication under ``root``, or ``None`` when there is none."""
    names = _names(root)
    if not names:
        return None
    check_names(names, os.path.join(root, PUB))
    name = max(names)
    found = _found(root, model.parse_name(name), name)
    _check_found(root, [found])
    return found


def list_publications(root: str) -> list[Found]:
    """Every publication under ``root``, oldest first (the order of ``latest``)."""
    names = sorted(_names(root))
    found = [_found(root, model.parse_name(name), name) for name in names]
    if found:
        _check_found(root, found)
    return found


def _check_found(root: str, found: list[Found]) -> None:
    root_abs = os.path.abspath(root)
    root_fd = _open_root(root_abs, root)
    try:
        for each in found:
            _check_still_inside(root_fd, root_abs, each)
    finally:
        os.close(root_fd)


class PosixStore(Store):
    """The :class:`~.base.Store` of a folder.  A hung file system cannot be interrupted from
    user space, so there is no timeout here (the S3 store has one)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def publish(self, epoch: int, step: int, path: str) -> str:
        return publish(self.root, epoch, step, path)

    def latest(self) -> Found | None:
        return latest(self.root)

    def list_publications(self) -> list[Found]:
        return list_publications(self.root)

    def exec_dir(self, attempt: str) -> str:
        return os.path.join(self.root, EXEC, model.check_attempt(attempt))

    def locate(self, relative: str) -> str:
        return os.path.join(os.path.abspath(self.root), relative)
