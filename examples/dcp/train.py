"""A torchtitan-style training loop that saves with torch.distributed.checkpoint (DCP) and
knows nothing of dispatch: every rank trains, and every SAVE_EVERY steps all ranks save one
DCP folder, ``step-<N>``, in the output folder (each rank writes its own shard; the
coordinator writes ``.metadata`` last).  ``dispatch watch`` publishes each one (job.sh).

It resumes from ``$DISPATCH_RESUME_FROM`` (the latest published save, which the launcher
chose; empty for a fresh start) with ``torch.distributed.checkpoint.load``.  Each rank holds
its own tensor (so each writes its own shard) and a replicated step counter.

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
    torch.manual_seed(rank)
    state = {"step": torch.zeros((), dtype=torch.int64),
             f"rank{rank}": torch.rand(64, 64)}
    resume = os.environ.get("DISPATCH_RESUME_FROM", "")
    if resume:
        dcp.load(state, checkpoint_id=resume)
        print(f"dcp-example: attempt={attempt} rank={rank} resumed step={int(state['step'])} "
              f"from={resume} hash={digest(state)}", flush=True)
    while int(state["step"]) < steps:
        time.sleep(interval)
        state[f"rank{rank}"].mul_(0.5).add_(1.0)  # one "training step"
        state["step"] += 1
        step = int(state["step"])
        if step % every == 0:
            dcp.save(state, checkpoint_id=os.path.join(out, f"step-{step}"))
            print(f"dcp-example: attempt={attempt} rank={rank} saved step={step} "
                  f"hash={digest(state)}", flush=True)
    print(f"dcp-example: attempt={attempt} rank={rank} done step={int(state['step'])}",
          flush=True)
    dist.destroy_process_group()


def digest(state: dict[str, torch.Tensor]) -> str:
    """A hash of every tensor of this rank's state, by name."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    main()
