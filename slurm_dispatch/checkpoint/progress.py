"""Whether an execution's publications went on from the save it resumed from.

A publication's step is the trainer's step, with one exception: accelerate's automatic naming
(``ProjectConfiguration(automatic_checkpoint_naming=True)``) names its saves
``checkpoint_<i>``, ``i`` counting the saves of one run (0, 1, 2 again in every execution),
so the step of such a publication is a save index and the training step is not known.  Such a
step is never compared with another execution's (:func:`step_known`).

An execution that resumed from a save of step S and publishes a step at or below S went
backwards: its trainer loaded the save but started counting again (torchtitan's
``initial_load_model_only``, its default, loads the model only from ``initial_load_path`` and
starts at step 1, restoring no optimizer, schedule or data position).  Its saves outrank the
further-along one (a newer epoch) without an error; :func:`went_backwards` says so, naming the
framework option that restores the step where it is known.  Read by ``dispatch watch`` (at
each publication) and ``dispatch status`` (per execution).

An execution that published nothing past the save it resumed from made no progress
(:func:`went_on`); ``dispatch supervise`` stops restarting a job after ``--max-no-progress``
such executions in a row.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Iterable, Optional

from . import frameworks

# Save folders whose number is a save index (accelerate's automatic naming), from the saves
# table; and each framework's save folders with what makes it restore its step, where known.
_SAVE_INDEX = frameworks.compiled([row.folder for row in frameworks.TABLE if row.index])
_RESTORE = tuple(
    (pattern, row.restore)
    for row in frameworks.TABLE
    if row.restore
    for pattern in frameworks.compiled([row.folder])
)

TORCHTITAN_RESTORE = frameworks.TORCHTITAN_RESTORE


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def step_known(path: str) -> bool:
    """False when the publication of the save at ``path`` carries a save index, not a step
    (accelerate's ``checkpoint_<i>``)."""
    return frameworks.first_step(_base(path), _SAVE_INDEX) is None


def restoring(path: str) -> str:
    """What makes the framework that wrote the save at ``path`` resume its step, in words."""
    for pattern, restore in _RESTORE:
        if pattern.fullmatch(_base(path)):
            return restore
    return "make the trainer restore its step (and optimizer) from the save it loads"


def went_backwards(
    resumed_path: str, resumed_step: Optional[int], published: Iterable[tuple[str, int]]
) -> Optional[str]:
    """A sentence when a publication of ``published`` ((path, step) of one execution's) is at
    or below ``resumed_step``, the step of the save it resumed from; None when none is, when
    the execution resumed from nothing, or when either side's step is a save index (not
    known)."""
    if resumed_step is None or not step_known(resumed_path):
        return None
    back = [(path, step) for path, step in published if step_known(path) and step <= resumed_step]
    if not back:
        return None
    path, step = min(back, key=lambda found: found[1])
    return (
        f"step {step} ({path}) is at or below step {resumed_step} of the save this "
        f"execution resumed from ({resumed_path}): the trainer started counting again, "
        f"so its saves outrank the further-along one; {restoring(path)}"
    )


def index_note(path: str) -> Optional[str]:
    """For a save named by a save index: what its step is, in words; else None."""
    if step_known(path):
        return None
    return (
        f"{_base(path)} is accelerate's save index (0, 1, 2 again in every execution), "
        "not a training step: the step is not known and is not compared across "
        "executions"
    )


def went_on(
    resumed_step: Optional[int], resumed_path: str, published: Iterable[tuple[str, int]]
) -> bool:
    """Whether an execution made progress: one of its publications (``published``: (path,
    step) of its own) is past the save it resumed from.  Past means a greater step; any
    publication counts where it resumed from nothing (``resumed_step`` None: a fresh start, or
    a save no longer published) or where a step is a save index (not comparable).  An
    execution that published nothing made none (``dispatch supervise``'s --max-no-progress)."""
    for path, step in published:
        if (
            resumed_step is None
            or not step_known(path)
            or not step_known(resumed_path)
            or step > resumed_step
        ):
            return True
    return False
