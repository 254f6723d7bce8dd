"""What a supervisor pass costs slurmctld, by the controller's own counters (``sdiag``).

A pass reads the user's jobs in one ``squeue --me`` and asks nothing per job, so its RPCs do not
grow with the number of dispatch jobs the controller knows: 5 held jobs and 50 cost the same,
and that is what one ``squeue --me`` costs.  The scale run (1,000 jobs, 32 nodes) is
bench/bench_controller.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests import sdiag

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real



def test_a_pass_costs_one_squeue_whatever_the_number_of_jobs(sandbox: Sandbox) -> None:
    work = sandbox.workdir("bill")
    home = work / "dispatch-home"
    user = ["env", f"DISPATCH_HOME={home}"]
    sandbox.run(["tee", str(work / "job.sh")], user=sandbox.user, input="#!/bin/bash\ntrue\n")
    sandbox.run(["tee", str(work / "sweep.py")], user=sandbox.user, input=sdiag.HELD_SWEEP)

    def cost(argv: list[str]) -> sdiag.Cost:
        return sdiag.measure(lambda tool: sandbox.run(tool, check=False), sandbox.user,
                             lambda: sandbox.run([*user, *argv], user=sandbox.user, cwd=work))

    squeue = cost(["squeue", "--me"])
    assert squeue.rpcs >= 1, f"sdiag counted no RPC of {sandbox.user} for squeue --me"
    supervise = [str(sandbox.venv_bin / "dispatch"), "supervise"]
    passes = {}
    known = 0
    for size in (5, 50):
        out = sandbox.run([*user, str(sandbox.venv_bin / "python"), "sweep.py", str(known),
                           str(size - known)], user=sandbox.user, cwd=work).stdout
        assert len(out.split()) == size - known, out
        known = size
        held = sandbox.run(["squeue", "--me", "-h", "-t", "PD", "-o", "%i"],
                           user=sandbox.user).stdout.split()
        assert len(held) >= size, held
        passes[size] = cost(supervise)
    assert passes[5].rpcs == passes[50].rpcs == squeue.rpcs, (
        f"squeue --me: {squeue.rpcs} ({squeue.types()}); a pass over 5 held jobs: "
        f"{passes[5].rpcs} ({passes[5].types()}), over 50: {passes[50].rpcs} "
        f"({passes[50].types()})")
