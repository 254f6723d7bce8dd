"""The guides' install, followed literally on the sandbox, whose slurm.conf is not in /etc/slurm
(docs/admin-guide.md, install): the wheel of ``make dist`` in a venv of Debian's
``/usr/bin/python3`` (the admin guide's step 1), a StateDir of its own (step 2), the shipped
``dispatch.conf`` copied beside slurm.conf (step 3), the shipped parts with their knobs set as step
4 says (``DISPATCH_PYTHON``, and ``DISPATCH_CONF``, since slurm.conf is elsewhere), the slurm.conf
lines of step 5 (the sandbox's own site.conf, checked against the shipped ones); then a user
who installs the wheel as the user guide says and runs the supervisor as the shipped unit runs
it (its ``ExecStart`` and ``PATH``, ``%h`` their home, the site's ``SLURM_CONF`` as the
unit's comment says, nothing else of their shell).  It gives controller facts, a re-check
that proves an escaped process gone, and a shared hold that lifts by itself.

What the sandbox installed is put back at the end (its parts and dispatch.conf), so the
session's other tests find it as before.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from slurm_dispatch.sandbox import install as sandbox_install
from tests.real.test_upgrade_in_place import build_wheel

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
# What `make dist` builds the wheel from (pyproject.toml's packages and data files).
WHEEL_SOURCES = (
    "pyproject.toml",
    "README.md",
    "slurm_dispatch",
    "docs/man",
    "contrib/completion",
    "contrib/systemd",
)
PARTS = {
    "contrib/prolog.d/05-dispatch": "prolog.d/05-dispatch",
    "contrib/epilog.d/05-dispatch": "epilog.d/05-dispatch",
    "site-config/dispatch-recheck": "dispatch-recheck",
}


@pytest.fixture(scope="module")
def site_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `make dist` makes (built from a copy: a build in the checkout leaves build/
    there, and `make dist` empties the checkout's dist/, which another test may be reading),
    the sandbox left out as tools/site_wheel.py leaves it out."""
    base = tmp_path_factory.mktemp("guide-wheel")
    for name in WHEEL_SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source,
                base / "src" / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
            )
        else:
            (base / "src" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, base / "src" / name)
    wheel = build_wheel(base / "src", base / "dist")
    made = subprocess.run(
        [sys.executable, str(REPO / "tools/site_wheel.py"), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return wheel


def installed_venv(sandbox: Sandbox, venv: Path, wheel: Path, user: str | None = None) -> Path:
    """``python3 -m venv VENV && VENV/bin/pip install WHEEL``, Debian's python3, as ``user``."""
    shutil.rmtree(venv, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix="guide-wheel-", dir="/var/tmp"))  # seen by all
    folder.chmod(0o755)
    shutil.copy2(wheel, folder / wheel.name)  # pip reads the wheel's own file name
    (folder / wheel.name).chmod(0o644)
    try:
        sandbox.run(["mkdir", "-p", str(venv.parent)], user=user, cwd=Path("/"))
        sandbox.run(
            [sandbox_install.SYSTEM_PYTHON, "-m", "venv", str(venv)],
            user=user,
            cwd=venv.parent,
            timeout=180,
        )
        sandbox.run(
            [
                str(venv / "bin/pip"),
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-input",
                str(folder / wheel.name),
            ],
            user=user,
            cwd=venv.parent,
            timeout=600,
        )
    finally:
        shutil.rmtree(folder)
    return venv


@pytest.fixture
def installed(sandbox: Sandbox, site_wheel: Path) -> Iterator[dict[str, Path]]:
    """The admin guide's steps 1 to 5 on the sandbox; its own parts and dispatch.conf are put
    back afterwards."""
    etc = sandbox.dir / "etc"
    slurm_conf = Path(sandbox.env["SLURM_CONF"])
    assert slurm_conf.parent == etc and not str(slurm_conf).startswith("/etc/slurm/")
    guide = Path("/var/tmp") / f"guide-{sandbox.dir.name}"  # seen by the nodes (a bound folder)
    kept = {
        path: path.read_bytes()
        for path in [etc / "dispatch.conf", *(etc / t for t in PARTS.values())]
    }
    modes = {path: path.stat().st_mode & 0o7777 for path in kept}
    try:
        # 1. The package: the wheel, in a venv of Debian's python3.
        guide.mkdir(mode=0o755, exist_ok=True)
        venv = installed_venv(sandbox, guide / "slurm-dispatch", site_wheel)
        # 2. StateDir, root's, writable by nobody else (a fresh one: what it holds is this
        #    install's alone).
        state = guide / "state"
        shutil.rmtree(state, ignore_errors=True)
        subprocess.run(
            ["install", "-d", "-o", "root", "-g", "root", "-m", "0755", str(state)], check=True
        )
        # 3. dispatch.conf: the shipped one, beside slurm.conf, edited: its StateDir, and a
        #    question every few seconds rather than every minute (a test waits for it).
        text = (REPO / "site-config/dispatch.conf").read_text()
        text, count = re.subn(r"(?m)^StateDir=.*$", f"StateDir={state}", text)
        text, more = re.subn(r"(?m)^CessationInterval=.*$", "CessationInterval=5", text)
        assert count == more == 1
        (etc / "dispatch.conf").write_text(text)
        # 4. The parts, mode 0755, root's, with their knobs set: DISPATCH_PYTHON, and
        #    DISPATCH_CONF since dispatch.conf is not /etc/slurm/dispatch.conf.
        for source, target in PARTS.items():
            text = (REPO / source).read_text()
            text, count = re.subn(
                r"(?m)^DISPATCH_PYTHON=\S*", f"DISPATCH_PYTHON={venv}/bin/python", text
            )
            text, more = re.subn(r"(?m)^DISPATCH_CONF=", f"DISPATCH_CONF={etc}/dispatch.conf", text)
            assert count == more == 1, source
            (etc / target).write_text(text)
            (etc / target).chmod(0o755)
        # 5. slurm.conf has the shipped lines, with the parts' paths where this install put
        #    them (the sandbox's site.conf): each hook key, and PrologFlags=Alloc.
        shipped = dict(
            line.split("=", 1)
            for line in (REPO / "site-config/slurm.conf.dispatch").read_text().splitlines()
            if line and not line.startswith("#")
        )
        has = dict(
            line.split("=", 1)
            for line in (etc / "site.conf").read_text().splitlines()
            if line and not line.startswith("#")
        )
        for key in (
            "Prolog",
            "Epilog",
            "PrologSlurmctld",
            "EpilogSlurmctld",
            "HealthCheckProgram",
            "PrologFlags",
        ):
            assert has[key] == shipped[key].replace("/etc/slurm", str(etc)), key
        yield {"venv": venv, "state": state, "wheel": site_wheel}
    finally:
        for path, data in kept.items():
            path.write_bytes(data)
            path.chmod(modes[path])
        shutil.rmtree(guide, ignore_errors=True)  # the install's venv and StateDir


def unit_command(home: Path, venv: Path, slurm_conf: str) -> list[str]:
    """The wheel's dispatch-supervise.service as systemd runs it for a user whose home is
    ``home``: its ExecStart, with its Environment= lines and the site's SLURM_CONF (the unit's
    comment: "your site's settings (SLURM_CONF, if any, as another Environment= line)"), and
    nothing of the user's shell."""
    unit = (venv / "share/slurm-dispatch/systemd/dispatch-supervise.service").read_text()
    (start,) = re.findall(r"(?m)^ExecStart=(.*)$", unit)
    settings = re.findall(r"(?m)^Environment=(\S+)$", unit)
    environ = [s.replace("%h", str(home)) for s in settings]
    return [
        "env",
        "-i",
        f"HOME={home}",
        "LOGNAME=" + home.owner(),
        "USER=" + home.owner(),
        *environ,
        f"SLURM_CONF={slurm_conf}",
        *shlex.split(start.replace("%h", str(home))),
    ]


TRAIN = """#!/bin/bash
#SBATCH --time=5
#DISPATCH --checkpoint {home}/ck-$USER
(setsid sleep {marker} </dev/null >/dev/null 2>&1 &)
if [ -n "$DISPATCH_RESUME_FROM" ]; then echo "resumed from $DISPATCH_RESUME_FROM"; exit 0; fi
mkdir -p "$DISPATCH_EXEC_DIR/checkpoint-1" && echo 1 > "$DISPATCH_EXEC_DIR/checkpoint-1/x"
dispatch publish --step 1 "$DISPATCH_EXEC_DIR/checkpoint-1"
exit 1
"""


def test_the_guides_install_gives_controller_facts_rechecks_and_a_hold_that_lifts(
    sandbox: Sandbox, installed: dict[str, Path]
) -> None:
    venv, state = installed["venv"], installed["state"]
    # Verify (the admin guide): the doctor of the installed venv passes, node and controller
    # (where the nodes run: in the Debian root of another release).
    for args in ([], ["--controller", "--no-node"]):
        proc = sandbox.run(
            [str(venv / "bin/dispatch-admin"), "doctor", "--node", sandbox.nodes[0], *args],
            check=False,
            timeout=180,
            cwd=Path("/"),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # The user: a home of this test's own (%h), the wheel in ~/.venvs/dispatch.
    home = Path(
        sandbox.run(
            ["mktemp", "-d", f"{sandbox.home}/guide.XXXXXX"], user=sandbox.user
        ).stdout.strip()
    )
    user_venv = installed_venv(
        sandbox, home / ".venvs/dispatch", installed["wheel"], user=sandbox.user
    )
    marker = 61000 + os.getpid() % 4000
    (home / "train.sh").write_text(TRAIN.format(home=home, marker=marker))
    shutil.chown(home / "train.sh", sandbox.user)
    shell = [
        "env",
        f"HOME={home}",
        f"PATH={user_venv}/bin:/usr/local/bin:/usr/bin:/bin",
        f"SLURM_CONF={sandbox.env['SLURM_CONF']}",
    ]
    try:
        said = sandbox.run(
            [
                *shell,
                "dispatch-sbatch",
                "--parsable",
                "--shared-checkpoint",
                "--resubmit",
                "1",
                "train.sh",
            ],
            user=sandbox.user,
            cwd=home,
        )
        job = said.stderr.split("Dispatch job ")[1].split()[0]
        first = said.stdout.strip().split(";")[0]
        sandbox.wait_for(
            lambda: sandbox.job_state(first).get("JobState") == "FAILED",
            90,
            "the first submission to fail",
        )
        facts = state / "facts" / str(sandbox.uid) / first

        def recorded(kind: str) -> list[str]:
            return sorted(p.name for p in facts.glob(f"{kind}.*")) if facts.is_dir() else []

        # Controller facts, the node's start and end (with the escaped sleep as a survivor).
        sandbox.wait_for(
            lambda: recorded("ctld-start") and recorded("ctld-end") and recorded("end"),
            60,
            "the controller's and the node's facts",
        )
        survivors = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _cmdline(p) == f"sleep\0{marker}\0"
        ]
        assert survivors, "the job's escaped sleep is not running"
        unit = unit_command(home, user_venv, sandbox.env["SLURM_CONF"])
        passes: list[subprocess.CompletedProcess[str]] = []

        def supervised() -> subprocess.CompletedProcess[str]:
            passes.append(sandbox.run(unit, user=sandbox.user, cwd=home, check=False, timeout=180))
            return passes[-1]

        def status() -> dict[str, Any]:
            out = sandbox.run(
                [*shell, "dispatch", "status", "--json", job], user=sandbox.user, cwd=home
            ).stdout
            return dict(json.loads(out))

        def events(kind: str) -> list[dict[str, Any]]:
            return [e for e in status()["events"] if e["event"] == kind]

        made = supervised()
        assert made.returncode == 0, (made.stdout, made.stderr)  # the unit's pass ran
        (hold,) = events("hold")
        held = str(hold["slurm_job_id"])
        assert sandbox.job_state(held).get("Reason") == "JobHeldUser"
        (answer,) = events("cessation")
        assert answer["verdict"] == "not ceased", answer  # the sleep runs on
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        sandbox.wait_for(
            lambda: recorded("recheck"), 60, "the node's re-check to record the survivor gone"
        )

        def lifted() -> list[dict[str, Any]]:
            supervised()
            return events("released")

        (released,) = sandbox.wait_for(
            lifted, 90, "the hold lifted by a pass of the unit", interval=1
        )
        assert released["by"] == "cessation signal", released
        assert [e["verdict"] for e in events("cessation")][-1] == "ceased"
        assert all(p.returncode == 0 for p in passes), [(p.stdout, p.stderr) for p in passes]
        sandbox.wait_for(
            lambda: sandbox.job_state(held).get("JobState") == "COMPLETED",
            90,
            "the released submission to resume and complete",
        )
    finally:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _cmdline(entry) == f"sleep\0{marker}\0":
                os.kill(int(entry.name), signal.SIGKILL)
        sandbox.settle()
        shutil.rmtree(home, ignore_errors=True)  # the user's venv, root and records


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_text(errors="replace")
    except OSError:
        return ""
