"""Cleanup in real Slurm jobs on the sandbox (docs/invariants.md, 9): a trainer run under ``dispatch
watch --keep 2`` requeued several times keeps the disk bounded and resumes from its own lineage; and
``dispatch gc`` run as the job's user on a folder it cannot remove is an error that removes
nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.test_dispatch_sbatch import Workdir, wait_executions, wait_state

pytestmark = pytest.mark.real

work = sbatch_tests.work
WATCH_TRAINER = Path(__file__).resolve().parents[2] / "examples" / "watch-trainer.sh"
SAVE_BYTES = 200_000  # each save's ballast, so the disk in use is dominated by saves
REQUEUES = 3


def keep_trainer() -> str:
    """The example trainer, under `watch --keep 2`, each save carrying ballast."""
    text = WATCH_TRAINER.read_text()
    text = text.replace("exec dispatch watch --interval", "exec dispatch watch --keep 2 --interval")
    text = text.replace(
        '        echo "$step" > "$save/weights"\n',
        f'        head -c {SAVE_BYTES} /dev/zero > "$save/ballast"\n'
        '        echo "$step" > "$save/weights"\n',
    )
    assert "--keep 2" in text and "ballast" in text
    return text


def disk_bytes(root: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(root / "exec"):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass  # removed by cleanup while we walked
    return total


def test_watch_keep_bounds_the_disk_across_requeues(work: Workdir) -> None:
    sandbox = work.sandbox
    work.write("keep-trainer.sh", keep_trainer())
    # A save every 0.2 s, the watch's own interval: a loaded machine that stalls the watch
    # for a scan or two must not pile saves beyond the bound.
    long_run = {
        "TOY_STEPS": "100000",
        "TOY_INTERVAL": "0.04",
        "TOY_SAVE_EVERY": "5",
        "TOY_WATCH_INTERVAL": "0.2",
    }
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "-o", "out-%j.txt", "keep-trainer.sh", env=long_run
    )
    root = work.path / "ck"
    # Bound: the K=2 latest saves, the resume source, a save or two being written and
    # published meanwhile, an older execution's last saves until the next cleanup, records.
    bound = 8 * SAVE_BYTES
    peak = 0
    executions = []
    try:
        for n in range(REQUEUES + 1):
            execution = wait_executions(work, job, n + 1, timeout=120)[n]
            executions.append(execution)
            source = execution["resume_from"]
            start = int(source.rsplit("-", 1)[1]) if source else 0
            mine = execution["exec_dir"] + "/"

            def published_enough(start: int = start, mine: str = mine) -> bool:
                nonlocal peak
                peak = max(peak, disk_bytes(root))
                latest = store.latest(str(root))
                # Six saves of its own published (cleanup removes the older ones meanwhile).
                return (
                    latest is not None
                    and latest.path.startswith(mine)
                    and latest.step >= start + 30
                )

            sandbox.wait_for(published_enough, 90, f"execution {n} publishing six saves")
            if n < REQUEUES:
                sandbox.run(["scontrol", "requeue", slurm_id])
    finally:
        sandbox.run(["scancel", slurm_id], check=False)
    wait_state(work, slurm_id, {"CANCELLED"})
    assert peak <= bound, f"disk in use reached {peak} bytes (bound {bound})"
    # Every execution resumed from its predecessor's last publication (its own lineage).
    for before, after in zip(executions, executions[1:]):
        resumed = after["resume_from"]
        assert resumed.startswith(before["exec_dir"] + "/checkpoint-"), (resumed, before)
    last = executions[-1]
    record = json.loads((Path(last["exec_dir"]) / ".dispatch").read_text())
    assert model.parse_name(record["resume_publication"]).path == os.path.relpath(
        last["resume_from"], root
    )
    assert os.path.isdir(last["resume_from"])  # its source stays while it is the live lineage
    out = (work.path / f"out-{slurm_id}.txt").read_text()
    assert (
        f"resuming at step {last['resume_from'].rsplit('-', 1)[1]} from "
        f"{last['resume_from']}" in out
    )
    assert "dispatch watch: removed " in out
    assert "cleanup stopped" not in out
    latest = store.latest(str(root))
    assert latest is not None and latest.path.startswith(last["exec_dir"] + "/")
    assert all(os.path.exists(f.path) for f in store.list_publications(str(root)))
    # Older executions' folders are gone, but for the saves the lineage still needs.
    assert len(os.listdir(root / "exec")) <= 3


def test_gc_as_the_user_on_a_folder_it_cannot_remove_removes_nothing(work: Workdir) -> None:
    root = work.path / "ck"

    def as_user(*argv: str) -> tuple[int, str, str]:
        proc = work.run("dispatch", *argv, check=False)
        return proc.returncode, proc.stdout, proc.stderr

    # Two executions' saves, published by the user (a lineage and a stale older one).
    old = model.new_attempt()
    new = model.new_attempt()
    for attempt, epoch, steps in ((old, 1_000_000, (1, 2, 3)), (new, 2_000_000, (4, 5))):
        folder = root / "exec" / attempt
        folder.mkdir(parents=True)
        (folder / ".dispatch").write_text(
            json.dumps(
                {"format": 1, "epoch": epoch, "attempt": attempt, "resume_publication": None}
            )
        )
        for step in steps:
            (folder / f"checkpoint-{step}").mkdir()
            (folder / f"checkpoint-{step}" / "w").write_text("x")
    locked = root / "exec" / old / "checkpoint-2" / "locked"
    locked.mkdir()
    (locked / "part").write_text("y")
    for path in [root, *root.rglob("*")]:
        shutil.chown(path, work.sandbox.user)
    shutil.chown(locked, "root")  # the user cannot empty it
    os.chmod(locked, 0o755)
    for attempt, epoch, steps in ((old, 1_000_000, (1, 2, 3)), (new, 2_000_000, (4, 5))):
        for step in steps:
            code, _, err = as_user(
                "publish",
                "--root",
                str(root),
                "--epoch",
                str(epoch),
                "--step",
                str(step),
                str(root / "exec" / attempt / f"checkpoint-{step}"),
            )
            assert code == 0, err
    before = sorted(p.name for p in (root / "pub").iterdir())
    code, out, err = as_user("gc", "--root", str(root), "--keep", "1")
    assert code == 2 and out == ""
    assert f"cannot remove {str(root / 'exec' / old)!r}" in err and "locked" in err
    assert "nothing was removed" in err
    assert sorted(p.name for p in (root / "pub").iterdir()) == before
    assert (root / "exec" / old / "checkpoint-1" / "w").exists()
    assert not (root / "gc").exists() or not os.listdir(root / "gc")
    # Once the folder can be removed, gc does its work.
    shutil.chown(locked, work.sandbox.user)
    code, out, err = as_user("gc", "--root", str(root), "--keep", "1")
    assert code == 0, err
    assert not (root / "exec" / old).exists()
    assert [p.name for p in (root / "pub").iterdir()] == [before[-1]]
