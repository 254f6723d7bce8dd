"""The controller's records are tied to executions the way a node's are:
after `scontrol requeue`, EpilogSlurmctld of restart 0 runs with the next execution's count,
and its end was filed under restart 1, so the running execution read "ended exit 0:0"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_dispatch.config import Config
from slurm_dispatch.hooks import evidence as work
from slurm_dispatch.node import facts

from ..fakes.hooks import state_dir

UID = os.getuid()


def controller_hook(
    monkeypatch: pytest.MonkeyPatch,
    cfg: Config,
    kind: str,
    job: str,
    restart: int,
    nodes: str,
    exit_code: str = "0:0",
) -> None:
    for name in list(os.environ):
        if name.startswith("SLURM"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_JOB_UID", str(UID))
    monkeypatch.setenv("SLURM_JOB_GID", str(os.getgid()))
    monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", str(restart))
    monkeypatch.setenv("SLURM_JOB_NODELIST", nodes)
    monkeypatch.setenv("SLURM_JOB_EXIT_CODE2", exit_code)
    work.HANDLERS[kind](cfg)


def test_a_requeued_executions_controller_end_is_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = state_dir(tmp_path)[1]
    job = "4242"
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    # scontrol requeue: Slurm gives the ending execution's EpilogSlurmctld the next count.
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n1", "0:15")
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 1, "n2")
    first, second = facts.execution_facts(job, cfg.state_dir, UID)
    assert (first["restart"], second["restart"]) == (0, 1)
    assert first["controller"]["end"] is not None
    assert first["end"]["exit_code"] == "0:15" and first["end"]["requeued"]
    assert second["controller"]["end"] is None and second["end"] is None  # still running
    assert (first["allocated"], second["allocated"]) == (["n1"], ["n2"])
    # And its own end, when it comes, is its own.
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n2", "1:0")
    second = facts.execution_facts(job, cfg.state_dir, UID)[1]
    assert second["end"]["exit_code"] == "1:0" and not second["end"]["requeued"]


def test_an_end_without_a_recorded_start_keeps_the_count_it_was_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = state_dir(tmp_path)[1]
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", "77", 2, "n3")
    (only,) = facts.execution_facts("77", cfg.state_dir, UID)
    end = only["controller"]["end"]
    assert end is not None, only
    assert only["restart"] == 2 and "start_token" not in end


def test_a_killed_epilogslurmctlds_leftover_never_stops_the_next_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An EpilogSlurmctld ended while it wrote its fact leaves .ctld-end.slurmctld.0.<token>
    # (factstore.create_file), and its start stays open.  The next one ends the oldest open
    # start, the same name: a leftover under that temporary name must not refuse it (it did,
    # every later EpilogSlurmctld of the job with it: 'cannot create ...: File exists').
    cfg = state_dir(tmp_path)[1]
    job = "4343"
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    folder = Path(cfg.state_dir) / "facts" / str(UID) / job
    [start] = os.listdir(folder)
    left = folder / ("." + start.replace("ctld-start.", "ctld-end.", 1))
    left.write_bytes(b'{"v":1,"ki')  # what the killed writer had written
    left.chmod(0o640)
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 1, "n2")
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n2", "0:9")
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n2", "0:0")
    ends = [n for n in os.listdir(folder) if n.startswith("ctld-end.")]
    assert len(ends) == 2, sorted(os.listdir(folder))
    found, problems = facts.read_job_facts(cfg.state_dir, UID, job)
    assert problems == [] and len(found) == 4


def test_a_controller_end_no_start_ties_never_ends_an_execution_started_after_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A PrologSlurmctld ended before it recorded its start (HookTimeout on a slow StateDir;
    # it leaves at most a dot-name): the requeued execution's EpilogSlurmctld, given the next
    # count, finds no open start and records an end tied to none under execution 1, before
    # execution 1 starts.  Execution 1, running, then read as ended with execution 0's exit.
    cfg = state_dir(tmp_path)[1]
    job = "4545"
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n1", "0:15")
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 1, "n2")
    (second,) = facts.execution_facts(job, cfg.state_dir, UID)
    assert second["restart"] == 1 and second["allocated"] == ["n2"]
    assert second["controller"]["end"] is None and second["end"] is None, second  # running
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n2", "1:0")
    (second,) = facts.execution_facts(job, cfg.state_dir, UID)
    assert second["end"]["exit_code"] == "1:0"
