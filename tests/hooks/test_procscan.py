"""The survivor scan against real processes that try, or happen, to hide from one /proc pass:
a thread-group leader whose main thread exited, a PID hopper, an environment over 1 MiB, another
user's process that claims the job, and the job's cgroup where proctrack/cgroup keeps one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_dispatch.node import procscan

PATH = {"PATH": "/usr/bin:/bin"}

# The main thread leaves with SYS_exit (60 on x86_64): the thread group lives on in its second
# thread, the leader reads as a zombie with an empty environ.
THREAD_LEADER = """
import ctypes, sys, threading, time
def work():
    while True:
        time.sleep(0.05)
threading.Thread(target=work).start()
print("ready", flush=True)
ctypes.CDLL(None).syscall(60, 0)
"""

# Fork, the parent exits, again, for ever: no PID lives long.
HOPPER = """
import os, sys
sys.stdout.write("ready\\n"); sys.stdout.flush(); os.close(1)
while True:
    if os.fork():
        os._exit(0)
"""


def job_id() -> str:
    return f"7{os.getpid()}{time.monotonic_ns() % 100000}"


def _wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _start(code: str, env: dict[str, str], user: str | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", code],
        env={**PATH, **env},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        user=user,
        cwd="/",
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.fixture()
def reaper() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _state(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2]


def test_a_thread_group_whose_leader_exited_is_found(reaper: list) -> None:
    job = job_id()
    proc = _start(THREAD_LEADER, {"SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": "1"})
    reaper.append(proc)
    _wait(lambda: _state(proc.pid) == "Z", 5, "the leader to exit")
    try:  # depending on the kernel: empty, or "no such process"
        assert Path(f"/proc/{proc.pid}/environ").read_bytes() == b""
    except ProcessLookupError:
        pass
    found = procscan.scan_survivors({job: 1})[job]
    assert [s["pid"] for s in found] == [proc.pid]
    assert found[0]["state"] != "Z" and found[0]["restart"] == 1
    assert "syscall(60" in found[0]["cmdline"] or "python" in found[0]["cmdline"]


def test_a_pid_hopper_is_found_every_time(reaper: list) -> None:
    job = job_id()
    proc = _start(HOPPER, {"SLURM_JOB_ID": job})
    reaper.append(proc)
    trials, found_in, slowest, deadline = 100, 0, 0.0, 2.0
    for _ in range(trials):
        started = time.monotonic()
        result = procscan.scan({job: None}, seconds=deadline)
        slowest = max(slowest, time.monotonic() - started)
        found = result.found[job]
        if found:
            found_in += 1
            # (A process read just as it exits has an empty command line.)
            assert all(
                s["cmdline"].startswith(sys.executable) or not s["cmdline"] for s in found
            ), found
        # A scan that met its deadline (a loaded machine: other processes came and went in
        # every round) says it is not complete and names what it could not read.
        assert result.complete or result.unresolved, result
    assert found_in == trials, f"found in {found_in} of {trials} scans"
    # The scan stops at its deadline (a round past it at most), never runs on with the hopper.
    assert slowest < deadline + 1.0, f"a scan took {slowest:.2f} s"


def test_an_environment_over_one_mib_is_read_to_its_end(reaper: list) -> None:
    job = job_id()
    # Each variable under the kernel's 128 KiB limit per string; 10 of them pass 1 MiB.
    padding = {f"PAD{i}": "x" * (120 * 1024) for i in range(10)}
    env = {**PATH, **padding, "SLURM_JOB_ID": job}
    proc = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        environ = _wait(lambda: Path(f"/proc/{proc.pid}/environ").read_bytes(), 5, "exec")
        assert len(environ) > 1 << 20 and environ.index(f"SLURM_JOB_ID={job}".encode()) > 1 << 20
        found = procscan.scan_survivors({job: 0})[job]
        assert [s["pid"] for s in found] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_the_needle_is_found_across_a_read_boundary() -> None:
    job = "4242"
    needle = b"SLURM_JOB_ID=4242\0"
    for cut in range(1, len(needle)):
        chunks = [b"A=1\0" + b"x" * 100 + b"\0" + needle[:cut], needle[cut:] + b"B=2\0"]
        assert procscan.environ_facts(iter(chunks), {job})[0] == {job}


def test_another_users_process_claiming_the_job_is_not_counted(reaper: list) -> None:
    job = job_id()
    proc = subprocess.Popen(
        ["sleep", "600"],
        env={**PATH, "SLURM_JOB_ID": job},
        user="nobody",
        start_new_session=True,
        cwd="/",
    )
    reaper.append(proc)
    _wait(lambda: b"sleep" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 5, "exec")
    victim_uid = 4321
    assert procscan.scan_survivors({job: None}, uids={job: victim_uid})[job] == []
    nobody = Path(f"/proc/{proc.pid}/status").read_text().split("Uid:")[1].split()[0]
    mine = procscan.scan_survivors({job: None}, uids={job: int(nobody)})[job]
    assert [s["pid"] for s in mine] == [proc.pid]


def test_the_jobs_cgroup_is_counted_when_present(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], env=PATH)
    try:
        # cgroup v2 (proctrack/cgroup with cgroup/v2): processes sit in the job's step cgroups.
        v2 = tmp_path / "v2"
        task = v2 / "system.slice/slurmstepd.scope/job_55/step_batch/user/task_0"
        task.mkdir(parents=True)
        (task / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        (v2 / "system.slice/slurmstepd.scope/job_55/cgroup.procs").write_text("")
        found = procscan.cgroup_processes(str(v2), "55", 1000, "n1")
        assert found is not None and [p["pid"] for p in found] == [sleeper.pid]
        assert found[0]["source"] == "cgroup" and found[0]["cmdline"] == "sleep 60"
        # cgroup v1: the freezer hierarchy, per uid.
        v1 = tmp_path / "v1"
        job_dir = v1 / "freezer/slurm/uid_1000/job_56/step_0"
        job_dir.mkdir(parents=True)
        (job_dir / "cgroup.procs").write_text(f"{sleeper.pid}\n999999999\n")
        found = procscan.cgroup_processes(str(v1), "56", 1000, "n1")
        assert found is not None and [p["pid"] for p in found] == [sleeper.pid]
        # An empty job cgroup is evidence too: nothing left.
        (job_dir / "cgroup.procs").write_text("")
        assert procscan.cgroup_processes(str(v1), "56", 1000, "n1") == []
        # No cgroup for the job (proctrack/linuxproc, or already removed): no evidence.
        assert procscan.cgroup_processes(str(v1), "57", 1000, "n1") is None
        assert procscan.cgroup_processes(str(tmp_path / "none"), "55", 1000, "n1") is None
    finally:
        sleeper.kill()
        sleeper.wait()


C_HOPPER = """#include <stdio.h>
#include <unistd.h>
int main(void) {
    puts("ready"); fflush(stdout); close(1);
    for (;;) if (fork()) _exit(0);
}
"""


@pytest.fixture()
def c_hopper() -> Iterator[Path]:
    """The hopper in C (thousands of new PIDs a second), where another user may run it."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="dispatch-hopper-", dir="/var/tmp"))
    os.chmod(folder, 0o755)
    (folder / "hop.c").write_text(C_HOPPER)
    subprocess.run(["gcc", "-O2", "-o", str(folder / "hop"), str(folder / "hop.c")], check=True)
    yield folder / "hop"
    shutil.rmtree(folder)


def test_another_users_hopper_is_never_counted(reaper: list, c_hopper: Path) -> None:
    """Another user's PID hopper claiming the job is never a survivor of it.  It can keep a scan
    from finishing within its bound (its PIDs vanish before they can be read, so nobody can say
    whose they were): those scans leave the job "not proven", the safe direction, and the
    admin guide says so.  How often depends on the machine's load, so it is not asserted."""
    job = job_id()
    proc = subprocess.Popen(
        [str(c_hopper)],
        env={**PATH, "SLURM_JOB_ID": job},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        user="nobody",
        cwd="/",
    )
    reaper.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    results = [procscan.scan({job: 4321}) for _ in range(30)]
    assert all(r.found[job] == [] for r in results)  # never counted: the safety property
    assert all(r.complete or r.unresolved for r in results)  # an unfinished scan says so


def test_a_process_killed_while_the_scan_runs_is_not_a_survivor(
    reaper: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmd's SIGKILL reaches a process the Epilog's scan has just read (a trap's child that
    was reparented, on a loaded node): by the end of the scan it is gone, so it is no survivor
    (the CI run that found a job killed at KillWait proven only by the later re-check)."""
    job = job_id()
    proc = subprocess.Popen(
        ["sleep", "600"], env={**PATH, "SLURM_JOB_ID": job}, start_new_session=True, cwd="/"
    )
    reaper.append(proc)
    _wait(lambda: b"sleep" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 5, "exec")
    real = procscan._examine

    def examine_then_kill(pid, jobs, kernel=frozenset()):  # type: ignore[no-untyped-def]
        outcome = real(pid, jobs, kernel)
        if pid == str(proc.pid):
            os.kill(proc.pid, signal.SIGKILL)
        return outcome

    monkeypatch.setattr(procscan, "_examine", examine_then_kill)
    found = procscan.scan({job: None}, set(), seconds=2.0)
    assert found.complete and found.found[job] == []


def test_a_process_that_stays_through_the_scan_is_a_survivor(reaper: list) -> None:
    """A stopped process (as one stuck would be) is still there at the scan's end: counted."""
    job = job_id()
    proc = subprocess.Popen(
        ["sleep", "600"], env={**PATH, "SLURM_JOB_ID": job}, start_new_session=True, cwd="/"
    )
    reaper.append(proc)
    _wait(lambda: b"sleep" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), 5, "exec")
    os.kill(proc.pid, signal.SIGSTOP)
    _wait(lambda: _state(proc.pid) == "T", 5, "stopped")
    found = procscan.scan({job: None}, set(), seconds=2.0)
    assert [p["pid"] for p in found.found[job]] == [proc.pid]
