"""A property test of cleanup (docs/invariants.md, 9): random interleavings of executions starting
(with and without the launcher's source), falling back to an older save, saving and publishing (old
executions late, at their lower epoch, too), saves published twice, symlinked saves, pins,
the framework's bests changing, and gc with a random K, killed at a random stage or not; on a
folder and on SeaweedFS.  After every step the invariants are checked:

* no publication names a missing save (so ``latest`` never does);
* no save is missing that a live execution chose (the launcher's record, a choice file) or has
  not published yet, that
  a pin names, that the framework keeps as best, or that one of the K latest named when a gc
  with that K finished;
* a gc that runs to its end after a killed one leaves no intent behind (a rerun finishes),
  but for a removal it decided before the save became needed (pinned or chosen since).

Each case is seeded; a failure names its seed and the steps so far, to replay it.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.checkpoint import execdir, gc, model
from tests.s3server import SeaweedServer

from .gc_world import World, epoch, posix_world
from .worlds import S3Raw

STAGES = ("checked", "intents", "unpublished", "removed")


class Killed(Exception):
    pass


class Model:
    """What the test knows it made: executions, saves, choices, pins, scores."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world, self.rng = world, rng
        self.execs: dict[str, int] = {}  # attempt -> epoch
        self.chosen: dict[str, set[str]] = {}  # attempt -> saves it chose
        self.saves: dict[str, int] = {}  # every save made -> step
        self.scored: dict[str, float] = {}  # saves published with a score
        self.pins: set[str] = set()
        self.unpublished: dict[str, set[str]] = {}  # attempt -> saves it never published
        self.kept_by_k: set[str] = set()  # what the K latest named at the last finished gc
        self.ranked: Optional[str] = None  # the execution whose keep record ranks bests
        self.next_n = 1
        self.step = 0
        self.killed = False
        self.log: list[str] = []

    # what the store says -------------------------------------------------------------

    def latest_epoch(self) -> int:
        names = self.world.names()
        return int(names[-1][:20]) if names else -1

    def published(self) -> list[str]:
        return sorted({model.parse_name(n).path for n in self.world.names()})

    # steps ------------------------------------------------------------------------------

    def start(self) -> None:
        """A new submission (higher epoch) resumes from the latest, as the launcher would."""
        latest = self.world.store.latest()
        ep = epoch(self.next_n)
        self.next_n += 1
        name = latest.name if latest else None
        attempt = self.world.execution(ep, resume=name)
        self.execs[attempt] = ep
        self.chosen[attempt] = {model.parse_name(name).path} if name else set()
        self.log.append(f"start {attempt} epoch {ep} from {name}")

    def fall_back(self) -> None:
        """A live execution passes over its source and chooses an older published save."""
        live = [a for a, e in self.execs.items() if e >= self.latest_epoch()]
        candidates = self.published()
        if not live or not candidates:
            return
        attempt, save = self.rng.choice(live), self.rng.choice(candidates)
        try:
            self.world.store.create_exec_file(
                attempt, execdir.choice_name(save), execdir.choice_bytes(save, attempt, "test")
            )
        except FileExistsError:
            return
        # The integration takes it only while a publication of it is still there.
        if save in self.published():
            self.chosen[attempt].add(save)
        self.log.append(f"fall back {attempt} to {save}")

    def save(self, publish: bool = True) -> None:
        """Any execution (an old one late, at its lower epoch, too) saves and publishes."""
        if not self.execs:
            return
        attempt = self.rng.choice(sorted(self.execs))
        self.step += 1
        relative = self.world.save(attempt, self.step, 20)
        self.saves[relative] = self.step
        if not publish:
            self.unpublished.setdefault(attempt, set()).add(relative)
            self.log.append(f"save {relative} unpublished")
            return
        if self.ranked == attempt:
            # The framework's bests (top 2 by a score) as its manifest would list them.
            self.scored[relative] = round(self.rng.random(), 3)
            self.world.put(
                f"{relative}/{execdir.MANIFEST_NAME}",
                0,
                json.dumps({"format": 1, "files": {}, "bests": sorted(self.bests())}).encode(),
            )
        self.world.publish(self.execs[attempt], self.step, relative)
        self.log.append(f"publish {relative}")

    def publish_twice(self) -> None:
        """A replacement re-publishes an existing published save at its own epoch."""
        saves, live = (
            self.published(),
            [a for a, e in self.execs.items() if e >= self.latest_epoch()],
        )
        if not saves or not live:
            return
        save = self.rng.choice(saves)
        self.step += 1
        try:
            self.world.publish(self.execs[self.rng.choice(live)], self.step, save)
        except Exception:  # noqa: BLE001 - gone meanwhile: nothing to publish
            return
        self.log.append(f"publish {save} again")

    def symlink(self) -> None:
        if self.world.remote:
            return
        saves = [s for s in self.published() if s.startswith("exec/")]
        live = [a for a, e in self.execs.items() if e >= self.latest_epoch()]
        if not saves or not live:
            return
        target = self.rng.choice(saves)
        self.step += 1
        link = f"link-{self.step}"
        os.symlink(target, os.path.join(self.world.root, link))
        self.world.publish(self.execs[self.rng.choice(live)], self.step, link)
        self.log.append(f"publish {link} -> {target}")

    def pin(self) -> None:
        saves = self.published()
        if self.pins and self.rng.random() < 0.4:
            save = self.rng.choice(sorted(self.pins))
            gc.unpin(self.world.root, self.world.locate(save))
            self.pins.discard(save)
            self.log.append(f"unpin {save}")
        elif saves:
            save = self.rng.choice(saves)
            gc.pin(self.world.root, self.world.locate(save))
            self.pins.add(save)
            self.log.append(f"pin {save}")

    def rank(self) -> None:
        """An execution's framework starts keeping its best saves (top 2 by a score)."""
        live = [a for a, e in self.execs.items() if e >= self.latest_epoch()]
        if self.ranked is not None or not live:
            return
        self.ranked = self.rng.choice(sorted(live))
        self.log.append(f"rank bests in {self.ranked}")

    def clean(self) -> None:
        keep = self.rng.randint(1, 4)
        stage = self.rng.choice(STAGES + (None, None))

        def pause(where: str) -> None:
            if where == stage:
                raise Killed

        self.kept_by_k = set()  # this run may remove what an earlier K kept
        try:
            report = gc.collect(self.world.root, keep, pause=pause)
        except Killed:
            self.killed = True
            self.log.append(f"gc --keep {keep} killed at {stage}")
            return
        self.log.append(f"gc --keep {keep}")
        # Only a removal decided before its save became needed (pinned since, chosen since)
        # is left, as an intent, for a later run; nothing is left with neither name.
        for intent in self.world.store.list_intents():
            path = model.parse_name(intent).path
            assert any(gc._overlap(path, kept) for kept in report.kept), (
                f"a finished gc left the intent {intent} of {path}, which nothing needs"
            )
        self.killed = False
        self.kept_by_k = {model.parse_name(n).path for n in self.world.names()[-keep:]}

    # the invariants ---------------------------------------------------------------------

    def bests(self) -> set[str]:
        """What the ranking execution's framework keeps as best now (while it is live)."""
        if self.ranked is None or self.execs[self.ranked] < self.latest_epoch():
            return set()
        ranked = sorted(self.scored.items(), key=lambda item: item[1])
        return {path for path, _value in ranked[:2]}

    def check(self) -> None:
        w = self.world
        for n in w.names():
            assert w.exists(model.parse_name(n).path), f"{n} names a missing save"
        live_epoch = self.latest_epoch()
        needed = set(self.pins) | self.bests() | self.kept_by_k
        for attempt, ep in self.execs.items():
            if ep >= live_epoch:  # a live execution: what it chose and has not published
                needed |= self.chosen[attempt] | self.unpublished.get(attempt, set())
        for save in sorted(needed):
            assert w.exists(save), f"{save} is needed and gone"


def run_case(world: World, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    m = Model(world, rng)
    actions = [
        (m.start, 2),
        (m.fall_back, 2),
        (m.save, 8),
        (lambda: m.save(publish=False), 1),
        (m.publish_twice, 1),
        (m.symlink, 1),
        (m.pin, 2),
        (m.rank, 1),
        (m.clean, 4),
    ]
    weights = [w for _a, w in actions]
    m.start()
    try:
        for _ in range(steps):
            rng.choices([a for a, _w in actions], weights)[0]()
            m.check()
        m.killed = True
        m.clean()  # a last run: whatever was killed before, it finishes
        while m.killed:
            m.clean()
        m.check()
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}\nsteps:\n  " + "\n  ".join(m.log)) from None


@pytest.mark.parametrize("seed", range(12))
def test_cleanup_keeps_every_needed_save_on_a_folder(tmp_path: Path, seed: int) -> None:
    run_case(posix_world(tmp_path), seed, 60)


@pytest.mark.parametrize("seed", range(3))
def test_cleanup_keeps_every_needed_save_on_s3(
    s3_env: SeaweedServer, s3_root: str, seed: int
) -> None:
    run_case(World(S3Raw(s3_root, s3_env.client())), 100 + seed, 40)
