"""What each framework's saves are called and hold: the one table cleanup
(:mod:`.gc`) and ``dispatch watch`` (``execution/saverules.py``) read.

A row (:class:`Saves`) says, for one framework, the names of its save folders and files
(each a regular expression over one name, its first group the step, or the save index for
accelerate's), the file it writes last into a save folder, whether its folders are
``torch.distributed.checkpoint`` (DCP) saves, and which readers take its names for saves:
cleanup reads a name without reading the save (``cleanup``), watch reads the save
(``watch``).  Adding a framework is a row here (and its integration, where it has one);
what the readers do with a row is theirs.

Standard library only: no framework, no torch (both readers run without them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

STEP = "([0-9]+)"  # the digits of a step (or save index) in a save's name: group 1


@dataclass(frozen=True)
class Saves:
    """One framework's saves, as their names and files say."""

    framework: str
    folder: Optional[str] = None  # a save folder's name (fullmatch), the step in group 1
    writing: str = ""  # what a save folder's name starts with while it is written
    file: Optional[str] = None  # searched in a save file's name, the step in group 1
    step_inside: Optional[str] = None  # a save file whose step only its contents hold
    suffix: Optional[str] = None  # every file or folder of this suffix is the framework's
    ready: str = ""  # the file written last into a save folder ("": none)
    objects: Optional[str] = None  # files written after ``ready``, as many in every save
    dcp: bool = False  # its save folders are DCP saves: whole by their .metadata
    index: bool = False  # the number in its names counts saves, not training steps
    saves_folder: Optional[str] = None  # the folder the integration gives its saves
    sharded_meta: Optional[str] = None  # a DCP folder of ``suffix``: written after the shards
    restore: str = ""  # what makes it resume its step from a save it loads, where known
    cleanup: bool = True  # cleanup takes its names for saves
    watch: bool = True  # watch publishes its names


TRAINER = Saves(
    "Hugging Face Trainer", folder=f"checkpoint-{STEP}", writing="tmp-", ready="trainer_state.json"
)
TORCHTITAN_RESTORE = "--checkpoint.no-initial-load-model-only"
TORCHTITAN = Saves(
    "torchtitan's CheckpointManager (DCP)",
    folder=f"step-{STEP}",
    dcp=True,
    restore=(
        f"torchtitan loads the model only by default: give "
        f"{TORCHTITAN_RESTORE} (with --checkpoint.initial-load-path "
        '"$DISPATCH_RESUME_FROM")'
    ),
)
# accelerate's automatic naming (ProjectConfiguration(automatic_checkpoint_naming=True)):
# <project_dir>/checkpoints/checkpoint_<i>/; save_state writes the RNG states last but for the
# objects registered with register_for_checkpointing, as many in each save of one trainer.
ACCELERATE = Saves(
    "accelerate",
    folder=f"checkpoint_{STEP}",
    ready="random_states_0.pkl",
    objects=rf"custom_checkpoint_{STEP}\.pkl",
    index=True,
    cleanup=False,
)
# Lightning's default file name is epoch=<E>-step=<S>.ckpt (-v<k> when a name repeats);
# "last.ckpt" carries no step and is rewritten in place.  "step=" must start the name or
# follow a character that is not a letter, digit or "_" (so "global_step=" is not it), and
# the name must end in ".ckpt" (so a manifest beside a save is not one).  Its
# SLURMEnvironment(auto_requeue=True) saves hpc_ckpt_<n>.ckpt at the requeue signal (n one
# more than the folder's greatest: 1 in every new folder), its step inside.  A .ckpt folder
# is its sharded save, a DCP one, whose meta.pt rank 0 writes after the collective save.
LIGHTNING = Saves(
    "Lightning",
    file=rf"(?:^|[^A-Za-z0-9_])step={STEP}(?=.*\.ckpt$)",
    step_inside=rf"hpc_ckpt_{STEP}\.ckpt",
    suffix=".ckpt",
    saves_folder="checkpoints",
    sharded_meta="meta.pt",
)

TABLE: tuple[Saves, ...] = (TRAINER, TORCHTITAN, ACCELERATE, LIGHTNING)

# What torch.distributed.checkpoint's FileSystemWriter writes into a save's folder: the
# coordinator's .metadata (first as .metadata.tmp, renamed into place last), each rank's
# __<rank>_<n>.distcp, and a save made without collectives' __<rank>.metadata.
DCP_METADATA = ".metadata"
DCP_METADATA_TMP = ".metadata.tmp"
DCP_FILES = r"\.metadata(?:\.tmp)?|__[0-9]+(?:_[0-9]+\.distcp|\.metadata)"


def rows(reader: str) -> tuple[Saves, ...]:
    """The rows whose names ``reader`` ("cleanup" or "watch") takes for saves."""
    return tuple(row for row in TABLE if getattr(row, reader))


def compiled(patterns: list[Optional[str]]) -> tuple[re.Pattern[str], ...]:
    """The patterns given (None passed over), compiled, in order."""
    return tuple(re.compile(p) for p in patterns if p is not None)


def first_step(
    name: str, patterns: tuple[re.Pattern[str], ...], search: bool = False
) -> Optional[int]:
    """The step group 1 of the first of ``patterns`` matching ``name`` says (whole name, or
    anywhere in it with ``search``), or None."""
    for pattern in patterns:
        found = pattern.search(name) if search else pattern.fullmatch(name)
        if found:
            return int(found.group(1))
    return None
