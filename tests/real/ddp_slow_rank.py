"""Test harness for tests/real/test_frameworks_ddp.py: an example's train.py (beside this file
in the job's folder) run with one rank slow to write its part of every save, so a publication
made before every rank has written would be seen.

* Hugging Face Trainer: every rank writes ``rng_state_<rank>.pth`` into the checkpoint folder;
  rank ``SLOW_RANK`` writes it ``SLOW_RANK_SECONDS`` late.
* Lightning under DDP: only rank 0 writes the ``.ckpt``.  As a sharded strategy's ranks would
  (FSDP, which Lightning refuses on CPU), every rank here writes a part of each save, as a
  marker file ``$PARTS_DIR/<attempt>/<checkpoint name>.rank<rank>`` outside the checkpoint
  root, in the strategy's save before Lightning's own barrier; rank ``SLOW_RANK`` is late.

Run it as the job's ``TRAIN_SCRIPT``; it then runs the example's ``main()`` unchanged.
"""

from __future__ import annotations

import os
import time
from typing import Any

import train  # the example's script, copied beside this one (the script's folder is on sys.path)

SLOW_RANK = int(os.environ.get("SLOW_RANK", "1"))
DELAY = float(os.environ.get("SLOW_RANK_SECONDS", "1"))


def _slow_hf() -> None:
    from transformers import Trainer

    original = Trainer._save_rng_state

    def save_rng_state(self: Any, output_dir: str) -> None:
        if self.args.process_index == SLOW_RANK:
            time.sleep(DELAY)
        original(self, output_dir)

    Trainer._save_rng_state = save_rng_state  # type: ignore[method-assign]


def _parts_lightning() -> None:
    from lightning.pytorch.strategies import DDPStrategy

    original = DDPStrategy.save_checkpoint
    folder = os.path.join(os.environ["PARTS_DIR"], os.environ.get("DISPATCH_ATTEMPT", "-"))
    os.makedirs(folder, exist_ok=True)

    def save_checkpoint(
        self: Any, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        original(self, checkpoint, filepath, storage_options)  # rank 0 writes the .ckpt
        if self.global_rank == SLOW_RANK:
            time.sleep(DELAY)
        part = os.path.join(
            folder, f"{os.path.basename(os.fspath(filepath))}.rank{self.global_rank}"
        )
        with open(part, "w", encoding="utf-8") as handle:
            handle.write(f"{self.global_rank}\n")
            handle.flush()
            os.fsync(handle.fileno())

    DDPStrategy.save_checkpoint = save_checkpoint  # type: ignore[method-assign]


if __name__ == "__main__":
    if hasattr(train, "Regression"):
        _parts_lightning()
    else:
        _slow_hf()
    train.main()
