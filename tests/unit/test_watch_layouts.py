"""``dispatch watch`` where frameworks put their saves (issue 36): a watched folder that the
framework makes at its first save, and a run that ends having published nothing.

Watcher's rules run directly on real folders; the process behaviour runs the real ``dispatch
watch`` as a subprocess (helpers from test_watch.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.errors import StoreError
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Watcher
from tests.unit.test_watch import (
    DISPATCH,
    EPOCH,
    hf_save,
    published,
    two_scans,
    watch_env,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ck" / "exec" / "a").mkdir(parents=True)
    return tmp_path / "ck"


@pytest.fixture
def folder(root: Path) -> Path:
    return root / "exec" / "a"


# ---- a watched folder made at the first save (issue 36 item 2) -------------------------

def test_a_folder_made_at_the_first_save_is_waited_for(root: Path, folder: Path) -> None:
    """Lightning's ModelCheckpoint(dirpath=...), accelerate and torchtitan make their folder
    at the first save: inside the execution's folder, its absence is the normal start."""
    lines: list[str] = []
    w = Watcher(str(root), str(folder / "ckpts"), EPOCH, SaveRule.make(), lines.append,
                exec_dir=str(folder))
    assert w.scan() == [] and w.scan() == []
    assert not w.appeared
    (folder / "ckpts").mkdir()
    hf_save(folder / "ckpts", 3)
    assert two_scans(w) == [3]
    assert w.appeared
    assert lines == [f"published step 3: {folder}/ckpts/checkpoint-3"]


@pytest.mark.parametrize("where", ["a file", "under a file", "not inside the execution's"])
def test_a_watched_folder_that_cannot_come_is_still_an_error(root: Path, folder: Path,
                                                             where: str) -> None:
    target = folder / "ckpts"
    if where == "a file":
        target.write_text("not a folder")
    elif where == "under a file":
        (folder / "file").write_text("")
        target = folder / "file" / "ckpts"
    else:
        target = root / "exec" / "other"
    w = Watcher(str(root), str(target), EPOCH, SaveRule.make(), exec_dir=str(folder))
    with pytest.raises(StoreError, match=f"cannot list the watched folder '{target}'"):
        w.scan()


def test_a_folder_that_appears_then_goes_is_an_error(root: Path, folder: Path) -> None:
    w = Watcher(str(root), str(folder / "ckpts"), EPOCH, SaveRule.make(),
                exec_dir=str(folder))
    (folder / "ckpts").mkdir()
    assert w.scan() == []
    (folder / "ckpts").rmdir()
    with pytest.raises(StoreError, match="No such file or directory"):
        w.scan()


def test_watch_publishes_into_a_folder_the_command_makes(root: Path, folder: Path,
                                                         tmp_path: Path) -> None:
    save = folder / "ckpts" / "checkpoint-4"
    proc = subprocess.run(
        [*DISPATCH, "watch", "--interval", "0.05", "--dir", str(folder / "ckpts"), "--", "sh",
         "-c", f"sleep 0.3; mkdir -p {save} && echo '{{}}' > {save}/trainer_state.json"],
        env=watch_env(root, folder), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert published(root) == [(4, "checkpoint-4")]
    assert "never appeared" not in proc.stderr


def test_a_folder_that_never_appeared_is_said_once_at_the_end(root: Path, folder: Path) -> None:
    proc = subprocess.run(
        [*DISPATCH, "watch", "--interval", "0.05", "--dir", str(folder / "ckpts"), "--",
         sys.executable, "-c", "import time; time.sleep(0.3)"],
        env=watch_env(root, folder), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "never appeared" in line]
    assert said == [f"dispatch watch: the watched folder {folder}/ckpts never appeared: "
                    "nothing was saved there"], proc.stderr

