"""A TERM before the time limit with the real Lightning, as a real Slurm job:
``#SBATCH --signal=B:TERM@150`` sends TERM to the batch script well before its limit; Lightning
turns it into ``SystemExit`` with no code, so the job ended COMPLETED with its training
unfinished and the supervisor stopped for good.  The test sends that TERM itself, as Slurm does
(``scancel --batch --signal=TERM``, to the batch script alone), once training has published a
save (Slurm sends ``--signal`` up to 60 s early: here, before Lightning had started).  Under
``exec dispatch watch`` (a trainer without the callback, its saves in the execution's folder)
and with ``DispatchCallback`` (the trainer is the batch script), the job now ends FAILED with
143, and the resubmit rule runs submission 2 from the newest published save.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.real.conftest import ENDED_STATES
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: the fixture)
    _published,
    _work,
    frameworks,
    pytestmark,  # the real tier's mark, the frameworks' own warnings left out
)

JOB = """#!/bin/bash
#SBATCH --time=10
exec {run}
"""


@pytest.mark.parametrize("route", ["watch", "callback"])
def test_lightning_stopped_by_term_before_its_limit_ends_failed_and_is_resubmitted(
    sandbox: Any, frameworks: Path, route: str
) -> None:  # noqa: F811
    work = _work(sandbox, "lightning")
    if route == "watch":
        # The trainer as a user of watch writes it: no callback, its saves in the execution's
        # folder (Lightning's default dirpath under default_root_dir).
        text = (work.path / "train.py").read_text()
        plain = text.replace("                   DispatchCallback()])", "                   ])")
        plain = plain.replace(
            "logger=False,", "logger=False, default_root_dir=os.environ['DISPATCH_EXEC_DIR'],"
        )
        assert plain.count("DispatchCallback()") == 0 and "default_root_dir" in plain
        work.write("train.py", plain, mode=0o644)
        run = "dispatch watch --interval 0.5 -- python3 train.py"
    else:
        run = "python3 train.py"
    work.write("job.sh", JOB.format(run=run))
    env = {"TRAIN_STEPS": "100000", "SAVE_EVERY": "10", "STEP_SECONDS": "0.2", "SAVE_TOP_K": "-1"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--resubmit", "1", "-o", "out.txt", "job.sh", env=env
    )
    root, output = work.path / "ck", work.path / "out.txt"
    try:
        sandbox.wait_for(lambda: _published(root), 180, "a first published save")
        sandbox.run(["scancel", "--batch", "--signal=TERM", slurm_id], user=sandbox.user)
        ended = sandbox.wait_for(
            lambda: (
                sandbox.job_state(slurm_id).get("JobState") in ENDED_STATES
                and sandbox.job_state(slurm_id)
            ),
            200,
            f"job {slurm_id} to end at the TERM",
        )
        text = output.read_text()
        assert ended["JobState"] == "FAILED" and ended["ExitCode"] == "143:0", (ended, text)
        said = (
            "the command exited 0 after watch forwarded it TERM"
            if route == "watch"
            else "the trainer stopped at SIGTERM with status 0"
        )
        assert said in text, text
        published = _published(root)
        assert published, text
        supervised = work.run("dispatch", "supervise", check=False)
        assert "resubmitted as submission 2" in supervised.stdout, supervised
        second = sandbox.wait_for(
            lambda: [e for e in work.status(job)["executions"] if e["submission"] == 2],
            90,
            "submission 2 to start",
        )[0]
        newest = max(_published(root), key=lambda f: (f.epoch, f.step))
        assert second["resume_from"] == newest.path
    finally:
        for execution in work.status(job)["executions"]:
            sandbox.run(["scancel", str(execution["slurm_job_id"])], check=False)
