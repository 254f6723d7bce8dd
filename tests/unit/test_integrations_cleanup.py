"""The integrations and cleanup (docs/invariants.md, 9) with the real Lightning and
Hugging Face Trainer on the CPU: the fallback an execution loads is recorded before the load
and cleanup spares it; the framework's bests survive cleanup; the user's limit is applied
during the run, so the disk stays bounded without `dispatch gc` by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import transformers
from lightning.pytorch.callbacks import ModelCheckpoint

from slurm_dispatch.checkpoint import execdir, gc, model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import launch, saves
from slurm_dispatch.integrations import lightning as dl
from slurm_dispatch.integrations import transformers as dt

from .test_integrations_saves import _execution, _save, _truncate
from .test_integrations_transformers import StartProbe, dispatch_env, make_trainer

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

E1, E2, E3 = 1_000_000, 1_000_001, 1_000_002


def launcher_record(exec_dir: Path, epoch: int, resume: str = "") -> None:
    """The record the launcher writes before the script runs (cleanup reads it)."""
    root = exec_dir.parent.parent
    found = [f for f in store.list_publications(str(root)) if f.path == resume]
    launch.write_exec_record(
        str(exec_dir),
        {
            "job": "j",
            "epoch": epoch,
            "attempt": exec_dir.name,
            "resume_from": resume or None,
            "resume_publication": found[-1].name if found else None,
        },
    )


# --- the fallback is a choice, recorded before the load --------------------------------------


def test_the_fallback_is_recorded_before_the_load_and_cleanup_spares_it(tmp_path: Path) -> None:
    a = _execution(tmp_path, "a", E1, "")
    launcher_record(Path(a.exec_dir), E1)
    first, second = _save(a, 2), _save(a, 4)
    _truncate(second)  # the launcher's choice cannot be loaded
    b = _execution(tmp_path, "b", E2, second)
    launcher_record(Path(b.exec_dir), E2, second)
    chosen = saves.choose_resume(b, required=("trainer_state.json",))
    assert chosen.path == first
    relative = "exec/a/checkpoint-2"
    assert (
        execdir.chosen_in_choice(Path(b.exec_dir, execdir.choice_name(relative)).read_bytes())
        == relative
    )
    _save(a, 6)  # the old execution goes on publishing at its lower epoch
    gc.collect(str(tmp_path), 1)
    assert os.path.isdir(first) and saves.why_unloadable(first) is None


def test_a_fallback_unpublished_while_chosen_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other half of the handshake: cleanup unpublished the fallback before the choice was
    recorded; the execution sees it and takes the one before."""
    a = _execution(tmp_path, "a", E1, "")
    first, second, third = _save(a, 2), _save(a, 4), _save(a, 6)
    _truncate(third)
    b = _execution(tmp_path, "b", E2, third)
    real = saves.record_choice

    def cleanup_first(execution: Any, path: str, found: Any, why: str) -> bool:
        if path == second:
            st = store.open_store(str(tmp_path))
            st.delete_publications([f.name for f in found if f.path == second])
        return real(execution, path, found, why)

    monkeypatch.setattr(saves, "record_choice", cleanup_first)
    chosen = saves.choose_resume(b, required=("trainer_state.json",))
    assert chosen.path == first
    assert [p["path"] for p in chosen.passed_over] == [third, second]
    assert "removed by cleanup" in chosen.passed_over[1]["why"]


def test_the_trainer_resumes_from_its_recorded_fallback_and_gc_spares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_a = dispatch_env(root, "a", E1, "", monkeypatch)
    launcher_record(exec_a, E1)
    make_trainer(tmp_path / "o", 4, [dt.DispatchCallback()], save_total_limit=None).train()
    latest = store.latest(str(root))
    assert latest is not None and latest.step == 4
    weights = Path(latest.path) / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    exec_b = dispatch_env(root, "b", E2, latest.path, monkeypatch)
    launcher_record(exec_b, E2, latest.path)
    source = dt.resume_from_checkpoint()
    assert source == str(exec_a / "checkpoint-2")
    # The old execution publishes once more; a cleanup keeping only the latest runs.
    extra = exec_a / "checkpoint-9"
    extra.mkdir()
    (extra / "trainer_state.json").write_text("{}")
    store.publish(str(root), E1, 9, str(extra))
    report = gc.collect(str(root), 1)
    assert "chose it" in report.kept["exec/a/checkpoint-2"]
    probe = StartProbe()
    trainer = make_trainer(tmp_path / "o", 6, [dt.DispatchCallback(), probe])
    trainer.train(resume_from_checkpoint=source)
    assert probe.step == 2


# --- Lightning: its top-k by monitor survives, its limit is applied --------------------------


class Scored(L.LightningModule):
    """Logs a made-up ``val_loss`` per step, so which saves are best is known beforehand."""

    LOSSES = {2: 0.9, 4: 0.2, 6: 0.8, 8: 0.1, 10: 0.7, 12: 0.6, 14: 0.95, 16: 0.99}

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        step = self.global_step + 1
        self.log("val_loss", self.LOSSES.get(step, 5.0))
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_top_k_by_monitor_survives_and_the_limit_bounds_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_a = dispatch_env(root, "a", E1, "", monkeypatch)
    launcher_record(exec_a, E1)
    checkpoint = ModelCheckpoint(
        monitor="val_loss", mode="min", save_top_k=2, every_n_train_steps=2
    )
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1)), batch_size=4
    )
    trainer = L.Trainer(
        max_steps=16,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "user"),
        callbacks=[checkpoint, dl.DispatchCallback()],
    )
    trainer.fit(Scored(), data)
    on_disk = sorted(
        int(p.name.split("step=")[1].split(".")[0])
        for p in (exec_a / "checkpoints").glob("*step=*.ckpt")
    )
    # The two best by val_loss (steps 8 and 4) and the two latest (14, 16), nothing else.
    assert on_disk == [4, 8, 14, 16]
    assert os.path.exists(checkpoint.best_model_path)  # it never dangles
    keep = json.loads((exec_a / execdir.KEEP).read_text())
    assert keep == {"framework": "lightning", "setting": "save_top_k", "keep": 2}
    manifest = json.loads(Path(checkpoint.best_model_path + execdir.MANIFEST_SUFFIX).read_text())
    assert sorted(manifest["bests"])[:1] == ["exec/a/checkpoints/epoch=0-step=4.ckpt"]
    # A later `dispatch gc` by hand keeps them too.
    gc.collect(str(root), None)
    assert os.path.exists(checkpoint.best_model_path)
    assert all(os.path.exists(f.path) for f in store.list_publications(str(root)))


# --- the Trainer: save_total_limit across executions, best model kept -------------------------


def test_the_trainer_limit_is_applied_during_the_run_across_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_total_limit=2 over three executions: the disk holds the 2 latest saves (and the
    live lineage's source), not every save of every execution."""
    root = tmp_path / "ck"
    source = ""
    for attempt, ep, steps in (("a", E1, 6), ("b", E2, 12), ("c", E3, 18)):
        exec_dir = dispatch_env(root, attempt, ep, source, monkeypatch)
        launcher_record(exec_dir, ep, source)
        trainer = make_trainer(tmp_path / "o", steps, [dt.DispatchCallback()], save_total_limit=2)
        trainer.train(resume_from_checkpoint=dt.resume_from_checkpoint())
        found = store.latest(str(root))
        assert found is not None
        source = found.path
    left = sorted(str(p.relative_to(root)) for p in root.glob("exec/*/checkpoint-*"))
    # The two latest, and the save the live execution resumed from (its launcher chose it).
    assert left == ["exec/b/checkpoint-12", "exec/c/checkpoint-16", "exec/c/checkpoint-18"]


def test_the_trainer_best_model_survives_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_a = dispatch_env(root, "a", E1, "", monkeypatch)
    launcher_record(exec_a, E1)
    torch.manual_seed(0)
    net = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16)
    )
    generator = torch.Generator().manual_seed(1)
    data = [
        {
            "input_ids": torch.randint(0, 32, (8,), generator=generator),
            "labels": torch.randint(0, 32, (8,), generator=generator),
        }
        for _ in range(64)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "o"),
        max_steps=12,
        save_steps=2,
        eval_steps=2,
        eval_strategy="steps",
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        logging_steps=1000,
        disable_tqdm=True,
        seed=0,
        learning_rate=0.5,
    )
    trainer = transformers.Trainer(
        model=net,
        args=args,
        train_dataset=data,
        eval_dataset=data[:8],
        callbacks=[dt.DispatchCallback()],
    )
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and os.path.isdir(best)
    losses = {
        entry["step"]: entry["eval_loss"]
        for entry in trainer.state.log_history
        if "eval_loss" in entry
    }
    assert best.endswith(f"checkpoint-{min(losses, key=losses.__getitem__)}")
    assert len(list(exec_a.glob("checkpoint-*"))) <= 2  # the latest and the best
    assert model.parse_name(store.latest(str(root)).name).step == 12  # type: ignore[union-attr]
