"""The POSIX publication store: ``publish``, ``latest`` and ``list_publications`` on ``pub/``.

:class:`PosixStore` is the :class:`~.base.Store` for a root that is a local or shared file
system folder; the module functions are its body.  Invariants kept here (the seed's rules):

* A publication is an empty file created with ``O_CREAT|O_EXCL``; ``pub/`` and the root are
  fsynced before :func:`publish` returns.  Nothing here renames, rewrites or appends; only
  cleanup's methods (``delete_publication``, ``remove_save``, ``remove_exec``) delete, and
  they never follow a symlink: a path with a symlink on its way is refused, a symlink inside
  a removed folder is removed itself, never what it points to.
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
import time
from typing import Optional

from ... import _fsio
from ...errors import AlreadyPublished, OutsideRoot, StoreError, StoreFull
from .. import model
from .base import (
    EXEC,
    GC,
    MANIFEST_SUFFIX,
    PUB,
    Found,
    StillWritten,
    Store,
    check_names,
    mark_part,
)

__all__ = [
    "PosixStore",
    "publish",
    "latest",
    "list_publications",
    "Found",
    "PUB",
    "EXEC",
    "what_stands",
]


def what_stands(path: str) -> Optional[str]:
    """What stands at ``path`` where a folder should be, in words ('a file, not a folder', 'a
    symlink to '/scratch/u', which is not there'), or None where it is a folder or nothing.
    A symlink to a folder that is not there (a file system not mounted) is no file."""
    try:
        target = os.readlink(path)
    except OSError:
        target = None
    if target is not None and not os.path.exists(path):
        return (
            f"a symlink to {target!r}, which is not there (a file system not mounted, or "
            "a folder removed?)"
        )
    if os.path.lexists(path) and not os.path.isdir(path):
        return (
            f"a symlink to {target!r}, a file, not a folder"
            if target is not None
            else "a file, not a folder"
        )
    return None


def _not_a_root(given: str) -> StoreError:
    """The error for a root that is no folder, naming what is there instead."""
    what = what_stands(given)
    if what is not None:
        return StoreError(
            f"checkpoint root {given!r} is {what}: give the folder that holds pub/ and exec/"
        )
    return StoreError(f"checkpoint root {given!r} is not a directory")


def _open_pub_dir(pub_path: str, dir_fd: int | None = None) -> int:
    """Open ``pub/`` without following a symlink; FileNotFoundError passes through.

    With ``dir_fd`` (the open root), ``pub/`` is opened relative to it.
    """
    target = PUB if dir_fd is not None else pub_path
    try:
        return _fsio.open_dir(target, dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            if os.path.islink(pub_path):
                raise StoreError(f"pub/ {pub_path!r} is a symlink; refusing to follow it") from None
            root = os.path.dirname(pub_path)
            if not os.path.isdir(root):
                raise _not_a_root(root) from None
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
                fd = _fsio.create_new(name, 0o444, pub_fd)
            except FileExistsError:
                raise AlreadyPublished(
                    f"publication {name!r} already exists in {pub_path!r} "
                    f"(epoch {epoch}, step {step}, path {relative!r})"
                ) from None
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
        return _fsio.open_dir(root_abs, follow=True)  # the root may be a symlink
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise _not_a_root(given) from None
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
            raise OutsideRoot(
                f"save {given!r} resolves to {escape[0]!r}, outside the "
                f"checkpoint root {escape[1]!r}"
            )
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
                "the root leads out of it); refusing to return it"
            )


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
            raise _not_a_root(root) from None
        return []
    return _list_closing(fd, pub_path)


def _list_closing(fd: int, path: str) -> list[str]:
    """The names in the open folder ``fd`` (shown as ``path`` in errors); closes ``fd``."""
    try:
        return os.listdir(fd)
    except OSError as exc:
        raise StoreError(f"cannot list {path!r}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _found(root: str, publication: model.Publication, name: str) -> Found:
    return Found(
        publication.epoch,
        publication.step,
        name,
        os.path.join(os.path.abspath(root), publication.path),
    )


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


# --------------------------------------------------------------------------- cleanup's part

_ROUNDS = 5  # removals of a folder something still writes into, before it is an error


def _open_below(root_fd: int, parts: list[str], shown: str) -> Optional[int]:
    """Open the folder ``parts`` below the open root, never following a symlink; None when a
    part does not exist.  A symlink or a file on the way is a StoreError naming it."""
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = _fsio.open_dir(part, fd)
            except FileNotFoundError:
                os.close(fd)
                return None
            except OSError as exc:
                where = os.path.join(shown, *parts[: i + 1])
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StoreError(
                        f"{where!r} is a symlink or not a folder; cleanup never follows one"
                    ) from None
                raise StoreError(f"cannot open {where!r}: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _tree(parent_fd: int, name: str, shown: str, visit_dir: bool) -> tuple[int, list[str]]:
    """(bytes of every file, folders that cannot be emptied) of ``name`` in ``parent_fd``;
    symlinks count as themselves."""
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return 0, []
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, []
    total, stuck = 0, []
    try:
        fd = _fsio.open_dir(name, parent_fd)
    except FileNotFoundError:
        return 0, []
    except OSError as exc:
        return 0, [f"{shown} ({exc.strerror})"]
    if visit_dir and not os.access(
        name, os.W_OK | os.X_OK, dir_fd=parent_fd, follow_symlinks=False
    ):
        stuck.append(f"{shown} (no write permission)")
    try:
        for entry in os.scandir(fd):
            size, below = _tree(fd, entry.name, os.path.join(shown, entry.name), visit_dir)
            total += size
            stuck.extend(below)
    finally:
        os.close(fd)
    return total, stuck


def _remove(parent_fd: int, name: str, shown: str, last: tuple[str, ...] = ()) -> int:
    """Remove ``name`` (a file, a symlink or a whole folder) from ``parent_fd``; a folder's
    entries ``last`` go after every other one, in that order.  Returns the bytes of the
    files removed."""
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return 0
    try:
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return st.st_size
        fd = _fsio.open_dir(name, parent_fd)
        total = 0
        try:
            # A superseded execution may still be writing into its folder: what it adds
            # meanwhile is removed too, a few rounds at most.
            for round_ in range(_ROUNDS):
                names = sorted(entry.name for entry in os.scandir(fd))
                for child in [n for n in names if n not in last] + [n for n in last if n in names]:
                    total += _remove(fd, child, os.path.join(shown, child))
                try:
                    os.rmdir(name, dir_fd=parent_fd)
                    return total
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:
                        raise
                    if round_ == _ROUNDS - 1:
                        raise StillWritten(
                            f"{shown!r} is still being written into: left for the next cleanup"
                        ) from None
        finally:
            os.close(fd)
        raise AssertionError("unreachable")  # pragma: no cover
    except FileNotFoundError:
        return 0  # another cleanup removed it meanwhile
    except OSError as exc:
        raise StoreError(f"cannot remove {shown!r}: {exc.strerror}") from None


class _Cleanup:
    """The POSIX store's part for cleanup; mixed into :class:`PosixStore`."""

    root: str

    def _root_fd(self) -> int:
        return _open_root(os.path.abspath(self.root), self.root)

    def _at(self, relative: str) -> tuple[Optional[int], str, str]:
        """(open parent folder or None when absent, last part, the path as shown)."""
        parts = relative.split("/")
        shown = os.path.join(self.root, relative)
        root_fd = self._root_fd()
        try:
            return _open_below(root_fd, parts[:-1], self.root), parts[-1], shown
        finally:
            os.close(root_fd)

    def check_store(self) -> None:
        root_abs = os.path.abspath(self.root)
        os.close(_open_root(root_abs, self.root))
        if not any(os.path.lexists(os.path.join(root_abs, part)) for part in (PUB, EXEC)):
            raise StoreError(
                f"{self.root!r} is not a checkpoint root (it holds neither pub/ "
                "nor exec/); refusing to clean it"
            )

    def publication_names(self) -> list[str]:
        names = _names(self.root)
        check_names(names, os.path.join(self.root, PUB))
        return names

    def _entry(self, folder: str, name: str) -> str:
        return os.path.join(os.path.abspath(self.root), folder, name)

    def has_publication(self, name: str) -> bool:
        return os.path.lexists(self._entry(PUB, name))

    def _open_part(self, part: str) -> Optional[int]:
        """``pub/``, ``exec/`` or ``gc/`` opened without following a symlink (None: absent)."""
        root_fd = self._root_fd()
        try:
            return _open_below(root_fd, [part], self.root)
        finally:
            os.close(root_fd)

    def _unlink_synced(self, folder: str, names: list[str]) -> None:
        path = os.path.join(os.path.abspath(self.root), folder)
        fd = self._open_part(folder)
        if fd is None:
            return
        try:
            for name in names:
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass  # another cleanup removed it
                except OSError as exc:
                    raise StoreError(
                        f"cannot remove {os.path.join(path, name)!r}: {exc.strerror}"
                    ) from None
            _fsync_dir(fd, path)  # one sync makes every removal above durable
        finally:
            os.close(fd)

    def delete_publications(self, names: list[str]) -> None:
        self._unlink_synced(PUB, names)

    def list_exec(self) -> list[str]:
        path = os.path.join(os.path.abspath(self.root), EXEC)
        fd = self._open_part(EXEC)
        if fd is None:
            return []
        return _list_closing(fd, path)

    def read_exec_file(self, attempt: str, name: str) -> Optional[bytes]:
        parent, last, shown = self._at(f"{EXEC}/{attempt}/{name}")
        if parent is None:
            return None
        try:
            fd = _fsio.open_file(last, parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {shown!r}: {exc.strerror}") from None
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as handle:
            return handle.read()

    def create_exec_file(self, attempt: str, name: str, data: bytes) -> None:
        """Created whole or not at all: written to a temporary name, synced, then linked into
        place (``link`` fails when the name exists), so a reader never sees it empty."""
        path = os.path.join(os.path.abspath(self.root), EXEC, attempt, name)
        temporary = f"{path}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        _fsio.write_new(temporary, data, 0o444)
        try:
            os.link(temporary, path, follow_symlinks=False)
        finally:
            os.unlink(temporary)
        fd = _fsio.open_dir(os.path.dirname(path))
        try:
            _fsync_dir(fd, os.path.dirname(path))
        finally:
            os.close(fd)

    def exists(self, relative: str) -> bool:
        parent, last, _shown = self._at(relative)
        if parent is None:
            return False
        try:
            os.lstat(last, dir_fd=parent)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(parent)

    def size(self, relative: str) -> int:
        parent, last, shown = self._at(relative)
        if parent is None:
            return 0
        try:
            total = _tree(parent, last, shown, visit_dir=False)[0]
            if not last.endswith(MANIFEST_SUFFIX):
                total += _tree(parent, last + MANIFEST_SUFFIX, shown, visit_dir=False)[0]
            return total
        finally:
            os.close(parent)

    def check_removable(self, relative: str) -> None:
        parent, last, shown = self._at(relative)
        if parent is None:
            return
        try:
            try:
                os.lstat(last, dir_fd=parent)
            except FileNotFoundError:
                return
            stuck = (
                []
                if os.access(".", os.W_OK | os.X_OK, dir_fd=parent)
                else [f"{os.path.dirname(shown)} (no write permission)"]
            )
            stuck += _tree(parent, last, shown, visit_dir=True)[1]
        finally:
            os.close(parent)
        if stuck:
            raise StoreError(
                f"cannot remove {shown!r}: {stuck[0]}"
                + (f" and {len(stuck) - 1} more" if len(stuck) > 1 else "")
                + "; nothing was removed"
            )

    def remove_save(self, relative: str) -> int:
        parent, last, shown = self._at(relative)
        if parent is None:
            return 0
        try:
            freed = _remove(parent, last, shown)
            if not last.endswith(MANIFEST_SUFFIX):
                freed += _remove(parent, last + MANIFEST_SUFFIX, shown + MANIFEST_SUFFIX)
            _fsync_dir(parent, os.path.dirname(shown))
            return freed
        finally:
            os.close(parent)

    def remove_exec(self, attempt: str, record: str, mark: str = "") -> int:
        parent, last, shown = self._at(f"{EXEC}/{attempt}")
        if parent is None:
            return 0
        try:
            freed = _remove(parent, last, shown, last=(mark, record) if mark else (record,))
            _fsync_dir(parent, os.path.dirname(shown))
            return freed
        finally:
            os.close(parent)

    def list_intents(self) -> list[str]:
        path = os.path.join(os.path.abspath(self.root), GC)
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {path!r}: {exc.strerror}") from None

    def create_intents(self, names: list[str]) -> None:
        self._create_entries(GC, names, exclusive=False)

    def _create_entries(self, part: str, names: list[str], exclusive: bool) -> list[str]:
        """Create the empty entries ``names`` in ``part`` (made when absent), durably; with
        ``exclusive``, an entry already there is not made again.  Returns those made."""
        root_fd = self._root_fd()
        path = os.path.join(os.path.abspath(self.root), part)
        made = []
        try:
            try:
                os.mkdir(part, 0o755, dir_fd=root_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                _raise_write_error(exc, path)
            fd = _open_below(root_fd, [part], self.root)
            assert fd is not None
            try:
                for name in names:
                    try:
                        os.close(_fsio.create_new(name, 0o444, fd, exclusive=exclusive))
                        made.append(name)
                    except FileExistsError:
                        continue
                    except OSError as exc:
                        _raise_write_error(exc, os.path.join(path, name))
                _fsync_dir(fd, path)
            finally:
                os.close(fd)
            _fsync_dir(root_fd, self.root)
        finally:
            os.close(root_fd)
        return made

    def delete_intents(self, names: list[str]) -> None:
        self._unlink_synced(GC, names)

    def list_marks(self, part: str) -> list[str]:
        fd = self._open_part(mark_part(part))
        if fd is None:
            return []
        return _list_closing(fd, os.path.join(os.path.abspath(self.root), part))

    def create_mark(self, part: str, entry: str) -> bool:
        return bool(self._create_entries(mark_part(part), [entry], exclusive=True))

    def delete_mark(self, part: str, entry: str) -> bool:
        if not os.path.lexists(self._entry(mark_part(part), entry)):
            return False
        self._unlink_synced(part, [entry])
        return True

    def list_exec_entries(self, attempt: str, inside: str = "") -> list[str]:
        root_fd = self._root_fd()
        try:
            fd = _open_below(
                root_fd, [EXEC, attempt, *[p for p in inside.split("/") if p]], self.root
            )
        finally:
            os.close(root_fd)
        if fd is None:
            return []
        try:
            with os.scandir(fd) as entries:
                return [
                    e.name + "/" if e.is_dir(follow_symlinks=False) else e.name for e in entries
                ]
        finally:
            os.close(fd)

    def resolve(self, relative: str) -> list[str]:
        root_abs = os.path.abspath(self.root)
        real_root = os.path.realpath(root_abs)
        found: list[str] = []

        def inside(path: str) -> Optional[str]:
            real = os.path.normpath(path)
            if not real.startswith(real_root.rstrip("/") + "/"):
                return None
            return os.path.relpath(real, real_root).replace(os.sep, "/")

        # Each hop of a symlink on the way: the link's text, read one component at a time.
        current, hops = relative, 0
        while hops < 40:
            parts = current.split("/")
            for i in range(1, len(parts) + 1):
                here = os.path.join(real_root, *parts[:i])
                if os.path.islink(here):
                    target = os.path.join(os.path.dirname(here), os.readlink(here))
                    nxt = inside(os.path.join(target, *parts[i:]))
                    if nxt is None:
                        return found
                    found.append(nxt)
                    current, hops = nxt, hops + 1
                    break
            else:
                break
        # Symlinks inside the save (a folder): each one's target is needed too.
        real = os.path.join(real_root, current)
        if os.path.isdir(real) and not os.path.islink(real):
            for folder, dirs, files in os.walk(real):
                for name in dirs + files:
                    full = os.path.join(folder, name)
                    if os.path.islink(full):
                        led = inside(os.path.join(folder, os.readlink(full)))
                        if led is not None:
                            found.append(led)
        return found


class PosixStore(_Cleanup, Store):
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
