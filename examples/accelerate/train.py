"""A custom training loop with accelerate's own checkpointing, as accelerate's docs write it:
``ProjectConfiguration(automatic_checkpoint_naming=True)``, the scheduler and the loop's own
state registered with ``register_for_checkpointing``, ``save_state()`` every
``--checkpointing_steps`` and ``load_state(path)`` to resume.  Nothing here knows about
dispatch; job.sh does (it gives ``--project_dir "$DISPATCH_EXEC_DIR"`` and the save to resume).

accelerate numbers its saves ``<project_dir>/checkpoints/checkpoint_<i>`` by a save index
that starts at 0 in every run, so the training step is kept by the loop itself (``Progress``,
saved with each state as a registered object), not read from the folder's name.
Knobs (environment): TRAIN_STEPS (default 200), SAVE_EVERY (20), STEP_SECONDS (a pause per
step, 0).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed


class Progress:
    """The training step, saved and loaded with every state."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def weights_sha256(model: torch.nn.Module) -> str:
    """One hash over every tensor of the model, to tell two models' weights apart."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project_dir", required=True)
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--max_steps", type=int, default=int(os.environ.get("TRAIN_STEPS", 200)))
    parser.add_argument("--checkpointing_steps", type=int,
                        default=int(os.environ.get("SAVE_EVERY", 20)))
    args = parser.parse_args()
    pause = float(os.environ.get("STEP_SECONDS", "0"))
    attempt = os.environ.get("DISPATCH_ATTEMPT", "-")

    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=args.project_dir, automatic_checkpoint_naming=True))
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.9)
    features = torch.randn(1024, 8)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(features, features.sum(dim=1, keepdim=True)),
        batch_size=16, shuffle=True)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    progress = Progress()
    accelerator.register_for_checkpointing(scheduler, progress)
    if args.resume_from_checkpoint:
        accelerator.load_state(args.resume_from_checkpoint)
    print(f"accelerate-example: attempt={attempt} start step={progress.step} "
          f"from={args.resume_from_checkpoint or '-'} weights={weights_sha256(model)}",
          flush=True)
    while progress.step < args.max_steps:
        # Resuming mid-epoch: skip the batches this epoch has trained on already.
        done = progress.step % len(data)
        batches = accelerator.skip_first_batches(data, done) if done else data
        for batch, target in batches:
            time.sleep(pause)
            loss = torch.nn.functional.mse_loss(model(batch), target)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % args.checkpointing_steps == 0:
                where = accelerator.save_state()
                print(f"accelerate-example: attempt={attempt} saved step={progress.step} "
                      f"path={where} weights={weights_sha256(model)}", flush=True)
            if progress.step >= args.max_steps:
                break
    print(f"accelerate-example: attempt={attempt} end step={progress.step}", flush=True)


if __name__ == "__main__":
    main()
