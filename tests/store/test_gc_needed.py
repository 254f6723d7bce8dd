"""Cleanup never removes a save someone needs (docs/invariants.md, 9), on a folder and on
a real SeaweedFS server: a fallback an execution chose, a published symlink, a save published
twice, pins and the framework's bests, a killed run finished with another K, and files that
are not saves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import execdir, gc, model

from .gc_world import World, epoch, posix_world

E1, E2, E3 = epoch(1), epoch(1, 1), epoch(2)


def choose(world: World, attempt: str, relative: str) -> None:
    """What an integration records before it loads a fallback (execdir's choice file)."""
    world.store.create_exec_file(
        attempt, execdir.choice_name(relative), execdir.choice_bytes(relative, attempt, "fallback")
    )


def test_a_fallback_an_execution_chose_stays_while_the_old_one_publishes(world: World) -> None:
    """A fallback: B's launcher chose A's step 5, which cannot be loaded; B fell back to A's step
    4 and is loading it.  A still publishes at its lower epoch; gc --keep 1 keeps step 4."""
    a = world.execution(E1)
    a_pubs = [world.saved(a, E1, step) for step in range(1, 6)]
    b = world.execution(E2, resume=a_pubs[-1])
    choose(world, b, f"exec/{a}/checkpoint-4")
    world.saved(a, E1, 6)  # the old execution goes on publishing
    report = gc.collect(world.root, 1)
    assert world.exists(f"exec/{a}/checkpoint-4")
    assert a_pubs[3] in world.names()
    assert not world.exists(f"exec/{a}/checkpoint-3")
    assert "chose it" in report.kept[f"exec/{a}/checkpoint-4"]
    assert world.latest_exists() and world.every_published_save_exists()


def test_a_fallback_chosen_while_cleanup_runs_is_spared(world: World) -> None:
    """A fallback, the handshake: the choice is recorded after cleanup planned, before it
    removes."""
    a = world.execution(E1)
    a_pubs = [world.saved(a, E1, step) for step in range(1, 6)]
    b = world.execution(E2, resume=a_pubs[-1])

    def fall_back(where: str) -> None:
        if where == "unpublished":
            choose(world, b, f"exec/{a}/checkpoint-2")

    report = gc.collect(world.root, 1, pause=fall_back)
    assert world.exists(f"exec/{a}/checkpoint-2")
    assert [
        r.skipped.split(" (")[0] for r in report.removals if r.path.endswith("checkpoint-2")
    ] == ["a starting execution resumes from it"]
    assert not world.exists(f"exec/{a}/checkpoint-1")


def test_one_save_published_twice_goes_with_both_names(world: World) -> None:
    """A save published twice: A's step 5 re-published by its replacement C at C's epoch; both names
    go together, or the save stays."""
    a = world.execution(E1)
    a_pubs = [world.saved(a, E1, step) for step in range(1, 6)]
    c = world.execution(E3)  # its record names no source: nothing chose A's step 5
    again = world.publish(E3, 5, f"exec/{a}/checkpoint-5")
    c_pubs = [world.saved(c, E3, step) for step in (6, 7, 8)]
    gc.collect(world.root, 2)
    assert again not in world.names() and a_pubs[-1] not in world.names()
    assert not world.exists(f"exec/{a}/checkpoint-5")
    assert world.names() == sorted(c_pubs[-2:])
    assert world.every_published_save_exists() and world.latest_exists()


def test_one_save_published_twice_stays_while_the_newer_name_is_kept(world: World) -> None:
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in range(1, 4)]
    c = world.execution(E3)
    again = world.publish(E3, 9, f"exec/{a}/checkpoint-3")  # the latest names A's save
    gc.collect(world.root, 1)
    assert again in world.names() and world.exists(f"exec/{a}/checkpoint-3")
    assert world.every_published_save_exists()
    assert c in world.folders()


def test_a_published_symlink_keeps_what_it_leads_to(tmp_path: Path) -> None:
    """A published symlink (POSIX: S3 has no symlinks): best -> exec/A/checkpoint-10 published as
    latest."""
    w = posix_world(tmp_path)
    a = w.execution(E1)
    for step in range(8, 11):
        w.saved(a, E1, step)
    b = w.execution(E2)
    w.saved(b, E2, 1)
    os.symlink(f"exec/{a}/checkpoint-10", os.path.join(w.root, "best"))
    w.publish(E2, 2, "best")
    gc.collect(w.root, 2)
    assert os.path.exists(os.path.join(w.root, "best", "trainer_state.json"))
    assert w.latest_exists() and w.every_published_save_exists()
    assert not w.exists(f"exec/{a}/checkpoint-8")


def test_a_killed_run_is_finished_by_a_rerun_with_a_larger_k(world: World) -> None:
    """A killed run: killed after unpublishing; the rerun with a larger K removes those saves, so
    nothing is left with neither publication nor intent."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in range(1, 4)]
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in range(4, 7)]

    class Killed(Exception):
        pass

    def kill(where: str) -> None:
        if where == "unpublished":
            raise Killed

    with pytest.raises(Killed):
        gc.collect(world.root, 1, pause=kill)
    gc.collect(world.root, 5)
    assert world.store.list_intents() == []
    for attempt in world.folders():
        for entry in world.store.list_exec_entries(attempt):
            if entry.startswith("checkpoint-"):
                path = f"exec/{attempt}/{entry.rstrip('/')}"
                # (SeaweedFS may list a "folder" whose objects are gone: exists() says.)
                named = any(model.parse_name(n).path == path for n in world.names())
                assert named or not world.exists(path), f"{path} has neither publication nor intent"
    assert world.every_published_save_exists()


def test_pinned_saves_stay_and_unpinned_ones_go(world: World) -> None:
    """Pins: a pin keeps a save whatever K; unpinned, it goes."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in range(1, 4)]
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in range(4, 7)]
    gc.pin(world.root, world.locate(f"exec/{a}/checkpoint-2"))
    report = gc.collect(world.root, 1, dry_run=True)
    assert report.kept[f"exec/{a}/checkpoint-2"].startswith("pinned")
    gc.collect(world.root, 1)
    assert world.exists(f"exec/{a}/checkpoint-2") and not world.exists(f"exec/{a}/checkpoint-1")
    assert gc.unpin(world.root, world.locate(f"exec/{a}/checkpoint-2"))
    gc.collect(world.root, 1)
    assert not world.exists(f"exec/{a}/checkpoint-2")


def test_pin_refuses_what_is_not_a_published_save(world: World) -> None:
    from slurm_dispatch.errors import UsageError

    a = world.execution(E1)
    world.saved(a, E1, 1)
    world.save(a, 2)
    with pytest.raises(UsageError, match="checkpoint-2"):
        gc.pin(world.root, world.locate(f"exec/{a}/checkpoint-2"))
    assert world.store.list_pins() == []


def saved_with_bests(world: World, attempt: str, ep: int, step: int, bests: list[str]) -> str:
    """A save whose manifest lists what the framework keeps as best when it was made."""
    relative = world.save(attempt, step)
    world.put(
        f"{relative}/{execdir.MANIFEST_NAME}",
        0,
        json.dumps({"format": 1, "files": {}, "bests": bests}).encode(),
    )
    return world.publish(ep, step, relative)


def test_the_frameworks_best_saves_stay_as_well_as_the_k_latest(world: World) -> None:
    """The framework's bests: save_top_k=2 by val_loss (min): the two best the framework names in
    the live execution's latest manifest stay with the 2 latest."""
    a = world.execution(E1)
    world.store.create_exec_file(
        a,
        execdir.KEEP,
        json.dumps({"framework": "lightning", "setting": "save_top_k", "keep": 2}).encode(),
    )
    losses = [0.9, 0.2, 0.8, 0.1, 0.7, 0.6, 0.95, 0.99]
    made: dict[int, float] = {}
    for step, loss in enumerate(losses, start=1):
        made[step] = loss
        top = sorted(made, key=made.__getitem__)[:2]
        saved_with_bests(world, a, E1, step, [f"exec/{a}/checkpoint-{s}" for s in top])
    report = gc.collect(world.root, None)
    assert report.keep == 2
    kept = {s for s in range(1, 9) if world.exists(f"exec/{a}/checkpoint-{s}")}
    assert kept == {2, 4, 7, 8}
    assert world.every_published_save_exists()


def test_files_that_are_not_saves_stay(world: World) -> None:
    """Files that are not saves: an old execution's TensorBoard events and log stay; its saves go;
    the dry run lists everything a whole-folder removal takes."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in range(1, 4)]
    world.put(f"exec/{a}/runs/Dec01/events.out.tfevents.1", 50)
    world.put(f"exec/{a}/train.log", 5)
    world.put(f"exec/{a}/checkpoint-4/model.bin", 90)  # cut off while being written
    quiet = world.execution(E1)
    world.saved(quiet, E1, 5)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (6, 7)]
    dry = gc.collect(world.root, 1, dry_run=True)
    whole = [r for r in dry.removals if r.kind == "folder"]
    assert [r.path for r in whole] == [f"exec/{quiet}"]
    assert sorted(whole[0].entries) == [".dispatch", "checkpoint-5/"]
    gc.collect(world.root, 1)
    assert world.exists(f"exec/{a}/runs/Dec01/events.out.tfevents.1")
    assert world.exists(f"exec/{a}/train.log")
    for step in range(1, 5):
        assert not world.exists(f"exec/{a}/checkpoint-{step}")
    assert not world.exists(f"exec/{quiet}")
    gc.collect(world.root, 1, all_files=True)
    assert not world.exists(f"exec/{a}")
