"""What cleanup takes for a save, and what it does with one never published
(docs/invariants.md, 9): a whole save an older execution never published stays and is reported with
the command that publishes it, unless `--remove-unpublished` asks; a name ending in `.ckpt` is
no evidence of a save.  Every test runs on a folder and on a real SeaweedFS server."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import execdir, gc, model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.execution import launch

from .gc_world import World, epoch

E1, E2 = epoch(1), epoch(1, 1)


def sealed(world: World, attempt: str, step: int, size: int = 100) -> str:
    """checkpoint-<step> written whole and sealed as the integrations seal it (its manifest
    lists each file's size), never published; its relative path."""
    relative = world.save(attempt, step, size)
    world.put(
        f"{relative}/{execdir.MANIFEST_NAME}",
        0,
        json.dumps(
            {"format": 1, "files": {"model.bin": size - 10, "trainer_state.json": 10}}
        ).encode(),
    )
    return relative


def test_a_whole_save_never_published_stays_and_says_how_to_publish_it(world: World) -> None:
    """A writes checkpoint-5000, sealed with its manifest; its watch died, so it was never
    published.  B starts fresh and publishes three saves.  Before the fix `gc --keep 3`
    removed A's folder whole as "cut off", 5,000 steps with it."""
    a = world.execution(E1)
    save = sealed(world, a, 5000)
    cut = f"exec/{a}/checkpoint-5001"
    world.put(f"{cut}/model.bin", 40)  # cut off while being written: no ready file
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (1, 2, 3)]
    report = gc.collect(world.root, 3, lag=0)
    assert world.exists(f"{save}/model.bin"), "a whole save never published was removed"
    assert not world.exists(cut), "a save cut off while being written stays"
    assert [(u.path, u.epoch, u.step) for u in report.unpublished] == [(save, E1, 5000)]
    assert "manifest" in report.unpublished[0].why
    folder = next(f for f in report.folders if f.attempt == a)
    assert folder.verdict == "kept: it holds a save never published that looks whole"
    # Asked for, it goes (and its folder with it, nothing else being there).
    report = gc.collect(world.root, 3, lag=0, remove_unpublished=True)
    assert not world.exists(f"exec/{a}") and report.unpublished == []


def test_gc_prints_the_command_that_publishes_it(world: World) -> None:
    a = world.execution(E1)
    save = sealed(world, a, 5000)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (1, 2, 3)]
    done = CliRunner().invoke(
        cli.main, ["gc", "--root", world.root, "--keep", "3"], env={"DISPATCH_LISTING_LAG": "0"}
    )
    assert done.exit_code == 0, done.output
    command = f"dispatch publish --root {world.root} --epoch {E1} --step 5000 {world.locate(save)}"
    assert command in done.output, done.output
    assert "--remove-unpublished" in done.output
    assert world.exists(f"{save}/model.bin")
    done = CliRunner().invoke(
        cli.main,
        ["gc", "--root", world.root, "--keep", "3", "--remove-unpublished"],
        env={"DISPATCH_LISTING_LAG": "0"},
    )
    assert done.exit_code == 0, done.output
    assert not world.exists(save)


def test_a_checkpoint_folder_with_its_ready_file_and_a_dcp_save_stay_unsealed(world: World) -> None:
    """Without a manifest, watch's own rules: checkpoint-N/ with a whole trainer_state.json;
    a step-N/ DCP save with its .metadata in place (one with .metadata.tmp is cut off)."""
    a = world.execution(E1)
    ready = world.save(a, 7)
    world.put(f"exec/{a}/step-8/.metadata", 30)
    world.put(f"exec/{a}/step-8/__0_0.distcp", 30)
    world.put(f"exec/{a}/step-9/.metadata.tmp", 30)
    world.put(f"exec/{a}/step-9/__0_0.distcp", 30)
    b = world.execution(E2)
    world.saved(b, E2, 1)
    report = gc.collect(world.root, 1, lag=0)
    assert world.exists(f"{ready}/model.bin") and world.exists(f"exec/{a}/step-8/.metadata")
    assert not world.exists(f"exec/{a}/step-9")
    assert Counter(u.step for u in report.unpublished) == Counter([7, 8])


def test_a_users_ckpt_folder_and_a_downloaded_ckpt_file_are_not_saves(world: World) -> None:
    """In an older execution, a user's analysis.ckpt/notes.txt and a downloaded
    pretrained.ckpt were removed by `gc --keep 1` as unpublished saves, while train.log beside
    them was kept: a name is no evidence.  A .ckpt folder is a save only with a DCP save's
    files; a .ckpt file only with step=N in its name, its manifest, or a publication."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in (1, 2)]
    world.put(f"exec/{a}/analysis.ckpt/notes.txt", 20)
    world.put(f"exec/{a}/pretrained.ckpt", 300)
    world.put(f"exec/{a}/train.log", 10)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    report = gc.collect(world.root, 1, lag=0)
    assert world.exists(f"exec/{a}/analysis.ckpt/notes.txt")
    assert world.exists(f"exec/{a}/pretrained.ckpt")
    assert world.exists(f"exec/{a}/train.log")
    assert not world.exists(f"exec/{a}/checkpoint-1")  # its published saves still go
    assert sorted(report.left) == sorted(
        f"exec/{a}/{name}" for name in ("analysis.ckpt/", "pretrained.ckpt", "train.log")
    )


def test_ckpt_names_that_are_saves_still_go(world: World) -> None:
    """Lightning's own: a published last.ckpt, an unpublished epoch=0-step=5.ckpt that is
    empty (cut off), a sharded .ckpt folder published: the folder goes whole."""
    a = world.execution(E1)
    world.put(f"exec/{a}/last.ckpt", 30)
    world.publish(E1, 1, f"exec/{a}/last.ckpt")
    world.put(f"exec/{a}/sharded.ckpt/.metadata", 30)
    world.put(f"exec/{a}/sharded.ckpt/meta.pt", 30)
    world.publish(E1, 2, f"exec/{a}/sharded.ckpt")
    world.put(f"exec/{a}/epoch=0-step=5.ckpt", 0, b"")
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    gc.collect(world.root, 1, lag=0)
    assert not world.exists(f"exec/{a}")


def test_the_lightning_integrations_folder_goes_with_its_last_ckpt(world: World) -> None:
    """The Lightning integration's checkpoints/ of an older execution: its published saves and
    its last.ckpt (rewritten in place, never published, no step in its name) are all
    Lightning's; the folder goes whole, and last.ckpt is not kept as a save never published."""
    a = world.execution(E1)
    world.lightning_saved(a, E1, (1, 2), "epoch=0-step={step}.ckpt")
    world.put(f"exec/{a}/checkpoints/last.ckpt", 30)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    report = gc.collect(world.root, 1, lag=0)
    assert not world.exists(f"exec/{a}") and report.unpublished == []


def test_saves_an_older_folder_published_are_told_whatever_its_names_length(tmp_path: Path) -> None:
    """Which saves of an older folder were published is told from the encoded paths past what
    every path of the folder shares; ab3a396 counted that as 48 characters for any folder, right
    only for a launcher's 26-character attempt: in a folder of another name (a test's exec/a)
    every published save was taken for one never published and kept with its folder."""
    for name in ("a", "abcd", "abcdefghi", model.new_attempt()):
        root = tmp_path / name
        for attempt, ep, steps in ((name, E1, (1, 2, 3)), ("newer", E2, (4,))):
            folder = root / "exec" / attempt
            folder.mkdir(parents=True)
            launch.write_exec_record(
                str(folder),
                {
                    "job": "j",
                    "epoch": ep,
                    "attempt": attempt,
                    "resume_from": None,
                    "resume_publication": None,
                },
            )
            for step in steps:
                save = folder / f"checkpoint-{step}"
                save.mkdir()
                (save / "model.bin").write_bytes(b"m" * 90)
                (save / "trainer_state.json").write_text('{"step":1}')
                store.publish(str(root), ep, step, str(save))
        report = gc.collect(str(root), 1, lag=0)
        assert report.unpublished == [], (name, report.unpublished)
        assert not (root / "exec" / name).exists(), name


class _Stopped(Exception):
    pass


@pytest.mark.parametrize("stage", ["intents", "unpublished"])
def test_a_save_written_into_a_marked_folder_after_the_mark_stays(world: World, stage: str) -> None:
    """A cleanup decides to remove older execution A's folder whole (every save published,
    below K), marks it .dispatch-removing, and is killed there (or after unpublishing).  A
    still runs (cut off by a partition, its replacement B already publishing) and writes
    checkpoint-9000, sealed, which its dead watch never publishes.  The rerun took the mark for
    the whole folder decided and removed checkpoint-9000 with it, though the first run never
    saw it: the mark now names the saves it unpublished, and any other is judged as a save
    never published."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in (1, 2)]
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]

    def stop(where: str) -> None:
        if where == stage:
            raise _Stopped(where)

    with pytest.raises(_Stopped):
        gc.collect(world.root, 1, lag=0, pause=stop)
    assert world.exists(f"exec/{a}/{execdir.REMOVING}")
    late = sealed(world, a, 9000)
    report = gc.collect(world.root, 1, lag=0)
    assert world.exists(f"{late}/model.bin"), [r.path for r in report.removals]
    assert [u.path for u in report.unpublished] == [late]
    # What the first run decided is finished: A's published saves are gone, B's latest stays.
    assert not world.exists(f"exec/{a}/checkpoint-1") and not world.exists(f"exec/{a}/checkpoint-2")
    assert world.every_published_save_exists()


def test_a_save_cut_off_at_the_plan_and_finished_after_the_mark_stays(world: World) -> None:
    """At the plan A's checkpoint-9 was being written (no ready file yet): cut off, it goes
    with the folder.  The cleanup is killed after marking; A, still running, finishes it.  A
    mark naming every entry then had the rerun remove a save that looks whole."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in (1, 2)]
    world.put(f"exec/{a}/checkpoint-9/model.bin", 90)
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]

    def stop(where: str) -> None:
        if where == "unpublished":
            raise _Stopped(where)

    with pytest.raises(_Stopped):
        gc.collect(world.root, 1, lag=0, pause=stop)
    world.put(f"exec/{a}/checkpoint-9/trainer_state.json", 10, b'{"step":9}')  # now whole
    report = gc.collect(world.root, 1, lag=0)
    assert [u.path for u in report.unpublished] == [f"exec/{a}/checkpoint-9"]
    assert world.exists(f"exec/{a}/checkpoint-9/model.bin")
    assert not world.exists(f"exec/{a}/checkpoint-1") and world.every_published_save_exists()


def test_a_save_written_while_cleanup_waits_keeps_its_folder(world: World) -> None:
    """The same in one run: A writes checkpoint-9000 (sealed, never published) while cleanup
    waits out ListingLag between unpublishing A's saves and removing A's folder; the removal
    took it with the folder.  The folder is listed again first: it stays, for the next run to
    judge."""
    a = world.execution(E1)
    [world.saved(a, E1, step) for step in (1, 2)]
    b = world.execution(E2)
    [world.saved(b, E2, step) for step in (3, 4)]
    late: list[str] = []
    report = gc.collect(
        world.root, 1, lag=1, wait=lambda seconds: late.append(sealed(world, a, 9000))
    )
    assert late and world.exists(f"{late[0]}/model.bin")
    folder = next(r for r in report.removals if r.path == f"exec/{a}")
    assert "never published, was written whole while cleanup ran" in folder.skipped
    again = gc.collect(world.root, 1, lag=0)
    assert [u.path for u in again.unpublished] == late
    assert world.exists(f"{late[0]}/model.bin") and world.every_published_save_exists()
