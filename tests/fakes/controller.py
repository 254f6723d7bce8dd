"""The fake controller (:class:`FakeCluster`) as Slurm's commands on PATH, for tests that run
dispatch as a process (``dispatch supervise --loop``) against a controller they can take down.

Its job table lives in a JSON file, read and written under a lock by every command (and by the
test, through :class:`Controller`).  While the file says the controller is down, every command
fails as Slurm's clients do when slurmctld does not answer (exit 1, ``Socket timed out on
send/recv operation``), and counts the call.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from slurm_dispatch.slurm.result import Result

from .cluster import FakeCluster

COMMANDS = ("squeue", "sbatch", "scontrol", "scancel", "sacct")
CLUSTER = "fake"  # what every command run with Controller.env takes this cluster's name for
CONFIG = "ClusterName             = fake\nMinJobAge               = 300 sec\n"
DOWN = "slurm_load_jobs error: Socket timed out on send/recv operation"
_SCRIPT = """#!{python}
import sys
sys.path.insert(0, {repo!r})
from tests.fakes.controller import command
command({state!r})
"""


class Controller:
    """The test's side: the job table, the outage switch, the calls made."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.state = folder / "controller.json"
        self.bin = folder / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        if not self.state.exists():
            self.state.write_text(
                json.dumps({"jobs": {}, "next": 100, "down": False, "refused": 0, "calls": []})
            )
        repo = str(Path(__file__).resolve().parents[2])
        for name in COMMANDS:
            path = self.bin / name
            path.write_text(_SCRIPT.format(python=sys.executable, repo=repo, state=str(self.state)))
            path.chmod(0o755)

    @contextmanager
    def table(self) -> Iterator[dict[str, Any]]:
        with _locked(str(self.state)) as data:
            yield data

    def down(self, down: bool = True) -> None:
        with self.table() as data:
            data["down"] = down

    def set(self, jobid: str, **fields: str) -> None:
        with self.table() as data:
            data["jobs"][jobid].update(fields)

    def read(self) -> dict[str, Any]:
        return dict(json.loads(self.state.read_text()))

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        """A runner for :class:`slurm_dispatch.slurm.adapter.Slurm` in the test's own process."""
        return _answer(str(self.state), list(argv))

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose Slurm commands are this controller's."""
        return {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "SLURM_CLUSTER_NAME": CLUSTER,
            **extra,
        }


@contextmanager
def _locked(state: str) -> Iterator[dict[str, Any]]:
    with open(state + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(state, encoding="utf-8") as handle:
            data = json.load(handle)
        yield data
        tmp = f"{state}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(tmp, state)


def _answer(state: str, argv: list[str]) -> Result:
    with _locked(state) as data:
        data["calls"].append(argv)
        if data["down"]:
            data["refused"] += 1
            return Result(argv, 1, "", f"{argv[0]}: error: {DOWN}\n")
        if argv[:3] == ["scontrol", "show", "config"]:
            return Result(argv, 0, CONFIG, "")
        cluster = FakeCluster()
        cluster.jobs = data["jobs"]
        cluster.ids = itertools.count(data["next"])
        result = cluster(argv, None, None, 0.0)
        data["next"] = next(cluster.ids)
    return result


def command(state: str) -> None:
    """One Slurm command, as the process ``sys.argv`` names."""
    argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
    result = _answer(state, argv)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)
