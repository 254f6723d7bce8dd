"""dispatch-cease on the real sandbox: partition and heal, a SIGTERM-trapping job cancelled, a
process escaping Slurm's tracking, a rebooted node, and the end states the hooks record.

The sandbox installs the hooks as an admin would (contrib/ parts, dispatch.conf beside
slurm.conf).  dispatch-cease runs as the job's user, as the supervisor would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from slurm_dispatch.node import facts
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import daemons as sandbox_daemons
from slurm_dispatch.sandbox import layout as sandbox_layout

if TYPE_CHECKING:
    from slurm_dispatch.node.executions import ExecutionFacts
    from slurm_dispatch.node.factstore import Fact
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real


def cease(sandbox: Sandbox, jobid: str, restart: int | None = None) -> tuple[int, dict[str, Any]]:
    argv = [str(sandbox.venv_bin / "dispatch-cease"), jobid, "--json"]
    if restart is not None:
        argv += ["--restart", str(restart)]
    proc = sandbox.run(argv, user=sandbox.user, check=False)
    assert proc.returncode in (0, 1), f"dispatch-cease exited {proc.returncode}: {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def wait_cease(
    sandbox: Sandbox, jobid: str, code: int, restart: int | None = None, timeout: float = 60
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def answered() -> bool:
        rc, last["verdict"] = cease(sandbox, jobid, restart)
        return rc == code

    try:
        sandbox.wait_for(answered, timeout, f"dispatch-cease {jobid} to exit {code}", interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its last answer: {last.get('verdict')}") from None
    return last["verdict"]


def state_dir(sandbox: Sandbox) -> str:
    return str(sandbox.dir / "dispatch-state")


def _proctrack(sandbox: Sandbox) -> str:
    for line in sandbox.run(["scontrol", "show", "config"]).stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ProctrackType":
            return value.strip()
    raise AssertionError("scontrol show config printed no ProctrackType")


def executions(sandbox: Sandbox, jobid: str) -> list[ExecutionFacts]:
    return facts.execution_facts(jobid, state_dir(sandbox), sandbox.uid)


def running_on(sandbox: Sandbox, jobid: str) -> str:
    fields = sandbox.wait_for(
        lambda: (lambda f: f if f.get("JobState") == "RUNNING" else None)(sandbox.job_state(jobid)),
        30,
        f"job {jobid} running",
    )
    return fields["NodeList"]


def escaping_script(marker: str) -> str:
    """A job that leaves a process behind: setsid, then a double fork, so Slurm's process
    tracking (proctrack/linuxproc follows the process tree) loses it."""
    return (
        "#!/bin/bash\n"
        f"setsid bash -c '(exec -a {marker} sleep 300 </dev/null >/dev/null 2>&1 &); exit 0'\n"
        "sleep 1\nexit 0\n"
    )


def kill_marked(pid: int, marker: str) -> None:
    """Kill a process the test's own job left behind, after checking it is that one."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert marker in cmdline, cmdline
    os.kill(pid, signal.SIGKILL)


def test_sigterm_trapping_job_cancelled(sandbox: Sandbox) -> None:
    workdir = sandbox.workdir("trap")
    # Saves for longer than KillWait (5 s in the sandbox) on TERM: killed at KillWait.
    script = (
        f"#!/bin/sh\ntrap 'sleep 20; exit 0' TERM\ntouch {workdir}/ready\n"
        "sleep 300 &\nwait\nsleep 20\n"
    )
    jobid = sandbox.submit(script)
    running_on(sandbox, jobid)
    sandbox.wait_for(lambda: (workdir / "ready").exists(), 30, "the trap set")
    sandbox.run(["scancel", jobid])
    rc, verdict = cease(sandbox, jobid)
    assert rc == 1, verdict
    assert "has not ended" in verdict["reason"] or not verdict["ceased"]
    verdict = wait_cease(sandbox, jobid, 0)
    assert verdict["job_state"] == "CANCELLED"
    # No survivor: the Epilog's scan found none, or (on a node loaded enough that processes
    # vanished under every round of it: 26.05 in CI's run beside the other tiers) it could not
    # read some PIDs by its deadline and found no survivor, and a re-check proved them gone.
    assert all(
        "no process left after the kill" in n["evidence"]
        or ("could not read" in n["evidence"] and "found" not in n["evidence"])
        for n in verdict["nodes"]
    ), verdict


def _marked_alive(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            continue
    return found


def test_escaped_process_is_named_then_cessation_once_it_is_gone(sandbox: Sandbox) -> None:
    marker = f"escaped-{os.getpid()}-{time.monotonic_ns()}"
    script = escaping_script(marker)
    jobid = sandbox.submit(script)
    sandbox.wait_for(
        lambda: sandbox.job_state(jobid).get("JobState") == "COMPLETED", 30, "job completed"
    )
    if _proctrack(sandbox) == "proctrack/cgroup":
        # Nothing escapes the job's cgroup: slurmd killed the process with the job, and the
        # Epilog proves the execution at once (DISPATCH_SANDBOX_PROCTRACK=cgroup/v1).
        verdict = wait_cease(sandbox, jobid, 0)
        assert "no process left after the kill" in verdict["nodes"][0]["evidence"], verdict
        assert _marked_alive(marker) == []
        return
    verdict = wait_cease(sandbox, jobid, 1)
    survivors = [s for n in verdict["nodes"] for s in n["survivors"]]
    assert survivors and any(marker in s["cmdline"] for s in survivors), verdict
    assert any(marker in n["evidence"] for n in verdict["nodes"])
    # The plain table names it too.
    table = sandbox.run(
        [str(sandbox.venv_bin / "dispatch-cease"), jobid], user=sandbox.user, check=False
    )
    assert table.returncode == 1 and marker in table.stdout
    for survivor in survivors:
        if marker in survivor["cmdline"]:
            kill_marked(survivor["pid"], marker)
    # The node's re-check (HealthCheckProgram) records them gone.
    verdict = wait_cease(sandbox, jobid, 0, timeout=60)
    assert "all gone" in verdict["nodes"][0]["evidence"]


def test_partition_then_heal(sandbox: Sandbox) -> None:
    """The seed's scenario: requeued off a cut-off node, which keeps running until it rejoins.

    Beside it, on the same node, a job that may not be requeued ends NODE_FAIL.
    """
    workdir = sandbox.workdir("partition")
    loop = (
        '#!/bin/sh\nwhile true; do echo "$SLURM_JOB_ID $(date)" '
        f">> {workdir}/out.$SLURM_RESTART_COUNT; sleep 1; done\n"
    )
    node = "n1"
    requeued = sandbox.submit(loop, "--requeue", "-w", node)
    failed = sandbox.submit(loop, "--no-requeue", "-w", node)
    running_on(sandbox, requeued)
    running_on(sandbox, failed)
    # RUNNING in the controller comes before slurmd has launched the script: wait for each
    # job's first write, or the partition may freeze the node before one of them really runs.
    out = workdir / "out."
    sandbox.wait_for(
        lambda: (
            out.exists()
            and {requeued, failed}
            <= {line.split()[0] for line in out.read_text().splitlines() if line}
        ),
        30,
        "both jobs writing",
    )
    sandbox_lib.partition(node, sandbox.dir)
    try:
        sandbox.wait_for(
            lambda: sandbox.job_state(requeued).get("Restarts") == "1",
            90,
            "the job requeued off the partitioned node",
        )
        rc, verdict = cease(sandbox, requeued, 0)
        assert rc == 1, verdict
        assert verdict["nodes"][0]["node"] == node
        assert "no post-kill record" in verdict["nodes"][0]["evidence"]
        # The old execution is still writing: ended is not ceased.
        size = out.stat().st_size
        sandbox.wait_for(lambda: out.stat().st_size > size, 10, "the cut-off run still writing")
        assert sandbox.job_state(failed)["JobState"] == "NODE_FAIL"
        assert cease(sandbox, failed)[0] == 1
    finally:
        sandbox_lib.heal(node, sandbox.dir)
    verdict = wait_cease(sandbox, requeued, 0, restart=0, timeout=60)
    assert "no process left after the kill" in verdict["nodes"][0]["evidence"]
    wait_cease(sandbox, failed, 0, timeout=60)
    # Once the requeued job starts again (on the healed node), its first execution shows as
    # requeued in the records.
    found = sandbox.wait_for(
        lambda: (lambda e: e if len(e) > 1 else None)(executions(sandbox, requeued)),
        60,
        "the second execution recorded",
    )
    first = found[0]
    assert first["restart"] == 0 and first["allocated"] == [node]
    assert first["end"]["requeued"] is True
    assert first["nodes"][node]["ceased"] is True


def test_heal_right_after_the_node_went_down_ends_its_cut_off_job(sandbox: Sandbox) -> None:
    """A node healed within MessageTimeout (10 s here) of going DOWN: its slurmd's registration
    reports the job the failure ended, and the controller takes that for a race ("newly
    completed") and lets it run.  heal registers the node again past that window, so the job
    is killed and its Epilog records it at once: before, only the controller's next
    registration request did (28 s later on 22.05, over 60 s on 24.11 under load)."""
    workdir = sandbox.workdir("quick-heal")
    node = "n2"
    failed = sandbox.submit(
        f"#!/bin/sh\nwhile true; do date >> {workdir}/out; sleep 1; done\n",
        "--no-requeue",
        "-w",
        node,
    )
    running_on(sandbox, failed)
    sandbox.wait_for(lambda: (workdir / "out").exists(), 30, "the job writing")
    sandbox_lib.partition(node, sandbox.dir)
    try:
        sandbox.wait_for(
            lambda: sandbox.job_state(failed).get("JobState") == "NODE_FAIL",
            90,
            "the job ended by the node's failure",
        )
        # The cut lasts 5 s more (the scenario, not a wait for a condition): by then the
        # controller's kill has failed for want of a route, and 5 s is within MessageTimeout.
        # (A heal at once lets the kill's own connection through.)
        time.sleep(5)
    finally:
        sandbox_lib.heal(node, sandbox.dir)
    # Before, this passed only when the controller's periodic registration request (every
    # node about once a minute, at a phase of its own) happened to fall within the bound.
    verdict = wait_cease(sandbox, failed, 0, timeout=10)
    assert "no process left after the kill" in verdict["nodes"][0]["evidence"], verdict


def test_rebooted_node_proves_cessation(sandbox: Sandbox) -> None:
    if _proctrack(sandbox) == "proctrack/cgroup":
        pytest.skip(
            "under proctrack/cgroup no process escapes the job for a reboot to prove "
            "gone (test_escaped_process_is_named_then_cessation_once_it_is_gone)"
        )
    node = "n3"
    marker = f"reboot-{os.getpid()}-{time.monotonic_ns()}"
    script = escaping_script(marker)
    jobid = sandbox.submit(script, "-w", node)
    sandbox.wait_for(
        lambda: sandbox.job_state(jobid).get("JobState") == "COMPLETED", 30, "job completed"
    )
    verdict = wait_cease(sandbox, jobid, 1)
    pids = [s["pid"] for n in verdict["nodes"] for s in n["survivors"] if marker in s["cmdline"]]
    assert pids, verdict
    # "Reboot" the node the way Slurm's own tests do: slurmd -b reports a new BootTime.
    layout = sandbox_layout.Layout(sandbox.dir)
    daemon = sandbox_daemons.slurmd(layout, node)
    try:
        # BootTime must be later than the node's last record by BootTimeTolerance (2 s).
        _wait_seconds_past_records(sandbox, jobid, 3)
        sandbox_daemons.stop(daemon)
        sandbox_daemons.start(dataclasses.replace(daemon, argv=daemon.argv + ("-b",)), layout)
        verdict = wait_cease(sandbox, jobid, 0, timeout=60)
        assert "rebooted at" in verdict["nodes"][0]["evidence"], verdict
    finally:
        for pid in pids:
            try:
                kill_marked(pid, marker)
            except (FileNotFoundError, ProcessLookupError):
                pass
        sandbox_lib.heal(node, sandbox.dir)


def _wait_seconds_past_records(sandbox: Sandbox, jobid: str, seconds: float) -> None:
    """Wait until the clock is ``seconds`` past every moment dispatch-cease weighs a reboot
    against: the node's records, the controller's records (EpilogSlurmctld may lag the node's
    Epilog under load) and the job's EndTime."""

    def moments() -> list[float]:
        found = [
            float(f.get("time", 0)) if f else 0.0
            for e in executions(sandbox, jobid)
            for f in (
                *(
                    fact
                    for n in e["nodes"].values()
                    for fact in (n["start"], n["end"], n["recheck"])
                ),
                e["controller"]["start"],
                e["controller"]["end"],
            )
        ]
        end = sandbox.job_state(jobid).get("EndTime", "")
        if end and end != "Unknown":
            found.append(time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S")) + 1)
        return found

    sandbox.wait_for(
        lambda: executions(sandbox, jobid)[0]["controller"].get("end"),
        30,
        "the controller's end record",
    )
    latest = max(moments())
    sandbox.wait_for(
        lambda: time.time() > latest + seconds, seconds + 5, "the clock to pass the node's records"
    )


def test_end_states_completed_failed_and_a_broken_store_drains_nothing(sandbox: Sandbox) -> None:
    completed = sandbox.submit("#!/bin/sh\nexit 0\n")
    failed = sandbox.submit("#!/bin/sh\nexit 3\n")
    for jobid, state in ((completed, "COMPLETED"), (failed, "FAILED")):
        verdict = wait_cease(sandbox, jobid, 0)
        assert verdict["job_state"] == state
    assert executions(sandbox, completed)[0]["end"]["exit_code"] == "0:0"
    assert executions(sandbox, failed)[0]["end"]["exit_code"] == "3:0"
    # A StateDir a user could write is refused by every hook: jobs run, no node drains, nothing
    # is recorded, and dispatch-cease cannot prove anything.
    store = Path(state_dir(sandbox))
    os.chmod(store, 0o777)
    try:
        jobid = sandbox.submit("#!/bin/sh\nexit 0\n")
        sandbox.wait_for(
            lambda: sandbox.job_state(jobid).get("JobState") == "COMPLETED",
            30,
            "job completed despite the broken store",
        )
        with pytest.raises(facts.FactError, match="not trusted"):
            executions(sandbox, jobid)
    finally:
        os.chmod(store, 0o755)
    assert executions(sandbox, jobid) == []
    states = sandbox.node_states()
    assert not any("drain" in s for s in states.values()), states
    assert cease(sandbox, jobid)[0] == 1


def _ended_alone(sandbox: Sandbox) -> tuple[str, Fact, dict[str, Any], dict[str, Any]]:
    """A job that runs and ends at once: its id, its node's end, where that end says it looked
    for the job's cgroup, dispatch-cease's verdict."""
    jobid = sandbox.submit("#!/bin/sh\nexit 0\n")
    verdict = wait_cease(sandbox, jobid, 0)
    (node,) = executions(sandbox, jobid)[0]["nodes"].values()
    end = node["end"]
    assert end is not None, node
    said = end.get("cgroup")
    assert isinstance(said, dict), end
    return jobid, end, said, verdict


def test_the_epilog_says_where_it_read_the_jobs_cgroup(sandbox: Sandbox) -> None:
    """The Epilog looks for the job's cgroup under every name a release gives
    it (``job_<id>``, 26.05's SLUID) and says where it looked; where the site runs
    proctrack/cgroup (``DISPATCH_SANDBOX_PROCTRACK=cgroup/v1``) and CgroupRoot holds none of
    Slurm's cgroups, the end and dispatch-cease say the proof rests on /proc alone (it went
    quiet).  Under proctrack/linuxproc (the sandbox's default) nothing is missing."""
    proctrack = _proctrack(sandbox)
    jobid, end, said, verdict = _ended_alone(sandbox)
    assert said["proctrack"] == proctrack
    assert said["names"] == [f"job_{jobid}", *([end["sluid"]] if end.get("sluid") else [])]
    assert "missing" not in said and said["folders"] == []  # Slurm removed it, emptied
    assert "by /proc alone" not in verdict["nodes"][0]["evidence"]
    if proctrack == "proctrack/cgroup":
        assert said["scopes"], said  # where Slurm keeps this node's jobs' cgroups
    conf = sandbox.dir / "etc" / "dispatch.conf"
    text = conf.read_text()
    elsewhere = (
        "\n".join(
            f"CgroupRoot={sandbox.dir}/no-cgroups" if line.startswith("CgroupRoot=") else line
            for line in text.splitlines()
        )
        + "\n"
    )
    assert elsewhere != text
    conf.write_text(elsewhere)
    try:
        _, _, said, verdict = _ended_alone(sandbox)
    finally:
        conf.write_text(text)
    evidence = verdict["nodes"][0]["evidence"]
    if proctrack == "proctrack/cgroup":
        assert said["missing"].startswith("ProctrackType=proctrack/cgroup in ")
        assert (
            "no process left after the kill (by /proc alone: ProctrackType=proctrack/"
            "cgroup" in evidence
        ), evidence
    else:
        assert "missing" not in said and "by /proc alone" not in evidence
