"""``Trainer(max_time=...)`` with ``DispatchCallback`` as a real Slurm job, LightningCLI's
example with the real Lightning: Lightning's Timer stops ``fit`` at ``max_time`` and the job
ends COMPLETED, which is right (the Timer counts the whole run's time across executions: a
requeued execution would stop at once), but it ended with nothing said and the steps since
the last save lost.  Now the state at the stop is published and the job's output says what
happened and what to use to stop before Slurm's limit instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.real.conftest import ENDED_STATES
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: the fixture)
    _published,
    frameworks,
    pytestmark,  # the real tier's mark, the frameworks' own warnings left out
)
from tests.real.test_frameworks_cli import _work, lightning_cli  # noqa: F401  (fixture)


def test_a_stop_at_max_time_publishes_its_state_and_ends_completed_saying_so(
    sandbox: Any, lightning_cli: Path
) -> None:  # noqa: F811
    work = _work(sandbox, "callback")  # LightningCLI with DispatchCallback
    text = (work.path / "job.sh").read_text()
    limit = '--trainer.max_steps "$TRAIN_STEPS" '
    assert text.count(limit) == 1
    work.write("job.sh", text.replace(limit, f"{limit}--trainer.max_time 00:00:00:15 "))
    env = {"TRAIN_STEPS": "100000000", "SAVE_EVERY": "100000000"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--resubmit", "1", "-o", "out.txt", "job.sh", env=env
    )
    root, output = work.path / "ck", work.path / "out.txt"
    try:
        ended = sandbox.wait_for(
            lambda: (
                sandbox.job_state(slurm_id).get("JobState") in ENDED_STATES
                and sandbox.job_state(slurm_id)
            ),
            300,
            f"job {slurm_id} to end at max_time",
        )
        said = output.read_text()
        assert ended["JobState"] == "COMPLETED", (ended, said)
        first = work.status(job)["executions"][0]
        published = _published(root)
        assert [Path(f.path).name for f in published] == [
            f"max_time-step={published[0].step}.ckpt"
        ], (published, said)
        assert published[0].path.startswith(first["exec_dir"] + "/")
        assert re.search(
            r"dispatch: training stopped at max_time \(Lightning's Timer, "
            rf"0:00:15 of training counted across executions\) at step "
            rf"{published[0].step}, before max_steps",
            said,
        ), said
        assert "--warn-before" in said, said
        supervised = work.run("dispatch", "supervise", check=False)
        assert "resubmitted" not in supervised.stdout, supervised  # done, as Lightning means
    finally:
        for execution in work.status(job)["executions"]:
            sandbox.run(["scancel", str(execution["slurm_job_id"])], check=False)
