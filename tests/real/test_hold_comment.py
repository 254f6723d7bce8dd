"""A held job's comment on the real sandbox: squeue shows why a held job
waits ("held: shared checkpoint; ...; expires ..."); once a person's `scontrol release` lets
it run, the comment no longer says it is held."""

from __future__ import annotations

import pytest

from tests.real import test_supervisor as supervisor_tests
from tests.real.test_supervisor import User

pytestmark = pytest.mark.real
user = supervisor_tests.user  # the fixture: a folder of the sandbox user's, failing.sh in it


def comment_of(user: User, jobid: str) -> str:
    out = user.run("squeue", "-h", "-t", "all", "-j", jobid, "-o", "%k").stdout
    return str(out).strip()


def test_a_released_hold_that_ran_no_longer_reads_held(user: User) -> None:
    job, held = supervisor_tests.held_after_a_failure(user)
    assert comment_of(user, held).startswith(f"dispatch:{job}/2 held: shared checkpoint")
    user.run("scontrol", "release", held)  # a person's own release: no dispatch command

    def ran() -> bool:
        return any(str(e["slurm_job_id"]) == held for e in user.status(job)["executions"])

    user.sandbox.wait_for(ran, 60, "the released submission to start")
    user.sandbox.wait_for(
        lambda: "hold over" in comment_of(user, held), 30, "the comment to say the hold is over"
    )
    shown = comment_of(user, held)
    assert shown.startswith(f"dispatch:{job}/2 hold over: started ") and "held" not in shown
    user.supervise()  # the pass still finds the submission by its marker, and records its end
    assert [s["submission"] for s in user.status(job)["submissions"]] == [1, 2]
