"""torch.distributed.checkpoint with real ranks on the CPU (gloo, one process per rank running
tests/unit/dcp_ranks.py): one story of four executions shared by the cases, so each world
size's process group is started once.

a (4 ranks): a sync save (step 1) and an async save (step 2) overlapping three training steps.
b (2 ranks) resumes a's step 2 (4 -> 2), saves step 3, and is killed while its async save of
  step 4 persists (rank 1 blocked after writing its shard).
c (2 ranks) resumes step 3 and is killed in its sync save of step 5 at the worst moment: the
  coordinator past DCP's rename of .metadata, before the publication.
d (1 rank) resumes step 3 again (2 -> 1) and loads a's step 2 by its folder (4 -> 1).
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from slurm_dispatch.checkpoint import publish as store

from . import dcp_ranks

# Each rank is forked from a server that imported torch once (not once per rank).
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["tests.unit.dcp_ranks"])
EPOCHS = {"a": 1_000_000, "b": 1_000_001, "c": 1_000_002, "d": 1_000_003}
DEADLINE = 300.0  # seconds a launch may take on a loaded machine


@dataclass
class Run:
    lines: list[list[dict[str, Any]]]  # per rank
    exec_dir: Path
    resume: str


def _lines(out: Path, world: int) -> list[list[dict[str, Any]]]:
    found = []
    for rank in range(world):
        path = out / f"rank-{rank}.jsonl"
        text = path.read_text() if path.exists() else ""
        found.append([json.loads(line) for line in text.splitlines()])
    return found


def launch(
    root: Path,
    attempt: str,
    world: int,
    plan: list[dict[str, Any]],
    kill_when: Optional[Any] = None,
) -> Run:
    """Run the ranks of one execution (resuming as the launcher would: from the latest
    publication); with ``kill_when(out)``, SIGKILL every rank once it holds (the job killed)."""
    exec_dir = root / "exec" / attempt
    exec_dir.mkdir(parents=True)
    out = root.parent / f"out-{attempt}"
    out.mkdir()
    latest = store.latest(str(root))
    resume = latest.path if latest is not None else ""
    env = dict(
        DISPATCH_CHECKPOINT=str(root),
        DISPATCH_EXEC_DIR=str(exec_dir),
        DISPATCH_EPOCH=str(EPOCHS[attempt]),
        DISPATCH_ATTEMPT=attempt,
        DISPATCH_RESUME_FROM=resume,
    )
    procs = [
        FORKS.Process(
            target=dcp_ranks.rank_main, args=(rank, world, str(out / "store"), str(out), plan, env)
        )
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + DEADLINE
    try:
        while any(p.is_alive() for p in procs):
            if kill_when is not None and kill_when(out, world):
                for p in procs:
                    p.kill()  # SIGKILL
                for p in procs:
                    p.join()
                return Run(_lines(out, world), exec_dir, resume)
            assert time.monotonic() < deadline, f"execution {attempt} still running"
            time.sleep(0.1)  # polling the ranks' progress, not synchronising
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    errors = {
        r: (out / f"stderr-{r}").read_text()[-3000:] for r, p in enumerate(procs) if p.exitcode != 0
    }
    assert not errors, errors
    assert kill_when is None, f"execution {attempt} ended before it could be killed"
    return Run(_lines(out, world), exec_dir, resume)


def blocked_and_trained(out: Path, world: int) -> bool:
    """The blocking rank is blocked and every rank's loop trained on after async_save."""
    lines = _lines(out, world)
    return (out / "blocked").exists() and all(
        any(line["do"] == "trained" for line in rank) for rank in lines
    )


def blocked(out: Path, world: int) -> bool:
    return (out / "blocked").exists()


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("dcp") / "ck"
    root.mkdir()
    runs: dict[str, Any] = {"root": root}
    runs["a"] = launch(
        root,
        "a",
        4,
        [
            {"do": "load"},
            {"do": "save", "step": 1},
            {"do": "save", "step": 2, "async": True, "overlap": 3},
        ],
    )
    runs["a_pubs"] = store.list_publications(str(root))
    b_plan: list[dict[str, Any]] = [
        {"do": "load"},
        {"do": "save", "step": 3},
        {"do": "save", "step": 4, "async": True, "overlap": 2, "fault": "write", "fault_rank": 1},
    ]
    runs["b"] = launch(root, "b", 2, b_plan, kill_when=blocked_and_trained)
    runs["b_pubs"] = store.list_publications(str(root))
    runs["c"] = launch(
        root,
        "c",
        2,
        [{"do": "load"}, {"do": "save", "step": 5, "fault": "finish", "fault_rank": 0}],
        kill_when=blocked,
    )
    runs["c_pubs"] = store.list_publications(str(root))
    runs["d"] = launch(
        root,
        "d",
        1,
        [{"do": "load"}, {"do": "load", "checkpoint_id": str(root / "exec" / "a" / "step-2")}],
    )
    return runs


def saved(run: Run, step: int) -> dict[str, str]:
    found = [
        line["hashes"] for line in run.lines[0] if line["do"] == "saving" and line["step"] == step
    ]
    assert len(found) == 1
    return found[0]


def test_four_ranks_each_save_is_published_once_after_every_shard_and_the_metadata(
    story: dict[str, Any],
) -> None:
    a = story["a"]
    assert [(f.step, f.path) for f in story["a_pubs"]] == [
        (1, str(a.exec_dir / "step-1")),
        (2, str(a.exec_dir / "step-2")),
    ]
    for step in (1, 2):
        folder = a.exec_dir / f"step-{step}"
        shards = {f"__{rank}_0.distcp" for rank in range(4)}
        manifest = json.loads((folder / "dispatch-manifest.json").read_text())
        assert set(manifest["files"]) == shards | {".metadata"}
        assert all(manifest["files"][n] == (folder / n).stat().st_size for n in manifest["files"])
    # Every rank saw the sync save published when save returned, and the async one only after
    # its future: never while the loop trained on (rank 3's persistence waited for that).
    for rank in a.lines:
        done = {line["step"]: line["published"] for line in rank if line["do"] == "saved"}
        assert done == {1: True, 2: True}
        trained = [line for line in rank if line["do"] == "trained"]
        assert trained == [{"do": "trained", "step": 2, "published_meanwhile": [False] * 3}]
        assert rank[0] == {"do": "load", "loaded": None, "hashes": rank[0]["hashes"]}


def test_resuming_on_two_ranks_from_four_gives_the_same_values(story: dict[str, Any]) -> None:
    b = story["b"]
    assert b.resume == str(story["a"].exec_dir / "step-2")
    for rank in b.lines:
        assert rank[0]["loaded"] == b.resume
        assert rank[0]["hashes"] == saved(story["a"], 2)


def test_a_job_killed_while_its_async_save_persists_resumes_the_previous_one_bit_for_bit(
    story: dict[str, Any],
) -> None:
    b, c = story["b"], story["c"]
    assert [f.step for f in story["b_pubs"]] == [1, 2, 3]  # no publication of step 4
    assert not (b.exec_dir / "step-4" / ".metadata").exists()
    assert (b.exec_dir / "step-4" / "__0_0.distcp").exists()  # rank 0 had written its part
    assert c.resume == str(b.exec_dir / "step-3")
    for rank in c.lines:
        assert rank[0]["loaded"] == c.resume
        assert rank[0]["hashes"] == saved(b, 3)


def test_a_job_killed_past_the_metadata_rename_publishes_nothing_and_resumes_the_previous(
    story: dict[str, Any],
) -> None:
    c, d = story["c"], story["d"]
    assert (c.exec_dir / "step-5" / ".metadata").exists()  # DCP's folder looks complete
    assert [f.step for f in story["c_pubs"]] == [1, 2, 3]
    assert d.resume == str(story["b"].exec_dir / "step-3")
    assert d.lines[0][0]["loaded"] == d.resume
    assert d.lines[0][0]["hashes"] == saved(story["b"], 3)  # and 2 -> 1 ranks


def test_resuming_on_one_rank_from_four_gives_the_same_values(story: dict[str, Any]) -> None:
    d = story["d"]
    assert d.lines[0][1]["loaded"] == str(story["a"].exec_dir / "step-2")
    assert d.lines[0][1]["hashes"] == saved(story["a"], 2)


def test_process_mode_async_save_is_published_once_persisted_on_every_rank(tmp_path: Path) -> None:
    """AsyncCheckpointerType.PROCESS (torchtitan's async_with_pinned_mem): DCP persists in a
    process of its own; the save is published, once, with every rank's shard in its manifest,
    and no rank saw it published before its future was done."""
    root = tmp_path / "ck"
    root.mkdir()
    run = launch(
        root, "a", 2, [{"do": "save", "step": 1, "async": True, "mode": "process", "overlap": 2}]
    )
    assert [(f.step, f.path) for f in store.list_publications(str(root))] == [
        (1, str(run.exec_dir / "step-1"))
    ]
    manifest = json.loads((run.exec_dir / "step-1" / "dispatch-manifest.json").read_text())
    assert set(manifest["files"]) == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    for rank in run.lines:  # rank 1's persistence waited until every rank trained on
        assert [line["published"] for line in rank if line["do"] == "saved"] == [True]
        assert [line["published_meanwhile"] for line in rank if line["do"] == "trained"] == [
            [False, False]
        ]
