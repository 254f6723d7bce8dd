"""The framework integrations as real Slurm jobs on the sandbox, with the real libraries on the
CPU: the Hugging Face example job partitioned mid-training (Slurm requeues it, the replacement
resumes the latest save of its own lineage while the old execution still writes), and the
Lightning example job answering the requeue signal (save at a safe point, publish, requeue,
resume).  The jobs are the files under ``examples/``, run as a user would submit them.

The sandbox venv gets torch (the CPU build on disk) and the two extras once; that install is
part of this module's time.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import tomllib

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import saves
from slurm_dispatch.sandbox import cluster as sandbox_lib
from tests.real.conftest import ENDED_STATES
from tests.real.test_dispatch_sbatch import Workdir, wait_executions

pytestmark = [
    pytest.mark.real,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk; a bare torch pulls CUDA
# The versions the test environment is installed with (pip resolves them at once; see the file).
CONSTRAINTS = REPO / "tests" / "constraints.txt"
_START = re.compile(r"example: attempt=(\S+) start step=(\d+) weights=([0-9a-f]{64})")
_END = re.compile(r"example: attempt=(\S+) end step=(\d+)")


def _extras() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["optional-dependencies"]
    return sorted({req for name in ("transformers", "lightning") for req in wanted[name]})


@pytest.fixture(scope="module")
def frameworks(sandbox: Any) -> Path:
    """The sandbox venv's python with torch, transformers and lightning (installed once)."""
    python = Path(sandbox.venv_bin) / "python"
    probe = [str(python), "-c", "import torch, transformers, lightning"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        started = time.monotonic()
        for step in ([TORCH], _extras()):
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS), *step],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        sys.stderr.write(
            f"frameworks installed into the sandbox venv in {time.monotonic() - started:.0f} s\n"
        )
    return python


def _work(sandbox: Any, example: str, names: tuple[str, ...] = ("train.py", "job.sh")) -> Workdir:
    home = Path(os.path.expanduser(f"~{sandbox.user}"))
    path = home / "tests" / f"{example}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    shutil.chown(path.parent, sandbox.user)
    shutil.chown(path, sandbox.user)
    for name in names:
        shutil.copy(EXAMPLES / example / name, path / name)
        shutil.chown(path / name, sandbox.user)
    return Workdir(sandbox, path)


def _load_example(example: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"example_{example}", EXAMPLES / example / "train.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _starts(output: Path) -> dict[str, tuple[int, str]]:
    text = output.read_text() if output.exists() else ""
    return {m[1]: (int(m[2]), m[3]) for m in _START.finditer(text)}


def _ends(output: Path) -> dict[str, int]:
    text = output.read_text() if output.exists() else ""
    return {m[1]: int(m[2]) for m in _END.finditer(text)}


def _running(path: Path, *words: str) -> list[int]:
    """The pids of the processes running in ``path`` whose arguments after the program are
    ``words`` and more (on every node: the sandbox's nodes share this machine's /proc)."""
    want = [word.encode() for word in words]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if argv[1 : 1 + len(want)] == want and cwd == str(path):
            found.append(int(entry))
    return found


def _kill_and_resubmit(
    sandbox: Any, work: Workdir, job: str, slurm_id: str, pids: list[int], root: Path
) -> tuple[list[store.Found], dict[str, Any]]:
    """SIGKILL the trainer's processes: the job must end FAILED and ``dispatch supervise``
    resubmit it.  Returns what was published once it had ended, and submission 2's execution
    once it has started."""
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    ended = sandbox.wait_for(
        lambda: (
            sandbox.job_state(slurm_id).get("JobState") in ENDED_STATES
            and sandbox.job_state(slurm_id)
        ),
        120,
        f"job {slurm_id} to end at the kill",
    )
    assert ended["JobState"] == "FAILED", ended
    published = _published(root)
    supervised = work.run("dispatch", "supervise", check=False)
    assert "resubmitted as submission 2" in supervised.stdout, supervised
    second = sandbox.wait_for(
        lambda: [e for e in work.status(job)["executions"] if e["submission"] == 2],
        90,
        "submission 2 to start",
    )[0]
    return published, second


def _published(root: Path) -> list[store.Found]:
    return store.list_publications(str(root)) if (root / "pub").exists() else []


def test_hf_job_partitioned_mid_training_resumes_its_own_lineage(
    sandbox: Any, frameworks: Path
) -> None:
    work = _work(sandbox, "hf")
    env = {"TRAIN_STEPS": "60", "SAVE_EVERY": "5", "SAVE_LIMIT": "1", "STEP_SECONDS": "1"}
    job, slurm_id = work.submit("--checkpoint", "ck", "-o", "out.txt", "job.sh", env=env)
    root, output = work.path / "ck", work.path / "out.txt"
    old = wait_executions(work, job, 1)[0]
    sandbox.wait_for(
        lambda: any(f.path.startswith(old["exec_dir"] + "/") for f in _published(root)),
        120,
        "a first published save",
    )
    sandbox_lib.partition(old["node"], sandbox.dir)
    try:
        new = wait_executions(work, job, 2, timeout=120)[1]
        starts = sandbox.wait_for(
            lambda: new["attempt"] in _starts(output) and _starts(output),
            120,
            "the replacement's start line",
        )
        late_before_heal = sandbox.wait_for(
            lambda: [
                f
                for f in _published(root)
                if f.epoch == old["epoch"] and f.step > starts[new["attempt"]][0]
            ],
            60,
            "a late save of the old execution while the replacement runs",
        )
    finally:
        sandbox_lib.heal(old["node"], sandbox.dir)
    ends = sandbox.wait_for(
        lambda: new["attempt"] in _ends(output) and _ends(output), 180, "the replacement's end line"
    )
    start_step, start_weights = starts[new["attempt"]]
    source = new["resume_from"]
    # The replacement resumed from the latest save of its lineage when it started (the old
    # execution's, published before the requeue), with exactly that save's weights.
    assert source.startswith(old["exec_dir"] + "/checkpoint-")
    assert start_step == int(source.rsplit("-", 1)[1])
    example = _load_example("hf")
    model = example.tiny_model()
    from safetensors.torch import load_file

    model.load_state_dict(load_file(os.path.join(source, "model.safetensors")), strict=False)
    model.tie_weights()
    assert start_weights == example.weights_sha256(model)
    # The old execution's late saves (lower epoch, higher step) were never resumed from.
    assert late_before_heal and all(f.step > start_step for f in late_before_heal)
    assert ends[new["attempt"]] == 60
    mine = [f.step for f in _published(root) if f.epoch == new["epoch"]]
    # save_total_limit=1 is applied by dispatch across the store after each publication
    # (docs/user-guide.md, the frameworks' settings): the replacement's older saves were published,
    # then removed, each said on stderr; one publication per save all the same.
    removed = [
        int(step)
        for step in re.findall(
            rf"dispatch: removed save exec/{new['attempt']}/checkpoint-([0-9]+) ",
            output.read_text(),
        )
    ]
    assert mine == [60]
    assert sorted(removed + mine) == list(range(start_step + 5, 61, 5))
    assert os.path.isdir(source)  # the live execution's resume source stays
    assert all(os.path.isdir(f.path) for f in _published(root))  # no name without its save
    latest = store.latest(str(root))
    assert latest is not None and (latest.epoch, latest.step) == (new["epoch"], 60)
    assert saves.why_unloadable(latest.path, ("trainer_state.json",)) is None


def test_lightning_requeue_signal_saves_publishes_requeues_and_resumes(
    sandbox: Any, frameworks: Path
) -> None:
    work = _work(sandbox, "lightning")
    env = {"TRAIN_STEPS": "80", "SAVE_EVERY": "10", "STEP_SECONDS": "0.3"}
    job, slurm_id = work.submit("--checkpoint", "ck", "-o", "out.txt", "job.sh", env=env)
    root, output = work.path / "ck", work.path / "out.txt"
    first = wait_executions(work, job, 1)[0]
    sandbox.wait_for(lambda: first["attempt"] in _starts(output), 120, "training to start")
    sandbox.wait_for(lambda: _published(root), 120, "a first published save")
    # What Slurm sends --signal=USR1@T before the time limit, sent now.
    sandbox.run(["scancel", "--signal=USR1", slurm_id], user=sandbox.user)
    second = wait_executions(work, job, 2, timeout=120)[1]
    ends = sandbox.wait_for(
        lambda: second["attempt"] in _ends(output) and _ends(output),
        180,
        "the requeued execution's end line",
    )
    starts = _starts(output)
    source = second["resume_from"]
    assert second["restart"] == 1
    assert re.fullmatch(
        re.escape(first["exec_dir"]) + r"/checkpoints/requeue-step=\d+\.ckpt", source
    ), source
    step = int(source.rsplit("=", 1)[1].split(".")[0])
    assert starts[second["attempt"]][0] == step
    import torch

    state = torch.load(source, map_location="cpu", weights_only=False)["state_dict"]
    assert starts[second["attempt"]][1] == _load_example("lightning").weights_sha256(state)
    assert ends[second["attempt"]] == 80
    assert not list(work.path.rglob("hpc_ckpt_*.ckpt"))  # Lightning's own handler never ran
    names = [f.path for f in _published(root)]
    assert len(names) == len(set(names)) and source in names


@pytest.mark.parametrize("not_requeueable", ["--no-requeue", "JobRequeue=0"])
def test_lightning_job_slurm_will_not_requeue_ends_failed_and_is_resubmitted(
    sandbox: Any, frameworks: Path, not_requeueable: str
) -> None:
    """A job Slurm will not requeue (``--no-requeue``, ``JobRequeue=0``) gets
    the requeue signal; the callback saves and publishes, ``scontrol requeue`` is refused, and
    the job must end FAILED (had it ended COMPLETED, the supervisor would stop for good): then
    the resubmit rule applies and submission 2 resumes from the save made at the signal."""
    work = _work(sandbox, "lightning")
    env = {"TRAIN_STEPS": "80", "SAVE_EVERY": "10", "STEP_SECONDS": "0.3"}
    options = ["--no-requeue"] if not_requeueable == "--no-requeue" else []
    if not options:
        sandbox_lib.set_job_requeue(False, sandbox.dir)  # jobs take it at submission
    try:
        job, slurm_id = work.submit(
            "--checkpoint", "ck", "--resubmit", "1", *options, "-o", "out.txt", "job.sh", env=env
        )
    finally:
        if not options:
            sandbox_lib.set_job_requeue(True, sandbox.dir)
    root, output = work.path / "ck", work.path / "out.txt"
    first = wait_executions(work, job, 1)[0]
    sandbox.wait_for(lambda: first["attempt"] in _starts(output), 120, "training to start")
    sandbox.wait_for(lambda: _published(root), 120, "a first published save")
    sandbox.run(["scancel", "--signal=USR1", slurm_id], user=sandbox.user)
    ended = sandbox.wait_for(
        lambda: (
            sandbox.job_state(slurm_id).get("JobState") in ENDED_STATES
            and sandbox.job_state(slurm_id)
        ),
        120,
        f"job {slurm_id} to end",
    )
    assert ended["JobState"] == "FAILED" and ended["Restarts"] == "0", ended
    assert ended["ExitCode"] != "0:0", ended
    text = output.read_text()
    assert "NotRequeued" in text and "Requested operation is presently disabled" in text, text
    saved = [f.path for f in _published(root) if "/checkpoints/requeue-step=" in f.path]
    assert len(saved) == 1 and saved[0].startswith(first["exec_dir"] + "/"), saved
    assert saves.why_unloadable(saved[0]) is None
    step = int(saved[0].rsplit("=", 1)[1].split(".")[0])
    assert _ends(output)[first["attempt"]] == step < 80  # stopped at the signal
    # The resubmit rule applies to the failure: submission 2 resumes from that save.
    supervised = work.run("dispatch", "supervise", check=False)
    assert "resubmitted as submission 2" in supervised.stdout, supervised
    second = sandbox.wait_for(
        lambda: [e for e in work.status(job)["executions"] if e["submission"] == 2],
        90,
        "submission 2 to start",
    )[0]
    assert second["resume_from"] == saved[0] and second["epoch"] == 2_000_000
    sandbox.run(["scancel", str(second["slurm_job_id"])], check=False)
