"""dispatch-admin doctor on the real sandbox, whose hooks are installed as an admin installs them,
then broken the ways a site breaks them (docs/admin-guide.md, verify): the Epilog's DISPATCH_PYTHON
a Python without the package (real jobs then record starts and no end, and dispatch-cease says so),
a missing part, an unwritable StateDir, mixed versions.  Each break is undone in a ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.node import facts, metrics
from slurm_dispatch.sandbox import clients as sandbox_clients
from slurm_dispatch.sandbox import install as sandbox_install
from tests.hooks.test_doctor import counting_in
from tests.real.test_cease import cease, wait_cease

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real
REPO = Path(__file__).resolve().parents[2]
UNCONFIGURED = metrics.UNCONFIGURED_FILE  # where parts that find no dispatch.conf count runs


def doctor(
    sandbox: Sandbox, node: str, *args: str, prefix: tuple[str, ...] = ()
) -> tuple[int, dict]:
    """The doctor's report, run as sandbox.run runs a command (after ``prefix`` when given,
    which this machine runs before the command enters the sandbox's Debian root, if any)."""
    argv = [
        str(sandbox.venv_bin / "dispatch-admin"),
        "doctor",
        "--json",
        "--node",
        node,
        "--slurm-conf",
        sandbox.env["SLURM_CONF"],
        *args,
    ]
    if prefix:
        proc = subprocess.run(
            [*prefix, *sandbox_clients.command(argv, sandbox.dir)],
            env=sandbox.env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    else:
        proc = sandbox.run(argv, check=False, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def venv(sandbox: Sandbox, path: Path) -> None:
    """A bare venv of the Python the sandbox's jobs and hooks have (the Debian root's on
    24.11: a venv of this test's own Python would not run there)."""
    sandbox.run(
        [sandbox_install.SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(path)], timeout=120
    )


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
    # Runs counted on this machine before, where the nodes count them (the host's /run on the
    # host's Slurm, the Debian root's own /run on another release), by other sandboxes' parts
    # without dispatch.conf: the doctor rightly warns of them; the sandbox's parts add none.
    counted = sandbox.seen(f"/run/slurm-dispatch/{UNCONFIGURED}")
    before = counted.read_text() if counted.exists() else None
    code, report = doctor(sandbox, sandbox.nodes[0], "--controller")
    assert code == 0, report
    seen = {c["check"]: c["state"] for c in report["checks"]}
    if before is not None:
        assert (counted.read_text() if counted.exists() else None) == before
        seen.pop("unconfigured runs", None)
    assert set(seen.values()) == {"ok"}, report
    for hook in ("Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld"):
        assert "recorded " in check(report, f"{hook} runs")["detail"]
    assert not list((sandbox.dir / "dispatch-state/facts/0").glob("doctor-*"))


def test_a_python_without_the_package_records_no_end_and_is_named(
    sandbox: Sandbox, tmp_path: Path
) -> None:
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
            f"set DISPATCH_PYTHON= in {part} to the Python that has slurm-dispatch"
        )
        # Real jobs on that node now record a start and never an end.
        first = sandbox.submit("#!/bin/sh\nexit 0\n", "-w", node)
        sandbox.wait_for(
            lambda: sandbox.job_state(first).get("JobState") == "COMPLETED",
            60,
            "the first job ended (its Epilog run)",
        )
        second = sandbox.submit("#!/bin/sh\nexit 0\n", "-w", node)

        def second_started() -> bool:
            found = facts.execution_facts(second, state, sandbox.uid)
            return bool(found and node in found[0]["nodes"])

        sandbox.wait_for(second_started, 60, "the second job's start recorded")
        sandbox.settle()
        ceased = sandbox.run(
            [str(sandbox.venv_bin / "dispatch-cease"), first, "--json"], check=False, timeout=120
        )
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
    assert (
        "runs no slurm-dispatch part (the glob matches nothing)"
        in check(report, "Epilog")["detail"]
    )
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
    shutil.copytree(
        REPO / "slurm_dispatch",
        old / "src/slurm_dispatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    init = old / "src/slurm_dispatch/__init__.py"
    text = init.read_text()
    init.write_text(text.replace('__version__ = "', '__version__ = "0.0.9-', 1))
    venv(sandbox, old / "venv")
    (next((old / "venv/lib").glob("python3*")) / "site-packages/old.pth").write_text(
        f"{old / 'src'}\n"
    )
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


def test_parts_that_find_no_dispatch_conf_fail_and_an_install_as_the_guide_says_records(
    sandbox: Sandbox,
) -> None:
    """The sandbox's slurm.conf is not /etc/slurm/slurm.conf (as with Slurm
    built from source), and dispatch.conf is beside it.  With DISPATCH_CONF left empty in the
    parts (the admin guide allowed it: "only if dispatch.conf is elsewhere"), slurmctld's
    PrologSlurmctld and EpilogSlurmctld and slurmd's HealthCheckProgram, which Slurm gives no
    SLURM_CONF, look in /etc/slurm and record nothing in the site's StateDir, while the doctor
    said every check passed.  Installed as the guide now says (DISPATCH_CONF set), the
    controller records each execution and the re-check proves a survivor gone."""
    etc = sandbox.dir / "etc"
    conf = etc / "dispatch.conf"
    assert sandbox.env["SLURM_CONF"] == str(etc / "slurm.conf") and conf.is_file()
    assert not Path("/etc/slurm/dispatch.conf").exists()
    parts = [etc / "prolog.d/05-dispatch", etc / "epilog.d/05-dispatch", etc / "dispatch-recheck"]
    # Where the nodes have the default StateDir, the parts record there (what they make is
    # removed again), else they count their runs in the nodes' /run/slurm-dispatch: here a
    # folder of this test's own (counting_in), not the one every doctor run on this machine
    # (or in this Debian root) reads.
    made = sandbox.seen("/var/lib/slurm-dispatch/facts")
    existed = made.exists()
    seen = sandbox.seen(f"/run/slurm-dispatch/{UNCONFIGURED}")
    before = seen.read_text() if seen.exists() else None

    def controllers() -> list[str]:  # the series only the doctor's runs count in this window
        text = seen.read_text() if seen.exists() else ""
        return [
            line
            for line in text.splitlines()
            if '{hook="prolog-slurmctld"}' in line or '{hook="epilog-slurmctld"}' in line
        ]

    counted_before = controllers()
    counts = sandbox.dir / "unconfigured-counts"
    shutil.rmtree(counts, ignore_errors=True)
    counts.mkdir(mode=0o755)
    counts.chmod(0o755)
    try:
        with ExitStack() as stack:
            for part in parts:
                stack.enter_context(edited(part, f"DISPATCH_CONF={conf}\n", "DISPATCH_CONF=\n"))
            prefix = stack.enter_context(counting_in(counts, sandbox.seen("/run/slurm-dispatch")))
            code, report = doctor(sandbox, sandbox.nodes[0], "--controller", prefix=tuple(prefix))
        # Nothing of the doctor's left where the nodes count (a count there failed the next
        # doctor run's test).
        assert controllers() == counted_before
    finally:
        if not existed and made.is_dir():
            for folder in sorted(made.rglob("*"), reverse=True) + [made]:
                folder.rmdir()
        # slurmd's own re-check ran the edited part every HealthCheckInterval meanwhile, in the
        # nodes' namespace, and counted there where no default StateDir exists (in a Debian
        # root): once none of the runs started before the part was put back is left, what
        # they counted is taken back.
        restored = _since_boot()
        sandbox.wait_for(
            lambda: (
                not any(
                    str(parts[2]) in _cmdline(p) and _started(p) <= restored
                    for p in Path("/proc").iterdir()
                    if p.name.isdigit()
                )
            ),
            60,
            "slurmd's runs of the edited re-check to end",
        )
        if before is None:
            seen.unlink(missing_ok=True)
        else:
            seen.write_text(before)
    if not existed:
        assert "slurm_dispatch_hook_runs_unconfigured_total" in (counts / UNCONFIGURED).read_text()
    assert code == 1, report
    assert {"PrologSlurmctld config", "EpilogSlurmctld config", "HealthCheckProgram config"} <= set(
        failures(report)
    ), report
    assert "Prolog config" not in failures(report)  # slurmd gives the Prolog SLURM_CONF
    found = check(report, "PrologSlurmctld config")
    assert (
        "slurmctld gives PrologSlurmctld no SLURM_CONF, so it reads "
        "/etc/slurm/dispatch.conf" in found["detail"]
    ), found
    assert found["fix"] == f"set DISPATCH_CONF={conf} at the top of {parts[0]}", found
    # As installed (DISPATCH_CONF set): the doctor passes, and a real job is recorded by the
    # controller and its survivor proven gone by the node's re-check.
    code, report = doctor(sandbox, sandbox.nodes[0], "--controller")
    assert code == 0, report
    node = sandbox.nodes[0]
    marker = 60000 + os.getpid() % 5000  # the survivor's sleep, this test's own
    job = sandbox.submit(
        f"#!/bin/sh\n(setsid sleep {marker} </dev/null >/dev/null 2>&1 &)\nexit 0\n", "-w", node
    )
    sandbox.wait_for(
        lambda: sandbox.job_state(job).get("JobState") == "COMPLETED", 60, "the job ended"
    )
    folder = sandbox.dir / "dispatch-state/facts" / str(sandbox.uid) / job

    def recorded() -> list[str]:
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        return sorted(n.split(".")[0] for n in names if n.startswith("ctld-"))

    sandbox.wait_for(
        lambda: recorded() == ["ctld-end", "ctld-start"],
        60,
        "the controller's start and end of the job",
    )
    survivors = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _cmdline(p) == f"sleep\0{marker}\0"
    ]
    assert survivors, "the job's escaped sleep is not running"
    rc, verdict = cease(sandbox, job)
    assert rc == 1 and verdict["nodes"][0]["survivors"], verdict
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    verdict = wait_cease(sandbox, job, 0, timeout=60)
    assert "all gone" in verdict["nodes"][0]["evidence"], verdict


def _since_boot() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _started(proc: Path) -> float:
    """When the process started, in seconds since boot (never, for one already gone)."""
    try:
        after_name = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        return int(after_name[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("inf")


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_text(errors="replace")
    except OSError:
        return ""
