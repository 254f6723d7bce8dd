"""The controller's clock and a node's are not one clock: facts are read oldest token first,
and a token carries its writer's clock.  What dispatch-cease says must not hang on which of
the two clocks is ahead.

The hooks' handlers run in this process with Slurm's variables set as Slurm sets them (the
helpers of test_procscan_recheck and test_controller_facts); a writer's clock is skewed by
shifting ``time.time`` and ``time.time_ns`` while it runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

from slurm_dispatch.config import Config
from slurm_dispatch.node import cease

from ..fakes.hooks import FakeController, node
from ..fakes.hooks import job as slurm_job
from . import test_procscan_recheck as recheck_tests
from .test_controller_facts import controller_hook
from .test_procscan_recheck import UID, _job, hook, survivor

_time, _time_ns = time.time, time.time_ns


@contextlib.contextmanager
def clock(monkeypatch: pytest.MonkeyPatch, offset: float) -> Iterator[None]:
    """The writer's clock ``offset`` seconds ahead of this machine's (behind when negative)."""
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: _time() + offset)
        patch.setattr(time, "time_ns", lambda: _time_ns() + int(offset * 1e9))
        yield


cfg, spawned = recheck_tests.cfg, recheck_tests.spawned  # the fixtures


def cut_off(job: str) -> FakeController:
    """The controller after execution 1 ended with n1 cut off (its Epilog never ran)."""
    return FakeController(
        slurm_job(
            job, state="NODE_FAIL", restarts=1, uid=UID, start=time.time() - 5, end=time.time()
        ),
        {"n1": node("n1", state="DOWN+NOT_RESPONDING")},
    )


@pytest.mark.parametrize("skew", [0.0, -30.0, -600.0])
def test_a_stray_end_never_proves_the_next_execution_whatever_the_controllers_clock(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, skew: float
) -> None:
    # Execution 0 on n1 ends; a second Epilog of it (a part installed twice) is given the next
    # count (24.11 after a requeue) and, finding no open start, records an end tied to no
    # start under restart 1.  Execution 1 starts on n1, whose Prolog records nothing (ended at
    # its HookTimeout), and n1 is then cut off: its processes run on, its Epilog never runs.
    # The controller's start of execution 1 drops that stray end only when it is read after
    # it: with the controller's clock behind n1's by more than the requeue took, it is read
    # before, the stray end stays, and dispatch-cease said "ceased" of execution 1.
    job = _job()
    with clock(monkeypatch, skew):
        controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 1)  # the same Epilog again, the next count
    with clock(monkeypatch, skew):
        controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n1")
        time.sleep(0.01)
        controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 1, "n1")
    survivor(spawned, job, "n1", 1)  # execution 1 runs on; n1 records neither start nor end
    ctl = cut_off(job)
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert verdict.restart == 1
    assert not verdict.ceased, (skew, cease.render(verdict))
    assert cease.cessation(job, 0, cfg=cfg, controller=ctl, uid=UID).ceased


@pytest.mark.parametrize("skew", [0.0, -30.0, 30.0])
def test_a_stray_end_never_proves_the_next_execution_no_start_of_which_was_recorded(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, skew: float
) -> None:
    # As above, where execution 0's Prolog on n1 and both of execution 1's (n1's and
    # PrologSlurmctld) recorded nothing: execution 0's Epilog, given the next count, records
    # an end tied to no start under restart 1, and no start of execution 1 is read at all.
    job = _job()
    with clock(monkeypatch, skew):
        controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    hook(monkeypatch, cfg, "epilog", job, "n1", 1)  # execution 0's, given the next count
    with clock(monkeypatch, skew):
        controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n1")
    survivor(spawned, job, "n1", 1)
    ctl = cut_off(job)
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert verdict.restart == 1
    assert not verdict.ceased, (skew, cease.render(verdict))


@pytest.mark.parametrize("skew", [0.0, 30.0, 600.0])
def test_an_execution_whose_prolog_recorded_nothing_is_proven_whatever_the_controllers_clock(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, skew: float
) -> None:
    # Execution 0's Prolog on n1 records nothing (ended at its HookTimeout); its Epilog finds
    # a survivor and records an end tied to no start, under the count Slurm gives it (22.05:
    # its own).  The survivor goes and a re-check records it.  With the controller's clock
    # ahead of n1's by more than the job ran, the controller's start of execution 0 is read
    # after that end, is taken for a start recorded after it, and drops the end and its
    # re-checks: execution 0 was never proven, whatever became of its processes.  (Under a
    # count of 1 and later such an end proves nothing, whatever the clocks: it may be the
    # execution before's, given the next count; see the tests above.)
    job = _job()
    with clock(monkeypatch, skew):
        controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    pid = survivor(spawned, job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    with clock(monkeypatch, skew):
        controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 0, "n1")
    ctl = FakeController(
        slurm_job(
            job, state="COMPLETED", restarts=0, uid=UID, start=time.time() - 5, end=time.time()
        ),
        {"n1": node("n1")},
    )
    alive = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert not alive.ceased, (pid, cease.render(alive))
    spawned[0].kill()
    spawned[0].wait()
    hook(monkeypatch, cfg, "recheck")
    gone = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert gone.ceased, (skew, cease.render(gone))


@pytest.mark.parametrize("skew", [0.0, 300.0])
def test_a_reboot_before_the_end_never_proves_a_node_that_recorded_nothing_whatever_its_clock(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, skew: float
) -> None:
    # n1 booted a minute before the execution's end (power saving resumed it for the job), its
    # Prolog recorded nothing, and it was cut off: its processes run on.  Its BootTime is its
    # own clock's, the execution's end the controller's: with n1's clock 5 minutes ahead, the
    # boot read as after the end, and dispatch-cease said "ceased" ("rebooted at ...").
    job = _job()
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    survivor(spawned, job, "n1", 0)
    end = time.time()
    ctl = FakeController(
        slurm_job(job, state="NODE_FAIL", restarts=0, uid=UID, start=end - 30, end=end),
        {"n1": node("n1", state="DOWN+NOT_RESPONDING", boot=end - 60 + skew)},
    )
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert not verdict.ceased, (skew, cease.render(verdict))
