"""The checkpoint protocol's pure model: epochs, attempt tokens and publication names.

No I/O happens here.  The invariants this module keeps:

* ``Epoch = G*10^12 + N*10^6 + R`` with ``G >= 0``, ``1 <= N <= 999,999``,
  ``0 <= R <= 999,999`` and the epoch below ``10^20``; anything else is refused
  (:class:`~slurm_dispatch.errors.OutOfBounds`), never clamped.
* A publication name is ``<epoch:020d>-<step:020d>-<path under the root, base32 A-Z2-7, no
  padding>``.  Fixed-width digits make the byte order of names equal the order of
  ``(epoch, step, encoded path)``, so "the latest publication" is simply the greatest name.
  Ties on ``(epoch, step)`` therefore go to the greatest encoded path in byte order: a
  deterministic rule that every reader applies alike.
* Only canonical names parse: the base32 part must re-encode to itself, so one path has
  exactly one name.  A decoded path that is absolute, empty or climbs out of the root is
  refused.
* Attempt tokens never repeat: 48 bits of milliseconds and 80 random bits, so they stay unique
  even when Slurm job ids start again after a controller loses its state.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import secrets
import time
from dataclasses import dataclass

from ..errors import BadPublicationName, OutOfBounds, OutsideRoot

GENERATION_FACTOR = 10**12
SUBMISSION_FACTOR = 10**6
MAX_SUBMISSION = 999_999
MAX_RESTART = 999_999
EPOCH_LIMIT = 10**20  # exclusive: an epoch has at most 20 digits
STEP_LIMIT = 10**20  # exclusive: a step has at most 20 digits
NAME_MAX = 255  # the longest file name POSIX file systems take

_B32 = "A-Z2-7"
# base32 without padding only ever has 0, 2, 4, 5 or 7 characters in its last group of 8.
_B32_BODY = f"(?:[{_B32}]{{8}})*(?:[{_B32}]{{2}}|[{_B32}]{{4}}|[{_B32}]{{5}}|[{_B32}]{{7}})?"
NAME_PATTERN = f"[0-9]{{20}}-[0-9]{{20}}-(?=[{_B32}]){_B32_BODY}"
_NAME_RE = re.compile(NAME_PATTERN)
_ATTEMPT_RE = re.compile(r"[0-9a-z]{26}")


@dataclass(frozen=True, order=True)
class Epoch:
    """An execution's place in its job's history: ``G*10^12 + N*10^6 + R``."""

    generation: int
    submission: int
    restart: int

    def __post_init__(self) -> None:
        for label, value in (
            ("generation", self.generation),
            ("submission", self.submission),
            ("restart", self.restart),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise OutOfBounds(f"{label} {value!r} is not an integer")
        if self.generation < 0:
            raise OutOfBounds(f"generation {self.generation} is negative; it must be >= 0")
        if not 1 <= self.submission <= MAX_SUBMISSION:
            raise OutOfBounds(f"submission {self.submission} is outside 1..{MAX_SUBMISSION:,}")
        if not 0 <= self.restart <= MAX_RESTART:
            raise OutOfBounds(f"restart {self.restart} is outside 0..{MAX_RESTART:,}")
        if self.value >= EPOCH_LIMIT:
            raise OutOfBounds(
                f"generation {self.generation} makes the epoch {self.value}, "
                "which does not fit 20 digits "
                f"(generation must be < {EPOCH_LIMIT // GENERATION_FACTOR:,})"
            )

    @property
    def value(self) -> int:
        return (
            self.generation * GENERATION_FACTOR + self.submission * SUBMISSION_FACTOR + self.restart
        )

    def __int__(self) -> int:
        return self.value

    @classmethod
    def from_value(cls, value: int) -> Epoch:
        """Split an epoch integer back into (G, N, R); refuses one no triple makes."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < EPOCH_LIMIT:
            raise OutOfBounds(f"epoch {value!r} is outside 0..{EPOCH_LIMIT - 1}")
        generation, rest = divmod(value, GENERATION_FACTOR)
        submission, restart = divmod(rest, SUBMISSION_FACTOR)
        try:
            return cls(generation, submission, restart)
        except OutOfBounds as exc:
            raise OutOfBounds(f"epoch {value} is not G*10^12 + N*10^6 + R: {exc}") from None


def check_epoch_value(value: int) -> int:
    """Return ``value`` if it is an epoch some (G, N, R) produces, else refuse it."""
    # The fast path of publish; Epoch.from_value says precisely what is wrong otherwise.
    if (
        type(value) is int
        and 0 <= value < EPOCH_LIMIT
        and 1 <= value % GENERATION_FACTOR // SUBMISSION_FACTOR <= MAX_SUBMISSION
    ):
        return value
    return Epoch.from_value(value).value


def check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise OutOfBounds(f"step {step!r} is not an integer")
    if not 0 <= step < STEP_LIMIT:
        raise OutOfBounds(f"step {step} is outside 0..{STEP_LIMIT - 1}")
    return step


def new_attempt() -> str:
    """A fresh opaque attempt token: 26 characters of ``0-9a-z``, unique per execution.

    48 bits of wall-clock milliseconds followed by 80 bits from the OS's CSPRNG, written in
    base32 (lower case).  Two executions would need the same millisecond *and* the same
    80 random bits to collide; job-id reuse after a controller reset cannot cause it.
    """
    raw = (time.time_ns() // 1_000_000 & (2**48 - 1)).to_bytes(6, "big") + secrets.token_bytes(10)
    return base64.b32encode(raw).decode("ascii").lower()[:26]


def check_attempt(token: str) -> str:
    """Refuse anything that is not a token :func:`new_attempt` could make."""
    if not isinstance(token, str) or not _ATTEMPT_RE.fullmatch(token):
        raise OutOfBounds(f"attempt {token!r} is not an attempt token (26 characters of 0-9a-z)")
    return token


def normalize_relative(path: str) -> str:
    """Return ``path`` as a clean relative POSIX path, refusing ones that leave the root."""
    if not isinstance(path, str) or path == "":
        raise OutsideRoot(f"path {path!r} is empty; a save must be a path under the root")
    if path.startswith("/"):
        raise OutsideRoot(f"path {path!r} is absolute; a publication names a path under the root")
    if "\0" in path:
        raise OutsideRoot(f"path {path!r} contains a NUL byte")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OutsideRoot(f"path {path!r} climbs out of the root with '..'")
    if not parts:
        raise OutsideRoot(f"path {path!r} is the root itself; publish a save under it")
    return "/".join(parts)


def encode_path(relative: str) -> str:
    return base64.b32encode(relative.encode("utf-8", "surrogateescape")).decode("ascii").rstrip("=")


def encode_paths(relatives: list[str]) -> list[str]:
    """:func:`encode_path` of each, in one base32 pass: each path, zero-filled to a whole
    5-byte block, encodes to its own base32 followed by what the fill adds, which is cut."""
    raws = [r.encode("utf-8", "surrogateescape") for r in relatives]
    text = base64.b32encode(b"".join(r + b"\0" * (-len(r) % 5) for r in raws)).decode("ascii")
    out, at = [], 0
    for raw in raws:
        out.append(text[at : at + (len(raw) * 8 + 4) // 5])
        at += (len(raw) + 4) // 5 * 8
    return out


def decode_path(encoded: str, *, name: str | None = None) -> str:
    """Decode the base32 part of a name; only canonical, valid, in-root paths pass."""
    label = name if name is not None else encoded
    try:
        raw = base64.b32decode(encoded + "=" * (-len(encoded) % 8))
    except (ValueError, TypeError) as exc:
        raise BadPublicationName(f"publication {label!r}: path part is not base32: {exc}") from None
    if encode_path_bytes(raw) != encoded:
        raise BadPublicationName(f"publication {label!r}: path part is not canonical base32")
    text = raw.decode("utf-8", "surrogateescape")
    try:
        relative = normalize_relative(text)
    except OutsideRoot as exc:
        raise BadPublicationName(f"publication {label!r}: {exc}") from None
    if relative != text:
        raise BadPublicationName(
            f"publication {label!r}: path {text!r} is not in normal form (expected {relative!r})"
        )
    return text


def encode_path_bytes(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").rstrip("=")


@functools.total_ordering
@dataclass(frozen=True)
class Publication:
    """One publication, ordered as its name is: by epoch, then step, then encoded path."""

    epoch: int
    step: int
    path: str  # relative to the checkpoint root, normal form

    @property
    def name(self) -> str:
        return format_name(self.epoch, self.step, self.path)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Publication):
            return NotImplemented
        return self.name < other.name


def format_name(epoch: int, step: int, relative_path: str) -> str:
    """The file name of a publication; refuses out-of-bounds values and paths."""
    check_epoch_value(epoch)
    check_step(step)
    relative = normalize_relative(relative_path)
    return _format_normal(epoch, step, relative)


def _format_normal(epoch: int, step: int, relative: str) -> str:
    name = f"{epoch:020d}-{step:020d}-{encode_path(relative)}"
    if len(name.encode("ascii")) > NAME_MAX:
        raise OutOfBounds(
            f"path {relative!r} is too long for a publication name "
            f"({len(name)} characters, the limit is {NAME_MAX}); "
            f"paths up to {(NAME_MAX - 42) * 5 // 8} bytes fit"
        )
    return name


def is_name(name: str) -> bool:
    """True when ``name`` has the shape of a publication name (no decoding)."""
    return _NAME_RE.fullmatch(name) is not None


def parse_name(name: str) -> Publication:
    """Parse a publication name, refusing anything that is not exactly one."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise BadPublicationName(
            f"{name!r} in pub/ is not a publication name "
            "(expected <epoch, 20 digits>-<step, 20 digits>-<base32 path>)"
        )
    epoch = int(name[:20])
    try:
        check_epoch_value(epoch)
    except OutOfBounds as exc:
        raise BadPublicationName(f"publication {name!r}: {exc}") from None
    return Publication(epoch, int(name[21:41]), decode_path(name[42:], name=name))


def format_name_inside(root: str, path: str, epoch: int, step: int) -> tuple[str, str]:
    """(publication name, relative path) for ``path`` under ``root`` (both absolute)."""
    check_epoch_value(epoch)
    check_step(step)
    relative = relative_inside(root, path)
    return _format_normal(epoch, step, relative), relative


def relative_inside(root: str, path: str) -> str:
    """The path of ``path`` relative to ``root`` (both absolute, normalised lexically)."""
    root_abs = os.path.normpath(root)
    path_abs = os.path.normpath(path)
    if path_abs == root_abs or not path_abs.startswith(root_abs.rstrip("/") + "/"):
        raise OutsideRoot(f"path {path!r} is not inside the checkpoint root {root!r}")
    return normalize_relative(path_abs[len(root_abs.rstrip("/")) + 1 :])
