"""The sandbox's slurm.conf as each release needs it (slurm_dispatch.sandbox.slurm_conf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import slurm_conf
from slurm_dispatch.sandbox.layout import Layout


def render(tmp_path: Path, major: str, delay: int | None = None) -> list[str]:
    text = slurm_conf.render_slurm_conf(Layout(tmp_path), ["n1", "n2"], "host", "newest",
                                        major=major, requeue_delay=delay)
    return text.splitlines()


def scheduler_parameters(lines: list[str]) -> list[str]:
    [line] = [line for line in lines if line.startswith("SchedulerParameters=")]
    return line.split("=", 1)[1].split(",")


def test_expedited_requeue_is_enabled_from_25_11_and_nowhere_before(tmp_path: Path) -> None:
    """Issue 29 item 4: a --requeue=expedite job is requeued at once only where slurmctld has
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
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(slurm_conf.REQUEUE_DELAY_ENV, "2m")
    with pytest.raises(SandboxError, match=r"DISPATCH_SANDBOX_REQUEUE_DELAY='2m' is not a whole"):
        slurm_conf.write_config(Layout(tmp_path), ["n1"], "newest", "26.05")
