"""A torchtitan-style loop saving with torch.distributed.checkpoint (DCP), unmodified, as a
real 2-node job on the sandbox under ``dispatch watch`` (docs/user-guide.md, DCP):
``examples/dcp/job-ddp.sh`` (``-N 2 --ntasks-per-node=1``, one rank per node through srun, gloo on
the CPU).

What it asserts, in one job (the partition scenario with a DCP trainer):

* two ranks on two nodes, on gloo; every save is a DCP folder with one shard per rank;
* exactly one publication per save, each made after every file of its folder (both ranks'
  shards and the coordinator's .metadata) was written;
* rank 0's node (where watch runs) is cut off mid-run; Slurm requeues the job; the replacement
  runs on the other two nodes and resumes the save the launcher chose, the latest publication
  when it started, bit for bit (each rank's hash of every tensor equals the one its rank
  printed when that save was made), and trains to the end;
* the cut-off execution's later saves are never loaded: nothing resumes from them, and a
  publication of them, carrying the old epoch, never outranks the replacement's.

And the same loop saving in torchtitan's layout (``<dump_folder>/checkpoint/step-<N>/``, the
folder made at the first save), found by watch with no option, its ranks killed and the job
resubmitted: the replacement loads the newest published save, bit for bit.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.sandbox import cluster as sandbox_lib
from tests.real.test_dispatch_sbatch import Workdir, wait_executions
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: a fixture)
    _kill_and_resubmit,
    _published,
    _running,
    frameworks,
)

pytestmark = [
    pytest.mark.real,
    pytest.mark.usefixtures("frameworks"),  # torch in the sandbox venv
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dcp"
RANKS = 2
_LINE = re.compile(r"dcp-example: attempt=(\S+) rank=(\d+) (.*)")


def _lines(output: Path) -> list[tuple[str, int, str]]:
    text = output.read_text() if output.exists() else ""
    return [(m[1], int(m[2]), m[3]) for m in _LINE.finditer(text)]


def _said(output: Path, attempt: str, word: str) -> dict[int, list[dict[str, str]]]:
    """rank -> the key=value fields of each of the attempt's lines whose first word (or first
    field's key) is ``word``: "world" for a rank's start, "saved", "resumed", "done"."""
    out: dict[int, list[dict[str, str]]] = {}
    for who, rank, rest in _lines(output):
        if who == attempt and rest.split()[0].split("=")[0] == word:
            out.setdefault(rank, []).append(dict(f.split("=", 1) for f in rest.split() if "=" in f))
    return out


def test_a_dcp_loop_on_two_nodes_under_watch_is_published_once_per_save_and_resumes(
    sandbox: Any,
) -> None:
    home = Path(f"~{sandbox.user}").expanduser()
    path = home / "tests" / f"dcp-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    for target in (path.parent, path):
        shutil.chown(target, sandbox.user)
    for name in ("train.py", "job-ddp.sh"):
        shutil.copy(EXAMPLE / name, path / name)
        shutil.chown(path / name, sandbox.user)
    work = Workdir(sandbox, path)
    env = {"DCP_STEPS": "40", "DCP_SAVE_EVERY": "4", "DCP_INTERVAL": "0.5"}
    job, _slurm_id = work.submit("--checkpoint", "ck", "-o", "out.txt", "job-ddp.sh", env=env)
    root, output = path / "ck", path / "out.txt"
    old = wait_executions(work, job, 1)[0]
    sandbox.wait_for(
        lambda: any(f.path.startswith(old["exec_dir"] + "/") for f in _published(root)),
        180,
        "a first published save",
    )
    started = _said(output, old["attempt"], "world")
    assert sorted(started) == list(range(RANKS)), started
    assert {s[0]["backend"] for s in started.values()} == {"gloo"}
    assert len({s[0]["node"] for s in started.values()}) == RANKS  # one rank per node
    sandbox_lib.partition(old["node"], sandbox.dir)
    try:
        new = wait_executions(work, job, 2, timeout=150)[1]
        sandbox.wait_for(
            lambda: _said(output, new["attempt"], "world").keys() == set(range(RANKS)),
            150,
            "the replacement's ranks",
        )
    finally:
        sandbox_lib.heal(old["node"], sandbox.dir)
    sandbox.wait_for(
        lambda: _said(output, new["attempt"], "done").keys() == set(range(RANKS)),
        240,
        "the replacement's end",
    )
    # Watch publishes the last save in its last scans, after the ranks have exited.
    sandbox.wait_for(
        lambda: any(f.path == f"{new['exec_dir']}/step-40" for f in _published(root)),
        60,
        "the last save's publication",
    )
    assert old["node"] not in {
        s[0]["node"] for s in _said(output, new["attempt"], "world").values()
    }

    found = _published(root)
    assert len({f.path for f in found}) == len(found)  # never two publications of one save
    by_folder: dict[str, list[int]] = {}
    for f in found:
        by_folder.setdefault(str(Path(f.path).parent), []).append(f.step)
        assert sorted(p.name for p in Path(f.path).iterdir()) == [
            ".metadata",
            *(f"__{r}_0.distcp" for r in range(RANKS)),
        ], f.path
        made = (root / "pub" / f.name).stat().st_mtime_ns
        assert all(p.stat().st_mtime_ns <= made for p in Path(f.path).iterdir()), f.path
    # The replacement resumed the old execution's latest publication when it started...
    resumed = _said(output, new["attempt"], "resumed")
    assert sorted(resumed) == list(range(RANKS)), resumed
    source = resumed[0][0]["from"]
    assert {r[0]["from"] for r in resumed.values()} == {source}
    assert source.startswith(old["exec_dir"] + "/"), source
    step = int(resumed[0][0]["step"])
    assert Path(source).name == f"step-{step}"
    # ... bit for bit: each rank's tensors hash as they did when that save was made.
    saved = _said(output, old["attempt"], "saved")
    for rank in range(RANKS):
        made_hash = {int(s["step"]): s["hash"] for s in saved[rank]}
        assert resumed[rank][0]["hash"] == made_hash[step], (rank, step)
    # Every save of the replacement is published once, in order, to the end.
    assert by_folder[new["exec_dir"]] == list(range(step + 4, 41, 4))
    # The cut-off execution's later saves (published late or not) were never loaded, and
    # the latest publication is the replacement's.
    assert all(s[0]["from"] == source for s in resumed.values())
    assert found[-1].path.startswith(new["exec_dir"] + "/")
    old_steps = by_folder[old["exec_dir"]]
    assert old_steps == list(range(4, old_steps[-1] + 1, 4))


def test_a_dcp_loop_in_torchtitans_layout_killed_resumes_from_the_newest_published_save(
    sandbox: Any,
) -> None:
    """The same loop saving where torchtitan's CheckpointManager does, ``<dump_folder>/
    checkpoint/step-<N>/`` with ``--job.dump-folder "$DISPATCH_EXEC_DIR"`` (the folder made
    at the first save), under ``dispatch watch`` with no option naming it: every rank is
    killed (SIGKILL) once two saves are published, the job ends FAILED, the supervisor
    resubmits it, and the replacement's two ranks load the newest published save bit for bit
    and publish their saves past its step."""
    home = Path(f"~{sandbox.user}").expanduser()
    path = home / "tests" / f"dcp-tt-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    for target in (path.parent, path):
        shutil.chown(target, sandbox.user)
    shutil.copy(EXAMPLE / "train.py", path / "train.py")
    shutil.chown(path / "train.py", sandbox.user)
    work = Workdir(sandbox, path)
    job_text = (EXAMPLE / "job-ddp.sh").read_text()
    assert job_text.count("set -euo pipefail\n") == 1
    work.write(
        "job.sh",
        job_text.replace(
            "set -euo pipefail\n",
            'set -euo pipefail\nexport DCP_OUT="$DISPATCH_EXEC_DIR/checkpoint"  # torchtitan\'s\n',
        ),
    )
    env = {"DCP_STEPS": "100000", "DCP_SAVE_EVERY": "4", "DCP_INTERVAL": "0.3"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--resubmit", "1", "-o", "out.txt", "job.sh", env=env
    )
    root, output = path / "ck", path / "out.txt"
    try:
        old = wait_executions(work, job, 1)[0]
        sandbox.wait_for(lambda: len(_published(root)) >= 2, 240, "two published saves")
        ranks = sandbox.wait_for(
            lambda: len(_running(path, "train.py")) == RANKS and _running(path, "train.py"),
            30,
            "both ranks' pids",
        )
        published, new = _kill_and_resubmit(sandbox, work, job, slurm_id, ranks, root)
        assert all(
            re.fullmatch(re.escape(old["exec_dir"]) + r"/checkpoint/step-(\d+)", f.path)
            and f.path.endswith(f"/step-{f.step}")
            for f in published
        ), published
        newest = max(published, key=lambda f: (f.epoch, f.step))
        assert new["resume_from"] == newest.path
        resumed = sandbox.wait_for(
            lambda: (
                _said(output, new["attempt"], "resumed").keys() == set(range(RANKS))
                and _said(output, new["attempt"], "resumed")
            ),
            180,
            "both ranks' resumed lines",
        )
        saved = _said(output, old["attempt"], "saved")
        for rank in range(RANKS):
            assert resumed[rank][0]["from"] == newest.path
            assert int(resumed[rank][0]["step"]) == newest.step
            made = {int(s["step"]): s["hash"] for s in saved[rank]}
            assert resumed[rank][0]["hash"] == made[newest.step], (rank, newest.step)
        later = sandbox.wait_for(
            lambda: [f for f in _published(root) if f.path.startswith(new["exec_dir"] + "/")],
            180,
            "a save of the replacement published",
        )
        assert later[0].path == f"{new['exec_dir']}/checkpoint/step-{newest.step + 4}", later
        assert "went backwards" not in output.read_text()
    finally:
        for execution in work.status(job)["executions"]:
            sandbox.run(["scancel", str(execution["slurm_job_id"])], check=False)
