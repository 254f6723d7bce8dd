"""A hostile review of cleanup (docs/invariants.md, 9): each test is a way `dispatch gc` / the
integrations' limit still removes something a user needs.  On a folder and on SeaweedFS where
the store has the thing attacked; POSIX only where it needs symlinks."""

from __future__ import annotations

import json
import os
from pathlib import Path

from slurm_dispatch.checkpoint import execdir, gc
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import saves

from .gc_world import World, epoch, posix_world

E1, E2, E3 = epoch(1), epoch(1, 1), epoch(2)


def keep_record(world: World, attempt: str, keep: int, top: int) -> None:
    world.store.create_exec_file(
        attempt,
        execdir.KEEP,
        json.dumps({"framework": "lightning", "setting": "save_top_k", "keep": keep}).encode(),
    )


def with_bests(world: World, attempt: str, ep: int, step: int, best: str) -> str:
    """A save whose manifest names what its framework keeps as best when it was made."""
    relative = world.save(attempt, step)
    world.put(
        f"{relative}/{execdir.MANIFEST_NAME}",
        0,
        json.dumps({"format": 1, "files": {}, "bests": [best]}).encode(),
    )
    return world.publish(ep, step, relative)


# --- races -------------------------------------------------------------------------------


def test_a_pin_made_while_gc_runs_is_honoured(world: World) -> None:
    """`dispatch pin` succeeds (returns True, the pin is in pins/) while a `dispatch gc` (or an
    integration's apply_limit after a publication, which runs after every save) is between
    reading pins/ and removing: gc re-reads the live executions' choices after unpublishing,
    but never the pins.  The user is told the save is pinned; it is deleted anyway."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in range(1, 4)]
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in range(4, 6)]
    target = f"exec/{a}/checkpoint-2"
    made: list[bool] = []

    def pin_now(where: str) -> None:
        if where == "checked":  # gc has planned; the publication is still there
            made.append(gc.pin(world.root, world.locate(target)))

    gc.collect(world.root, 1, pause=pin_now)
    assert made == [True]
    assert gc.pinned(world.store) == {target: "pinned (dispatch pin)"}
    assert world.exists(target), "a save `dispatch pin` accepted was removed"


def test_a_choice_file_another_rank_is_still_writing_protects_the_save(tmp_path: Path) -> None:
    """Multi-rank resume: rank 0 is writing the choice file, its bytes not yet there.
    Before the fix the file was created (O_CREAT|O_EXCL), then written: rank 1 got
    FileExistsError ("another rank chose it too"), found the publication and loaded the
    save; gc, re-reading choices after unpublishing, read an empty file, counted it as no
    choice and removed the save rank 1 was loading.  Now a choice file is written under a
    temporary name and linked into place whole."""
    w = posix_world(tmp_path)
    a = w.execution(E1)
    pubs = [w.saved(a, E1, step) for step in range(1, 4)]
    b = w.execution(E2, resume=pubs[-1])
    w.saved(a, E1, 4)  # the old run publishes once more
    fallback = f"exec/{a}/checkpoint-2"
    execution = saves.Execution(
        root=w.root,
        exec_dir=os.path.join(w.root, "exec", b),
        epoch=E2,
        attempt=b,
        job="j",
        resume_from=w.locate(pubs[-1]),
    )
    # rank 0: still writing (a choice file is written under a temporary name, then linked
    # into place whole, so no reader ever sees it empty)
    open(os.path.join(w.root, "exec", b, execdir.choice_name(fallback) + ".99.1.tmp"), "x").close()
    found = store.list_publications(w.root)
    assert saves.record_choice(execution, w.locate(fallback), found, "fallback")  # rank 1 loads
    gc.collect(w.root, 1)
    assert w.exists(fallback), "the save rank 1 is loading was removed"


# --- the framework's bests ---------------------------------------------------------------


def test_the_live_lineages_best_stays_when_an_old_run_scores_better(world: World) -> None:
    """Lightning save_top_k=1 by val_loss.  B (a requeue) resumed from A's step 3; its
    ModelCheckpoint state says the best is A's step 2 (0.3), and `trainer.test(ckpt_path=
    "best")` / `best_model_path` will load it.  The old run A, still alive for its kill wait
    (the seed: ~24-140 s), publishes one more save at its lower epoch with val_loss 0.1.
    Cleanup ranks all executions' scores together, so A's stale late save becomes "the" best
    and B's real best (A's step 2) is deleted: the framework of the live lineage would keep it."""
    a = world.execution(E1)
    keep_record(world, a, 1, 1)
    a2 = f"exec/{a}/checkpoint-2"
    a_pubs = [
        with_bests(world, a, E1, step, best)
        for step, best in ((1, f"exec/{a}/checkpoint-1"), (2, a2), (3, a2))
    ]
    b = world.execution(E2, resume=a_pubs[-1])
    keep_record(world, b, 1, 1)
    with_bests(world, b, E2, 4, a2)  # B's framework state: the best is still A's step 2
    with_bests(world, a, E1, 4, f"exec/{a}/checkpoint-4")  # the old run's late "best"
    with_bests(world, b, E2, 5, a2)
    gc.collect(world.root, None)
    assert world.exists(a2), "the live lineage's best (what B's ModelCheckpoint names) was removed"
    assert not world.exists(f"exec/{a}/checkpoint-4")  # the old run's late save goes


# --- files that are not saves --------------------------------------------------------------


def test_a_users_file_named_like_dispatchs_own_stays(world: World) -> None:
    """The old-folder rule keeps files that are not saves unless --all-files; but every entry
    starting with ".dispatch" counts as dispatch's own, so a user's `.dispatch-notes.md`,
    `.dispatchrc` (or a folder `.dispatch-data/`) makes no difference: the whole old folder,
    with the user's file, is removed by a plain `dispatch gc --keep 1`."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in range(1, 3)]
    world.put(f"exec/{a}/.dispatch-notes.md", 20)
    world.put(f"exec/{a}/.dispatch-data/table.csv", 20)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    gc.collect(world.root, 1)
    assert world.exists(f"exec/{a}/.dispatch-notes.md")
    assert world.exists(f"exec/{a}/.dispatch-data/table.csv")


def test_non_checkpoint_files_in_checkpoints_folder_stay(world: World) -> None:
    """Lightning's checkpoints/ folder is taken as a save entry as a whole: an old execution
    whose checkpoints/ also holds a file that is no save (a user's exported ONNX model or
    notes, written next to the checkpoints) loses it without --all-files, though the
    old-folder rule promises that files that are not saves stay."""
    a = world.execution(E1)
    world.lightning_saved(a, E1, (1, 2))
    world.put(f"exec/{a}/checkpoints/model.onnx", 40)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    gc.collect(world.root, 1)
    assert not world.exists(f"exec/{a}/checkpoints/epoch=1.ckpt")
    assert world.exists(f"exec/{a}/checkpoints/model.onnx"), (
        "a file that is not a save was removed without --all-files"
    )


def test_a_whole_execution_folder_published_as_a_save_keeps_its_other_files(world: World) -> None:
    """A user's script (or `dispatch watch` pointed at it) publishes the execution's folder
    itself as a save (exec/<attempt>).  Once older than K, cleanup removes it as one save:
    the folder's TensorBoard events and logs go with it, without --all-files."""
    a = world.execution(E1)
    world.put(f"exec/{a}/model.pt", 30)
    world.put(f"exec/{a}/train.log", 5)
    world.publish(E1, 1, f"exec/{a}")
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    gc.collect(world.root, 1)
    assert world.exists(f"exec/{a}/train.log"), "a log (not a save) was removed without --all-files"


# --- symlinks (POSIX) ------------------------------------------------------------------------


def test_a_symlink_chain_keeps_every_link_on_the_way(tmp_path: Path) -> None:
    """latest -> exec/B/best.ckpt (a link) -> exec/A/last.ckpt (a published link, older than
    K) -> exec/A/epoch=3.ckpt.  resolve() jumps to the end of the chain, so the needed set
    holds the first and the last, never the middle link: it is removed as an old save and
    the latest publication now names a dangling symlink."""
    w = posix_world(tmp_path)
    a = w.execution(E1)
    w.put(f"exec/{a}/epoch=3.ckpt", 50)
    w.publish(E1, 3, f"exec/{a}/epoch=3.ckpt")
    os.symlink("epoch=3.ckpt", os.path.join(w.root, "exec", a, "last.ckpt"))
    w.publish(E1, 4, f"exec/{a}/last.ckpt")
    b = w.execution(E2)
    w.saved(b, E2, 5)
    os.symlink(f"../{a}/last.ckpt", os.path.join(w.root, "exec", b, "best.ckpt"))
    w.publish(E2, 6, f"exec/{b}/best.ckpt")
    gc.collect(w.root, 1)
    assert os.path.exists(os.path.join(w.root, "exec", b, "best.ckpt")), (
        "the latest publication names a dangling symlink"
    )
    assert w.latest_exists() and w.every_published_save_exists()


def test_a_folder_save_holding_a_symlink_keeps_its_target(tmp_path: Path) -> None:
    """A folder save whose weights are a symlink into an older save (a user de-duplicating
    frozen weights, or a framework that links unchanged shards): only a symlink *on the way
    to* a save is followed, never one inside it, so the older save is removed and the latest
    save's weights dangle: the latest checkpoint can no longer be loaded."""
    w = posix_world(tmp_path)
    a = w.execution(E1)
    [w.saved(a, E1, step) for step in range(1, 3)]
    b = w.execution(E2)
    latest = w.save(b, 3)
    os.symlink(
        f"../../{a}/checkpoint-1/model.bin", os.path.join(w.root, latest, "frozen_encoder.bin")
    )
    w.publish(E2, 3, latest)
    gc.collect(w.root, 1)
    assert os.path.exists(os.path.join(w.root, latest, "frozen_encoder.bin")), (
        "a file of the latest save dangles"
    )


def test_a_save_named_with_odd_characters_is_found(world: World) -> None:
    """(Held: passes.) Odd but legal names (spaces, unicode, a long deep path): cleanup
    still keeps the K latest and removes only what is older (the head decoding)."""
    a = world.execution(E1)
    deep = "/".join(["ä ö-ü"] * 6)
    old = f"exec/{a}/{deep}/checkpoint-1"
    world.put(f"{old}/model.bin", 10)
    world.publish(E1, 1, old)
    b = world.execution(E2)
    new = f"exec/{b}/{deep}/checkpoint-2"
    world.put(f"{new}/model.bin", 10)
    world.publish(E2, 2, new)
    gc.collect(world.root, 1)
    assert world.exists(new) and not world.exists(old)
    assert world.every_published_save_exists()


def test_a_folder_named_in_latin_1_keeps_its_saves_without_a_record(tmp_path: Path) -> None:
    """A person's folder whose name is not UTF-8 (exec/r\\xe9sum\\xe9, as an older tool wrote
    it) holds a published save and no launcher record: a folder with no record stays whole.
    Cleanup told a publication's folder by decoding the first 35 bytes of its path with
    "replace" (r\\ufffdsum\\ufffd), which names no folder, so once the path was longer than
    that the save was removed as one of an unknown folder while the report said 'kept: no
    record'."""
    world = posix_world(tmp_path)
    name = "r\udce9sum\udce9"  # b"r\xe9sum\xe9", as os.listdir gives it
    save = f"exec/{name}/checkpoint-100000000000000"
    world.put(f"{save}/model.bin", 90)
    world.put(f"{save}/trainer_state.json", 10, b'{"step":1}')
    world.publish(E1, 100000000000000, save)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    report = gc.collect(world.root, 1, lag=0)
    assert world.exists(f"{save}/model.bin"), [r.path for r in report.removals]
    assert next(f for f in report.folders if f.attempt == name).verdict == "kept: no record"
