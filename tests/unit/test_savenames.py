"""What each framework's saves are called and hold, as both readers of the saves table judge
them: cleanup (``checkpoint/gc.py``: which names in an execution's folder are saves, which
folders are a DCP save's insides, the step a name says) and watch
(``execution/saverules.py``: which names it publishes, their steps, which file is written
last).  The two disagree where they did before the table (accelerate's ``checkpoint_<i>``
and Lightning's ``hpc_ckpt_<n>.ckpt`` are saves to watch only; a ``checkpoint-N`` file and
``tmp-checkpoint-N/`` to cleanup only): these rows pin each judgement as it is."""

from __future__ import annotations

from typing import Optional

import pytest

from slurm_dispatch.checkpoint import gc
from slurm_dispatch.execution import saverules
from slurm_dispatch.execution.saverules import EITHER, FILE, FOLDER, INSIDE, STEP_INSIDE

# name -> (watch's step_of with the default rule, cleanup's step_of)
STEPS: dict[str, tuple[Optional[tuple[int, str]], Optional[int]]] = {
    "checkpoint-12": ((12, FOLDER), 12),  # the Trainer's
    "tmp-checkpoint-12": (None, 12),  # the Trainer's, while it writes
    "step-7": ((7, FOLDER), 7),  # torchtitan's DCP folder
    "checkpoint_3": ((3, FOLDER), None),  # accelerate's automatic naming
    "epoch=1-step=20.ckpt": ((20, FILE), 20),  # Lightning's default
    "step=5.ckpt": ((5, FILE), 5),
    "epoch=1-step=20-v1.ckpt": ((20, FILE), 20),
    "x_step=5.ckpt": (None, None),
    "global_step=5.ckpt": (None, None),
    "step=5.ckpt.dispatch-manifest.json": (None, None),
    "hpc_ckpt_2.ckpt": ((STEP_INSIDE, INSIDE), None),  # Lightning's at the requeue signal
    "last.ckpt": (None, None),
    "pretrained.ckpt": (None, None),
    ".checkpoint-4": (None, None),
    "checkpoint-4x": (None, None),
    "checkpoints": (None, None),
    "step_4": (None, None),
    "model.pt": (None, None),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_the_step_each_reader_gives_a_name(name: str) -> None:
    watch, cleanup = STEPS[name]
    assert saverules.SaveRule.make().step_of(name) == watch
    if not name.startswith("."):
        assert gc.step_of(f"exec/a/{name}") == cleanup


def test_a_pattern_takes_every_name_it_matches_as_either_kind() -> None:
    rule = saverules.SaveRule.make("model_{step}.pt")
    assert rule.step_of("model_3.pt") == (3, EITHER)
    assert rule.step_of("checkpoint-3") is None
    assert not rule.counts_objects("checkpoint_3")


# The file each framework writes last into a save folder, as watch reads it.
READY = {
    "checkpoint-3": "trainer_state.json",
    "checkpoint_3": "random_states_0.pkl",
    "step-3": "trainer_state.json",  # judged by its .metadata instead
}


@pytest.mark.parametrize("name", sorted(READY))
def test_the_file_written_last(name: str) -> None:
    rule = saverules.SaveRule.make()
    assert rule.ready_for(name) == READY[name]
    assert rule.counts_objects(name) is (name == "checkpoint_3")
    assert saverules.SaveRule.make(ready="done").ready_for(name) == "done"
    assert gc.READY == saverules.DEFAULT_READY == "trainer_state.json"


def test_watch_describes_its_names() -> None:
    assert saverules.SaveRule.make().describe() == (
        "checkpoint-<N>/ (holding its --ready file, 'trainer_state.json'), "
        "checkpoint_<N>/ (accelerate's, holding 'random_states_0.pkl'), "
        "step-<N>/ (a torch.distributed.checkpoint save), *step=<N>*.ckpt or "
        "hpc_ckpt_<n>.ckpt (Lightning's save at the requeue signal)"
    )


# An entry of an execution's folder ("x/" a folder) -> whether cleanup takes it for a save
# (or dispatch's own) by its name alone, nothing published.
CLEANUP_SAVES = {
    "checkpoint-4/": True,
    "checkpoint-4": True,
    "tmp-checkpoint-4/": True,
    "tmp-checkpoint-4": True,
    "step-3/": True,
    "step-3": False,
    "x.ckpt/": True,
    "epoch=0-step=3.ckpt": True,
    "x.ckpt": False,
    "last.ckpt": False,
    "hpc_ckpt_1.ckpt": False,
    "checkpoints/": True,
    "checkpoints": False,
    "checkpoint_3/": False,
    "checkpoint-4x/": False,
    "logs/": False,
    "events.out": False,
    ".dispatch": True,
    ".dispatch-keep.json": True,
    ".dispatch-notes": False,
    "x.dispatch-manifest.json": True,
    "checkpoint-4.dispatch-manifest.json": True,
}


@pytest.mark.parametrize("entry", sorted(CLEANUP_SAVES))
def test_which_entries_cleanup_takes_for_saves(entry: str) -> None:
    assert gc._is_save_entry(entry, set()) is CLEANUP_SAVES[entry]


# A name in the Lightning integration's checkpoints/ -> a save to cleanup (no DCP folder
# found holding anything else)
INNER = {
    "epoch=0-step=3.ckpt": True,
    "last.ckpt": True,
    "x.ckpt": True,
    "x.ckpt/": True,
    "x.ckpt.dispatch-manifest.json": True,
    "checkpoint-3": True,
    "checkpoint-3/": False,
    "step-3/": False,
    "checkpoint_3/": False,
    "notes.txt": False,
    "logs/": False,
}


@pytest.mark.parametrize("name", sorted(INNER))
def test_which_names_in_lightnings_folder_are_saves(name: str) -> None:
    folder = gc.Folder("a", 1, None)
    assert gc._inner_is_save(name, folder, frozenset()) is INNER[name]
    assert gc.CHECKPOINTS == "checkpoints/"


def test_a_dcp_folder_found_holding_other_files_is_a_save_only_published() -> None:
    folder = gc.Folder("a", 1, None, not_dcp={"step-3/", "checkpoints/x.ckpt/"})
    assert not gc._is_save_entry("step-3/", set(), folder)
    assert gc._is_save_entry("step-3/", {"step-3"}, folder)
    assert not gc._inner_is_save("x.ckpt/", folder, frozenset())
    assert gc._inner_is_save("x.ckpt/", folder, frozenset({"checkpoints/x.ckpt"}))


# What a DCP save's folder may hold, for cleanup to take it for one: name -> (in step-N/,
# in a Lightning sharded .ckpt/)
DCP_INSIDE = {
    ".metadata": (True, True),
    ".metadata.tmp": (True, True),
    "__0_0.distcp": (True, True),
    "__12_3.distcp": (True, True),
    "__1.metadata": (True, True),
    "dispatch-manifest.json": (True, True),
    "meta.pt": (False, True),
    "__0.distcp": (False, False),
    "model.bin": (False, False),
    "notes/": (False, False),
}


class _Listing:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def list_exec_entries(self, attempt: str, entry: str) -> list[str]:
        return self.names


@pytest.mark.parametrize("name", sorted(DCP_INSIDE))
def test_what_a_dcp_folder_may_hold(name: str) -> None:
    in_step, in_sharded = DCP_INSIDE[name]
    st = _Listing([".metadata", name])
    assert gc._holds_dcp_only(st, "a", "step-3/") is in_step  # type: ignore[arg-type]
    assert gc._holds_dcp_only(st, "a", "x.ckpt/") is in_sharded  # type: ignore[arg-type]


def test_the_names_watch_judges_a_dcp_save_by() -> None:
    assert (
        saverules.DCP_METADATA,
        saverules.DCP_METADATA_TMP,
        saverules.LIGHTNING_SHARDED_META,
        saverules.ACCELERATE_READY,
    ) == (".metadata", ".metadata.tmp", "meta.pt", "random_states_0.pkl")


# A save's name -> (its number is a training step, what makes its framework restore the
# step), as dispatch watch and status say (checkpoint/progress.py)
PROGRESS = {
    "checkpoint-3": (
        True,
        "make the trainer restore its step (and optimizer) from the save it loads",
    ),
    "checkpoint_3": (
        False,
        "make the trainer restore its step (and optimizer) from the save it loads",
    ),
    "step-3": (
        True,
        "torchtitan loads the model only by default: give "
        "--checkpoint.no-initial-load-model-only (with "
        '--checkpoint.initial-load-path "$DISPATCH_RESUME_FROM")',
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRESS))
def test_which_names_carry_a_step_and_how_it_is_restored(name: str) -> None:
    from slurm_dispatch.checkpoint import progress

    known, restore = PROGRESS[name]
    assert progress.step_known(f"exec/a/{name}/") is known
    assert progress.restoring(f"exec/a/{name}") == restore
