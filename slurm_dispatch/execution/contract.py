"""An execution's contract: the ``DISPATCH_*`` variables the launcher sets for the user's
script, and the one reader of them.

The launcher (:mod:`.launch`) puts :data:`VARIABLES` in every execution's environment.  Two
views read them, both through :meth:`Contract.read`: :class:`Execution` (public as
``slurm_dispatch.api.Execution``), the execution's identity, strict: inside an execution every
identity variable must be there; and the integrations' ``saves.Execution``, the folder they
publish from, lenient where they must leave a framework alone outside one.

Invariants: each variable is named here once and read here once; a variable that is absent is
``None`` and one set empty is ``""`` (the integrations tell "nothing to resume" from "ask the
store" by it), never a guess or a default; a number that is not one is refused
(:class:`NotANumber`), never clamped.  Standard library only: the in-job hot path imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional

JOB = "DISPATCH_JOB"
GENERATION = "DISPATCH_GENERATION"
SUBMISSION = "DISPATCH_SUBMISSION"
EPOCH = "DISPATCH_EPOCH"
ATTEMPT = "DISPATCH_ATTEMPT"
CHECKPOINT = "DISPATCH_CHECKPOINT"
EXEC_DIR = "DISPATCH_EXEC_DIR"
RESUME_FROM = "DISPATCH_RESUME_FROM"
STAGE_DIR = "DISPATCH_STAGE_DIR"
LOCAL_DIR = "DISPATCH_LOCAL_DIR"

# Everything the launcher sets (and exports through SLURM_EXPORT_ENV), in its order.
VARIABLES = (
    JOB,
    GENERATION,
    SUBMISSION,
    EPOCH,
    ATTEMPT,
    CHECKPOINT,
    EXEC_DIR,
    RESUME_FROM,
    STAGE_DIR,
    LOCAL_DIR,
)
# What an execution's identity needs: all of them, or it was not started by the launcher.
IDENTITY = (JOB, GENERATION, SUBMISSION, EPOCH, ATTEMPT, CHECKPOINT, EXEC_DIR)


class NotANumber(ValueError):
    """A contract variable that must be an integer is not one; each view words it."""

    def __init__(self, name: str, raw: str) -> None:
        super().__init__(f"{name}={raw!r} is not an integer")
        self.name, self.raw = name, raw


@dataclass(frozen=True)
class Contract:
    """The contract as one environment holds it: each variable's text, ``None`` where absent."""

    job: Optional[str]
    generation: Optional[str]
    submission: Optional[str]
    epoch: Optional[str]
    attempt: Optional[str]
    checkpoint: Optional[str]
    exec_dir: Optional[str]
    resume_from: Optional[str]
    stage_dir: Optional[str]
    local_dir: Optional[str]

    @classmethod
    def read(cls, env: Optional[Mapping[str, str]] = None) -> Contract:
        """The contract in ``env`` (default: ``os.environ``)."""
        env = os.environ if env is None else env
        return cls(*(env.get(name) for name in VARIABLES))

    def variable(self, field: str) -> str:
        """The variable behind a field: ``variable("epoch") == "DISPATCH_EPOCH"``."""
        return VARIABLES[[f.name for f in fields(self)].index(field)]

    def text(self, field: str) -> str:
        """A field's text, ``""`` where absent."""
        return getattr(self, field) or ""

    def missing(self, names: tuple[str, ...] = IDENTITY) -> list[str]:
        """Those of ``names`` (variables) that are absent or empty, in that order."""
        given = dict(zip(VARIABLES, (getattr(self, f.name) for f in fields(self))))
        return [name for name in names if not given[name]]

    def number(self, field: str) -> int:
        """A field's value as an integer (absent counts as ""); :class:`NotANumber` if not."""
        raw = getattr(self, field) or ""
        try:
            return int(raw)
        except ValueError:
            raise NotANumber(self.variable(field), raw) from None


@dataclass(frozen=True)
class Execution:
    """This execution's identity, as the launcher set it in the environment."""

    job: str  # DISPATCH_JOB: the dispatch job id, the same across submissions
    generation: int  # G
    submission: int  # N
    epoch: int  # G*10^12 + N*10^6 + R
    attempt: str  # DISPATCH_ATTEMPT: new for every execution
    checkpoint: str  # the root
    exec_dir: str  # <root>/exec/<attempt>/: write saves here, nowhere else
    resume_from: Optional[str]  # the latest save when the execution started, or None

    @property
    def restart(self) -> int:
        """R, Slurm's restart count of this execution."""
        return self.epoch % 1_000_000
