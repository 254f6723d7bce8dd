"""``dispatch supervise``'s passes, in the control side (control/passes.py): one pass's exit
status, and the loop's pause after a failed pass and after a good one.  The process as a whole,
against a controller that goes silent, is test_supervisor_loop's."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_dispatch.control import passes
from slurm_dispatch.control.supervisor import PassReport
from slurm_dispatch.errors import SlurmUnavailable


class Stop(Exception):
    pass


class Supervisor:
    """Passes that fail, then answer (a report each), as ``answers`` says."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.every = None
        self.slurm = self

    def cluster(self) -> str:
        return "c1"

    def run_pass(self) -> PassReport:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def fake(answers: list[Any]) -> Any:
    return Supervisor(answers)


@pytest.fixture(autouse=True)
def _home(home: Any) -> None:  # failures are recorded under DISPATCH_HOME
    pass


def test_one_pass_exits_2_on_a_failure_or_an_error_and_0_else() -> None:
    said: list[passes.Said] = []
    assert passes.run(fake([SlurmUnavailable("Socket  timed\nout")]), 60, False, said.append) == 2
    assert said[-1].failure == "Socket timed out" and said[-1].next_in is None
    assert passes.run(fake([PassReport(errors=["x"])]), 60, False, said.append) == 2
    assert passes.run(fake([PassReport(actions=["a"])]), 60, False, said.append) == 0
    assert said[-1].report is not None and said[-1].report.actions == ["a"]


def test_the_loop_waits_sooner_after_failures_and_says_when_the_controller_answers() -> None:
    said: list[passes.Said] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 4:
            raise Stop

    down = SlurmUnavailable("Socket timed out")
    with pytest.raises(Stop):
        passes.run(fake([down, down, PassReport(), PassReport()]), 80, True, said.append, sleep)
    assert slept == [10, 20, 80, 80]
    assert [s.next_in for s in said[:2]] == [10, 20]
    assert said[2].recovered is not None and said[2].recovered["failures"] == 2
    assert said[3].recovered is None
