"""The sandbox's slurm.conf as each release needs it (slurm_dispatch.sandbox.slurm_conf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import slurm_conf
from slurm_dispatch.sandbox.layout import Layout


def render(tmp_path: Path, major: str, delay: int | None = None) -> list[str]:
    text = slurm_conf.render_slurm_conf(
        Layout(tmp_path), ["n1", "n2"], "host", "newest", major=major, requeue_delay=delay
    )
    return text.splitlines()


def scheduler_parameters(lines: list[str]) -> list[str]:
    [line] = [line for line in lines if line.startswith("SchedulerParameters=")]
    return line.split("=", 1)[1].split(",")


def test_expedited_requeue_is_enabled_from_25_11_and_nowhere_before(tmp_path: Path) -> None:
    """A --requeue=expedite job is requeued at once only where slurmctld has
    enable_expedited_requeue; a release before 25.11 would not know the parameter."""
    for major in ("25.11", "26.05", "26.11"):
        assert "SlurmctldParameters=enable_expedited_requeue" in render(tmp_path, major), major
    for major in ("22.05", "24.11", "25.05", ""):
        lines = render(tmp_path, major)
        assert not [line for line in lines if "enable_expedited_requeue" in line], major


def test_the_requeue_delay_is_cred_expire_unless_given(tmp_path: Path) -> None:
    """From 25.11 requeue_delay (SchedulerParameters) is the delay and defaults to cred_expire;
    before, cred_expire is: the sandbox's 5 s either way, the env knob's value where given."""
    lines = render(tmp_path, "26.05")
    assert not [p for p in scheduler_parameters(lines) if p.startswith("requeue_delay")]
    assert any(line.endswith(f"cred_expire={slurm_conf.CRED_EXPIRE}") for line in lines)
    lines = render(tmp_path, "26.05", delay=120)
    assert "requeue_delay=120" in scheduler_parameters(lines)
    assert any(line.endswith(f"cred_expire={slurm_conf.CRED_EXPIRE}") for line in lines)
    lines = render(tmp_path, "24.11", delay=120)
    assert not [p for p in scheduler_parameters(lines) if p.startswith("requeue_delay")]
    assert any(line.endswith("cred_expire=120") for line in lines)


def test_a_requeue_delay_that_is_not_a_number_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(slurm_conf.REQUEUE_DELAY_ENV, "2m")
    with pytest.raises(SandboxError, match=r"DISPATCH_SANDBOX_REQUEUE_DELAY='2m' is not a whole"):
        slurm_conf.write_config(Layout(tmp_path), ["n1"], "newest", "26.05")


HYBRID = "9:name=systemd:/\n6:freezer:/\n4:memory:/process_api/x\n0::/\n"
MOUNTS = (
    "cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
)


def test_proctrack_cgroup_is_chosen_by_its_plugin_and_refused_where_slurm_cannot_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts, own = tmp_path / "mounts", tmp_path / "cgroup"
    mounts.write_text(MOUNTS)
    own.write_text(HYBRID)
    # A hybrid host (these VMs): slurmd's cgroup/v2 refuses it on every release, so the
    # sandbox says so before starting one; cgroup/v1 runs on its freezer hierarchy.
    with pytest.raises(
        SandboxError,
        match=r"Slurm's cgroup/v2 needs a host with cgroup v2 "
        r"alone and this one is hybrid: .* lists v1 "
        r"hierarchies \(9:name=systemd:/, 6:freezer:/",
    ):
        slurm_conf.cgroup_mount("cgroup/v2", str(mounts), str(own))
    assert slurm_conf.cgroup_mount("cgroup/v1", str(mounts), str(own)) == "/sys/fs/cgroup"
    # A cgroup v2 host: its one mount.
    mounts.write_text("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    own.write_text("0::/init.scope\n")
    assert slurm_conf.cgroup_mount("cgroup/v2", str(mounts), str(own)) == "/sys/fs/cgroup"
    with pytest.raises(SandboxError, match="mounts no cgroup v1 freezer hierarchy"):
        slurm_conf.cgroup_mount("cgroup/v1", str(mounts), str(own))
    assert (
        "CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\nCgroupMountpoint=/sys/fs/cgroup\n"
        in slurm_conf.render_cgroup_conf("cgroup/v1", "/sys/fs/cgroup")
    )
    monkeypatch.setenv(slurm_conf.PROCTRACK_ENV, "cgroup")
    with pytest.raises(SandboxError, match="is not one of linuxproc, cgroup/v2, cgroup/v1"):
        slurm_conf.proctrack()
    lines = slurm_conf.render_slurm_conf(
        Layout(tmp_path), ["n1"], "host", tracking="cgroup/v1"
    ).splitlines()
    assert "ProctrackType=proctrack/cgroup" in lines
    assert (
        "ProctrackType=proctrack/linuxproc"
        in slurm_conf.render_slurm_conf(Layout(tmp_path), ["n1"], "host").splitlines()
    )
