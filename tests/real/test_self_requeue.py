"""Real tier: a job's own requeue from an old execution spares the execution that replaced it.

The Lightning and Hugging Face callbacks requeue their job themselves after the save they made
at the warning signal (:func:`slurm_dispatch.integrations.requeue.requeue`).  A late call, from
an old execution that outlived its requeue (a straggler that escaped the job, a node cut off
that comes back), must not requeue its replacement.  Where the release gives each execution an
id of its own (``SLURM_JOB_SLUID``, 26.05), the call names it, and once the job was requeued
that id names no job: the call fails and the replacement runs on.  On older releases the call
can only name the job, and it requeues whatever runs: the test says which it saw.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real

# The old execution's straggler: escaped from the job (setsid, its parent gone), it waits for
# the test's word, then asks for the requeue the callbacks ask for, with the environment the
# first execution gave it.
LATE_CALL = """
import json, os, sys, time
work = sys.argv[1]
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(work, "go")):
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.1)
from slurm_dispatch.integrations.requeue import requeue
why = requeue("checkpoint-1", False)
with open(os.path.join(work, "late.part"), "w") as f:
    json.dump({"why": why, "sluid": os.environ.get("SLURM_JOB_SLUID")}, f)
os.rename(os.path.join(work, "late.part"), os.path.join(work, "late.json"))
"""


def _script(sandbox: Sandbox, work: Path) -> str:
    python = shlex.quote(str(sandbox.venv_bin / "python"))
    folder = shlex.quote(str(work))
    return (
        "#!/bin/sh\n"
        f'echo "${{SLURM_RESTART_COUNT:-0}} ${{SLURM_JOB_SLUID:--}}" >> {folder}/executions\n'
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then\n'
        f"  (setsid {python} {folder}/late.py {folder} </dev/null >{folder}/late.log 2>&1 &)\n"
        "fi\n"
        "exec sleep 600\n"
    )


def _executions(work: Path) -> list[list[str]]:
    path = work / "executions"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_an_old_executions_late_requeue_spares_its_replacement(sandbox: Sandbox) -> None:
    work = sandbox.workdir("late-requeue")
    (work / "late.py").write_text(LATE_CALL)
    jobid = sandbox.submit(_script(sandbox, work), f"--chdir={work}", "--output=/dev/null")
    try:
        first = sandbox.wait_for(lambda: _executions(work), 30, f"job {jobid} to start")[0]
        sandbox.run(["scontrol", "requeue", jobid])  # as a node failure or a person would
        sandbox.wait_for(
            lambda: (
                len(_executions(work)) >= 2
                and sandbox.job_state(jobid).get("JobState") == "RUNNING"
            ),
            90,
            "the replacement to run",
        )
        (work / "go").write_text("")
        late = work / "late.json"
        sandbox.wait_for(late.exists, 60, f"the late call's answer ({work}/late.log)")
        answer = json.loads(late.read_text())
        state = sandbox.job_state(jobid)
        sluid = first[1]
        if sluid != "-":
            # 26.05: the call named the old execution, which no job is any more.
            assert answer["sluid"] == sluid
            assert (state["JobState"], state["Restarts"]) == ("RUNNING", "1"), (state, answer)
            assert answer["why"] is not None
            assert f"`scontrol requeue {sluid}` failed" in answer["why"], answer["why"]
            assert _executions(work)[1][1] not in ("-", sluid)
        else:
            # Before 26.05 an execution has no id of its own: the late call requeues its job,
            # whatever execution runs (the admin guide's Slurm releases says so).
            assert answer["why"] is None
            assert state["Restarts"] == "2", state
    finally:
        sandbox.run(["scancel", jobid], check=False)
