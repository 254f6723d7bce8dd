"""Cleanup (``dispatch gc``, ``dispatch watch --keep``, and the framework integrations' own
limit): remove the saves no execution can need any more, on any store.

What a save is *needed* for, and so never removed (docs/invariants.md, 9):

1. it is the save of one of the K latest publications (by epoch, then step; K >= 1, so the
   latest's);
2. an execution that may be the live lineage (its epoch is at least the latest publication's,
   and its job's record, where the caller reads it, does not say the job ended: ``ended``)
   has chosen it: the launcher's record (``exec/<attempt>/.dispatch``) names it, or an
   integration recorded it as a choice before loading it (``.dispatch-choice-*.json``, the
   fallback along the lineage when the latest save cannot be loaded; :mod:`.execdir`);
3. it is pinned (``dispatch pin``: ``<root>/pins/``), or quarantined (``<root>/quarantine/``,
   :mod:`.quarantine`) while its publication is the latest: a person deciding about it
   still finds it; and then the latest save not quarantined, whatever K, which the next
   execution resumes from;
4. the framework of a live execution keeps it as one of its best: the manifests of that
   execution's latest saves (of its source, before it has saved) list them (Lightning's top k
   by each ``ModelCheckpoint``'s monitor, the Trainer's ``best_model_checkpoint``), so an old
   execution's late save never displaces the live lineage's best.

What a needed save holds is read through symlinks: a published symlink under the root keeps
every link of its chain and what it leads to, and a symlink inside a needed folder save keeps
its target too (:meth:`Store.resolve`), so ``latest`` never names a dangling link.

What goes, when it is not needed:

* a publication below the K latest whose save lies in an execution's folder, with every
  other publication of the same save (one save published twice goes with both names, never
  leaving one that names nothing), each before the save;
* in the folder of a live execution (epoch at least the latest's, its job not ended), only
  such published saves (the disk stays bounded during a long execution); what it has not
  published stays;
* a save an older execution never published that does not look whole (cut off while being
  written); one that looks whole by the rules watch publishes by (sealed with its manifest,
  or whole by watch's rules: :func:`looks_whole`) is needed, and stays with its folder
  (``Report.unpublished``, with what publishes it) unless ``remove_unpublished`` asks;
* the folder of an older execution (one of a job whose record says it ended, whatever its
  epoch, is one: it runs no more), whole (its record last), once nothing in it is needed and
  it holds nothing but saves and dispatch's records; one that holds other files (TensorBoard
  event files, logs: the Trainer writes them into its output folder) loses its saves only,
  and the other files stay unless ``all_files`` asks for them too.  A name is no evidence of
  a save: a ``.ckpt`` file is one only when its name holds ``step=<N>`` (watch's rule), its
  manifest is beside it, a publication names it, or it is in ``checkpoints/`` (the folder
  the Lightning integration gives its ModelCheckpoints); a ``.ckpt/`` or ``step-N/`` folder
  only while it holds nothing but a DCP save's files;
* a folder with no record (or an unreadable one) stays whole; of the older publications into
  it, only those whose save is already gone go.

Invariants kept whatever runs at the same time:

* ``latest`` never names a save that no longer exists: every publication of a save is
  removed before the save, and the greatest name is never removed.
* A starting execution never loses the save it chose: cleanup removes the publications, then
  reads again every record and choice of the folders that may be live, and spares any save
  they name; the launcher and the integrations, after recording their choice, check that a
  publication of it is still there (and choose again when not).  One of the two always sees
  the other.
* A killed cleanup leaves a valid store and a rerun finishes it, whatever K the rerun is
  given: a save removed on its own is recorded first as an intent in ``<root>/gc/`` (the
  publication's name); an intent whose publication is already gone is a removal decided,
  finished by the next run (unless the save has become needed since), and forgotten only
  once done.  A whole folder is marked first (``.dispatch-removing``, :mod:`.execdir`,
  naming the saves whose publications it removes), so those are not taken for saves never
  published; any other save there (one cut off at the plan that an old execution still
  running has finished since, or one it wrote after the mark) is judged as any save never
  published.  Just before the removal the folder is listed again: one holding a save that
  was not published at the plan and looks whole now stays for the next run.  It loses its
  record last, so until then it is still known.
* Nothing is removed when a removal is known beforehand to fail (permission): the checks run
  over every path first.
* The handshake holds when a node's view of ``exec/`` and ``pub/`` lags by up to ``ListingLag``
  seconds (dispatch.conf, default 60: NFS's acdirmax; ``$DISPATCH_LISTING_LAG``): between
  removing the publications and reading the choices again, cleanup waits twice that, so a
  choice recorded before a starting execution's (stale) check saw the publication is always
  visible to the re-read.  In a job (``watch --keep``, the integrations' limits) that wait
  runs beside the training, never in its way (:func:`collect_in_background`).

Library code: it never prints.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from ..errors import BadPublicationName, OutsideRoot, StoreError, UsageError
from . import execdir, frameworks, model, quarantine
from .stores.base import GC, StillWritten, check_names
from .stores.open import EXEC, Store, open_store

RECORD = execdir.RECORD  # the launcher's create-once record
KEEP_RECORD = execdir.KEEP  # the integrations' record of the framework's rotation
FOLDER = "folder"
SAVE = "save"
PUBLICATION = "publication"  # one whose save is already gone: only the name goes

# exec/ + a 26-character attempt + / is 32 bytes: 7 base32 blocks (35 bytes, 56 characters)
# always hold it, so a publication's folder is found by decoding that much only, once per
# distinct head (many saves share it).
_HEAD_CHARS = 56


def _shared_chars(attempt: str) -> int:
    """How many base32 characters every encoded path in ``exec/<attempt>/`` shares: those of
    its prefix's whole 5-byte blocks (48 for a launcher's 26-character attempt: 30 bytes).
    Counted per folder, never assumed: a folder of another name length (a person's, a test's)
    shifts the blocks, and a fixed count compared the wrong characters (every save of such a
    folder was taken for one never published)."""
    size = len(f"{EXEC}/{attempt}/".encode("utf-8", "surrogateescape"))
    return size // 5 * 8


# The names cleanup takes for saves, from the saves table (:mod:`.frameworks`): the Trainer's
# checkpoint-N folders (tmp-checkpoint-N while it writes), Lightning's .ckpt files (a .ckpt
# folder: its sharded save, a DCP one) and its integration's checkpoints/ folder inside an
# execution's, torchtitan's step-N DCP folders.  A DCP save is its folder, whole: its shards
# and .metadata are never saves of their own, and cleanup removes the folder or nothing of it.
_CLEANUP = frameworks.rows("cleanup")
_SUFFIXES = tuple(row.suffix for row in _CLEANUP if row.suffix is not None)
CHECKPOINTS = (
    next(
        row.saves_folder
        for row in _CLEANUP  # the Lightning integration's
        if row.saves_folder is not None
    )
    + "/"
)  # folder in an execution's
_SAVE_NAME = re.compile(
    "|".join(
        [
            (f"(?:{re.escape(row.writing)})?" if row.writing else "")
            + f"{row.folder}{'/' if row.dcp else '/?'}"
            for row in _CLEANUP
            if row.folder is not None
        ]
        + [f".*{re.escape(suffix)}/?" for suffix in _SUFFIXES]
        + [re.escape(CHECKPOINTS)]
    )
)
# A folder that is a save only as a DCP one (torchtitan's step-N/, Lightning's sharded .ckpt/)
_DCP_FOLDER = re.compile(
    "|".join(
        [f"{row.folder}/" for row in _CLEANUP if row.dcp and row.folder is not None]
        + [f".+{re.escape(suffix)}/" for suffix in _SUFFIXES]
    )
)
# What a DCP save's folder holds (frameworks.DCP_FILES), with the integrations' manifest and,
# in a folder of a save suffix, the file written after the shards (Lightning's meta.pt):
# such a folder holding anything else is a user's own (execution/saverules.py decides the
# same folder whole for watch, reading it).
_DCP_FILE = re.compile(frameworks.DCP_FILES + "|" + re.escape(execdir.MANIFEST_NAME))
_SHARDED_META = {
    row.suffix + "/": row.sharded_meta
    for row in _CLEANUP
    if row.suffix is not None and row.sharded_meta is not None
}
# A .ckpt file is a save by its name only where watch's rule says so: "step=<N>" in it
# (Lightning's default epoch=E-step=S.ckpt); else only with its manifest beside it or a
# publication naming it (a downloaded pretrained.ckpt is no save).
_FILE_STEPS = frameworks.compiled([row.file for row in _CLEANUP])
_FOLDER_STEPS = frameworks.compiled([row.folder for row in _CLEANUP])
# What a folder's name starts with while it is written (the Trainer's tmp-checkpoint-N): the
# step of the save it becomes
_WRITING = tuple(sorted({row.writing for row in _CLEANUP if row.writing}))


def _file_step(name: str) -> Optional[int]:
    """The step a save file's name holds (``...step=N...ckpt``), or None."""
    return frameworks.first_step(name, _FILE_STEPS, search=True)


@dataclass
class Removal:
    """One thing cleanup removes (or would): a whole execution folder or one save, with the
    publications that name what it holds."""

    kind: str
    path: str  # relative to the root
    publications: list[str]
    bytes: Optional[int] = None
    skipped: str = ""  # why it was left in the end (a starting execution named it)
    entries: list[str] = field(default_factory=list)  # a folder's: everything that goes
    others: list[str] = field(default_factory=list)  # of those, what is not named like a save

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "publications": len(self.publications),
            "bytes": self.bytes,
            "skipped": self.skipped or None,
            "entries": self.entries,
        }


@dataclass
class Folder:
    """An execution folder as cleanup sees it."""

    attempt: str
    epoch: Optional[int]  # None: no record, or one that cannot be read
    resume: Optional[str]  # the save the launcher chose, relative to the root
    problem: str = ""
    job: str = ""  # the dispatch job its record names
    # Its job's record says it started before the job ended: it is no live execution,
    # whatever its epoch.
    ended: bool = False
    verdict: str = ""  # why it stays, or "removed"
    bytes: Optional[int] = None
    entries: list[str] = field(default_factory=list)  # names in it ("x/" for a folder)
    chosen: list[str] = field(default_factory=list)  # every save it chose (resume included)
    inner: list[str] = field(default_factory=list)  # the names in its checkpoints/
    # its step-N/ and .ckpt/ folders (and those in its checkpoints/, "checkpoints/x.ckpt/")
    # holding something a DCP save never holds (read for older folders only)
    not_dcp: set[str] = field(default_factory=set)
    listed: Optional[frozenset[str]] = None  # entries and inner names, for look-ups
    # A killed cleanup's mark (.dispatch-removing): the saves it unpublished to remove the
    # folder (their paths in it: "checkpoint-4", "checkpoints/x.ckpt"); None: no mark; ALL: a
    # mark naming none (made before marks named them), taken for every save.
    decided: Optional[frozenset[str]] = None

    def marked(self, entry: str) -> bool:
        """Whether a killed cleanup unpublished the save ``entry`` to remove the folder."""
        return self.decided is not None and (
            self.decided is ALL or entry.rstrip("/") in self.decided
        )

    def has(self, entry: str) -> bool:
        """Whether ``entry`` (or ``checkpoints/<name>``) is in the folder as listed."""
        if self.listed is None:
            self.listed = frozenset(self.entries).union(CHECKPOINTS + e for e in self.inner)
        return entry in self.listed

    def as_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "epoch": self.epoch,
            "resume_from": self.resume,
            "chosen": self.chosen,
            "verdict": self.verdict,
            "bytes": self.bytes,
            "job": self.job or None,
            "ended": self.ended,
            "problem": self.problem or None,
        }


@dataclass
class Unpublished:
    """A save an older execution wrote and never published that looks whole: it stays
    (unless ``remove_unpublished``), and a person may publish it."""

    path: str  # relative to the root
    epoch: Optional[int]  # its execution's
    step: Optional[int]  # as its name says
    why: str

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "epoch": self.epoch, "step": self.step, "why": self.why}


@dataclass
class Report:
    root: str
    keep: int
    dry_run: bool
    latest: Optional[str] = None
    removals: list[Removal] = field(default_factory=list)
    folders: list[Folder] = field(default_factory=list)
    finished_intents: int = 0
    kept: dict[str, str] = field(default_factory=dict)  # needed save -> why it stays
    left: list[str] = field(default_factory=list)  # files that are not saves, left in place
    unpublished: list[Unpublished] = field(default_factory=list)  # whole, never published

    @property
    def freed(self) -> Optional[int]:
        done = [r for r in self.removals if not r.skipped]
        if any(r.bytes is None for r in done):
            return None
        return sum(r.bytes or 0 for r in done)

    def as_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "keep": self.keep,
            "dry_run": self.dry_run,
            "latest": self.latest,
            "freed": self.freed,
            "removals": [r.as_json() for r in self.removals],
            "folders": [f.as_json() for f in self.folders],
            "kept": [{"path": p, "why": w} for p, w in sorted(self.kept.items())],
            "left": self.left,
            "unpublished": [u.as_json() for u in self.unpublished],
            "finished_intents": self.finished_intents,
        }


def check_keep(keep: int) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise UsageError(
            f"--keep {keep!r} must be at least 1: the latest publication's save always stays"
        )
    return keep


ALL: frozenset[str] = frozenset({"*"})  # Folder.decided of a mark that names nothing


def mark_of(saves: Iterable[str]) -> bytes:
    """The mark cleanup leaves on a folder it removes whole: the saves in it whose
    publications it removes (their paths in the folder)."""
    return json.dumps({"format": 1, "unpublished": sorted(set(saves))}).encode()


def read_mark(raw: Optional[bytes]) -> frozenset[str]:
    """The saves a folder's mark says cleanup unpublished (ALL for an empty or unreadable
    mark: every save)."""
    data = execdir.load(raw)
    names = data.get("unpublished") if data else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ALL
    return frozenset(names)


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
            # As every path is decoded (surrogateescape): a folder name that is not UTF-8
            # is itself, never one with U+FFFD in it that names no folder.
            parts = base64.b32decode(head).decode("utf-8", "surrogateescape").split("/")
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


def _needed_by(path: str, needed: dict[str, str]) -> Optional[str]:
    for kept, why in needed.items():
        if _overlap(path, kept):
            return why
    return None


def read_folder(st: Store, attempt: str, entries: Optional[list[str]] = None) -> Folder:
    """An execution folder's epoch and the launcher's resume source from its record (None
    when absent); ``entries``, when listed already, are kept with it."""
    found = _read_record(st, attempt)
    found.entries = list(entries or [])
    return found


def _read_record(st: Store, attempt: str) -> Folder:
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
    resume = _resume_of(st, data)
    job = data.get("job") if isinstance(data, dict) else None
    return Folder(
        attempt,
        epoch,
        resume,
        chosen=[resume] if resume else [],
        job=job if isinstance(job, str) else "",
    )


def _relative(st: Store, source: Any) -> Optional[str]:
    """A save's path or URL as recorded, relative to the root; None when it is not one."""
    base = st.locate("")
    if isinstance(source, str) and source.startswith(base):
        try:
            return model.normalize_relative(source[len(base) :].rstrip("/"))
        except OutsideRoot:
            return None
    return None


def _resume_of(st: Store, data: dict[str, Any]) -> Optional[str]:
    name = data.get("resume_publication")
    if isinstance(name, str) and name:
        try:
            check_names([name], RECORD)  # the fast check; parse_name's pattern is slower
            return model.decode_path(name[42:], name=name)
        except BadPublicationName:
            pass
    return _relative(st, data.get("resume_from"))


def read_choices(st: Store, folder: Folder, entries: Optional[list[str]] = None) -> None:
    """Add to ``folder.chosen`` every save its execution recorded as chosen: its choice files
    and its resume record (:mod:`.execdir`).  ``entries``: the folder's names, listed now."""
    names = st.list_exec_entries(folder.attempt) if entries is None else entries
    found = set(folder.chosen)
    for name in names:
        if execdir.is_choice(name):
            save = execdir.chosen_in_choice(st.read_exec_file(folder.attempt, name))
            if save:
                try:
                    found.add(model.normalize_relative(save))
                except OutsideRoot:
                    pass
        elif name == execdir.RESUME:
            data = execdir.load(st.read_exec_file(folder.attempt, name))
            source = _relative(st, data.get("resume_from")) if data else None
            if source:
                found.add(source)
    folder.chosen = sorted(found)


@dataclass
class Plan:
    latest: Optional[str]
    removals: list[Removal]
    epoch: Optional[int]
    # Older publications below the K latest whose folder has no record: only one whose save
    # is gone goes (nothing can load it), without touching the folder.
    unsure: list[str] = field(default_factory=list)
    needed: dict[str, str] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    # Saves older executions never published that look whole: (path, why), kept.
    unpublished: list[tuple[str, str]] = field(default_factory=list)


def _ckpt_file_save(entry: str, folder: Optional[Folder], published: set[str]) -> bool:
    """Whether a ``.ckpt`` file is a save: watch's rule (``step=<N>`` in its name), its
    manifest beside it, or a publication naming it (``published``).  ``entry`` is its name in
    the execution folder (``checkpoints/<name>`` inside Lightning's folder)."""
    return (
        _file_step(entry) is not None
        or entry in published
        or (folder is not None and folder.has(entry + execdir.MANIFEST_SUFFIX))
    )


def _is_save_entry(
    entry: str,
    published_tops: set[str],
    folder: Optional[Folder] = None,
    published_inner: frozenset[str] = frozenset(),
) -> bool:
    """Whether a name in an execution folder is a save (or dispatch's): published, a
    manifest, one a framework's rotation names so, or dispatch's own record.  A ``.ckpt``
    file only by :func:`_ckpt_file_save`; a ``step-N/`` or ``.ckpt/`` folder only while it
    holds nothing but a DCP save's files (``not_dcp``).  Lightning's ``checkpoints/`` is one
    only while it holds nothing but such saves (``published_inner``: its published names)."""
    bare = entry.rstrip("/")
    if entry.endswith(_SUFFIXES):
        return _ckpt_file_save(entry, folder, published_tops)
    if entry == CHECKPOINTS and folder is not None:
        return all(_inner_is_save(e, folder, published_inner) for e in folder.inner)
    if folder is not None and entry in folder.not_dcp:
        return bare in published_tops
    return (
        execdir.is_own(bare)
        or bare in published_tops
        or bare.endswith(execdir.MANIFEST_SUFFIX)
        or _SAVE_NAME.fullmatch(entry) is not None
    )


def _inner_is_save(name: str, folder: Folder, published_inner: frozenset[str]) -> bool:
    """A name in an execution's ``checkpoints/`` that is a save (or a save's manifest): the
    Lightning integration makes that folder its ModelCheckpoints' own, so every ``.ckpt``
    file there is Lightning's (its ``last.ckpt`` too, never published: rewritten in place);
    a ``.ckpt/`` folder only as a DCP save."""
    entry = CHECKPOINTS + name
    if name.endswith(execdir.MANIFEST_SUFFIX) or name.endswith(_SUFFIXES):
        return True
    if name.endswith(tuple(_SHARDED_META)):
        return entry not in folder.not_dcp or entry.rstrip("/") in published_inner
    return not name.endswith("/") and _SAVE_NAME.fullmatch(name) is not None


def plan(
    names: list[str],
    folders: dict[str, Folder],
    keep: int,
    decode: Optional[_Names] = None,
    presorted: bool = False,
    needed: Optional[dict[str, str]] = None,
    all_files: bool = False,
    resolve: Callable[[str], list[str]] = lambda path: [],
    whole: Optional[Callable[[Folder, str], Optional[str]]] = None,
    decided: Iterable[str] = (),
) -> Plan:
    """What the rule removes, from the publication names (checked; ``presorted`` when they
    are in order already), the execution folders, and the saves ``needed`` otherwise (pins,
    the framework's bests: path -> why) (pure but for ``resolve``, which reads symlinks, and
    ``whole``).  ``whole(folder, entry)`` says why a save an older execution never published
    looks whole (:func:`looks_whole`), or None: such a save stays, with its folder; without
    ``whole`` (``--remove-unpublished``) every unpublished save of an older folder goes.
    ``decided``: the saves a killed cleanup unpublished to remove them (its intents), which
    count as published here."""
    check_keep(keep)
    decode = decode or _Names()
    ordered = names if presorted else sorted(names)
    needed = dict(needed or {})
    if not ordered:
        for each in folders.values():
            each.verdict = "kept: nothing is published"
        _resolve_all(needed, resolve)
        return Plan(None, [], None, needed=needed)
    latest = ordered[-1]
    epoch = int(latest[:20])
    for n in reversed(ordered[-keep:]):
        needed.setdefault(decode.path(n), "one of the K latest publications names it")
    protected = _live_folders(folders, epoch, needed)
    older, live_names, unsure = _group_below(
        ordered[:-keep],
        decode,
        protected,
        {a for a in protected if folders[a].epoch is None},
        latest[:20],
    )
    unpublished = _whole_unpublished(
        folders, protected, _published_tails(ordered, decode, protected, decided), whole, needed
    )
    _resolve_all(needed, resolve)
    live = {
        path: pubs
        for path, pubs in _by_save(live_names, decode).items()
        if path.count("/") >= 2 and _needed_by(path, needed) is None
    }
    removals: list[Removal] = []
    left: list[str] = []
    for attempt in sorted(set(older) | (set(folders) - protected)):
        _older_removals(
            attempt,
            older.get(attempt, []),
            folders.get(attempt),
            decode,
            needed,
            all_files,
            removals,
            left,
        )
    # The live lineage's folder stays, and so does all it has not published (a save being
    # written); what it published below the K latest goes, one save at a time, so that the
    # disk stays bounded during a long execution too.
    for path, pubs in sorted(live.items()):
        removals.append(Removal(SAVE, path, pubs))
    return Plan(latest, removals, epoch, unsure, needed, left, unpublished)


def _live_folders(folders: dict[str, Folder], epoch: int, needed: dict[str, str]) -> set[str]:
    """The folders that may be the live lineage's (epoch at least the latest publication's,
    their job not ended) or have no record: they stay.  Each folder's verdict is set, and the
    saves a live one chose are needed."""
    for each in folders.values():
        if each.epoch is None:
            each.verdict = f"kept: {each.problem}"
        elif each.epoch >= epoch and not each.ended:
            each.verdict = "kept: its epoch is at least the latest publication's"
            for chosen in each.chosen:
                needed.setdefault(chosen, f"execution {each.attempt} chose it")
    return {
        a
        for a, each in folders.items()
        if each.epoch is None or (each.epoch >= epoch and not each.ended)
    }


def _group_below(
    below: list[str], decode: _Names, protected: set[str], recordless: set[str], latest_epoch: str
) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """The publications below the K latest by where their saves lie: (older folder -> its
    publications, those in a live folder, those older than the latest's epoch in a folder
    with no record).  One pass over the names: each one's folder (mostly one dictionary
    look-up); the paths are decoded only where a save is handled on its own (decoding is the
    costly part).  Epochs are 20 digits: text compares as numbers do."""
    older: dict[str, list[str]] = {}
    live_names: list[str] = []
    unsure: list[str] = []
    folder_of, heads = decode.folder, decode._heads
    cut = 42 + _HEAD_CHARS
    for n in below:
        folder = heads.get(n[42:cut]) if len(n) > cut else None
        if folder is None:
            folder = folder_of(n)
        if folder is None:
            continue  # a save outside exec/: never removed
        if folder in recordless:
            if n[:20] < latest_epoch:
                unsure.append(n)
        elif folder in protected:
            live_names.append(n)
        else:
            same = older.get(folder)
            if same is None:
                older[folder] = [n]
            else:
                same.append(n)
    return older, live_names, unsure


def _by_save(group: list[str], decode: _Names) -> dict[str, list[str]]:
    """Every publication of one save together: names by their path's text."""
    tails: dict[str, list[str]] = {}
    for n in group:
        tails.setdefault(n[42:], []).append(n)
    return {decode.path(pubs[-1]): pubs for pubs in tails.values()}


def _published_tails(
    ordered: list[str], decode: _Names, protected: set[str], decided: Iterable[str]
) -> dict[str, set[str]]:
    """Older folder -> the encoded paths of its publications (also above the K latest: a save
    once named is a save) and of the saves a killed cleanup decided, past the characters
    every path of the folder shares (:func:`_shared_chars`): which saves are published is
    told by them, never by decoding every name (the costly part)."""
    folder_of, heads = decode.folder, decode._heads
    cut = 42 + _HEAD_CHARS
    tails: dict[str, set[str]] = {}
    shared: dict[str, int] = {}
    for n in ordered:
        folder = heads.get(n[42:cut]) if len(n) > cut else None
        folder = folder if folder is not None else folder_of(n)
        if folder is not None and folder not in protected:
            skip = shared.get(folder)
            if skip is None:
                skip = shared[folder] = _shared_chars(folder)
            tails.setdefault(folder, set()).add(n[42 + skip :])
    for path in decided:
        parts = path.split("/")
        if len(parts) >= 3 and parts[0] == EXEC and parts[1] not in protected:
            tails.setdefault(parts[1], set()).add(
                model.encode_path(path)[_shared_chars(parts[1]) :]
            )
    return tails


def _whole_unpublished(
    folders: dict[str, Folder],
    protected: set[str],
    tails: dict[str, set[str]],
    whole: Optional[Callable[[Folder, str], Optional[str]]],
    needed: dict[str, str],
) -> list[tuple[str, str]]:
    """The saves an older execution never published that look whole (``whole``): (path, why
    it looks whole), each made needed, so it stays with its folder."""
    unpublished: list[tuple[str, str]] = []
    for attempt in sorted(set(folders) - protected):
        old = folders[attempt]
        where = f"{EXEC}/{attempt}"
        for entry in _unpublished_saves(old, tails.get(attempt, set())):
            if old.marked(entry):
                continue  # a killed cleanup unpublished it to remove the folder
            path = f"{where}/{entry.rstrip('/')}"
            why = None if whole is None else whole(old, entry)
            if why is not None and _needed_by(path, needed) is None:
                needed[path] = f"never published, and it looks whole ({why})"
                unpublished.append((path, why))
    return unpublished


def _older_removals(
    attempt: str,
    group: list[str],
    f: Optional[Folder],
    decode: _Names,
    needed: dict[str, str],
    all_files: bool,
    removals: list[Removal],
    left: list[str],
) -> None:
    """What goes of an older execution's folder (``f``; None: only publications name it),
    its publications below the K latest being ``group``: the folder whole, when nothing in
    it is needed and it holds only saves (or ``all_files``); else its saves that are not
    needed, one at a time, and those it never published that were cut off."""
    where = f"{EXEC}/{attempt}"
    stays = _needed_by(where, needed)
    unsure_entries = [] if f is None else [e for e in f.entries if not _is_save_entry(e, set(), f)]
    saves: dict[str, list[str]] = {}
    tops: set[str] = set()
    inner: frozenset[str] = frozenset()
    if unsure_entries or stays is not None or f is None:
        saves = _by_save(group, decode)
        tops = {p.split("/")[2] for p in saves if p.count("/") >= 2}
        inner = frozenset(
            p.split("/", 2)[2] for p in saves if p.startswith(f"{where}/{CHECKPOINTS}")
        )
    # (checkpoints/ was looked into: a published save in it does not make it all saves)
    others = [e for e in unsure_entries if not _is_save_entry(e, tops, f, inner)]
    if f is not None and stays is None and (all_files or not others):
        removals.append(
            Removal(FOLDER, where, sorted(group), entries=sorted(f.entries), others=sorted(others))
        )
        f.verdict = "removed"
        return
    if not saves:
        saves = _by_save(group, decode)
        tops = {p.split("/")[2] for p in saves if p.count("/") >= 2}
    if f is not None:
        _keep_verdict(f, where, stays, others, left)
    for path, pubs in sorted(saves.items()):
        if path == where and others and not all_files:
            continue  # the folder itself published as a save: its other files stay
        if _needed_by(path, needed) is None:
            removals.append(Removal(SAVE, path, pubs))
    if f is not None:
        removals.extend(_cut_off(f, where, tops, needed))


def _keep_verdict(
    f: Folder, where: str, stays: Optional[str], others: list[str], left: list[str]
) -> None:
    """Why an older folder stays: a save in it stays, or it holds files that are not saves
    (``left`` gets them)."""
    if stays is not None:
        f.verdict = (
            "kept: it holds a save never published that looks whole"
            if stays.startswith("never published")
            else "kept: it holds a save that stays"
        )
    else:
        f.verdict = (
            "kept: it holds files that are not saves ("
            + ", ".join(others[:3])
            + (", ..." if len(others) > 3 else "")
            + "); `dispatch gc --all-files` removes them too"
        )
        left.extend(f"{where}/{e}" for e in sorted(others))


def _cut_off(f: Folder, where: str, tops: set[str], needed: dict[str, str]) -> list[Removal]:
    """The saves an older folder that stays never published and that are not needed (those
    that look whole are, unless --remove-unpublished): cut off while being written."""
    found = []
    for entry in sorted(f.entries):
        bare = entry.rstrip("/")
        path = f"{where}/{bare}"
        if (
            bare not in tops
            and not execdir.is_own(bare)
            and _SAVE_NAME.fullmatch(entry)
            and entry != CHECKPOINTS
            and entry not in f.not_dcp
            and _is_save_entry(entry, tops, f)
            and _needed_by(path, needed) is None
        ):
            found.append(Removal(SAVE, path, []))
    return found


def _unpublished_saves(f: Folder, tails: set[str]) -> list[str]:
    """The saves in an older execution's folder that no publication names (``tails``: the
    encoded paths of its publications) and that may look whole: its entries (and those of
    its ``checkpoints/``, as ``checkpoints/<name>``) that are saves by name and, for a
    ``.ckpt`` or ``step-N/`` folder, by what it holds (:func:`_is_save_entry`); a file only
    with its manifest beside it or ``step=<N>`` in its name (:func:`looks_whole`)."""
    found = []
    for entry in f.entries:
        if (
            execdir.is_own(entry.rstrip("/"))
            or entry == CHECKPOINTS
            or entry in f.not_dcp
            or _SAVE_NAME.fullmatch(entry) is None
        ):
            continue
        found.append(entry)
    found += [
        CHECKPOINTS + name
        for name in f.inner
        if not name.endswith(execdir.MANIFEST_SUFFIX) and _inner_is_save(name, f, frozenset())
    ]
    found = [
        e
        for e in found
        if e.endswith("/") or _file_step(e) is not None or f.has(e + execdir.MANIFEST_SUFFIX)
    ]
    where, skip = f"{EXEC}/{f.attempt}/", _shared_chars(f.attempt)
    encoded = model.encode_paths([where + e.rstrip("/") for e in found])
    return sorted(e for e, rest in zip(found, encoded) if rest[skip:] not in tails)


def _mark_ended(
    folders: dict[str, Folder],
    latest_epoch: Optional[int],
    ended: Optional[Callable[[str], frozenset[str]]],
) -> None:
    """Mark the executions that would be taken for live (epoch at least the latest's) that
    their job's record says ended (``ended``: :func:`collect`)."""
    if ended is None or latest_epoch is None:
        return
    found: dict[str, frozenset[str]] = {}
    for f in folders.values():
        if f.epoch is None or f.epoch < latest_epoch or not f.job:
            continue
        if f.job not in found:
            found[f.job] = ended(f.job)
        f.ended = f.attempt in found[f.job]


def _holds_dcp_only(st: Store, attempt: str, entry: str) -> bool:
    """The folder ``entry`` of an execution's folder holds only what a DCP save holds (and,
    a ``.ckpt/`` one, Lightning's meta.pt)."""
    meta = _sharded_meta(entry)
    return all(
        _DCP_FILE.fullmatch(n) or (meta is not None and n == meta)
        for n in st.list_exec_entries(attempt, entry.rstrip("/"))
    )


def _sharded_meta(entry: str) -> Optional[str]:
    """The file written after the shards into a DCP folder named as a save file (Lightning's
    meta.pt in a ``.ckpt/`` folder), or None."""
    return next((meta for suffix, meta in _SHARDED_META.items() if entry.endswith(suffix)), None)


def step_of(path: str) -> Optional[int]:
    """The step a save's name says (``checkpoint-N``, ``step-N``, ``...step=N...ckpt``)."""
    name = path.rsplit("/", 1)[-1]
    bare = next((name[len(p) :] for p in _WRITING if name.startswith(p)), name)
    step = frameworks.first_step(bare, _FOLDER_STEPS)
    return step if step is not None else _file_step(name)


def looks_whole(st: Store, f: Folder, entry: str) -> Optional[str]:
    """Why the save ``entry`` of the execution folder ``f``, which no publication names,
    looks whole, or None (one cut off while being written, or one that cannot be told).

    The rules ``dispatch watch`` publishes by (execution/saverules.py), as far as the store
    can read them without reading the save's data: sealed by an integration (its manifest is
    there, and the save holds at least the bytes it lists); else a DCP folder (``step-N/``,
    a ``.ckpt/`` folder, or any folder holding ``.metadata``) with its ``.metadata`` renamed
    into place (non-empty, no ``.metadata.tmp`` beside it; Lightning's ``meta.pt`` too); a
    ``checkpoint-N/`` whose ready file ``trainer_state.json`` is whole JSON; a ``.ckpt``
    file watch names a save (``step=<N>``) that is not empty (its zip is not read: a copy
    cut off while it grew looks whole too, and stays).  A ``tmp-checkpoint-N/`` (the
    Trainer's, before its rename) never looks whole."""
    bare = entry.rstrip("/")
    where = f"{EXEC}/{f.attempt}/{bare}"
    if bare.rsplit("/", 1)[-1].startswith("tmp-"):
        return None
    raw = _manifest(st, f.attempt, bare)
    if raw is not None:
        data = execdir.load(raw)
        files = data.get("files") if data else None
        if not isinstance(files, dict) or not all(type(size) is int for size in files.values()):
            return None
        if st.size(where) - len(raw) < sum(files.values()):
            return None
        return "sealed: its manifest is there and every byte it lists"
    if not entry.endswith("/"):  # only a name watch publishes (a last.ckpt never is)
        return (
            "a file named as Lightning names a save (step=N), not empty"
            if _file_step(entry) is not None and st.size(where) > 0
            else None
        )
    inside = set(st.list_exec_entries(f.attempt, bare))
    if _DCP_FOLDER.fullmatch(entry) or {_METADATA, _METADATA_TMP} & inside:
        if (
            _METADATA_TMP in inside
            or _METADATA not in inside
            or st.size(f"{where}/{_METADATA}") == 0
        ):
            return None
        meta = _sharded_meta(entry)
        if meta is not None and (meta not in inside or st.size(f"{where}/{meta}") == 0):
            return None
        return "a DCP save whose .metadata is in place"
    if execdir.load(st.read_exec_file(f.attempt, f"{bare}/{READY}")) is None:
        return None
    return f"its {READY} is whole"


READY = frameworks.TRAINER.ready  # the Trainer writes it last into checkpoint-N/ (watch's default)
_METADATA, _METADATA_TMP = frameworks.DCP_METADATA, frameworks.DCP_METADATA_TMP


def _resolve_all(needed: dict[str, str], resolve: Callable[[str], list[str]]) -> None:
    """A needed save reached through symlinks keeps every link on the way and what they lead
    to, and so does a symlink inside it (what it leads to is followed again)."""
    todo = list(needed.items())
    while todo:
        path, why = todo.pop()
        for target in resolve(path):
            if target not in needed:
                needed[target] = f"{why} (through the symlink {path})"
                todo.append((target, needed[target]))


def _folders(
    st: Store, attempts: Optional[list[str]] = None, listed: Optional[dict[str, list[str]]] = None
) -> dict[str, Folder]:
    """The execution folders (all, or those of ``attempts``) with their records and names
    (``listed``: :meth:`Store.exec_entries`, read now when not given).  A folder that holds
    nothing (an S3 listing may still name one whose objects are all gone) is not there."""
    listed = st.exec_entries() if listed is None else listed
    out: dict[str, Folder] = {}
    for attempt in sorted(listed) if attempts is None else attempts:
        entries = listed.get(attempt)
        if not entries:
            continue
        out[attempt] = (
            read_folder(st, attempt, entries)
            if RECORD in entries
            else Folder(attempt, None, None, problem="no record", entries=entries)
        )
    return out


def default_keep(
    st: Store, attempts: Iterable[str], folders: Optional[dict[str, Folder]] = None
) -> int:
    """The greatest rotation limit the integrations recorded in any execution's folder."""
    found = []
    for attempt in attempts:
        if (
            folders is not None
            and attempt in folders
            and KEEP_RECORD not in folders[attempt].entries
        ):
            continue
        raw = st.read_exec_file(attempt, KEEP_RECORD)
        if execdir.keeps_every(raw):
            return EVERY  # a checkpoint callback keeps every save: no limit applies
        value = execdir.keep_of(raw)
        if value is not None:
            found.append(value)
    if not found:
        raise UsageError(
            "--keep K is required: no execution recorded its framework's "
            f"rotation limit ({KEEP_RECORD})"
        )
    return max(found)


EVERY = 10**9  # the K of a framework that keeps every save


def pin_entry(relative: str) -> str:
    """The entry in ``pins/`` of the save at ``relative``: its path in base32."""
    return model.encode_path(relative)


def pinned(st: Store) -> dict[str, str]:
    """Every pinned save (relative to the root) -> why it stays."""
    out = {}
    for entry in st.list_pins():
        try:
            out[model.decode_path(entry, name=entry)] = "pinned (dispatch pin)"
        except BadPublicationName as exc:
            raise StoreError(f"{entry!r} in pins/ is not a pinned save's name: {exc}") from None
    return out


def bests(
    st: Store, names: list[str], folders: dict[str, Folder], decode: _Names
) -> dict[str, str]:
    """The saves the framework of each live execution (its epoch at least the latest
    publication's) keeps as its best: what the manifest of its latest save lists, or, before
    it has published, the manifest of the save it chose to resume from."""
    if not names:
        return {}
    latest_epoch = int(names[-1][:20])
    live = {
        a
        for a, f in folders.items()
        if f.epoch is not None and f.epoch >= latest_epoch and not f.ended
    }
    # live attempt -> (epoch and step of its latest publications, their saves): several
    # saves of one step (two checkpoint callbacks) are made in an order no name tells.
    newest: dict[str, tuple[str, list[str]]] = {}
    first = len(names)
    floor = names[-1][:20]  # a live execution's publications are at the latest epoch or above
    while first > 0 and names[first - 1][:20] >= floor:
        first -= 1
    for n in names[first:]:  # in order: the last ones seen are the latest
        folder = decode.folder(n)
        if folder in live:
            at = newest.get(folder)
            if at is not None and at[0] == n[:41]:
                at[1].append(decode.path(n))
            else:
                newest[folder] = (n[:41], [decode.path(n)])
    out: dict[str, str] = {}
    for attempt in sorted(live):
        sources = newest[attempt][1] if attempt in newest else folders[attempt].chosen
        for source in sources:
            for best in execdir.bests_of(_manifest_at(st, source)):
                try:
                    out.setdefault(
                        model.normalize_relative(best),
                        f"the framework of execution {attempt} keeps it as best",
                    )
                except OutsideRoot:
                    continue
    return out


def _manifest_at(st: Store, relative: str) -> Optional[bytes]:
    parts = relative.split("/", 2)
    if len(parts) < 3 or parts[0] != EXEC:
        return None
    return _manifest(st, parts[1], parts[2])


def _manifest(st: Store, attempt: str, inside: str) -> Optional[bytes]:
    """The manifest of the save ``exec/<attempt>/<inside>`` (beside a file save, inside a
    folder save), or None."""
    raw = st.read_exec_file(attempt, inside + execdir.MANIFEST_SUFFIX)
    if raw is not None:
        return raw
    try:
        return st.read_exec_file(attempt, f"{inside}/{execdir.MANIFEST_NAME}")
    except StoreError:  # a file save: nothing inside it
        return None


LAG_ENV = "DISPATCH_LISTING_LAG"


def listing_lag(value: Optional[float] = None, environ: Optional[dict[str, str]] = None) -> float:
    """Seconds a node's view of the root's listings may lag: ``value``, else
    ``$DISPATCH_LISTING_LAG``, else ``ListingLag`` in dispatch.conf (default 60)."""
    if value is not None:
        if not 0 <= value <= 3600:
            raise UsageError(f"--listing-lag {value!r} must be 0 to 3600 seconds")
        return float(value)
    env = dict(os.environ if environ is None else environ)
    raw = env.get(LAG_ENV, "").strip()
    if raw:
        try:
            return listing_lag(float(raw))
        except ValueError:
            raise UsageError(f"${LAG_ENV} {raw!r} is not a number of seconds") from None
    from .. import config

    return float(config.load(environ=env).listing_lag)


def collect(
    root: str,
    keep: Optional[int],
    *,
    dry_run: bool = False,
    sizes: bool = False,
    timeout: Optional[float] = None,
    store: Optional[Store] = None,
    all_files: bool = False,
    lag: Optional[float] = None,
    remove_unpublished: bool = False,
    ended: Optional[Callable[[str], frozenset[str]]] = None,
    say: Callable[[str], None] = lambda line: None,
    wait: Callable[[float], None] = time.sleep,
    pause: Callable[[str], None] = lambda where: None,
) -> Report:
    """Apply the rule to ``root`` (or only say what it would remove, with ``dry_run``).

    ``lag``: how stale another node's view of the listings may be (:func:`listing_lag`);
    ``say`` hears of the wait it costs.  ``pause(where)`` is called between the stages
    (tests stop the process there).  ``remove_unpublished``: an older execution's saves
    that were never published go even when they look whole (``Report.unpublished`` lists
    those that stay otherwise).  ``ended(job)``: the executions (attempts) of a dispatch job
    that its record says ended for good
    (:func:`slurm_dispatch.control.forget.ended_attempts`); such an execution is no live
    one, whatever its epoch.
    """
    if keep is not None:
        check_keep(keep)
    st = store or open_store(root, timeout)
    st.check_store()
    intents = st.list_intents()
    check_names(intents, st.locate(GC))  # they are decoded as publication names
    folders = _folders(st)
    if keep is None:
        keep = default_keep(st, folders, folders)
    names = st.publication_names()
    names.sort()
    decode = _Names()
    _read_folders(st, folders, int(names[-1][:20]) if names else None, ended)
    needed = _needed_first(st, names, folders, decode)
    found = plan(
        names,
        folders,
        keep,
        decode,
        presorted=True,
        needed=needed,
        all_files=all_files,
        resolve=st.resolve,
        whole=None if remove_unpublished else lambda f, e: looks_whole(st, f, e),
        decided=[decode.path(n) for n in intents],
    )
    present = set(names)
    held = _finish_decided(st, found, intents, present, decode)
    report = Report(
        root,
        keep,
        dry_run,
        found.latest,
        found.removals,
        sorted(folders.values(), key=lambda f: (f.epoch or 0, f.attempt)),
        kept=found.needed,
        left=found.left,
        unpublished=[
            Unpublished(path, folders[path.split("/")[1]].epoch, step_of(path), why)
            for path, why in found.unpublished
        ],
    )
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
    _mark_folders(st, found, decode)
    pause("intents")
    st.delete_publications(
        sorted({n for r in found.removals for n in r.publications if n in present})
    )
    pause("unpublished")
    seconds = 2 * listing_lag(lag)
    if seconds > 0 and any(not r.skipped for r in found.removals):
        say(
            f"waiting {seconds:g} s (twice ListingLag) for every node's view of pub/ to show "
            "the removed publications before reading the executions' choices again"
        )
        wait(seconds)
    _spare_new_sources(st, folders, found, report)
    _remove(st, found, folders, decode, remove_unpublished, pause)
    # An intent is forgotten once its save is gone; one whose save was spared (a starting
    # execution chose it) stays, and the next run decides again.
    spared = {n for r in found.removals if r.skipped for n in r.publications}
    done = sorted((set(intents) | set(singles)) - set(held) - spared)
    if done:
        st.delete_intents(done)
    report.finished_intents = len(set(intents) - set(held))
    return report


def _read_folders(
    st: Store,
    folders: dict[str, Folder],
    latest_epoch: Optional[int],
    ended: Optional[Callable[[str], frozenset[str]]],
) -> None:
    """What the plan needs of each folder besides its record: whether its job ended, the
    choices of those that may be live; of the older ones, the names in their
    ``checkpoints/``, a killed cleanup's mark, and which of their DCP-named folders hold
    something else."""
    _mark_ended(folders, latest_epoch, ended)
    for f in folders.values():
        if (
            f.epoch is not None
            and (latest_epoch is None or f.epoch >= latest_epoch)
            and not f.ended
        ):
            read_choices(st, f, f.entries)
    older = [
        f
        for f in folders.values()
        if f.epoch is not None and latest_epoch is not None and (f.epoch < latest_epoch or f.ended)
    ]
    for f in older:
        if CHECKPOINTS in f.entries:
            f.inner = st.list_exec_entries(f.attempt, CHECKPOINTS.rstrip("/"))
        if execdir.REMOVING in f.entries:
            f.decided = read_mark(st.read_exec_file(f.attempt, execdir.REMOVING))
    for f in older:
        # A step-N/ or .ckpt/ folder is a save (torchtitan's, Lightning's sharded one: DCP)
        # only while it holds nothing but a DCP save's files: a user's own analysis.ckpt/
        # stays, and so does the folder around it.
        f.not_dcp = {
            e
            for e in [*f.entries, *(CHECKPOINTS + n for n in f.inner)]
            if _DCP_FOLDER.fullmatch(e)
            and e != CHECKPOINTS
            and not _holds_dcp_only(st, f.attempt, e)
        }


def _needed_first(
    st: Store, names: list[str], folders: dict[str, Folder], decode: _Names
) -> dict[str, str]:
    """The saves needed before the plan: pinned ones, a quarantined latest and the save the
    next execution resumes from below it, and the live executions' frameworks' bests."""
    needed = pinned(st)
    newest = decode.path(names[-1]) if names else None
    marked = quarantine.quarantined(st) if names else set()
    if newest is not None and newest in marked:
        needed.setdefault(
            newest, "quarantined, the latest publication (dispatch unquarantine lifts it)"
        )
        # The save the next execution resumes from (quarantine.choose), whatever K: the
        # quarantined latest is one of the K latest, and the fallback below it must stay.
        below = next(
            (decode.path(n) for n in reversed(names) if decode.path(n) not in marked), None
        )
        if below is not None:
            needed.setdefault(
                below, "the latest publication not quarantined: the next execution resumes from it"
            )
    for path, why in bests(st, names, folders, decode).items():
        needed.setdefault(path, why)
    return needed


def _finish_decided(
    st: Store, found: Plan, intents: list[str], present: set[str], decode: _Names
) -> list[str]:
    """A removal a killed cleanup decided (its publication is gone already) is finished,
    whatever K this run was given, unless the save has become needed since (those intents
    are returned: held); and an older publication into a folder with no record goes where
    its save is gone already."""
    held: list[str] = []
    planned = {r.path for r in found.removals}
    for n in sorted(set(intents) - present):
        path = decode.path(n)
        if _needed_by(path, found.needed) is not None:
            held.append(n)
        elif path not in planned and "/".join(path.split("/")[:2]) not in planned:
            found.removals.append(Removal(SAVE, path, [n]))
            planned.add(path)
    for n in found.unsure:
        path = decode.path(n)
        if _needed_by(path, found.needed) is None and not st.exists(path):
            found.removals.append(Removal(PUBLICATION, path, [n], 0))
    return held


def _mark_folders(st: Store, found: Plan, decode: _Names) -> None:
    """Mark each folder removed whole (``.dispatch-removing``) with the saves whose
    publications it removes now: those are not saves it never published, and one it never
    published (cut off at the plan, or written since) is not among them."""
    for r in found.removals:
        if r.kind == FOLDER and execdir.REMOVING not in r.entries:
            try:
                st.create_exec_file(
                    r.path.split("/")[1],
                    execdir.REMOVING,
                    mark_of(_inside(r.path, decode.path(n)) for n in r.publications),
                )
            except FileExistsError:
                pass


def _remove(
    st: Store,
    found: Plan,
    folders: dict[str, Folder],
    decode: _Names,
    remove_unpublished: bool,
    pause: Callable[[str], None],
) -> None:
    """Remove what the plan says and was not spared: a folder whole (unless a save it never
    published was written whole since the plan, or an old execution still writes into it),
    a save on its own."""
    for r in found.removals:
        if r.skipped:
            continue
        if r.kind == FOLDER:
            late = (
                None
                if remove_unpublished
                else _written_since(
                    st,
                    folders[r.path.split("/")[1]],
                    {_inside(r.path, decode.path(n)) for n in r.publications},
                )
            )
            if late is not None:
                r.skipped = (
                    f"{late}, never published, was written whole while cleanup ran: "
                    "the folder stays for the next cleanup to judge"
                )
                continue
            try:
                r.bytes = st.remove_exec(r.path.split("/")[1], RECORD, execdir.REMOVING)
            except StillWritten as exc:
                # An old execution still running writes into its folder: nothing of it is
                # published any more (its publications went first); the rest goes next time.
                r.skipped = str(exc)
        elif r.kind == SAVE:
            r.bytes = st.remove_save(r.path)
        pause("removed")


def _inside(folder: str, path: str) -> str:
    """``path`` (relative to the root) relative to the folder ``folder`` holding it."""
    return path[len(folder) + 1 :] if path.startswith(folder + "/") else path


def _written_since(st: Store, f: Folder, published: set[str]) -> Optional[str]:
    """A save in the older folder ``f``, about to be removed whole, that was not published
    at the plan (``published``: its saves' paths in it; nor by a killed cleanup's mark) and
    looks whole now (an old execution
    still running wrote it, or finished it, meanwhile), or None."""
    entries = st.list_exec_entries(f.attempt)
    now = Folder(f.attempt, f.epoch, f.resume, entries=entries)
    if CHECKPOINTS in entries:
        now.inner = st.list_exec_entries(f.attempt, CHECKPOINTS.rstrip("/"))
    for entry in _unpublished_saves(now, set()):
        if f.marked(entry):
            continue  # a killed cleanup unpublished it: this run finishes that
        if entry.rstrip("/") not in published and looks_whole(st, now, entry) is not None:
            return f"{EXEC}/{f.attempt}/{entry.rstrip('/')}"
    return None


def _spare_new_sources(st: Store, folders: dict[str, Folder], found: Plan, report: Report) -> None:
    """After the publications are gone, read again what every execution that may be live
    has chosen (and the records cleanup had not seen): an execution that started, or chose
    a fallback, meanwhile keeps the save it chose."""
    if found.epoch is None:
        return
    spared: dict[str, str] = {}
    now = st.exec_entries()
    fresh = [a for a in now if a not in folders or folders[a].epoch is None]
    for attempt, f in _folders(st, fresh, now).items():
        if attempt not in folders:
            report.folders.append(f)
            f.verdict = "kept: it started while cleanup ran"
        folders[attempt] = f
    for attempt, f in folders.items():
        if attempt in now and (f.epoch is None or (f.epoch >= found.epoch and not f.ended)):
            if f.epoch is not None:
                read_choices(st, f, now[attempt])
            for chosen in f.chosen:
                spared[chosen] = f"execution {attempt} chose it"
    for path, why in pinned(st).items():  # a pin made while cleanup ran
        spared.setdefault(path, why)
    _resolve_all(spared, st.resolve)
    for r in found.removals:
        because = _needed_by(r.path, spared)
        if because is not None:
            r.skipped = (
                f"a starting execution resumes from it ({because} while cleanup ran)"
                if "chose it" in because
                else f"{because} while cleanup ran"
            )


def pin(root: str, path: str, timeout: Optional[float] = None) -> bool:
    """Pin the published save at ``path``: no cleanup removes it until it is unpinned.
    Returns False when it was pinned already."""
    st = open_store(root, timeout)
    relative = quarantine.save_under(st, path)
    names = st.publication_names()
    decode = _Names()
    mine = [n for n in names if decode.path(n) == relative]
    if not mine:
        raise UsageError(
            f"{path!r} is not a published save of {root!r}: only a save some "
            "publication names can be pinned, spelled as `dispatch list` "
            "shows it"
        )
    made = st.create_pin(pin_entry(relative))
    # The handshake with a cleanup running now: it re-reads pins/ after removing
    # publications, so a pin made while one is still there is seen; one made after is not.
    if not any(st.has_publication(n) for n in mine):
        if made:
            st.delete_pin(pin_entry(relative))
        raise StoreError(
            f"{path!r} was being removed by a cleanup (dispatch gc) while it "
            "was pinned; it is not pinned"
        )
    return made


def unpin(root: str, path: str, timeout: Optional[float] = None) -> bool:
    """Unpin the save at ``path``; False when it was not pinned."""
    st = open_store(root, timeout)
    return st.delete_pin(pin_entry(quarantine.save_under(st, path)))


_RUNNING: dict[str, threading.Thread] = {}
_AGAIN: set[str] = set()


def collect_in_background(
    root: str, keep: int, say: Callable[[str], None] = lambda line: None
) -> None:
    """Run :func:`collect` for ``root`` beside the caller (a job's training or watch loop), one
    run at a time per root; a request while one runs makes one more run after it.  With no
    listing lag there is nothing to wait for, and it runs at once in the caller.  A failure is
    said and ends this process's cleanups of the root (a later run finishes what it began)."""
    if listing_lag() == 0:
        _collect_reporting(root, keep, say)
        return
    thread = _RUNNING.get(root)
    if thread is not None and thread.is_alive():
        _AGAIN.add(root)
        return

    def work() -> None:
        while _collect_reporting(root, keep, say) and root in _AGAIN:
            _AGAIN.discard(root)

    thread = threading.Thread(target=work, name="dispatch-cleanup", daemon=True)
    _RUNNING[root] = thread
    thread.start()


_FAILED: set[str] = set()


def _collect_reporting(root: str, keep: int, say: Callable[[str], None]) -> bool:
    if root in _FAILED:
        return False
    try:
        done = collect(root, keep, say=say)
    except (StoreError, UsageError, OSError) as exc:
        _FAILED.add(root)
        say(f"cleanup stopped (saves are still published; run `dispatch gc` later): {exc}")
        return False
    except Exception as exc:  # noqa: BLE001 - a cleanup never ends a training run
        _FAILED.add(root)
        say(f"cleanup stopped by an unexpected error (saves are still published): {exc!r}")
        return False
    for removal in done.removals:
        if not removal.skipped:
            say(f"removed {removal.kind} {removal.path} ({removal.bytes} bytes)")
    return True


def say_on_stderr(line: str) -> None:
    sys.stderr.write(f"dispatch: {line}\n")
    sys.stderr.flush()
