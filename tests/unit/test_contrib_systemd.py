"""The shipped systemd user units (docs/user-guide.md, running the supervisor): systemd
accepts them, the timer starts the service every minute, and the service's command makes a
supervisor pass (run here against the fake controller, with the unit's own %h spelled out)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.control import heartbeat

from ..fakes.controller import CLUSTER, Controller

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "contrib" / "systemd"


def unit(name: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found[key] = value
    return found


def installed(home: Path) -> Path:
    """The units as a user installs them, with `dispatch` where the service expects it."""
    folder = home / ".config" / "systemd" / "user"
    folder.mkdir(parents=True)
    for name in ("dispatch-supervise.service", "dispatch-supervise.timer"):
        shutil.copy(UNITS / name, folder / name)
    dispatch = home / ".venvs" / "dispatch" / "bin" / "dispatch"
    dispatch.parent.mkdir(parents=True)
    dispatch.write_text(f'#!/bin/sh\nexec {sys.executable} -m slurm_dispatch.cli.dispatch "$@"\n')
    dispatch.chmod(0o755)
    return folder


def test_the_timer_starts_a_one_shot_pass_every_minute() -> None:
    timer, service = unit("dispatch-supervise.timer"), unit("dispatch-supervise.service")
    assert timer["OnUnitInactiveSec"] == "1min" and timer["WantedBy"] == "timers.target"
    assert service["Type"] == "oneshot"
    assert shlex.split(service["ExecStart"])[1:] == ["supervise", "-q"]


def test_the_services_command_makes_a_pass(tmp_path: Path) -> None:
    folder = installed(tmp_path)
    controller = Controller(tmp_path / "slurm")
    argv = [
        w.replace("%h", str(tmp_path))
        for w in shlex.split(unit("dispatch-supervise.service")["ExecStart"])
    ]
    env = controller.env(
        HOME=str(tmp_path), XDG_STATE_HOME="", PYTHONPATH=str(REPO), DISPATCH_SLURM_BACKEND="cli"
    )
    env.pop("DISPATCH_HOME", None)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / ".local" / "state" / "slurm-dispatch"
    assert heartbeat.read(str(state), CLUSTER) is not None
    assert (folder / "dispatch-supervise.service").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    folder = installed(tmp_path)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(tmp_path / ".config"),
    }
    proc = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--user",
            str(folder / "dispatch-supervise.timer"),
            str(folder / "dispatch-supervise.service"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


def test_the_default_signal_is_found_with_the_units_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit sets its own PATH, without the venv's bin/, so every pass
    got "'dispatch-cease' not found" with the default CessationSignal.  The supervisor finds
    it on PATH, else beside its own interpreter (where the wheel installs it)."""
    from slurm_dispatch import config
    from slurm_dispatch.control.holds import ask_signal

    path = unit("dispatch-supervise.service")["Environment"].removeprefix("PATH=")
    monkeypatch.setenv("PATH", path.replace("%h", str(tmp_path)))
    assert Path(sys.executable).parent.joinpath("dispatch-cease").is_file()
    answer = ask_signal([config.DEFAULT_CESSATION_SIGNAL, "--help"], 60)
    assert answer.code == 0 and "Usage: dispatch-cease" in str(answer.evidence), answer


def test_the_units_agree_with_the_user_guides_install_path() -> None:
    """The service ran %h/slurm-dispatch/.venv/bin/dispatch, a venv
    the user guide never makes (it makes ~/.venvs/dispatch)."""
    guide = (REPO / "docs/user-guide.md").read_text()
    (venv,) = set(re.findall(r"python3 -m venv (~/\S+)", guide))
    service = unit("dispatch-supervise.service")
    assert shlex.split(service["ExecStart"])[0] == venv.replace("~", "%h") + "/bin/dispatch"
    assert service["Environment"].startswith(f"PATH={venv.replace('~', '%h')}/bin:")
    assert "slurm-dispatch/.venv" not in guide
