"""Survivors that hide from one pass over /proc, and another user's impostor, on the real
sandbox: a job that leaves a PID hopper ``(setsid <hopper> &)`` and a thread group whose leader
exited is "not proven" while they run and "ceased" once they are killed and the node's re-check
ran; another user's ``env SLURM_JOB_ID=<job> sleep 600`` does not keep the job unproven; a
process started with the environment the user guide's container advice passes (``env -i`` keeping
exactly what its ``--env-file`` filter keeps, as ``apptainer exec --cleanenv`` does) and escaped
from the job is named by the Epilog.
"""

from __future__ import annotations

import functools
import os
import pwd
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.real.test_cease import cease, wait_cease

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real

PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]
OTHER_USER = "dispatch-other"

# Fork, the parent exits, again, for ever; each generation appends to a file.  The first one
# writes its session id (setsid made it a session leader) so that the test can end them all.
HOPPER = """
import os, sys, time
out, marker = sys.argv[1], sys.argv[2]
with open(out + ".sid", "w") as f:
    f.write(str(os.getsid(0)))
while True:
    with open(out, "a") as f:
        f.write("hop\\n")
    time.sleep(0.001)
    if os.fork():
        os._exit(0)
"""

# The main thread leaves with SYS_exit; the second thread keeps writing.
LEADER = """
import ctypes, sys, threading, time
out, marker = sys.argv[1], sys.argv[2]
def work():
    while True:
        with open(out, "a") as f:
            f.write("thread\\n")
        time.sleep(0.2)
threading.Thread(target=work).start()
ctypes.CDLL(None).syscall(60, 0)
"""


def _writing(path: Path, seconds: float = 10) -> bool:
    """Whether ``path`` grows within ``seconds``."""
    size = path.stat().st_size if path.exists() else 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > size:
            return True
        time.sleep(0.1)
    return False


def _script(workdir: Path, name: str, code: str, marker: str) -> str:
    program = workdir / f"{name}.py"
    program.write_text(code)
    os.chmod(program, 0o644)
    out = workdir / f"{name}.out"
    return (
        f"#!/bin/sh\n(setsid {PYTHON} {program} {out} {marker} </dev/null >/dev/null 2>&1 &)\n"
        "sleep 300\n"
    )


def test_hopper_and_thread_leader_are_not_proven_until_killed(sandbox: Sandbox) -> None:
    workdir = sandbox.workdir("hiders")
    marker = f"hider-{os.getpid()}-{time.monotonic_ns()}"
    hopper = sandbox.submit(_script(workdir, "hopper", HOPPER, marker), "-w", "n1")
    leader = sandbox.submit(_script(workdir, "leader", LEADER, marker), "-w", "n2")
    hop_out, lead_out = workdir / "hopper.out", workdir / "leader.out"
    sandbox.wait_for(
        lambda: _writing(hop_out, 1) and _writing(lead_out, 1), 60, "both jobs' hiders writing"
    )
    sandbox.run(["scancel", hopper, leader])
    try:
        for jobid, out in ((hopper, hop_out), (leader, lead_out)):
            sandbox.wait_for(
                functools.partial(_unproven_with_survivors, sandbox, jobid),
                60,
                f"job {jobid} not proven, its survivors named",
            )
            assert _writing(out), f"{out} stopped: nothing to find"
            # Still unproven while they write, across re-checks (every 5 s in the sandbox).
            time.sleep(6)
            assert _unproven_with_survivors(sandbox, jobid), cease(sandbox, jobid)
    finally:
        sid = int((workdir / "hopper.out.sid").read_text())
        os.killpg(sid, signal.SIGKILL)  # the hopper's session: every generation
        for pid in _pids_with_marker(marker):
            os.kill(pid, signal.SIGKILL)
    assert not _writing(hop_out, 2) and not _writing(lead_out, 2)
    for jobid in (hopper, leader):
        verdict = wait_cease(sandbox, jobid, 0, timeout=60)
        assert "all gone" in verdict["nodes"][0]["evidence"], verdict


def _unproven_with_survivors(sandbox: Sandbox, jobid: str) -> dict | None:
    rc, verdict = cease(sandbox, jobid)
    if (
        rc == 1
        and verdict["job_state"] == "CANCELLED"
        and any(n["survivors"] for n in verdict["nodes"])
    ):
        return verdict
    return None


def _pids_with_marker(marker: str) -> list[int]:
    """This test's own leftover processes (their command line carries its marker; a thread
    group whose leader exited shows it only in its live threads' command lines)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            tasks = os.listdir(f"/proc/{name}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                if marker.encode() in Path(f"/proc/{name}/task/{tid}/cmdline").read_bytes():
                    found.append(int(name))
                    break
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def other_user() -> str:
    """A second local user (created once on this machine if missing)."""
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", OTHER_USER],
            check=True,
        )
    return OTHER_USER


def test_another_users_impostor_does_not_keep_the_job_unproven(
    sandbox: Sandbox, other_user: str
) -> None:
    workdir = sandbox.workdir("impostor")
    jobid = sandbox.submit(f"#!/bin/sh\ntouch {workdir}/ready\nsleep 300\n", "-w", "n1")
    sandbox.wait_for(lambda: (workdir / "ready").exists(), 60, "the victim running")
    impostor = subprocess.Popen(
        [
            "runuser",
            "-u",
            other_user,
            "--",
            "env",
            "-i",
            f"SLURM_JOB_ID={jobid}",
            "SLURMD_NODENAME=n1",
            "sleep",
            "600",
        ],
        start_new_session=True,
        cwd="/",
    )
    try:
        sandbox.wait_for(
            lambda: (
                f"SLURM_JOB_ID={jobid}".encode()
                in b"".join(_environ(p) for p in _children(impostor.pid))
            ),
            30,
            "the impostor's sleep",
        )
        sandbox.run(["scancel", jobid])
        verdict = wait_cease(sandbox, jobid, 0, timeout=60)
        assert verdict["job_state"] == "CANCELLED"
        assert "no process left after the kill" in verdict["nodes"][0]["evidence"], verdict
        assert impostor.poll() is None  # it was there all along
    finally:
        os.killpg(impostor.pid, signal.SIGKILL)
        impostor.wait()


def _children(pid: int) -> list[int]:
    try:
        return [
            pid,
            *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()),
        ]
    except OSError:
        return [pid]


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _container_filter() -> str:
    """The command the user guide's container section feeds ``--env-file`` (``env | grep ...``)."""
    guide = (REPO / "docs/user-guide.md").read_text()
    section = guide[guide.index("## Jobs whose steps run in a container") :]
    found = re.search(r"--env-file <\((env \| grep .+?)\)[\s\\]*image\.sif", section)
    assert found, "the container section no longer gives an --env-file <(env | grep ...) filter"
    return found.group(1)


def test_container_advice_keeps_an_escaped_process_visible(sandbox: Sandbox) -> None:
    """A process started in the environment the guide's container advice leaves (``--cleanenv``
    with its ``--env-file`` filter: here ``env -i`` keeping exactly the lines the filter keeps)
    in a requeued job's second execution escapes the job (setsid, its parent exits) and outlives
    it: the Epilog's scan names it as that execution's, so the job is not proven ceased while it
    runs (a shared job's hold stays).  With ``grep ^DISPATCH_`` alone it was proven ceased."""
    workdir = sandbox.workdir("container")
    marker = f"contained-{os.getpid()}-{time.monotonic_ns()}"
    script = (
        "#!/bin/bash\n"
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then\n'
        f"  touch {workdir}/running.0; exec sleep 300\n"
        "fi\n"
        f"{_container_filter()} > {workdir}/env.$SLURM_JOB_ID\n"
        f"mapfile -t kept < {workdir}/env.$SLURM_JOB_ID\n"
        f'env -i "${{kept[@]}}" /usr/bin/setsid /bin/sh -c \'{PYTHON} -c '
        f'"import time; time.sleep(300)" {marker} </dev/null >/dev/null 2>&1 &\'\n'
        "sleep 1\n"
    )
    jobid = sandbox.submit(script, "--requeue", "-w", "n1")
    try:
        sandbox.wait_for(lambda: (workdir / "running.0").exists(), 60, "the first execution")
        sandbox.run(["scontrol", "requeue", jobid])
        sandbox.wait_for(
            lambda: _pids_with_marker(marker),
            90,
            "the second execution's contained process running",
        )
        sandbox.wait_for(
            lambda: sandbox.job_state(jobid).get("JobState") == "COMPLETED", 30, "the job completed"
        )
        rc, verdict = sandbox.wait_for(
            lambda: (
                lambda r: r if r[0] == 0 or any(n["survivors"] for n in r[1]["nodes"]) else None
            )(cease(sandbox, jobid, 1)),
            60,
            "the Epilog's answer",
        )
        kept = (workdir / f"env.{jobid}").read_text().split()
        assert _pids_with_marker(marker), "the contained process ended: nothing to find"
        assert rc == 1, (
            f"the Epilog did not see the process the advice started; it kept {kept}: {verdict}"
        )
        assert "SLURM_RESTART_COUNT=1" in kept and f"SLURM_JOB_ID={jobid}" in kept, kept
        survivors = [s for n in verdict["nodes"] for s in n["survivors"]]
        assert any(marker in s["cmdline"] for s in survivors), verdict
    finally:
        for pid in _pids_with_marker(marker):
            os.kill(pid, signal.SIGKILL)
    verdict = wait_cease(sandbox, jobid, 0, restart=1, timeout=60)
    assert "all gone" in verdict["nodes"][0]["evidence"], verdict
