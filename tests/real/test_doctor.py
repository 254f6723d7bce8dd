"""dispatch-admin doctor on the real sandbox, whose hooks are installed as an admin installs them,
then broken the ways a site breaks them (issue 22 item 1): the Epilog's DISPATCH_PYTHON a Python
without the package (real jobs then record starts and no end, and dispatch-cease says so), a
missing part, an unwritable StateDir, mixed versions.  Each break is undone in a ``finally``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.node import facts
from slurm_dispatch.sandbox import install as sandbox_install

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real
REPO = Path(__file__).resolve().parents[2]


def doctor(sandbox: Sandbox, node: str, *args: str) -> tuple[int, dict]:
    proc = sandbox.run([str(sandbox.venv_bin / "dispatch-admin"), "doctor", "--json",
                        "--node", node, "--slurm-conf", sandbox.env["SLURM_CONF"], *args],
                       check=False, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def venv(sandbox: Sandbox, path: Path) -> None:
    """A bare venv of the Python the sandbox's jobs and hooks have (the Debian root's on
    24.11: a venv of this test's own Python would not run there)."""
    sandbox.run([sandbox_install.SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(path)],
                timeout=120)


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["check"] == name)


def failures(report: dict) -> list[str]:
    return [c["check"] for c in report["checks"] if c["state"] == "FAIL"]


@contextmanager
def edited(path: Path, old: str, new: str) -> Iterator[None]:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    try:
        yield
    finally:
        path.write_text(text)


def test_the_sandbox_as_installed_passes(sandbox: Sandbox) -> None:
    code, report = doctor(sandbox, sandbox.nodes[0], "--controller")
    assert code == 0, report
    assert {c["state"] for c in report["checks"]} == {"ok"}
    for hook in ("Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld"):
        assert "recorded " in check(report, f"{hook} runs")["detail"]
    assert not list((sandbox.dir / "dispatch-state/facts/0").glob("doctor-*"))


def test_a_python_without_the_package_records_no_end_and_is_named(sandbox: Sandbox,
                                                                   tmp_path: Path) -> None:
    bare = Path("/var/tmp") / f"doctor-bare-{sandbox.dir.name}"
    if not (bare / "bin/python").exists():
        venv(sandbox, bare)
    part = sandbox.dir / "etc/epilog.d/05-dispatch"
    python = f"DISPATCH_PYTHON={sandbox.venv_bin / 'python'}"
    node = sandbox.nodes[0]
    state = str(sandbox.dir / "dispatch-state")
    with edited(part, python, f"DISPATCH_PYTHON={bare / 'bin/python'}"):
        code, report = doctor(sandbox, node)
        assert code == 1 and failures(report) == ["Epilog python"], report
        assert "cannot import slurm_dispatch" in check(report, "Epilog python")["detail"]
        assert check(report, "Epilog python")["fix"].startswith(
            f"set DISPATCH_PYTHON= in {part} to the Python that has slurm-dispatch")
        # Real jobs on that node now record a start and never an end.
        first = sandbox.submit("#!/bin/sh\nexit 0\n", "-w", node)
        sandbox.wait_for(lambda: sandbox.job_state(first).get("JobState") == "COMPLETED",
                         60, "the first job ended (its Epilog run)")
        second = sandbox.submit("#!/bin/sh\nexit 0\n", "-w", node)

        def second_started() -> bool:
            found = facts.execution_facts(second, state, sandbox.uid)
            return bool(found and node in found[0]["nodes"])

        sandbox.wait_for(second_started, 60, "the second job's start recorded")
        sandbox.settle()
        ceased = sandbox.run([str(sandbox.venv_bin / "dispatch-cease"), first, "--json"],
                             check=False, timeout=120)
        assert ceased.returncode == 1, (ceased.stdout, ceased.stderr)
        evidence = json.loads(ceased.stdout)["nodes"][0]["evidence"]
        assert evidence.startswith("no post-kill record"), evidence
        assert f"{node} has recorded no end for any job since " in evidence
        assert "its Epilog is likely not installed or not working" in evidence
    code, report = doctor(sandbox, node)
    assert code == 0, report


def test_a_missing_part_is_named(sandbox: Sandbox) -> None:
    part = sandbox.dir / "etc/epilog.d/05-dispatch"
    aside = sandbox.dir / "etc/05-dispatch.epilog-aside"
    shutil.move(part, aside)
    try:
        code, report = doctor(sandbox, sandbox.nodes[0], "--controller")
    finally:
        shutil.move(aside, part)
    assert code == 1
    assert failures(report) == ["Epilog", "EpilogSlurmctld"]
    assert "runs no slurm-dispatch part (the glob matches nothing)" in \
        check(report, "Epilog")["detail"]
    assert f"{part} is missing" in check(report, "EpilogSlurmctld")["detail"]
    assert check(report, "Epilog")["fix"].startswith("install contrib/epilog.d/05-dispatch as ")


def test_an_unwritable_state_dir_is_named(sandbox: Sandbox) -> None:
    state = sandbox.dir / "dispatch-state"
    mode = state.stat().st_mode & 0o7777
    state.chmod(0o1777)
    try:
        code, report = doctor(sandbox, sandbox.nodes[0])
    finally:
        state.chmod(mode)
    assert code == 1
    assert "writable by group or others" in check(report, "StateDir")["detail"]
    runs = check(report, "Prolog runs")
    assert runs["state"] == "FAIL" and "but no start fact" in runs["detail"]
    assert "refusing to use it" in runs["detail"]


def test_mixed_versions_are_named(sandbox: Sandbox) -> None:
    old = Path("/var/tmp") / f"doctor-old-{sandbox.dir.name}"
    if old.exists():
        shutil.rmtree(old)
    shutil.copytree(REPO / "slurm_dispatch", old / "src/slurm_dispatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = old / "src/slurm_dispatch/__init__.py"
    text = init.read_text()
    init.write_text(text.replace('__version__ = "', '__version__ = "0.0.9-', 1))
    venv(sandbox, old / "venv")
    (next((old / "venv/lib").glob("python3*")) / "site-packages/old.pth").write_text(
        f"{old / 'src'}\n")
    part = sandbox.dir / "etc/prolog.d/05-dispatch"
    python = f"DISPATCH_PYTHON={sandbox.venv_bin / 'python'}"
    try:
        with edited(part, python, f"DISPATCH_PYTHON={old / 'venv/bin/python'}"):
            code, report = doctor(sandbox, sandbox.nodes[0], "--controller")
    finally:
        shutil.rmtree(old)
    assert code == 1 and failures(report) == ["versions"], report
    assert f"{part} 0.0.9-" in check(report, "versions")["detail"]
    assert check(report, "PrologSlurmctld runs")["state"] == "ok"
