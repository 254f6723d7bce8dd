"""The launcher's create-once execution record ``exec/<attempt>/.dispatch`` (docs/invariants.md, 9):
written before the script runs, with the execution's identity and resume source, never replaced."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.control import record
from slurm_dispatch.errors import RecordError
from slurm_dispatch.execution import launch

SEES_RECORD = """#!/usr/bin/env python3
import json, os
path = os.path.join(os.environ["DISPATCH_EXEC_DIR"], ".dispatch")
print(json.dumps(json.load(open(path))))
"""


def make_job(tmp_path: Path, script: str = "#!/bin/sh\n", generation: int = 0) -> record.JobRecord:
    spec = {"generation": generation, "checkpoint": str(tmp_path / "ck"), "script": "job.py"}
    return record.create_job(spec, script.encode(), home=str(tmp_path / "home"))


def test_identity_writes_the_record_once_with_the_resume_source(tmp_path: Path) -> None:
    job = make_job(tmp_path, generation=2)
    env = {"SLURM_RESTART_COUNT": "3", "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "41"}
    first = launch.identity(job, 5, env)
    data = launch.read_exec_record(first["DISPATCH_EXEC_DIR"])
    assert {
        k: data[k]
        for k in (
            "format",
            "job",
            "generation",
            "submission",
            "restart",
            "epoch",
            "attempt",
            "resume_from",
            "resume_publication",
            "node",
            "slurm_job_id",
        )
    } == {
        "format": 1,
        "job": job.id,
        "generation": 2,
        "submission": 5,
        "restart": 3,
        "epoch": model.Epoch(2, 5, 3).value,
        "attempt": first["DISPATCH_ATTEMPT"],
        "resume_from": None,
        "resume_publication": None,
        "node": "n7",
        "slurm_job_id": "41",
    }
    assert isinstance(data["time"], float) and isinstance(data["ns"], int)
    path = Path(first["DISPATCH_EXEC_DIR"]) / ".dispatch"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444

    save = Path(first["DISPATCH_EXEC_DIR"]) / "checkpoint-10"
    save.mkdir()
    name = store.publish(str(tmp_path / "ck"), data["epoch"], 10, str(save))
    second = launch.identity(job, 5, {**env, "SLURM_RESTART_COUNT": "4"})
    later = launch.read_exec_record(second["DISPATCH_EXEC_DIR"])
    assert (later["resume_from"], later["resume_publication"]) == (str(save), name)
    assert later["resume_from"] == second["DISPATCH_RESUME_FROM"]
    assert later["epoch"] == data["epoch"] + 1
    # Create-once: the record of an execution is never replaced.
    with pytest.raises(FileExistsError):
        launch.write_exec_record(first["DISPATCH_EXEC_DIR"], {"job": "someone else"})
    assert launch.read_exec_record(first["DISPATCH_EXEC_DIR"]) == data


def test_record_exists_before_the_script_runs(tmp_path: Path) -> None:
    job = make_job(tmp_path, SEES_RECORD)
    env = {
        **os.environ,
        "DISPATCH_HOME": str(tmp_path / "home"),
        "SLURM_JOB_ID": "9",
        "SLURMD_NODENAME": "n2",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            job.path,
            "--submission",
            "1",
            "--",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(proc.stdout.splitlines()[1])
    (started,) = [e for e in job.events() if e["event"] == "started"]
    assert (seen["attempt"], seen["epoch"], seen["node"]) == (started["attempt"], 1_000_000, "n2")


def test_a_garbled_record_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / ".dispatch").write_text('{"format": 99}\n')
    with pytest.raises(RecordError, match=str(tmp_path / ".dispatch")):
        launch.read_exec_record(str(tmp_path))
    with pytest.raises(RecordError, match="missing"):
        launch.read_exec_record(str(tmp_path / "nowhere"))
