"""Quarantined saves: passed over when an execution chooses the save to resume from.

A save that made executions fail before they published anything (``dispatch supervise``,
``--quarantine-after``), or one a person names (``dispatch quarantine``), is quarantined: an
empty entry in ``<root>/quarantine/`` named by the save's path under the root in base32, as a
pin is in ``pins/``, created once (``O_CREAT|O_EXCL`` on POSIX, ``If-None-Match: *`` on S3) and
durable when the call returns.  It is never rewritten; a person lifts it (``dispatch
unquarantine``), which removes it.

Invariants:

* The save to resume from (the launcher's ``DISPATCH_RESUME_FROM``, ``dispatch latest``,
  ``api.latest()`` and ``api.resume_from()``, an integration given no choice) is
  the latest publication whose save is not quarantined (:func:`choose`): past a quarantined
  save it falls back along the root's publications (a lower epoch or step), and the saves
  passed over are returned, for the caller to say so.  With no quarantine mark it costs one
  listing of ``quarantine/`` beyond the latest publication.
* Only a published save can be quarantined (a mark for another path would mean nothing).
  ``dispatch supervise`` quarantines one only where a publication not quarantined remains
  (:func:`fallback`): past the last one the next execution would start afresh, and its saves
  would outrank the quarantined one for good (a newer epoch), a choice left to a person.
* Cleanup keeps a quarantined save while its publication is the root's latest (``gc``): the
  person deciding about it still finds it.
"""

from __future__ import annotations

import os
from typing import Optional

from ..errors import BadPublicationName, OutsideRoot, StoreError, UsageError
from . import model
from .stores.base import QUARANTINE, Found, Store
from .stores.open import open_store

LIFT = "dispatch unquarantine"


def save_under(st: Store, path: str) -> str:
    """The save at ``path`` (a path or an ``s3://`` URL) relative to the store's root: what
    a quarantine mark names, and a pin (``gc.pin``)."""
    relative = getattr(st, "relative", None)
    if relative is not None:
        return str(relative(path))
    try:
        return model.relative_inside(os.path.abspath(st.root), os.path.abspath(path))
    except OutsideRoot:
        raise UsageError(f"{path!r} is not inside the checkpoint root {st.root!r}") from None


def entry(relative: str) -> str:
    """The entry in ``quarantine/`` of the save at ``relative``: its path in base32."""
    return model.encode_path(relative)


def quarantined(st: Store) -> set[str]:
    """Every quarantined save, relative to the root; a mark that is no save's name is an
    error naming it (never skipped: it could be the one that matters)."""
    out = set()
    for name in st.list_marks(QUARANTINE):
        try:
            out.add(model.decode_path(name, name=name))
        except BadPublicationName as exc:
            raise StoreError(
                f"{name!r} in {QUARANTINE}/ is not a quarantined save's name: {exc}"
            ) from None
    return out


def located(st: Store) -> set[str]:
    """Every quarantined save as a publication locates it (a path, or an s3:// URL)."""
    return {st.locate(relative) for relative in quarantined(st)}


def choose(st: Store) -> tuple[Optional[Found], list[Found]]:
    """(the publication to resume from, the newer ones passed over as quarantined): the
    latest one whose save is not quarantined; (None, [...]) when every one is."""
    latest = st.latest()
    if latest is None:
        return None, []
    marked = located(st)
    if latest.path not in marked:
        return latest, []
    passed: list[Found] = []
    for found in reversed(st.list_publications()):
        if found.path not in marked:
            return found, passed
        passed.append(found)
    return None, passed


def fallback(root: str, path: str, timeout: Optional[float] = None) -> bool:
    """Whether a publication other than the save at ``path`` and not quarantined remains:
    what the choice of the save to resume from falls back to once ``path`` is quarantined
    (none: the next execution would start afresh)."""
    st = open_store(root, timeout)
    marked, target = located(st), st.locate(save_under(st, path))
    return any(
        found.path != target and found.path not in marked for found in st.list_publications()
    )


def resumable(root: str, timeout: Optional[float] = None) -> Optional[Found]:
    """The publication to resume from in ``root`` (:func:`choose`, what is passed over not
    said): for a chooser other than the launcher (``api.latest``, an integration given no
    choice)."""
    return choose(open_store(root, timeout))[0]


def passed_text(passed: list[Found]) -> str:
    """What a chooser says of the saves it passed over, for the job's output."""
    return (
        f"passed over quarantined save(s) {', '.join(f.path for f in passed)}; "
        f"`{LIFT} SAVE` lifts a mark"
    )


def mark(root: str, path: str, timeout: Optional[float] = None) -> bool:
    """Quarantine the published save at ``path``; False when it was quarantined already."""
    st = open_store(root, timeout)
    relative = save_under(st, path)
    if not any(found.path == st.locate(relative) for found in st.list_publications()):
        raise UsageError(
            f"{path!r} is not a published save of {root!r}: only a save some "
            "publication names can be quarantined, spelled as `dispatch list` "
            "shows it"
        )
    return st.create_mark(QUARANTINE, entry(relative))


def lift(root: str, path: str, timeout: Optional[float] = None) -> bool:
    """Lift the quarantine of the save at ``path``; False when it was not quarantined."""
    st = open_store(root, timeout)
    return st.delete_mark(QUARANTINE, entry(save_under(st, path)))
