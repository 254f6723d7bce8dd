"""The Trainer and Lightning callbacks make a save durable and publish it off
the training thread.  Training goes on while a save is synced (the real ``transformers`` and
``lightning`` trainers on the CPU, the disk's fsync made slow at the system-call boundary), a
save is published only once every file of it is synced, at most one is pending, and a process
killed while its save is pending leaves the save whole and unpublished, which cleanup keeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import transformers
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from slurm_dispatch import _fsio
from slurm_dispatch.checkpoint import gc
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import saves
from slurm_dispatch.execution.background import Publisher
from slurm_dispatch.integrations import lightning as dl
from slurm_dispatch.integrations import transformers as dt
from tests.execution_env import dispatch_env
from tests.unit.test_integrations_cleanup import launcher_record
from tests.unit.test_integrations_lightning import fit
from tests.unit.test_integrations_transformers import make_trainer

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

E1, E2 = 1_000_000, 1_000_001
WAIT_S = 10.0  # how long a held sync waits for training to go on before it gives up


class HeldSync:
    """fsync made slow for one save: each of its files' and folders' syncs waits until the
    training thread has got past ``released`` (or WAIT_S), and notes whether it did and
    whether the save was already published."""

    def __init__(self, root: Path, marker: str) -> None:
        self.root, self.marker = root, marker
        self.released = threading.Event()
        self.seen: list[tuple[str, bool, bool]] = []  # (path, training went on, published)
        self.real = _fsio.fsync_path

    def __call__(self, path: str, directory: bool) -> None:
        if self.marker in path:
            went_on = self.released.wait(WAIT_S)
            self.released.set()  # waited in vain once: the rest go on (the test fails)
            published = any(self.marker in f.path for f in store.list_publications(str(self.root)))
            self.seen.append((path, went_on, published))
        self.real(path, directory)


def test_the_trainer_trains_on_while_its_save_is_synced_and_publishes_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    held = HeldSync(root, "checkpoint-2")
    monkeypatch.setattr(_fsio, "fsync_path", held)

    class StepProbe(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:  # a step after the save at 2, before the save at 4
                held.released.set()

    callback = dt.DispatchCallback()
    make_trainer(tmp_path / "o", 4, [callback, StepProbe()]).train()
    files = {os.path.join(d, f) for d, _, fs in os.walk(exec_dir / "checkpoint-2") for f in fs}
    synced = {path for path, _went_on, _published in held.seen}
    assert files <= synced and str(exec_dir / "checkpoint-2") in synced
    # Before: the training thread synced the save itself, so step 3 never came while it waited.
    assert all(went_on for _path, went_on, _published in held.seen), held.seen
    assert not any(published for _path, _went_on, published in held.seen)
    assert [(f.step, Path(f.path).name) for f in store.list_publications(str(root))] == [
        (2, "checkpoint-2"),
        (4, "checkpoint-4"),
    ]
    assert callback.publications and all(
        saves.why_unloadable(str(exec_dir / f"checkpoint-{s}")) is None for s in (2, 4)
    )


def test_lightning_trains_on_while_its_save_is_synced_and_publishes_it_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    held = HeldSync(root, "step=2.ckpt")
    monkeypatch.setattr(_fsio, "fsync_path", held)

    class StepProbe(Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 3:
                held.released.set()

    checkpoint = ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)
    fit(tmp_path, 4, [checkpoint, dl.DispatchCallback(), StepProbe()])
    assert [p for p, _w, _p in held.seen if p.endswith("step=2.ckpt")]
    assert all(went_on for _path, went_on, _published in held.seen), held.seen
    assert not any(published for _path, _went_on, published in held.seen)
    assert [f.step for f in store.list_publications(str(root))] == [2, 4]


def test_at_most_one_save_is_pending_and_a_failure_reaches_the_training_thread() -> None:
    publisher = Publisher()
    gate, order = threading.Event(), []

    def first() -> None:
        gate.wait(WAIT_S)
        order.append("first")
        raise OSError("fsync: No space left on device")

    publisher.submit(first)
    assert publisher.pending
    threading.Timer(0.2, gate.set).start()
    with pytest.raises(OSError, match="No space left"):
        publisher.submit(lambda: order.append("second"))  # waits for the first, then raises
    assert order == ["first"] and not publisher.pending
    publisher.submit(lambda: order.append("third"))
    publisher.wait()
    assert order == ["first", "third"]


KILLED_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from slurm_dispatch import _fsio
    real = _fsio.fsync_path
    def held(path, directory):
        if "checkpoint-2" in path:
            open({syncing!r}, "w").close()
            time.sleep(600)  # killed here, the save written, its sync under way
        real(path, directory)
    _fsio.fsync_path = held
    from pathlib import Path
    from tests.unit.test_integrations_transformers import make_trainer
    from slurm_dispatch.integrations.transformers import DispatchCallback
    make_trainer(Path({out!r}), 2, [DispatchCallback()]).train()
""")


def test_a_process_killed_while_its_save_is_pending_leaves_it_whole_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_a = dispatch_env(root, "a", E1, "", monkeypatch)
    launcher_record(exec_a, E1)
    syncing = tmp_path / "syncing"
    repo = str(Path(__file__).resolve().parents[2])
    script = KILLED_CHILD.format(repo=repo, syncing=str(syncing), out=str(tmp_path / "o"))
    child = subprocess.Popen([sys.executable, "-c", script], cwd=repo, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while not syncing.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert syncing.exists(), f"the child never synced its save (exit {child.poll()})"
    child.send_signal(signal.SIGKILL)
    child.wait()
    save = exec_a / "checkpoint-2"
    assert store.list_publications(str(root)) == []
    assert saves.why_unloadable(str(save), (dt.TRAINER_STATE,)) is None  # whole, manifest and all
    # A later execution publishes; cleanup keeps the killed one's save as never published.
    exec_b = dispatch_env(root, "b", E2, "", monkeypatch)
    launcher_record(exec_b, E2)
    later = exec_b / "checkpoint-9"
    later.mkdir()
    (later / dt.TRAINER_STATE).write_text("{}")
    store.publish(str(root), E2, 9, str(later))
    report = gc.collect(str(root), 1)
    assert "exec/a/checkpoint-2" in [u.path for u in report.unpublished]
    assert save.is_dir()
