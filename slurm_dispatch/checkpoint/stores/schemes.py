"""The table of stores a root may name by a ``scheme://`` prefix: which class serves it, the
extra a user installs for it, and whether it is remote (its saves are written to a local
staging folder and uploaded, never written in place).

Everything that asks "which store is this root?" reads :data:`SCHEMES`: :func:`~.open.open_store`,
the root checks and their error messages, and every side that must treat a remote root apart
(the launcher, ``dispatch watch``, ``status``).  A root with no row here is a folder.  Adding a
store is a row here and its module beside this one; the row names its class by module and name,
so reading the table imports no store (and so no SDK such as boto3).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .base import Store


@dataclass(frozen=True)
class Scheme:
    """One row: ``prefix`` (``s3://``, lower case) and what serves it."""

    prefix: str
    module: str  # the store's module under checkpoint/stores/
    cls: str  # its Store class there, made as cls(root, timeout)
    extra: str  # the extra of slurm-dispatch a user installs for it
    label: str  # how people name it in messages ("S3")
    example: str  # a root of this kind, as the messages show one
    remote: bool = True  # saves are staged locally, then uploaded (not written in place)
    transfers: str = ""  # the module of its transfers (stores/remote.py); empty: ``module``

    @property
    def name(self) -> str:
        return self.prefix[: -len("://")]

    def matches(self, root: str) -> bool:
        """True for a root with this prefix (the scheme in any case)."""
        return root[: len(self.prefix)].lower() == self.prefix

    def store_class(self) -> type[Store]:
        """The class, imported now (and with it the store's SDK)."""
        found: type[Store] = getattr(
            importlib.import_module(f"{__package__}.{self.module}"), self.cls
        )
        return found


SCHEMES: tuple[Scheme, ...] = (
    Scheme(
        prefix="s3://",
        module="s3",
        cls="S3Store",
        extra="s3",
        label="S3",
        example="s3://bucket/prefix",
        transfers="transfer",
    ),
    Scheme(
        prefix="az://",
        module="azure",
        cls="AzureStore",
        extra="azure",
        label="Azure Blob",
        example="az://container/prefix",
    ),
)


def scheme_of(root: str) -> Optional[Scheme]:
    """The row of ``root``'s store; None for a folder (or a scheme no store serves)."""
    for row in SCHEMES:
        if row.matches(root):
            return row
    return None


def label_of(root: str) -> str:
    """How messages name the store of ``root`` (a root or a URL under one): its row's label
    ("S3", "Azure Blob"), "the remote store" where no row serves it."""
    row = scheme_of(root)
    return row.label if row is not None else "the remote store"


def is_remote_root(root: str) -> bool:
    """True for a root whose store is remote: the execution's saves are staged on local disk
    and uploaded, and the root is never a local folder."""
    row = scheme_of(root)
    return row is not None and row.remote


def served() -> str:
    """The roots the stores serve, as messages list them: ``a folder or s3://bucket/prefix``."""
    return " or ".join(["a folder", *(row.example for row in SCHEMES)])
