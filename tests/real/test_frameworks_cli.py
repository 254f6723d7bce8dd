"""Lightning's ``LightningCLI`` example as a real Slurm job:
``examples/lightning-cli/`` runs ``LightningCLI(DemoModel, BoringDataModule)`` unchanged, under
``exec dispatch watch`` with Lightning's default layout (``lightning_logs/version_0/
checkpoints/``), with ``ModelCheckpoint``'s ``dirpath`` a folder Lightning makes at its first
save (``dispatch watch --dir`` that folder, which does not exist yet when watch starts), or
with ``DispatchCallback`` added from the command line (``--trainer.callbacks+=``).  The
trainer is killed (SIGKILL) once saves are published; the job ends FAILED, the supervisor
resubmits it, and the replacement resumes, through ``--ckpt_path
"${DISPATCH_RESUME_FROM:-null}"``, from the newest whole published save and publishes steps
past it, in the same layout.  The first execution's fresh start is the ``null`` case (an empty
``--ckpt_path`` fails).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.real.conftest import ENDED_STATES
from tests.real.test_dispatch_sbatch import Workdir
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: the fixture)
    CONSTRAINTS,
    _kill_and_resubmit,
    _published,
    _running,
    frameworks,
    pytestmark,  # the real tier's mark, the frameworks' own warnings left out
)
from tests.real.test_frameworks import _work as _example

CALLBACK = "slurm_dispatch.integrations.lightning.DispatchCallback"


@pytest.fixture(scope="module")
def lightning_cli(frameworks: Path) -> Path:  # noqa: F811
    """The frameworks' venv with LightningCLI's own requirement, jsonargparse."""
    probe = [
        str(frameworks),
        "-c",
        "import lightning.pytorch.cli as c; c._JSONARGPARSE_SIGNATURES_AVAILABLE or exit(1)",
    ]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        subprocess.run(
            [
                str(frameworks),
                "-m",
                "pip",
                "install",
                "-q",
                "-c",
                str(CONSTRAINTS),
                "jsonargparse[signatures]",
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    return frameworks


def _work(sandbox: Any, route: str) -> Workdir:
    work = _example(sandbox, "lightning-cli", ("main.py", "job.sh"))
    path = work.path
    if route == "callback":
        # The Python route's twin: no watch, the callback added from the command line.
        text = (path / "job.sh").read_text()
        start = text.index("exec dispatch watch -- ")
        work.write(
            "job.sh",
            text[:start]
            + (
                'exec python3 main.py fit --trainer.default_root_dir "$DISPATCH_EXEC_DIR" '
                '--trainer.max_steps "$TRAIN_STEPS" '
                f"--trainer.callbacks+={CALLBACK} "
                "--trainer.callbacks+=ModelCheckpoint "
                '--trainer.callbacks.every_n_train_steps "$SAVE_EVERY" '
                "--trainer.callbacks.save_top_k -1 "
                '--ckpt_path "${DISPATCH_RESUME_FROM:-null}"\n'
            ),
        )
    elif route == "dirpath":
        # ModelCheckpoint(dirpath=...) makes its folder at the first save: watch --dir waits.
        text = (path / "job.sh").read_text()
        late = '"$DISPATCH_EXEC_DIR/ckpts"'
        keep = "--trainer.callbacks.save_top_k -1"
        assert text.count("exec dispatch watch -- ") == 1 and text.count(keep) == 1
        work.write(
            "job.sh",
            text.replace(
                "exec dispatch watch -- ", f"exec dispatch watch --dir {late} -- "
            ).replace(keep, f"{keep} --trainer.callbacks.dirpath {late}"),
        )
    return work


def _layout(route: str, exec_dir: str) -> str:
    """The pattern of a save's path in the route's layout."""
    folder = "ckpts" if route == "dirpath" else "lightning_logs/version_0/checkpoints"
    return re.escape(f"{exec_dir}/{folder}/") + r"epoch=\d+-step=(\d+)\.ckpt"


def _trainer_pid(work: Workdir) -> Optional[int]:
    """The pid of the trainer (python3 main.py fit) running in the work folder, not dispatch
    watch's, whose arguments hold the command too."""
    return next(iter(_running(work.path, "main.py", "fit")), None)


@pytest.mark.parametrize("route", ["watch", "dirpath", "callback"])
def test_lightning_cli_killed_resumes_from_the_newest_whole_save(
    sandbox: Any, lightning_cli: Path, route: str
) -> None:
    work = _work(sandbox, route)
    env = {"TRAIN_STEPS": "1000000", "SAVE_EVERY": "200"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--resubmit", "1", "-o", "out.txt", "job.sh", env=env
    )
    root, output = work.path / "ck", work.path / "out.txt"
    try:

        def saved_or_ended() -> str:
            if len(_published(root)) >= 2:
                return "saved"
            ended = sandbox.job_state(slurm_id).get("JobState") in ENDED_STATES
            return "ended" if ended else ""

        # A fresh start given --ckpt_path "" ends at once ('found no path for the best weights').
        got = sandbox.wait_for(saved_or_ended, 240, "two published saves")
        assert got == "saved", output.read_text() if output.exists() else "no output"
        pid = sandbox.wait_for(lambda: _trainer_pid(work), 30, "the trainer's pid")
        published, second = _kill_and_resubmit(sandbox, work, job, slurm_id, [pid], root)
        first = work.status(job)["executions"][0]
        if route != "callback":  # where Lightning put them, found by watch
            assert all(
                re.fullmatch(_layout(route, first["exec_dir"]), f.path) for f in published
            ), published
        newest = max(published, key=lambda f: (f.epoch, f.step))
        assert second["resume_from"] == newest.path
        later = sandbox.wait_for(
            lambda: [f for f in _published(root) if f.path.startswith(second["exec_dir"] + "/")],
            240,
            "a save of the replacement published",
        )
        # It resumed from that save: Lightning restored its step, so its saves go on from it.
        assert min(f.step for f in later) > newest.step, (later, newest)
        if route != "callback":
            assert all(re.fullmatch(_layout(route, second["exec_dir"]), f.path) for f in later), (
                later
            )
        text = output.read_text()
        assert f"Restoring states from the checkpoint path at {newest.path}" in text, text
        assert text.count("Restoring states from the checkpoint") == 1, text  # A's was fresh
        assert "went backwards" not in text and "at or below step" not in text, text
        assert "stopped publishing" not in text and "never appeared" not in text, text
    finally:
        for execution in work.status(job)["executions"]:
            sandbox.run(["scancel", str(execution["slurm_job_id"])], check=False)
