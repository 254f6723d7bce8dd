"""The in-job commands' import budget: `dispatch publish`, `latest` and `list` run inside the
job, often once per save, so they load the checkpoint side and the shell only, never the
control side (records, status, submit, the supervisor) nor the Slurm adapter.

Each command runs in a subprocess as the console script runs it, under ``-X importtime``,
which names every module the process imported (as click's tests/test_imports.py checks
its own budget).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# What an in-job command may load of ours: the checkpoint protocol and its POSIX store, the
# shell that ends the command, the error tree.  Anything else is a new import to justify here.
IN_JOB_ALLOWED = {
    "slurm_dispatch",
    "slurm_dispatch.cli",
    "slurm_dispatch.cli.dispatch",
    "slurm_dispatch.cli.shell",
    "slurm_dispatch.errors",
    "slurm_dispatch.config",
    "slurm_dispatch._table",  # the table renderer: pure, imports nothing
    "slurm_dispatch.cli.options",  # every table's --json and -H: click only
    "slurm_dispatch._fsio",  # create-once writes and no-follow opens, for the POSIX store
    "slurm_dispatch.checkpoint",
    "slurm_dispatch.checkpoint.model",
    "slurm_dispatch.checkpoint.execdir",
    "slurm_dispatch.checkpoint.publish",
    # the quarantined saves `latest` passes over and `list` marks: the protocol's, stdlib
    "slurm_dispatch.checkpoint.quarantine",
    "slurm_dispatch.checkpoint.stores",
    "slurm_dispatch.checkpoint.stores.open",
    "slurm_dispatch.checkpoint.stores.base",
    "slurm_dispatch.checkpoint.stores.posix",
    # the table of stores open_store reads: stdlib, it names each store's module as a string
    "slurm_dispatch.checkpoint.stores.schemes",
}
# Never, whatever the list above grows to: the login-node side.
FORBIDDEN = (
    "slurm_dispatch.control",
    "slurm_dispatch.slurm",
    "slurm_dispatch.node",
    "slurm_dispatch.execution",
    "slurm_dispatch.sandbox",
)

ENTRY = (
    "import sys\nfrom slurm_dispatch.cli.dispatch import main\nsys.argv[0] = 'dispatch'\nmain()\n"
)


def imported(argv: list[str], env: dict[str, str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", ENTRY, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", proc.stderr, re.M)
    return {n for n in names if n == "slurm_dispatch" or n.startswith("slurm_dispatch.")}


@pytest.mark.parametrize("command", ["publish", "latest", "list", "publish --help"])
def test_in_job_commands_load_no_control_side(command: str, tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a" / "checkpoint-3"
    save.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    env.update(DISPATCH_CHECKPOINT=str(tmp_path), DISPATCH_EPOCH="1000000")
    argv = {"publish": ["publish", "--step", "3", str(save)]}.get(command, command.split())
    ours = imported(argv, env)
    assert "slurm_dispatch.checkpoint.publish" in ours  # the check sees what it should
    leaked = sorted(m for m in ours if m.startswith(FORBIDDEN))
    assert not leaked, f"dispatch {command} loaded the login-node side: {leaked}"
    extra = sorted(ours - IN_JOB_ALLOWED)
    assert not extra, (
        f"dispatch {command} loaded {extra}: import it inside the command "
        "that needs it, or add it to IN_JOB_ALLOWED with the reason"
    )
