"""Publication stores, chosen by the root's spelling: a ``scheme://`` of the table of stores
(:mod:`.schemes`: ``s3://bucket/prefix``) or a folder.

:func:`open_store` is the one place a root becomes a store; :mod:`.base` holds the interface
they all implement.  Invariant: a remote root (``s3://``) never touches the local file system as
a folder, and a root with any other ``scheme://`` is refused rather than made into a folder
named so.  A store's module (and so its SDK, boto3 for S3) is imported only when a root of its
scheme is opened.
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional

from ...errors import UsageError
from .base import EXEC, PUB, Found, Store
from .posix import PosixStore
from .schemes import SCHEMES, is_remote_root, scheme_of, served

__all__ = [
    "EXEC",
    "PUB",
    "Found",
    "Store",
    "open_store",
    "is_remote_root",
    "scheme_of",
    "store_timeout",
    "DEFAULT_TIMEOUT",
    "TIMEOUT_ENV",
]

DEFAULT_TIMEOUT = 60.0
TIMEOUT_ENV = "DISPATCH_STORE_TIMEOUT"
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def check_root_scheme(root: str) -> None:
    """Refuse a URL root of a kind no store serves (``gs://``, ``file://``...)."""
    for row in SCHEMES:
        head = len(row.name) + 1
        if root[:head].lower() == row.name + ":" and root[head : head + 2] != "//":
            # One slash (or none) would make a local folder named 's3:' quietly.
            raise UsageError(
                f"checkpoint root {root!r} is not an {row.label} URL, which has "
                f"two slashes: {row.prefix}{root[head:].lstrip('/')}; for a local "
                f"folder of that name, write ./{root}"
            )
    match = _SCHEME_RE.match(root)
    if match and scheme_of(root) is None:
        raise UsageError(
            f"checkpoint root {root!r}: {match.group(0)!r} roots are not supported (use {served()})"
        )


def store_timeout(
    value: Optional[float] = None, environ: Optional[Mapping[str, str]] = None
) -> float:
    """Seconds a remote store's call or scan (S3's) may take: ``value`` if given, else
    ``$DISPATCH_STORE_TIMEOUT``, else ``StoreTimeout`` in dispatch.conf, else 60."""
    if value is not None:
        return _positive(value, "--timeout")
    env = os.environ if environ is None else environ
    raw = env.get(TIMEOUT_ENV, "")
    if raw.strip():
        try:
            return _positive(float(raw), f"${TIMEOUT_ENV}")
        except ValueError:
            raise UsageError(f"${TIMEOUT_ENV} {raw!r} is not a number of seconds") from None
    return _configured_timeout(env)


_CONFIGURED: dict[tuple[str, int], float] = {}


def _configured_timeout(env: Mapping[str, str]) -> float:
    """``StoreTimeout`` of the dispatch.conf ``env`` names, read again only when that file
    changes (a publish on S3 costs about 2 ms: reading the file each time was a quarter)."""
    from ... import config

    path = config.config_path(env)  # type: ignore[arg-type]  # reads two names
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = -1
    key = (path, stamp)
    if key not in _CONFIGURED:
        _CONFIGURED.clear()
        _CONFIGURED[key] = float(config.load(environ=dict(env)).store_timeout)
    return _CONFIGURED[key]


def _positive(value: float, label: str) -> float:
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{label} {value!r} must be a number of seconds more than 0")
    return float(value)


def open_store(root: str, timeout: Optional[float] = None) -> Store:
    """The store of ``root``.  ``timeout`` bounds every call and scan of a remote store (see
    :func:`store_timeout` for the default); a folder has no timeout."""
    row = scheme_of(root)
    if row is not None:
        return row.store_class()(root, store_timeout(timeout))  # type: ignore[call-arg]
    check_root_scheme(root)
    return PosixStore(root)
