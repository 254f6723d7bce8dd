"""The sandbox is a real Slurm cluster: jobs run as the job user, requeue, and survive a partition.

These tests prove the ground the rest of the real tier stands on: what the project claims about
overlapping executions is only worth what this cluster reproduces of Slurm's behaviour.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import daemons as sandbox_daemons
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import network as sandbox_network
from slurm_dispatch.sandbox import slots as sandbox_slots
from slurm_dispatch.sandbox import slurm_conf as sandbox_slurm_conf
from slurm_dispatch.sandbox import state_folder as sandbox_state_folder

if TYPE_CHECKING:
    from conftest import Sandbox

pytestmark = pytest.mark.real
REPO_ROOT = Path(__file__).resolve().parents[2]


def _writer(log: Path) -> str:
    """A batch script appending a line per half second to ``log``: restart count, node, pid."""
    return f"""#!/bin/bash
while true; do
    echo "restart=${{SLURM_RESTART_COUNT:-0}} node=$SLURMD_NODENAME pid=$$" >> '{log}'
    sleep 0.5
done
"""


def _lines(path: Path, restart: int) -> list[str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line.startswith(f"restart={restart} ")]


def _field(line: str, name: str) -> str:
    return dict(part.split("=", 1) for part in line.split())[name]


def _slurm_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S")


def _cluster_actions(report: sandbox_lib.UpReport) -> list[str]:
    # A venv refresh is legitimate when the checkout changed during the session (someone is
    # editing it); what must not happen is a daemon, config or node change.
    return [a for a in report.actions if not a.startswith("installed ")]


def test_up_again_changes_nothing(sandbox: Sandbox) -> None:
    before = sandbox_lib.status(sandbox.dir)
    report = sandbox_lib.up(sandbox.dir, user=sandbox.user, source=REPO_ROOT)
    assert _cluster_actions(report) == []
    # Changing nothing is quick (a loaded 2-core machine, or the 24.11 root, may take some
    # seconds; a restart of the daemons would take far more).
    assert report.seconds < 15 or _cluster_actions(report) != report.actions
    assert [(d.name, d.pid) for d in report.status.daemons] == [
        (d.name, d.pid) for d in before.daemons
    ]


def test_no_other_user_can_place_a_name_where_root_writes(sandbox: Sandbox) -> None:
    # What `up` claimed and made: root's folders closed to others (munge/
    # is the munge user's), and the files slurmd reads or runs as root are plain files.
    root = sandbox.dir
    munge = pwd.getpwnam(sandbox_layout.MUNGE_USER).pw_uid
    folders = {
        root: 0,
        root / "etc": 0,
        root / "etc" / "prolog.d": 0,
        root / "etc" / "epilog.d": 0,
        root / "log": 0,
        root / "run": 0,
        root / "spool": 0,
        root / "state": 0,
        root / "dispatch-state": 0,
        root / "munge": munge,
    }
    for folder, owner in folders.items():
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == owner, folder
        assert not st.st_mode & 0o022, f"{folder} mode {stat.S_IMODE(st.st_mode):o}"
    for name in (
        "slurm.conf",
        "site.conf",
        "plugstack.conf",
        "dispatch.conf",
        "dispatch-recheck",
        f"prolog.d/{sandbox_slurm_conf.DISPATCH_PART}",
        f"epilog.d/{sandbox_slurm_conf.DISPATCH_PART}",
    ):
        st = os.lstat(root / "etc" / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022, name
    assert sandbox_state_folder.claim(root, create=True)


def test_status_json_lists_three_idle_nodes(sandbox: Sandbox) -> None:
    # From the venv, as the job user: the installed CLI works without root.
    proc = sandbox.run(
        [sandbox.venv_bin / "dispatch-sandbox", "status", "--json"], user=sandbox.user
    )
    report = json.loads(proc.stdout)
    assert [(n["name"], n["state"]) for n in report["nodes"]] == [
        ("n1", "idle"),
        ("n2", "idle"),
        ("n3", "idle"),
    ]
    accounting = ["mariadbd", "slurmdbd"] if sandbox.accounting == "slurmdbd" else []
    assert [d["name"] for d in report["daemons"]] == [
        "munged",
        *accounting,
        "slurmctld",
        "slurmd n1",
        "slurmd n2",
        "slurmd n3",
    ]
    assert all(d["alive"] and not d["stopped"] for d in report["daemons"])
    assert report["running"] is True
    assert report["dir"] == str(sandbox.dir)


def test_slurm_authenticates_through_the_sandbox_munged(sandbox: Sandbox) -> None:
    config = sandbox.run(["scontrol", "show", "config"]).stdout
    settings = dict(line.split("=", 1) for line in config.splitlines() if " = " in line)
    settings = {k.strip(): v.strip() for k, v in settings.items()}
    assert (
        settings["AuthInfo"]
        == f"socket={sandbox.dir}/munge/munge.socket,cred_expire={sandbox_slurm_conf.CRED_EXPIRE}"
    )
    assert settings["AuthType"] == "auth/munge"
    assert settings["CredType"] == "cred/munge"
    # A job (next tests) then proves that sbatch, slurmctld, slurmd and slurmstepd all signed
    # and checked through that socket: no other munged has the sandbox's key.


def test_env_lines_point_at_the_sandbox(sandbox: Sandbox) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bin" / "dispatch-sandbox"),
            "env",
            "--dir",
            str(sandbox.dir),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"export SLURM_CONF={sandbox.dir}/etc/slurm.conf" in out.splitlines()
    assert f"export DISPATCH_SANDBOX_USER={sandbox.user}" in out.splitlines()
    assert f'export PATH={sandbox.venv_bin}:"$PATH"' in out.splitlines()


def test_a_job_runs_as_the_user_with_the_venv(sandbox: Sandbox) -> None:
    work = sandbox.workdir("job")
    script = """#!/bin/bash
echo "user=$(id -un) node=$SLURMD_NODENAME restart=${SLURM_RESTART_COUNT:-0}"
python3 -c 'import slurm_dispatch, sys; print("prefix=" + sys.prefix)'
"""
    jobid = sandbox.submit(script, f"--chdir={work}", f"--output={work}/out-%j.txt")
    state = sandbox.wait_for(
        lambda: (s := sandbox.job_state(jobid))["JobState"] in ("COMPLETED", "FAILED") and s,
        30,
        f"job {jobid} to end",
    )
    out = work / f"out-{jobid}.txt"
    assert state["JobState"] == "COMPLETED", out.read_text()
    assert out.stat().st_uid == sandbox.uid
    fields = dict(part.split("=", 1) for part in out.read_text().split())
    assert fields["user"] == sandbox.user
    assert fields["node"] in sandbox.nodes
    assert fields["restart"] == "0"
    assert fields["prefix"] == str(sandbox.dir / "venv")
    # sched_interval=1 and no batch delay: submission to start within a couple of seconds on
    # a quiet machine (the default scheduler's interval is 60 s); 10 s leaves room for load.
    started = _slurm_time(state["StartTime"]) - _slurm_time(state["SubmitTime"])
    assert started.total_seconds() <= 10


def test_scontrol_requeue_runs_the_job_again(
    sandbox: Sandbox, record_property: Callable[[str, object], None]
) -> None:
    work = sandbox.workdir("requeue")
    log = work / "writes.log"
    jobid = sandbox.submit(_writer(log), f"--chdir={work}", "--output=/dev/null")
    try:
        sandbox.wait_for(lambda: _lines(log, 0), 30, f"job {jobid} to write")
        requeued_at = time.monotonic()
        sandbox.run(["scontrol", "requeue", jobid])
        state = sandbox.wait_for(
            lambda: (
                (s := sandbox.job_state(jobid))["Restarts"] == "1"
                and s["JobState"] == "RUNNING"
                and s
            ),
            60,
            f"job {jobid} to run again",
        )
        record_property("requeue_to_running_s", round(time.monotonic() - requeued_at, 1))
        assert state["NodeList"] in sandbox.nodes
        sandbox.wait_for(lambda: _lines(log, 1), 30, "the second execution to write")
    finally:
        sandbox.run(["scancel", jobid], check=False)


def test_partitioned_node_requeues_its_job_while_the_old_execution_runs_on(
    sandbox: Sandbox, record_property: Callable[[str, object], None]
) -> None:
    work = sandbox.workdir("partition")
    log = work / "writes.log"
    jobid = sandbox.submit(_writer(log), f"--chdir={work}", "--output=/dev/null")
    node = ""
    try:
        first = sandbox.wait_for(lambda: _lines(log, 0), 30, f"job {jobid} to write")
        node = _field(first[0], "node")
        old_pid = int(_field(first[0], "pid"))

        cut_at = time.monotonic()
        sandbox_lib.partition(node, sandbox.dir)
        sandbox.wait_for(
            lambda: "*" in sandbox.node_states()[node], 60, f"{node} to stop responding"
        )
        state = sandbox.wait_for(
            lambda: (s := sandbox.job_state(jobid))["Restarts"] == "1" and s,
            90,
            f"job {jobid} to be requeued away from {node}",
        )
        record_property("partition_to_requeue_s", round(time.monotonic() - cut_at, 1))
        # `up` leaves a deliberate partition alone.
        report = sandbox_lib.up(sandbox.dir, user=sandbox.user, source=REPO_ROOT)
        assert (_cluster_actions(report), report.partitioned) == ([], [node])
        state = sandbox.wait_for(
            lambda: (s := sandbox.job_state(jobid))["JobState"] == "RUNNING" and s,
            60,
            f"job {jobid} to run again",
        )
        record_property("partition_to_running_elsewhere_s", round(time.monotonic() - cut_at, 1))
        assert state["NodeList"] != node
        second = sandbox.wait_for(lambda: _lines(log, 1), 30, "the new execution to write")
        assert _field(second[0], "node") == state["NodeList"]

        # Slurm says the first execution ended; on the cut-off node it is still writing.
        written = len(_lines(log, 0))
        sandbox.wait_for(
            lambda: len(_lines(log, 0)) > written + 1,
            10,
            f"the old execution on {node} to keep writing",
        )
        assert Path(f"/proc/{old_pid}").exists()
    finally:
        if node:
            healed_at = time.monotonic()
            sandbox_lib.heal(node, sandbox.dir)
            record_property("heal_to_usable_s", round(time.monotonic() - healed_at, 1))
    # Back in touch, slurmd kills what is left of the old execution and the node is idle again.
    sandbox.wait_for(
        lambda: not Path(f"/proc/{old_pid}").exists(),
        30,
        f"the old execution (pid {old_pid}) to be killed",
    )
    sandbox.wait_for(lambda: sandbox.node_states()[node] == "idle", 30, f"{node} idle")
    assert sandbox.job_state(jobid)["JobState"] == "RUNNING"
    sandbox.run(["scancel", jobid])


def _prober(log: Path, address: str, port: int) -> str:
    """A batch script whose own process tries the controller's port every half second and
    logs whether it got through; its first execution ends (exit 0) after three failures, a
    later one just waits."""
    probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=1).close()"
    return f"""#!/bin/bash
if [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ]; then exec sleep 600; fi
cuts=0
while [ $cuts -lt 3 ]; do
    if python3 -c "{probe}" 2>/dev/null; then
        echo "reach node=$SLURMD_NODENAME" >> '{log}'
    else
        cuts=$((cuts + 1)); echo "cut node=$SLURMD_NODENAME" >> '{log}'
    fi
    sleep 0.5
done
echo "ended node=$SLURMD_NODENAME" >> '{log}'
"""


def test_a_cut_node_reaches_nothing_and_its_ended_job_is_not_completed(
    sandbox: Sandbox, record_property: Callable[[str, object], None]
) -> None:
    # With slurmd merely stopped, slurmstepd told the controller that the job had
    # ended and Slurm recorded COMPLETED; a real cut lets nothing of the node through.
    layout = sandbox_layout.Layout(sandbox.dir)
    net = sandbox_network.net_of(layout)
    work = sandbox.workdir("cut")
    log = work / "probes.log"
    jobid = sandbox.submit(
        _prober(log, net.host_address, layout.controller_port),
        f"--chdir={work}",
        "--output=/dev/null",
    )

    def lines() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    node = ""
    try:
        first = sandbox.wait_for(lambda: lines(), 30, f"job {jobid} to probe")
        assert first[0].startswith("reach "), first  # the probe gets through before the cut
        node = first[0].split("node=")[1]
        cut_at = time.monotonic()
        sandbox_lib.partition(node, sandbox.dir)
        assert sandbox_lib.status(sandbox.dir).partitioned == [node]
        sandbox.wait_for(
            lambda: any(line.startswith("ended ") for line in lines()),
            30,
            f"the job's own process on {node} to fail three probes and end",
        )
        after = lines()[[line.startswith("cut ") for line in lines()].index(True) :]
        assert all(not line.startswith("reach ") for line in after), after

        seen: list[str] = []

        def requeued() -> bool:
            state = sandbox.job_state(jobid)
            seen.append(state["JobState"])
            return "*" in sandbox.node_states()[node] and state["Restarts"] == "1"

        sandbox.wait_for(requeued, 90, f"{node} not responding and job {jobid} requeued")
        record_property("cut_to_requeue_s", round(time.monotonic() - cut_at, 1))
        # Healed only once the job runs elsewhere: a requeued job sent back to the node that
        # still holds its old, unreported batch step fails to launch (Slurm holds it).
        state = sandbox.wait_for(
            lambda: (s := sandbox.job_state(jobid))["JobState"] == "RUNNING" and s,
            60,
            f"job {jobid} to run again",
        )
        # Ended on the cut node, yet never recorded so: nothing of the node got through.
        assert "COMPLETED" not in seen, seen
        assert state["Restarts"] == "1" and state["NodeList"] != node
    finally:
        if node:
            sandbox_lib.heal(node, sandbox.dir)
    assert sandbox_lib.status(sandbox.dir).partitioned == []
    # Back in touch, the old execution's end is not taken for this one's.
    sandbox.wait_for(lambda: sandbox.node_states()[node] == "idle", 30, f"{node} idle")
    state = sandbox.job_state(jobid)
    assert (state["JobState"], state["Restarts"]) == ("RUNNING", "1"), state
    sandbox.run(["scancel", jobid])


def test_down_leaves_no_network_behind_and_up_repairs_a_crash(sandbox: Sandbox) -> None:
    net = sandbox_network.net_of(sandbox_layout.Layout(sandbox.dir))
    node = sandbox.nodes[1]
    slurmd = sandbox_daemons.slurmd(sandbox_layout.Layout(sandbox.dir), node)
    old_pid = sandbox_daemons.checked_pid(slurmd)
    # A crash's leftover: the node's namespace gone from /run/netns while its slurmd lives on
    # in it (unreachable), and its veth still on the bridge.
    subprocess.run(["ip", "netns", "delete", net.netns(node)], check=True)
    report = sandbox_lib.up(sandbox.dir, user=sandbox.user, source=REPO_ROOT)
    assert f"created network namespace {net.netns(node)}" in report.actions
    new_pid = sandbox_daemons.checked_pid(slurmd)
    assert new_pid != old_pid and report.status.running
    assert sandbox_network.in_netns(new_pid, sandbox_layout.Layout(sandbox.dir), node)

    def ours() -> list[str]:
        prefix = f"dsb{net.slot}"
        return sorted(
            [
                *(p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(prefix)),
                *(p.name for p in Path("/run/netns").glob(f"{prefix}-*")),
            ]
        )

    assert ours() == sorted(
        [net.bridge, *(net.veth(n) for n in sandbox.nodes), *(net.netns(n) for n in sandbox.nodes)]
    )
    try:
        sandbox_lib.down(sandbox.dir)
        assert ours() == []
    finally:
        report = sandbox_lib.up(sandbox.dir, user=sandbox.user, source=REPO_ROOT)
    assert report.status.running and ours() != []


def test_a_subnet_this_machine_has_is_refused_naming_what_holds_it(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = sandbox_network.net_of(sandbox_layout.Layout(sandbox.dir))
    # A folder whose slot no sandbox on this machine has (not only this one's): the real
    # tier's second sandbox (test_clusters) is up by now, and a folder of its slot found its
    # bridge there, so the check made before a bridge is created never ran, the subnet was
    # added to that bridge and its slurmctld's port was taken (failed once in a CI-like run).
    folder, other = next(
        (f, n)
        for f in (Path(f"/var/tmp/netns-refusal-{os.getpid()}-{i}") for i in range(64))
        if (n := sandbox_network.net_of(sandbox_layout.Layout(f))).slot != taken.slot
        and not Path("/sys/class/net", n.bridge).exists()
    )
    monkeypatch.setenv(sandbox_network.SUBNET_ENV, str(taken.subnet))
    try:
        with pytest.raises(
            SandboxError,
            match=(
                rf"network {taken.subnet} is taken on this machine \(address "
                rf"{taken.host_address}/24 on {taken.bridge}\): set \$DISPATCH_SANDBOX_SUBNET"
            ),
        ):
            sandbox_lib.up(folder, user=sandbox.user, source=REPO_ROOT)
        assert not Path("/sys/class/net", other.bridge).exists()
        assert not list(Path("/run/netns").glob(f"dsb{other.slot}-*"))
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=True)


def test_partition_of_an_unknown_node_names_the_valid_ones(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError, match=r"unknown node 'n9'.*n1, n2, n3"):
        sandbox_lib.partition("n9", sandbox.dir)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bin" / "dispatch-sandbox"),
            "heal",
            "n9",
            "--dir",
            str(sandbox.dir),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("dispatch-sandbox: unknown node 'n9'")


# --- a sandbox of its own: what `up` says to paste, and `remove` ---------------------------------


def _bin(*argv: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``bin/dispatch-sandbox ARGV`` run from the clone, as its docs say (a relative path)."""
    return subprocess.run(
        ["bin/dispatch-sandbox", *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def own(sandbox: Sandbox) -> Iterator[tuple[Path, str, subprocess.CompletedProcess[str]]]:
    """A one-node sandbox in a folder and with a job user of its own, brought up as a user
    would (``DISPATCH_SANDBOX_DIR=... DISPATCH_SANDBOX_USER=... bin/dispatch-sandbox up``),
    on the session's release; removed at the end, the user too."""
    folder = Path(f"/var/tmp/sb-own-{os.getpid()}")
    user = f"dsbown{os.getpid() % 100000}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
    if sandbox.slurm != sandbox_layout.HOST_RELEASE:
        env[sandbox_layout.RELEASE_ENV] = sandbox.slurm
    proc = _bin(
        "up",
        "--nodes",
        "1",
        env={**env, sandbox_layout.DIR_ENV: str(folder), sandbox_layout.USER_ENV: user},
    )
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield folder, user, proc
    finally:
        if folder.exists():
            _bin("remove", "--dir", str(folder), env=env, timeout=120)
        subprocess.run(["userdel", "-r", user], capture_output=True)


def test_up_prints_lines_that_pasted_reach_its_folder_and_user(
    own: tuple[Path, str, subprocess.CompletedProcess[str]],
) -> None:
    folder, user, proc = own
    lines = proc.stdout.splitlines()
    use, jobs = (line.split(": ", 1)[1] for line in lines[-2:])
    assert "bin/dispatch-sandbox" in use and f"--dir {folder}" in use, proc.stdout
    assert lines[-1].startswith(f"jobs run as {user}: "), proc.stdout
    assert json.loads((folder / "sandbox.json").read_text())["user"] == user
    # Pasted, in order, into a shell that has none of the sandbox's variables (a user's next
    # shell); the job's output goes to a folder the job user may write to.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
    in_root = sandbox_layout.HOST_RELEASE != json.loads((folder / "sandbox.json").read_text()).get(
        "slurm", sandbox_layout.HOST_RELEASE
    )
    sinfo = "" if in_root else "sinfo -h -N -o %N\n"  # in a root, the first line runs it
    script = f"set -e\ncd {REPO_ROOT}\n{use}\n{sinfo}cd /tmp\n{jobs} --output=/dev/null\n"
    shell = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert shell.returncode == 0, shell.stdout + shell.stderr
    job = shell.stdout.split("Submitted batch job ")[1].split()[0]
    shown = _bin(
        "exec",
        "--dir",
        str(folder),
        "--",
        "scontrol",
        "-o",
        "show",
        "job",
        job,
        env=env,
        timeout=60,
    )
    assert f" UserId={user}(" in shown.stdout, shown.stdout + shown.stderr
    assert "n1" in shell.stdout.split("Submitted")[0], shell.stdout


def test_remove_leaves_nothing_of_the_sandbox_but_its_job_user(
    own: tuple[Path, str, subprocess.CompletedProcess[str]],
) -> None:
    folder, user, _ = own
    layout = sandbox_layout.Layout(folder)
    slot = layout.recorded_slot()
    assert slot is not None and sandbox_slots.holder(slot) == folder
    net = sandbox_network.net_of(layout)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
    deadline = time.monotonic() + 60
    while _bin("exec", "--dir", str(folder), "--", "squeue", "-h", env=env).stdout.strip():
        assert time.monotonic() < deadline, "the pasted job did not end"
        time.sleep(0.5)

    proc = _bin("remove", "--dir", str(folder), env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = proc.stdout.splitlines()
    for expected in (
        f"removed network namespace {net.netns('n1')}",
        f"removed bridge {net.bridge}",
        f"released port slot {slot}",
    ):
        assert expected in said, proc.stdout
    assert any(line.startswith(f"removed {folder} (") for line in said), proc.stdout
    assert said[-1].startswith(f"the job user {user} stays"), proc.stdout
    assert not os.path.lexists(folder)
    assert not list(Path("/run/netns").glob(f"{net.bridge}-*"))
    # The slot is free: no claim names the folder (another session may take the slot at once,
    # with its own bridge).
    assert sandbox_slots.holder(slot) != folder
    claim = sandbox_slots.claims_folder() / str(slot)
    assert not claim.exists() or claim.read_text().strip() != str(folder)
    assert not Path("/sys/class/net", net.bridge).exists() or sandbox_slots.holder(slot)
    pwd.getpwnam(user)  # the job user stays, as it said
    again = _bin("remove", "--dir", str(folder), env=env, timeout=60)
    assert (again.returncode, again.stdout) == (
        0,
        f"no sandbox folder {folder}: nothing to remove\n",
    ), again.stderr


def test_a_folder_made_before_accounting_comes_up_with_it(sandbox: Sandbox) -> None:
    """A sandbox folder made before the sandbox kept accounting (or whose database server was
    made again) holds slurmctld's saved cluster id, which the new database does not know:
    slurmctld stopped at "CLUSTER ID MISMATCH" and `up` failed (seen on every folder kept from
    before the change: a machine that keeps its sandboxes would lose its real tier)."""
    layout = sandbox_layout.Layout(sandbox.dir)
    if not layout.db_made.exists():
        pytest.skip("this sandbox keeps no accounting")
    sandbox_lib.down(sandbox.dir)
    saved = layout.state_save / "clustername"
    try:
        # What the folder looked like before: slurmctld's saved cluster id (an earlier
        # database's), no database server of its own yet.
        if not saved.exists():  # 22.05 saves it only at times; 24.11 and later always
            saved.write_bytes(b"")
        os.utime(saved, (time.time() - 3600, time.time() - 3600))
        shutil.rmtree(layout.db_dir)
        layout.db_made.unlink(missing_ok=True)
    finally:
        report = sandbox_lib.up(sandbox.dir, user=sandbox.user, source=REPO_ROOT)
    assert report.status.running
    assert any("cluster id saved before" in action for action in report.actions), report.actions
    jobid = sandbox.submit("#!/bin/sh\ntrue\n")
    sandbox.wait_for(
        lambda: sandbox.job_state(jobid)["JobState"] == "COMPLETED", 60, "a job to complete"
    )
