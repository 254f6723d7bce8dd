"""The job's cgroup under every naming and slice a release gives it (docs/admin-guide.md, Slurm
releases), on fake cgroup trees: 26.05's cgroup/v2 names the job's folder by the execution's SLUID
(``.../slurmstepd.scope/<SLUID>/``) unless cgroup.conf's ``CgroupJobIdPaths=yes``, and 25.11's
``CgroupSlice`` moves the scope out of ``system.slice``.  A process that scrubbed its
environment is found there by its cgroup alone.  Where slurm.conf runs ``proctrack/cgroup`` and
the Epilog finds no place Slurm keeps jobs' cgroups, the end and dispatch-cease say the proof
rests on /proc alone instead of going quiet.

The hooks' handlers run in this process with Slurm's variables set as Slurm sets them; the
processes are real, the cgroup trees folders (fakes at the kernel's boundary).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.config import Config
from slurm_dispatch.hooks import evidence as work
from slurm_dispatch.node import cease, procscan

from ..fakes.hooks import FakeController, node
from ..fakes.hooks import job as slurm_job
from . import test_procscan_recheck as recheck_tests
from .test_procscan_recheck import UID, _job, node_view

cfg, spawned = recheck_tests.cfg, recheck_tests.spawned  # the fixtures
SLUID = "s0CXM950AMXP00"


def hook(
    monkeypatch: pytest.MonkeyPatch,
    cfg: Config,
    kind: str,
    job: str = "",
    node: str = "n1",
    sluid: str = "",
    slurm_conf: Path | None = None,
) -> None:
    for name in list(os.environ):
        if name.startswith("SLURM"):
            monkeypatch.delenv(name)
    if slurm_conf is not None:
        monkeypatch.setenv("SLURM_CONF", str(slurm_conf))
    if kind != "recheck":
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_UID", str(UID))
        monkeypatch.setenv("SLURM_JOB_GID", str(os.getgid()))
        monkeypatch.setenv("SLURMD_NODENAME", node)
        monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", "0")
        if sluid:
            monkeypatch.setenv("SLURM_JOB_SLUID", sluid)
    work.HANDLERS[kind](cfg)


def scrubbed(spawned: list[subprocess.Popen]) -> int:
    """A process of the job that scrubbed its environment: only its cgroup knows it."""
    proc = subprocess.Popen(["sleep", "300"], env={"PATH": "/usr/bin:/bin"})
    spawned.append(proc)
    return proc.pid


def place(folder: Path, pid: int | None) -> Path:
    """A step's cgroup under ``folder`` holding ``pid`` (none: emptied)."""
    step = folder / "step_batch/user/task_0"
    step.mkdir(parents=True, exist_ok=True)
    (step / "cgroup.procs").write_text(f"{pid}\n" if pid else "")
    return step


def slurm_conf(tmp_path: Path, proctrack: str) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "site.conf").write_text(f"ProctrackType={proctrack}\n")
    path = etc / "slurm.conf"
    path.write_text("ClusterName=c\nInclude site.conf\n")
    return path


@pytest.mark.parametrize(
    "where",
    [
        "system.slice/n1_slurmstepd.scope/{sluid}",  # 26.05: the SLUID, several slurmd a machine
        "system.slice/slurmstepd.scope/{sluid}",  # 26.05, one slurmd
        "batch.slice/n1_slurmstepd.scope/job_{job}",  # 25.11's CgroupSlice=batch.slice
        "batch.slice/slurmstepd.scope/{sluid}",  # both
    ],
)
def test_the_epilog_finds_the_jobs_cgroup_under_every_naming_and_slice(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, tmp_path: Path, where: str
) -> None:
    job = _job()
    pid = scrubbed(spawned)
    root = tmp_path / "cgroup"
    step = place(root / where.format(job=job, sluid=SLUID), pid)
    cfg.cgroup_root = str(root)
    hook(monkeypatch, cfg, "prolog", job, sluid=SLUID)
    hook(monkeypatch, cfg, "epilog", job, sluid=SLUID)
    end = node_view(cfg, job)[(0, "n1")]
    assert end["ceased"] is False
    assert [(s["pid"], s["source"]) for s in end["survivors"]] == [(pid, "cgroup")]
    folder = str(root / where.format(job=job, sluid=SLUID))
    assert end["end"]["cgroup"]["folders"] == [folder]
    # The re-check reads the same folder (the watch entry keeps the SLUID): once it is empty
    # and the process gone, the execution is proven.
    spawned[-1].kill()
    spawned[-1].wait()
    (step / "cgroup.procs").write_text("")
    hook(monkeypatch, cfg, "recheck")
    assert node_view(cfg, job)[(0, "n1")]["ceased"] is True


def test_another_executions_sluid_is_not_this_ones(tmp_path: Path, spawned: list) -> None:
    pid = scrubbed(spawned)
    root = tmp_path / "cgroup"
    place(root / "system.slice/slurmstepd.scope/s0OTHER0000000", pid)
    look = procscan.cgroup_look(str(root), "55", UID, "n1", SLUID)
    assert look.scopes == [str(root / "system.slice/slurmstepd.scope")]
    assert look.folders == [] and look.processes is None
    assert look.names == ["job_55", SLUID]


def cgroup_said(cfg: Config, job: str) -> dict[str, Any]:
    """Where n1's end of restart 0 says it looked for the job's cgroup."""
    end = node_view(cfg, job)[(0, "n1")]["end"]
    said = end["cgroup"]
    assert isinstance(said, dict), end
    return said


def _verdict(cfg: Config, job: str) -> cease.Verdict:
    ctl = FakeController(
        slurm_job(job, uid=UID, start=time.time() - 5, end=time.time()), {"n1": node("n1")}
    )
    return cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)


def test_proctrack_cgroup_with_no_cgroup_found_is_said(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, tmp_path: Path
) -> None:
    job = _job()
    root = tmp_path / "cgroup"
    root.mkdir()  # CgroupRoot names a folder where Slurm keeps nothing (another mount point)
    cfg.cgroup_root = str(root)
    conf = slurm_conf(tmp_path, "proctrack/cgroup")
    hook(monkeypatch, cfg, "prolog", job, sluid=SLUID, slurm_conf=conf)
    hook(monkeypatch, cfg, "epilog", job, sluid=SLUID, slurm_conf=conf)
    said = cgroup_said(cfg, job)
    assert said["proctrack"] == "proctrack/cgroup" and said["scopes"] == []
    assert (
        f"ProctrackType=proctrack/cgroup in {conf}, but {root} holds no slurmstepd "
        "scope" in said["missing"]
    )
    verdict = _verdict(cfg, job)
    assert verdict.ceased, cease.render(verdict)
    evidence = verdict.nodes[0].evidence
    assert (
        "no process left after the kill (by /proc alone: ProctrackType=proctrack/cgroup" in evidence
    ), evidence


@pytest.mark.parametrize("proctrack", ["proctrack/cgroup", "proctrack/linuxproc"])
def test_nothing_is_missing_where_slurm_removed_the_emptied_cgroup_or_runs_none(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, tmp_path: Path, proctrack: str
) -> None:
    job = _job()
    root = tmp_path / "cgroup"
    (root / "system.slice/n1_slurmstepd.scope/system").mkdir(parents=True)
    cfg.cgroup_root = str(root if proctrack == "proctrack/cgroup" else tmp_path / "none")
    conf = slurm_conf(tmp_path, proctrack)
    hook(monkeypatch, cfg, "prolog", job, sluid=SLUID, slurm_conf=conf)
    hook(monkeypatch, cfg, "epilog", job, sluid=SLUID, slurm_conf=conf)
    said = cgroup_said(cfg, job)
    assert "missing" not in said and said["folders"] == []
    verdict = _verdict(cfg, job)
    assert verdict.ceased and "by /proc alone" not in verdict.nodes[0].evidence
