"""A fake Slurm controller for cessation tests: answers only what it was given, counts calls,
and fails loudly on a question it did not expect."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from slurm_dispatch import config, facts


def slurm_clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


class FakeController:
    def __init__(self, job: Optional[dict[str, str]], nodes: dict[str, dict[str, str]]) -> None:
        self.job_fields = job
        self.node_fields = nodes
        self.calls: list[tuple[str, Any]] = []

    def job(self, job_id: str) -> Optional[dict[str, str]]:
        self.calls.append(("job", job_id))
        if self.job_fields is not None and job_id not in (
                self.job_fields.get("JobId"), self.job_fields.get("_alias")):
            raise AssertionError(f"unexpected question about job {job_id}")
        return self.job_fields

    def nodes(self, names: list[str]) -> dict[str, dict[str, str]]:
        self.calls.append(("nodes", list(names)))
        unknown = [n for n in names if n not in self.node_fields]
        if unknown:
            raise AssertionError(f"unexpected nodes {unknown[:5]}")
        return {n: self.node_fields[n] for n in names}


def job(job_id: str = "100", state: str = "COMPLETED", restarts: int = 0,
        nodelist: str = "n1", uid: int = 1000, start: float = 0.0,
        end: float = 0.0) -> dict[str, str]:
    return {"JobId": job_id, "UserId": f"alice({uid})", "JobState": state,
            "Restarts": str(restarts), "NodeList": nodelist,
            "StartTime": slurm_clock(start) if start else "Unknown",
            "EndTime": slurm_clock(end) if end else "Unknown"}


def node(name: str, state: str = "IDLE", boot: float = 1_000_000.0,
         reason: str = "") -> dict[str, str]:
    fields = {"NodeName": name, "State": state, "BootTime": slurm_clock(boot)}
    if reason:
        fields["Reason"] = reason
    return fields


def state_dir(tmp: Path) -> tuple[str, config.Config]:
    path = tmp / "state"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    cfg = config.Config()
    cfg.state_dir = str(path)
    return str(path), cfg


def record(state: str, kind: str, node: str, job_id: str = "100", uid: int = 1000,
           **body: Any) -> str:
    return facts.write_fact(state, uid, uid, job_id, kind, node, body)
