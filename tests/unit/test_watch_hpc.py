"""``dispatch watch`` and Lightning's own SLURM auto-requeue: on the requeue signal (SIGUSR1)
Lightning's ``SLURMEnvironment(auto_requeue=True)``, on by default once it detects Slurm, saves
``hpc_ckpt_<n>.ckpt`` into ``default_root_dir`` and runs ``scontrol requeue``.  Under dispatch
the replacement has a folder of its own, where Lightning finds no ``hpc_ckpt``: unless watch
publishes that save, the replacement resumes from an older one and the work in between is
lost without a word.  Its name holds no step: watch reads the step from the file
(``global_step``, read with stand-ins: nothing in it runs, torch is not imported).

The saves are made by the real Lightning's own handler, in a child process given what Slurm
gives a task (``SLURM_NTASKS``...) and a stand-in ``scontrol`` on its PATH (the process
boundary)."""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from slurm_dispatch.execution import saverules
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Watcher
from tests.unit import test_watch as base
from tests.unit.test_watch import EPOCH, published, torch_like_zip, two_scans

SIGNALLED_AT = 7  # the step at whose end the trainer gets SIGUSR1
TRAINER = f"""
import os, signal, sys
import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

class Signal(Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == {SIGNALLED_AT}:
            os.kill(os.getpid(), signal.SIGUSR1)  # what #SBATCH --signal=USR1@90 sends

trainer = L.Trainer(max_steps=9, default_root_dir=sys.argv[1], logger=False,
                    accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[ModelCheckpoint(every_n_train_steps=5, save_top_k=-1),
                               Signal()])
assert trainer._accelerator_connector.cluster_environment.auto_requeue
trainer.fit(BoringModel())
"""


@pytest.fixture(scope="module")
def lightning_saves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as Lightning's trainer leaves it under Slurm: checkpoints/epoch=0-step=5.ckpt
    from ModelCheckpoint, hpc_ckpt_1.ckpt from its requeue handler at step 7."""
    work = tmp_path_factory.mktemp("lightning")
    bin_dir, out = work / "bin", work / "out"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {work}/scontrol.log\n')
    scontrol.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "42",
        "SLURM_NODELIST": "n1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run(
        [sys.executable, "-c", TRAINER, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert (work / "scontrol.log").read_text() == "requeue 42\n"  # Lightning's own requeue
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "hpc_ckpt_1.ckpt"]
    return out


def test_the_step_of_lightnings_save_is_read_from_it(lightning_saves: Path) -> None:
    assert saverules.step_inside(str(lightning_saves / "hpc_ckpt_1.ckpt")) == SIGNALLED_AT
    assert saverules.step_inside(str(lightning_saves / "checkpoints" / "epoch=0-step=5.ckpt")) == 5


def test_lightnings_requeue_save_is_published_at_its_step(
    root: Path, folder: Path, lightning_saves: Path
) -> None:
    """default_root_dir=$DISPATCH_EXEC_DIR: the save at the requeue signal is the newest; the
    replacement resumes from it (before, watch never published it: no step in its name)."""
    shutil.copytree(lightning_saves, folder, dirs_exist_ok=True)
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    assert two_scans(w) == [5, SIGNALLED_AT]
    assert published(root) == [(5, "epoch=0-step=5.ckpt"), (SIGNALLED_AT, "hpc_ckpt_1.ckpt")]
    assert lines[-1] == f"published step {SIGNALLED_AT}: {folder}/hpc_ckpt_1.ckpt"
    assert w.missed() == []


def test_a_requeue_save_whose_step_cannot_be_read_is_never_published_and_named(
    root: Path, folder: Path
) -> None:
    """A zip that is no torch.save of a Lightning checkpoint: said once, never published, and
    named at the end as a save watch missed (so the run fails, not ends done)."""
    (folder / "hpc_ckpt_1.ckpt").write_bytes(torch_like_zip(1, 100))
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    assert w.scan() == [] and w.scan() == [] and w.scan() == []
    assert published(root) == []
    said = (
        f"not publishing {folder}/hpc_ckpt_1.ckpt: its step cannot be read from it: it "
        "holds no data.pkl (not torch.save's zip)"
    )
    assert lines == [said]
    assert w.missed() == [
        (
            f"{folder}/hpc_ckpt_1.ckpt",
            "its step could not be read from it: it holds no data.pkl (not torch.save's zip)",
        )
    ]


def test_a_requeue_save_still_being_written_waits(
    root: Path, folder: Path, lightning_saves: Path
) -> None:
    """Cut short (fsspec's move across file systems is a copy visible while it grows): no
    step is read from it and nothing is said until it is whole."""
    whole = (lightning_saves / "hpc_ckpt_1.ckpt").read_bytes()
    save = folder / "hpc_ckpt_1.ckpt"
    save.write_bytes(whole[: len(whole) // 2])
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    assert w.scan() == [] and w.scan() == [] and lines == []
    save.write_bytes(whole)
    assert two_scans(w) == [SIGNALLED_AT]


def test_a_command_killed_by_the_warning_signal_watch_forwarded_is_said(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    """`--warn-before` (USR1 to the batch script) with `exec dispatch watch -- python main.py`:
    Lightning installs its requeue handler only where it detects Slurm (SLURM_NTASKS: under
    srun, or with --ntasks), which a trainer the batch script runs itself does not, so USR1
    kills it.  The job fails (138), as it should, but watch says why and what works."""
    proc = subprocess.run(
        [
            *base.DISPATCH,
            "watch",
            "--interval",
            "0.05",
            "--",
            sys.executable,
            "-c",
            "import os, signal; os.kill(os.getppid(), signal.SIGUSR1); signal.pause()",
        ],
        env=base.watch_env(root, folder),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 128 + 10, proc.stderr
    assert (
        "dispatch watch: the command was killed by SIGUSR1, which watch forwarded to it "
        "(the warning signal): it has no handler for it.  Lightning installs its own "
        "(save hpc_ckpt_<n>.ckpt, requeue) only where it detects Slurm: run it under srun "
        "(exec dispatch watch -- srun python ...), or add DispatchCallback"
    ) in proc.stderr, proc.stderr


def test_publishing_lightnings_requeue_save_marks_the_requeue_as_the_jobs_own(
    root: Path, folder: Path, lightning_saves: Path
) -> None:
    """Lightning requeues right after that save, as the callbacks do at the warning signal:
    `--max-requeues` budgets Slurm's requeues (node failures, preemptions), not a job going
    on past its time limit, so the execution's folder is marked as the callbacks mark it."""
    import json

    shutil.copytree(lightning_saves, folder, dirs_exist_ok=True)
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), exec_dir=str(folder))
    assert two_scans(w) == [5, SIGNALLED_AT]
    mark = folder / ".dispatch-requeued.json"
    assert json.loads(mark.read_text()) == {"save": f"{folder}/hpc_ckpt_1.ckpt"}


def test_a_requeue_save_outside_the_watched_folder_is_named_and_fails(
    root: Path, folder: Path, lightning_saves: Path
) -> None:
    """`dispatch watch --dir "$DISPATCH_EXEC_DIR/ckpts"` with ModelCheckpoint's dirpath there
    and default_root_dir the execution's folder: Lightning's save at the requeue signal lands
    beside the watched folder, never published, while the periodic saves are; the requeued
    execution would resume from an older save without a word."""
    ckpts = folder / "ckpts"
    ckpts.mkdir()
    shutil.copy(lightning_saves / "checkpoints" / "epoch=0-step=5.ckpt", ckpts)
    shutil.copy(lightning_saves / "hpc_ckpt_1.ckpt", folder)
    proc = subprocess.run(
        [*base.DISPATCH, "watch", "--interval", "0.05", "--dir", str(ckpts), "--", "true"],
        env=base.watch_env(root, folder),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert published(root) == [(5, "epoch=0-step=5.ckpt")]
    assert proc.returncode == 2, proc.stderr
    assert (
        f"dispatch watch: never published: {folder}/hpc_ckpt_1.ckpt (Lightning's save at "
        f"the requeue signal, outside the watched folder {ckpts}: without --dir watch "
        "publishes it)"
    ) in proc.stderr, proc.stderr


def _zip_of_pickle(
    data: bytes, method: int = zipfile.ZIP_STORED, encrypted: bool = False, corrupt: bool = False
) -> bytes:
    """A zip as torch.save writes one, its ``archive/data.pkl`` being ``data``: compressed
    by ``method``, flagged as encrypted, or with its compressed bytes damaged."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        archive.writestr("archive/data.pkl", data)
        archive.writestr("archive/data/0", b"\0" * 64)
    raw = bytearray(buffer.getvalue())
    if encrypted:  # the general purpose flags' bit 0, in the local and central headers
        raw[6] |= 1
        central = raw.find(b"PK\x01\x02")
        raw[central + 8] |= 1
    if corrupt:
        start = 30 + len("archive/data.pkl")
        raw[start + 4 : start + 40] = bytes(b ^ 0xFF for b in raw[start + 4 : start + 40])
    return bytes(raw)


_LONG_PICKLE = pickle.dumps({"global_step": 7, "state": list(range(2000))})
_BAD_SAVES = {
    # a damaged or odd zip, its end record in place: zlib's, lzma's and zipfile's own errors
    "deflate-damaged": (
        _zip_of_pickle(_LONG_PICKLE, zipfile.ZIP_DEFLATED, corrupt=True),
        "it is not a whole zip (error: ",
    ),
    "lzma-damaged": (
        _zip_of_pickle(_LONG_PICKLE, zipfile.ZIP_LZMA, corrupt=True),
        "it is not a whole zip (LZMAError: ",
    ),
    "encrypted": (
        _zip_of_pickle(_LONG_PICKLE, encrypted=True),
        "it is not a whole zip (RuntimeError: ",
    ),
    "garbage": (_zip_of_pickle(os.urandom(500)), "its data.pkl does not read as a pickle"),
    # opcodes that would run os.system under pickle.load: a stand-in is made, nothing runs
    "runs-something": (
        _zip_of_pickle(b"cos\nsystem\n(S'touch hpc-pwned'\ntR."),
        "it holds no global_step (not a Lightning checkpoint)",
    ),
    "bool": (
        _zip_of_pickle(pickle.dumps({"global_step": True})),
        "its global_step True is not a step (a whole number from 0)",
    ),
    "negative": (
        _zip_of_pickle(pickle.dumps({"global_step": -3})),
        "its global_step -3 is not a step (a whole number from 0)",
    ),
    "float": (
        _zip_of_pickle(pickle.dumps({"global_step": 7.0})),
        "its global_step 7.0 is not a step (a whole number from 0)",
    ),
    "text": (
        _zip_of_pickle(pickle.dumps({"global_step": "7"})),
        "its global_step '7' is not a step (a whole number from 0)",
    ),
    "too-large": (
        _zip_of_pickle(pickle.dumps({"global_step": 10**20})),
        f"its global_step {10**20} is not a step (a whole number from 0)",
    ),
}


@pytest.mark.parametrize("kind", sorted(_BAD_SAVES))
def test_a_requeue_save_that_does_not_read_is_refused_once_and_watch_goes_on(
    root: Path, folder: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile or damaged hpc_ckpt_1.ckpt whose end record is in place: its step is never
    taken, it is said once and never published, and the scan goes on (the save beside it is
    published).  Before, a damaged compressed or an encrypted data.pkl raised out of the scan
    (zlib.error, LZMAError, RuntimeError), ending watch with a traceback; a bad global_step
    was called missing, and one past the store's steps (10**20) stopped publishing for good."""
    monkeypatch.chdir(folder)
    data, why = _BAD_SAVES[kind]
    (folder / "hpc_ckpt_1.ckpt").write_bytes(data)
    (folder / "epoch=0-step=3.ckpt").write_bytes(torch_like_zip(1, 100))
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    assert two_scans(w) == [3]
    assert w.scan() == [] and w.scan() == []
    assert published(root) == [(3, "epoch=0-step=3.ckpt")]
    said = [line for line in lines if "hpc_ckpt_1.ckpt" in line]
    assert len(said) == 1, lines
    assert said[0].startswith(
        f"not publishing {folder}/hpc_ckpt_1.ckpt: its step cannot be read from it: {why}"
    ), said
    assert not (folder / "hpc-pwned").exists() and not (folder / ".dispatch-requeued.json").exists()


@pytest.mark.parametrize("later", [False, True])
def test_a_requeue_save_at_a_step_already_published_still_marks_the_requeue_as_own(
    root: Path, folder: Path, lightning_saves: Path, later: bool
) -> None:
    """Lightning saves at the requeue signal inside its handler, wherever training is: right
    after ModelCheckpoint's save of step 7 (every_n_train_steps=1, or the signal landing in
    the step after a periodic save) its hpc_ckpt_1.ckpt holds step 7 too.  That save is not
    published (step 7 is), but Lightning requeues all the same: the folder is marked as the
    job's own requeue.  Before, only a published hpc save marked it, so --max-requeues counted
    Lightning's requeue as Slurm's.  (``later``: the hpc save appears after step 7 was
    published; else both are seen at the same scan.)"""
    import json

    checkpoints = folder / "checkpoints"
    checkpoints.mkdir()
    shutil.copy(
        lightning_saves / "hpc_ckpt_1.ckpt", checkpoints / f"epoch=0-step={SIGNALLED_AT}.ckpt"
    )
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    if later:
        assert two_scans(w) == [SIGNALLED_AT]
    shutil.copy(lightning_saves / "hpc_ckpt_1.ckpt", folder)
    assert (two_scans(w) if not later else w.scan() + w.scan()) in ([SIGNALLED_AT], [])
    assert published(root) == [(SIGNALLED_AT, f"epoch=0-step={SIGNALLED_AT}.ckpt")]
    mark = folder / ".dispatch-requeued.json"
    assert mark.exists(), lines
    assert json.loads(mark.read_text()) == {"save": f"{folder}/hpc_ckpt_1.ckpt"}


@pytest.mark.parametrize("name", ["hpc_ckpt_1.ckpt", "epoch=0-step=7.ckpt"])
def test_a_symlink_named_as_a_save_is_never_followed_and_named_as_a_symlink(
    root: Path, folder: Path, lightning_saves: Path, tmp_path: Path, name: str
) -> None:
    """A link in the execution's folder to a whole save elsewhere is never published (watch
    follows no symlink), and a run that published nothing names it as what it is.  Before,
    an hpc_ckpt_1.ckpt link was named as a file that 'never looked whole', and an
    epoch=0-step=7.ckpt link not at all: the run ended 0, its save never published."""
    elsewhere = tmp_path / "elsewhere.ckpt"
    shutil.copy(lightning_saves / "hpc_ckpt_1.ckpt", elsewhere)
    (folder / name).symlink_to(elsewhere)
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), exec_dir=str(folder))
    assert w.scan() == [] and w.scan() == [] and w.scan() == []
    assert published(root) == []
    assert w.missed() == [
        (
            f"{folder}/{name}",
            f"a symlink to {elsewhere}, which watch never follows: write the "
            "save itself into the execution's folder",
        )
    ]
