"""Random histories of one job on one to three nodes, run through the real hook handlers with
real survivors: dispatch-cease never says "ceased" of an execution a process of which still
runs, and an execution whose hooks all recorded is proven once its processes are gone.

A history: executions 0 to K, each requeued but the last; on each, PrologSlurmctld and each
allocated node's Prolog (either may record nothing: ended at its HookTimeout; the node's may run
twice, a part installed twice), survivors left
on some nodes, each node's Epilog (given the next count after a requeue on 24.11; run twice
where a part is installed twice; ended before its watch entry, or between it and its end; never
run on a node cut off: NODE_FAIL, which requeues it), EpilogSlurmctld (the next count after a
requeue); re-checks at random moments (sometimes past the watch entries' HookTimeout; some ended
as they renew a watch entry or drop the old one);
survivors ended at random moments.  The controller's clock is skewed from the nodes' by up to
ten minutes either way (a writer's clock: ``time.time``/``time_ns`` shifted while it runs; the
controller's StartTime and EndTime are its clock's, a node's BootTime its own, shortly before the
history began).
``ATTACK_HISTORIES`` sets how many histories (default 60).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from typing import Callable

import pytest

from slurm_dispatch.config import Config
from slurm_dispatch.hooks import evidence as work
from slurm_dispatch.node import cease, facts

from ..fakes.hooks import FakeController, node
from ..fakes.hooks import job as slurm_job
from . import test_procscan_recheck as recheck_tests
from .test_cease_clocks import clock
from .test_controller_facts import controller_hook
from .test_procscan_recheck import UID, _age_entries, _job, _Killed, hook, survivor

cfg, spawned = recheck_tests.cfg, recheck_tests.spawned  # the fixtures

HISTORIES = int(os.environ.get("ATTACK_HISTORIES", "60"))
NODES = ["n1", "n2", "n3"]


def _epilog(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, job: str, name: str, count: int, killed: str
) -> None:
    """The Epilog, ended (``killed``) before its watch entry or before its end, or not."""
    with monkeypatch.context() as patch:
        if killed == "before-entry":
            patch.setattr(work, "_add_watch", _raise)
        elif killed == "before-end":
            patch.setattr(work.store, "write_fact", _stopped_at_end([]))
        try:
            hook(monkeypatch, cfg, "epilog", job, name, count)
        except _Killed:
            pass


def _raise(*args: object) -> None:
    raise _Killed()


def _proven_once_gone(
    monkeypatch: pytest.MonkeyPatch,
    cfg: Config,
    job: str,
    ctl: FakeController,
    proc: subprocess.Popen,
) -> cease.Verdict:
    """The survivor ``proc`` ended and re-checked: the verdict, which must be "ceased"."""
    proc.kill()
    proc.wait()
    hook(monkeypatch, cfg, "recheck")
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert verdict.ceased, cease.render(verdict)
    return verdict


def _stopped_at_end(kept: list[tuple]) -> Callable[..., str]:
    """``write_fact`` for an Epilog stopped as it writes its end (kept: what it was writing)."""
    real = facts.write_fact

    def write(
        state: str, uid: int, gid: int, job_id: str, kind: str, *rest: object, **kwargs: object
    ) -> str:
        if kind == "end":
            kept.append((state, uid, gid, job_id, kind, *rest, kwargs))
            raise _Killed()
        return real(state, uid, gid, job_id, kind, *rest, **kwargs)  # type: ignore[arg-type]

    return write


def test_the_execution_befores_controller_end_gives_no_allocation(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # Found by the histories below (seed 711 of 3000): execution 1 ran on n3, execution 2 on
    # n2, and neither's PrologSlurmctld recorded.  Execution 1's EpilogSlurmctld, given the
    # next count after the requeue, closed no start: its end was filed under execution 2 and
    # its nodes taken for execution 2's allocation, so dispatch-cease judged execution 2 on n3
    # too, which never ran it there: with n3 down, never proven, its processes long gone.
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n3", 1)
    hook(monkeypatch, cfg, "epilog", job, "n3", 1)
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 2, "n3")
    hook(monkeypatch, cfg, "prolog", job, "n2", 2)
    survivor(spawned, job, "n2", 2)
    hook(monkeypatch, cfg, "epilog", job, "n2", 2)
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 2, "n2")
    ctl = FakeController(
        slurm_job(
            job,
            state="COMPLETED",
            restarts=2,
            uid=UID,
            nodelist="n2",
            start=time.time() - 5,
            end=time.time(),
        ),
        {"n2": node("n2"), "n3": node("n3", state="DOWN+NOT_RESPONDING")},
    )
    assert not cease.cessation(job, cfg=cfg, controller=ctl, uid=UID).ceased
    verdict = _proven_once_gone(monkeypatch, cfg, job, ctl, spawned[0])
    assert [n.node for n in verdict.nodes] == ["n2"]


@pytest.mark.parametrize("seed", range(HISTORIES))
def test_a_random_history_never_proves_a_live_survivor(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, seed: int
) -> None:
    rng = random.Random(seed * 7919 + 17)
    job = _job()
    booted = {n: time.time() - rng.uniform(2, 120) for n in NODES}
    executions = rng.randint(1, 3)
    slurm2411 = rng.random() < 0.5
    skew = rng.choice([0.0, rng.uniform(-5, 5), rng.uniform(-600, 600)])
    width = rng.randint(1, 3)
    alive: list[tuple[subprocess.Popen, int, str]] = []  # (process, restart, node)
    # Whether the execution must be proven once its processes are gone: its hooks recorded
    # enough (the controller's start, for one not the last; on each node a start, or for
    # execution 0 an Epilog's end tied to none under count 0, and an Epilog ended at worst after
    # its watch
    # entry of survivors).
    clean: dict[int, bool] = {}
    story: list[str] = [f"24.11={slurm2411} skew={skew:.1f}"]
    cut_off: set[str] = set()
    allocations: list[list[str]] = []

    def maybe_recheck() -> None:
        if rng.random() < 0.4:
            if rng.random() < 0.5:
                _age_entries(cfg)
                story.append("age")
            killed = rng.choice(["", "", "_add_watch", "_drop_watch"])
            with monkeypatch.context() as patch:
                if killed:  # ended as it renews an entry, or drops the old one
                    patch.setattr(work, killed, _raise)
                try:
                    hook(monkeypatch, cfg, "recheck")
                except _Killed:
                    pass
            story.append(f"recheck {killed}".rstrip())
        for proc, r, n in alive:
            if proc.poll() is None and rng.random() < 0.25:
                proc.kill()
                proc.wait()
                story.append(f"kill {r}@{n}")

    for r in range(executions):
        last = r == executions - 1
        nodes = sorted(rng.sample(NODES[:width], rng.randint(1, width)))
        allocations.append(nodes)
        clean[r] = True
        if rng.random() < 0.85:
            with clock(monkeypatch, skew):
                controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, r, ",".join(nodes))
            story.append(f"ctld-start {r}")
        else:
            clean[r] = clean[r] and last
            story.append(f"ctld-start {r} lost")
        for n in nodes:
            if rng.random() < 0.85:
                for _ in range(2 if rng.random() < 0.15 else 1):  # a part installed twice
                    hook(monkeypatch, cfg, "prolog", job, n, r)
                    story.append(f"start {r}@{n}")
            else:
                # An end tied to no start proves only under count 0 (its Epilog's: on 24.11
                # one requeued is given 1).
                clean[r] = clean[r] and r == 0 and (last or not slurm2411)
                story.append(f"start {r}@{n} lost")
            for _ in range(rng.choice([0, 0, 1, 2])):
                survivor(spawned, job, n, r)
                alive.append((spawned[-1], r, n))
                story.append(f"survivor {r}@{n}")
        maybe_recheck()
        count = r if last or not slurm2411 else r + 1
        for n in nodes:
            if rng.random() < 0.1:
                cut_off.add(n)
                clean[r] = False
                story.append(f"{n} cut off")
                continue
            recorded = False
            for _ in range(2 if rng.random() < 0.2 else 1):
                killed = rng.choice(["", "", "", "", "before-entry", "before-end"])
                watched = any(p.poll() is None for p, rr, nn in alive if (rr, nn) == (r, n))
                recorded = recorded or not killed or killed == "before-end" and watched
                _epilog(monkeypatch, cfg, job, n, count, killed)
                story.append(f"epilog {r}@{n} count {count} {killed}".rstrip())
                maybe_recheck()
            clean[r] = clean[r] and recorded
        with clock(monkeypatch, skew):
            controller_hook(
                monkeypatch, cfg, "epilog-slurmctld", job, r if last else r + 1, ",".join(nodes)
            )
        story.append(f"ctld-end {r}")
        maybe_recheck()

    def controller() -> FakeController:
        # Slurm's times by the controller's clock; BootTime by the node's (this machine's),
        # shortly before the history began (a node resumed for the job, never rebooted since).
        state = "NODE_FAIL" if cut_off else "COMPLETED"
        return FakeController(
            slurm_job(
                job,
                state=state,
                restarts=executions - 1,
                uid=UID,
                nodelist=",".join(allocations[-1]),
                start=time.time() + skew - 5,
                end=time.time() + skew,
            ),
            {
                n: node(n, state="DOWN+NOT_RESPONDING" if n in cut_off else "IDLE", boot=booted[n])
                for n in NODES
            },
        )

    def check_safe(when: str) -> None:
        views = {
            (e["restart"], n): v
            for e in facts.execution_facts(job, cfg.state_dir, UID)
            for n, v in e["nodes"].items()
        }
        for r in range(executions):
            running = [(p.pid, n) for p, rr, n in alive if rr == r and p.poll() is None]
            if not running:
                continue
            verdict = cease.cessation(job, r, cfg=cfg, controller=controller(), uid=UID)
            assert not verdict.ceased, (
                f"seed {seed} {when} {r} {running}: {story}\n{cease.render(verdict)}"
            )
            for _, n in running:
                view = views.get((r, n))
                assert view is None or view["ceased"] is not True, (
                    f"seed {seed} {when} {r}@{n}: {story}\n{view}"
                )

    check_safe("after the history")
    maybe_recheck()
    check_safe("after more re-checks")
    for proc, _, _ in alive:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    _age_entries(cfg)
    hook(monkeypatch, cfg, "recheck")
    hook(monkeypatch, cfg, "recheck")
    for r in range(executions):
        if clean[r]:
            verdict = cease.cessation(job, r, cfg=cfg, controller=controller(), uid=UID)
            assert verdict.ceased, f"seed {seed} {r}: {story}\n{cease.render(verdict)}"


def test_an_end_a_recheck_recorded_is_the_one_its_late_epilog_would_have_written(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # The Epilog writes its watch entry and is stopped before its end (stuck on a hung
    # StateDir past HookTimeout).  A re-check records the end from the entry (recorded_by).
    # The stuck Epilog, woken, then writes its own end under the same name: refused (a fact is
    # written once), and the end read is the re-check's, tied to the same start and execution.
    # A second Epilog of the same start (a part installed twice) finds no open start then: its
    # end, tied to none, names the survivor still running.  Never "ceased" while it runs.
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    survivor(spawned, job, "n1", 0)
    survivor(spawned, job, "n1", 0)
    late: list[tuple] = []
    with monkeypatch.context() as patch:
        patch.setattr(work.store, "write_fact", _stopped_at_end(late))
        with pytest.raises(_Killed):
            hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    spawned[0].kill()
    spawned[0].wait()
    _age_entries(cfg)
    hook(monkeypatch, cfg, "recheck")
    ((state, uid, gid, job_id, kind, name, body, kwargs),) = late
    with pytest.raises(facts.FactError, match="exists"):
        facts.write_fact(state, uid, gid, job_id, kind, name, body, **kwargs)
    (execution,) = facts.execution_facts(job, cfg.state_dir, UID)
    entry = execution["nodes"]["n1"]
    assert entry["end"]["recorded_by"] and entry["end"]["token"] == entry["start"]["token"]
    assert [s["pid"] for s in entry["survivors"]] == [spawned[1].pid]
    ctl = FakeController(slurm_job(job, uid=UID), {"n1": node("n1")})
    assert not cease.cessation(job, cfg=cfg, controller=ctl, uid=UID).ceased
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)  # the second part, tied to no start
    assert not cease.cessation(job, cfg=cfg, controller=ctl, uid=UID).ceased
    _proven_once_gone(monkeypatch, cfg, job, ctl, spawned[1])
