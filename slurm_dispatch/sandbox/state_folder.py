"""Root's writes under a state folder that another local user may have made first.

The state folder's path is predictable (``/var/tmp/slurm-dispatch-sandbox``), so another local
user may have made it, or a folder above it, first.  Before root writes there (:func:`claim`,
run by every root verb) the path is walked from ``/`` one opened folder at a time, never
following a link it has not checked: every folder on the way must be
root's and closed to others (or sticky, like ``/var/tmp``), the state folder is made with an
exclusive ``mkdir`` or accepted only when root's and writable by nobody else, and so is each
folder the sandbox makes in it (``munge/`` is the munge user's).  No other user can then place a
name there; on top of that, files are written to a fresh ``O_EXCL|O_NOFOLLOW`` temporary name
and renamed into place, and opened with ``O_NOFOLLOW``, so a link is replaced, never written
through.  The folder's lock (``.lock``, ``flock``) keeps two root verbs from changing it at once.

Each open goes through :mod:`slurm_dispatch._fsio` (its flags are the package's one spelling of
"never through a symlink", "create once", "a folder").  The walk from ``/`` stays here: it is
not ``_fsio``'s no-follow open of one name but a decision about a whole path (could any other
user have changed a folder on it, or a link it follows?), made as root, that makes the missing
part of the path and says whose folder broke the rule.

:func:`delete_folder` (``dispatch-sandbox remove``) removes a state folder the same way: links in
it are removed, never followed, and a folder with a mount in it is left whole.

Invariant: nothing is written under a folder before it is claimed; a symlink in the state
folder is never written through or read as a file of the sandbox's.  Nothing here knows the
sandbox's layout (no module of this package is imported): which folder is the state folder and
what it holds are :mod:`.layout`'s, and the roots' cache (:mod:`.root`) and the slots' claims
(:mod:`.slots`) are written through here too.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Optional

from .. import _fsio
from ..errors import SandboxError

_MAX_LINKS = 40  # as the kernel's own limit on links followed in one path


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _refuse(folder: Path, problem: str) -> SandboxError:
    return SandboxError(
        f"{problem}: another user could plant links or programs there that root would write "
        f"through or run; refusing to use {folder} as the sandbox folder (remove it, or choose "
        "another with --dir or $DISPATCH_SANDBOX_DIR)"
    )


def _check_folder(fd: int, where: str, folder: Path, last: bool) -> None:
    st = os.fstat(fd)
    what = f"sandbox folder {where}" if last else f"folder {where} above the sandbox folder"
    if st.st_uid != 0:
        raise _refuse(folder, f"{what} is owned by {_owner(st.st_uid)}, not root")
    if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
        raise _refuse(folder, f"{what} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def claim(folder: Path, create: bool) -> bool:
    """Make sure root may write into ``folder`` (absolute); False when it is missing and
    ``create`` is false.

    Every folder from ``/`` down is opened relative to the one before (``O_NOFOLLOW``) and
    checked on the open descriptor: it must be root's and not writable by group or others,
    except that a folder above ``folder`` may be sticky (``/var/tmp``: others may add names
    there but not move root's).  A symlink on the way must be root's; its target is walked the
    same way.  A missing folder is made by root with ``mkdir`` when ``create`` (exclusive: one
    that appears meanwhile is checked like any other).  Raises :class:`SandboxError` naming the
    folder and its owner otherwise, before anything is written.
    """
    todo = list(folder.parts[1:])
    fd = _fsio.open_dir("/")
    where = "/"
    links = 0
    try:
        _check_folder(fd, where, folder, last=not todo)
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            made = False
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    return False
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            here = os.path.join(where, name)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0:
                    raise _refuse(folder, f"{here} is a symlink owned by {_owner(st.st_uid)}")
                links += 1
                if links > _MAX_LINKS:
                    raise _refuse(folder, f"{here}: too many symlinks on the way")
                target = os.readlink(name, dir_fd=fd)
                todo = list(Path(target).parts) + todo
                if target.startswith("/"):
                    todo.pop(0)
                    os.close(fd)
                    fd, where = _fsio.open_dir("/"), "/"
                continue
            try:
                opened = _fsio.open_dir(name, fd)
            except OSError as exc:
                raise _refuse(folder, f"{here} is not a folder ({exc.strerror})") from None
            os.close(fd)
            fd, where = opened, os.path.normpath(here)
            if not stat.S_ISDIR(st.st_mode):  # replaced between stat and open
                raise _refuse(folder, f"{here} changed while it was checked")
            if made:
                os.fchmod(fd, 0o755)  # whatever root's umask: jobs read the config below
            _check_folder(fd, where, folder, last=not todo)
    finally:
        os.close(fd)
    return True


def own_folder(path: Path, uid: int = 0, gid: int = 0, mode: int = 0o755) -> None:
    """Make ``path`` (whose parent is ours) a folder of ``uid``, mode ``mode``, or refuse one
    that someone else made.  World-traversable: jobs run as another user and read the config
    and the venv; munged refuses a socket folder that others can write to."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    try:
        fd = _fsio.open_dir(os.fspath(path))
    except OSError as exc:
        raise SandboxError(
            f"{path} is a symlink or not a folder ({exc.strerror}); refusing to "
            "write into it as root: remove it and run `dispatch-sandbox up` "
            "again"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (0, uid) or st.st_mode & 0o022:
            raise SandboxError(
                f"{path} is owned by {_owner(st.st_uid)} with mode "
                f"{stat.S_IMODE(st.st_mode):o}, not root's and closed to others: another user "
                "could have planted links there; refusing to write into it as root (remove it "
                "and run `dispatch-sandbox up` again)"
            )
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def append(path: Path) -> Any:
    """``path`` opened for appending bytes, never through a symlink."""
    fd = _fsio.create_new(os.fspath(path), 0o644, exclusive=False)
    # _fsio opens no file for appending: O_APPEND is set on the open descriptor, before any write.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return os.fdopen(fd, "ab")


def read_own(path: Path) -> Optional[str]:
    """The text of the regular file ``path``, or None when it is missing or a symlink."""
    try:
        fd = _fsio.open_file(os.fspath(path))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode(errors="replace")


@contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold ``lock_file`` (made when missing, never through a symlink) exclusively: one root
    verb at a time changes a state folder (``layout.lock_file``) or builds a Debian root."""
    fd = _fsio.create_new(os.fspath(lock_file), 0o644, exclusive=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def create_once(path: Path, data: bytes, mode: int, uid: int = 0, gid: int = 0) -> None:
    """Make ``path`` holding ``data``, owned by ``uid``:``gid`` with ``mode``; an existing name
    (a symlink included) is FileExistsError, never opened."""
    fd = _fsio.create_new(os.fspath(path), mode)
    try:
        _fsio.write_all(fd, data, os.fspath(path))
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` by a file holding ``text``: written under a fresh name (mkstemp:
    O_EXCL|O_NOFOLLOW) in the same folder, then renamed over it; a symlink in place of either
    is replaced, never written through."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` unless it holds it already (a symlink never does)."""
    if read_own(path) == text:
        return False
    write_text(path, text, mode)
    return True


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, headed by its path, for an error message ("" when
    it is missing or empty)."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    if not text:
        return ""
    return f"--- {path} (last {len(text)} lines)\n" + "\n".join(text) + "\n"


def mounts_under(folder: Path) -> list[Path]:
    """The mount points at or under ``folder`` (from ``/proc/self/mountinfo``)."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            # Field 5 is the mount point, its spaces and the like written as octal escapes.
            point = Path(line.split()[4].encode().decode("unicode_escape"))
            if point == folder or folder in point.parents:
                found.append(point)
    return found


def delete_folder(folder: Path) -> str:
    """Remove ``folder`` and everything in it, never through a symlink: the folder itself must
    not be one, a link in it is removed, not followed (``shutil.rmtree`` on descriptors), and
    a folder with a mount in it is refused (its files are another file system's).  Returns
    what it removed."""
    if not shutil.rmtree.avoids_symlink_attacks:
        raise SandboxError(f"this platform's rmtree may follow a link: not removing {folder}")
    mounts = mounts_under(folder)
    if mounts:
        raise SandboxError(
            f"{mounts[0]} is mounted in {folder}: unmount it first; nothing was removed"
        )
    count = size = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            count += 1
            with suppress(OSError):
                size += os.lstat(os.path.join(dirpath, name)).st_size
    shutil.rmtree(folder)
    return f"removed {folder} ({count} files and folders, {size / 2**20:.0f} MiB)"
