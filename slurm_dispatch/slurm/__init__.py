"""The one adapter between slurm-dispatch and Slurm: no module outside this package runs
``squeue``, ``scontrol``, ``sacct`` or ``sbatch``, or imports pyslurm.

:mod:`.jobs` holds the typed views of jobs and nodes and the job-state vocabulary (and
:class:`~.jobs.Snapshot`, Slurm's view of one submission in one read); :mod:`.adapter` the reads,
actions, retries and the choice of backend; :mod:`.result` what one command did; :mod:`.select`
chooses pyslurm or the command-line tools (:mod:`.release` compares their releases);
:mod:`.pyslurm_backend` is the libslurm way; :mod:`.arrays` reads Slurm's array ranges;
:mod:`.hostlist` reads Slurm's host lists (standard library only: the hooks use it).

Imports nothing at import time: ``slurm_dispatch.slurm.Slurm`` (the documented path of the
adapter, as ``api.submit(slurm=...)`` takes it), ``Job`` and ``Node`` are resolved at their first
use from their homes (PEP 562), so the hooks' ``slurm.hostlist`` loads no adapter.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from .adapter import Slurm as Slurm
    from .jobs import Job as Job
    from .jobs import Node as Node

# The names this package answers for, and the module each lives in.
_HOMES = {"Slurm": "adapter", "Job": "jobs", "Node": "jobs"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
