"""Hooks import only the standard library (like click's tests/test_imports.py)."""

from __future__ import annotations

import json
import subprocess
import sys

ALLOWED_OWN = {
    "slurm_dispatch",
    "slurm_dispatch._fsio",
    "slurm_dispatch.hooks",
    "slurm_dispatch.hooks.evidence",
    "slurm_dispatch.node.facts",
    "slurm_dispatch.config",
    "slurm_dispatch.errors",
    "slurm_dispatch.node.factstore",
    "slurm_dispatch.node.procscan",
    "slurm_dispatch.node.slurmconf",
    "slurm_dispatch.slurm.hostlist",
    "slurm_dispatch.node.executions",
    # only where dispatch.conf sets MetricsDir (test_metrics checks it is not else)
    "slurm_dispatch.node.metrics",
    # subpackages, whose __init__ files import nothing
    "slurm_dispatch.node",
    "slurm_dispatch.slurm",
}

PROGRAM = """
import json, sys
before = set(sys.modules)
from slurm_dispatch.hooks import run, hook_kind, evidence
from slurm_dispatch.node import metrics
from slurm_dispatch.node import facts
from slurm_dispatch import config
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_hook_entry_point_imports_only_the_standard_library() -> None:
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROGRAM], capture_output=True, text=True, check=True
    ).stdout
    new = json.loads(out)
    stdlib = set(sys.stdlib_module_names)
    foreign = [m for m in new if m.split(".")[0] not in stdlib and m not in ALLOWED_OWN]
    assert not foreign, f"hooks imported non-stdlib modules: {foreign}"
    # Heavy standard modules that would slow every job start.
    assert not {"typing", "dataclasses", "inspect", "subprocess", "click", "tenacity"} & set(new)
