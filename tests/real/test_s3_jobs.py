"""Real Slurm jobs on the sandbox whose checkpoint root is ``s3://...`` on a SeaweedFS server
on loopback (credentials through the job's environment: dispatch-sbatch keeps the submission's).

An HF-shaped job (a shell trainer writing ``checkpoint-<N>/`` folders, weights first and
``trainer_state.json`` last, into ``$DISPATCH_STAGE_DIR``) runs under ``dispatch watch``,
which uploads each complete save under the execution's prefix and publishes it; requeued
mid-run, the replacement fetches its lineage's latest save from S3 to local disk and goes on
from it.  The Lightning example job writes ``s3://`` itself (fsspec, s3fs): at the requeue
signal it saves, publishes and requeues, and the requeued execution resumes from that URL.
The sandbox's venv gets boto3 (the ``s3`` extra) once, and s3fs with the frameworks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores import transfer
from slurm_dispatch.sandbox import network as sandbox_network
from slurm_dispatch.sandbox.layout import Layout
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real import test_frameworks as frameworks_tests
from tests.real.test_dispatch_sbatch import Workdir, printed, wait_executions, wait_state
from tests.s3server import SeaweedServer
from tests.store.conftest import point_boto3_at

pytestmark = pytest.mark.real

work = sbatch_tests.work  # the fixture: a folder of the sandbox user's, with helpers
frameworks = frameworks_tests.frameworks  # the sandbox venv with torch and the extras
BUCKET = "dispatch-jobs"

# The trainer: resumes from a local copy of $DISPATCH_RESUME_FROM (`dispatch fetch`: fetched
# from S3 with the transfer manager, checked), saves every 5 steps into $DISPATCH_LOCAL_DIR
# (the staging folder on S3), never deletes.
TRAINER = r"""#!/bin/bash
#SBATCH --ntasks=1
#SBATCH --time=00:30:00
set -euo pipefail
if [ "${1:-}" != "--train" ]; then
    exec dispatch watch --interval 0.2 -- "$0" --train
fi
echo "stage=$DISPATCH_STAGE_DIR local=$DISPATCH_LOCAL_DIR"
step=0
resume=$(dispatch fetch)
if [ -n "$resume" ]; then
    step=$(cat "$resume/weights")
    echo "resuming at step $step from $DISPATCH_RESUME_FROM, copied to $resume"
fi
while true; do
    step=$((step + 1))
    sleep 0.05
    if [ $((step % 5)) -eq 0 ]; then
        save="$DISPATCH_LOCAL_DIR/checkpoint-$step"
        mkdir "$save"
        head -c 300000 /dev/urandom > "$save/model.safetensors"
        echo "$step" > "$save/weights"
        echo "{\"global_step\": $step}" > "$save/trainer_state.json"
    fi
done
"""


@pytest.fixture(scope="module")
def s3_server(sandbox: Any) -> Iterator[SeaweedServer]:
    """SeaweedFS for the module on the sandbox's bridge address, where jobs on every node reach
    it (a node's loopback is its own), and boto3 in the sandbox's venv (once)."""
    python = Path(sandbox.venv_bin) / "python"
    if subprocess.run([str(python), "-c", "import boto3"], capture_output=True).returncode:
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "-c",
                str(frameworks_tests.CONSTRAINTS),
                "boto3>=1.35",
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    address = sandbox_network.net_of(Layout(Path(sandbox.dir))).host_address
    server = SeaweedServer(os.environ.get("DISPATCH_S3_TEST_DIR") or None, address).start()
    try:
        server.make_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SeaweedServer:
    point_boto3_at(monkeypatch, s3_server, tmp_path)
    return s3_server


def publications(root: str, exec_dir: str) -> list[store.Found]:
    return [f for f in store.list_publications(root) if f.path.startswith(exec_dir + "/")]


def stage_of(out: str, execution: int) -> Path:
    stage, local = re.findall(r"^stage=(.*) local=(.*)$", out, re.M)[execution]
    assert local == stage  # DISPATCH_LOCAL_DIR: the staging folder on an s3:// root
    return Path(stage)


def test_an_hf_shaped_job_on_s3_is_requeued_and_resumes_from_its_own_lineage(
    work: Workdir, s3: SeaweedServer
) -> None:
    sandbox = work.sandbox
    work.write("train.sh", TRAINER)
    root = f"s3://{BUCKET}/run-{uuid.uuid4().hex[:8]}"
    job, slurm_id = work.submit("--checkpoint", root, "-o", "out-%j.txt", "train.sh", env=s3.env())
    first = wait_executions(work, job, 1)[0]
    assert first["exec_dir"].startswith(f"{root}/exec/")
    sandbox.wait_for(
        lambda: len(publications(root, first["exec_dir"])) >= 2,
        90,
        "two saves uploaded and published by watch",
    )
    sandbox.run(["scontrol", "requeue", slurm_id])
    second = wait_executions(work, job, 2)[1]
    try:
        sandbox.wait_for(
            lambda: len(publications(root, second["exec_dir"])) >= 2,
            90,
            "two saves of the replacement published",
        )
    finally:
        sandbox.run(["scancel", slurm_id], check=False)
    wait_state(work, slurm_id, {"CANCELLED"})

    old = publications(root, first["exec_dir"])
    new = publications(root, second["exec_dir"])
    steps = [f.step for f in old]
    assert steps == sorted(steps) and steps == list(range(5, 5 * len(steps) + 1, 5)), (
        "each save published once, in step order, none skipped"
    )
    assert {f.epoch for f in old} == {1_000_000} and {f.epoch for f in new} == {1_000_001}
    # The replacement resumed from its lineage's latest, on S3, and went on from its step.
    assert second["resume_from"] == old[-1].path
    assert new[0].step == old[-1].step + 5
    latest = store.latest(root)
    assert latest is not None and latest.path == new[-1].path
    folder, objects = transfer.save_objects(old[-1].path, 30)
    assert folder and set(objects) == {"model.safetensors", "weights", "trainer_state.json"}
    assert objects["model.safetensors"] == 300_000

    out = printed(work.path / f"out-{slurm_id}.txt")
    name = old[-1].path.rsplit("/", 1)[-1]
    assert (
        f"resuming at step {old[-1].step} from {old[-1].path}, copied to "
        f"{stage_of(out, 1)}/resume-1/{name}"
    ) in out, out
    lines = [line for line in out.splitlines() if line.startswith("dispatch watch: published")]
    assert lines == [f"dispatch watch: published step {f.step}: {f.path}" for f in old + new]
    # Uploaded and published: each execution's older local copies are gone, its newest kept.
    for number, pubs in ((0, old), (1, new)):
        stage = stage_of(out, number)
        kept = sorted(
            p.name for p in stage.glob("checkpoint-*") if (p / "trainer_state.json").exists()
        )
        assert f"checkpoint-{pubs[-1].step}" in kept and len(kept) <= 2, kept
        assert not any(f"checkpoint-{f.step}" in kept for f in pubs[:-1])
        record = json.loads((stage / ".dispatch").read_text())
        assert record["attempt"] == (first, second)[number]["attempt"]


def test_a_lightning_job_writes_s3_itself_and_resumes_after_the_requeue_signal(
    sandbox: Any, frameworks: Path, s3: SeaweedServer, tmp_path: Path
) -> None:
    """The Lightning example job with an s3:// root: Lightning writes its saves to the
    execution's prefix (fsspec, s3fs), the callback publishes each; at the requeue signal it
    saves, publishes and requeues, and the requeued execution resumes from that URL."""
    python = Path(sandbox.venv_bin) / "python"
    if subprocess.run([str(python), "-c", "import s3fs"], capture_output=True).returncode:
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "-c",
                str(frameworks_tests.CONSTRAINTS),
                "s3fs>=2024.6",
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    work = frameworks_tests._work(sandbox, "lightning")
    root = f"s3://{BUCKET}/pl-{uuid.uuid4().hex[:8]}"
    env = {**s3.env(), "TRAIN_STEPS": "80", "SAVE_EVERY": "10", "STEP_SECONDS": "0.3"}
    job, slurm_id = work.submit("--checkpoint", root, "-o", "out.txt", "job.sh", env=env)
    output = work.path / "out.txt"
    first = wait_executions(work, job, 1)[0]
    sandbox.wait_for(
        lambda: first["attempt"] in frameworks_tests._starts(output), 180, "training to start"
    )
    sandbox.wait_for(
        lambda: publications(root, first["exec_dir"]),
        120,
        "a first save written to S3 by Lightning and published",
    )
    sandbox.run(["scancel", "--signal=USR1", slurm_id], user=sandbox.user)
    second = wait_executions(work, job, 2, timeout=120)[1]
    ends = sandbox.wait_for(
        lambda: (
            second["attempt"] in frameworks_tests._ends(output) and frameworks_tests._ends(output)
        ),
        240,
        "the requeued execution's end line",
    )
    source = second["resume_from"]
    assert second["restart"] == 1
    assert re.fullmatch(
        re.escape(first["exec_dir"]) + r"/checkpoints/requeue-step=\d+\.ckpt", source
    ), source
    step = int(source.rsplit("=", 1)[1].split(".")[0])
    starts = frameworks_tests._starts(output)
    assert starts[second["attempt"]][0] == step
    import torch

    local = transfer.fetch_save(source, str(tmp_path / "source.ckpt"), 60)
    state = torch.load(local, map_location="cpu", weights_only=False)["state_dict"]
    example = frameworks_tests._load_example("lightning")
    assert starts[second["attempt"]][1] == example.weights_sha256(state)
    assert ends[second["attempt"]] == 80
    found = store.list_publications(root)
    assert source in [f.path for f in found]
    assert all(f.path.startswith(f"{root}/exec/") and f.path.endswith(".ckpt") for f in found)
    assert [f.step for f in publications(root, second["exec_dir"])][-1] == 80
