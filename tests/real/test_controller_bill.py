"""What a supervisor pass and ``dispatch-cease`` cost slurmctld, by the controller's own
counters (``sdiag``).

A pass reads the user's jobs in one ``squeue --me`` and asks nothing per job, so its RPCs do not
grow with the number of dispatch jobs the controller knows: 5 held jobs and 50 cost the same,
and that is what one ``squeue --me`` costs.  ``dispatch-cease`` of an ended job asks for that
job once and for its nodes once, through either backend.  Where the sandbox keeps accounting,
a job slurmctld forgot costs slurmdbd one ``sacct`` in the pass that records its end, and
nothing after.  The scale run (1,000 jobs, 32 nodes) is bench/bench_controller.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests import sdiag
from tests.real.test_adapter_contract import BACKENDS, overlay  # noqa: F401 - the fixture
from tests.real.test_arrays import known, short_min_job_age  # noqa: F401 - the fixture

if TYPE_CHECKING:
    from pathlib import Path

    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real


def test_a_pass_costs_one_squeue_whatever_the_number_of_jobs(sandbox: Sandbox) -> None:
    work = sandbox.workdir("bill")
    home = work / "dispatch-home"
    user = ["env", f"DISPATCH_HOME={home}"]
    sandbox.run(["tee", str(work / "job.sh")], user=sandbox.user, input="#!/bin/bash\ntrue\n")
    sandbox.run(["tee", str(work / "sweep.py")], user=sandbox.user, input=sdiag.HELD_SWEEP)

    def cost(argv: list[str]) -> sdiag.Cost:
        return sdiag.measure(
            lambda tool: sandbox.run(tool, check=False),
            sandbox.user,
            lambda: sandbox.run([*user, *argv], user=sandbox.user, cwd=work),
        )

    squeue = cost(["squeue", "--me"])
    assert squeue.rpcs >= 1, f"sdiag counted no RPC of {sandbox.user} for squeue --me"
    supervise = [str(sandbox.venv_bin / "dispatch"), "supervise"]
    passes = {}
    known = 0
    for size in (5, 50):
        out = sandbox.run(
            [*user, str(sandbox.venv_bin / "python"), "sweep.py", str(known), str(size - known)],
            user=sandbox.user,
            cwd=work,
        ).stdout
        assert len(out.split()) == size - known, out
        known = size
        held = sandbox.run(
            ["squeue", "--me", "-h", "-t", "PD", "-o", "%i"], user=sandbox.user
        ).stdout.split()
        assert len(held) >= size, held
        passes[size] = cost(supervise)
    assert passes[5].rpcs == passes[50].rpcs == squeue.rpcs, (
        f"squeue --me: {squeue.rpcs} ({squeue.types()}); a pass over 5 held jobs: "
        f"{passes[5].rpcs} ({passes[5].types()}), over 50: {passes[50].rpcs} "
        f"({passes[50].types()})"
    )


@pytest.mark.parametrize("backend", BACKENDS)  # pyslurm where one exists for the release
def test_cease_asks_for_the_job_once_and_its_nodes_once(
    sandbox: Sandbox,
    overlay: Path,  # noqa: F811
    backend: str,
) -> None:
    """One job read (``JOB_INFO_SINGLE``, and the federation look-up libslurm makes before
    it) and one read of the nodes (``NODE_INFO`` with the partitions it names them in), not a
    read of every job of the owner: pyslurm 24.11's one-job read answers with the first
    record only, which for a job that is no array is all of it.  What else pyslurm asks is
    named: its release probe (``BUILD_INFO``, once a process) and, for a job that has run,
    the steps ``Job.load`` loads itself (``JOB_STEP_INFO``)."""
    work = sandbox.workdir("bill-cease")
    sandbox.run(["tee", str(work / "job.sh")], user=sandbox.user, input="#!/bin/bash\ntrue\n")
    env = ["env", f"DISPATCH_HOME={work / 'dispatch-home'}", f"DISPATCH_SLURM_BACKEND={backend}"]
    if backend == "pyslurm":
        env.append(f"PYTHONPATH={overlay}")
    out = sandbox.run(
        [
            *env,
            str(sandbox.venv_bin / "dispatch-sbatch"),
            "--parsable",
            "-N",
            "2",
            "--checkpoint",
            "ck",
            "job.sh",
        ],
        user=sandbox.user,
        cwd=work,
    ).stdout
    job = out.strip().split(";")[0]
    sandbox.wait_for(
        lambda: sandbox.job_state(job).get("JobState") == "COMPLETED", 120, f"job {job} to complete"
    )
    cease = [*env, str(sandbox.venv_bin / "dispatch-cease"), job, "--json"]
    sandbox.wait_for(
        lambda: sandbox.run(cease, user=sandbox.user, cwd=work, check=False).returncode == 0,
        60,
        f"dispatch-cease {job} to prove both nodes ceased",
    )
    cost = sdiag.measure(
        lambda tool: sandbox.run(tool, check=False),
        sandbox.user,
        lambda: sandbox.run(cease, user=sandbox.user, cwd=work),
    )
    asked = {
        name.removeprefix("REQUEST_"): n
        for name, n in cost.by_type.items()
        if not name.startswith(("MESSAGE_", "COMPLETE_"))
    }  # slurmds', not ours
    pyslurm_own = {"BUILD_INFO", "JOB_STEP_INFO"} if backend == "pyslurm" else set()
    wanted = {"JOB_INFO_SINGLE", "NODE_INFO", "FED_INFO", "PARTITION_INFO"} | pyslurm_own
    assert (
        asked.get("JOB_INFO_SINGLE") == 1 and asked.get("NODE_INFO") == 1 and set(asked) <= wanted
    ), f"dispatch-cease ({backend}) asked {cost.types()}"
    assert cost.rpcs <= 5 + len(pyslurm_own), f"dispatch-cease ({backend}): {cost.types()}"


def test_a_forgotten_job_costs_slurmdbd_one_sacct_once(
    sandbox: Sandbox, short_min_job_age: None
) -> None:  # noqa: F811 - the fixture
    """A dispatch job that ended while no supervisor ran and that slurmctld
    then forgot (MinJobAge) costs the next pass one ``squeue --me`` at the controller, as every
    pass, and one ``sacct`` at slurmdbd (what ``sacct -j`` costs alone); the pass after, with
    its end recorded, asks slurmdbd nothing."""
    if sandbox.accounting != "slurmdbd":
        pytest.skip("the sandbox keeps no accounting (DISPATCH_SANDBOX_ACCOUNTING=none)")
    work = sandbox.workdir("bill-forgotten")
    user = ["env", f"DISPATCH_HOME={work / 'dispatch-home'}"]
    sandbox.run(["tee", str(work / "fail.sh")], user=sandbox.user, input="#!/bin/bash\nexit 3\n")
    out = sandbox.run(
        [
            *user,
            str(sandbox.venv_bin / "dispatch-sbatch"),
            "--parsable",
            "--checkpoint",
            "ck",
            "--stop-on-exit",
            "3",
            "fail.sh",
        ],
        user=sandbox.user,
        cwd=work,
    ).stdout
    job = out.strip().split(";")[0]
    sandbox.wait_for(
        lambda: not known(sandbox, job), 200, f"slurmctld to forget job {job}", interval=2
    )
    both = (sdiag.SLURMCTLD, sdiag.SLURMDBD)

    def cost(argv: list[str]) -> tuple[sdiag.Cost, sdiag.Cost]:
        ctld, dbd = sdiag.measure_all(
            lambda tool: sandbox.run(tool, check=False),
            sandbox.user,
            lambda: said.append(sandbox.run([*user, *argv], user=sandbox.user, cwd=work).stdout),
            both,
        )
        return ctld, dbd

    said: list[str] = []
    _, sacct = cost(
        ["sacct", "-X", "-n", "-P", "-j", job, "-o", "JobIDRaw,JobID,State,UID,Submit,ExitCode"]
    )
    assert sacct.rpcs >= 1 and said[-1].split("|")[2] == "FAILED", (said, sacct.types())
    squeue, _ = cost(["squeue", "--me"])
    supervise = [str(sandbox.venv_bin / "dispatch"), "supervise"]
    first_ctld, first_dbd = cost(supervise)
    assert "known from Slurm's accounting (sacct)" in said[-1], said[-1]
    # sacct gives the exit code too: --stop-on-exit applies.
    assert "stop (exit code 3: --stop-on-exit)" in said[-1], said[-1]
    again_ctld, again_dbd = cost(supervise)
    assert (first_ctld.rpcs, again_ctld.rpcs) == (squeue.rpcs, squeue.rpcs), (
        f"squeue --me: {squeue.types()}; the pass: {first_ctld.types()}; the next: "
        f"{again_ctld.types()}"
    )
    assert (first_dbd.rpcs, again_dbd.rpcs) == (sacct.rpcs, 0), (
        f"sacct -j alone cost slurmdbd {sacct.rpcs} ({sacct.types()}); the pass "
        f"{first_dbd.rpcs}, the next {again_dbd.rpcs} ({again_dbd.types()})"
    )
