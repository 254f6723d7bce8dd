"""The publication functions every caller uses: ``publish``, ``latest``, ``list_publications``.

Each opens the root's store (:func:`slurm_dispatch.stores.open_store`: a folder, or
``s3://bucket/prefix``) and asks it; the rules live in :mod:`slurm_dispatch.stores`.  On a
folder they behave exactly as the POSIX store always has; ``timeout`` (seconds) bounds an S3
call or scan and defaults to ``$DISPATCH_STORE_TIMEOUT``, then ``StoreTimeout`` in
dispatch.conf, then 60.
"""

from __future__ import annotations

from typing import Optional

from .stores import EXEC, PUB, Found, is_s3_root, open_store, store_timeout

__all__ = ["EXEC", "PUB", "Found", "publish", "latest", "list_publications", "is_s3_root",
           "open_store", "store_timeout"]


def publish(root: str, epoch: int, step: int, path: str, *,
            timeout: Optional[float] = None) -> str:
    """Publish the save at ``path`` (inside ``root``); return the publication's name."""
    return open_store(root, timeout).publish(epoch, step, path)


def latest(root: str, *, timeout: Optional[float] = None) -> Optional[Found]:
    """The latest publication under ``root``, or ``None`` when there is none."""
    return open_store(root, timeout).latest()


def list_publications(root: str, *, timeout: Optional[float] = None) -> list[Found]:
    """Every publication under ``root``, oldest first (the order of ``latest``)."""
    return open_store(root, timeout).list_publications()
