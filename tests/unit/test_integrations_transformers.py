"""The Hugging Face integration with the real ``transformers.Trainer`` on the CPU (a tiny GPT-2
built from a config, no hub): one publication per save, rotation off inside dispatch and
untouched outside, resume with the right weights and step, fallback past a truncated save, and
the rotation race against a replacement that loads slowly."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import torch  # noqa: E402
import transformers  # noqa: E402

from slurm_dispatch.checkpoint import publish as store  # noqa: E402
from slurm_dispatch.execution import saves  # noqa: E402
from slurm_dispatch.integrations.transformers import (  # noqa: E402
    DispatchCallback,
    resume_from_checkpoint,
)
from tests.execution_env import dispatch_env

E1, E2 = 1_000_000, 1_000_001


def weights_hash(model: Any) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def saved_weights_hash(save: str) -> str:
    from safetensors.torch import load_file

    model = transformers.GPT2LMHeadModel(_config())
    model.load_state_dict(load_file(os.path.join(save, "model.safetensors")), strict=False)
    model.tie_weights()
    return weights_hash(model)


def _config() -> Any:
    return transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16)


class StartProbe(transformers.TrainerCallback):  # type: ignore[misc]
    """What the trainer starts from: its step and the weights it trains."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.weights: Optional[str] = None

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        self.step = state.global_step
        self.weights = weights_hash(model)


def make_trainer(
    output_dir: Path, max_steps: int, callbacks: list[Any], save_total_limit: Optional[int] = 1
) -> Any:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_config())
    generator = torch.Generator().manual_seed(1)
    data = [
        {
            "input_ids": torch.randint(0, 32, (8,), generator=generator),
            "labels": torch.randint(0, 32, (8,), generator=generator),
        }
        for _ in range(256)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        save_steps=2,
        save_total_limit=save_total_limit,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        logging_steps=1000,
        disable_tqdm=True,
        seed=0,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)


def published(root: Path) -> list[tuple[int, int, str]]:
    return [(f.epoch, f.step, f.path) for f in store.list_publications(str(root))]


def test_each_save_is_published_once_and_rotation_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    callback = DispatchCallback()
    trainer = make_trainer(tmp_path / "user-out", 6, [callback], save_total_limit=1)
    assert trainer.args.output_dir == str(exec_dir)
    assert trainer.args.save_total_limit is None
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    saves_made = [str(exec_dir / f"checkpoint-{s}") for s in (2, 4, 6)]
    assert published(root) == [(E1, s, p) for s, p in zip((2, 4, 6), saves_made)]
    assert len(callback.publications) == 3
    assert all(os.path.isdir(p) and saves.why_unloadable(p) is None for p in saves_made)
    keep = json.loads((exec_dir / saves.KEEP_RECORD).read_text())
    assert keep == {"framework": "transformers", "setting": "save_total_limit", "keep": 1}
    assert not list((tmp_path / "user-out").glob("checkpoint-*"))  # the Trainer made it empty


def test_outside_dispatch_the_trainer_is_left_alone(tmp_path: Path) -> None:
    callback = DispatchCallback()
    out = tmp_path / "out"
    trainer = make_trainer(out, 6, [callback], save_total_limit=1)
    assert resume_from_checkpoint() is None
    assert resume_from_checkpoint(True) is True
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-6"
    ]  # the user's own rotation, as before
    assert callback.publications == []
    assert not (tmp_path / "pub").exists()


def test_resume_starts_from_the_published_save_with_its_weights_and_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    make_trainer(tmp_path / "o", 4, [DispatchCallback()]).train(
        resume_from_checkpoint=resume_from_checkpoint()
    )
    source = store.latest(str(root))
    assert source is not None and source.step == 4
    exec_b = dispatch_env(root, "b", E2, source.path, monkeypatch)
    probe = StartProbe()
    trainer = make_trainer(tmp_path / "o", 8, [DispatchCallback(), probe])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    assert probe.step == 4
    assert probe.weights == saved_weights_hash(source.path)
    assert trainer.state.global_step == 8
    assert [s for e, s, _ in published(root) if e == E2] == [6, 8]
    assert all(p.startswith(str(exec_b)) for e, _, p in published(root) if e == E2)


def test_a_truncated_latest_save_falls_back_to_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ck"
    dispatch_env(root, "a", E1, "", monkeypatch)
    make_trainer(tmp_path / "o", 4, [DispatchCallback()]).train()
    latest = store.latest(str(root))
    assert latest is not None and latest.step == 4
    weights = Path(latest.path) / "model.safetensors"
    with open(weights, "r+b") as handle:  # a crash cut the file after it was published
        handle.truncate(weights.stat().st_size // 2)
    exec_b = dispatch_env(root, "b", E2, latest.path, monkeypatch)
    capfd.readouterr()
    probe = StartProbe()
    trainer = make_trainer(tmp_path / "o", 6, [DispatchCallback(), probe])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    previous = str(root / "exec" / "a" / "checkpoint-2")
    assert probe.step == 2 and probe.weights == saved_weights_hash(previous)
    err = capfd.readouterr().err
    assert f"not resuming from {latest.path}" in err and "model.safetensors" in err
    record = json.loads((exec_b / saves.RESUME_RECORD).read_text())
    assert record["resume_from"] == previous
    assert "truncated" in record["passed_over"][0]["why"]
    assert trainer.state.global_step == 6


OLD_RUN = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from tests.unit.test_integrations_transformers import make_trainer, DispatchCallback
    import transformers
    from pathlib import Path

    class Slow(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(0.05)

    callbacks = [Slow()] + ([DispatchCallback()] if {integrated!r} else [])
    make_trainer(Path({out!r}), 400, callbacks, save_total_limit=1).train()
""")


@pytest.mark.parametrize("integrated", [True, False], ids=["integration", "without"])
def test_rotation_of_an_old_execution_never_deletes_the_resume_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, integrated: bool
) -> None:
    """The old execution keeps training with save_total_limit=1 while the replacement loads,
    slowly, the save it resumes from; without the integration (both in one folder, as before
    dispatch) the old run's rotation deletes that save under the loader."""
    root = tmp_path / "ck"
    old_exec = root / "exec" / "old"
    old_exec.mkdir(parents=True)
    env = {
        **os.environ,
        "DISPATCH_CHECKPOINT": str(root),
        "DISPATCH_EXEC_DIR": str(old_exec),
        "DISPATCH_EPOCH": str(E1),
        "DISPATCH_RESUME_FROM": "",
    }
    out = old_exec if not integrated else tmp_path / "unused"
    script = OLD_RUN.format(
        tests=str(Path(__file__).resolve().parents[2]), integrated=integrated, out=str(out)
    )
    err = tmp_path / "old.err"
    with open(err, "w") as err_file:
        old = subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=err_file
        )
    try:
        deadline = time.monotonic() + 120
        while not list(old_exec.glob("checkpoint-*/trainer_state.json")):
            assert old.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the old execution made no save"
            time.sleep(0.05)
        if integrated:  # the save is published a moment after its trainer_state.json
            while (found := store.latest(str(root))) is None:
                assert time.monotonic() < deadline, "the old execution published nothing"
                time.sleep(0.05)
            source = found.path
        else:
            source = str(sorted(old_exec.glob("checkpoint-*"), key=os.path.getmtime)[-1])
        steps_then = int(source.rsplit("-", 1)[1])
        dispatch_env(root, "new", E2, source, monkeypatch)
        chosen = resume_from_checkpoint()
        # A slow load: the old execution saves several times while the files are read.
        files = sorted(Path(source).iterdir()) if os.path.isdir(source) else []
        for _ in range(40):
            if any(
                int(p.name.rsplit("-", 1)[1]) >= steps_then + 6
                for p in old_exec.glob("checkpoint-*")
                if p.name[11:].isdigit()
            ):
                break
            time.sleep(0.1)
        loaded = all(p.exists() for p in files) and os.path.isdir(source)
        if integrated:
            assert chosen == source
            assert loaded
            probe = StartProbe()
            make_trainer(tmp_path / "o", steps_then + 2, [DispatchCallback(), probe]).train(
                resume_from_checkpoint=chosen
            )
            assert probe.step == steps_then
        else:
            assert not loaded, "the old run's rotation was expected to delete the source"
    finally:
        old.kill()
        old.wait()


class ProgressProbe(transformers.TrainerCallback):  # type: ignore[misc]
    """The progress record as each save is made (before the dispatch callback's on_save)."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)
        self.at_save: list[Any] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from slurm_dispatch.execution import steps

        self.at_save.append(steps.read(self.folder))


def test_the_callback_records_progress_and_marks_each_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled job (docs/user-guide.md): each step's end is progress, the save after it no
    stall."""
    from slurm_dispatch.execution import steps

    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    probe = ProgressProbe(exec_dir)
    trainer = make_trainer(tmp_path / "out", 4, [probe, DispatchCallback()])
    trainer.train()
    assert [(r["step"], r["saving"], r.get("what")) for r in probe.at_save] == [
        (2, True, "save"),
        (4, True, "save"),
    ]
    last = steps.read(str(exec_dir))
    assert last is not None and (last["step"], last["saving"], last["saves"]) == (4, False, 2)
    # train() returned: what the script does next (trainer.evaluate() on the test set, a final
    # save_model, an export) is no stall, however long it takes.
    assert last.get("ended") is True


def test_each_micro_batch_of_gradient_accumulation_is_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With gradient_accumulation_steps the Trainer's step is many batches;
    each substep's end is progress too (the record's calls), so a long optimizer step of
    micro-batches is no stall."""
    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    callback = DispatchCallback()
    trainer = make_trainer(tmp_path / "out", 2, [callback])
    trainer.args.gradient_accumulation_steps = 3
    trainer.train()
    assert callback._progress is not None
    assert callback._progress.calls == 6  # 2 steps of 3 micro-batches each


def test_a_save_at_an_epochs_end_is_marked_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_strategy="epoch": the Trainer decides the save at the epoch's end, not a step's."""
    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    probe = ProgressProbe(exec_dir)
    trainer = make_trainer(tmp_path / "out", 4, [probe, DispatchCallback()])
    trainer.args.save_strategy = transformers.IntervalStrategy.EPOCH
    trainer.args.per_device_train_batch_size = 64  # one epoch of 4 steps
    trainer.train()
    assert [(r["step"], r["saving"]) for r in probe.at_save] == [(4, True)]
