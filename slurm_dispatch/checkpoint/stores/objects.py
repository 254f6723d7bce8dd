"""What every object store does the same way above its own requests: a remote root that is a
prefix of keys in a bucket (S3's bucket, Azure Blob's container), its saves the keys under it.

:func:`split_root` reads ``scheme://bucket/prefix``; :class:`ObjectStore` is a
:class:`~.base.RemoteStore` whose URLs, listings of publications, executions, intents and
marks, and cleanup's removals are written once here in terms of two requests each store
makes its own way: :meth:`ObjectStore._objects` (a listing) and
:meth:`ObjectStore._delete_keys`.  Nothing here makes a request or imports an SDK.

Invariant kept here: a save is every key equal to its path or under it as a folder, plus its
manifest beside it; an execution folder's record is removed last, its cleanup mark just before.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Optional

from ...errors import AlreadyPublished, OutsideRoot, UsageError
from .. import model
from .base import (
    EXEC,
    GC,
    MANIFEST_SUFFIX,
    PUB,
    Found,
    RemoteStore,
    check_names,
    found_all,
    found_latest,
    mark_part,
)


@dataclass(frozen=True)
class ObjectRoot:
    """A parsed ``scheme://bucket/prefix`` root (the bucket: S3's bucket, Azure's container);
    ``prefix`` has no slash at either end.  A store's own subclass names its ``scheme``."""

    bucket: str
    prefix: str
    scheme: ClassVar[str] = ""

    @property
    def url(self) -> str:
        base = f"{self.scheme}{self.bucket}"
        return f"{base}/{self.prefix}" if self.prefix else base

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative


# What a publish that ran past its deadline says: the server may have applied the create.
PUBLISH_UNFINISHED = "whether it was published is unknown (`dispatch list` shows)"


def refused(status: Optional[int]) -> bool:
    """Whether a request's last answer refused it (a 4xx: the same request was refused on
    every try); a 5xx or no answer at all, after the SDK's retries, leaves unknown whether
    an earlier try, its answer lost, was applied."""
    return status is not None and 400 <= status < 500


def already_published(
    url: str, what: str, whose: Optional[str], token: str
) -> Optional[AlreadyPublished]:
    """The error of a create-once publication that met the conflict, or None where it holds
    this call's ``token`` (the create was applied, its answer lost, the SDK's retry met the
    conflict: published).  ``whose`` is the token read from it ("" for none), None where it
    could not be read."""
    if whose == token:
        return None
    return AlreadyPublished(
        f"publication {url!r} already exists {what}: "
        + (
            "published before this call"
            if whose is not None
            else "published before this call, or by it with the answer lost (its owner could "
            "not be read)"
        )
    )


def split_root(root: str, scheme: str, holder: str) -> tuple[str, str]:
    """``scheme://<holder>/prefix`` split into the holder (a bucket, a container) and the
    prefix, which has no slash at either end; a root whose keys would not be one clean prefix
    is refused."""
    if root[: len(scheme)].lower() != scheme:
        raise UsageError(f"checkpoint root {root!r} is not an {scheme} URL")
    bucket, _, prefix = root[len(scheme) :].partition("/")
    prefix = prefix.rstrip("/")
    if not bucket:
        raise UsageError(
            f"checkpoint root {root!r} names no {holder} (expected {scheme}{holder}/prefix)"
        )
    if prefix:
        try:
            clean = model.normalize_relative(prefix)
        except OutsideRoot as exc:
            raise UsageError(f"checkpoint root {root!r}: {exc}") from None
        if clean != prefix:
            raise UsageError(
                f"checkpoint root {root!r}: the prefix {prefix!r} is not in normal "
                f"form (expected {clean!r}: no empty, '.' or '..' parts)"
            )
    return bucket, prefix


class ObjectStore(RemoteStore):
    """A remote root of keys under ``where.prefix``; ``pub_prefix`` is its ``pub/`` keys'."""

    where: ObjectRoot
    pub_prefix: str

    def __init__(self, root: str, timeout: float) -> None:
        if not timeout > 0:
            raise UsageError(f"timeout {timeout!r} must be more than 0 seconds")
        self.root = root
        self.where = self._parse(root)
        self._refuse_without_sdk(False)
        self.timeout = float(timeout)
        self.pub_prefix = self.where.key(PUB) + "/"

    @classmethod
    def checked_root(cls, root: str) -> str:
        cls._refuse_without_sdk(True)
        return cls._parse(root).url

    @staticmethod
    @abc.abstractmethod
    def _parse(root: str) -> ObjectRoot:
        """The root split (:func:`split_root`), as the store's own :class:`ObjectRoot`."""

    @staticmethod
    @abc.abstractmethod
    def _refuse_without_sdk(quick: bool) -> None:
        """A StoreError naming the extra where the store's SDK is missing (``quick``: only
        look for it, do not import it)."""

    def key(self, relative: str) -> str:
        return self.where.key(relative)

    def _url(self, key: str) -> str:
        """The URL of ``key`` (in the root's bucket)."""
        return f"{self.where.scheme}{self.where.bucket}/{key}"

    @abc.abstractmethod
    def _objects(self, prefix: str, delimiter: str = "") -> list[tuple[str, int]]:
        """(key, size) of every object under ``prefix``, one scan against the deadline; with a
        ``delimiter``, the common prefixes too (size -1)."""

    @abc.abstractmethod
    def _delete_keys(self, keys: list[str]) -> None:
        """Remove ``keys`` (absent ones are fine); a refused one is an error naming it."""

    def _names(self) -> list[str]:
        """Every name under ``pub/`` (the folder marker ``pub/`` itself is none)."""
        cut = len(self.pub_prefix)
        return [key[cut:] for key, _size in self._objects(self.pub_prefix) if key[cut:]]

    # The interface ----------------------------------------------------------

    def latest(self) -> Optional[Found]:
        return found_latest(self, self._names(), self._url(self.pub_prefix))

    def list_publications(self) -> list[Found]:
        return found_all(self, self._names())

    def exec_dir(self, attempt: str) -> str:
        return f"{self.where.url}/{EXEC}/{model.check_attempt(attempt)}"

    def locate(self, relative: str) -> str:
        return f"{self.where.url}/{relative}"

    def relative(self, path: str) -> str:
        base = self.where.url + "/"
        if not path.startswith(base) or path == base:
            raise OutsideRoot(
                f"save {path!r} is not inside the checkpoint root "
                f"{self.where.url!r} (an {self.where.scheme} URL under it is expected)"
            )
        rest = path[len(base) :].rstrip("/")
        relative = model.normalize_relative(rest)
        if relative != rest:
            raise OutsideRoot(f"save {path!r} is not in normal form (expected {base + relative!r})")
        return relative

    # Cleanup's part ------------------------------------------------------------

    def publication_names(self) -> list[str]:
        names = self._names()
        check_names(names, self._url(self.pub_prefix))
        return names

    def delete_publications(self, names: list[str]) -> None:
        self._delete_keys([self.pub_prefix + name for name in names])

    def list_exec(self) -> list[str]:
        prefix = self.key(EXEC) + "/"
        return [
            key[len(prefix) :].rstrip("/") for key, size in self._objects(prefix, "/") if size == -1
        ]

    def _save_objects(self, relative: str) -> list[tuple[str, int]]:
        key = self.key(relative)
        wanted = {key, key + MANIFEST_SUFFIX}
        return [
            (k, size) for k, size in self._objects(key) if k in wanted or k.startswith(key + "/")
        ]

    def size(self, relative: str) -> int:
        return sum(size for _key, size in self._save_objects(relative))

    def check_removable(self, relative: str) -> None:
        return None  # an object store answers only the delete itself

    def remove_save(self, relative: str) -> int:
        found = self._save_objects(relative)
        self._delete_keys([key for key, _size in found])
        return sum(size for _key, size in found)

    def remove_exec(self, attempt: str, record: str, mark: str = "") -> int:
        prefix = self.key(f"{EXEC}/{attempt}") + "/"
        found = list(self._objects(prefix))
        last = [prefix + name for name in (mark, record) if name]
        self._delete_keys([key for key, _size in found if key not in last])
        for one in last:
            self._delete_keys([key for key, _size in found if key == one])
        return sum(size for _key, size in found)

    def _entries(self, part: str) -> list[str]:
        prefix = self.key(part) + "/"
        return [key[len(prefix) :] for key, _size in self._objects(prefix) if key != prefix]

    def list_intents(self) -> list[str]:
        return self._entries(GC)

    def delete_intents(self, names: list[str]) -> None:
        self._delete_keys([self.key(f"{GC}/{name}") for name in names])

    def list_marks(self, part: str) -> list[str]:
        return self._entries(mark_part(part))

    def delete_mark(self, part: str, entry: str) -> bool:
        key = self.key(f"{mark_part(part)}/{entry}")
        there = any(k == key for k, _size in self._objects(key))
        if there:
            self._delete_keys([key])
        return there

    def list_exec_entries(self, attempt: str, inside: str = "") -> list[str]:
        prefix = self.key(f"{EXEC}/{attempt}" + (f"/{inside}" if inside else "")) + "/"
        return [key[len(prefix) :] for key, _size in self._objects(prefix, "/") if key != prefix]
