"""Save before the limit with the Hugging Face Trainer, as a real Slurm job
(docs/user-guide.md, saving before the time limit):
``dispatch-sbatch --warn-before`` with a short ``--time``; Slurm signals the job script
(``exec srun`` in examples/hf/job.sh hands it to the trainer), the callback saves at the next
step, publishes, requeues, and the requeued execution resumes from that save.  No save of the
Trainer's own comes before the limit (``save_steps`` is far off), so the one resumed from is
the one made at the signal."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.execution import saves
from tests.real.test_dispatch_sbatch import wait_executions
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: the fixture)
    _load_example,
    _published,
    _starts,
    _work,
    frameworks,
)

pytestmark = [
    pytest.mark.real,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

LIMIT_S = 120  # --time=2
WARN_S = 45  # Slurm sends it up to its 30 s check early: 45 to 75 s after the start


def test_hf_job_saves_at_the_warning_publishes_requeues_and_resumes_before_its_limit(
    sandbox: Any, frameworks: Path
) -> None:  # noqa: F811
    work = _work(sandbox, "hf")
    env = {
        "TRAIN_STEPS": "100000",
        "SAVE_EVERY": "100000",
        "SAVE_LIMIT": "0",
        "STEP_SECONDS": "0.2",
    }
    job, slurm_id = work.submit(
        "--checkpoint",
        "ck",
        "--warn-before",
        str(WARN_S),
        "--time=2",
        "-o",
        "out.txt",
        "job.sh",
        env=env,
    )
    root, output = work.path / "ck", work.path / "out.txt"
    try:
        first = wait_executions(work, job, 1)[0]
        second = wait_executions(work, job, 2, timeout=LIMIT_S + 60)[1]
        sandbox.wait_for(
            lambda: second["attempt"] in _starts(output), 120, "the requeued execution's start line"
        )
    finally:
        sandbox.run(["scancel", slurm_id], check=False)
    text = output.read_text()
    assert second["restart"] == 1 and second["submission"] == 1  # Slurm's requeue
    assert "requeued the job" in text, text
    # Its own requeue is marked, so --max-requeues does not count it.
    assert (Path(first["exec_dir"]) / ".dispatch-requeued.json").exists()
    # Requeued before the limit: the replacement started within the first one's time.
    assert second["started"] - first["started"] < LIMIT_S, (first, second)
    published = _published(root)
    source = second["resume_from"]
    assert [f.path for f in published if f.epoch == first["epoch"]] == [source]
    assert re.fullmatch(re.escape(first["exec_dir"]) + r"/checkpoint-\d+", source), source
    step = int(source.rsplit("-", 1)[1])
    assert 0 < step < 100000 and saves.why_unloadable(source, ("trainer_state.json",)) is None
    start_step, start_weights = _starts(output)[second["attempt"]]
    assert start_step == step
    example = _load_example("hf")
    model = example.tiny_model()
    from safetensors.torch import load_file

    model.load_state_dict(load_file(os.path.join(source, "model.safetensors")), strict=False)
    model.tie_weights()
    assert start_weights == example.weights_sha256(model)
