"""What every publication store is: the interface, the value it returns, the name check.

A store holds a checkpoint root's publications in ``<root>/pub/``, one empty entry per
publication, created once or not at all, never renamed, rewritten or deleted; the latest save
is the greatest name.  :class:`Store` is what the POSIX store (:mod:`.posix`) and the S3 store
(:mod:`.s3`) both implement, and all the callers above them (the CLI, the launcher, ``watch``,
``status``) use.

Invariant kept here: :func:`check_names` refuses a listing that holds any entry that is not a
publication name (one scan, at C speed), naming the first bad entry; nothing is ever skipped,
because a skipped entry could be the latest one.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from .. import model
from ..errors import BadPublicationName, OutOfBounds

PUB = "pub"
EXEC = "exec"
S3_SCHEME = "s3://"

# One scan over all names joined by newlines checks every name's shape at C speed; the
# base32 length rule is then checked once per distinct length, and the epoch once per
# distinct epoch (a single character-class repeat is several times faster in CPython's
# regex engine than the grouped length rule of model.NAME_PATTERN).
_ALL_NAMES_RE = re.compile(r"(?:[0-9]{20}-[0-9]{20}-[A-Z2-7]+\n)*")
_B32_TAIL_LENGTHS = frozenset({0, 2, 4, 5, 7})


@dataclass(frozen=True)
class Found:
    """A publication as read from a store: its parts, its name and where the save is
    (an absolute path on POSIX, an ``s3://bucket/key`` URL on S3)."""

    epoch: int
    step: int
    name: str
    path: str

    def as_json(self) -> dict[str, object]:
        return {"epoch": self.epoch, "step": self.step, "path": self.path, "name": self.name}


class Store(abc.ABC):
    """One checkpoint root's publications.  ``root`` is the root as the user spelled it."""

    root: str

    @abc.abstractmethod
    def publish(self, epoch: int, step: int, path: str) -> str:
        """Create the publication of the save at ``path`` (inside the root); return its name.

        Raises :class:`~slurm_dispatch.errors.AlreadyPublished` when the name exists."""

    @abc.abstractmethod
    def latest(self) -> Optional[Found]:
        """The publication with the greatest name, or None when there is none."""

    @abc.abstractmethod
    def list_publications(self) -> list[Found]:
        """Every publication, oldest first (the order of :meth:`latest`)."""

    @abc.abstractmethod
    def exec_dir(self, attempt: str) -> str:
        """Where the execution ``attempt`` writes its saves (a path or an ``s3://`` URL)."""

    @abc.abstractmethod
    def locate(self, relative: str) -> str:
        """The save at ``relative`` (a normal path under the root) as a path or URL."""


def is_s3_root(root: str) -> bool:
    """True for an ``s3://`` root (the scheme in any case)."""
    return root[:len(S3_SCHEME)].lower() == S3_SCHEME


def _epochs_valid(epochs: Iterable[str]) -> bool:
    try:
        for epoch in epochs:
            model.check_epoch_value(int(epoch))
    except (OutOfBounds, ValueError):
        return False
    return True


def _first_bad(names: list[str]) -> str:
    for name in names:
        if not model.is_name(name) or not _epochs_valid({name[:20]}):
            return name
    raise AssertionError("no bad name found")  # pragma: no cover - caller saw one


def check_names(names: list[str], where: str) -> None:
    """Refuse ``names`` (the entries of ``where``) unless every one has a publication's shape."""
    if not names:
        return
    joined = "\n".join(names) + "\n"
    if (_ALL_NAMES_RE.fullmatch(joined) is None or joined.count("\n") != len(names)
            or any((length - 42) % 8 not in _B32_TAIL_LENGTHS
                   for length in set(map(len, names)))
            or not _epochs_valid({name[:20] for name in names})):
        bad = _first_bad(names)
        raise BadPublicationName(
            f"{bad!r} in {where!r} is not a publication name "
            "(expected <epoch, 20 digits>-<step, 20 digits>-<base32 path>); "
            "refusing to guess the latest save past it")


def found_latest(store: Store, names: list[str], where: str) -> Optional[Found]:
    """The :class:`Found` of the greatest of ``names`` after checking every one's shape."""
    if not names:
        return None
    check_names(names, where)
    name = max(names)
    publication = model.parse_name(name)
    return Found(publication.epoch, publication.step, name, store.locate(publication.path))


def found_all(store: Store, names: list[str]) -> list[Found]:
    """Every one of ``names`` parsed (a bad one is an error naming it), oldest first."""
    out = []
    for name in sorted(names):
        publication = model.parse_name(name)
        out.append(Found(publication.epoch, publication.step, name,
                         store.locate(publication.path)))
    return out
