"""Which names in an execution's folder are saves, their steps, and when a save is complete.

The rules ``dispatch watch`` publishes by (:class:`SaveRule`): a folder ``checkpoint-<N>``
once its ready file is whole (accelerate's ``checkpoint_<N>`` once its RNG states,
``random_states_0.pkl``, are, and it holds as many of the objects registered with
``register_for_checkpointing``, ``custom_checkpoint_<k>.pkl``, which ``save_state`` writes
after them, as the saves of the same trainer that the watcher knows: :func:`registered_objects`;
their number is the trainer's, so only ``--ready`` can name the last for its very first save);
a ``.ckpt`` file whose name
holds ``step=<N>`` once it is in place and whole; Lightning's ``hpc_ckpt_<n>.ckpt`` (the save
its own SLURM auto-requeue makes at the requeue signal, in ``default_root_dir``) on the same
terms, its step read from it (:func:`step_inside`: the name holds none, and ``<n>`` counts the
folder's hpc saves from 1 in every execution); or, with a pattern, every name matching a
glob with one ``{step}``.  Watch applies them to every name at most :data:`SCAN_DEPTH` names
below its folder (Lightning's default layout is 4 deep).  A
folder holding ``.metadata`` is a ``torch.distributed.checkpoint`` (DCP) save, whatever its
name (``step-<N>``, torchtitan's, is a save's name too; a ``.ckpt`` folder is Lightning's
sharded save): it looks whole once :func:`dcp_problem` finds nothing missing.
:func:`step_named` finds, below an execution's folder, the entries those default names call
saves: what a run that published nothing may have missed.

Why a DCP save, which several ranks write (on several nodes), is safe to judge from one
node: ``torch.distributed.checkpoint.save`` (and ``async_save``, in its background thread) is
one collective.  Every rank writes its own shard files (fsynced by ``FileSystemWriter``'s
default ``sync_files``), the write results are gathered to the coordinator, and only then does
the coordinator write the metadata, to ``.metadata.tmp``, and rename it to ``.metadata``
(``FileSystemWriter.finish``).  So ``.metadata`` in place means every rank has finished
writing: a writer on another node, which the ``/proc`` check cannot see, has already closed
its files.  What is still checked, because the rename proves nothing about them: that the
``.metadata`` in place is whole and is DCP's (it is read, never trusted: a pickle read with
stand-ins, so nothing in it runs and torch is not needed); that every file its
``storage_data`` names is a regular file in the folder, long enough for every item's offset
and length (a shard lost or cut short, or a listing that lags on a shared file system); that
no ``.metadata.tmp`` is beside it (a second save into the same folder, whose old
``.metadata`` stays until the rename); and, for Lightning's sharded ``.ckpt`` folder, that
``meta.pt``, which rank 0 writes after the collective save, is whole.  The snapshot rule
below still applies (a shard rewritten in place by a second save of the same folder).  A
save made without collectives (each rank's own ``__<rank>.metadata``, no ``.metadata``)
never looks whole: no file says how many ranks there were.

Looking whole is not enough to be complete: a file written in place (safetensors, a pickle,
a preallocated file) looks whole while it grows, and a folder's ready file may not be its
last file (transformers before 4.36 writes ``trainer_state.json`` before ``rng_state.pth``).
So a save is complete only when it looks whole (:func:`looks_whole`), its :func:`snapshot`
(every entry's type, size, mtime and ctime in ns, inode and device, recursively) is the same
at two consecutive scans, and :func:`open_for_writing` finds no process of this user on this
node holding one of its files open for writing or mapped shared and writable.  The watcher
applies that rule; this module gives its parts.

Invariants: a name's meaning depends on the name alone (so a name decided once never needs
deciding again; for ``hpc_ckpt_<n>.ckpt`` the name says its step is inside it, read once it
looks whole); nothing here follows a symlink (but :func:`step_named`, which only lists
through one, to name saves no scan could see), blocks on a FIFO, or writes; reading
``/proc`` touches no other file system (links are read, never followed).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
import struct
import zipfile
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import _fsio
from ..checkpoint import frameworks
from ..checkpoint.model import STEP_LIMIT
from ..errors import UsageError

_WATCHED = frameworks.rows("watch")  # the saves table's rows watch publishes by
DEFAULT_READY = frameworks.TRAINER.ready  # written last into checkpoint-N/
FOLDER, FILE, EITHER = "folder", "file", "either"  # what kind of entry a save's name must be
INSIDE = "file, step inside"  # a save file whose name holds no step: step_inside reads it
STEP_INSIDE = -1  # the step step_of gives an INSIDE name: not known from the name

# The table's names (module docstring): save folders (the Trainer's checkpoint-<N>,
# torchtitan's step-<N>, accelerate's checkpoint_<i>), save files with their step in the
# name (Lightning's *step=<N>*.ckpt) and with it inside (hpc_ckpt_<n>.ckpt).
_FOLDER_NAMES = frameworks.compiled([row.folder for row in _WATCHED])
_DCP_FOLDERS = frameworks.compiled([row.folder for row in _WATCHED if row.dcp])
_FILE_STEPS = frameworks.compiled([row.file for row in _WATCHED])
_INSIDE_FILES = frameworks.compiled([row.step_inside for row in _WATCHED])
# A folder whose framework writes registered objects after its ready file (accelerate's
# custom_checkpoint_<k>.pkl after random_states_0.pkl): (its name, its ready file).
_COUNTED = tuple(
    (re.compile(row.folder), row.ready)
    for row in _WATCHED
    if row.folder is not None and row.objects is not None
)
_OBJECTS = frameworks.compiled([row.objects for row in _WATCHED])
ACCELERATE_READY = frameworks.ACCELERATE.ready
DCP_METADATA = frameworks.DCP_METADATA  # the DCP coordinator renames it into place last
DCP_METADATA_TMP = frameworks.DCP_METADATA_TMP  # what it writes first
# A DCP folder of a framework's save suffix (Lightning's FSDP sharded .ckpt folder) -> the
# file rank 0 writes after the shards
_SHARDED_META = {
    row.suffix: row.sharded_meta
    for row in _WATCHED
    if row.suffix is not None and row.sharded_meta is not None
}
LIGHTNING_SHARDED_META = frameworks.LIGHTNING.sharded_meta or ""
DCP_METADATA_LIMIT = 1 << 30  # a .metadata larger than this is not read (bytes)
PICKLE_LIMIT = 1 << 28  # a torch.save zip's data.pkl larger than this is not read (bytes)
# A save's path below the watched folder holds at most this many names: Lightning's default
# lightning_logs/version_<N>/checkpoints/epoch=E-step=S.ckpt is 4.
SCAN_DEPTH = 4
NAMED_DEPTH = 8  # how deep step_named looks below the execution's folder
NAMED_LIMIT = 100_000  # and over how many entries at most
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_END = b"PK\x06\x06"


@dataclass(frozen=True)
class SaveRule:
    """Which names in the folder are saves, their steps, and when each looks whole.

    Without a pattern: a folder ``checkpoint-<N>`` (whole once its ready file is) or
    ``step-<N>`` (a DCP save), or a ``.ckpt`` file whose name holds ``step=<N>`` (whole once
    in place, non-empty and, for a zip, ended by its end record; a ``.ckpt`` folder is
    Lightning's sharded save, a DCP one), or Lightning's ``hpc_ckpt_<n>.ckpt`` file, whole
    on the same terms, its step (:data:`STEP_INSIDE` from the name) read from it.  Any
    folder save holding ``.metadata`` is whole once :func:`dcp_problem` says nothing.  With a
    pattern (a glob over names in the folder with one ``{step}`` standing for the digits),
    every matching name is a save: a folder needs its ready file, a file is whole on the same
    terms.  Names starting with "." are never saves.
    Complete also needs the save unchanged and unwritten (the module's docstring).
    """

    pattern: Optional[str] = None
    ready: str = DEFAULT_READY
    regex: Optional[re.Pattern[str]] = field(default=None, compare=False)
    ready_given: bool = False  # --ready named it: every save folder's, accelerate's too

    @classmethod
    def make(cls, pattern: Optional[str] = None, ready: Optional[str] = None) -> SaveRule:
        given = ready is not None
        ready = DEFAULT_READY if ready is None else ready
        if ready in ("", ".", "..") or "/" in ready or "\0" in ready:
            raise UsageError(f"--ready {ready!r} is not a file name (one name, no '/')")
        if pattern is None:
            return cls(None, ready, None, given)
        return cls(pattern, ready, compile_pattern(pattern), given)

    def ready_for(self, name: str) -> str:
        """The ready file of a save folder of this name: --ready's, else what the framework
        that names its saves so writes last."""
        return self._counted(name) or self.ready

    def counts_objects(self, name: str) -> bool:
        """A save folder of this name is accelerate's, judged by its RNG states (no --ready):
        whole only with as many registered objects as its kin (:func:`registered_objects`)."""
        return self._counted(name) is not None

    def _counted(self, name: str) -> Optional[str]:
        """The ready file of a framework that writes registered objects after it, when a
        save folder of this name is that framework's (and no --ready or pattern rules)."""
        if self.ready_given or self.regex is not None:
            return None
        return next((ready for folder, ready in _COUNTED if folder.fullmatch(name)), None)

    def describe(self) -> str:
        """The names this rule takes for saves, in words."""
        if self.pattern is not None:
            return f"as --pattern {self.pattern!r} says"
        return (
            f"checkpoint-<N>/ (holding its --ready file, {self.ready!r}), "
            f"checkpoint_<N>/ (accelerate's, holding {self.ready_for('checkpoint_0')!r}), "
            "step-<N>/ (a torch.distributed.checkpoint save), *step=<N>*.ckpt or "
            "hpc_ckpt_<n>.ckpt (Lightning's save at the requeue signal)"
        )

    def step_of(self, name: str) -> Optional[tuple[int, str]]:
        """(step, kind) of a save's name, kind being FOLDER, FILE, EITHER or INSIDE (a file
        whose step, :data:`STEP_INSIDE` here, :func:`step_inside` reads); None when the name
        is no save."""
        if name.startswith("."):
            return None
        if self.regex is not None:
            match = self.regex.fullmatch(name)
            return (int(match.group(1)), EITHER) if match else None
        step = frameworks.first_step(name, _FOLDER_NAMES)
        if step is not None:
            return step, FOLDER
        step = frameworks.first_step(name, _FILE_STEPS, search=True)
        if step is not None:
            return step, FILE
        inside = frameworks.first_step(name, _INSIDE_FILES)
        return (STEP_INSIDE, INSIDE) if inside is not None else None


def step_named(folder: str) -> list[str]:
    """The entries under ``folder`` (at most :data:`NAMED_DEPTH` names deep, of the first
    :data:`NAMED_LIMIT` entries) that the default rule names as saves with a step, sorted, as
    reached from ``folder``; nothing under them is looked at, no name starting with "." is
    entered.  What a run that published nothing may have missed.  A symlink to a folder is
    looked through (listed, never written; each real folder once), as watch never does:
    ``ln -s /scratch/run lightning_logs`` hides the saves behind it from watch, not from
    this."""
    rule = SaveRule.make()
    found: list[str] = []
    pending = [(folder, 0)]
    visited = {os.path.realpath(folder)}
    seen = 0
    while pending and seen < NAMED_LIMIT:
        path, depth = pending.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.name.startswith("."):
                continue
            if rule.step_of(entry.name) is not None:
                found.append(entry.path)
            elif depth + 1 < NAMED_DEPTH and _folder_once(entry, visited):
                pending.append((entry.path, depth + 1))
    return sorted(found)


def _folder_once(entry: os.DirEntry[str], visited: set[str]) -> bool:
    """``entry`` is a folder, or a symlink to one, whose real path was not entered yet."""
    try:
        if not entry.is_dir(follow_symlinks=True):
            return False
    except OSError:
        return False
    if not entry.is_symlink():
        return True
    real = os.path.realpath(entry.path)
    if real in visited:
        return False
    visited.add(real)
    return True


def symlink_on(path: str, base: str) -> Optional[str]:
    """The first symlink among the folders between ``base`` (itself not counted) and the
    entry ``path`` below it; None when there is none."""
    parts = os.path.relpath(path, base).split("/")[:-1]
    at = base
    for part in parts:
        at = os.path.join(at, part)
        if os.path.islink(at):
            return at
    return None


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A glob over one name (``*``, ``?``, ``[...]``) with exactly one ``{step}``."""
    if pattern.count("{step}") != 1:
        raise UsageError(
            f"--pattern {pattern!r} must hold {{step}} exactly once, where the "
            "step's digits are (e.g. 'model_{step}.pt')"
        )
    if "/" in pattern or pattern.startswith("."):
        raise UsageError(
            f"--pattern {pattern!r} must match names directly in the folder "
            "(no '/', not starting with '.')"
        )
    head, tail = pattern.split("{step}")
    return re.compile(_glob(head, pattern) + "([0-9]+)" + _glob(tail, pattern))


def _glob(text: str, pattern: str) -> str:
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = text.find("]", i + 2 if text[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end < 0:
                raise UsageError(f"--pattern {pattern!r} has a '[' without its ']'")
            body = text[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def looks_whole(path: str, is_folder: bool, ready: str, dcp_only: bool = False) -> bool:
    """The save at ``path`` looks whole: :func:`folder_complete` or :func:`file_complete`;
    with ``dcp_only`` (:func:`dcp_only`), a folder only as a complete DCP save."""
    if is_folder and dcp_only:
        return is_dcp_save(path) and dcp_problem(path) is None
    return folder_complete(path, ready) if is_folder else file_complete(path)


def registered_objects(path: str) -> int:
    """How many objects registered with accelerate's ``register_for_checkpointing`` the save
    folder at ``path`` holds: ``custom_checkpoint_<k>.pkl`` for k = 0, 1, ... in turn, which
    ``save_state`` writes after its RNG states (0 when none, or the folder cannot be listed).
    Their number is the trainer's, the same in each of its saves, so a save holding fewer
    than another save of the same trainer was cut short."""
    try:
        names = os.listdir(path)
    except OSError:
        return 0
    found = {
        int(m[1]) for pattern in _OBJECTS for m in map(pattern.fullmatch, names) if m is not None
    }
    count = 0
    while count in found:
        count += 1
    return count


def dcp_only(name: str, kind: str) -> bool:
    """A folder of this name is a save only as a DCP one: ``step-<N>`` (torchtitan's), or a
    name that is a file's (a ``.ckpt`` folder is Lightning's sharded save)."""
    return kind == FILE or frameworks.first_step(name, _DCP_FOLDERS) is not None


def folder_complete(path: str, ready: str) -> bool:
    """A save folder looks whole once its ready file is a non-empty regular file (and, for a
    ``.json`` one, parses: Hugging Face creates trainer_state.json, then writes it); a DCP
    folder (:func:`is_dcp_save`) once :func:`dcp_problem` finds nothing missing."""
    if is_dcp_save(path):
        return dcp_problem(path) is None
    return _regular_and(
        os.path.join(path, ready), _json_whole if ready.endswith(".json") else lambda fd, size: True
    )


def file_complete(path: str) -> bool:
    """A save file looks whole once it is a non-empty regular file and, when it is a zip
    (torch.save's format, so Lightning's ``.ckpt``), its end record is in place.

    Lightning moves the file into place, but fsspec's move across file systems (``$TMPDIR``
    on a local disk, the checkpoint on a shared one) is a copy into the final name, which is
    visible while it grows; the zip's end record is written last.
    """
    return _regular_and(
        path, lambda fd, size: os.pread(fd, 4, 0) != _ZIP_LOCAL or _zip_whole(fd, size)
    )


def _regular_and(path: str, whole: Callable[[int, int], bool]) -> bool:
    """``path`` is a non-empty regular file (no symlink followed) and ``whole(fd, size)``."""
    try:
        # nonblock: a FIFO planted as a save or ready file must not block a scan in open().
        fd = _fsio.open_file(path, nonblock=True)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_size > 0 and whole(fd, st.st_size)
    finally:
        os.close(fd)


def is_dcp_save(path: str) -> bool:
    """The folder at ``path`` is a ``torch.distributed.checkpoint`` save: it holds (or is
    about to hold) ``.metadata`` (no symlink followed)."""
    return os.path.lexists(os.path.join(path, DCP_METADATA)) or os.path.lexists(
        os.path.join(path, DCP_METADATA_TMP)
    )


def dcp_problem(path: str) -> Optional[str]:
    """Why the DCP save in the folder ``path`` is not complete, or None when it is: its
    ``.metadata`` is a whole DCP metadata file, no ``.metadata.tmp`` is beside it, every file
    the metadata's ``storage_data`` names is a regular file in the folder reaching each of its
    items' offset plus length, and (a ``.ckpt`` folder, Lightning's) ``meta.pt`` is whole.

    ``.metadata`` is a pickle of torch's ``Metadata``; it is read with stand-ins for every
    class it names (nothing in it is run, torch is not imported), and only ``storage_data``'s
    file names, offsets and lengths are used.  Nothing is followed, written or blocked on."""
    if os.path.lexists(os.path.join(path, DCP_METADATA_TMP)):
        return f"{DCP_METADATA_TMP} is there: the coordinator has not renamed it into place"
    meta = os.path.join(path, DCP_METADATA)
    try:
        fd = _fsio.open_file(meta, nonblock=True)
    except OSError as exc:
        return f"{DCP_METADATA} cannot be opened: {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return f"{DCP_METADATA} is not a non-empty regular file"
        if st.st_size > DCP_METADATA_LIMIT:
            return f"{DCP_METADATA} is larger than {DCP_METADATA_LIMIT} bytes"
        data = _read_all(fd, st.st_size)
    finally:
        os.close(fd)
    files = dcp_files(data)
    if isinstance(files, str):
        return f"{DCP_METADATA} {files}"
    for name, end in sorted(files.items()):
        try:
            shard = os.lstat(os.path.join(path, name))
        except OSError:
            return f"{DCP_METADATA} names {name}, which is not there"
        if not stat.S_ISREG(shard.st_mode):
            return f"{DCP_METADATA} names {name}, which is not a regular file"
        if shard.st_size < end:
            return f"{DCP_METADATA} names {end} bytes of {name}, which holds {shard.st_size}"
    return _sharded_problem(path)


def _sharded_problem(path: str) -> Optional[str]:
    """For a DCP folder named as a framework's save file (Lightning's sharded ``.ckpt``
    folder): why the file its rank 0 writes after the shards is not whole, or None."""
    for suffix, meta in _SHARDED_META.items():
        if path.rstrip("/").endswith(suffix) and not file_complete(os.path.join(path, meta)):
            return f"{meta} (Lightning writes it after the shards) is not whole"
    return None


class _Stand:
    """What every class a DCP metadata pickle names becomes: it keeps its arguments and its
    state, and runs nothing."""

    where: tuple[str, str] = ("", "")
    args: tuple[object, ...] = ()
    state: object = None

    def __new__(cls, *args: object, **kwargs: object) -> _Stand:
        self = object.__new__(cls)
        self.args = args
        return self

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        self.state = state


class _Contents(_Stand):
    """What every class a torch.save pickle names becomes: a stand-in that also takes the
    items and elements a dict or list subclass is given (an OrderedDict of tensors)."""

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, value: object) -> None:
        pass

    def extend(self, values: object) -> None:
        pass


class _StandInUnpickler(pickle.Unpickler):
    stand: type[_Stand] = _Stand  # what every class named becomes a subclass of

    def __init__(self, data: bytes) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self._made: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> type:
        made = self._made.get((module, name))
        if made is None:
            made = type(name, (self.stand,), {"where": (module, name)})
            self._made[(module, name)] = made
        return made


class _TorchUnpickler(_StandInUnpickler):
    """A torch.save ``data.pkl``: tensors' storages are persistent ids (other members of the
    zip), never read."""

    stand = _Contents

    def persistent_load(self, pid: object) -> None:
        return None


def step_inside(path: str) -> int | str:
    """The ``global_step`` a Lightning save file at ``path`` holds, or why it cannot be
    read, as words (a damaged zip, a pickle that does not read, a global_step that is no
    step the store takes: a bool, a float, negative, past :data:`model.STEP_LIMIT`; never an
    exception).  The file is torch.save's zip; its ``<archive>/data.pkl`` is a pickle of
    Lightning's checkpoint dict, read with stand-ins for every class it names (nothing in it
    is run, torch is not imported, no storage is read).  No symlink is followed."""
    try:
        fd = _fsio.open_file(path, nonblock=True)
    except OSError as exc:
        return f"it cannot be opened: {exc.strerror}"
    try:
        with os.fdopen(fd, "rb") as fh:
            with zipfile.ZipFile(fh) as archive:
                names = [
                    info
                    for info in archive.infolist()
                    if info.filename.count("/") == 1 and info.filename.endswith("/data.pkl")
                ]
                if len(names) != 1:
                    return "it holds no data.pkl (not torch.save's zip)"
                if names[0].file_size > PICKLE_LIMIT:
                    return f"its data.pkl is larger than {PICKLE_LIMIT} bytes"
                data = archive.read(names[0])
    except Exception as exc:  # any damaged zip: zlib's, lzma's, an encrypted member's...
        return f"it is not a whole zip ({type(exc).__name__}: {exc})"
    try:
        top = _TorchUnpickler(data).load()
    except Exception as exc:  # any malformed pickle: truncated, garbage, a stand-in misused
        return f"its data.pkl does not read as a pickle ({type(exc).__name__}: {exc})"
    if not (isinstance(top, dict) and "global_step" in top):
        return "it holds no global_step (not a Lightning checkpoint)"
    step = top["global_step"]
    if type(step) is not int or not 0 <= step < STEP_LIMIT:
        shown = repr(step) if isinstance(step, (bool, int, float, str)) else type(step).__name__
        return f"its global_step {shown[:60]} is not a step (a whole number from 0)"
    return step


def dcp_files(data: bytes) -> dict[str, int] | str:
    """From a DCP ``.metadata``'s bytes: each file its ``storage_data`` names (one name in
    the save's folder) -> the least size that holds every item stored in it; or what is
    wrong with the bytes, as words."""
    try:
        top = _StandInUnpickler(data).load()
    except Exception as exc:  # any malformed pickle: truncated, garbage, a stand-in misused
        return f"does not read as a pickle ({type(exc).__name__}: {exc})"
    state = top.state if isinstance(top, _Stand) else None
    if not (
        isinstance(top, _Stand)
        and top.where[1] == "Metadata"
        and isinstance(state, dict)
        and isinstance(state.get("storage_data"), dict)
    ):
        return "is not torch.distributed.checkpoint's Metadata with its storage_data"
    files: dict[str, int] = {}
    for info in state["storage_data"].values():
        fields = info.state if isinstance(info, _Stand) else None
        if isinstance(fields, tuple) and len(fields) == 2 and isinstance(fields[0], dict):
            fields = fields[0]  # (dict, slots) where a class has both
        if not isinstance(fields, dict):
            return "has a storage_data entry that is not a file, offset and length"
        name, offset, length = (
            fields.get("relative_path"),
            fields.get("offset"),
            fields.get("length"),
        )
        if not (
            isinstance(name, str)
            and type(offset) is int
            and type(length) is int
            and offset >= 0
            and length >= 0
        ):
            return "has a storage_data entry that is not a file, offset and length"
        if name in ("", ".", "..") or "/" in name or "\0" in name or name.startswith("."):
            return f"names {name!r}, which is not a file of the save's own folder"
        files[name] = max(files.get(name, 0), offset + length)
    return files


def _json_whole(fd: int, size: int) -> bool:
    try:
        json.loads(_read_all(fd, size))
    except ValueError:
        return False
    return True


def _zip_whole(fd: int, size: int) -> bool:
    """The zip's end record ends the file and says the central directory ends where the end
    records begin (zip64 too): true of a whole zip, not of one cut anywhere."""
    tail_len = min(size, 22 + 65535)
    tail = os.pread(fd, tail_len, size - tail_len)
    at = tail.rfind(_ZIP_END)
    while at >= 0:  # the end record whose comment ends the file (the comment may hold "PK")
        if at + 22 <= len(tail) and at + 22 + struct.unpack_from("<H", tail, at + 20)[0] == len(
            tail
        ):
            break
        at = tail.rfind(_ZIP_END, 0, at)
    if at < 0:
        return False
    end_pos = size - tail_len + at
    # A zip64 archive (more than 65,535 members, or past 4 GiB) puts its own end record and
    # a locator between the central directory and the classic end record.
    locator = os.pread(fd, 20, end_pos - 20) if end_pos >= 20 else b""
    if locator.startswith(_ZIP64_LOCATOR) and len(locator) == 20:
        end64_pos = struct.unpack_from("<Q", locator, 8)[0]
        end64 = os.pread(fd, 56, end64_pos)
        if len(end64) == 56 and end64.startswith(_ZIP64_END):
            record_size = struct.unpack_from("<Q", end64, 4)[0] + 12
            cd_size64, cd_offset64 = struct.unpack_from("<QQ", end64, 40)
            if cd_offset64 + cd_size64 == end64_pos and end64_pos + record_size == end_pos - 20:
                return True
    cd_size, cd_offset = struct.unpack_from("<II", tail, at + 12)
    return bool(cd_offset + cd_size == end_pos)


def _read_all(fd: int, size: int) -> bytes:
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


# --- still being written? -------------------------------------------------------------------

Entry = tuple[str, int, int, int, int, int, int]  # name under the save, mode, size, mtime_ns,
# ctime_ns, inode, device
_KINDS = (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK)


class NotASave(Exception):
    """The save holds something that is not a regular file, folder or symlink (a FIFO, a
    socket, a device): syncing it could block, and no framework writes one."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def snapshot(path: str) -> Optional[tuple[Entry, ...]]:
    """Every entry of the save at ``path`` (itself, and for a folder everything under it; no
    symlink followed), or None when it is gone.  Equal snapshots at two moments mean nothing
    was created, removed, renamed, written or truncated in between (to the file system's
    timestamp resolution, and size and inode besides).  Raises :class:`NotASave` for an
    entry of another kind; OSError other than a vanished entry goes to the caller."""
    entries: list[Entry] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        full = os.path.join(path, rel) if rel else path
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            if not rel:
                return None
            continue  # removed meanwhile: the snapshot differs from the last one anyway
        kind = stat.S_IFMT(st.st_mode)
        if kind not in _KINDS:
            raise NotASave(full)
        entries.append(
            (rel, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        )
        if kind == stat.S_IFDIR:
            try:
                names = os.listdir(full)
            except FileNotFoundError:
                continue
            pending.extend(os.path.join(rel, name) for name in names)
    entries.sort()
    return tuple(entries)


def files_of(path: str, entries: tuple[Entry, ...]) -> set[str]:
    """The real paths of the regular files a :func:`snapshot` of ``path`` lists."""
    real = os.path.realpath(path)
    return {
        os.path.join(real, rel) if rel else real for rel, mode, *_ in entries if stat.S_ISREG(mode)
    }


_ACCMODE = os.O_WRONLY | os.O_RDWR  # O_ACCMODE: 0 read, 1 write, 2 read and write


def open_for_writing(paths: set[str], proc: str = "/proc") -> list[tuple[int, str]]:
    """(pid, path) for each file of ``paths`` (real paths) that a process of this user on this
    node holds open for writing (a descriptor whose flags, in ``fdinfo``, allow writing) or
    maps shared and writable (``maps``); sorted.  Each process's descriptors are read as
    links, so a hung file system elsewhere is never touched; a process that ends, or whose
    ``/proc`` entries cannot be read, is passed over.  Without ``/proc``: [] (only the
    snapshot rule applies).

    The cost is one listing of ``/proc``, one ``stat`` per process and, for this user's
    processes, one ``readlink`` per descriptor and one read of ``maps``: it is paid only for
    a save about to be published."""
    if not paths:
        return []
    uid = os.geteuid()
    common = os.fsencode(os.path.commonpath(list(paths)))
    found: set[tuple[int, str]] = set()
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        base = f"{proc}/{pid}"
        try:
            if os.stat(base).st_uid != uid:
                continue
            fds = os.listdir(f"{base}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{base}/fd/{fd}")
            except OSError:
                continue
            if target in paths and _writable_fd(f"{base}/fdinfo/{fd}"):
                found.add((pid, target))
        found.update((pid, target) for target in _mapped_writable(f"{base}/maps", paths, common))
    return sorted(found)


def _writable_fd(fdinfo: str) -> bool:
    try:
        with open(fdinfo, "rb") as fh:
            text = fh.read()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith(b"flags:"):
            return bool(int(line.split()[1], 8) & _ACCMODE)
    return False


def _mapped_writable(maps: str, paths: set[str], common: bytes) -> set[str]:
    """The files of ``paths`` (all under ``common``) mapped shared and writable ("rw?s") in a
    ``maps`` file."""
    try:
        with open(maps, "rb") as fh:
            text = fh.read()
    except OSError:
        return set()
    out: set[str] = set()
    if common not in text:
        return out  # most processes map nothing of the save: no line is split
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[1][1:2] == b"w" and fields[1][3:4] == b"s":
            target = os.fsdecode(fields[5])
            if target in paths:
                out.add(target)
    return out
