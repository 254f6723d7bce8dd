"""A custom accelerate loop as accelerate's docs write it, as a real Slurm job:
``examples/accelerate/`` (``ProjectConfiguration(automatic_checkpoint_naming=True)``,
``register_for_checkpointing``, ``save_state()``, ``load_state(path)``) run by
``exec dispatch watch -- python3 train.py ...`` with no option: watch finds the saves where
accelerate puts them (``<project_dir>/checkpoints/checkpoint_<i>/``, made at the first save)
and publishes each once whole.  The trainer is killed (SIGKILL) once two saves are published;
the job ends FAILED, the supervisor resubmits it, and the replacement loads the newest
published save, bit for bit (its weights hash as they did when that save was made, and its
step is the save's), then publishes its own saves, whose save index starts at 0 again: watch
says that index is not a step, and ``dispatch status`` shows it as a save index.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from tests.real.test_dispatch_sbatch import Workdir
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: the fixture)
    _kill_and_resubmit,
    _published,
    _running,
    _work,
    frameworks,
    pytestmark,  # the real tier's mark, the frameworks' own warnings left out
)

_LINE = re.compile(
    r"accelerate-example: attempt=(\S+) (start|saved) step=(\d+) "
    r"(?:from|path)=(\S+) weights=([0-9a-f]{64})"
)


def _lines(output: Path, attempt: str, word: str) -> dict[str, tuple[int, str]]:
    """path -> (step, weights) of the attempt's lines saying ``word`` (start: from; saved)."""
    text = output.read_text() if output.exists() else ""
    return {
        m[4]: (int(m[3]), m[5]) for m in _LINE.finditer(text) if m[1] == attempt and m[2] == word
    }


def _trainer_pid(work: Workdir) -> Optional[int]:
    """The pid of the trainer (python3 train.py) running in the work folder, not dispatch
    watch's, whose arguments hold the command too."""
    return next(iter(_running(work.path, "train.py")), None)


def test_accelerate_loop_killed_resumes_from_the_newest_published_save(
    sandbox: Any, frameworks: Path
) -> None:  # noqa: F811
    work = _work(sandbox, "accelerate")
    env = {"TRAIN_STEPS": "1000000", "SAVE_EVERY": "20", "STEP_SECONDS": "0.02"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--resubmit", "1", "-o", "out.txt", "job.sh", env=env
    )
    root, output = work.path / "ck", work.path / "out.txt"
    try:
        first = sandbox.wait_for(lambda: work.status(job)["executions"], 90, "the first execution")[
            0
        ]
        sandbox.wait_for(lambda: len(_published(root)) >= 2, 240, "two published saves")
        pid = sandbox.wait_for(lambda: _trainer_pid(work), 30, "the trainer's pid")
        published, second = _kill_and_resubmit(sandbox, work, job, slurm_id, [pid], root)
        # Found where accelerate puts them, with no option: the save index is the step.
        pattern = re.escape(first["exec_dir"]) + r"/checkpoints/checkpoint_(\d+)"
        assert all(re.fullmatch(pattern, f.path) for f in published), published
        assert [f.step for f in published] == list(range(len(published))), published
        saved = _lines(output, first["attempt"], "saved")
        assert {f.path for f in published} <= set(saved), (published, output.read_text())
        newest = max(published, key=lambda f: (f.epoch, f.step))
        assert second["resume_from"] == newest.path
        started = sandbox.wait_for(
            lambda: _lines(output, second["attempt"], "start"), 180, "the replacement's start line"
        )
        # It loaded that save whole: the step and the weights it had when it was saved.
        assert started == {newest.path: saved[newest.path]}, (started, saved)
        later = sandbox.wait_for(
            lambda: [f for f in _published(root) if f.path.startswith(second["exec_dir"] + "/")],
            240,
            "a save of the replacement published",
        )
        assert later[0].path == f"{second['exec_dir']}/checkpoints/checkpoint_0", later
        mine = _lines(output, second["attempt"], "saved")
        assert mine[later[0].path][0] > saved[newest.path][0], (mine, saved)  # went on
        text = output.read_text()
        assert "checkpoint_0 is accelerate's save index" in text, text
        # The replacement's index 0 outranks the further-along index of the older epoch.
        latest = max(_published(root), key=lambda f: (f.epoch, f.step))
        assert latest.path.startswith(second["exec_dir"] + "/"), latest
        shown = work.run("dispatch", "status", job).stdout
        assert "save index" in shown and "step not known" in shown, shown
    finally:
        for execution in work.status(job)["executions"]:
            sandbox.run(["scancel", str(execution["slurm_job_id"])], check=False)
