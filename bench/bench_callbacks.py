#!/usr/bin/env python3
"""Benchmark the Hugging Face integration's cost per save against the save itself.

Run ``python bench/bench_callbacks.py`` (needs the ``transformers`` extra).  A real
``transformers.Trainer`` on the CPU trains a GPT-2 built from a config whose weights are about
100 MB (``save_only_model``, so a save is the weights and the small state files) and saves every
step, inside a dispatch execution made up in a scratch root.  For each save it times:

* the save: ``Trainer._save_checkpoint`` (the framework's own work, written to the page cache);
* the callback's bookkeeping: the manifest (a stat per file) and the publication
  (``O_CREAT|O_EXCL`` + two directory fsyncs), i.e. what publication adds;
* the callback's data sync: fsync of every file and folder of the save, which makes the save
  durable (the framework does not sync; without this a crash may leave a published save short).

The target (issue 10): the callback's cost < 1% of the save's wall time for a 100 MB save.  It
is reported for the bookkeeping, and separately with the data sync, whose cost is the disk's
write-back of the save and not the callback's.  Timings are wall-clock ``perf_counter``;
the first save is a warm-up and not counted.  Prints a JSON summary; exit 0 unless
``--fail-on-miss`` and the bookkeeping target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

TARGET = 0.01  # bookkeeping / save


def _timed(sink: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - started)
    return wrapper


def run(saves_count: int, scratch: str) -> dict[str, Any]:
    root = os.path.join(scratch, "ck")
    exec_dir = os.path.join(root, "exec", "bench")
    os.makedirs(exec_dir)
    os.environ.update({"DISPATCH_CHECKPOINT": root, "DISPATCH_EXEC_DIR": exec_dir,
                       "DISPATCH_EPOCH": "1000000", "DISPATCH_ATTEMPT": "bench",
                       "DISPATCH_RESUME_FROM": ""})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    from slurm_dispatch.execution import saves
    from slurm_dispatch.integrations import transformers as integration

    save_t: list[float] = []
    seal_t: list[float] = []  # manifest + data sync (single writer)
    sync_t: list[float] = []  # the data sync alone
    publish_t: list[float] = []
    saves.sync_save = _timed(sync_t, saves.sync_save)  # type: ignore[assignment]
    integration.seal_save = _timed(seal_t, integration.seal_save)  # type: ignore[assignment]
    integration.publish_save = _timed(publish_t, integration.publish_save)  # type: ignore
    trainer_cls = transformers.Trainer
    original_save = trainer_cls._save_checkpoint
    trainer_cls._save_checkpoint = _timed(save_t, original_save)  # type: ignore[method-assign]

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=16384,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 16384, (64, 8))]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(scratch, "unused"), max_steps=saves_count + 1, save_steps=1,
        save_only_model=True, per_device_train_batch_size=1, use_cpu=True, report_to=[],
        logging_steps=10_000, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[integration.DispatchCallback()])
    trainer.train()
    trainer_cls._save_checkpoint = original_save  # type: ignore[method-assign]
    first = os.path.join(exec_dir, "checkpoint-1")
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(first) for f in fs)
    bookkeeping_t = [seal - sync + pub for seal, sync, pub in zip(seal_t, sync_t, publish_t)]
    save, sync, publish = (statistics.median(x[1:]) for x in (save_t, sync_t, bookkeeping_t))
    return {
        "saves_timed": len(save_t) - 1, "save_bytes": size,
        "save_median_s": round(save, 4), "sync_median_s": round(sync, 4),
        "bookkeeping_median_s": round(publish, 5),
        "bookkeeping_over_save": round(publish / save, 5),
        "with_sync_over_save": round((publish + sync) / save, 4),
        "target_bookkeeping_over_save": TARGET,
        "met": publish / save < TARGET,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--fail-on-miss", action="store_true")
    opts = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-callbacks-", dir=opts.dir)
    try:
        result = run(opts.saves, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 1 if opts.fail_on_miss and not result["met"] else 0


if __name__ == "__main__":
    sys.exit(main())
