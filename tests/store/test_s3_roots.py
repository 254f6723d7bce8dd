"""An s3:// root where roots are accepted: dispatch-sbatch keeps it as a URL and never talks
to S3; the launcher gives the execution its S3 prefix, a local staging folder, and resumes
from the root's latest publication on the real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.schemes import SCHEMES
from slurm_dispatch.control import record, sbatch_args, submit
from slurm_dispatch.errors import UsageError
from slurm_dispatch.execution import launch

from .test_s3 import REPO


def options(checkpoint: str) -> sbatch_args.DispatchOptions:
    opts = sbatch_args.DispatchOptions()
    opts.checkpoint = checkpoint
    return opts


def test_submission_keeps_an_s3_root_as_a_url_and_makes_nothing(tmp_path: Path) -> None:
    root = submit.checkpoint_root(options("s3://bucket/runs/a/"), str(tmp_path))
    assert root == "s3://bucket/runs/a"
    assert submit.prepare_root(root) == [] and os.listdir(tmp_path) == []
    with pytest.raises(UsageError, match="'gs://bucket/x'"):
        submit.checkpoint_root(options("gs://bucket/x"), str(tmp_path))
    with pytest.raises(UsageError, match="'s3://bucket/a/../b'"):
        submit.checkpoint_root(options("s3://bucket/a/../b"), str(tmp_path))


@pytest.mark.parametrize("given", ["/scratch/run://1", "./a://b", "1a://x", "-://x"])
def test_a_root_holding_a_scheme_no_store_serves_is_refused_by_name(
    tmp_path: Path, given: str
) -> None:
    # "://" past a scheme's place (a folder's name, a word no scheme starts with) is no URL
    # of any store: refused naming the root and the stores' schemes, as before the table of
    # stores, not an assert.
    said = f"{given!r} is not an {' or '.join(row.prefix for row in SCHEMES)} URL"
    with pytest.raises(UsageError, match=re.escape(said) + "$"):
        submit.checkpoint_root(options(given), str(tmp_path))


def test_submission_never_imports_boto3() -> None:
    code = (
        "import sys\nfrom slurm_dispatch.control import submit, sbatch_args\n"
        "o = sbatch_args.DispatchOptions(); o.checkpoint = 's3://b/p'\n"
        "submit.prepare_root(submit.checkpoint_root(o, '/'))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('boto', 'botocore'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    assert out.strip() == "[]"


def test_launcher_on_an_s3_root(
    s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = {"generation": 0, "checkpoint": s3_root, "script": "job.py"}
    job = record.create_job(spec, b"#!/bin/sh\n", home=str(tmp_path / "home"))
    stage_base = tmp_path / "scratch"
    stage_base.mkdir()
    env = {**os.environ, "TMPDIR": str(stage_base), "SLURM_JOB_ID": "7"}
    first = launch.identity(job, 1, env)
    attempt = first["DISPATCH_ATTEMPT"]
    assert first["DISPATCH_EXEC_DIR"] == f"{s3_root}/exec/{attempt}"
    stage = Path(first["DISPATCH_STAGE_DIR"])
    assert stage.parent == stage_base and stage.is_dir() and attempt in stage.name
    assert launch.read_exec_record(str(stage))["attempt"] == attempt
    assert first["DISPATCH_RESUME_FROM"] == ""
    save = first["DISPATCH_EXEC_DIR"] + "/checkpoint-10"
    store.publish(s3_root, int(first["DISPATCH_EPOCH"]), 10, save)
    # A requeued execution: its own prefix and folder, resuming from the first's save.
    second = launch.identity(job, 1, {**env, "SLURM_RESTART_COUNT": "1"})
    assert second["DISPATCH_RESUME_FROM"] == save
    assert second["DISPATCH_EPOCH"] == str(model.Epoch(0, 1, 1).value)
    assert second["DISPATCH_STAGE_DIR"] != first["DISPATCH_STAGE_DIR"]
    assert not any(p.name == "exec" for p in tmp_path.rglob("*"))  # nothing local as a root
