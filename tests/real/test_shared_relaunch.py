"""A controller that lost a shared job's launch runs it again: the second execution never runs
the script, and the next submission waits until both are proven gone (the soak's finding,
seed 802312, 2026-12-04: "shared-overlap", two executions of one shared job writing at once).

slurmctld saves its state a few seconds after a change; SIGKILLed in between (the soak's
``slurmctld-kill``), or replaced by a backup controller whose state lags, it starts again
believing a job it had launched is still pending, and schedules it again, on another node,
while the first launch runs on.  For an isolated job that is harmless (each execution writes a
folder of its own); a shared-checkpoint job's two executions would write one checkpoint.

The test makes that loss for certain: it keeps slurmctld's saved job state from while the job
was pending, lets the job start on n1, cuts n1 off (so its slurmd cannot report the job when
the controller comes back, as a slow or busy node would not have yet), SIGKILLs slurmctld,
puts the saved state back and starts it: the controller runs the job again on n2.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import daemons
from slurm_dispatch.sandbox.layout import Layout, state_dir
from slurm_dispatch.sandbox.slurm_conf import PARTITION_NAME
from tests.real.test_supervisor import User, state_of
from tests.real.test_supervisor import user as user  # noqa: F401  (the fixture)

pytestmark = pytest.mark.real

# Each execution that runs the script beats into a file of its own, with its node.
BEATING = """#!/bin/bash
#SBATCH --time=10
while true; do
    echo "$SLURMD_NODENAME $(date +%s.%N)" >> "beats-$DISPATCH_ATTEMPT"
    sleep 0.2
done
"""


def saved_after(path: Path, since_ns: int) -> bool:
    try:
        return path.stat().st_mtime_ns > since_ns
    except FileNotFoundError:
        return False


def beats(folder: Path) -> dict[str, list[str]]:
    """Each execution that ran the script: the lines it wrote (node, time)."""
    return {
        p.name[len("beats-") :]: p.read_text().splitlines() for p in sorted(folder.glob("beats-*"))
    }


def test_a_shared_job_the_controller_runs_again_never_runs_twice(user: User) -> None:
    sandbox = user.sandbox
    layout = Layout(state_dir(sandbox.dir))
    saved = layout.state_save / "job_state"
    kept = user.path / "job_state.pending"
    first_node, second_node, spare = sandbox.nodes[:3]
    (user.path / "beating.sh").write_text(BEATING)
    (user.path / "beating.sh").chmod(0o755)
    shutil.chown(user.path / "beating.sh", sandbox.user)
    scontrol = ["scontrol", "update"]
    try:
        sandbox.run([*scontrol, f"partitionname={PARTITION_NAME}", "state=down"])
        since = time.time_ns()
        job, slurm_id = user.submit(
            "--checkpoint",
            "ck",
            "--shared-checkpoint",
            "--resubmit",
            "1",
            "-o",
            "out-%j.txt",
            "beating.sh",
        )
        assert state_of(sandbox, slurm_id)[0] == "PENDING"
        sandbox.wait_for(
            lambda: saved_after(saved, since),
            30,
            "slurmctld to save its job state with the job pending",
        )
        shutil.copy2(saved, kept)

        # It starts on the first node only.
        sandbox.run(
            [
                *scontrol,
                f"nodename={second_node},{spare}",
                "state=drain",
                "reason=test_shared_relaunch",
            ]
        )
        sandbox.run([*scontrol, f"partitionname={PARTITION_NAME}", "state=up"])
        first = sandbox.wait_for(lambda: beats(user.path), 60, "the first execution's beats")
        (attempt,) = first
        assert first[attempt][0].split()[0] == first_node

        # The first node is cut off with it running; the controller, when it comes back,
        # may run it on the second node only.
        sandbox_lib.partition(first_node, sandbox.dir)
        nodes_saved = layout.state_save / "node_state"
        since = time.time_ns()
        sandbox.run(
            [*scontrol, f"nodename={first_node}", "state=drain", "reason=test_shared_relaunch"]
        )
        sandbox.run([*scontrol, f"nodename={second_node}", "state=resume"])
        sandbox.wait_for(
            lambda: saved_after(nodes_saved, since), 30, "slurmctld to save the nodes' state"
        )
        pid = daemons.live_pid(daemons.slurmctld(layout))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        sandbox.wait_for(
            lambda: daemons.live_pid(daemons.slurmctld(layout)) is None, 30, "slurmctld to be gone"
        )
        shutil.copy2(kept, saved)
        sandbox_lib.start_controller(sandbox.dir)

        # The controller believes the job never ran, and runs it again on the second node.
        out = user.path / f"out-{slurm_id}.txt"

        def refused() -> Any:
            twice = beats(user.path)
            assert list(twice) == [attempt], f"a second execution ran the script: {twice}"
            text = out.read_text() if out.exists() else ""
            return text if "already started" in text else ""

        said = sandbox.wait_for(refused, 90, "the second execution's launcher to refuse")
        assert f"submission 1 already started on {first_node}" in said, said
        assert f"restart 0 on {second_node}" in said, said

        def ended() -> Any:
            state = state_of(sandbox, slurm_id)
            return state if state[0] not in ("PENDING", "RUNNING", "COMPLETING", "") else None

        info = sandbox.wait_for(ended, 60, "the second execution to end")
        assert info[0] == "FAILED", info
        assert sandbox.job_state(slurm_id).get("NodeList") == second_node
        # Only the first execution ran the script, and it runs on, cut off.
        ran = beats(user.path)
        assert list(ran) == [attempt], ran
        count = len(ran[attempt])
        sandbox.wait_for(
            lambda: len(beats(user.path)[attempt]) > count + 2,
            30,
            "the cut-off execution to beat on",
        )
        started = user.status(job)["executions"]
        assert [(e["node"], e["attempt"]) for e in started] == [(first_node, attempt)]

        # The supervisor holds the next submission, and the site's signal does not lift it
        # while the first execution runs.
        assert "held" in user.supervise()
        (hold,) = user.events(job, "hold")
        held = str(hold["slurm_job_id"])
        user.supervise()
        facts = user.events(job, "cessation")
        assert facts and facts[-1]["verdict"] == "not ceased", facts
        assert state_of(sandbox, held) == ("PENDING", "JobHeldUser")
    finally:
        sandbox_lib.heal(first_node, sandbox.dir)
        sandbox.run([*scontrol, f"partitionname={PARTITION_NAME}", "state=up"], check=False)
        sandbox.run([*scontrol, f"nodename={','.join(sandbox.nodes)}", "state=resume"], check=False)

    # Once the node is back, slurmd kills what the controller no longer runs there, its
    # Epilog records it, and the hold lifts: submission 2 runs alone.
    def lifted() -> bool:
        user.supervise()
        return bool(user.events(job, "released"))

    sandbox.wait_for(lifted, 180, "dispatch-cease to prove both executions gone", interval=1)
    last_beat = max(float(line.split()[1]) for line in beats(user.path)[attempt])
    (release,) = user.events(job, "released")
    assert release["time"] > last_beat
    second = sandbox.wait_for(
        lambda: [e for e in user.status(job)["executions"] if e["submission"] == 2],
        60,
        "submission 2 to start",
    )
    sandbox.run(["scancel", held], check=False)
    assert second[0]["attempt"] != attempt
