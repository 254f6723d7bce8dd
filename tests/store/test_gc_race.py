"""Cleanup racing everything else (docs/invariants.md, 9), on a folder and on SeaweedFS, in real
processes:

* gc in a loop (--keep 2);
* an old execution that keeps publishing under its own, lower epoch;
* the live lineage publishing;
* new executions starting one after another through the launcher's own ``identity`` (each
  a higher epoch), each loading its resume source, then publishing as the new live lineage.

Checked all along: every execution loads the save its launcher chose, whole (each save holds
its own publication's epoch and step); a save is never gone while its publication is still
there, so ``latest`` never names a save that does not exist.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from slurm_dispatch.checkpoint import gc, model
from slurm_dispatch.checkpoint.stores.open import open_store
from slurm_dispatch.control import record
from slurm_dispatch.execution import launch

from .gc_world import World, epoch
from .worlds import raw_of

RUN_SECONDS = 8.0
# A publisher saves as fast as it can, but at most this many saves past the last cleanup it
# saw end: on a slow store on loaded cores (Azurite beside make test's real tiers) publishing
# outran cleanup, each cleanup had more to remove than the last, and the bound ran out.
AHEAD = 40


def _write_save(world: World, attempt: str, epoch_value: int, step: int) -> str:
    relative = f"exec/{attempt}/checkpoint-{step}"
    marker = json.dumps({"epoch": epoch_value, "step": step}).encode()
    world.put(f"{relative}/model.bin", 0, marker * 20)
    world.put(f"{relative}/trainer_state.json", 0, marker)
    return relative


def _read(world: World, relative: str, name: str) -> bytes | None:
    return world.raw.read(f"{relative}/{name}")


def _world(root: str) -> World:
    return World(raw_of(root))


def publisher(root: str, epoch_value: int, attempt: str, stop: Any, first: int, runs: Any) -> None:
    """An execution that keeps saving and publishing in its folder (an old one, or live), at
    most AHEAD saves past the last cleanup."""
    world = _world(root)
    step = first
    seen, made = runs.value, 0
    while not stop.is_set():
        if runs.value != seen:
            seen, made = runs.value, 0
        elif made >= AHEAD:
            stop.wait(0.05)
            continue
        made += 1
        step += 1
        try:
            world.publish(epoch_value, step, _write_save(world, attempt, epoch_value, step))
        except Exception:  # noqa: BLE001 - cleanup removed its folder: it is superseded
            pass


def cleaner(root: str, stop: Any, runs: Any) -> None:
    while not stop.is_set():
        gc.collect(root, 2)
        runs.value += 1


def starter(root: str, home: str, stop: Any, failures: Any, starts: Any) -> None:
    """New executions, each through the launcher: it loads its source, then publishes."""
    world = _world(root)
    job = record.create_job(
        {"generation": 0, "checkpoint": root, "script": "job.py"}, b"#!/bin/sh\n", home=home
    )
    submission = 1
    while not stop.is_set():
        submission += 1
        env = {**os.environ, "TMPDIR": home, "SLURM_JOB_ID": str(submission)}
        values = launch.identity(job, submission, env)
        source = values["DISPATCH_RESUME_FROM"]
        epoch_value = int(values["DISPATCH_EPOCH"])
        attempt = values["DISPATCH_ATTEMPT"]
        kept = json.loads(world.store.read_exec_file(attempt, ".dispatch") or b"{}")
        time.sleep(0.05)  # loading takes a while; cleanup and the others go on meanwhile
        if source:
            relative = model.parse_name(kept["resume_publication"]).path
            state = _read(world, relative, "trainer_state.json")
            body = _read(world, relative, "model.bin")
            want = model.parse_name(kept["resume_publication"])
            marker = json.dumps({"epoch": want.epoch, "step": want.step}).encode()
            if state != marker or body != marker * 20 or world.locate(relative) != source:
                failures.put(f"execution {attempt} could not load {source}: {state!r}")
        for step in range(1000 * submission, 1000 * submission + 3):
            world.publish(epoch_value, step, _write_save(world, attempt, epoch_value, step))
        starts.value += 1


def checker(root: str, stop: Any, failures: Any, checks: Any) -> None:
    world = _world(root)
    st = open_store(root)
    while not stop.is_set():
        found = st.latest()
        if found is not None and not world.exists(model.parse_name(found.name).path):
            if st.has_publication(found.name):  # a save gone while still published
                failures.put(f"latest {found.name} names a save that does not exist")
        checks.value += 1


def test_cleanup_racing_publishers_and_starting_executions(world: World, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # boto3 is not fork-safe
    old, live = epoch(1), epoch(1, 1)
    a = world.execution(old)
    first = [world.publish(old, s, _write_save(world, a, old, s)) for s in (1, 2)]
    b = world.execution(live, resume=first[-1])
    world.publish(live, 3, _write_save(world, b, live, 3))
    stop, failures = ctx.Event(), ctx.Queue()
    runs, starts, checks = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0)
    home = tmp_path / "home"
    home.mkdir()
    procs = [
        ctx.Process(target=publisher, args=(world.root, old, a, stop, 2, runs)),
        ctx.Process(target=publisher, args=(world.root, live, b, stop, 3, runs)),
        ctx.Process(target=cleaner, args=(world.root, stop, runs)),
        ctx.Process(target=starter, args=(world.root, str(home), stop, failures, starts)),
        ctx.Process(target=checker, args=(world.root, stop, failures, checks)),
    ]
    for p in procs:
        p.start()
    # Run for RUN_SECONDS, and on until each side has done enough to overlap the others
    # (a loaded machine runs fewer cleanups in the same time), within a bound.
    started = time.monotonic()
    # The bound: 30 x RUN_SECONDS, for Azurite beside make test's real tiers.
    while all(p.is_alive() for p in procs) and time.monotonic() < started + 30 * RUN_SECONDS:
        if time.monotonic() >= started + RUN_SECONDS and (
            runs.value >= 5 and starts.value >= 3 and checks.value >= 20
        ):
            break
        time.sleep(0.2)
    stop.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    problems = []
    while not failures.empty():
        problems.append(failures.get())
    assert problems == []
    # Each side must have overlapped the others.
    assert runs.value >= 5 and starts.value >= 3 and checks.value >= 20, (
        runs.value,
        starts.value,
        checks.value,
    )
    report = gc.collect(world.root, 2)
    missing = [
        (n[:41], model.parse_name(n).path)
        for n in world.names()
        if not world.exists(model.parse_name(n).path)
    ]
    assert world.latest_exists() and missing == [], (missing, report.as_json()["folders"])
