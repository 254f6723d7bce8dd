"""SIGKILL of cleanup at random moments (docs/invariants.md, 9): after every kill the store is valid
(no save gone while its publication is there, so ``latest`` names a save that exists), and a rerun
ends exactly where an uninterrupted run does.

On a folder, 300 kills of a forked ``gc.collect`` (a real SIGKILL, no interpreter start in the
loop); on SeaweedFS, 25 kills of ``dispatch gc`` as a process.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurm_dispatch.checkpoint import gc, model

from .gc_world import World, epoch, posix_world
from .worlds import PosixRaw, S3Raw

DISPATCH = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]

KILLS = 300


def build(world: World) -> None:
    """Four executions: two older lineages (one of whose saves the live one resumed from,
    one never published), the previous one and the live one."""
    a = world.execution(epoch(1))
    pubs = [world.saved(a, epoch(1), step, 4000) for step in range(1, 9)]
    crashed = world.execution(epoch(1, 1))
    for step in range(9):
        world.put(f"exec/{crashed}/partial-{step}/w.bin", 3000)
    b = world.execution(epoch(2), resume=pubs[3])
    pubs += [world.saved(b, epoch(2), step, 4000) for step in range(10, 20)]
    c = world.execution(epoch(3), resume=pubs[-3])
    world.saved(c, epoch(3), 20)


def files(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if not p.is_dir() and "gc" not in p.relative_to(root).parts[:1]
    )


def valid(world: World) -> bool:
    return all(world.exists(model.parse_name(n).path) for n in world.names())


def test_sigkill_at_random_moments_leaves_a_valid_store_a_rerun_finishes(tmp_path: Path) -> None:
    template = posix_world(tmp_path / "template")
    build(template)
    # The kill window is the quickest of three cleanups: one timed during a burst of other
    # work (make test runs the 24.11 tier beside this) made most kills land after the end.
    times = []
    for n in range(3):
        reference = tmp_path / f"reference{n}"
        shutil.copytree(template.root, reference, symlinks=True)
        started = time.monotonic()
        gc.collect(str(reference), 2)
        times.append(time.monotonic() - started)
    took = min(times)
    expected = files(reference)
    rng = random.Random(13)
    interrupted = 0
    for i in range(KILLS):
        root = tmp_path / f"run{i % 2}"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(template.root, root, symlinks=True)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child is killed or exits at once
            try:
                os.write(ready_w, b"x")
                gc.collect(str(root), 2)
            finally:
                os._exit(0)
        os.read(ready_r, 1)  # timed from the child's start, not from the fork's
        os.close(ready_r)
        os.close(ready_w)
        time.sleep(rng.uniform(0, took))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        interrupted += os.WIFSIGNALED(status)
        world = World(PosixRaw(root))
        assert valid(world), f"kill {i}: a published save is gone"
        gc.collect(str(root), 2)
        assert files(root) == expected, f"kill {i}: the rerun did not finish the job"
        assert world.store.list_intents() == []
    # A good share of the kills landed while cleanup ran (the test means nothing otherwise):
    # half of them on a machine as quiet as when the window was timed, 107 of 300 seen with
    # other sessions' tests starting and stopping beside it (the window timed busier than the
    # kills ran), so a quarter is the floor.
    assert interrupted >= KILLS // 4, interrupted


def test_sigkill_of_dispatch_gc_on_s3(s3_env: object, s3_root: str, tmp_path: Path) -> None:
    server = s3_env
    world = World(S3Raw(s3_root, server.client()))  # type: ignore[attr-defined]
    build(world)
    rng = random.Random(31)
    for i in range(25):
        # Each round kills a run that has more to do: a fresh older execution is added.
        older = world.execution(epoch(1, 2))
        for step in range(3):
            world.saved(older, epoch(1, 2), 100 * i + step, 500)
        proc = subprocess.Popen(
            [*DISPATCH, "gc", "--keep", "2", "--root", s3_root],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.3, 1.5))  # the interpreter and boto3 take ~0.4 s to start
        proc.kill()
        proc.wait()
        assert valid(world), f"kill {i}: a published save is gone"
    gc.collect(s3_root, 2)
    assert world.store.list_intents() == []
    assert gc.collect(s3_root, 2).removals == []
    assert valid(world) and world.latest_exists()
