"""Cleanup (``dispatch gc``, ``dispatch watch --keep``): remove the saves and execution folders
no execution can need any more, on any store.

The rule (issue 13), applied to what the store holds when cleanup looks:

1. the saves of the K latest publications (by epoch, then step; K >= 1, so the latest's) stay;
2. every folder of an execution whose epoch is at least the latest publication's stays (it may
   be the live lineage that has not published yet), with all it has not published, and so
   does the save any such execution resumed from, as its create-once record
   (``exec/<attempt>/.dispatch``) says; a folder with no record (or one that cannot be read)
   stays whole.  What the live lineage published below the K latest goes, save by save (so
   the disk stays bounded during a long execution);
3. what goes is a publication below the K latest, of an epoch below the latest's, whose save
   lies in the folder of such an older execution (and is no kept save, nor holds or lies in
   one), with its save; a folder of an older execution that holds nothing kept goes whole.
   In a folder with no record, only such a publication whose save is already gone goes (a
   superseded execution that went on writing while its folder was removed leaves those).

Invariants kept whatever runs at the same time:

* ``latest`` never names a save that no longer exists: a publication is removed before its
  save, and the greatest name is never removed.
* A starting execution never loses its resume source: cleanup removes the publications, then
  reads again the records of folders that had none (or were new), and spares any save one of
  them names; the launcher, after writing its record, checks that its source's publication is
  still there (``launch.py``).  One of the two always sees the other.
* A killed cleanup leaves a valid store and a rerun finishes: a save removed on its own is
  recorded first as an intent in ``<root>/gc/`` (the publication's name) and forgotten only
  once removed; a whole folder loses its record last, so until then it is still known.
* Nothing is removed when a removal is known beforehand to fail (permission): the checks run
  over every path first.

Library code: it never prints.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import model
from .errors import BadPublicationName, OutsideRoot, StoreError, UsageError
from .stores import EXEC, Store, open_store
from .stores.base import GC, StillWritten, check_names

RECORD = ".dispatch"  # the launcher's create-once record (launch.EXEC_RECORD)
KEEP_RECORD = ".dispatch-keep.json"  # the integrations' record of the framework's rotation
FOLDER = "folder"
SAVE = "save"
PUBLICATION = "publication"  # one whose save is already gone: only the name goes

# exec/ + a 26-character attempt + / is 32 bytes: 7 base32 blocks (35 bytes, 56 characters)
# always hold it, so a publication's folder is found by decoding that much only, once per
# distinct head (many saves share it).
_HEAD_CHARS = 56


@dataclass
class Removal:
    """One thing cleanup removes (or would): a whole execution folder or one save, with the
    publications that name what it holds."""

    kind: str
    path: str  # relative to the root
    publications: list[str]
    bytes: Optional[int] = None
    skipped: str = ""  # why it was left in the end (a starting execution named it)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "publications": len(self.publications),
                "bytes": self.bytes, "skipped": self.skipped or None}


@dataclass
class Folder:
    """An execution folder as cleanup sees it."""

    attempt: str
    epoch: Optional[int]  # None: no record, or one that cannot be read
    resume: Optional[str]  # the save it resumed from, relative to the root
    problem: str = ""
    verdict: str = ""  # why it stays, or "removed"
    bytes: Optional[int] = None

    def as_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "epoch": self.epoch, "resume_from": self.resume,
                "verdict": self.verdict, "bytes": self.bytes,
                "problem": self.problem or None}


@dataclass
class Report:
    root: str
    keep: int
    dry_run: bool
    latest: Optional[str] = None
    removals: list[Removal] = field(default_factory=list)
    folders: list[Folder] = field(default_factory=list)
    finished_intents: int = 0

    @property
    def freed(self) -> Optional[int]:
        done = [r for r in self.removals if not r.skipped]
        if any(r.bytes is None for r in done):
            return None
        return sum(r.bytes or 0 for r in done)

    def as_json(self) -> dict[str, Any]:
        return {"root": self.root, "keep": self.keep, "dry_run": self.dry_run,
                "latest": self.latest, "freed": self.freed,
                "removals": [r.as_json() for r in self.removals],
                "folders": [f.as_json() for f in self.folders],
                "finished_intents": self.finished_intents}


def check_keep(keep: int) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise UsageError(f"--keep {keep!r} must be at least 1: the latest publication's save "
                         "always stays")
    return keep


class _Names:
    """Decoding of publication names, each part once."""

    def __init__(self) -> None:
        self._heads: dict[str, Optional[str]] = {}
        self._paths: dict[str, str] = {}

    def folder(self, name: str) -> Optional[str]:
        """The execution folder (attempt) the publication's save lies in, or None."""
        tail = name[42:]
        if len(tail) > _HEAD_CHARS:
            head = tail[:_HEAD_CHARS]
            if head in self._heads:
                return self._heads[head]
            parts = base64.b32decode(head).decode("utf-8", "replace").split("/")
            if len(parts) >= 3:  # the folder's name ended inside the head
                found = parts[1] if parts[0] == EXEC and parts[1] else None
                self._heads[head] = found
                return found
        parts = self.path(name).split("/")
        return parts[1] if len(parts) >= 2 and parts[0] == EXEC else None

    def path(self, name: str) -> str:
        path = self._paths.get(name)
        if path is None:
            # Every name was checked with the listing (check_names): only the path to decode.
            path = self._paths[name] = model.decode_path(name[42:], name=name)
        return path


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def _overlap(a: str, b: str) -> bool:
    return _under(a, b) or _under(b, a)


def read_folder(st: Store, attempt: str) -> Folder:
    """An execution folder's epoch and resume source from its record (None when absent)."""
    try:
        raw = st.read_exec_file(attempt, RECORD)
    except StoreError as exc:
        return Folder(attempt, None, None, problem=str(exc))
    if raw is None:
        return Folder(attempt, None, None, problem="no record")
    try:
        data = json.loads(raw)
        epoch = model.check_epoch_value(int(data["epoch"]))
    except (ValueError, KeyError, TypeError, BadPublicationName) as exc:
        return Folder(attempt, None, None, problem=f"record unreadable: {exc}")
    except Exception as exc:  # noqa: BLE001 - OutOfBounds and the like: keep the folder
        return Folder(attempt, None, None, problem=f"record unreadable: {exc}")
    return Folder(attempt, epoch, _resume_of(st, data))


def _resume_of(st: Store, data: dict[str, Any]) -> Optional[str]:
    name = data.get("resume_publication")
    if isinstance(name, str) and name:
        try:
            check_names([name], RECORD)  # the fast check; parse_name's pattern is slower
            return model.decode_path(name[42:], name=name)
        except BadPublicationName:
            pass
    source = data.get("resume_from")
    base = st.locate("")
    if isinstance(source, str) and source.startswith(base):
        try:
            return model.normalize_relative(source[len(base):].rstrip("/"))
        except OutsideRoot:
            return None
    return None


@dataclass
class Plan:
    latest: Optional[str]
    removals: list[Removal]
    kept_saves: set[str]
    epoch: Optional[int]
    # Older publications below the K latest whose folder has no record: only one whose save
    # is gone goes (nothing can load it), without touching the folder.
    unsure: list[str] = field(default_factory=list)


def plan(names: list[str], folders: dict[str, Folder], keep: int,
         decode: Optional[_Names] = None, presorted: bool = False) -> Plan:
    """What the rule removes, from the publication names (checked; ``presorted`` when they
    are in order already) and the execution folders (pure)."""
    check_keep(keep)
    decode = decode or _Names()
    ordered = names if presorted else sorted(names)
    if not ordered:
        for each in folders.values():
            each.verdict = "kept: nothing is published"
        return Plan(None, [], set(), None)
    latest = ordered[-1]
    top = ordered[-keep:]
    epoch = int(latest[:20])
    kept = {decode.path(n) for n in top}
    for each in folders.values():
        if each.epoch is None:
            each.verdict = f"kept: {each.problem}"
        elif each.epoch >= epoch:
            each.verdict = "kept: its epoch is at least the latest publication's"
            if each.resume:
                kept.add(each.resume)
    protected = {a for a, each in folders.items() if each.epoch is None or each.epoch >= epoch}
    by_folder: dict[str, list[str]] = {}
    blocked: set[str] = set()  # folders holding a publication that stays
    unsure: list[str] = []  # older publications into folders with no record
    live: list[str] = []  # publications below the K latest in a live execution's folder
    latest_epoch = latest[:20]  # epochs are 20 digits: text compares as numbers do
    recordless = {a for a in protected if folders[a].epoch is None}
    folder_of, heads = decode.folder, decode._heads
    cut = 42 + _HEAD_CHARS
    for n in ordered[:-keep]:
        # The folder of most names is one dictionary look-up (decode.folder, inlined).
        folder = heads.get(n[42:cut]) if len(n) > cut else None
        if folder is None:
            folder = folder_of(n)
        if folder is None:
            continue
        if folder in protected:
            if folder not in recordless:
                live.append(n)
            elif n[:20] < latest_epoch:
                unsure.append(n)
        elif n[:20] >= latest_epoch:
            blocked.add(folder)
        else:
            by_folder.setdefault(folder, []).append(n)
    for n in top:
        folder = decode.folder(n)
        if folder is not None:
            blocked.add(folder)
    removals: list[Removal] = []
    for attempt in sorted(set(by_folder) | (set(folders) - protected)):
        mine = by_folder.get(attempt, [])
        where = f"{EXEC}/{attempt}"
        f: Optional[Folder] = folders.get(attempt)
        if (f is not None and attempt not in blocked
                and not any(_overlap(k, where) for k in kept)):
            removals.append(Removal(FOLDER, where, mine))
            f.verdict = "removed"
            continue
        if f is not None:
            f.verdict = "kept: it holds a save that stays"
        saves: dict[str, list[str]] = {}
        for n in mine:
            saves.setdefault(decode.path(n), []).append(n)
        for path, pubs in sorted(saves.items()):
            if not any(_overlap(path, k) for k in kept):
                removals.append(Removal(SAVE, path, pubs))
    # The live lineage's folder stays, and so does all it has not published (a save being
    # written); what it published below the K latest goes, one save at a time, so that the
    # disk stays bounded during a long execution too.
    saves = {}
    for n in live:
        saves.setdefault(decode.path(n), []).append(n)
    for path, pubs in sorted(saves.items()):
        if not any(_overlap(path, k) for k in kept) and path.count("/") >= 2:
            removals.append(Removal(SAVE, path, pubs))
    return Plan(latest, removals, kept, epoch, unsure)


def _folders(st: Store, attempts: list[str]) -> dict[str, Folder]:
    found = {a: read_folder(st, a) for a in attempts}
    # An S3 listing may still name a "folder" whose objects are all gone: it is not there.
    return {a: f for a, f in found.items()
            if f.epoch is not None or st.exists(f"{EXEC}/{a}")}


def default_keep(st: Store, attempts: list[str]) -> int:
    """The greatest rotation limit the integrations recorded in any execution's folder."""
    found = []
    for attempt in attempts:
        raw = st.read_exec_file(attempt, KEEP_RECORD)
        if raw is None:
            continue
        try:
            value = json.loads(raw).get("keep")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            found.append(value)
    if not found:
        raise UsageError("--keep K is required: no execution recorded its framework's "
                         f"rotation limit ({KEEP_RECORD})")
    return max(found)


def collect(root: str, keep: Optional[int], *, dry_run: bool = False, sizes: bool = False,
            timeout: Optional[float] = None, store: Optional[Store] = None,
            pause: Callable[[str], None] = lambda where: None) -> Report:
    """Apply the rule to ``root`` (or only say what it would remove, with ``dry_run``).

    ``pause(where)`` is called between the stages (tests stop the process there).
    """
    if keep is not None:
        check_keep(keep)
    st = store or open_store(root, timeout)
    st.check_store()
    intents = st.list_intents()
    check_names(intents, st.locate(GC))  # they are decoded as publication names
    attempts = st.list_exec()
    folders = _folders(st, attempts)
    if keep is None:
        keep = default_keep(st, attempts)
    names = st.publication_names()
    names.sort()
    decode = _Names()
    # A removal a killed cleanup began counts as the publication it removes.
    present = set(names)
    extra = [n for n in intents if n not in present]
    found = plan(sorted(names + extra) if extra else names, folders, keep, decode,
                 presorted=True)
    for n in found.unsure:
        path = decode.path(n)
        if not any(_overlap(path, k) for k in found.kept_saves) and not st.exists(path):
            found.removals.append(Removal(PUBLICATION, path, [n], 0))
    report = Report(root, keep, dry_run, found.latest, found.removals,
                    sorted(folders.values(), key=lambda f: (f.epoch or 0, f.attempt)))
    if sizes:
        for f in report.folders:
            f.bytes = st.size(f"{EXEC}/{f.attempt}")
        for r in report.removals:
            r.bytes = st.size(r.path)
    if dry_run:
        return report
    for r in found.removals:
        st.check_removable(r.path)
    pause("checked")
    singles = sorted({n for r in found.removals if r.kind == SAVE for n in r.publications})
    if singles:
        st.create_intents([n for n in singles if n not in intents])
    pause("intents")
    st.delete_publications(sorted({n for r in found.removals for n in r.publications
                                   if n in present}))
    pause("unpublished")
    _spare_new_sources(st, folders, found, report)
    for r in found.removals:
        if r.skipped:
            continue
        if r.kind == FOLDER:
            try:
                r.bytes = st.remove_exec(r.path.split("/")[1], RECORD)
            except StillWritten as exc:
                # An old execution still running writes into its folder: nothing of it is
                # published any more (its publications went first); the rest goes next time.
                r.skipped = str(exc)
        elif r.kind == SAVE:
            r.bytes = st.remove_save(r.path)
        pause("removed")
    done = sorted(set(intents) | set(singles))
    if done:
        st.delete_intents(done)
    report.finished_intents = len(set(intents))
    return report


def _spare_new_sources(st: Store, folders: dict[str, Folder], found: Plan,
                       report: Report) -> None:
    """After the publications are gone, read the records cleanup had not seen: an execution
    that started meanwhile may resume from a save about to go; it stays."""
    if found.epoch is None:
        return
    fresh = [a for a in st.list_exec() if a not in folders or folders[a].epoch is None]
    spared: set[str] = set()
    for attempt, f in _folders(st, fresh).items():
        if f.epoch is None or f.epoch >= found.epoch:
            if f.resume:
                spared.add(f.resume)
            if attempt not in folders:
                report.folders.append(f)
                f.verdict = "kept: it started while cleanup ran"
    for r in found.removals:
        if any(_overlap(r.path, s) for s in spared):
            r.skipped = "a starting execution resumes from it"
