"""A fake Slurm controller for cessation tests: answers only what it was given, counts calls,
and fails loudly on a question it did not expect."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Union

from slurm_dispatch import config
from slurm_dispatch.node import facts
from slurm_dispatch.slurm.cli_backend import parse_squeue, slurm_time, squeue_format
from slurm_dispatch.slurm.jobs import Job, Node

from . import squeue


def slurm_clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


class FakeController:
    """Answers ``jobs`` from scontrol-style fields (one dict, a list for an array's tasks, or
    None for a job the controller does not know) and ``nodes`` from node fields."""

    def __init__(
        self,
        job: Union[dict[str, str], list[dict[str, str]], None],
        nodes: dict[str, dict[str, str]],
    ) -> None:
        self.job_fields = job
        self.node_fields = nodes
        self.calls: list[tuple[str, Any]] = []

    def jobs(self, job_id: str) -> list[Job]:
        self.calls.append(("job", job_id))
        if self.job_fields is None:
            return []
        listed = self.job_fields if isinstance(self.job_fields, list) else [self.job_fields]
        ids = {
            v
            for f in listed
            for v in (
                f.get("JobId"),
                f.get("ArrayJobId"),
                f.get("_alias"),
                f"{f.get('ArrayJobId')}_{f.get('ArrayTaskId')}",
            )
        }
        if job_id not in ids:
            raise AssertionError(f"unexpected question about job {job_id}")
        return [
            to_job(f)
            for f in listed
            if job_id
            in (
                f.get("JobId"),
                f.get("ArrayJobId"),
                f.get("_alias"),
                f"{f.get('ArrayJobId')}_{f.get('ArrayTaskId')}",
            )
        ]

    def nodes(self, names: list[str]) -> dict[str, Node]:
        self.calls.append(("nodes", list(names)))
        unknown = [n for n in names if n not in self.node_fields]
        if unknown:
            raise AssertionError(f"unexpected nodes {unknown[:5]}")
        return {
            n: Node(
                n,
                self.node_fields[n].get("State", ""),
                self.node_fields[n].get("Reason", ""),
                slurm_time(self.node_fields[n].get("BootTime")),
            )
            for n in names
        }


def to_job(fields: dict[str, str]) -> Job:
    """The adapter's view of scontrol-style fields, through the real squeue parser."""
    nonces = ("#a#", "#b#")
    argv = ["squeue", "--Format", squeue_format(nonces)]
    return parse_squeue(squeue.render(argv, [fields]), nonces, argv)[0]


def job(
    job_id: str = "100",
    state: str = "COMPLETED",
    restarts: int = 0,
    nodelist: str = "n1",
    uid: int = 1000,
    start: float = 0.0,
    end: float = 0.0,
) -> dict[str, str]:
    return {
        "JobId": job_id,
        "UserId": f"alice({uid})",
        "JobState": state,
        "Restarts": str(restarts),
        "NodeList": nodelist,
        "StartTime": slurm_clock(start) if start else "Unknown",
        "EndTime": slurm_clock(end) if end else "Unknown",
    }


def node(
    name: str, state: str = "IDLE", boot: float = 1_000_000.0, reason: str = ""
) -> dict[str, str]:
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


def record(
    state: str, kind: str, node: str, job_id: str = "100", uid: int = 1000, **body: Any
) -> str:
    return facts.write_fact(state, uid, uid, job_id, kind, node, body)


def dying_after(step_expr: str, names: tuple[str, ...]) -> str:
    """Python source that ends its process (``os._exit(3)``, as a hook's watchdog ends it)
    right after the Nth call of the ``os`` functions ``names``, N being ``step_expr``'s value:
    for programs that see a writer ended at each of its steps in turn."""
    return f"""
import os
_step, _done = {step_expr}, [0]
def _dying(call):
    def wrapper(*args, **kwargs):
        result = call(*args, **kwargs)
        _done[0] += 1
        if _done[0] == _step:
            os._exit(3)
        return result
    return wrapper
for _name in {names!r}:
    setattr(os, _name, _dying(getattr(os, _name)))
"""
