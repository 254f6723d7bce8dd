"""A checkpoint root for cleanup's tests, on a folder or on SeaweedFS: executions with their
launcher records, saves of a known size, publications, and what is there afterwards.

The records are the launcher's own (``launch.write_exec_record`` on POSIX, the same bytes as
an object on S3), so the tests read what the launcher writes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.open import open_store
from slurm_dispatch.execution import launch

from .worlds import PosixRaw, Raw

BUCKET = "dispatch-tests"


def epoch(n: int, r: int = 0) -> int:
    return model.Epoch(0, n, r).value


class World:
    def __init__(self, raw: Raw) -> None:
        self.raw = raw  # the root's bytes, around the store
        self.root = raw.root
        self.store = open_store(self.root)
        self.remote = store.is_remote_root(self.root)

    # making things ----------------------------------------------------------------------

    def execution(
        self, epoch_value: int, resume: Optional[str] = None, record: bool = True, job: str = "j"
    ) -> str:
        """A new execution folder (with the launcher's record unless ``record`` is False) of
        dispatch job ``job``; ``resume`` is the publication name it resumed from."""
        attempt = model.new_attempt()
        fields: dict[str, Any] = {
            "job": job,
            "epoch": epoch_value,
            "attempt": attempt,
            "resume_from": self.locate(model.parse_name(resume).path) if resume else None,
            "resume_publication": resume,
        }
        if self.remote:
            if record:
                data = {"format": launch.EXEC_RECORD_FORMAT, **fields, "ns": time.time_ns()}
                self.store.create_exec_file(attempt, launch.EXEC_RECORD, json.dumps(data).encode())
            else:
                self.put(f"exec/{attempt}/stray.log", 3)
        else:
            folder = os.path.join(self.root, "exec", attempt)
            os.makedirs(folder)
            if record:
                launch.write_exec_record(folder, fields)
        return attempt

    def put(self, relative: str, size: int, body: bytes = b"") -> None:
        self.raw.put(relative, body or b"x" * size)

    def save(self, attempt: str, step: int, size: int = 100) -> str:
        """A folder save checkpoint-<step> of ``size`` bytes in two files; its relative path."""
        relative = f"exec/{attempt}/checkpoint-{step}"
        self.put(f"{relative}/model.bin", size - 10)
        self.put(f"{relative}/trainer_state.json", 10, b'{"step":1}')  # whole JSON: ready
        return relative

    def publish(self, epoch_value: int, step: int, relative: str) -> str:
        return store.publish(self.root, epoch_value, step, self.locate(relative))

    def lightning_saved(
        self,
        attempt: str,
        epoch_value: int,
        steps: tuple[int, ...],
        name: str = "epoch={step}.ckpt",
    ) -> None:
        """Lightning's file saves in the execution's checkpoints/, 30 bytes each, published."""
        for step in steps:
            relative = f"exec/{attempt}/checkpoints/{name.format(step=step)}"
            self.put(relative, 30)
            self.publish(epoch_value, step, relative)

    def saved(self, attempt: str, epoch_value: int, step: int, size: int = 100) -> str:
        """A save written and published; its publication's name."""
        return self.publish(epoch_value, step, self.save(attempt, step, size))

    # looking --------------------------------------------------------------------------

    def locate(self, relative: str) -> str:
        return self.store.locate(relative)

    def names(self) -> list[str]:
        return sorted(self.store.publication_names())

    def exists(self, relative: str) -> bool:
        return self.raw.exists(relative)

    def folders(self) -> set[str]:
        # SeaweedFS may still list a "folder" whose objects are gone: only what holds keys.
        return {a for a in self.store.list_exec() if self.exists(f"exec/{a}")}

    def every_published_save_exists(self) -> bool:
        return all(self.exists(model.parse_name(n).path) for n in self.names())

    def latest_exists(self) -> bool:
        found = self.store.latest()
        return found is None or self.exists(model.parse_name(found.name).path)


def posix_world(tmp_path: Path) -> World:
    return World(PosixRaw(tmp_path / "root"))
