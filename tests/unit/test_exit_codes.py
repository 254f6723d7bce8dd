"""Recovery by exit code (docs/user-guide.md).  --stop-on-exit CODES means never restart,
--restart-on-exit CODES restart without spending the --resubmit budget (also #DISPATCH lines);
`dispatch plan` shows them, the supervisor applies them to the script's own exit status as
Slurm reports it, and records them with the decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.control import events, plan, status, status_text, submit
from slurm_dispatch.control.sbatch_args import parse_codes
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.jobs import exit_code_text

from ..fakes.cluster import FakeCluster
from .test_no_progress import home, last_id, new_job  # noqa: F401 - the fixture


def test_codes_parse_and_refuse_by_name() -> None:
    assert parse_codes("3,5-7, 9", "--stop-on-exit") == [3, 5, 6, 7, 9]
    with pytest.raises(UsageError, match="'0' is outside 1..255"):
        parse_codes("0", "--stop-on-exit")
    with pytest.raises(UsageError, match="--restart-on-exit 'x,3': 'x' is not an exit code"):
        parse_codes("x,3", "--restart-on-exit")
    with pytest.raises(UsageError, match="7-5"):
        parse_codes("7-5", "--stop-on-exit")
    # squeue's exit_code is a wait status on 22.05 (768 for exit 3); scontrol writes 3:0.
    assert [exit_code_text(v) for v in ("768", "9", "3:0", "", None)] == [
        "3:0",
        "0:9",
        "3:0",
        None,
        None,
    ]


def test_options_directives_and_plan(home: Path) -> None:  # noqa: F811
    (home / "d.sh").write_text(
        "#!/bin/bash\n#DISPATCH --checkpoint ck --stop-on-exit 2-4\n"
        "#DISPATCH --restart-on-exit 75\n"
    )
    request = submit.read_request(["d.sh"])
    assert (request.options.stop_on_exit, request.options.restart_on_exit) == ([2, 3, 4], [75])
    text = plan.describe(request)
    assert (
        "  exit codes     2-4: stop, never restarted (--stop-on-exit); 75: restarted "
        "without spending the resubmit budget (--restart-on-exit)" in text
    )
    assert "none named" in plan.describe(submit.read_request(["--checkpoint", "ck", "job.sh"]))
    with pytest.raises(UsageError, match="exit code.*3.*both --stop-on-exit and"):
        submit.read_request(
            ["--checkpoint", "ck", "--stop-on-exit", "3", "--restart-on-exit", "1-5", "job.sh"]
        )


def test_an_exit_code_that_means_stop_stops_whatever_the_budget(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "3", "--stop-on-exit", "3")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    cluster.set(last_id(job), JobState="FAILED", ExitCode="4:0")  # not one of them
    assert "resubmitted as submission 2" in sup.run_pass().actions[0]
    cluster.set(last_id(job), JobState="FAILED", ExitCode="3:0")
    report = sup.run_pass()
    assert report.actions == [f"{job.id}: failed: stop (exit code 3: --stop-on-exit)"]
    assert len(cluster.sbatch_calls()) == 2
    (done,) = job.history().of(events.Finished)
    assert done.rule == "stop (exit code 3: --stop-on-exit)"


def test_a_signal_is_no_exit_code(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "1", "--stop-on-exit", "9")
    cluster.set(last_id(job), JobState="FAILED", ExitCode="0:9")  # killed by SIGKILL
    assert "resubmitted" in Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions[0]


def test_a_free_restart_spends_no_budget(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "1", "--restart-on-exit", "75", "--max-no-progress", "0")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    for n in (2, 3):
        cluster.set(last_id(job), JobState="FAILED", ExitCode="75:0")
        said = sup.run_pass().actions[0]
        assert f"resubmitted as submission {n}" in said and "budget not spent" in said
    assert job.history().submissions[-1].reason == "failed (exit 75, budget not spent)"
    cluster.set(last_id(job), JobState="FAILED", ExitCode="1:0")
    assert "resubmitted as submission 4" in sup.run_pass().actions[0]  # the budget of 1
    assert job.history().submissions[-1].reason == "failed (budget 1)"
    cluster.set(last_id(job), JobState="FAILED", ExitCode="1:0")
    assert "stop (no resubmit budget)" in sup.run_pass().actions[0]
    data = status.collect(job, {}, facts_reader=lambda _: [])
    assert "resubmits 1 of 1 (and 2 by --restart-on-exit, budget not spent)" in status_text.render(
        data
    )


def test_a_shared_jobs_free_restart_is_still_a_hold(home: Path) -> None:  # noqa: F811
    cluster = FakeCluster()
    job = new_job(cluster, "--shared-checkpoint", "--restart-on-exit", "75")
    cluster.set(last_id(job), JobState="FAILED", ExitCode="75:0")
    Supervisor(Slurm(cluster, wait=0), Settings(signal=None)).run_pass()
    assert "--hold" in cluster.sbatch_calls()[-1]
    assert (
        job.history().submissions[-1].reason
        == "failed (exit 75, budget not spent): held (shared checkpoint)"
    )


def test_a_code_in_both_lists_is_refused_across_the_script_and_the_command_line(home: Path) -> None:  # noqa: F811
    """Found attacking recovery by exit code: `#DISPATCH --stop-on-exit 3` and `--restart-on-exit 3`
    on the command line were taken, the plan showing 3 under both (the supervisor stopped)."""
    (home / "d.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck --stop-on-exit 2-4\n")
    with pytest.raises(
        UsageError,
        match=r"exit code\(s\) 3 given to both --stop-on-exit "
        r"\(the script's #DISPATCH lines\) and "
        r"--restart-on-exit \(the command line\)",
    ):
        submit.read_request(["--restart-on-exit", "3,75", "d.sh"])
    # The command line's own list replaces the script's: no code in both.
    request = submit.read_request(["--stop-on-exit", "9", "--restart-on-exit", "3", "d.sh"])
    assert (request.options.stop_on_exit, request.options.restart_on_exit) == ([9], [3])


class _Accounted(FakeCluster):
    """A site keeping accounting: sacct answers for the jobs it has ended (``ended``), with
    the fields asked for (-o)."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: dict[str, dict[str, str]] = {}

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        argv = list(argv)
        if argv[0] != "sacct":
            return super().__call__(argv, env, cwd, timeout)
        self.calls.append(argv)
        from slurm_dispatch.slurm.result import Result

        fields = argv[argv.index("-o") + 1].split(",")
        job = self.ended.get(argv[argv.index("-j") + 1])
        values = (
            {
                "JobIDRaw": job["JobId"],
                "JobID": job["JobId"],
                "State": job["JobState"],
                "UID": str(__import__("os").getuid()),
                "Submit": "Unknown",
                "ExitCode": job.get("ExitCode", "0:0"),
            }
            if job
            else None
        )
        out = "|".join(values[f] for f in fields) + "\n" if values else ""
        return Result(argv, 0, out, "")


def test_an_exit_code_is_read_from_slurms_accounting_once_slurmctld_forgot_the_job(
    home: Path,
) -> None:  # noqa: F811
    """Found attacking recovery by exit code: a job that ended while no pass ran (the supervisor
    down longer than MinJobAge) has its end read from sacct, which was not asked for the exit code:
    exit 3 with --stop-on-exit 3 was resubmitted as any failure."""
    cluster = _Accounted()
    job = new_job(cluster, "--resubmit", "3", "--stop-on-exit", "3")
    slurm_id = last_id(job)
    cluster.set(slurm_id, JobState="FAILED", ExitCode="3:0")
    cluster.ended[slurm_id] = cluster.jobs.pop(slurm_id)  # aged out of slurmctld
    report = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass()
    assert len(cluster.sbatch_calls()) == 1, report.actions
    assert report.actions == [
        f"{job.id}: failed (known from Slurm's accounting (sacct)): "
        "stop (exit code 3: --stop-on-exit)"
    ], report.actions
