"""The publication functions every caller uses: ``publish``, ``latest``, ``list_publications``.

Each opens the root's store (:func:`~slurm_dispatch.checkpoint.stores.open.open_store`: a folder,
or ``s3://bucket/prefix``) and asks it; the rules live in
:mod:`slurm_dispatch.checkpoint.stores`.  On a folder they behave exactly as the POSIX store
always has; ``timeout`` (seconds) bounds an S3 call or scan and defaults to
``$DISPATCH_STORE_TIMEOUT``, then ``StoreTimeout`` in dispatch.conf, then 60.

``publish`` raises ``AlreadyPublished`` when the name was there before the call (on S3, not
when it was the call's own create whose answer was lost: that is returned as made);
``publish_done``, which ``dispatch publish`` and the integrations use, takes that as done,
since a name is one save's (epoch, step, path) and a publication holds nothing else.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from ..errors import AlreadyPublished
from . import model
from .stores.open import EXEC, PUB, Found, is_remote_root, open_store, scheme_of, store_timeout

__all__ = [
    "EXEC",
    "PUB",
    "Found",
    "publish",
    "publish_done",
    "publication_name",
    "latest",
    "list_publications",
    "is_remote_root",
    "scheme_of",
    "open_store",
    "store_timeout",
]


def publish(root: str, epoch: int, step: int, path: str, *, timeout: Optional[float] = None) -> str:
    """Publish the save at ``path`` (inside ``root``); return the publication's name."""
    return open_store(root, timeout).publish(epoch, step, path)


def publish_done(
    root: str,
    epoch: int,
    step: int,
    path: str,
    *,
    timeout: Optional[float] = None,
    said: Optional[Callable[[str], None]] = None,
) -> str:
    """:func:`publish`, taking the same publication found already there as done: its name is
    the save's epoch, step and path, so it is this save's publication (made earlier, by hand or
    by a retry).  ``said`` gets the store's words for that case; returns the name."""
    try:
        return publish(root, epoch, step, path, timeout=timeout)
    except AlreadyPublished as exc:
        if said is not None:
            said(str(exc))
        return publication_name(root, epoch, step, path)


def publication_name(root: str, epoch: int, step: int, path: str) -> str:
    """The name :func:`publish` gives the save at ``path``, checked the way publish checks it."""
    row = scheme_of(root)
    if row is not None:
        # A remote store names a save by its URL: relative() takes it back under the root.
        remote: Any = row.store_class()(root, 1.0)  # type: ignore[call-arg]
        return model.format_name(epoch, step, remote.relative(path))
    return model.format_name_inside(os.path.abspath(root), os.path.abspath(path), epoch, step)[0]


def latest(root: str, *, timeout: Optional[float] = None) -> Optional[Found]:
    """The latest publication under ``root``, or ``None`` when there is none."""
    return open_store(root, timeout).latest()


def list_publications(root: str, *, timeout: Optional[float] = None) -> list[Found]:
    """Every publication under ``root``, oldest first (the order of ``latest``)."""
    return open_store(root, timeout).list_publications()
