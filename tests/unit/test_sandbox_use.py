"""What ``dispatch-sandbox up`` tells its user to run next, and which job user it makes.

Its last lines are pasted into a shell that has none of the sandbox's variables: they must
reach the folder ``up`` used (``--dir``, also when ``$DISPATCH_SANDBOX_DIR`` chose it) through
the command as it was run (``bin/dispatch-sandbox`` from a clone), and its job user must be the
one ``$DISPATCH_SANDBOX_USER`` named.  Running ``up`` itself is the real
tier's (tests/real/test_sandbox.py); here the lines are pasted against a folder with a manifest.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from slurm_dispatch.cli import sandbox as sandbox_cli
from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import machine as sandbox_machine

REPO = Path(__file__).resolve().parents[2]


def test_a_non_default_folder_is_named_and_the_default_one_is_not() -> None:
    assert sandbox_cli.use_lines("dispatch-sandbox", "/var/tmp/sb 2", "alice", False) == [
        """use it with: eval "$(dispatch-sandbox env --dir '/var/tmp/sb 2')\"""",
        'jobs run as alice: runuser -u "$DISPATCH_SANDBOX_USER" -- sbatch --wrap hostname',
    ]
    default = str(sandbox_layout.DEFAULT_DIR)
    assert (
        sandbox_cli.use_lines("bin/dispatch-sandbox", default, "dispatchuser", False)[0]
        == 'use it with: eval "$(bin/dispatch-sandbox env)"'
    )
    # A sandbox in a Debian root: every word pastes as it is (no [--user USER] to fill in).
    assert sandbox_cli.use_lines("dispatch-sandbox", f"{default}-24.11", "bob", True) == [
        f"use it with: dispatch-sandbox exec --dir {default}-24.11 -- sinfo -N",
        f"jobs run as bob: dispatch-sandbox exec --dir {default}-24.11 --user bob -- "
        "sbatch --wrap hostname",
    ]


def test_the_command_is_named_as_it_was_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sandbox_cli.invoked_as("bin/dispatch-sandbox") == "bin/dispatch-sandbox"
    assert (
        sandbox_cli.invoked_as("/opt/my venv/bin/dispatch-sandbox")
        == "'/opt/my venv/bin/dispatch-sandbox'"
    )
    assert sandbox_cli.invoked_as("/usr/lib/python3/runpy.py") == "dispatch-sandbox"
    on_path = tmp_path / "dispatch-sandbox"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(stat.S_IRWXU)
    # The one on PATH is this very program: its bare name is what the user typed.
    assert sandbox_cli.invoked_as(str(on_path)) == "dispatch-sandbox"
    assert sandbox_cli.invoked_as("bin/dispatch-sandbox") == "bin/dispatch-sandbox"


def test_the_pasted_line_reaches_the_folder_and_its_job_user(tmp_path: Path) -> None:
    folder = tmp_path / "sb"
    folder.mkdir()
    (folder / "sandbox.json").write_text(json.dumps({"nodes": ["n1"], "user": "alice"}))
    line = sandbox_cli.use_lines("bin/dispatch-sandbox", str(folder), "alice", False)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "SLURM_"))}
    proc = subprocess.run(
        [
            "bash",
            "-c",
            line.split(": ", 1)[1] + '\necho "$SLURM_CONF $DISPATCH_SANDBOX_DIR '
            '$DISPATCH_SANDBOX_USER"',
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == [f"{folder}/etc/slurm.conf", str(folder), "alice"], proc


def test_up_takes_its_job_user_from_the_environment_then_the_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(sandbox_layout.USER_ENV, raising=False)
    assert sandbox_layout.job_user(None, {}) == "dispatchuser"
    assert sandbox_layout.job_user(None, {"user": "bob"}) == "bob"
    monkeypatch.setenv(sandbox_layout.USER_ENV, "alice")
    assert sandbox_layout.job_user(None, {"user": "bob"}) == "alice"
    assert sandbox_layout.job_user("carol", {"user": "bob"}) == "carol"


def test_root_is_refused_as_the_job_user() -> None:
    with pytest.raises(
        SandboxError,
        match=r"job user 'root' is root \(uid 0\): the sandbox's "
        r"jobs run unprivileged.*DISPATCH_SANDBOX_USER",
    ):
        sandbox_machine.ensure_user("root")
