"""``api.submit`` on the real sandbox cluster: a sweep of 20 jobs submitted from one Python
process (as the sandbox user, with the sandbox venv's interpreter) runs and publishes as jobs
``dispatch-sbatch`` submits do: the same identity, the same record, the same saves."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.real.test_dispatch_sbatch import Workdir, published_steps, wait_state, work

pytestmark = pytest.mark.real
__all__ = ["work"]  # the fixture, used by name

SWEEP = 20
TOY = {"TOY_STEPS": "10", "TOY_INTERVAL": "0.05", "TOY_SAVE_EVERY": "5"}

DRIVER = """\
import dataclasses, json, sys, time
from slurm_dispatch import api

toy = json.loads(sys.argv[2])
started = time.perf_counter()
done = [api.submit("trainer.sh", "-o", f"out-{i}.txt", "--time=5", args=[f"run{i}"],
                   checkpoint=f"sweep/lr{i}", resubmit=1, env=toy)
        for i in range(int(sys.argv[1]))]
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "jobs": [dataclasses.asdict(d) for d in done]}))
"""


def test_a_sweep_from_one_process_runs_and_publishes_like_dispatch_sbatch(work: Workdir) -> None:
    work.write("sweep.py", DRIVER, mode=0o644)
    python = str(work.sandbox.venv_bin / "python")
    started = time.monotonic()
    out = json.loads(work.run(python, "sweep.py", str(SWEEP), json.dumps(TOY)).stdout)
    one_process = time.monotonic() - started
    jobs: list[dict[str, Any]] = out["jobs"]
    assert len({j["job"] for j in jobs}) == SWEEP
    # Beside it, the same job through the command: what the sweep's jobs must match.
    cli_job, cli_slurm = work.submit(
        "--checkpoint",
        "cli",
        "-o",
        "out-cli.txt",
        "--time=5",
        "--resubmit",
        "1",
        "trainer.sh",
        "run-cli",
        env=TOY,
    )
    try:
        for j in [*jobs, {"job": cli_job, "slurm_job_id": cli_slurm}]:
            assert (
                wait_state(
                    work, j["slurm_job_id"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180
                )
                == "COMPLETED"
            ), j
        cli = work.status(cli_job)
        for i, j in enumerate(jobs):
            status = work.status(j["job"])
            assert status["checkpoint"] == j["checkpoint"] == str(work.path / "sweep" / f"lr{i}")
            (run,) = status["executions"]
            assert (run["epoch"], run["submission"]) == (j["epoch"], 1) == (1_000_000, 1)
            assert run["exec_dir"].startswith(j["checkpoint"] + "/exec/")
            assert published_steps(run["exec_dir"]) == [5, 10]
            assert set(status) == set(cli)
            assert status["resubmit_budget"] == cli["resubmit_budget"] == 1
            output = (work.path / f"out-{i}.txt").read_text()
            assert output.startswith("==> slurm-dispatch: ") and "done at step 10" in output
            assert j["record"].endswith("/" + j["job"])
        (cli_run,) = cli["executions"]
        assert published_steps(cli_run["exec_dir"]) == [5, 10]
        names = {
            work.sandbox.job_state(i).get("JobName") for i in (jobs[0]["slurm_job_id"], cli_slurm)
        }
        assert names == {"toy-trainer"}, "the job name as the script's #SBATCH line gives it"
    finally:
        work.run("scancel", *[j["slurm_job_id"] for j in jobs], cli_slurm, check=False)
    print(
        f"{SWEEP} submissions from one process: {out['seconds']:.2f} s in api.submit, "
        f"{one_process:.2f} s with the interpreter's start"
    )
