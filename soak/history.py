"""What a soak trainer writes, for the checker: one JSON line per fact, one file per execution
per node (``<run>/history/<attempt>-<node>.jsonl``), appended and flushed as it happens.

Facts (every one has ``ev``, ``t`` (time.time()), ``attempt``, ``node``):

- ``start``: ``job``, ``task`` (or null), ``submission``, ``epoch``, ``root``, ``shared``,
  ``resumed`` (the launcher's choice, or ""), ``loaded`` (what ``dispatch fetch`` gave it,
  the lineage's fallback when the choice cannot be loaded; "" a fresh start; null on S3, where
  it is a local copy), ``chose_at`` (when the launcher chose it: the execution record's start
  time);
- ``save``: ``step``, ``path`` (a complete save, written before it is published);
- ``publishing`` / ``published``: ``step``, ``path``, ``name`` (before the call, after it returned);
- ``beat``: a heartbeat while the trainer runs (also while it is stopped from outside, it
  resumes writing when it can);
- ``end``: ``reason``.

Standard library only: the trainer runs it inside the job with the sandbox's venv.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any


class History:
    """One execution's history file on this node."""

    def __init__(self, folder: str, attempt: str) -> None:
        self.attempt = attempt
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{attempt}-{self.node}-{os.getpid()}.jsonl")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ev: str, **fields: Any) -> None:
        line = {"ev": ev, "t": time.time(), "attempt": self.attempt, "node": self.node, **fields}
        os.write(self._fd, (json.dumps(line, sort_keys=True) + "\n").encode())


def read(folder: str) -> list[dict[str, Any]]:
    """Every fact of every history file in ``folder``, in time order.  A torn last line (a
    trainer killed mid-write) is dropped; nothing else is."""
    facts: list[dict[str, Any]] = []
    if not os.path.isdir(folder):
        return facts
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            lines = f.read().split("\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                facts.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    facts.sort(key=lambda fact: fact["t"])
    return facts
