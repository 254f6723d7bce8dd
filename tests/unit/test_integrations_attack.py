"""A hostile review of the integrations' cleanup with the real Lightning on the CPU: setups a
user writes every day where the limit dispatch applies (or a later `dispatch gc`) removes a
save the framework itself would have kept."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from slurm_dispatch.checkpoint import gc
from slurm_dispatch.integrations import lightning as dl

from .test_integrations_cleanup import launcher_record
from .test_integrations_transformers import dispatch_env

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

E1 = 1_000_000


class TwoMetrics(L.LightningModule):
    """Logs a made-up val_loss and val_acc per step: the best by each is known beforehand
    (val_loss best at step 8, val_acc best at step 4)."""

    LOSS = {2: 0.9, 4: 0.5, 6: 0.8, 8: 0.1, 10: 0.7, 12: 0.6}
    ACC = {2: 0.1, 4: 0.99, 6: 0.2, 8: 0.3, 10: 0.4, 12: 0.5}

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        step = self.global_step + 1
        self.log("val_loss", self.LOSS.get(step, 5.0))
        self.log("val_acc", self.ACC.get(step, 0.0))
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Path, callbacks: list[Any]) -> None:
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1)), batch_size=4
    )
    trainer = L.Trainer(
        max_steps=12,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path / "user"),
        callbacks=[*callbacks, dl.DispatchCallback()],
    )
    trainer.fit(TwoMetrics(), data)


def test_two_model_checkpoints_with_different_monitors_keep_both_bests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A common Lightning setup: one ModelCheckpoint keeps the best by val_loss, another the
    best by val_acc.  The keep record is create-once, so only the first callback's ranking is
    recorded; the val_acc callback's best (`by_acc.best_model_path`, what the user exports at
    the end) is not "one of the framework's bests" for cleanup and is deleted by the limit
    dispatch applies after each publication (or a later `dispatch gc`)."""
    root = tmp_path / "ck"
    exec_a = dispatch_env(root, "a", E1, "", monkeypatch)
    launcher_record(exec_a, E1)
    by_loss = ModelCheckpoint(
        monitor="val_loss", mode="min", save_top_k=1, every_n_train_steps=2, filename="loss-{step}"
    )
    by_acc = ModelCheckpoint(
        monitor="val_acc", mode="max", save_top_k=1, every_n_train_steps=2, filename="acc-{step}"
    )
    _fit(tmp_path, [by_loss, by_acc])
    gc.collect(str(root), None)
    assert os.path.exists(by_loss.best_model_path)
    assert by_acc.best_model_path.endswith("acc-step=4.ckpt")
    assert os.path.exists(by_acc.best_model_path), "the val_acc ModelCheckpoint's best was deleted"


def test_a_keep_every_save_model_checkpoint_is_not_rotated_by_another_ones_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ModelCheckpoint(save_top_k=-1) asks Lightning to keep every save it makes (a
    per-epoch archive), next to a top-1 one.  dispatch records K=1 from the top-1 callback
    and applies it to the whole store, so the archive callback's saves are deleted: Lightning
    alone would have kept all of them."""
    root = tmp_path / "ck"
    exec_a = dispatch_env(root, "a", E1, "", monkeypatch)
    launcher_record(exec_a, E1)
    top1 = ModelCheckpoint(
        monitor="val_loss", mode="min", save_top_k=1, every_n_train_steps=2, filename="loss-{step}"
    )
    archive = ModelCheckpoint(save_top_k=-1, every_n_train_steps=4, filename="all-{step}")
    _fit(tmp_path, [top1, archive])
    gc.collect(str(root), None)
    left = sorted(p.name for p in (exec_a / "checkpoints").glob("all-*.ckpt"))
    assert left == ["all-step=12.ckpt", "all-step=4.ckpt", "all-step=8.ckpt"], (
        "saves of a save_top_k=-1 ModelCheckpoint were deleted"
    )
