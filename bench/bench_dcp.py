"""torch.distributed.checkpoint through slurm_dispatch.integrations.dcp, on real gloo ranks
(forked from a forkserver), in a scratch folder under /var/tmp (not tmpfs) it removes after.

Three figures (bench/README.md, torch.distributed.checkpoint):

* a save's wall time, DCP's own ``save`` (FileSystemWriter) against ours (the same DCP save,
  then the fsyncs, the manifest and the publication), rounds interleaved: target ours under
  1.01x DCP's (publishing adds under 1%);
* the time from "persisted on every rank" (DCP's coordinator has gathered every rank's write
  results) to "published", and from ".metadata in place" to "published" (what publishing
  itself adds), read from DurableWriter's timings: target under 50 ms;
* training time per step with a save every ``--every`` steps, no save / sync / async
  (``async_save`` on a gloo group of its own, overlapping the next steps) / async in DCP's
  process mode (``AsyncCheckpointerType.PROCESS``, torchtitan's ``async_with_pinned_mem``).

``python bench/bench_dcp.py [--ranks 2] [--mib 64] [--rounds 8] [--steps 24] [--every 4]
[--dir /var/tmp] [--json]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

ROOT_ENV = (
    "DISPATCH_CHECKPOINT",
    "DISPATCH_EXEC_DIR",
    "DISPATCH_EPOCH",
    "DISPATCH_ATTEMPT",
    "DISPATCH_RESUME_FROM",
)


def rank_main(rank: int, world: int, scratch: str, opts: dict[str, Any], results: Any) -> None:
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as torch_dcp

    from slurm_dispatch.execution.saves import Execution
    from slurm_dispatch.integrations import dcp

    root = os.path.join(scratch, "ck")
    exec_dir = os.path.join(root, "exec", "a")
    os.environ.update(
        DISPATCH_CHECKPOINT=root,
        DISPATCH_EXEC_DIR=exec_dir,
        DISPATCH_EPOCH="1000000",
        DISPATCH_ATTEMPT="a",
        DISPATCH_RESUME_FROM="",
    )
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{scratch}/store", rank=rank, world_size=world
    )
    persist = dist.new_group(backend="gloo")
    execution = Execution.current()
    assert execution is not None
    numel = opts["mib"] * 2**20 // 4 // world  # float32, this rank's share
    state = {"w": torch.rand(numel), "step": 0}
    layer = torch.rand(256, 256)
    out: dict[str, Any] = {
        "plain": [],
        "ours": [],
        "gathered_to_published": [],
        "metadata_to_published": [],
    }
    step = 0
    for round_ in range(opts["rounds"]):
        for kind in ("plain", "ours") if round_ % 2 == 0 else ("ours", "plain"):
            step += 1
            folder = os.path.join(exec_dir if kind == "ours" else scratch, f"step-{step}")
            os.makedirs(folder, exist_ok=True)
            dist.barrier()
            start = time.monotonic()
            if kind == "plain":
                torch_dcp.save(state, checkpoint_id=folder)
            else:
                writer = dcp.DurableWriter(
                    torch_dcp.FileSystemWriter(folder), execution, step, folder
                )
                torch_dcp.save(state, checkpoint_id=folder, storage_writer=writer)
                if rank == 0:
                    t = writer.timings
                    out["gathered_to_published"].append(t["published"] - t["gathered"])
                    out["metadata_to_published"].append(t["published"] - t["metadata"])
            dist.barrier()
            out[kind].append(time.monotonic() - start)

    def train_step() -> None:
        for _ in range(opts["work"]):
            layer.copy_(torch.tanh(layer @ layer / 256))
        total = torch.ones(1)
        dist.all_reduce(total)
        state["w"].add_(1.0)

    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    for mode in ("none", "sync", "async", "async_process"):
        pending = None
        dist.barrier()
        start = time.monotonic()
        for i in range(opts["steps"]):
            train_step()
            if mode != "none" and i % opts["every"] == opts["every"] - 1:
                step += 1
                state["step"] = step
                if mode == "sync":
                    dcp.save(state, step=step)
                else:
                    if pending is not None:
                        pending.result()  # one async save in flight, as DCP allows
                    kind = (
                        AsyncCheckpointerType.PROCESS
                        if mode == "async_process"
                        else AsyncCheckpointerType.THREAD
                    )
                    pending = dcp.async_save(
                        state, step=step, process_group=persist, async_checkpointer_type=kind
                    )
        if pending is not None:
            pending.result()
        dist.barrier()
        out[f"step_{mode}"] = (time.monotonic() - start) / opts["steps"]
    if rank == 0:
        results.put(out)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib", type=int, default=64, help="state size in MiB, all ranks")
    parser.add_argument("--rounds", type=int, default=8, help="save rounds (each kind once)")
    parser.add_argument("--steps", type=int, default=24, help="training steps per mode")
    parser.add_argument("--every", type=int, default=4, help="save every N steps")
    parser.add_argument("--work", type=int, default=20, help="matmuls per training step")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-dcp-", dir=args.dir)
    os.makedirs(os.path.join(scratch, "ck", "exec", "a"))
    opts = {
        "mib": args.mib,
        "rounds": args.rounds,
        "steps": args.steps,
        "every": args.every,
        "work": args.work,
    }
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(["torch", "torch.distributed.checkpoint"])
    results = forks.Queue()
    try:
        procs = [
            forks.Process(target=rank_main, args=(r, args.ranks, scratch, opts, results))
            for r in range(args.ranks)
        ]
        for p in procs:
            p.start()
        out = results.get(timeout=1800)
        for p in procs:
            p.join()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = statistics.median
    report = {
        "ranks": args.ranks,
        "mib": args.mib,
        "rounds": args.rounds,
        "load": os.getloadavg()[0],
        "save_plain_ms": med(out["plain"]) * 1e3,
        "save_ours_ms": med(out["ours"]) * 1e3,
        "save_ratio": med(out["ours"]) / med(out["plain"]),
        "save_ratio_min": min(out["ours"]) / min(out["plain"]),
        "gathered_to_published_ms": med(out["gathered_to_published"]) * 1e3,
        "metadata_to_published_ms": med(out["metadata_to_published"]) * 1e3,
        "metadata_to_published_max_ms": max(out["metadata_to_published"]) * 1e3,
        "step_none_ms": out["step_none"] * 1e3,
        "step_sync_ms": out["step_sync"] * 1e3,
        "step_async_ms": out["step_async"] * 1e3,
        "step_async_process_ms": out["step_async_process"] * 1e3,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"{args.ranks} ranks, {args.mib} MiB state, {args.rounds} rounds, load {report['load']:.1f}"
    )
    print(
        f"save wall time: DCP {report['save_plain_ms']:.1f} ms, ours "
        f"{report['save_ours_ms']:.1f} ms: {report['save_ratio']:.3f}x "
        f"(min {report['save_ratio_min']:.3f}x; target < 1.01x)"
    )
    print(
        f"persisted on every rank -> published: {report['gathered_to_published_ms']:.1f} ms; "
        f".metadata in place -> published: {report['metadata_to_published_ms']:.1f} ms "
        f"(max {report['metadata_to_published_max_ms']:.1f}; target < 50 ms)"
    )
    print(
        f"per training step, a save every {args.every}: none {report['step_none_ms']:.1f} ms, "
        f"sync {report['step_sync_ms']:.1f} ms, async {report['step_async_ms']:.1f} ms, "
        f"async in a process {report['step_async_process_ms']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
