"""The file-system primitives every side shares: create-once writes, no-follow opens, folder syncs.

One home for the open flags that carry this project's safety rules, so each rule is spelled once:

* A create-once file is opened ``O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`` (:func:`create_new`): it
  never replaces a file, never writes through a symlink planted in its place, and an existing
  name is ``FileExistsError`` for the caller to read as "someone else made it".
* A folder opened to work inside it is opened ``O_DIRECTORY|O_NOFOLLOW`` (:data:`DIR_FLAGS`,
  :func:`open_dir`) unless the caller says a symlink is allowed there (a checkpoint root or a
  folder a person named may be one); a file read where a user could plant something is opened
  ``O_NOFOLLOW`` (:func:`open_file`), and ``O_NONBLOCK`` where a FIFO must not hang the reader.
* :func:`write_new` writes all of its bytes (a write may be short), fsyncs them, and by default
  leaves no partial file under its name when anything fails, Ctrl-C included.
* :func:`replace` puts a whole new file under a name in one step (a create-once temporary
  name renamed over it): a reader sees the old file or the new one, never part of either.

Only OSError is raised here, as the system gave it: each caller turns it into its own error with
its own words.  Only the standard library is imported (the hooks import this module).
"""

from __future__ import annotations

import os

#: A folder, opened to list it or to work relative to it, never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A new file, created once: never an existing one, never through a symlink.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file read where someone else could have planted a symlink.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

__all__ = [
    "CREATE_FLAGS",
    "DIR_FLAGS",
    "READ_FLAGS",
    "create_new",
    "fsync_dir",
    "fsync_path",
    "open_dir",
    "open_file",
    "replace",
    "write_all",
    "write_new",
]


def open_dir(
    path: str, dir_fd: int | None = None, *, follow: bool = False, path_only: bool = False
) -> int:
    """Open the folder ``path`` (relative to ``dir_fd`` if given); a symlink is refused (ELOOP)
    unless ``follow``.  ``path_only`` opens it ``O_PATH``: enough to pass through a folder one
    may search but not read (0711), not to list it."""
    flags = DIR_FLAGS
    if follow:
        flags &= ~os.O_NOFOLLOW
    if path_only:
        flags = (flags & ~os.O_RDONLY) | os.O_PATH
    return os.open(path, flags, dir_fd=dir_fd)


def open_file(path: str, dir_fd: int | None = None, *, nonblock: bool = False) -> int:
    """Open the file ``path`` for reading, never through a symlink; ``nonblock`` so that a FIFO
    planted there answers at once instead of hanging the reader."""
    return os.open(path, READ_FLAGS | (os.O_NONBLOCK if nonblock else 0), dir_fd=dir_fd)


def create_new(path: str, mode: int, dir_fd: int | None = None, *, exclusive: bool = True) -> int:
    """Create ``path`` and return it open for writing; FileExistsError if it exists.

    ``exclusive=False`` opens an existing file instead (still never through a symlink): for
    entries whose name alone is the message, where making one twice is harmless.
    """
    flags = CREATE_FLAGS if exclusive else CREATE_FLAGS & ~os.O_EXCL
    return os.open(path, flags, mode, dir_fd=dir_fd)


def write_all(fd: int, data: bytes, path: str = "") -> None:
    """Write every byte of ``data`` to ``fd``: a write may be short (a signal, a network file
    system), so write until none is left."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - a regular file never answers 0 for >0 bytes
            raise OSError(5, f"short write to {path!r}")
        view = view[written:]


def write_new(
    path: str,
    data: bytes,
    mode: int = 0o644,
    *,
    dir_fd: int | None = None,
    sync: bool = True,
    discard_partial: bool = True,
) -> None:
    """Create ``path`` once with ``data`` and ``mode``, fsynced unless ``sync`` is False (the
    caller then syncs what it must itself); FileExistsError if it exists.

    With ``discard_partial`` (the default), a failure after the file was made (a full disk,
    Ctrl-C) removes it, so no partial file is left under its name; without it the file stays
    as far as it was written (the callers that ask for that are named where they do).
    """
    fd = create_new(path, mode, dir_fd)
    try:
        write_all(fd, data, path)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        if discard_partial:
            os.unlink(path, dir_fd=dir_fd)
        raise
    os.close(fd)


def replace(
    name: str, data: bytes, mode: int, *, dir_fd: int, gid: int | None = None, sync: bool = True
) -> None:
    """Put ``data`` under ``name`` in the folder ``dir_fd``, whole, replacing what was there.

    The bytes go into a create-once temporary name beside it (``.<name>.<pid>``, a leftover of
    a crashed writer with the same pid removed first) whose mode (exactly ``mode``, whatever
    the umask) and group (``gid``, when given) are set before a byte is written, then it is
    renamed over ``name``: readers see the old file or the new, never part, and never the new
    one with looser rights.  ``sync`` fsyncs the file before the rename and the folder after.
    Any failure removes the temporary name and leaves ``name`` as it was.  Only for folders
    nobody but the caller writes (the rename replaces whatever ``name`` is).
    """
    temp = f".{name}.{os.getpid()}"
    try:
        os.unlink(temp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = create_new(temp, 0o600, dir_fd)
    try:
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
            write_all(fd, data, name)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if sync:
        os.fsync(dir_fd)


def fsync_dir(path: str, dir_fd: int | None = None, *, follow: bool = True) -> None:
    """Make the names in the folder ``path`` durable (a file's bytes are synced on its own fd;
    its name lives in its folder).  The folder may be a symlink unless ``follow`` is False."""
    fd = open_dir(path, dir_fd, follow=follow)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str, directory: bool) -> None:
    """fsync the file or folder ``path`` itself, never through a symlink."""
    fd = open_dir(path) if directory else os.open(path, READ_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
