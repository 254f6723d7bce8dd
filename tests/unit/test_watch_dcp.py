"""``dispatch watch`` publishes a torch.distributed.checkpoint (DCP) folder, which several
ranks write, once its coordinator's ``.metadata`` is in place and every shard it names is
there (docs/user-guide.md, DCP); cleanup treats such a folder as one save.

The saves are real: ``examples/dcp/train.py`` (a torchtitan-style loop that knows nothing of
dispatch) run as two gloo ranks on the CPU, under a real :class:`WatchLoop`.  The
checks on a torn save copy one of those folders and take a part away; two scans are modelled
by calling ``Watcher.scan()`` twice, as in test_watch_complete.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import gc, model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import launch, saverules
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Watcher, WatchLoop

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

EPOCH = model.Epoch(0, 1, 0).value
TRAINER = Path(__file__).resolve().parents[2] / "examples" / "dcp" / "train.py"
RANKS = 2


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _record(folder: Path, epoch: int, attempt: str) -> None:
    launch.write_exec_record(
        str(folder),
        {
            "job": "j",
            "epoch": epoch,
            "attempt": attempt,
            "resume_from": None,
            "resume_publication": None,
        },
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], int]:
    """A root whose execution folder ``a`` got three DCP saves (steps 2, 4, 6) from two real
    ranks, published by a real watch loop running them; (root, watch's lines, status)."""
    root = tmp_path_factory.mktemp("dcp") / "ck"
    folder = root / "exec" / "a"
    folder.mkdir(parents=True)
    _record(folder, EPOCH, "a")
    lines: list[str] = []
    watcher = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append)
    os.environ.update(
        DCP_OUT=str(folder),
        DCP_STEPS="6",
        DCP_SAVE_EVERY="2",
        DCP_INTERVAL="0.3",
        OMP_NUM_THREADS="1",
    )
    try:
        # Two ranks as torchrun would start them (without its own extra torch process).
        command = [
            "bash",
            "-c",
            'for r in $(seq 0 $(($1 - 1))); do RANK=$r "$2" "$3" & done; '
            'for r in $(seq 1 "$1"); do wait -n || exit 1; done',
            "ranks",
            str(RANKS),
            sys.executable,
            str(TRAINER),
        ]
        os.environ.update(
            WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
        code = WatchLoop(watcher, command, 0.2, 120.0, lines.append).run()
    finally:
        for name in (
            "DCP_OUT",
            "DCP_STEPS",
            "DCP_SAVE_EVERY",
            "DCP_INTERVAL",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            os.environ.pop(name, None)
    return root, lines, code


def published(root: Path) -> list[tuple[int, str]]:
    return [(f.step, os.path.basename(f.path)) for f in store.list_publications(str(root))]


def test_an_unmodified_dcp_loop_under_watch_is_published_once_per_save(
    trained: tuple[Path, list[str], int],
) -> None:
    root, lines, code = trained
    assert code == 0, lines
    assert published(root) == [(2, "step-2"), (4, "step-4"), (6, "step-6")], lines
    for step in (2, 4, 6):
        save = root / "exec" / "a" / f"step-{step}"
        shards = sorted(p.name for p in save.iterdir() if p.name.endswith(".distcp"))
        assert shards == [f"__{rank}_0.distcp" for rank in range(RANKS)]  # one per rank
        assert saverules.dcp_problem(str(save)) is None
        # Every shard was in place before its publication was made.
        made = os.stat(
            root
            / store.PUB
            / next(f.name for f in store.list_publications(str(root)) if f.step == step)
        ).st_mtime_ns
        assert all(p.stat().st_mtime_ns <= made for p in save.iterdir())
    assert sum("published step" in line for line in lines) == 3, lines


def _copy(
    trained: tuple[Path, list[str], int], tmp_path: Path, name: str = "step-4"
) -> tuple[Path, Path, Path]:
    root = tmp_path / "ck"
    folder = root / "exec" / "b"
    folder.mkdir(parents=True)
    save = folder / name
    shutil.copytree(trained[0] / "exec" / "a" / "step-4", save)
    return root, folder, save


def _watcher(root: Path, folder: Path, lines: list[str]) -> Watcher:
    return Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append)


def _never_published(w: Watcher, scans: int = 3) -> Watcher:
    for _ in range(scans):
        assert w.scan() == []
    return w


def test_no_publication_before_the_coordinator_renames_the_metadata_into_place(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    root, folder, save = _copy(trained, tmp_path)
    os.rename(save / ".metadata", save / ".metadata.tmp")  # every shard there, finish() not
    w = _watcher(root, folder, lines := list[str]())
    for _ in range(3):
        assert w.scan() == []
    os.rename(save / ".metadata.tmp", save / ".metadata")
    assert w.scan() == []  # seen once
    assert [p.step for p in w.scan()] == [4]
    assert published(root) == [(4, "step-4")] and lines == [f"published step 4: {save}"]


def test_a_second_save_into_the_same_folder_is_not_taken_for_the_first(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    """DCP leaves the old .metadata in place until its rename: a .metadata.tmp beside it."""
    root, folder, save = _copy(trained, tmp_path)
    shutil.copy(save / ".metadata", save / ".metadata.tmp")
    _never_published(_watcher(root, folder, []))


@pytest.mark.parametrize("tear", ["gone", "short", "folder"])
def test_a_shard_the_metadata_names_that_is_missing_or_short_holds_the_save_back(
    trained: tuple[Path, list[str], int], tmp_path: Path, tear: str
) -> None:
    root, folder, save = _copy(trained, tmp_path)
    shard = save / "__1_0.distcp"
    whole = shard.read_bytes()
    if tear == "gone":
        shard.unlink()
    elif tear == "short":
        shard.write_bytes(whole[:-1])
    else:
        shard.unlink()
        shard.mkdir()
    w = _watcher(root, folder, lines := list[str]())
    for _ in range(3):
        assert w.scan() == []
    assert published(root) == []
    assert len(lines) == 1 and "__1_0.distcp" in lines[0] and "step 4 yet" in lines[0], lines
    if tear == "folder":
        shard.rmdir()
    shard.write_bytes(whole)  # the lagging listing caught up
    w.scan()
    assert [p.step for p in w.scan()] == [4]


def test_a_metadata_that_is_not_dcp_or_names_a_file_elsewhere_is_never_published(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    root, folder, save = _copy(trained, tmp_path)
    meta = save / ".metadata"
    real = meta.read_bytes()
    for bad, words in (
        (real[: len(real) // 2], "does not read as a pickle"),
        (pickle.dumps({"storage_data": {}}), "is not torch.distributed"),
        (b"", "not a non-empty regular file"),
    ):
        meta.write_bytes(bad)
        assert words in str(saverules.dcp_problem(str(save)))
    with open(save / ".metadata", "wb") as fh:
        fh.write(real)
    loaded = pickle.loads(real)  # torch's own classes: torch is imported here
    info = next(iter(loaded.storage_data.values()))
    info.relative_path = "../../a/step-2/__0_0.distcp"
    meta.write_bytes(pickle.dumps(loaded))
    assert "not a file of the save's own folder" in str(saverules.dcp_problem(str(save)))
    _never_published(_watcher(root, folder, lines := list[str]()))
    assert published(root) == [] and len(lines) == 1


def test_the_metadata_is_read_without_running_anything_it_names(tmp_path: Path) -> None:
    """A pickle naming os.system is read with stand-ins: nothing runs, and it is no DCP."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    assert "is not torch.distributed" in str(saverules.dcp_problem(str(tmp_path)))
    assert not marker.exists()


def test_a_save_without_collectives_never_looks_whole(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    """Each rank's own __<rank>.metadata: nothing says how many ranks there were."""
    root, folder, save = _copy(trained, tmp_path)
    os.rename(save / ".metadata", save / "__0.metadata")
    w = _never_published(_watcher(root, folder, []))
    assert w.waiting() == []  # so the last scans after the command do not wait for it


def test_lightnings_sharded_ckpt_folder_waits_for_its_meta_pt(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    """Lightning's FSDP sharded save: a folder epoch=E-step=S.ckpt, DCP shards, then rank 0's
    meta.pt (torch.save, a zip written in place)."""
    root, folder, save = _copy(trained, tmp_path, "epoch=0-step=4.ckpt")
    w = _never_published(_watcher(root, folder, []))
    torch.save({"epoch": 0, "global_step": 4}, save / "meta.pt")
    w.scan()
    assert [p.step for p in w.scan()] == [4]
    assert published(root) == [(4, "epoch=0-step=4.ckpt")]


def test_keep_removes_an_older_dcp_save_whole_and_never_a_shard_alone(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    root = tmp_path / "ck"
    shutil.copytree(trained[0], root)
    live = root / "exec" / "a"
    done = gc.collect(str(root), 1)
    removed = sorted(r.path for r in done.removals)
    assert removed == ["exec/a/step-2", "exec/a/step-4"], removed
    assert not (live / "step-2").exists() and not (live / "step-4").exists()
    assert saverules.dcp_problem(str(live / "step-6")) is None  # the latest, whole
    assert published(root) == [(6, "step-6")]


def test_gc_removes_an_older_executions_folder_with_its_torn_dcp_save(
    trained: tuple[Path, list[str], int], tmp_path: Path
) -> None:
    """An older execution cut off mid-save leaves a step-N folder without .metadata: one of
    its saves (never published), not a file that keeps the folder."""
    root = tmp_path / "ck"
    shutil.copytree(trained[0], root)
    old = root / "exec" / "a"
    torn = old / "step-8"
    shutil.copytree(old / "step-6", torn)
    (torn / ".metadata").unlink()
    newer = root / "exec" / "n"
    newer.mkdir()
    epoch = model.Epoch(0, 2, 0).value
    _record(newer, epoch, "n")
    shutil.copytree(old / "step-6", newer / "step-3")
    store.publish(str(root), epoch, 3, str(newer / "step-3"))
    done = gc.collect(str(root), 1)
    assert [(r.kind, r.path) for r in done.removals] == [(gc.FOLDER, "exec/a")], done.removals
    assert not old.exists() and saverules.dcp_problem(str(newer / "step-3")) is None


def test_gc_never_takes_a_step_folder_that_is_not_dcp_for_a_save(tmp_path: Path) -> None:
    """A user's own step-N folder (evaluation output, not DCP's) in an older execution is not
    a save: gc neither removes it as an unpublished save nor the folder whole around it; a
    torn DCP step-N beside it (shards, no .metadata) still goes."""
    root = tmp_path / "ck"
    old = root / "exec" / "a"
    (old / "step-5").mkdir(parents=True)
    (old / "step-5" / "samples.txt").write_text("the user's own\n")
    (old / "step-8").mkdir()
    (old / "step-8" / "__0_0.distcp").write_bytes(b"shard")
    _record(old, EPOCH, "a")
    newer = root / "exec" / "n"
    newer.mkdir()
    epoch = model.Epoch(0, 2, 0).value
    _record(newer, epoch, "n")
    (newer / "epoch=0-step=3.ckpt").write_bytes(b"whole")
    store.publish(str(root), epoch, 3, str(newer / "epoch=0-step=3.ckpt"))
    done = gc.collect(str(root), 1)
    assert [(r.kind, r.path) for r in done.removals] == [(gc.SAVE, "exec/a/step-8")], done.removals
    assert (old / "step-5" / "samples.txt").read_text() == "the user's own\n"
    assert not (old / "step-8").exists()
    assert "exec/a/step-5/" in done.left
