"""Lightning's own SLURM auto-requeue under ``dispatch watch`` alone, as a real Slurm job with
the real Lightning (found attacking it).

Where Lightning detects Slurm (its trainer started by ``srun``), ``SLURMEnvironment``'s
``auto_requeue``, on by default, answers SIGUSR1 (``#SBATCH --signal=USR1@90``: to srun's
tasks) by saving ``hpc_ckpt_<n>.ckpt`` into ``default_root_dir`` and running ``scontrol
requeue``.  The requeued execution has a folder of its own, where Lightning finds no
``hpc_ckpt``; watch never published that save (no step in its name), so the replacement
resumed from the older periodic save and the work in between was lost without a word.  The
test sends the signal as ``--signal=USR1@`` does (``scancel --signal=USR1``: every step, not
the batch script) once two periodic saves are published, and the replacement must resume
from the save made at the signal, published by watch at the step read from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.real.test_frameworks import (  # noqa: F401  (frameworks: the fixture)
    _published,
    frameworks,
    pytestmark,  # the real tier's mark, the frameworks' own warnings left out
)
from tests.real.test_frameworks import _work as _example
from tests.real.test_frameworks_cli import lightning_cli  # noqa: F401  (the fixture)


def test_lightnings_own_requeue_under_watch_resumes_from_its_save_at_the_signal(
    sandbox: Any, lightning_cli: Path
) -> None:  # noqa: F811
    work = _example(sandbox, "lightning-cli", ("main.py", "job.sh"))
    text = (work.path / "job.sh").read_text()
    # As Lightning's docs run it on Slurm: the trainer under srun (so it detects Slurm and
    # installs its requeue handler), the signal to srun's tasks.
    assert text.count("exec dispatch watch -- python3 ") == 1
    work.write(
        "job.sh",
        text.replace("#SBATCH --time=60", "#SBATCH --time=60\n#SBATCH --signal=USR1@30").replace(
            "exec dispatch watch -- python3 ", "exec dispatch watch -- srun python3 "
        ),
    )
    env = {"TRAIN_STEPS": "1000000", "SAVE_EVERY": "200"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--resubmit", "1", "-o", "out.txt", "job.sh", env=env
    )
    root, output = work.path / "ck", work.path / "out.txt"
    try:
        sandbox.wait_for(lambda: len(_published(root)) >= 2, 240, "two published saves")
        before = max(f.step for f in _published(root))
        sandbox.run(["scancel", "--signal=USR1", slurm_id], user=sandbox.user)
        second = sandbox.wait_for(
            lambda: next(iter(work.status(job)["executions"][1:]), None),
            180,
            "the requeued execution to start",
        )
        first = work.status(job)["executions"][0]
        said = output.read_text()
        assert "Handling auto-requeue signal" in said, said  # Lightning's own handler ran
        assert second["submission"] == 1 and second["restart"] == 1, second  # Slurm's requeue
        hpc = [f for f in _published(root) if f.path == f"{first['exec_dir']}/hpc_ckpt_1.ckpt"]
        assert hpc and hpc[0].step > before, (hpc, before, said)
        # The job's own requeue, which --max-requeues does not count (as the callbacks mark it).
        assert (Path(first["exec_dir"]) / ".dispatch-requeued.json").exists()
        newest = max((f for f in _published(root) if f.epoch == hpc[0].epoch), key=lambda f: f.step)
        assert second["resume_from"] == newest.path and newest.step >= hpc[0].step
        later = sandbox.wait_for(
            lambda: [f for f in _published(root) if f.path.startswith(second["exec_dir"] + "/")],
            240,
            "a save of the replacement published",
        )
        assert min(f.step for f in later) > newest.step, (later, newest)
        text = output.read_text()
        assert f"Restoring states from the checkpoint path at {newest.path}" in text, text
    finally:
        for execution in work.status(job)["executions"]:
            sandbox.run(["scancel", str(execution["slurm_job_id"])], check=False)
