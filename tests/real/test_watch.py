"""``dispatch watch`` in real Slurm jobs on the sandbox: the example job script
(examples/watch-trainer.sh, a trainer run under watch) requeued mid-run; each execution's
complete saves published once, in step order, the replacement resuming from its own lineage.
A save is published at the second scan that finds it unchanged, so the waits below are for
publications, never for a scan."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.sandbox import cluster as sandbox_lib
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.test_dispatch_sbatch import Workdir, wait_executions, wait_state

pytestmark = pytest.mark.real

work = sbatch_tests.work  # the fixture: a folder of the sandbox user's, with helpers
WATCH_TRAINER = Path(__file__).resolve().parents[2] / "examples" / "watch-trainer.sh"


def complete_saves(exec_dir: str) -> list[int]:
    """Steps of the saves the trainer finished (trainer_state.json is written last)."""
    return sorted(
        int(name.split("-")[1])
        for name in os.listdir(exec_dir)
        if name.startswith("checkpoint-")
        and os.path.exists(os.path.join(exec_dir, name, "trainer_state.json"))
    )


def publications(root: Path, exec_dir: str) -> list[store.Found]:
    """The execution's publications in the order they were made (creation time)."""
    found = [f for f in store.list_publications(str(root)) if f.path.startswith(exec_dir + "/")]
    return sorted(found, key=lambda f: os.stat(root / "pub" / f.name).st_ctime_ns)


def test_watch_publishes_each_save_once_across_a_requeue(work: Workdir) -> None:
    sandbox = work.sandbox
    work.write("watch-trainer.sh", WATCH_TRAINER.read_text())
    long_run = {
        "TOY_STEPS": "100000",
        "TOY_INTERVAL": "0.05",
        "TOY_SAVE_EVERY": "5",
        "TOY_WATCH_INTERVAL": "0.2",
    }
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "-o", "out-%j.txt", "watch-trainer.sh", env=long_run
    )
    root = work.path / "ck"
    first = wait_executions(work, job, 1)[0]
    sandbox.wait_for(
        lambda: len(publications(root, first["exec_dir"])) >= 2, 60, "two saves published by watch"
    )
    sandbox.run(["scontrol", "requeue", slurm_id])
    second = wait_executions(work, job, 2)[1]
    try:
        sandbox.wait_for(
            lambda: len(publications(root, second["exec_dir"])) >= 2,
            60,
            "two saves of the replacement published",
        )
    finally:
        sandbox.run(["scancel", slurm_id], check=False)
    wait_state(work, slurm_id, {"CANCELLED"})

    # Every save each execution finished was published exactly once, in step order: the
    # last scans after Slurm's TERM included.  Those confirm a save at a second scan, up to
    # a second (here an interval, 0.2 s) after the first, and may still run when Slurm says
    # CANCELLED: they are waited for, not assumed done.  The first one's last save is the
    # resume source.
    for execution in (first, second):
        sandbox.wait_for(
            lambda e=execution: (
                [f.step for f in publications(root, e["exec_dir"])] == complete_saves(e["exec_dir"])
            ),
            30,
            f"watch's last scans in {execution['exec_dir']}",
        )
    old = publications(root, first["exec_dir"])
    assert [f.step for f in old] == complete_saves(first["exec_dir"])
    assert {f.epoch for f in old} == {1_000_000}
    resumed = second["resume_from"]
    assert resumed == old[-1].path, "the replacement did not resume from its lineage's latest"
    new = publications(root, second["exec_dir"])
    assert [f.step for f in new] == complete_saves(second["exec_dir"])
    assert {f.epoch for f in new} == {1_000_001}
    assert new[0].step == old[-1].step + 5, "the replacement did not start where it resumed"
    latest = store.latest(str(root))
    assert latest is not None and latest.path == new[-1].path

    out = (work.path / f"out-{slurm_id}.txt").read_text()
    assert f"resuming at step {old[-1].step} from {resumed}" in out
    for execution, pubs in ((first, old), (second, new)):
        lines = [
            line
            for line in out.splitlines()
            if line.startswith("dispatch watch: published step ")
            and execution["exec_dir"] + "/" in line
        ]
        assert lines == [f"dispatch watch: published step {f.step}: {f.path}" for f in pubs]
        record = json.loads((Path(execution["exec_dir"]) / ".dispatch").read_text())
        assert (record["attempt"], record["epoch"]) == (execution["attempt"], execution["epoch"])
    assert (
        json.loads((Path(second["exec_dir"]) / ".dispatch").read_text())["resume_from"] == resumed
    )


def test_a_partitioned_watch_keeps_publishing_its_own_lineage_harmlessly(work: Workdir) -> None:
    """The cut-off execution's watch goes on publishing its trainer's saves under its own,
    lower epoch while the replacement runs: they never outrank the replacement's, and the
    replacement resumed from what was published when it started."""
    sandbox = work.sandbox
    work.write("watch-trainer.sh", WATCH_TRAINER.read_text())
    long_run = {
        "TOY_STEPS": "100000",
        "TOY_INTERVAL": "0.05",
        "TOY_SAVE_EVERY": "5",
        "TOY_WATCH_INTERVAL": "0.2",
    }
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "-o", "out-%j.txt", "watch-trainer.sh", env=long_run
    )
    root = work.path / "ck"
    old = wait_executions(work, job, 1)[0]
    node = old["node"]
    sandbox.wait_for(lambda: publications(root, old["exec_dir"]), 60, f"a first save on {node}")
    sandbox_lib.partition(node, sandbox.dir)
    try:
        new = wait_executions(work, job, 2, timeout=150)[1]
        assert new["node"] != node and new["restart"] == 1
        sandbox.wait_for(
            lambda: len(publications(root, new["exec_dir"])) >= 2,
            60,
            "the replacement's saves published",
        )
        at_start = len(publications(root, old["exec_dir"]))
        sandbox.wait_for(
            lambda: len(publications(root, old["exec_dir"])) > at_start,
            60,
            "the cut-off execution's watch publishing again",
        )
        # The old lineage leads in steps by the replacement's start-up (its resume source was
        # the old's latest publication then), but both train at one pace on a loaded machine,
        # so the lead is watched for, not assumed at one instant: a moment where a published
        # old save is ahead in steps (read first) and the latest (read after) is still the
        # replacement's.  Every latest seen on the way must be the replacement's.
        seen: list[tuple[int, int]] = []

        def old_ahead_yet_not_latest() -> bool:
            late = publications(root, old["exec_dir"])[-1]
            latest = store.latest(str(root))
            assert latest is not None and latest.epoch == 1_000_001, latest
            assert latest.path.startswith(new["exec_dir"] + "/"), latest
            assert late.epoch == 1_000_000
            seen.append((late.step, latest.step))
            return late.step > latest.step

        try:
            sandbox.wait_for(
                old_ahead_yet_not_latest,
                60,
                "a late save of the old lineage ahead in steps yet not the latest",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; (old step, latest step) last seen: {seen[-5:]}") from None
        resumed = new["resume_from"]
        assert resumed.startswith(old["exec_dir"] + "/checkpoint-")
        first_new = publications(root, new["exec_dir"])[0]
        assert first_new.step == int(resumed.rsplit("-", 1)[1]) + 5
    finally:
        sandbox_lib.heal(node, sandbox.dir)
        sandbox.run(["scancel", slurm_id], check=False)
