"""One rank of the multi-rank DCP tests (tests/unit/test_integrations_dcp_ranks.py):
:func:`rank_main` runs in a process forked by a forkserver that imported this module (and so
torch) once, takes the execution's environment, joins a gloo process group (a FileStore), runs
the plan's steps and appends one JSON line per step to ``OUT/rank-RANK.jsonl``.

The fault is the user's own storage writer (DCP's FileSystemWriter, subclassed) that, on one
rank, blocks for good after writing its part (``write``) or after DCP's ``finish`` renamed
``.metadata`` (``finish``), having made ``OUT/blocked``: the test kills the ranks there.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.integrations import dcp

ROWS = 12  # splits over 4, 2 and 1 ranks


def state(step: int, mesh: DeviceMesh, empty: bool = False) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    emb, bias = torch.randn(ROWS, 5, generator=g), torch.randn(7, generator=g)
    if empty:
        emb.zero_()
        bias.zero_()
    return {
        "model": {"emb": distribute_tensor(emb, mesh, [Shard(0)]), "bias": bias},
        "step": -1 if empty else step,
    }


def hashes(sd: dict[str, Any]) -> dict[str, str]:
    out = {"step": str(sd["step"])}
    for name, value in sorted(sd["model"].items()):
        whole = value.full_tensor() if isinstance(value, DTensor) else value  # collective
        out[name] = hashlib.sha256(whole.contiguous().numpy().tobytes()).hexdigest()
    return out


def block(out: str, where: str) -> None:
    with open(os.path.join(out, "blocked"), "w", encoding="utf-8") as handle:
        handle.write(where)
    threading.Event().wait()  # until the test kills this process


class FaultyWriter(FileSystemWriter):  # type: ignore[misc]
    def __init__(self, path: str, at: str, out: str, gate: threading.Event | str | None) -> None:
        super().__init__(path)
        self.at, self.out, self.gate = at, out, gate

    def write_data(self, plan: Any, planner: Any) -> Any:
        written = super().write_data(plan, planner)
        if isinstance(self.gate, str):  # in DCP's own process: a file, made once trained on
            while not os.path.exists(self.gate):
                time.sleep(0.05)
        elif self.gate is not None:  # persistence may end only after the loop trained on
            self.gate.wait()
        if self.at == "write":
            block(self.out, "write")
        return written

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        if self.at == "finish":
            block(self.out, "finish")


def published(root: str, step: int) -> bool:
    return any(f.step == step for f in store.list_publications(root))


def rank_main(
    rank: int,
    world: int,
    store_file: str,
    out: str,
    plan: list[dict[str, Any]],
    env: dict[str, str],
) -> None:
    os.environ.update(env)
    err = os.open(os.path.join(out, f"stderr-{rank}"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(err, 2)
    os.close(err)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    warnings.simplefilter("ignore")  # DCP's and DTensor's notices, not the test's matter
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    persist = dist.new_group(backend="gloo")  # async persistence's own group, as DCP asks
    root = os.environ["DISPATCH_CHECKPOINT"]
    lines = open(os.path.join(out, f"rank-{rank}.jsonl"), "a", encoding="utf-8")

    def say(**fields: Any) -> None:
        lines.write(json.dumps(fields) + "\n")
        lines.flush()

    for action in plan:
        if action["do"] == "load":
            sd = state(0, mesh, empty=True)
            path = dcp.load(sd, checkpoint_id=action.get("checkpoint_id"))
            say(do="load", loaded=path, hashes=hashes(sd))
            continue
        step, faulty = action["step"], action.get("fault_rank") == rank
        gate: threading.Event | str | None = None
        if action.get("overlap") and rank == world - 1:
            # DCP's PROCESS mode pickles the writer into a process of its own: a file then.
            gate = (
                os.path.join(out, f"trained-{step}")
                if action.get("mode") == "process"
                else threading.Event()
            )
        writer = None
        if faulty or gate is not None:
            writer = FaultyWriter(
                dcp.save_folder(step), action.get("fault", "") if faulty else "", out, gate
            )
        sd = state(step, mesh)
        saved = hashes(sd)
        say(do="saving", step=step, hashes=saved)
        if not action.get("async"):
            dcp.save(sd, step=step, storage_writer=writer)
            say(do="saved", step=step, published=published(root, step))
            continue
        options: dict[str, Any] = {}
        if action.get("mode") == "process":  # DCP persists in a process of its own
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            options["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
        future = dcp.async_save(
            sd, step=step, storage_writer=writer, process_group=persist, **options
        )
        seen = []
        for _ in range(action.get("overlap", 0)):  # training goes on meanwhile
            for value in sd["model"].values():
                value.mul_(0.5).add_(1.0)  # staged: the save keeps the values it was given
            total = torch.ones(1)
            dist.all_reduce(total)
            seen.append(published(root, step))
        dist.barrier()  # every rank looked before the gated persistence may end
        if isinstance(gate, str):
            open(gate, "w").close()  # noqa: SIM115
        elif gate is not None:
            gate.set()
        say(do="trained", step=step, published_meanwhile=seen)
        future.result()
        dist.barrier()
        say(do="saved", step=step, published=published(root, step))
    dist.barrier()
    dist.destroy_process_group()
