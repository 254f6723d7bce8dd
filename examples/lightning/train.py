"""A complete Lightning job for slurm-dispatch (copy it and put your model in).

Two lines make it a dispatch job (marked "dispatch:"); outside a dispatch job the same script
runs as before, Lightning's own SLURM support included.  Inside one, the requeue signal
(``#SBATCH --signal=USR1@90`` in job.sh) makes the next batch end save, publish and requeue.
Knobs (environment): TRAIN_STEPS, SAVE_EVERY, SAVE_TOP_K (ModelCheckpoint's, default 2; -1
keeps every save), STEP_SECONDS (a pause per step).  In a job of
several nodes (job-ddp.sh: one process per node) it trains with DDP on every node.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint


def weights_sha256(state: dict[str, Any]) -> str:
    """One hash over every tensor of a state dict, to tell two models' weights apart."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Regression(L.LightningModule):
    def __init__(self, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))
        self.step_seconds = step_seconds

    def on_train_start(self) -> None:
        dist = torch.distributed
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "-"
        print(f"example: attempt={os.environ.get('DISPATCH_ATTEMPT', '-')} "
              f"rank={self.trainer.global_rank} world={self.trainer.world_size} "
              f"backend={backend} node={os.environ.get('SLURMD_NODENAME', '-')}", flush=True)
        if self.trainer.is_global_zero:
            print(f"example: attempt={os.environ.get('DISPATCH_ATTEMPT', '-')} "
                  f"start step={self.trainer.global_step} "
                  f"weights={weights_sha256(self.state_dict())}", flush=True)

    def on_train_end(self) -> None:
        if self.trainer.is_global_zero:
            print(f"example: attempt={os.environ.get('DISPATCH_ATTEMPT', '-')} "
                  f"end step={self.trainer.global_step}", flush=True)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(self.step_seconds)
        features, target = batch
        return torch.nn.functional.mse_loss(self.net(features), target)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    torch.manual_seed(0)
    features = torch.randn(4096, 8)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(features, features.sum(dim=1, keepdim=True)),
        batch_size=16)
    nodes = int(os.environ.get("SLURM_NNODES", "1"))  # one process per node (job-ddp.sh)
    trainer = L.Trainer(
        num_nodes=nodes, strategy="ddp" if nodes > 1 else "auto",
        max_steps=int(os.environ.get("TRAIN_STEPS", "60")), accelerator="cpu", logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(every_n_train_steps=int(os.environ.get("SAVE_EVERY", "10")),
                                   save_top_k=int(os.environ.get("SAVE_TOP_K", "2")),
                                   monitor="step", mode="max"),
                   # dispatch: saves isolated, published, requeue at a safe point
                   DispatchCallback()])
    # dispatch: resume from the latest published save of this job (outside dispatch: None)
    trainer.fit(Regression(float(os.environ.get("STEP_SECONDS", "0"))), data,
                ckpt_path=resume_from_checkpoint())


if __name__ == "__main__":
    main()
