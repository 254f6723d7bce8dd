"""The hooks on the real sandbox, installed as an admin would install them: every node of a
multi-node job records its start and its post-kill end, the controller records the allocation
and the end, the job's user can read them and another user cannot, a timed-out job's end is
recorded too, and an array task's starts name its array and task.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.node import facts

if TYPE_CHECKING:
    from slurm_dispatch.node.executions import ExecutionFacts
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real


def test_installed_like_an_admin(sandbox: Sandbox) -> None:
    etc = sandbox.dir / "etc"
    site = (etc / "site.conf").read_text()
    for line in (
        f"Prolog={etc}/prolog.d/*",
        f"Epilog={etc}/epilog.d/*",
        f"PrologSlurmctld={etc}/prolog.d/05-dispatch",
        f"EpilogSlurmctld={etc}/epilog.d/05-dispatch",
        "PrologFlags=Alloc",
    ):
        assert line in site.splitlines(), site
    part = (etc / "prolog.d/05-dispatch").read_text()
    assert f"DISPATCH_PYTHON={sandbox.venv_bin / 'python'}" in part.splitlines()
    assert (etc / "dispatch.conf").read_text().count(f"StateDir={sandbox.dir}/dispatch-state")


def test_every_node_records_and_only_the_user_reads(sandbox: Sandbox) -> None:
    jobid = sandbox.submit(
        "#!/bin/sh\nsrun -l hostname >/dev/null\nexit 0\n", "-N", str(len(sandbox.nodes))
    )
    state = str(sandbox.dir / "dispatch-state")

    def ended_everywhere() -> list[ExecutionFacts] | None:
        found = facts.execution_facts(jobid, state, sandbox.uid)
        if (
            found
            and sorted(found[0]["nodes"]) == sorted(sandbox.nodes)
            and all(n["end"] for n in found[0]["nodes"].values())
            and found[0]["controller"]["end"]
        ):
            return found
        return None

    found = sandbox.wait_for(ended_everywhere, 60, "start and end on every node")
    execution = found[0]
    assert execution["allocated"] == sandbox.nodes
    for name, node in execution["nodes"].items():
        assert (
            node["start"]["node"] == name and node["end"]["start_token"] == node["start"]["token"]
        )
        assert node["ceased"] is True and node["survivors"] == []
    assert execution["end"]["exit_code"] == "0:0"
    # The job's user reads its own facts (through facts/, mode 0711, and its group's folders).
    program = (
        "import json, sys; from slurm_dispatch.node import facts; "
        f"print(json.dumps(facts.execution_facts({jobid!r}, {state!r})))"
    )
    mine = sandbox.run([str(sandbox.venv_bin / "python"), "-c", program], user=sandbox.user)
    assert json.loads(mine.stdout)[0]["restart"] == 0
    # Another user reads nothing of it, and cannot write there.
    theirs = (
        "import json, sys; from slurm_dispatch.node import facts; print(json.dumps("
        f"facts.execution_facts({jobid!r}, {state!r}, uid={sandbox.uid})))"
    )
    other = sandbox.run(
        [str(sandbox.venv_bin / "python"), "-c", theirs], user="nobody", cwd=Path("/"), check=False
    )
    assert other.returncode != 0 and "Permission denied" in other.stderr, other
    touch = sandbox.run(
        ["touch", f"{state}/facts/{sandbox.uid}/{jobid}/forged"],
        user=sandbox.user,
        cwd=Path("/"),
        check=False,
    )
    assert touch.returncode != 0


def test_timed_out_job_end_is_recorded(sandbox: Sandbox) -> None:
    jobid = sandbox.submit("#!/bin/sh\nsleep 300\n", "--time=1")
    sandbox.wait_for(
        lambda: sandbox.job_state(jobid).get("JobState") == "TIMEOUT",
        150,
        "the job to time out",
        interval=1,
    )
    state = str(sandbox.dir / "dispatch-state")
    found = sandbox.wait_for(
        lambda: (
            lambda f: (
                f if f and f[0]["end"] and all(n["end"] for n in f[0]["nodes"].values()) else None
            )
        )(facts.execution_facts(jobid, state, sandbox.uid)),
        30,
        "the end recorded",
    )
    assert found[0]["end"]["source"] == "controller"
    for name, node in found[0]["nodes"].items():
        # The Epilog's scan found nothing of the job; on a loaded machine (CI runs the fast
        # tier beside this) it may not have finished in its budget, and then it names only
        # what it could not read, never a process of the job, and is not counted as proof.
        survivors = node["end"]["survivors"]
        assert all(s.get("unresolved") for s in survivors), (name, survivors)
        assert node["ceased"] is (not survivors), (name, node)
    # Such a node is settled by the next re-check (HealthCheckProgram, every 5 s here).
    found = sandbox.wait_for(
        lambda: (lambda f: f if all(n["ceased"] for n in f[0]["nodes"].values()) else None)(
            facts.execution_facts(jobid, state, sandbox.uid)
        ),
        60,
        "every node ceased",
    )
    proc = sandbox.run(
        [str(sandbox.venv_bin / "dispatch-cease"), jobid, "--json"], user=sandbox.user, check=False
    )
    verdict = json.loads(proc.stdout)
    assert proc.returncode == 0 and verdict["job_state"] == "TIMEOUT", verdict


def test_a_requeued_executions_ends_are_its_own(sandbox: Sandbox) -> None:
    """After `scontrol requeue`, the controller's end record of restart 0 was
    filed under restart 1 (Slurm gives EpilogSlurmctld the next count), so the running
    execution read "ended exit 0:0".  Ends are tied to the starts they close."""
    workdir = sandbox.workdir("requeue-ends")
    script = (
        "#!/bin/bash\n"
        f"touch {workdir}/running.${{SLURM_RESTART_COUNT:-0}}\n"
        f"while [ ! -e {workdir}/stop ]; do sleep 0.2; done\n"
    )
    jobid = sandbox.submit(script, f"--chdir={workdir}", "-o", "/dev/null")
    state = str(sandbox.dir / "dispatch-state")
    sandbox.wait_for(lambda: (workdir / "running.0").exists(), 60, "the first execution")
    sandbox.run(["scontrol", "requeue", jobid])
    sandbox.wait_for(lambda: (workdir / "running.1").exists(), 90, "the second execution")

    def both() -> list[ExecutionFacts] | None:
        found = facts.execution_facts(jobid, state, sandbox.uid)
        return found if len(found) == 2 and found[1]["controller"]["start"] else None

    first, second = sandbox.wait_for(both, 30, "both executions recorded")
    assert first["controller"]["end"] is not None and first["end"]["requeued"]
    assert all(n["end"] for n in first["nodes"].values())
    # The running execution has no end: none of restart 0's records was filed under it.
    assert second["controller"]["end"] is None and second["end"] is None, second
    assert all(n["end"] is None for n in second["nodes"].values())
    (workdir / "stop").touch()
    sandbox.wait_for(
        lambda: sandbox.job_state(jobid).get("JobState") == "COMPLETED",
        60,
        "the second execution to complete",
    )
    second = sandbox.wait_for(
        lambda: (lambda f: f[1] if len(f) == 2 and f[1]["controller"]["end"] else None)(
            facts.execution_facts(jobid, state, sandbox.uid)
        ),
        30,
        "its end recorded",
    )
    assert second["end"]["exit_code"] == "0:0" and not second["end"]["requeued"]


def test_an_array_tasks_starts_name_its_array_and_task(sandbox: Sandbox) -> None:
    """A task's facts are filed under its own job id (SLURM_JOB_ID) while the
    records name the array and A_T.  PrologSlurmctld is given SLURM_ARRAY_JOB_ID and
    SLURM_ARRAY_TASK_ID, and the controller's start carries them, which ties the folder.  The
    node's Prolog (PrologFlags=Alloc) is given neither on 22.05 or 24.11 (its environment,
    dumped on the sandbox by a prolog.d part: SLURM_JOB_ID and no SLURM_ARRAY_*); where a
    release gives them it records them, and never records another task's."""
    array = sandbox.submit("#!/bin/sh\nexit 0\n", "--array=0-2", "-o", "/dev/null")
    state = str(sandbox.dir / "dispatch-state")

    def own_ids() -> dict[int, str] | None:
        shown = {t: sandbox.job_state(f"{array}_{t}") for t in range(3)}
        if any(f.get("JobState") != "COMPLETED" for f in shown.values()):
            return None
        return {t: f["JobId"] for t, f in shown.items()}

    own = sandbox.wait_for(own_ids, 90, "every task to complete", interval=1)
    assert len(set(own.values())) == 3 and array in own.values(), own

    def started(job_id: str) -> ExecutionFacts | None:
        found = facts.execution_facts(job_id, state, sandbox.uid)
        if (
            found
            and found[0]["controller"]["start"]
            and found[0]["nodes"]
            and all(n["start"] for n in found[0]["nodes"].values())
        ):
            return found[0]
        return None

    for task, job_id in own.items():
        execution = sandbox.wait_for(
            functools.partial(started, job_id), 30, f"task {task}'s starts"
        )
        named = {"array_job_id": array, "array_task_id": str(task)}
        ctld = execution["controller"]["start"]
        assert {k: ctld.get(k) for k in named} == named, ctld
        for node in execution["nodes"].values():
            start = node["start"]
            assert start is not None and all(start.get(k) in (None, v) for k, v in named.items()), (
                node
            )
