"""`dispatch gc` and `dispatch watch --keep` on a folder: the table, --json, --dry-run
--sizes, the refusals (exit 2, nothing removed), and watch keeping the disk bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from slurm_dispatch.cli.dispatch import main
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Watcher

from .gc_world import World, epoch, posix_world

DISPATCH = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]

E1, E2 = epoch(1), epoch(1, 1)


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        main, list(args), env={"DISPATCH_CHECKPOINT": ""}, catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def two_lineages(world: World) -> tuple[str, str, list[str]]:
    a = world.execution(E1)
    pubs = [world.saved(a, E1, step) for step in (1, 2, 3)]
    b = world.execution(E2, resume=pubs[-1])
    pubs += [world.saved(b, E2, step) for step in (4, 5)]
    return a, b, pubs


def test_gc_prints_what_it_removed_with_the_bytes(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a, b, pubs = two_lineages(world)
    code, out, err = run("gc", "--root", world.root, "--keep", "2")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["ACTION", "KIND", "BYTES", "PUBLICATIONS", "PATH"]
    assert lines[1].split() == [
        "removed",
        "save",
        "100",
        "1",
        f"{world.root}/exec/{a}/checkpoint-1",
    ]
    assert lines[2].split()[-1] == f"{world.root}/exec/{a}/checkpoint-2"
    assert lines[-1] == (
        "removed 2 save(s) or folder(s), 2 publication(s), 200 bytes; "
        "keeping the 2 latest publication(s)"
    )


def test_a_dry_run_with_sizes_measures_each_folder_and_removes_nothing(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a, b, pubs = two_lineages(world)
    code, out, _ = run("gc", "--root", world.root, "--keep", "2", "--dry-run", "--sizes")
    assert code == 0
    assert "would remove save 100 1" in " ".join(out.split())
    table = out.split("\n\n")[1].splitlines()
    assert table[0].split() == ["ATTEMPT", "EPOCH", "BYTES", "VERDICT"]
    assert {line.split()[0] for line in table[1:] if not line.startswith("would")} == {a, b}
    kept = out.split("\n\n")[2].splitlines()  # why each kept save stays
    assert kept[0].split() == ["KEPT", "WHY"]
    assert any("one of the K latest" in line for line in kept[1:])
    assert world.exists(f"exec/{a}/checkpoint-1") and len(world.names()) == 5
    code, out, _ = run("gc", "--root", world.root, "--keep", "2", "--dry-run", "--json")
    data = json.loads(out)
    assert data["dry_run"] is True and data["freed"] is None  # not measured without --sizes
    assert [r["path"] for r in data["removals"]] == [
        f"exec/{a}/checkpoint-1",
        f"exec/{a}/checkpoint-2",
    ]


def test_bad_input_is_a_clear_error_and_removes_nothing(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a, b, pubs = two_lineages(world)
    code, out, err = run("gc", "--root", world.root, "--keep", "0")
    assert (code, out) == (2, "") and "--keep 0 must be at least 1" in err
    code, _, err = run("gc", "--root", world.root, "--keep", "two")
    assert code == 2 and "--keep 'two' is not an integer" in err
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    code, _, err = run("gc", "--root", str(home), "--keep", "1")
    assert code == 2 and f"{str(home)!r} is not a checkpoint root" in err
    assert (home / "notes").is_dir() and len(world.names()) == 5
    code, _, err = run("gc", "--keep", "1")
    assert code == 2 and "--root is required" in err


def test_a_symlink_on_the_way_to_a_save_is_refused_before_anything_goes(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a, b, pubs = two_lineages(world)
    elsewhere = Path(world.root, "elsewhere")
    (elsewhere / "checkpoint-0").mkdir(parents=True)
    (elsewhere / "checkpoint-0" / "keepme").write_text("x")
    Path(world.root, "exec", a, "linked").symlink_to(elsewhere)
    world.publish(E1, 0, f"exec/{a}/linked/checkpoint-0")
    code, _, err = run("gc", "--root", world.root, "--keep", "2")
    assert code == 2 and "cleanup never follows one" in err and f"{a}/linked" in err
    assert (elsewhere / "checkpoint-0" / "keepme").exists() and len(world.names()) == 6
    assert world.exists(f"exec/{a}/checkpoint-1")  # nothing half-done
    assert world.store.list_intents() == []


def test_a_save_that_is_a_symlink_goes_as_a_link(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a, b, pubs = two_lineages(world)
    target = Path(world.root, "shared-weights")
    target.mkdir()
    (target / "w.bin").write_text("x")
    Path(world.root, "exec", a, "checkpoint-0").symlink_to(target)
    world.publish(E1, 0, f"exec/{a}/checkpoint-0")
    assert run("gc", "--root", world.root, "--keep", "2")[0] == 0
    assert not world.exists(f"exec/{a}/checkpoint-0") and (target / "w.bin").exists()


def test_watch_keep_bounds_the_disk_while_it_publishes(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a = world.execution(E1)
    old = [world.saved(a, E1, step) for step in (1, 2)]
    b = world.execution(E2, resume=old[-1])
    lines: list[str] = []
    watcher = Watcher(
        world.root, str(Path(world.root, "exec", b)), E2, SaveRule.make(), lines.append
    )
    watcher.keep = 2
    for step in range(3, 9):
        world.save(b, step)
        assert watcher.scan() == []  # the first scan that sees a save only records it
        assert [p.step for p in watcher.scan()] == [step]
        # B is the live lineage: its folder stays, its saves below the 2 latest go.
        assert world.exists(f"exec/{b}/checkpoint-{step}")
        assert not world.exists(f"exec/{b}/checkpoint-{step - 2}")
        assert world.latest_exists() and world.every_published_save_exists()
    # B's epoch is the latest's and B resumed from A's step 2: that save stays, step 1 goes.
    assert world.exists(f"exec/{a}/checkpoint-2") and not world.exists(f"exec/{a}/checkpoint-1")
    assert sorted(p.name for p in Path(world.root, "exec", b).iterdir()) == [
        ".dispatch",
        "checkpoint-7",
        "checkpoint-8",
    ]
    assert len(world.names()) == 3
    assert any(f"removed save exec/{a}/checkpoint-1 (100 bytes)" in line for line in lines)


def test_watch_refuses_keep_zero() -> None:
    out = subprocess.run(
        [*DISPATCH, "watch", "--keep", "0"],
        capture_output=True,
        text=True,
        env={
            "DISPATCH_CHECKPOINT": "/tmp",
            "DISPATCH_EXEC_DIR": "/tmp",
            "DISPATCH_EPOCH": "1000000",
            "PATH": "/usr/bin:/bin",
        },
    )
    assert out.returncode == 2 and "--keep 0 must be at least 1" in out.stderr


def test_pin_unpin_and_a_dry_run_that_says_what_stays_and_why(tmp_path: Path) -> None:
    """Pins and files that are not saves, as a user runs them: pin, list pins, the dry run's reasons
    and the files it would leave."""
    world = posix_world(tmp_path)
    a, b, pubs = two_lineages(world)
    old = world.execution(E1)
    world.saved(old, E1, 0)
    world.put(f"exec/{old}/train.log", 5)
    target = f"{world.root}/exec/{a}/checkpoint-1"
    code, out, err = run("pin", "--root", world.root, target)
    assert (code, out.strip(), err) == (0, f"pinned {target}", "")
    code, out, _ = run("pin", "--root", world.root)
    assert (code, out.splitlines()) == (0, [target])
    code, out, err = run("pin", "--root", world.root, f"{world.root}/exec/{a}/nothing")
    assert code == 2 and "is not a published save" in err and "nothing" in err
    code, out, _ = run("gc", "--root", world.root, "--keep", "1", "--dry-run")
    assert code == 0
    assert f"{target}  pinned (dispatch pin)" in " ".join(out.split("  ")) or any(
        line.split()[:2] == [target, "pinned"] for line in out.splitlines()
    )
    assert (
        f"would leave (not a save; --all-files removes it): {world.root}/exec/{old}/train.log"
    ) in out
    assert any(line.startswith(old) and "not saves" in line for line in out.splitlines())
    assert any(
        line.startswith(a) and "holds a save that stays" in line for line in out.splitlines()
    )
    code, out, _ = run("unpin", "--root", world.root, target)
    assert (code, out.strip()) == (0, f"unpinned {target}")
    code, out, _ = run("unpin", "--root", world.root, target)
    assert out.strip() == f"{target} was not pinned"


def test_a_dry_run_names_a_whole_folder_and_what_in_it_is_not_a_save(tmp_path: Path) -> None:
    world = posix_world(tmp_path)
    a = world.execution(E1)
    second = [world.saved(a, E1, step) for step in (1, 2)][-1]
    b = world.execution(E2, resume=second)
    fourth = [world.saved(b, E2, step) for step in (3, 4)][-1]
    c = world.execution(epoch(1, 2), resume=fourth)
    world.saved(c, epoch(1, 2), 5)
    (Path(world.root) / "exec" / a / "events.log").write_text("x")
    code, out, _ = run("gc", "--root", world.root, "--keep", "1", "--dry-run", "--all-files")
    assert code == 0
    folder = f"{world.root}/exec/{a}"
    assert "would remove folder - 2 " + folder in " ".join(out.split())
    assert f"  would remove {folder}: 4 entries, 1 not named like saves\n" in out
    assert f"  would remove {folder}/events.log\n" in out
    assert world.exists(f"exec/{a}/events.log")
