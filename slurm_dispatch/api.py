"""The Python API for training scripts: what ``dispatch publish|latest|list`` and the
execution's environment give, without shelling out.

::

    from slurm_dispatch import api

    run = api.execution()            # None outside a dispatch execution
    resume = api.resume_from()       # the save to resume from, or None
    ...                              # train; write each save under run.exec_dir
    api.publish(save_path, step)     # now the next execution can see it

Every function takes its root and epoch from the execution's environment (the contract the
launcher sets: ``DISPATCH_CHECKPOINT``, ``DISPATCH_EPOCH``, ...) unless given, and raises the
package's errors (:mod:`slurm_dispatch.errors`): an existing publication is
:class:`~slurm_dispatch.errors.AlreadyPublished` (a ``FileExistsError``), a path outside the
root :class:`~slurm_dispatch.errors.OutsideRoot`, an unreadable store a
:class:`~slurm_dispatch.errors.StoreError`.  It imports no training library and no click.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from . import store
from .errors import UsageError

__all__ = ["Execution", "Publication", "execution", "latest", "list_publications",
           "publish", "resume_from"]

Publication = store.Found  # epoch, step, path (absolute), name; .as_json()


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


_VARIABLES = ("DISPATCH_JOB", "DISPATCH_GENERATION", "DISPATCH_SUBMISSION", "DISPATCH_EPOCH",
              "DISPATCH_ATTEMPT", "DISPATCH_CHECKPOINT", "DISPATCH_EXEC_DIR")


def execution(environ: Optional[Mapping[str, str]] = None) -> Optional[Execution]:
    """This execution's identity, or None outside a dispatch execution (no DISPATCH_JOB).

    A partial or garbled contract (some variables missing, a number that is not one) is a
    :class:`UsageError` naming the variable: a script must not guess its epoch.
    """
    env = os.environ if environ is None else environ
    if not env.get("DISPATCH_JOB"):
        return None
    missing = [name for name in _VARIABLES if not env.get(name)]
    if missing:
        raise UsageError(f"a dispatch execution's environment lacks {', '.join(missing)} "
                         "(was the script started by the dispatch launcher?)")

    def number(name: str) -> int:
        try:
            return int(env[name])
        except ValueError:
            raise UsageError(f"${name}={env[name]!r} is not an integer") from None
    return Execution(job=env["DISPATCH_JOB"], generation=number("DISPATCH_GENERATION"),
                     submission=number("DISPATCH_SUBMISSION"),
                     epoch=number("DISPATCH_EPOCH"), attempt=env["DISPATCH_ATTEMPT"],
                     checkpoint=env["DISPATCH_CHECKPOINT"], exec_dir=env["DISPATCH_EXEC_DIR"],
                     resume_from=env.get("DISPATCH_RESUME_FROM") or None)


def _root(root: Optional[str]) -> str:
    value = root or os.environ.get("DISPATCH_CHECKPOINT")
    if not value:
        raise UsageError("no checkpoint root: pass root=... or run inside a dispatch execution "
                         "($DISPATCH_CHECKPOINT)")
    return value


def publish(path: str, step: int, *, root: Optional[str] = None,
            epoch: Optional[int] = None) -> str:
    """Make the complete save at ``path`` visible; returns the publication's name.

    ``path`` must lie inside the root (under this execution's ``exec_dir``); ``root`` and
    ``epoch`` default to this execution's.  Durable when it returns (the publication and its
    folders are synced; the save's own files are as durable as the script made them).
    """
    if epoch is None:
        raw = os.environ.get("DISPATCH_EPOCH")
        if not raw:
            raise UsageError("no epoch: pass epoch=... or run inside a dispatch execution "
                             "($DISPATCH_EPOCH)")
        try:
            epoch = int(raw)
        except ValueError:
            raise UsageError(f"$DISPATCH_EPOCH={raw!r} is not an integer") from None
    return store.publish(_root(root), epoch, step, path)


def latest(root: Optional[str] = None) -> Optional[Publication]:
    """The latest publication (greatest epoch, then step), or None when there is none."""
    return store.latest(_root(root))


def list_publications(root: Optional[str] = None) -> list[Publication]:
    """Every publication under the root, oldest first (the latest is last)."""
    return store.list_publications(_root(root))


def resume_from(root: Optional[str] = None) -> Optional[str]:
    """The save to resume from: ``DISPATCH_RESUME_FROM`` (fixed when the execution started),
    else the latest publication's path, else None (a fresh start)."""
    fixed = os.environ.get("DISPATCH_RESUME_FROM")
    if fixed:
        return fixed
    if root is None and not os.environ.get("DISPATCH_CHECKPOINT"):
        return None
    found = latest(root)
    return found.path if found is not None else None
