"""A torchtitan-style training loop that saves with torch.distributed.checkpoint (DCP) and
knows nothing of dispatch: every rank trains, and every SAVE_EVERY steps all ranks save one
DCP folder, ``step-<N>``, in the output folder (each rank writes its own shard; the
coordinator writes ``.metadata`` last).  ``dispatch watch`` publishes each one (job.sh).

The model is sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``, which runs on the
CPU with gloo), so each rank holds and writes its own shard of every parameter and of the
optimizer's state; the state dict is torch's ``get_state_dict``, as torchtitan's is.  It
resumes from ``$DISPATCH_RESUME_FROM`` (the latest published save, which the launcher chose;
empty for a fresh start) with ``torch.distributed.checkpoint.load``.

Ranks come from torchrun (RANK, WORLD_SIZE) or from the job script (job-ddp.sh sets them from
srun's SLURM_PROCID and SLURM_NTASKS); MASTER_ADDR and MASTER_PORT say where rank 0 listens.
Knobs (environment): DCP_STEPS (default 12), DCP_SAVE_EVERY (3), DCP_INTERVAL seconds per
step (0.1), DCP_OUT (default $DISPATCH_EXEC_DIR).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def main() -> None:
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = os.environ.get("DCP_OUT") or os.environ["DISPATCH_EXEC_DIR"]
    steps = int(os.environ.get("DCP_STEPS", "12"))
    every = int(os.environ.get("DCP_SAVE_EVERY", "3"))
    interval = float(os.environ.get("DCP_INTERVAL", "0.1"))
    attempt = os.environ.get("DISPATCH_ATTEMPT", "-")
    print(f"dcp-example: attempt={attempt} rank={rank} world={world} backend="
          f"{dist.get_backend()} node={os.environ.get('SLURMD_NODENAME', socket.gethostname())}",
          flush=True)
    torch.manual_seed(0)  # the same model on every rank before it is sharded
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    resume = os.environ.get("DISPATCH_RESUME_FROM", "")
    if resume:
        state = checkpoint_state(model, optimizer, step)
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        step = int(state["step"])
        print(f"dcp-example: attempt={attempt} rank={rank} resumed step={step} "
              f"from={resume} hash={digest(checkpoint_state(model, optimizer, step))}",
              flush=True)
    data = torch.Generator().manual_seed(1234)
    while step < steps:
        time.sleep(interval)
        batch = torch.randn(16, 32, generator=data)
        loss = model(batch).square().mean()  # one "training step"
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step % every == 0:
            state = checkpoint_state(model, optimizer, step)
            dcp.save(state, checkpoint_id=os.path.join(out, f"step-{step}"))
            print(f"dcp-example: attempt={attempt} rank={rank} saved step={step} "
                  f"hash={digest(state)}", flush=True)
    print(f"dcp-example: attempt={attempt} rank={rank} done step={step}",
          flush=True)
    dist.destroy_process_group()


def checkpoint_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int
                     ) -> dict[str, object]:
    """What is saved and loaded: the sharded model and optimizer (torch's own state dicts)
    and the step, as a tensor every rank holds alike."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state,
            "step": torch.tensor(step, dtype=torch.int64)}


def digest(state: object) -> str:
    """A hash of every tensor this rank holds of ``state`` (its own shard of each), by name."""
    h = hashlib.sha256()

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(f"{prefix}.{key}", value[key])
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if isinstance(value, DTensor) else value
            h.update(prefix.encode())
            h.update(local.detach().contiguous().numpy().tobytes())
    walk("", state)
    return h.hexdigest()[:16]


if __name__ == "__main__":
    main()
