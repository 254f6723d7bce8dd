"""Which names in an execution's folder are saves, their steps, and when a save is complete.

The rules ``dispatch watch`` publishes by (:class:`SaveRule`): a folder ``checkpoint-<N>``
once its ready file is whole; a ``.ckpt`` file whose name holds ``step=<N>`` once it is in
place and whole; or, with a pattern, every name matching a glob with one ``{step}``.

Invariants: a name's meaning depends on the name alone (so a name decided once never needs
deciding again); nothing here follows a symlink, blocks on a FIFO, or writes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from typing import Callable, Optional

from .errors import UsageError

DEFAULT_READY = "trainer_state.json"  # Hugging Face Trainer writes it last into checkpoint-N/
FOLDER, FILE, EITHER = "folder", "file", "either"  # what kind of entry a save's name must be

_FOLDER_NAME = re.compile(r"checkpoint-([0-9]+)")
# Lightning's default file name is epoch=<E>-step=<S>.ckpt (-v<k> when a name repeats);
# "last.ckpt" and "hpc_ckpt_<n>.ckpt" carry no step and are not saves here.  "step=" must start
# the name or follow a character that is not a letter, digit or "_" (so "global_step=" is not
# it), and the name must end in ".ckpt" (so a manifest beside a save is not one).
_FILE_STEP = re.compile(r"(?:^|[^A-Za-z0-9_])step=([0-9]+)(?=.*\.ckpt$)")
# O_NONBLOCK: a FIFO planted as a save or ready file must not block a scan in open().
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_END = b"PK\x06\x06"


@dataclass(frozen=True)
class SaveRule:
    """Which names in the folder are saves, their steps, and when each is complete.

    Without a pattern: a folder ``checkpoint-<N>`` (complete once its ready file is whole),
    or a ``.ckpt`` file whose name holds ``step=<N>`` (complete once in place and whole).  With a
    pattern (a glob over names in the folder with one ``{step}`` standing for the digits),
    every matching name is a save: a folder needs its ready file, a file is complete when
    whole.  Names starting with "." are never saves.
    """

    pattern: Optional[str] = None
    ready: str = DEFAULT_READY
    regex: Optional[re.Pattern[str]] = field(default=None, compare=False)

    @classmethod
    def make(cls, pattern: Optional[str] = None, ready: Optional[str] = None) -> SaveRule:
        ready = DEFAULT_READY if ready is None else ready
        if ready in ("", ".", "..") or "/" in ready or "\0" in ready:
            raise UsageError(f"--ready {ready!r} is not a file name (one name, no '/')")
        if pattern is None:
            return cls(None, ready, None)
        return cls(pattern, ready, compile_pattern(pattern))

    def step_of(self, name: str) -> Optional[tuple[int, str]]:
        """(step, kind) of a save's name, kind being FOLDER, FILE or EITHER; None when the
        name is no save."""
        if name.startswith("."):
            return None
        if self.regex is not None:
            match = self.regex.fullmatch(name)
            return (int(match.group(1)), EITHER) if match else None
        match = _FOLDER_NAME.fullmatch(name)
        if match:
            return int(match.group(1)), FOLDER
        match = _FILE_STEP.search(name)
        return (int(match.group(1)), FILE) if match else None


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A glob over one name (``*``, ``?``, ``[...]``) with exactly one ``{step}``."""
    if pattern.count("{step}") != 1:
        raise UsageError(f"--pattern {pattern!r} must hold {{step}} exactly once, where the "
                         "step's digits are (e.g. 'model_{step}.pt')")
    if "/" in pattern or pattern.startswith("."):
        raise UsageError(f"--pattern {pattern!r} must match names directly in the folder "
                         "(no '/', not starting with '.')")
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
            end = text.find("]", i + 2 if text[i + 1:i + 2] in ("!", "]") else i + 1)
            if end < 0:
                raise UsageError(f"--pattern {pattern!r} has a '[' without its ']'")
            body = text[i + 1:end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def folder_complete(path: str, ready: str) -> bool:
    """A save folder is complete once its ready file is a non-empty regular file (and, for a
    ``.json`` one, parses: Hugging Face creates trainer_state.json, then writes it)."""
    return _regular_and(os.path.join(path, ready),
                        _json_whole if ready.endswith(".json") else lambda fd, size: True)


def file_complete(path: str) -> bool:
    """A save file is complete once it is a non-empty regular file and, when it is a zip
    (torch.save's format, so Lightning's ``.ckpt``), its end record is in place.

    Lightning moves the file into place, but fsspec's move across file systems (``$TMPDIR``
    on a local disk, the checkpoint on a shared one) is a copy into the final name, which is
    visible while it grows; the zip's end record is written last.
    """
    return _regular_and(path, lambda fd, size: os.pread(fd, 4, 0) != _ZIP_LOCAL
                        or _zip_whole(fd, size))


def _regular_and(path: str, whole: Callable[[int, int], bool]) -> bool:
    """``path`` is a non-empty regular file (no symlink followed) and ``whole(fd, size)``."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_size > 0 and whole(fd, st.st_size)
    finally:
        os.close(fd)


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
        if at + 22 <= len(tail) and at + 22 + struct.unpack_from("<H", tail, at + 20)[0] \
                == len(tail):
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
