"""Attack on a shell trainer's staging on S3: the staging folder's removal when ``dispatch watch``'s
command exits 0 must never take what is not on S3.  Its download folders (``resume-<n>/``,
``fetched/``) were removed whatever they held: a shell trainer that keeps working in the
folder it resumed from (one ``--ckpt_dir`` to load and save, as many scripts have it), or
that writes beside the copy, lost that work although nothing of it was uploaded."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from slurm_dispatch.control import record
from tests.s3server import SeaweedServer
from tests.store.test_shell_trainer_s3 import execution, train


def _resumed(s3_root: str, tmp_path: Path, script: str) -> tuple[Path, str]:
    """A first execution trains to step 10 (published on S3); a second runs ``script`` under
    dispatch watch, which exits 0: (its staging folder, watch's stderr)."""
    job = record.create_job(
        {"generation": 0, "checkpoint": s3_root, "script": "job.sh"},
        b"#!/bin/bash\n",
        home=str(tmp_path / "home"),
    )
    base = tmp_path / "scratch"
    base.mkdir()
    done = train(execution(job, 0, base), 10)
    assert done.returncode == 0, done.stdout + done.stderr
    second = execution(job, 1, base)
    done = subprocess.run(
        ["dispatch", "watch", "--interval", "0.2", "--", "bash", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, **second},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return Path(second["DISPATCH_STAGE_DIR"]), done.stderr


def test_work_written_into_a_fetched_copy_is_never_removed(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path
) -> None:
    # One folder to load from and save to, as many shell trainers have it.
    stage, err = _resumed(s3_root, tmp_path, 'ckpt=$(dispatch fetch); echo 20 > "$ckpt/step-20"')
    assert (stage / "resume-1" / "checkpoint-10" / "step-20").read_text() == "20\n", err
    assert (
        f"kept the staging folder {stage}: resume-1 (checkpoint-10/step-20 is not on S3 "
        "at its size)" in err
    )


def test_a_file_written_beside_the_copies_is_never_removed(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path
) -> None:
    stage, err = _resumed(
        s3_root,
        tmp_path,
        "dispatch fetch >/dev/null; mkdir -p "
        '"$DISPATCH_LOCAL_DIR/fetched"; echo mine > '
        '"$DISPATCH_LOCAL_DIR/fetched/results.csv"',
    )
    assert (stage / "fetched" / "results.csv").read_text() == "mine\n", err
    assert "fetched (results.csv is not a save of this root on S3)" in err
    assert not (stage / "resume-1").exists(), err  # the untouched copy went


def test_a_copy_holding_only_what_was_fetched_goes(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path
) -> None:
    stage, err = _resumed(s3_root, tmp_path, "dispatch fetch")
    assert not stage.exists(), err
    assert "removed the staging folder" in err
