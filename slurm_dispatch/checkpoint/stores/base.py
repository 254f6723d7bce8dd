"""What every publication store is: the interface, the value it returns, the name check.

A store holds a checkpoint root's publications in ``<root>/pub/``, one empty entry per
publication, created once or not at all, never renamed or rewritten; the latest save is the
greatest name.  :class:`Store` is what the POSIX store (:mod:`.posix`) and the S3 store
(:mod:`.s3`) both implement, and all the callers above them (the CLI, the launcher, ``watch``,
``status``, ``gc``) use.

The one operation that removes anything is cleanup (:mod:`slurm_dispatch.checkpoint.gc`, through the
``*_exec``, ``*_save``, ``*_publication`` and ``*_intent`` methods below): it removes only
publications below the K latest, each before its save, and records its intent in
``<root>/gc/`` first so that a rerun finishes what a killed run began.  The seed's guarantees
still hold: a name is never renamed or rewritten (it exists whole, or not at all), and
``latest`` is still the greatest name by listing, without a lock, because the greatest name
is never removed (K is at least 1).

Invariant kept here: :func:`check_names` refuses a listing that holds any entry that is not a
publication name (one scan, at C speed), naming the first bad entry; nothing is ever skipped,
because a skipped entry could be the latest one.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from ...errors import BadPublicationName, OutOfBounds, StoreError
from .. import execdir, model

PUB = "pub"
EXEC = "exec"
GC = "gc"  # cleanup's intents: one empty entry per publication being removed
PINS = "pins"  # pinned saves: one empty entry per save, named by its path in base32
QUARANTINE = "quarantine"  # quarantined saves (checkpoint/quarantine.py), named as pins are
MARKS = (PINS, QUARANTINE)  # the parts of create-once marks on saves


def mark_part(part: str) -> str:
    """``part`` when it is a part of marks (:data:`MARKS`); no other name reaches a path."""
    if part not in MARKS:
        raise ValueError(f"{part!r} is not a part of marks ({', '.join(MARKS)})")
    return part


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

    @classmethod
    def checked_root(cls, root: str) -> str:
        """A remote root in normal form, checked for its shape (and for its SDK's presence,
        without importing it) and never asked: what ``dispatch-sbatch`` records."""
        raise NotImplementedError(f"a {cls.__name__} root is a folder, not a URL")

    @abc.abstractmethod
    def exec_dir(self, attempt: str) -> str:
        """Where the execution ``attempt`` writes its saves (a path or an ``s3://`` URL)."""

    @abc.abstractmethod
    def locate(self, relative: str) -> str:
        """The save at ``relative`` (a normal path under the root) as a path or URL."""

    # What cleanup (gc) needs.  Nothing else calls the removing methods. -------------------

    @abc.abstractmethod
    def check_store(self) -> None:
        """Raise StoreError naming the root unless it is a checkpoint root (it holds
        ``pub/`` or ``exec/``): cleanup never removes anything under another folder."""

    @abc.abstractmethod
    def publication_names(self) -> list[str]:
        """Every name in ``pub/``, each checked (:func:`check_names`), in no order."""

    @abc.abstractmethod
    def has_publication(self, name: str) -> bool:
        """Whether the publication ``name`` is in ``pub/`` now."""

    @abc.abstractmethod
    def delete_publications(self, names: list[str]) -> None:
        """Remove the publications ``names`` (absent ones are fine); durable when this
        returns."""

    @abc.abstractmethod
    def list_exec(self) -> list[str]:
        """The names of the execution folders under ``exec/``, in no order."""

    @abc.abstractmethod
    def read_exec_file(self, attempt: str, name: str) -> Optional[bytes]:
        """The bytes of ``exec/<attempt>/<name>``, or None when it does not exist."""

    @abc.abstractmethod
    def create_exec_file(self, attempt: str, name: str, data: bytes) -> None:
        """Create ``exec/<attempt>/<name>`` once with ``data`` (FileExistsError if it is
        there); durable when this returns."""

    @abc.abstractmethod
    def exists(self, relative: str) -> bool:
        """Whether anything is at ``relative`` (on S3: a key equal to it or under it; a
        "folder" whose objects are all gone is not there, whatever a listing says)."""

    @abc.abstractmethod
    def size(self, relative: str) -> int:
        """Bytes of every file of the save or folder at ``relative`` (0 when absent)."""

    @abc.abstractmethod
    def check_removable(self, relative: str) -> None:
        """Raise StoreError naming the first part of ``relative`` (a save or an execution
        folder) that cannot be removed, before anything is; nothing is changed."""

    @abc.abstractmethod
    def remove_save(self, relative: str) -> int:
        """Remove the save at ``relative`` (a folder, or a file and its manifest beside it);
        return the bytes freed (0 when it was gone)."""

    @abc.abstractmethod
    def remove_exec(self, attempt: str, record: str, mark: str = "") -> int:
        """Remove the folder ``exec/<attempt>/``, its ``record`` file last (so a killed
        removal leaves a folder that still says whose it is), and its ``mark`` (cleanup's,
        that the folder is being removed) just before it; return the bytes freed."""

    @abc.abstractmethod
    def list_intents(self) -> list[str]:
        """The publication names in ``gc/``: removals a cleanup began."""

    @abc.abstractmethod
    def create_intents(self, names: list[str]) -> None:
        """Record, durably, that the publications ``names`` and their saves are being
        removed (an intent that exists already is fine)."""

    @abc.abstractmethod
    def delete_intents(self, names: list[str]) -> None:
        """Forget finished removals (absent ones are fine)."""

    # Pins, what an execution folder holds, and symlinks (cleanup's view of what is needed).

    @abc.abstractmethod
    def list_marks(self, part: str) -> list[str]:
        """The entries of a mark part (``pins/``, ``quarantine/``: :data:`MARKS`), each a
        save's path in base32, in no order."""

    @abc.abstractmethod
    def create_mark(self, part: str, entry: str) -> bool:
        """Create ``<part>/<entry>`` durably, once; False when it was there already."""

    @abc.abstractmethod
    def delete_mark(self, part: str, entry: str) -> bool:
        """Remove ``<part>/<entry>`` durably; False when it was not there."""

    def list_pins(self) -> list[str]:
        """The entries of ``pins/`` (each a save's path in base32), in no order."""
        return self.list_marks(PINS)

    def create_pin(self, entry: str) -> bool:
        """Pin: create ``pins/<entry>`` durably; False when it was there already."""
        return self.create_mark(PINS, entry)

    def delete_pin(self, entry: str) -> bool:
        """Unpin: remove ``pins/<entry>`` durably; False when it was not there."""
        return self.delete_mark(PINS, entry)

    @abc.abstractmethod
    def list_exec_entries(self, attempt: str, inside: str = "") -> list[str]:
        """The names directly in ``exec/<attempt>/`` (or its folder ``inside``), a folder's
        with a trailing ``/``."""

    def exec_entries(self) -> dict[str, list[str]]:
        """Every execution folder with the names directly in it (see
        :meth:`list_exec_entries`); a folder that holds nothing is left out."""
        out = {}
        for attempt in self.list_exec():
            entries = self.list_exec_entries(attempt)
            if entries:
                out[attempt] = entries
        return out

    def resolve(self, relative: str) -> list[str]:
        """What the save at ``relative`` needs besides itself because of symlinks (paths
        relative to the root, inside it): each hop of a symlink on its way, and the target of
        each symlink inside it.  Empty for a store without symlinks."""
        return []


class RemoteStore(Store):
    """A store of a remote root (a row of the table of stores with ``remote``): its saves are
    URLs under the root, uploaded from a staging folder."""

    @abc.abstractmethod
    def relative(self, path: str) -> str:
        """The save's path under the root; ``path`` must be a URL inside it (OutsideRoot
        otherwise)."""


# The sibling a framework integration writes beside a file save (checkpoint/execdir.py).
MANIFEST_SUFFIX = execdir.MANIFEST_SUFFIX


def is_s3_root(root: str) -> bool:
    """True for an ``s3://`` root (the scheme in any case)."""
    return root[: len(S3_SCHEME)].lower() == S3_SCHEME


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
    if (
        _ALL_NAMES_RE.fullmatch(joined) is None
        or joined.count("\n") != len(names)
        or any((length - 42) % 8 not in _B32_TAIL_LENGTHS for length in set(map(len, names)))
        or not _epochs_valid({name[:20] for name in names})
    ):
        bad = _first_bad(names)
        raise BadPublicationName(
            f"{bad!r} in {where!r} is not a publication name "
            "(expected <epoch, 20 digits>-<step, 20 digits>-<base32 path>); "
            "refusing to guess the latest save past it"
        )


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
        out.append(Found(publication.epoch, publication.step, name, store.locate(publication.path)))
    return out


class StillWritten(StoreError):
    """A folder something kept writing into while cleanup removed it (an old execution still
    running): what it held is gone, the folder itself is left for a later cleanup."""
