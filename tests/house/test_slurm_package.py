"""slurm_dispatch.slurm imports nothing at import time, and still answers for the adapter's
documented path (``slurm_dispatch.slurm.Slurm``, what ``api.submit(slurm=...)`` takes) and for
Job and Node, each resolved from its home at first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _run(code: str) -> object:
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)


def test_the_package_imports_nothing() -> None:
    loaded = _run(
        "import json, sys\nbefore = set(sys.modules)\nimport slurm_dispatch.slurm\n"
        "print(json.dumps(sorted(m for m in set(sys.modules) - before "
        "if m.startswith('slurm_dispatch'))))"
    )
    assert loaded == ["slurm_dispatch", "slurm_dispatch.slurm"]


def test_slurm_job_and_node_resolve_from_their_homes() -> None:
    from slurm_dispatch import slurm
    from slurm_dispatch.slurm import adapter, jobs

    assert slurm.Slurm is adapter.Slurm
    assert slurm.Job is jobs.Job and slurm.Node is jobs.Node
    assert {"Slurm", "Job", "Node"} <= set(dir(slurm))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        slurm.Nope  # noqa: B018


def test_the_documented_import_loads_only_what_it_names() -> None:
    loaded = _run(
        "import json, sys\nfrom slurm_dispatch.slurm import Job\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.startswith('slurm_dispatch'))))"
    )
    assert "slurm_dispatch.slurm.adapter" not in loaded  # type: ignore[operator]
    assert "slurm_dispatch.slurm.jobs" in loaded  # type: ignore[operator]
