"""Cleanup's rule (docs/invariants.md, 9) on both stores: what stays, what goes, in what order, and
the refusals that remove nothing.  Every test runs on a folder and on a real SeaweedFS server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import gc, model
from slurm_dispatch.control import record
from slurm_dispatch.errors import StoreError, UsageError
from slurm_dispatch.execution import launch

from .gc_world import World, epoch

E1, E2, E3 = epoch(1), epoch(1, 1), epoch(2)


def lineage(world: World) -> tuple[str, list[str], str, list[str]]:
    """Execution A (epoch E1) published steps 1..5; B (E2) resumed from step 5 and published
    6 and 7."""
    a = world.execution(E1)
    a_pubs = [world.saved(a, E1, step) for step in range(1, 6)]
    b = world.execution(E2, resume=a_pubs[-1])
    b_pubs = [world.saved(b, E2, step) for step in (6, 7)]
    return a, a_pubs, b, b_pubs


def test_keeps_the_k_latest_the_live_lineage_and_its_resume_source(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    report = gc.collect(world.root, 2)
    # B's folder stays whole (its epoch is the latest's); A's step 5 stays: B resumed from it.
    assert world.names() == sorted([a_pubs[-1], *b_pubs])
    for step in (1, 2, 3, 4):
        assert not world.exists(f"exec/{a}/checkpoint-{step}")
    assert world.exists(f"exec/{a}/checkpoint-5") and world.exists(f"exec/{a}/.dispatch")
    assert world.exists(f"exec/{b}/checkpoint-6")
    assert [(r.kind, r.path) for r in report.removals] == [
        ("save", f"exec/{a}/checkpoint-{step}") for step in (1, 2, 3, 4)
    ]
    assert report.freed == 400
    assert world.store.list_intents() == []
    assert world.latest_exists() and world.every_published_save_exists()


def test_an_older_folder_that_holds_nothing_kept_goes_whole_record_last(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    c = world.execution(E3, resume=b_pubs[-1])
    c_pubs = [world.saved(c, E3, step) for step in (8, 9)]
    record = len(world.store.read_exec_file(a, ".dispatch") or b"")
    report = gc.collect(world.root, 2)
    assert world.names() == sorted([b_pubs[-1], *c_pubs])
    assert not world.exists(f"exec/{a}")  # nothing of A is needed any more
    assert world.exists(f"exec/{b}/checkpoint-7") and not world.exists(f"exec/{b}/checkpoint-6")
    kinds = {r.path: r.kind for r in report.removals}
    assert kinds[f"exec/{a}"] == "folder"
    # (and the mark cleanup made first, naming the saves it unpublished)
    folder = next(r for r in report.removals if r.path == f"exec/{a}")
    mark = len(gc.mark_of(model.parse_name(n).path.split("/", 2)[2] for n in folder.publications))
    assert report.freed == 5 * 100 + record + 100 + mark
    assert world.folders() == {b, c}


def test_a_live_execution_that_has_not_published_keeps_its_folder_and_source(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    # C started (epoch above every publication) from B's step 6, saved, published nothing.
    c = world.execution(E3, resume=b_pubs[0])
    world.save(c, 8)
    gc.collect(world.root, 1)
    assert world.exists(f"exec/{c}/checkpoint-8")
    assert world.exists(f"exec/{b}/checkpoint-6")  # C's source, below the K latest
    assert world.exists(f"exec/{b}/checkpoint-7")  # the latest
    # B's epoch is the latest's: B may be live too, so its source (A's step 5) stays.
    assert world.exists(f"exec/{a}/checkpoint-5") and not world.exists(f"exec/{a}/checkpoint-4")
    assert world.names() == sorted([a_pubs[-1], *b_pubs])


def test_a_folder_without_a_record_stays_whole(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    stray = world.execution(E1, record=False)
    old = world.saved(stray, E1, 3)
    gc.collect(world.root, 1)
    assert old in world.names() and world.exists(f"exec/{stray}/checkpoint-3")
    assert world.exists(f"exec/{a}/checkpoint-5")  # B's source


def test_an_older_execution_that_never_published_goes(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    crashed = world.execution(E1)
    world.put(f"exec/{crashed}/checkpoint-9/partial.bin", 50)
    gc.collect(world.root, 3)
    assert not world.exists(f"exec/{crashed}")


def test_a_dry_run_removes_nothing_and_says_what_it_would_free(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    before = world.names()
    dry = gc.collect(world.root, 2, dry_run=True, sizes=True)
    assert world.names() == before and world.exists(f"exec/{a}/checkpoint-1")
    assert dry.freed == 400
    sizes = {f.attempt: f.bytes for f in dry.folders}
    record = len(world.store.read_exec_file(a, ".dispatch") or b"")
    assert sizes[a] == 500 + record
    real = gc.collect(world.root, 2)
    assert [r.path for r in real.removals] == [r.path for r in dry.removals]
    assert real.freed == dry.freed


def test_a_second_run_finds_nothing_to_do(world: World) -> None:
    lineage(world)
    gc.collect(world.root, 2)
    assert gc.collect(world.root, 2).removals == []


def test_keep_zero_is_refused_and_nothing_goes(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    before = world.names()
    with pytest.raises(UsageError, match="--keep 0 must be at least 1"):
        gc.collect(world.root, 0)
    assert world.names() == before


def test_a_root_that_is_not_a_store_is_refused(world: World, tmp_path: Path) -> None:
    if world.remote:
        with pytest.raises(StoreError, match="not a checkpoint root"):
            gc.collect(world.root + "-empty", 1)
        return
    other = tmp_path / "home"
    other.mkdir()
    (other / "precious.txt").write_text("x")
    with pytest.raises(StoreError, match="not a checkpoint root"):
        gc.collect(str(other), 1)
    with pytest.raises(StoreError, match="is not a directory"):
        gc.collect(str(tmp_path / "missing"), 1)
    assert (other / "precious.txt").exists()


def test_the_default_keep_is_the_recorded_rotation_limit(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    with pytest.raises(UsageError, match="--keep K is required"):
        gc.collect(world.root, None)
    world.store.create_exec_file(b, ".dispatch-keep.json", b'{"keep": 3}')
    report = gc.collect(world.root, None)
    assert report.keep == 3
    assert a_pubs[-2] not in world.names() and a_pubs[-1] in world.names()


def test_a_killed_run_leaves_intents_a_rerun_finishes(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)

    class Killed(Exception):
        pass

    def stop(where: str) -> None:
        if where == "unpublished":
            raise Killed

    with pytest.raises(Killed):
        gc.collect(world.root, 2, pause=stop)
    # The publications are gone, their saves not yet: the intents say which.
    assert sorted(world.store.list_intents()) == sorted(a_pubs[:4])
    assert world.exists(f"exec/{a}/checkpoint-1")
    assert world.latest_exists() and world.every_published_save_exists()
    report = gc.collect(world.root, 2)
    assert report.finished_intents == 4
    assert not world.exists(f"exec/{a}/checkpoint-1")
    assert world.store.list_intents() == []
    assert world.names() == sorted([a_pubs[-1], *b_pubs])


def test_an_execution_starting_meanwhile_keeps_its_source(world: World) -> None:
    """Cleanup planned without D's record; D's record names a save that was about to go."""
    a, a_pubs, b, b_pubs = lineage(world)
    late: list[str] = []

    def start_d(where: str) -> None:
        if where == "unpublished" and not late:
            # D read the latest long ago (A's step 4 then), and writes its record only now.
            late.append(world.execution(E3, resume=a_pubs[3]))

    report = gc.collect(world.root, 2, pause=start_d)
    assert world.exists(f"exec/{a}/checkpoint-4")
    assert [
        r.skipped.split(" (")[0] for r in report.removals if r.path.endswith("checkpoint-4")
    ] == ["a starting execution resumes from it"]
    assert not world.exists(f"exec/{a}/checkpoint-3")
    # D's launcher, checking after its record, sees its source unpublished: it starts again.
    assert not world.store.has_publication(a_pubs[3])


def test_an_old_execution_publishing_at_a_lower_epoch_never_outranks(world: World) -> None:
    a, a_pubs, b, b_pubs = lineage(world)
    late = world.saved(a, E1, 100)  # A is still running after B started
    gc.collect(world.root, 2)
    assert world.store.latest().name == b_pubs[-1]  # type: ignore[union-attr]
    assert late not in world.names() and not world.exists(f"exec/{a}/checkpoint-100")


def test_publication_names_decode_the_folder_of_long_and_short_paths(world: World) -> None:
    a = world.execution(E1)
    world.put(f"exec/{a}/x", 5)
    short = world.publish(E1, 1, f"exec/{a}/x")
    folder_save = world.publish(E1, 2, f"exec/{a}")
    names = gc._Names()
    assert names.folder(short) == a and names.folder(folder_save) == a
    long = model.format_name(E1, 3, f"exec/{a}/" + "d" * 80 + "/checkpoint-3")
    assert names.folder(long) == a


def test_the_launcher_records_on_the_store_and_starts_again_when_its_source_goes(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other half of the starting race: cleanup unpublishes the launcher's choice between
    its read of the latest and its record; the launcher sees it and starts afresh."""
    a, a_pubs, b, b_pubs = lineage(world)
    job = record.create_job(
        {"generation": 0, "checkpoint": world.root, "script": "job.py"},
        b"#!/bin/sh\n",
        home=str(tmp_path / "home"),
    )
    real_choose = launch.quarantine.choose
    seen: list[str] = []

    def choose_then_cleanup(st: object) -> object:
        # The launcher's read of the latest (not quarantined) publication, since 915b6d7.
        found, passed = real_choose(st)  # type: ignore[arg-type]
        assert found is not None
        if not seen:
            world.store.delete_publications([found.name])  # what cleanup does first
        seen.append(found.name)
        return found, passed

    monkeypatch.setattr(launch.quarantine, "choose", choose_then_cleanup)
    env = {**os.environ, "TMPDIR": str(tmp_path), "SLURM_JOB_ID": "7"}
    values = launch.identity(job, 2, env)
    assert seen == [b_pubs[1], b_pubs[0]]
    assert values["DISPATCH_RESUME_FROM"] == world.locate(model.parse_name(b_pubs[0]).path)
    attempt = values["DISPATCH_ATTEMPT"]
    assert world.folders() == {a, b, attempt}  # the first try's folder is gone
    kept = json.loads(world.store.read_exec_file(attempt, ".dispatch") or b"{}")
    assert kept["resume_publication"] == b_pubs[0] and kept["epoch"] == epoch(2)


def test_the_live_lineage_keeps_its_folder_and_unpublished_saves_not_old_published_ones(
    world: World,
) -> None:
    """A long execution under `watch --keep`: its disk stays bounded."""
    a, a_pubs, b, b_pubs = lineage(world)
    more = [world.saved(b, E2, step) for step in (8, 9, 10)]
    world.save(b, 11)  # being written: not published yet
    gc.collect(world.root, 2)
    assert world.names() == sorted([a_pubs[-1], *more[-2:]])
    for step in (6, 7, 8):
        assert not world.exists(f"exec/{b}/checkpoint-{step}")
    for step in (9, 10, 11):
        assert world.exists(f"exec/{b}/checkpoint-{step}")
    assert world.exists(f"exec/{b}/.dispatch") and world.exists(f"exec/{a}/checkpoint-5")
