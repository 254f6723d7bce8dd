"""``dispatch watch`` publishes a save only once nothing is still writing it, and only once it
is durable (docs/invariants.md, 9).

A save is complete when it looks whole (a folder's ready file, a zip's end record), has not
changed between two consecutive scans, and no process of this user on this node holds one of
its files open for writing or mapped writable; it is fsynced before it is published, so before
``--keep`` removes anything older because of it.  Two scans are modelled by calling
``Watcher.scan()`` twice; writers are real file descriptors and mappings of this process.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import gc, model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import launch
from slurm_dispatch.execution.saverules import SaveRule, open_for_writing
from slurm_dispatch.execution.watch import Published, Watcher, WatchLoop

EPOCH = model.Epoch(0, 1, 0).value
MB4 = 4 * 1024 * 1024


def watcher(
    root: Path,
    folder: Path,
    rule: SaveRule | None = None,
    lines: list[str] | None = None,
    keep: int | None = None,
) -> Watcher:
    sink = lines if lines is not None else []
    if keep is not None:  # cleanup removes saves only from a folder the launcher recorded
        launch.write_exec_record(
            str(folder),
            {
                "job": "j",
                "epoch": EPOCH,
                "attempt": "a",
                "resume_from": None,
                "resume_publication": None,
            },
        )
    w = Watcher(str(root), str(folder), EPOCH, rule or SaveRule.make(), sink.append)
    w.keep = keep
    return w


def published(root: Path) -> list[tuple[int, str]]:
    return [(f.step, os.path.basename(f.path)) for f in store.list_publications(str(root))]


def steps(found: list[Published]) -> list[int]:
    return [p.step for p in found]


# ---- a file save written in place --------------------------------------------------------


def test_a_file_written_in_place_is_published_only_once_its_writer_is_done(
    root: Path, folder: Path
) -> None:
    """The report: with --keep 1, an 8-byte partial .ckpt became the only save and the whole
    4 MB one before it was removed."""
    w = watcher(root, folder, keep=1)
    whole = folder / "epoch=0-step=10.ckpt"
    whole.write_bytes(b"p" * MB4)  # a pickle, not a zip: no end record to wait for
    assert w.scan() == [], "published at its first sighting"
    assert steps(w.scan()) == [10]
    partial = folder / "epoch=0-step=20.ckpt"
    with open(partial, "wb") as writer:
        writer.write(b"p" * 8)
        writer.flush()
        for _ in range(3):  # unchanged across scans, but still open for writing
            assert w.scan() == []
        assert published(root) == [(10, whole.name)] and whole.stat().st_size == MB4
        writer.write(b"p" * (MB4 - 8))
    assert w.scan() == [], "changed since the last scan"
    assert steps(w.scan()) == [20]
    assert published(root) == [(20, partial.name)] and not whole.exists()


def test_a_preallocated_file_waits_for_its_writer(root: Path, folder: Path) -> None:
    """Its size is final from the start; only its writer says it is not done."""
    w = watcher(root, folder)
    target = folder / "epoch=0-step=5.ckpt"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, MB4)
        for _ in range(3):
            assert w.scan() == []
        os.pwrite(fd, b"x" * 4096, 0)
        assert w.scan() == []
    finally:
        os.close(fd)
    assert steps(w.scan()) == [5], "unchanged since the last scan, and its writer is gone"


def test_a_file_written_through_a_shared_mapping_waits_for_it(root: Path, folder: Path) -> None:
    """numpy.memmap and friends: the descriptor may be closed while the mapping writes."""
    w = watcher(root, folder, SaveRule.make(pattern="weights_{step}.bin"))
    target = folder / "weights_3.bin"
    target.write_bytes(b"\0" * 65536)
    with open(target, "r+b") as fh:
        mapping = mmap.mmap(fh.fileno(), 0)
    try:
        for _ in range(3):
            assert w.scan() == []
    finally:
        mapping.close()
    assert steps(w.scan()) == [3]


def test_a_file_that_grows_between_scans_waits(root: Path, folder: Path) -> None:
    """A writer no check on this node can see (another node, another user) still changes the
    file: a save is published only after two scans in a row saw it the same."""
    w = watcher(root, folder, SaveRule.make(pattern="model_{step}.pt"))
    target = folder / "model_1.pt"
    for size in (8, 1024, 4096):
        target.write_bytes(b"m" * size)  # written and closed each time
        assert w.scan() == []
    os.utime(target, ns=(0, 0))  # same size, another mtime: still a change
    assert w.scan() == []
    assert steps(w.scan()) == [1]


def test_a_writer_in_another_process_holds_the_save_back(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    target = folder / "epoch=0-step=4.ckpt"
    target.write_bytes(b"z" * 100)
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "f = open(sys.argv[1], 'ab')\n"
            "open(sys.argv[2] + '.open', 'w').close()\n"
            "while not os.path.exists(sys.argv[2]): time.sleep(0.01)\n",
            str(target),
            str(go),
        ]
    )
    try:
        while not Path(f"{go}.open").exists():
            assert holder.poll() is None, "the holder died"
        real = os.path.realpath(target)
        assert open_for_writing({real}) == [(holder.pid, real)]
        w = watcher(root, folder)
        for _ in range(3):
            assert w.scan() == []
        go.touch()
        assert holder.wait(timeout=30) == 0
    finally:
        holder.kill()
    assert open_for_writing({real}) == []
    assert steps(w.scan()) == [4]


def test_a_writer_is_said_once(root: Path, folder: Path) -> None:
    lines: list[str] = []
    w = watcher(root, folder, lines=lines)
    target = folder / "epoch=0-step=6.ckpt"
    with open(target, "wb") as writer:
        writer.write(b"x")
        writer.flush()
        for _ in range(4):
            assert w.scan() == []
    assert steps(w.scan()) == [6]
    assert lines == [
        f"not publishing step 6 yet: process {os.getpid()} has "
        f"{os.path.realpath(target)} open for writing",
        f"published step 6: {target}",
    ]


def test_the_last_scans_give_up_on_a_save_still_written_after_the_timeout(
    root: Path, folder: Path
) -> None:
    """The command has ended, but something still holds a save open: watch says so and ends
    within --timeout instead of publishing it or waiting for ever."""
    lines: list[str] = []
    w = watcher(root, folder, lines=lines)
    target = folder / "epoch=0-step=8.ckpt"
    with open(target, "wb") as writer:
        writer.write(b"x")
        writer.flush()
        assert WatchLoop(w, ["true"], 0.05, 1.0, lines.append).run() == 0
    assert published(root) == []
    assert lines[-2] == (
        f"not publishing {target}: still being written 1 s (--timeout) after the end"
    )
    assert lines[-1].startswith("published nothing: ")  # and not counted as a save missed


def test_a_reader_does_not_hold_a_save_back(root: Path, folder: Path) -> None:
    target = folder / "epoch=0-step=2.ckpt"
    target.write_bytes(b"r" * 100)
    w = watcher(root, folder)
    with open(target, "rb"):
        assert w.scan() == []
        assert steps(w.scan()) == [2]


# ---- a folder with a file written after the ready file ------------------------------------


def test_a_file_written_after_the_ready_file_holds_the_folder_back(
    root: Path, folder: Path
) -> None:
    """transformers < 4.36 writes trainer_state.json, then rng_state.pth."""
    w = watcher(root, folder)
    save = folder / "checkpoint-50"
    save.mkdir()
    (save / "model.safetensors").write_bytes(b"w" * 1000)
    (save / "trainer_state.json").write_text('{"global_step": 50}')
    assert w.scan() == []
    (save / "rng_state.pth").write_bytes(b"r" * 10)
    assert w.scan() == [], "the folder changed after its ready file was whole"
    assert steps(w.scan()) == [50]


def test_a_file_deep_in_a_folder_still_open_for_writing_holds_it_back(
    root: Path, folder: Path
) -> None:
    w = watcher(root, folder)
    save = folder / "checkpoint-7"
    (save / "global_step7").mkdir(parents=True)
    (save / "trainer_state.json").write_text("{}")
    with open(save / "global_step7" / "mp_rank_00_model_states.pt", "wb") as shard:
        shard.write(b"s")
        shard.flush()
        for _ in range(3):
            assert w.scan() == []
    assert steps(w.scan()) == [7]


def test_a_change_deep_in_a_folder_holds_it_back(root: Path, folder: Path) -> None:
    w = watcher(root, folder)
    save = folder / "checkpoint-8"
    (save / "a" / "b").mkdir(parents=True)
    (save / "trainer_state.json").write_text("{}")
    (save / "a" / "b" / "shard").write_bytes(b"1")
    assert w.scan() == []
    (save / "a" / "b" / "shard").write_bytes(b"2")  # same size, written again
    os.utime(save / "a" / "b" / "shard", ns=(1, 1))
    assert w.scan() == []
    (save / "a" / "new").write_bytes(b"")
    assert w.scan() == []
    assert steps(w.scan()) == [8]


def test_a_folder_holding_a_fifo_is_never_published(root: Path, folder: Path) -> None:
    """Syncing it would block in open(): a save holds files, folders and symlinks only."""
    lines: list[str] = []
    w = watcher(root, folder, lines=lines)
    save = folder / "checkpoint-9"
    save.mkdir()
    (save / "trainer_state.json").write_text("{}")
    os.mkfifo(save / "pipe")
    for _ in range(3):
        assert w.scan() == []
    assert lines == [
        f"not publishing step 9: {save} holds {save}/pipe, which is not a "
        "regular file, folder or symlink"
    ]


# ---- durable before anything older goes ---------------------------------------------------


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every path os.fsync is called on, in order (read from /proc/self/fd)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield seen


def every_part(save: Path) -> set[str]:
    parts = {os.path.realpath(save), os.path.realpath(save.parent)}
    for path in save.rglob("*"):
        if not path.is_symlink():
            parts.add(os.path.realpath(path))
    return parts


def test_keep_removes_nothing_before_the_new_save_is_synced(
    root: Path, folder: Path, synced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    at_collect: list[set[str]] = []
    real_collect = gc.collect

    def collect(*args: object, **kwargs: object) -> object:
        at_collect.append(set(synced))
        return real_collect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gc, "collect", collect)
    w = watcher(root, folder, keep=1)
    saves = []
    for step in (1, 2):
        save = folder / f"checkpoint-{step}"
        (save / "sub").mkdir(parents=True)
        (save / "model.safetensors").write_bytes(b"w" * 100)
        (save / "sub" / "optimizer.pt").write_bytes(b"o" * 100)
        (save / "trainer_state.json").write_text("{}")
        (save / "link").symlink_to("model.safetensors")
        saves.append(save)
        synced.clear()
        assert w.scan() == [] and not synced and len(at_collect) == step - 1
        assert steps(w.scan()) == [step]
        missing = every_part(save) - at_collect[-1]
        assert not missing, f"not synced before cleanup ran: {sorted(missing)}"
    assert not saves[0].exists() and saves[1].exists()


def test_a_save_is_synced_before_it_is_published(
    root: Path, folder: Path, synced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    at_publish: list[set[str]] = []
    real_publish = store.publish

    def publish(*args: object, **kwargs: object) -> str:
        at_publish.append(set(synced))
        return real_publish(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "publish", publish)
    w = watcher(root, folder)
    target = folder / "epoch=0-step=3.ckpt"
    target.write_bytes(b"p" * 100)
    assert w.scan() == []
    assert steps(w.scan()) == [3]
    assert at_publish and {os.path.realpath(target), os.path.realpath(folder)} <= at_publish[0]


def test_a_save_that_cannot_be_synced_is_not_published(
    root: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.errors import StoreError

    def fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    w = watcher(root, folder)
    (folder / "epoch=0-step=3.ckpt").write_bytes(b"p" * 100)
    assert w.scan() == []
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StoreError, match="cannot sync .*step=3.ckpt.*Input/output error"):
        w.scan()
    assert published(root) == []
