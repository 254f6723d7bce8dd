"""An orphan's Epilog (docs/admin-guide.md, Slurm releases): Slurm 26.05 looks up the steps a
rejoining node reports by SLUID, so an execution cut off by a partition and requeued meanwhile is an
"Orphan" to slurmctld, and the Epilog it runs on that node is given ``SLURM_JOB_UID=0``, no restart
count and no times, but the ``SLURM_JOB_SLUID`` its Prolog was given.  Its end must be the owner's,
tied to that start, with the owner's survivors found, or dispatch-cease says "no post-kill
record" for ever.

The hooks' handlers run in this process with Slurm's variables set as Slurm sets them; the
job's owner is ``nobody`` (its survivor runs as nobody, as a user's job does), the hooks root.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.config import Config
from slurm_dispatch.hooks import evidence as work
from slurm_dispatch.node import facts

from . import test_procscan_recheck as recheck_tests
from .test_procscan_recheck import _job, survivor

if TYPE_CHECKING:
    from slurm_dispatch.node.executions import NodeFacts

OWNER = 65534  # nobody
cfg, spawned = recheck_tests.cfg, recheck_tests.spawned  # the fixtures


def hook(
    monkeypatch: pytest.MonkeyPatch,
    cfg: Config,
    kind: str,
    job: str,
    node: str,
    uid: int,
    sluid: str,
    restart: int | None = None,
) -> None:
    """A node's hook of ``job`` as 26.05 runs it: an orphan's Epilog has uid 0 and no count."""
    for name in list(os.environ):
        if name.startswith("SLURM"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_JOB_UID", str(uid))
    monkeypatch.setenv("SLURM_JOB_GID", str(uid))
    monkeypatch.setenv("SLURMD_NODENAME", node)
    monkeypatch.setenv("SLURM_JOB_SLUID", sluid)
    if restart is not None:
        monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", str(restart))
    work.HANDLERS[kind](cfg)


def owners_survivor(procs: list[subprocess.Popen], job: str, node: str) -> int:
    """A process of the job left on ``node``, running as its owner (not root)."""
    if os.geteuid() != 0:
        pytest.fail("an orphan's Epilog runs as root: these tests need root")
    return survivor(procs, job, node, 0, user=OWNER)


def node_view(cfg: Config, job: str) -> dict[tuple[int, str], NodeFacts]:
    return {
        (e["restart"], name): n
        for e in facts.execution_facts(job, cfg.state_dir, OWNER)
        for name, n in e["nodes"].items()
    }


def test_an_orphans_epilog_records_the_owners_end_tied_to_the_start_of_its_sluid(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", OWNER, "S0AAAA", restart=0)
    # Requeued off n1 while it was cut off: execution 1 starts on n2 under a new SLUID.
    hook(monkeypatch, cfg, "prolog", job, "n2", OWNER, "S1BBBB", restart=1)
    pid = owners_survivor(spawned, job, "n1")
    # n1 rejoins: its execution is an orphan to slurmctld, whose Epilog is root's.
    hook(monkeypatch, cfg, "epilog", job, "n1", 0, "S0AAAA")
    assert facts.job_uids(cfg.state_dir, job) == [OWNER]  # nothing filed under uid 0
    view = node_view(cfg, job)
    start, end = view[(0, "n1")]["start"], view[(0, "n1")]["end"]
    assert start["sluid"] == end["sluid"] == "S0AAAA"
    assert end["start_token"] == start["token"] and end["orphan"] is True
    assert [s["pid"] for s in view[(0, "n1")]["survivors"]] == [pid]
    assert view[(0, "n1")]["ceased"] is False
    assert view[(1, "n2")]["end"] is None  # the replacement is untouched
    watch = list((Path(cfg.state_dir) / "watch").rglob(f"{OWNER}.{job}.*"))
    assert len(watch) == 1 and '"sluid":"S0AAAA"' in watch[0].read_text().replace(" ", "")
    # Once the survivor is gone, a re-check proves the execution ceased on n1.
    spawned[0].kill()
    spawned[0].wait()
    work.HANDLERS["recheck"](cfg)
    assert node_view(cfg, job)[(0, "n1")]["ceased"] is True


def test_an_orphans_epilog_ties_to_no_start_of_another_sluid(
    monkeypatch: pytest.MonkeyPatch, cfg: Config
) -> None:
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", OWNER, "S0AAAA", restart=0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0, "S9ZZZZ")
    view = node_view(cfg, job)
    assert view[(0, "n1")]["end"] is None and view[(0, "n1")]["ceased"] is None
    # Nor an execution whose end its own Epilog recorded already.
    hook(monkeypatch, cfg, "epilog", job, "n1", OWNER, "S0AAAA", restart=0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0, "S0AAAA")
    ends = [f for f in facts.read_job_facts(cfg.state_dir, OWNER, job)[0] if f["kind"] == "end"]
    assert len(ends) == 1 and "orphan" not in ends[0]


def test_a_start_and_an_end_record_the_sluid_only_where_slurm_gives_a_plain_one(
    monkeypatch: pytest.MonkeyPatch, cfg: Config
) -> None:
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", OWNER, "S0/../x", restart=0)
    hook(monkeypatch, cfg, "epilog", job, "n1", OWNER, "", restart=0)
    view = node_view(cfg, job)
    start, end = view[(0, "n1")]["start"], view[(0, "n1")]["end"]
    assert start is not None and end is not None, view
    assert "sluid" not in start and "sluid" not in end
    assert view[(0, "n1")]["ceased"] is True


def test_an_epilog_ties_its_end_to_the_open_start_of_its_own_sluid(
    monkeypatch: pytest.MonkeyPatch, cfg: Config
) -> None:
    """Job ids start again once a controller lost its state (its
    StateSaveLocation gone, FirstJobId again).  The id's run from before, whose end was never
    recorded, and the new job's run both have restart 0 on n1; each Epilog's end is tied to the
    start of its own SLUID, whichever came last: it was tied to the latest start of the count,
    so the old run's late end closed the new one's start (and the new one was taken for
    ended, its own Epilog's end for a stray)."""
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", OWNER, "S0OLD", restart=0)
    hook(monkeypatch, cfg, "prolog", job, "n1", OWNER, "S1NEW", restart=0)
    hook(monkeypatch, cfg, "epilog", job, "n1", OWNER, "S0OLD", restart=0)
    found = facts.read_job_facts(cfg.state_dir, OWNER, job)[0]
    starts = {f["sluid"]: f for f in found if f["kind"] == "start"}
    [end] = [f for f in found if f["kind"] == "end"]
    assert end["start_token"] == starts["S0OLD"]["token"]
    hook(monkeypatch, cfg, "epilog", job, "n1", OWNER, "S1NEW", restart=0)
    ends = [f for f in facts.read_job_facts(cfg.state_dir, OWNER, job)[0] if f["kind"] == "end"]
    assert {e["sluid"]: e["start_token"] for e in ends} == {
        "S0OLD": starts["S0OLD"]["token"],
        "S1NEW": starts["S1NEW"]["token"],
    }


def test_the_controllers_end_is_tied_to_its_start_of_the_same_sluid(
    monkeypatch: pytest.MonkeyPatch, cfg: Config
) -> None:
    """The same for the controller's facts, which now carry the SLUID: its ends are tied to its
    starts oldest first, so the new job's end closed the old run's start."""
    job = _job()
    for sluid in ("S0OLD", "S1NEW"):
        hook(monkeypatch, cfg, "prolog-slurmctld", job, "n1", OWNER, sluid, restart=0)
    hook(monkeypatch, cfg, "epilog-slurmctld", job, "n1", OWNER, "S1NEW", restart=0)
    found = facts.read_job_facts(cfg.state_dir, OWNER, job)[0]
    starts = {f["sluid"]: f for f in found if f["kind"] == "ctld-start"}
    [end] = [f for f in found if f["kind"] == "ctld-end"]
    assert end["sluid"] == "S1NEW" and end["start_token"] == starts["S1NEW"]["token"]
