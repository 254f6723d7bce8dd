"""Real tier: an expedited requeue past a spent budget does not run the script
(docs/user-guide.md, Slurm's requeues on a budget).

The supervisor holds Slurm's requeued job once its --max-requeues budget is spent, but only a
job it sees pending: a --requeue=expedite job (25.11, with
``SlurmctldParameters=enable_expedited_requeue``, which the sandbox turns on) whose node fails
starts again at once, before any pass, so it bounced past the budget for ever.  The launcher,
the gate every execution passes, stops it: the second requeued execution records the
supervisor's event, requeues itself held and ends without running the script; `dispatch
release` lets the next one run.  No supervisor runs here at all.  On a release before 25.11
there is no expedited requeue: the test says so and skips (tests/real/test_expedite.py)."""

from __future__ import annotations

from typing import Any

from slurm_dispatch.sandbox import cluster as sandbox_lib
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.test_dispatch_sbatch import Workdir, wait_executions
from tests.real.test_expedite import _expedite_or_skip, _squeue, pytestmark  # noqa: F401

work = sbatch_tests.work  # the fixture, used by name

RUNS = '#!/bin/sh\necho "script ran, restart ${SLURM_RESTART_COUNT:-0}"\nsleep 600\n'


def test_an_expedited_requeue_past_max_requeues_is_held_before_its_script(work: Workdir) -> None:
    sandbox: Any = work.sandbox
    _expedite_or_skip(sandbox)
    work.write("runs.sh", RUNS)
    job, slurm_id = work.submit(
        "--requeue=expedite",
        "--checkpoint",
        "ck",
        "--max-requeues",
        "1",
        "--max-no-progress",
        "0",
        "-o",
        "out.txt",
        "runs.sh",
    )
    cut: list[str] = []
    try:
        for restart in (0, 1):  # each execution's node fails: Slurm requeues it at once
            node = wait_executions(work, job, restart + 1, timeout=90)[restart]["node"]
            sandbox.wait_for(
                lambda: _squeue(sandbox, slurm_id)[0] == "RUNNING",
                60,
                f"execution {restart} running",
            )
            sandbox_lib.partition(node, sandbox.dir)
            cut.append(node)
            if restart == 0:
                wait_executions(work, job, 2, timeout=120)  # one requeue: within the budget
                sandbox_lib.heal(cut.pop(), sandbox.dir)

        def held() -> bool:
            state = sandbox.job_state(slurm_id)
            return state.get("Restarts") == "3" and _squeue(sandbox, slurm_id)[0] in (
                "PENDING",
                "REQUEUE_HOLD",
            )

        sandbox.wait_for(held, 150, "the second requeue held by its launcher")
    finally:
        for node in cut:
            sandbox_lib.heal(node, sandbox.dir)
    status = work.status(job)
    assert len(status["executions"]) == 2, status["executions"]  # restart 2 never started
    assert [s["submission"] for s in status["submissions"]] == [1]
    said = status["requeues_spent"]
    assert said and "Slurm requeued it 2 time(s), past its --max-requeues 1" in said[0], said
    out = (work.path / "out.txt").read_text()
    assert "does not run the script" in out and "requeuehold" in out, out
    assert "script ran, restart 2" not in out, out
    state, reason, _ = _squeue(sandbox, slurm_id)
    assert reason in ("JobHeldUser", "job_requeued_in_held_state", "job requeued in held state"), (
        state,
        reason,
    )
    # A person's release lets it run, once.
    assert "released Slurm job" in work.run("dispatch", "release", job).stdout
    third = wait_executions(work, job, 3, timeout=90)[2]
    assert third["restart"] == 3, third
    sandbox.wait_for(
        lambda: "script ran, restart 3" in (work.path / "out.txt").read_text(),
        30,
        "the released execution's script",
    )
    sandbox.run(["scancel", slurm_id])
