"""The in-job half of a remote store: one interface for what an execution on a remote root
(``s3://``; the table of stores, :mod:`slurm_dispatch.checkpoint.stores.schemes`, says which
roots are remote) does that an execution on a folder does not.

On a remote root a framework that writes only to local disk saves into the execution's staging
folder (``$DISPATCH_STAGE_DIR``), and each save is uploaded under the execution's prefix, then
published; a framework that writes the store's URLs itself (Lightning through fsspec) has its
save sealed where it lies; the save to resume from is chosen there and, for a framework that
loads from local disk, copied here and checked; ``dispatch fetch`` checks a copy against the
manifest; ``dispatch watch`` uploads and, when its command ends well, clears the staging folder.

:class:`Staging` is that interface; a remote store's implementation is one module that provides
it (S3's: :mod:`.s3saves`, with :mod:`.watch_s3`'s uploader and :mod:`.stage`'s cleanup behind
it), named in :data:`STAGINGS` by the store's scheme.  :func:`of` imports it (and so the store's
SDK) only when a remote root asks.  Callers (the integrations, ``watch``, ``fetch``) name no
store: they ask :func:`of` for the root's staging.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from ..checkpoint import publish as store

if TYPE_CHECKING:
    from .saves import Execution, Resume

# The module of each remote store's staging, by its scheme's name (schemes.Scheme.name).
STAGINGS: dict[str, str] = {
    "s3": "slurm_dispatch.execution.s3saves",
    "az": "slurm_dispatch.execution.s3saves",
}


class StagedUploader(Protocol):
    """One staging folder's uploads to one execution's prefix, each then published."""

    def url_of(self, path: str) -> str:
        """The URL the local save ``path`` is uploaded to."""

    def own_mark(self) -> int:
        """The step of the newest save this execution published (-1: none yet)."""

    def put(self, epoch: int, step: int, path: str, cancelled: Callable[[], bool]) -> str:
        """Upload the local save ``path``, then publish it; the publication's name."""

    def published(self, path: str) -> None:
        """``path`` is published: the older local copies may go."""


class Staging(Protocol):
    """What a remote store's in-job implementation provides (a module, as :mod:`.s3saves`)."""

    # Names of the staging folder's folders of copies fetched from the store (never saves of
    # the execution's own): watch passes over them, the cleanup of the folder removes them.
    DOWNLOADS: re.Pattern[str]

    def uploader(self, execution: Execution, report: Callable[[str], None] = ...) -> StagedUploader:
        """The uploader of ``execution``'s staging folder to its prefix."""

    def watch_uploader(
        self,
        root: str,
        folder: str,
        upload_to: Optional[str],
        timeout: float,
        report: Callable[[str], None],
        may_be_absent: bool = False,
    ) -> StagedUploader:
        """``dispatch watch``'s uploader of ``folder`` to ``upload_to`` under ``root``."""

    def clear_stage(
        self, root: str, stage_dir: str, prefix: str, timeout: float, report: Callable[[str], None]
    ) -> bool:
        """Remove what of ``stage_dir`` is on the store; True when the folder is gone."""

    def publish_local_save(
        self, execution: Execution, up: Any, step: int, save: str, bests: Optional[list[str]] = None
    ) -> str:
        """Upload the local ``save`` with ``up``'s manifest, then publish it; its name."""

    def seal_remote_save(self, url: str, bests: Optional[list[str]] = None) -> None:
        """Write the manifest beside a save the framework wrote to ``url`` itself."""

    def record_keep(
        self, execution: Execution, framework: str, setting: str, value: Any, every: bool = False
    ) -> None:
        """The framework's rotation limit, for cleanup, under the execution's prefix."""

    def choose_resume(
        self,
        execution: Execution,
        required: tuple[str, ...] = (),
        framework: str = "",
        fetch: bool = False,
    ) -> Resume:
        """The save to resume from: its URL, or with ``fetch`` a checked local copy."""

    def read_json(self, url: str) -> Optional[Any]:
        """The JSON record at ``url``; None when there is none or it does not parse."""

    def why_unloadable_remote(self, url: str, required: tuple[str, ...] = ()) -> Optional[str]:
        """Why the save at ``url`` cannot be loaded where it lies; None when it looks whole."""

    def why_copy_differs(self, url: str, local: str) -> Optional[str]:
        """Why ``local`` is not the copy of ``url`` that was uploaded; None when it is."""

    def fetch_checked(self, url: str, dest: str) -> str:
        """``dispatch fetch``'s checked copy of the save at ``url`` in ``dest``."""


def of(root: str) -> Staging:
    """The staging of the remote ``root`` (ValueError for a folder: callers ask only for a root
    that :func:`~slurm_dispatch.checkpoint.publish.is_remote_root` says is remote)."""
    row = store.scheme_of(root)
    if row is None or not row.remote:
        raise ValueError(f"{root!r} is not a remote root: it has no staging")
    found: Staging = importlib.import_module(STAGINGS[row.name])  # type: ignore[assignment]
    return found


if TYPE_CHECKING:  # mypy checks each implementation in STAGINGS against the interface
    from . import s3saves as _s3saves

    _S3: Staging = _s3saves
