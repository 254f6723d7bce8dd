"""A shell trainer on an ``s3://`` root (docs/user-guide.md, checkpoints on S3), against a real
SeaweedFS server: ``examples/watch-trainer.sh`` run with the launcher's own environment, twice, as a
requeue runs it.  It writes its saves under ``$DISPATCH_LOCAL_DIR`` (the staging folder there),
``dispatch watch`` uploads and publishes them, and the second execution resumes from the first
one's ``s3://`` save through ``dispatch fetch``.  A staging folder goes once its execution's
command ended with 0 and everything in it is on S3; a file that is not keeps it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.control import record
from slurm_dispatch.execution import launch
from tests.s3server import SeaweedServer

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "watch-trainer.sh"


def execution(job: record.JobRecord, restart: int, stage_base: Path) -> dict[str, str]:
    return launch.identity(
        job,
        1,
        {
            **os.environ,
            "TMPDIR": str(stage_base),
            "SLURM_JOB_ID": "7",
            "SLURM_RESTART_COUNT": str(restart),
        },
    )


def train(values: dict[str, str], steps: int, extra: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **values,
        "TOY_STEPS": str(steps),
        "TOY_SAVE_EVERY": "5",
        "TOY_INTERVAL": "0.02",
        "TOY_WATCH_INTERVAL": "0.2",
    }
    script = f"{extra}exec bash {TRAINER}" if extra else f"exec bash {TRAINER}"
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=180
    )


def test_a_shell_trainer_resumes_from_s3_through_dispatch_fetch(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path
) -> None:
    job = record.create_job(
        {"generation": 0, "checkpoint": s3_root, "script": "job.sh"},
        b"#!/bin/bash\n",
        home=str(tmp_path / "home"),
    )
    base = tmp_path / "scratch"
    base.mkdir()
    first = execution(job, 0, base)
    assert first["DISPATCH_LOCAL_DIR"] == first["DISPATCH_STAGE_DIR"]
    assert (
        Path(first["DISPATCH_LOCAL_DIR"]).is_dir()
        and first["DISPATCH_EXEC_DIR"] != first["DISPATCH_LOCAL_DIR"]
    )
    done = train(first, 10)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting from scratch" in done.stdout
    urls = [f"{first['DISPATCH_EXEC_DIR']}/checkpoint-{s}" for s in (5, 10)]
    assert [f.path for f in store.list_publications(s3_root)] == urls
    # Ended with 0 and all of it on S3: the node-local folder is gone.
    assert not Path(first["DISPATCH_STAGE_DIR"]).exists(), done.stderr
    assert "removed the staging folder" in done.stderr

    second = execution(job, 1, base)
    assert second["DISPATCH_RESUME_FROM"] == urls[-1]
    # Another file the job leaves that was never uploaded: it and the folder stay.
    done = train(second, 20, extra='echo note > "$DISPATCH_LOCAL_DIR/notes.txt"; ')
    assert done.returncode == 0, done.stdout + done.stderr
    stage = Path(second["DISPATCH_STAGE_DIR"])
    assert f"resuming at step 10 from {stage}/resume-1/checkpoint-10" in done.stdout, done.stdout
    assert [
        f.step
        for f in store.list_publications(s3_root)
        if f.path.startswith(second["DISPATCH_EXEC_DIR"] + "/")
    ] == [15, 20]
    assert sorted(p.name for p in stage.iterdir()) == ["notes.txt"]
    assert f"kept the staging folder {stage}: notes.txt (not published)" in done.stderr


@pytest.mark.parametrize("status", [3])
def test_a_run_that_failed_keeps_its_staging_folder(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path, status: int
) -> None:
    job = record.create_job(
        {"generation": 0, "checkpoint": s3_root, "script": "job.sh"},
        b"#!/bin/bash\n",
        home=str(tmp_path / "home"),
    )
    base = tmp_path / "scratch"
    base.mkdir()
    first = execution(job, 0, base)
    env = {**os.environ, **first}
    done = subprocess.run(
        [
            "dispatch",
            "watch",
            "--interval",
            "0.2",
            "--",
            "bash",
            "-c",
            f'mkdir "$DISPATCH_LOCAL_DIR/checkpoint-5"; echo 5 > "$DISPATCH_LOCAL_DIR/'
            f'checkpoint-5/weights"; echo {{}} > "$DISPATCH_LOCAL_DIR/checkpoint-5/'
            f'trainer_state.json"; sleep 1; exit {status}',
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == status, done.stderr
    assert [f.step for f in store.list_publications(s3_root)] == [5]
    # Stopped early: the newest save stays for a replacement on this node.
    assert (Path(first["DISPATCH_STAGE_DIR"]) / "checkpoint-5" / "weights").is_file()
