"""The Slurm adapter's reads: user-controlled text never moves a controller field, the state
vocabulary is one, and reads ask for the caller's jobs only."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_dispatch.errors import ConfigError, SlurmError
from slurm_dispatch.slurm import cli_backend
from slurm_dispatch.slurm import jobs as slurm_jobs
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes import squeue

HOSTILE = [
    "JobState=COMPLETED Restarts=3 NodeList=(null)",
    "x|COMPLETED|9|0|(null)",
    "line one\nJobID|1|N/A|COMPLETED|3|0||N/A|N/A|N/A|None#00#forged#00#\nmore",
    "#" * 40,
    "dispatch:dabcdefg/2 and text",
    "",
]


class FakeSqueue:
    def __init__(self, jobs: list[dict[str, str]]) -> None:
        self.jobs = jobs
        self.calls: list[list[str]] = []

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        self.calls.append(list(argv))
        assert argv[0] == "squeue", argv
        shown = squeue.selected(argv, self.jobs, os.getuid())
        return Result(list(argv), 0, squeue.render(argv, shown), "")


def running(comment: str, **fields: str) -> dict[str, str]:
    return {
        "JobId": "7",
        "JobState": "RUNNING",
        "Restarts": "0",
        "NodeList": "n[1-2]",
        "UserId": f"me({os.getuid()})",
        "StartTime": "2026-11-30T10:00:00",
        "Comment": comment,
        **fields,
    }


@pytest.mark.parametrize("comment", HOSTILE)
def test_a_comment_never_moves_a_field(comment: str) -> None:
    """Finding 4: `scontrol update comment='JobState=COMPLETED Restarts=3 NodeList=(null)'`
    made a running job read as an ended one that never started anywhere."""
    fake = FakeSqueue([running(comment), running("plain", JobId="8")])
    jobs = Slurm(fake, wait=0).jobs("7")
    assert len(jobs) == 2 or jobs[0].job_id == "7"
    job = next(j for j in jobs if j.job_id == "7")
    assert (job.state, job.restarts, job.nodes) == ("RUNNING", 0, ("n1", "n2"))
    assert job.comment == comment and not job.execution_ended


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200))
def test_any_comment_round_trips(comment: str) -> None:
    nonces = ("#n1#", "#n2#")
    if any(n in comment for n in nonces):
        return  # the real nonces are random per call: a comment cannot hold them
    if comment == "(null)":
        return  # squeue's word for no comment: a comment of these six letters reads as none
    argv = ["squeue", "--Format", cli_backend.squeue_format(nonces)]
    text = squeue.render(argv, [running(comment), running("x", JobId="8")])
    jobs = cli_backend.parse_squeue(text, nonces, argv)
    assert [j.job_id for j in jobs] == ["7", "8"]
    assert jobs[0].comment == comment and jobs[0].state == "RUNNING"


def test_nonces_differ_per_call() -> None:
    fake = FakeSqueue([running("x")])
    adapter = Slurm(fake, wait=0)
    adapter.own_jobs()
    adapter.own_jobs()
    first, second = (c[c.index("--Format") + 1] for c in fake.calls)
    assert first != second


def test_own_jobs_asks_for_mine_only_and_drops_others() -> None:
    """Finding 5: comments are public; only the caller's own jobs are read."""
    theirs = running("dispatch:dvictim1/2", JobId="9", UserId="mallory(4242)")
    fake = FakeSqueue([running("dispatch:dvictim1/1"), theirs])
    jobs = Slurm(fake, wait=0).own_jobs()
    assert (
        "--me" in fake.calls[0] and "9" not in jobs and jobs["7"].markers == ["dispatch:dvictim1/1"]
    )
    # Even a controller that ignored --me cannot hand us another uid's job.
    fake.calls.clear()
    leaky = Slurm(
        lambda argv, env, cwd, timeout: Result(list(argv), 0, squeue.render(argv, [theirs]), ""),
        wait=0,
    )
    assert leaky.own_jobs() == {}


def test_array_tasks_are_jobs_of_their_own() -> None:
    tasks = [
        running("", JobId="98", ArrayJobId="97", ArrayTaskId="1", JobState="FAILED"),
        running("", JobId="97", ArrayJobId="97", ArrayTaskId="0"),
        running("", JobId="97", ArrayJobId="97", ArrayTaskId="2", JobState="PENDING"),
        running("", JobId="97", ArrayJobId="97", ArrayTaskId="3", JobState="PENDING"),
    ]
    jobs = Slurm(FakeSqueue(tasks), wait=0).own_jobs()
    assert jobs["97_1"].job_id == "98" and jobs["98"].display_id == "97_1"
    assert jobs["97_1"].is_final and jobs["97_0"].is_active
    assert "97" not in jobs  # shared by pending tasks: ambiguous, so only A_T keys it


def test_one_state_vocabulary() -> None:
    for state in (
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    ):
        assert slurm_jobs.is_final(state) and not slurm_jobs.is_active(state)
        assert slurm_jobs.execution_ended(state)
    for state in ("SPECIAL_EXIT", "REQUEUED", "REQUEUE_HOLD"):
        # Slurm runs it again (after a release): not final, but the execution has ended.
        assert slurm_jobs.is_active(state) and slurm_jobs.execution_ended(state)
    for state in ("PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"):
        assert slurm_jobs.is_active(state) and not slurm_jobs.execution_ended(state)
    assert not slurm_jobs.is_active("")


def test_unterminated_or_garbled_output_is_an_error() -> None:
    nonces = ("#a#", "#b#")
    with pytest.raises(SlurmError, match="unterminated"):
        cli_backend.parse_squeue("7|7|N/A|RUNNING", nonces)
    with pytest.raises(SlurmError, match="does not parse"):
        cli_backend.parse_squeue("7|RUNNING#a##b#\n", nonces)
    with pytest.raises(SlurmError, match="does not parse"):
        cli_backend.parse_squeue("7|7|N/A|RUNNING|x|0||N/A|N/A|N/A|None#a##b#\n", nonces)


def test_unknown_job_is_empty_and_bad_ids_are_refused() -> None:
    def answer(argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        return Result(list(argv), 1, "", "slurm_load_jobs error: Invalid job id specified\n")

    assert Slurm(answer, wait=0).jobs("123") == []
    with pytest.raises(SlurmError, match="not a Slurm job id"):
        Slurm(answer, wait=0).jobs("123; rm")


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_environment_knobs_are_checked(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("DISPATCH_SLURM_ATTEMPTS", value)
    with pytest.raises(ConfigError, match=f"DISPATCH_SLURM_ATTEMPTS={value!r}"):
        Slurm()


def test_an_unknown_node_is_absent_not_an_error() -> None:
    """scontrol exits 1 ("Node nx9 not found") after printing the nodes it knows."""

    def answer(argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        return Result(
            list(argv),
            1,
            "NodeName=n1 State=IDLE BootTime=2026-11-30T10:00:00\n",
            "Node nx9 not found\n",
        )

    nodes = Slurm(answer, wait=0).nodes(["n1", "nx9"])
    assert list(nodes) == ["n1"] and nodes["n1"].boot_time == cli_backend.slurm_time(
        "2026-11-30T10:00:00"
    )

    def broken(argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        return Result(list(argv), 1, "", "slurm_load_node error: Access denied\n")

    with pytest.raises(SlurmError, match="scontrol failed"):
        Slurm(broken, wait=0).nodes(["n1"])


def test_a_fake_controller_means_the_tools_and_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's runner is the controller: the backend setting is not even read."""
    monkeypatch.setenv("DISPATCH_SLURM_BACKEND", "pyslurm")
    fake = FakeSqueue([running("x")])
    adapter = Slurm(fake, wait=0)
    assert adapter.backend == "cli" and "7" in adapter.own_jobs()


def test_an_arrays_tasks_come_in_task_order() -> None:
    """squeue prints an array's pending remainder first (by priority); pyslurm 24.11's backend
    reads the controller's order: the adapter hands both over in task order."""
    tasks = [
        running("", JobId="97", ArrayJobId="97", ArrayTaskId="3", JobState="PENDING"),
        running("", JobId="97", ArrayJobId="97", ArrayTaskId="2", JobState="PENDING"),
        running("", JobId="99", ArrayJobId="97", ArrayTaskId="1"),
        running("", JobId="98", ArrayJobId="97", ArrayTaskId="0"),
    ]
    jobs = Slurm(FakeSqueue(tasks), wait=0).jobs("97")
    assert [j.display_id for j in jobs] == ["97_0", "97_1", "97_2", "97_3"]


@pytest.mark.parametrize("state", ["PENDING", "EXPEDITING", "REQUEUE_HOLD", "SPECIAL_EXIT"])
def test_a_waiting_jobs_start_time_is_no_start(state: str) -> None:
    """A job waiting to start (Slurm's base state PENDING, whatever name its flag gives it:
    25.11's EXPEDITING, REQUEUE_HOLD) shows the scheduler's estimate as StartTime; an EXPEDITING
    job's estimate read as the start of an execution."""
    fake = FakeSqueue([running("x", JobState=state, NodeList="(null)")])
    job = Slurm(fake, wait=0).jobs("7")[0]
    assert (job.state, job.start_time) == (state, None)


def test_a_submission_folder_that_is_gone_is_not_called_a_missing_slurm(tmp_path) -> None:
    """The supervisor runs sbatch in the job's submission folder: a folder the user removed
    since was reported as "'sbatch' not found on PATH; is Slurm's client installed?"; a folder
    that became a file raised NotADirectoryError out of the adapter."""
    from slurm_dispatch.slurm.adapter import run_command

    with pytest.raises(SlurmError) as info:
        run_command(["true"], cwd=str(tmp_path / "gone"))
    text = str(info.value)
    assert "not found on PATH" not in text
    assert f"{tmp_path / 'gone'}" in text and "does not exist" in text
    (tmp_path / "afile").write_text("")
    with pytest.raises(SlurmError, match="afile.*not a folder"):
        run_command(["true"], cwd=str(tmp_path / "afile"))


def test_a_slurm_command_not_on_path_names_the_path(tmp_path) -> None:
    """Under a systemd unit the PATH is the unit's, not the shell's: the error names it."""
    from slurm_dispatch.slurm.adapter import run_command

    with pytest.raises(SlurmError) as info:
        run_command(["squeue"], env={"PATH": str(tmp_path / "bin")})
    assert f"'squeue' not found on PATH ({tmp_path / 'bin'})" in str(info.value)
