"""The sandbox runs the Slurm release the session selected, all of it
(docs/admin-guide.md, Slurm releases).

``DISPATCH_SANDBOX_SLURM=24.11`` must put the controller, the tools the tests run, the jobs and
the venv they run on inside the Debian 13 root, and leave the host's mount table as it was;
unset, everything is the host's own.  Runs on both releases, asserting each one's facts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import install as sandbox_install
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import root as sandbox_root

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real


def _expected(sandbox: Sandbox) -> tuple[str, str]:
    """(Slurm major release, Python major.minor) the selected release must show."""
    status = sandbox_lib.status(sandbox.dir)
    if status.slurm != sandbox_layout.HOST_RELEASE:
        # What the root holds (the newest row's is whatever its suite shipped), and its Python.
        python = subprocess.run(
            [
                "chroot",
                status.rootfs,
                "/usr/bin/python3",
                "-c",
                "import sys; print('%d.%d' % sys.version_info[:2])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return sandbox_root.held(Path(status.rootfs)), python
    python = subprocess.run(
        [sandbox_install.SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return sandbox_root.host_release(), python


def test_controller_tools_jobs_and_venv_are_the_selected_release(sandbox: Sandbox) -> None:
    release, python = _expected(sandbox)
    assert sandbox.slurm == sandbox_lib.status(sandbox.dir).slurm
    ping = sandbox.run(["scontrol", "ping"]).stdout
    assert " is UP" in ping, ping
    tools = sandbox.run(["sinfo", "--version"]).stdout.split()
    assert tools[-1].startswith(release + "."), tools
    work = sandbox.workdir("release")
    script = (
        "#!/bin/sh\n"
        f"{{ sbatch --version; {sandbox.venv_bin}/python -c "
        "'import sys, slurm_dispatch; print(\"%d.%d\" % sys.version_info[:2])'; "
        f"}} > {work}/seen\n"
    )
    jobid = sandbox.submit(script, f"--chdir={work}", "-o", "/dev/null")
    sandbox.wait_for(
        lambda: sandbox.job_state(jobid).get("JobState") == "COMPLETED", 60, "the job to complete"
    )
    seen = (work / "seen").read_text().split("\n")
    assert seen[0].split()[-1].startswith(release + "."), seen
    assert seen[1] == python, seen
    # The controller says which release it is too (its own record of itself).
    config = sandbox.run(["scontrol", "show", "config"]).stdout.splitlines()
    version = [
        line.partition("=")[2].strip() for line in config if line.startswith("SLURM_VERSION")
    ]
    assert len(version) == 1 and version[0].startswith(release + "."), version


def test_the_hosts_mount_table_is_left_alone(sandbox: Sandbox) -> None:
    status = sandbox_lib.status(sandbox.dir)
    sandbox.run(["sinfo", "-N"], user=sandbox.user)
    host = Path("/proc/self/mountinfo").read_text()
    ctld = next(d for d in status.daemons if d.name == "slurmctld")
    assert ctld.pid is not None
    theirs = Path(f"/proc/{ctld.pid}/mountinfo").read_text()
    if status.rootfs:
        root = status.rootfs
        # The binds exist only in the daemons' own namespace, whose root is the Debian root
        # (mount points there are shown relative to it).
        assert f" {root}/proc " not in host and f" {root}/home " not in host
        assert os.readlink(f"/proc/{ctld.pid}/root") == root
        assert os.readlink(f"/proc/{ctld.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        points = {line.split()[4] for line in theirs.splitlines()}
        assert {"/proc", "/home", "/dev", str(sandbox.dir)} <= points or {
            "/proc",
            "/home",
            "/dev",
            "/var/tmp",
        } <= points, sorted(points)
        assert json.loads((Path(root) / sandbox_root.MARKER).read_text())["release"] == status.slurm
    else:
        # The host's Slurm: the daemons share the host's mount namespace.
        assert os.readlink(f"/proc/{ctld.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
