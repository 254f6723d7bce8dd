"""The framework integrations with several ranks, as real 2-node Slurm jobs on the sandbox:
``examples/hf/job-ddp.sh`` and ``examples/lightning/job-ddp.sh`` (``-N 2
--ntasks-per-node=1``, one rank per node started by srun, DDP over ``torch.distributed`` on the
gloo backend, CPU), run as a user would submit them, with the tiny models of the examples.

What each test asserts, for the Hugging Face ``Trainer`` and for Lightning:

* the job ran as two ranks on two distinct nodes, on gloo;
* exactly one publication per save, and a publication only once every rank has written its
  part of that save: one rank is made slow to write its part (tests/real/ddp_slow_rank.py), and
  each publication is checked against every rank's part (listed in the save's manifest with its
  size, written no later than the publication);
* the node of rank 0 (the publishing rank) is partitioned mid-run; Slurm requeues the job, the
  replacement runs on the other two nodes and resumes the save the launcher chose, which is
  complete and of its own lineage: its start step and weights hash are that save's;
* the replacement trains to the intended step and publishes each of its saves once.

The sandbox's three nodes are three slurmds on one machine, each in a network namespace of its
own, so the ranks of a job meet on the first node's NodeAddr (its address on the sandbox's
bridge) and each execution picks a port free there; the sandbox's TaskProlog points gloo at the
node's link, since the machine's name, which every node shares, resolves to a node's own
loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import saves
from slurm_dispatch.sandbox import cluster as sandbox_lib
from tests.real.test_dispatch_sbatch import Workdir, wait_executions
from tests.real.test_frameworks import (  # noqa: F401  (frameworks: a fixture)
    _ends,
    _load_example,
    _published,
    _starts,
    frameworks,
)
from tests.real.test_frameworks import _work as _example_work

pytestmark = [
    pytest.mark.real,
    pytest.mark.usefixtures("frameworks"),  # torch and the extras in the venv
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
HARNESS = Path(__file__).with_name("ddp_slow_rank.py")
RANKS = 2
_RANK = re.compile(r"example: attempt=(\S+) rank=(\d+) world=(\d+) backend=(\S+) node=(\S+)")


def _work(sandbox: Any, example: str) -> Workdir:
    """The example's folder (train.py, job.sh) with its 2-node job file and the harness."""
    work = _example_work(sandbox, example)
    for source in (EXAMPLES / example / "job-ddp.sh", HARNESS):
        shutil.copy(source, work.path / source.name)
        shutil.chown(work.path / source.name, sandbox.user)
    return work


def _ranks(output: Path, attempt: str) -> dict[int, tuple[int, str, str]]:
    """Each rank of ``attempt`` as it said at its start: (world size, backend, node)."""
    text = output.read_text() if output.exists() else ""
    return {int(m[2]): (int(m[3]), m[4], m[5]) for m in _RANK.finditer(text) if m[1] == attempt}


def _assert_two_ranks_on_two_nodes(output: Path, attempt: str) -> set[str]:
    ranks = _ranks(output, attempt)
    assert sorted(ranks) == list(range(RANKS)), ranks
    assert {(world, backend) for world, backend, _node in ranks.values()} == {(RANKS, "gloo")}
    nodes = {node for _world, _backend, node in ranks.values()}
    assert len(nodes) == RANKS, ranks  # one rank per node
    return nodes


def _pub_mtime(root: Path, found: store.Found) -> int:
    return os.stat(root / store.PUB / found.name).st_mtime_ns


def _partitioned_run(
    sandbox: Any,
    example: str,
    env: dict[str, str],
) -> tuple[Workdir, dict[str, Any], dict[str, Any]]:
    """Submit the example's 2-node job, partition rank 0's node once the job has published a
    save, heal it once the replacement has started, and wait for the replacement's end."""
    work = _work(sandbox, example)
    env = {
        "TRAIN_SCRIPT": HARNESS.name,
        "SLOW_RANK": "1",
        "SLOW_RANK_SECONDS": "1",
        "PARTS_DIR": str(work.path / "parts"),
        **env,
    }
    job, _slurm_id = work.submit("--checkpoint", "ck", "-o", "out.txt", "job-ddp.sh", env=env)
    root, output = work.path / "ck", work.path / "out.txt"
    old = wait_executions(work, job, 1)[0]
    sandbox.wait_for(
        lambda: any(f.path.startswith(old["exec_dir"] + "/") for f in _published(root)),
        180,
        "a first published save",
    )
    nodes = _assert_two_ranks_on_two_nodes(output, old["attempt"])
    assert old["node"] in nodes  # the batch script, and rank 0, run on the first node
    sandbox_lib.partition(old["node"], sandbox.dir)
    try:
        new = wait_executions(work, job, 2, timeout=150)[1]
        sandbox.wait_for(
            lambda: new["attempt"] in _starts(output), 150, "the replacement's start line"
        )
    finally:
        sandbox_lib.heal(old["node"], sandbox.dir)
    sandbox.wait_for(lambda: new["attempt"] in _ends(output), 240, "the replacement's end line")
    assert old["node"] not in _assert_two_ranks_on_two_nodes(output, new["attempt"])
    return work, old, new


def _steps_by_execution(root: Path) -> dict[str, list[int]]:
    """The published steps of each execution folder, in publication order."""
    published: dict[str, list[int]] = {}
    for found in _published(root):
        folder = saves._exec_folder(str(root), found.path)
        assert folder is not None, found
        published.setdefault(folder, []).append(found.step)
    return published


def _assert_one_publication_per_save(
    root: Path,
    saved: dict[str, list[int]],
    old: dict[str, Any],
    new: dict[str, Any],
    steps: int,
    every: int,
    start: int,
) -> None:
    """Every save of the replacement is published once; the old execution's saves are
    published once each, in order, but for at most the save it was writing when cut off."""
    found = _published(root)
    assert len({f.path for f in found}) == len(found)  # never two publications of one save
    published = _steps_by_execution(root)
    assert set(published) == {old["exec_dir"], new["exec_dir"]}
    assert published[new["exec_dir"]] == list(range(start + every, steps + 1, every))
    assert saved[new["exec_dir"]] == published[new["exec_dir"]]
    old_steps = published[old["exec_dir"]]
    assert old_steps == list(range(every, old_steps[-1] + 1, every))
    assert old_steps[-1] < steps, "the old execution finished before Slurm cut it off"
    # Rank 0 alone publishes nothing (each publication waits for every rank), and the other
    # rank was killed when Slurm requeued the job: the replacement, started after that, resumed
    # the old execution's last publication.
    assert start == old_steps[-1], (start, old_steps)
    assert saved[old["exec_dir"]][: len(old_steps)] == old_steps
    assert len(saved[old["exec_dir"]]) - len(old_steps) <= 1, saved[old["exec_dir"]]


def _assert_published_after_every_part(work: Workdir) -> None:
    """Each Lightning publication comes after every rank's part of its save (the harness's
    markers) and after the checkpoint file rank 0 wrote, and promises a whole file."""
    root = work.path / "ck"
    for found in _published(root):
        assert saves.why_unloadable(found.path) is None, found
        attempt = found.path.split(f"/{store.EXEC}/", 1)[1].split("/", 1)[0]
        made = _pub_mtime(root, found)
        parts = [
            work.path / "parts" / attempt / f"{os.path.basename(found.path)}.rank{rank}"
            for rank in range(RANKS)
        ]
        for written in [Path(found.path), *parts]:
            assert written.stat().st_mtime_ns <= made, (found.path, written)


def test_hf_ddp_two_nodes_publishes_each_save_once_after_every_rank_and_resumes(
    sandbox: Any,
) -> None:
    steps, every = 40, 5
    work, old, new = _partitioned_run(
        sandbox,
        "hf",
        {
            "TRAIN_STEPS": str(steps),
            "SAVE_EVERY": str(every),
            "SAVE_LIMIT": "0",
            "STEP_SECONDS": "1",
        },
    )  # no limit: every save's publication is there to count
    root, output = work.path / "ck", work.path / "out.txt"
    rank_parts = {f"rng_state_{rank}.pth" for rank in range(RANKS)}
    # Each publication promises every rank's part: listed in the manifest with its size, on
    # disk at that size, and written before the publication was made.
    for found in _published(root):
        assert saves.why_unloadable(found.path, ("trainer_state.json",)) is None, found
        with open(saves.manifest_path(found.path), encoding="utf-8") as handle:
            listed = json.load(handle)["files"]
        assert rank_parts <= set(listed), (found.path, sorted(listed))
        made = _pub_mtime(root, found)
        for name in listed:
            written = os.stat(os.path.join(found.path, name)).st_mtime_ns
            assert written <= made, (found.path, name, written, made)
    saved = {
        folder: sorted(int(p.name.split("-")[1]) for p in Path(folder).glob("checkpoint-*"))
        for folder in (old["exec_dir"], new["exec_dir"])
    }
    start_step, start_weights = _starts(output)[new["attempt"]]
    _assert_one_publication_per_save(root, saved, old, new, steps, every, start_step)
    # The replacement resumed the save the launcher chose: the old execution's latest
    # publication when it started, complete, with exactly that save's step and weights.
    source = new["resume_from"]
    assert source.startswith(old["exec_dir"] + "/checkpoint-"), source
    assert source in {f.path for f in _published(root)}
    assert start_step == int(source.rsplit("-", 1)[1])
    assert start_weights == _load_example("hf").saved_weights_sha256(source)
    assert _ends(output)[new["attempt"]] == steps
    latest = store.latest(str(root))
    assert latest is not None and (latest.epoch, latest.step) == (new["epoch"], steps)


def test_lightning_ddp_two_nodes_publishes_each_save_once_after_every_rank_and_resumes(
    sandbox: Any,
) -> None:
    steps, every = 60, 5
    work, old, new = _partitioned_run(
        sandbox,
        "lightning",
        {
            "TRAIN_STEPS": str(steps),
            "SAVE_EVERY": str(every),
            "STEP_SECONDS": "1",
            "SAVE_TOP_K": "-1",
        },
    )  # keep every save: every publication is there to count
    root, output = work.path / "ck", work.path / "out.txt"
    _assert_published_after_every_part(work)
    step_of = re.compile(r"step=(\d+)\.ckpt")
    saved = {
        folder: sorted(
            int(m[1])
            for p in Path(folder, "checkpoints").glob("*.ckpt")
            if (m := step_of.search(p.name))
        )
        for folder in (old["exec_dir"], new["exec_dir"])
    }
    start_step, start_weights = _starts(output)[new["attempt"]]
    _assert_one_publication_per_save(root, saved, old, new, steps, every, start_step)
    source = new["resume_from"]
    assert re.fullmatch(re.escape(old["exec_dir"]) + r"/checkpoints/.*step=\d+\.ckpt", source)
    assert source in {f.path for f in _published(root)}
    step_match = step_of.search(source)
    assert step_match is not None and start_step == int(step_match[1])
    import torch

    state = torch.load(source, map_location="cpu", weights_only=False)["state_dict"]
    assert start_weights == _load_example("lightning").weights_sha256(state)
    assert _ends(output)[new["attempt"]] == steps
    latest = store.latest(str(root))
    assert latest is not None and (latest.epoch, latest.step) == (new["epoch"], steps)


def test_lightning_ddp_requeue_signal_on_two_nodes_saves_once_publishes_and_resumes(
    sandbox: Any,
) -> None:
    steps = 60
    work = _work(sandbox, "lightning")
    env = {
        "TRAIN_SCRIPT": HARNESS.name,
        "PARTS_DIR": str(work.path / "parts"),
        "TRAIN_STEPS": str(steps),
        "SAVE_EVERY": "10",
        "STEP_SECONDS": "0.3",
    }
    job, slurm_id = work.submit("--checkpoint", "ck", "-o", "out.txt", "job-ddp.sh", env=env)
    root, output = work.path / "ck", work.path / "out.txt"
    first = wait_executions(work, job, 1)[0]
    sandbox.wait_for(lambda: _published(root), 180, "a first published save")
    _assert_two_ranks_on_two_nodes(output, first["attempt"])
    # What Slurm sends --signal=USR1@T before the time limit, sent now: to every rank.
    sandbox.run(["scancel", "--signal=USR1", slurm_id], user=sandbox.user)
    second = wait_executions(work, job, 2, timeout=150)[1]
    sandbox.wait_for(
        lambda: second["attempt"] in _ends(output), 240, "the requeued execution's end line"
    )
    _assert_two_ranks_on_two_nodes(output, second["attempt"])
    assert second["restart"] == 1
    # The ranks saved together once at the signal; that save was published once, after every
    # rank's part, and the requeued execution resumed it.
    source = second["resume_from"]
    assert re.fullmatch(
        re.escape(first["exec_dir"]) + r"/checkpoints/requeue-step=\d+\.ckpt", source
    ), source
    _assert_published_after_every_part(work)
    found = _published(root)
    assert len({f.path for f in found}) == len(found)
    for execution in (first, second):  # every save of each execution published, once
        written = {str(p) for p in Path(execution["exec_dir"], "checkpoints").glob("*.ckpt")}
        assert {f.path for f in found if f.path.startswith(execution["exec_dir"] + "/")} == written
    assert not list(work.path.rglob("hpc_ckpt_*.ckpt"))  # Lightning's own handler never ran
    start_step, start_weights = _starts(output)[second["attempt"]]
    assert start_step == int(source.rsplit("=", 1)[1].split(".")[0])
    import torch

    state = torch.load(source, map_location="cpu", weights_only=False)["state_dict"]
    assert start_weights == _load_example("lightning").weights_sha256(state)
    assert _ends(output)[second["attempt"]] == steps
