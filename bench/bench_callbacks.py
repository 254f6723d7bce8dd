#!/usr/bin/env python3
"""Benchmark the Hugging Face integration's cost per save against a bare save, side by side.

Run ``python bench/bench_callbacks.py`` (needs the ``transformers`` extra).  A real
``transformers.Trainer`` on the CPU trains a GPT-2 built from a config whose weights are about
100 MB (``save_only_model``, so a save is the weights and the small state files) and saves every
``--every`` steps.  In one process it runs the same training bare (no callback, outside dispatch)
and with the ``DispatchCallback`` inside a dispatch execution made up in a scratch root,
alternately ``--rounds`` times, and times for each save:

* the save: ``Trainer._save_checkpoint`` (the framework's own work, written to the page cache),
  bare and with the callback;
* the stall: the callback's hooks in the training thread (``on_save``, which hands the save to
  the background publisher and waits for the one before it if still pending, ``on_step_end``,
  ``on_train_end``), i.e. what the callback adds to training;
* the sync: fsync of every file and folder of the save, now on the publisher's thread (before
  the background publisher it ran in the training thread, so the stall was at least this);
* the latency: from the end of that sync to the end of the publication.

Targets (bench/README.md, the callbacks' stall): stall / bare save <= 1% for a save of 100 MB or
more, and latency <= 50 ms.  Timings are wall-clock ``perf_counter``; each run's first save is a
warm-up and not counted.  Prints a JSON summary; exit 0 unless ``--fail-on-miss`` and a target is
missed.
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
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree this bench sits in

STALL_TARGET = 0.01  # stall / bare save
LATENCY_TARGET_S = 0.050  # end of sync -> publication
ENV = (
    "DISPATCH_CHECKPOINT",
    "DISPATCH_EXEC_DIR",
    "DISPATCH_EPOCH",
    "DISPATCH_ATTEMPT",
    "DISPATCH_RESUME_FROM",
)


def _timed(
    sink: list[float], fn: Callable[..., Any], ends: list[float] | None = None
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            now = time.perf_counter()
            sink.append(now - started)
            if ends is not None:
                ends.append(now)

    return wrapper


def _train(scratch: str, saves_count: int, every: int, callbacks: list[Any]) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=6,
        n_embd=512,
        n_head=8,
        vocab_size=16384,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 16384, (256, 8))]
    args = transformers.TrainingArguments(
        output_dir=scratch,
        max_steps=saves_count * every,
        save_steps=every,
        save_only_model=True,
        per_device_train_batch_size=1,
        use_cpu=True,
        report_to=[],
        logging_steps=10_000,
        disable_tqdm=True,
    )
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()


def run(saves_count: int, every: int, rounds: int, scratch: str) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from slurm_dispatch.execution import saves
    from slurm_dispatch.integrations import sequence
    from slurm_dispatch.integrations import transformers as integration

    cls = integration.DispatchCallback
    originals = {name: getattr(cls, name) for name in ("on_save", "on_step_end", "on_train_end")}
    trainer_cls = transformers.Trainer
    original_save = trainer_cls._save_checkpoint
    original_sync, original_publish = saves.sync_save, sequence.publish_save
    bare_t: list[float] = []
    save_t: list[float] = []
    end_wait_t: list[float] = []
    stall_t: list[float] = []  # per save: the callback's time in the training thread
    sync_t: list[float] = []
    sync_ends: list[float] = []
    publish_t: list[float] = []
    publish_ends: list[float] = []
    size = 0
    for round_ in range(rounds):
        bare: list[float] = []
        trainer_cls._save_checkpoint = _timed(bare, original_save)  # type: ignore
        for name in ENV:
            os.environ.pop(name, None)
        _train(os.path.join(scratch, f"bare-{round_}"), saves_count, every, [])
        bare_t += bare[1:]

        root = os.path.join(scratch, f"ck-{round_}")
        exec_dir = os.path.join(root, "exec", "bench")
        os.makedirs(exec_dir)
        os.environ.update(
            {
                "DISPATCH_CHECKPOINT": root,
                "DISPATCH_EXEC_DIR": exec_dir,
                "DISPATCH_EPOCH": str(1_000_000 + round_),
                "DISPATCH_ATTEMPT": "bench",
                "DISPATCH_RESUME_FROM": "",
            }
        )
        hooks: list[float] = []
        with_save: list[float] = []
        sync: list[float] = []
        ends: list[float] = []
        pub: list[float] = []
        pub_ends: list[float] = []
        trainer_cls._save_checkpoint = _timed(with_save, original_save)  # type: ignore
        for name, fn in originals.items():
            setattr(cls, name, _timed(hooks, fn))
        saves.sync_save = _timed(sync, original_sync, ends)  # type: ignore[assignment]
        sequence.publish_save = _timed(pub, original_publish, pub_ends)  # type: ignore
        _train(os.path.join(scratch, "unused"), saves_count, every, [cls()])
        for name, fn in originals.items():
            setattr(cls, name, fn)
        saves.sync_save, sequence.publish_save = original_sync, original_publish
        save_t += with_save[1:]
        # The hooks of the steps between saves belong to the save they follow; the last hook,
        # on_train_end, waits for the last save's publication once training is over (said
        # apart: no training is stalled by it).
        stall_t.append((sum(hooks) - hooks[-1]) / len(with_save))
        end_wait_t.append(hooks[-1])
        sync_t += sync[1:]
        sync_ends += ends[1:]
        publish_t += pub[1:]
        publish_ends += pub_ends[1:]
        first = os.path.join(exec_dir, f"checkpoint-{every}")
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(first) for f in fs)
    trainer_cls._save_checkpoint = original_save  # type: ignore[method-assign]
    latencies = [p - s for s, p in zip(sync_ends, publish_ends)]
    bare_s, save_s = statistics.median(bare_t), statistics.median(save_t)
    stall_s, sync_s = statistics.median(stall_t), statistics.median(sync_t)
    latency_max = max(latencies)
    return {
        "save_bytes": size,
        "saves_timed": len(save_t),
        "rounds": rounds,
        "every": every,
        "bare_save_median_s": round(bare_s, 4),
        "save_with_callback_median_s": round(save_s, 4),
        "stall_per_save_median_s": round(stall_s, 5),
        "stall_over_bare_save": round(stall_s / bare_s, 5),
        "end_of_training_wait_median_s": round(statistics.median(end_wait_t), 4),
        "sync_median_s": round(sync_s, 4),
        "sync_over_bare_save": round(sync_s / bare_s, 4),
        "latency_median_s": round(statistics.median(latencies), 5),
        "latency_max_s": round(latency_max, 5),
        "load_1m": round(os.getloadavg()[0], 1),
        "targets": {"stall_over_bare_save": STALL_TARGET, "latency_max_s": LATENCY_TARGET_S},
        "met": stall_s / bare_s <= STALL_TARGET and latency_max <= LATENCY_TARGET_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=6, help="saves per run")
    parser.add_argument("--every", type=int, default=4, help="steps between saves")
    parser.add_argument("--rounds", type=int, default=2, help="bare and callback runs each")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--fail-on-miss", action="store_true")
    opts = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-callbacks-", dir=opts.dir)
    try:
        result = run(opts.saves, opts.every, opts.rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 1 if opts.fail_on_miss and not result["met"] else 0


if __name__ == "__main__":
    sys.exit(main())
