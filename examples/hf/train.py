"""A complete Hugging Face Trainer job for slurm-dispatch (copy it and put your model in).

Two lines make it a dispatch job (marked "dispatch:"); outside a dispatch job the same script
runs as before.  The model is a tiny GPT-2 built from a config, so nothing is downloaded.
Knobs (environment): TRAIN_STEPS (total optimizer steps), SAVE_EVERY (steps between saves),
SAVE_LIMIT (the Trainer's save_total_limit), STEP_SECONDS (a pause per step, to watch it run),
OUTPUT_DIR (where saves go outside dispatch).  The same script runs with several ranks
(job-ddp.sh: one per node).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint


def weights_sha256(model: Any) -> str:
    """One hash over every tensor of the model, to tell two models' weights apart."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def tiny_model() -> Any:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=32, bos_token_id=0, eos_token_id=0))


def saved_weights_sha256(checkpoint: str) -> str:
    """The weights hash of the model a checkpoint folder holds (to check what a run resumed)."""
    from safetensors.torch import load_file

    model = tiny_model()
    model.load_state_dict(load_file(os.path.join(checkpoint, "model.safetensors")), strict=False)
    model.tie_weights()  # the saved file holds the shared embedding once
    return weights_sha256(model)


class Report(TrainerCallback):  # type: ignore[misc]
    """Says where training starts and ends (and pauses per step when asked)."""

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        dist = torch.distributed
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "-"
        print(f"example: attempt={os.environ.get('DISPATCH_ATTEMPT', '-')} "
              f"rank={args.process_index} world={args.world_size} backend={backend} "
              f"node={os.environ.get('SLURMD_NODENAME', '-')}", flush=True)
        if state.is_world_process_zero:
            print(f"example: attempt={os.environ.get('DISPATCH_ATTEMPT', '-')} "
                  f"start step={state.global_step} weights={weights_sha256(model)}", flush=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.step_seconds)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            print(f"example: attempt={os.environ.get('DISPATCH_ATTEMPT', '-')} "
                  f"end step={state.global_step}", flush=True)


def main() -> None:
    steps = int(os.environ.get("TRAIN_STEPS", "60"))
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 64, (512, 16), generator=generator)]
    args = TrainingArguments(
        output_dir=os.environ.get("OUTPUT_DIR", "hf-output"), max_steps=steps,
        save_steps=int(os.environ.get("SAVE_EVERY", "5")),
        save_total_limit=int(os.environ.get("SAVE_LIMIT", "2")),
        per_device_train_batch_size=8, use_cpu=True, report_to=[], logging_steps=1000,
        disable_tqdm=True, seed=0)
    trainer = Trainer(model=tiny_model(), args=args, train_dataset=data,
                      callbacks=[DispatchCallback(),  # dispatch: saves isolated and published
                                 Report(float(os.environ.get("STEP_SECONDS", "0")))])
    # dispatch: resume from the latest published save of this job (outside dispatch: None)
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())


if __name__ == "__main__":
    main()
