"""What a newcomer hits on the command line: roots that would change between
submissions, typos in option names, and dispatch options given after the script."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.control import sbatch_args, submit
from slurm_dispatch.errors import UsageError


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\necho hi\n")
    return path


@pytest.mark.parametrize("root", ["ck/%j", "ck/%A", "ck-%A_%a", "/scratch/%j/run"])
def test_a_root_that_changes_between_submissions_is_refused(script: Path, root: str) -> None:
    """With --checkpoint 'ck/%j' a resubmission got a fresh root and started from
    scratch, although resubmission promises to resume from the latest publication."""
    request = submit.read_request(["--checkpoint", root, "job.sh"])
    with pytest.raises(UsageError) as info:
        submit.checkpoint_root(request.options, request.cwd)
    text = str(info.value)
    assert repr(root) in text and "every submission" in text and "exec/<attempt>/" in text
    assert "%a" in text  # what to write instead, for arrays


@pytest.mark.parametrize("root", ["ck", "ck-%a", "ck/task%a", "ck/100%%"])
def test_fixed_roots_and_per_task_roots_are_fine(script: Path, root: str) -> None:
    request = submit.read_request(["--checkpoint", root, "job.sh"])
    assert submit.checkpoint_root(request.options, request.cwd).endswith(root.split("/")[-1])


@pytest.mark.parametrize(
    "argv,wrong,right",
    [
        (["--checkpont", "X", "job.sh"], "--checkpont", "--checkpoint"),
        (["--resubmt", "2", "job.sh"], "--resubmit", "--resubmit"),
        (["--shared-chekpoint", "job.sh"], "--shared-chekpoint", "--shared-checkpoint"),
        (["--partitoin=debug", "job.sh"], "--partitoin", "--partition"),
    ],
)
def test_typos_name_the_option_and_suggest(argv: list[str], wrong: str, right: str) -> None:
    """`--checkpont X` said "cannot read script '.../X'"."""
    with pytest.raises(UsageError) as info:
        sbatch_args.parse_command_line(argv)
    text = str(info.value)
    assert f"unrecognized option '{argv[0].split('=')[0]}'" in text
    assert f"did you mean {right}?" in text


def test_a_typo_in_a_dispatch_directive_is_named() -> None:
    text = "#!/bin/bash\n#DISPATCH --chekpoint /tmp/x\necho\n"
    with pytest.raises(
        UsageError,
        match=r"unrecognized option '--chekpoint'.*did you mean "
        r"--checkpoint\?",
    ):
        sbatch_args.read_header(text, "job.sh")


def test_options_sbatch_may_know_and_we_do_not_still_reach_sbatch() -> None:
    # Nothing like a known option: a newer sbatch's option, passed through for sbatch to judge.
    line = sbatch_args.parse_command_line(["--zzz-new-thing", "job.sh"])
    assert line.sbatch == ["--zzz-new-thing"] and line.script == "job.sh"


def test_dispatch_options_after_the_script_go_to_it_with_a_warning() -> None:
    """As with sbatch, words after the script are the script's; ours look like a
    mistake, so say so."""
    line = sbatch_args.parse_command_line(
        ["--checkpoint", "ck", "job.sh", "--resubmit", "2", "--lr", "3e-4", "--checkpoint=x"]
    )
    assert line.script_args == ["--resubmit", "2", "--lr", "3e-4", "--checkpoint=x"]
    assert line.dispatch.resubmit == 0
    assert len(line.warnings) == 1
    assert "--resubmit, --checkpoint after the script job.sh go to the script" in line.warnings[0]
    assert sbatch_args.parse_command_line(["job.sh", "--lr", "1"]).warnings == []


def test_dispatch_sbatch_prints_the_warning(
    script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurm_dispatch.cli import sbatch as cli_sbatch

    with pytest.raises(SystemExit) as info:
        cli_sbatch.main(["--checkpoint", "ck", "--plan", "job.sh", "--resubmit", "3"])
    assert info.value.code in (0, None)
    err = capsys.readouterr().err
    assert "dispatch-sbatch: warning: --resubmit after the script job.sh go to the script" in err


class OneAnswer:
    """A fake sbatch that answers once, as told, and records what it was asked."""

    def __init__(self, rc: int, stdout: str = "", stderr: str = "") -> None:
        self.answer = (rc, stdout, stderr)
        self.calls: list[list[str]] = []

    def __call__(self, argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        from slurm_dispatch.slurm.result import Result

        self.calls.append(list(argv))
        assert argv[0] == "sbatch", argv
        return Result(list(argv), *self.answer)


def test_a_refused_submission_leaves_no_folder_behind(script: Path) -> None:
    """`--partition=nope` left the newly made (empty) checkpoint folders behind."""
    from slurm_dispatch.control import record
    from slurm_dispatch.errors import SlurmError
    from slurm_dispatch.slurm.adapter import Slurm

    (script.parent / "runs").mkdir()
    fake = OneAnswer(1, stderr="sbatch: error: invalid partition specified: nope\n")
    with pytest.raises(SlurmError):
        submit.submit_new(
            submit.read_request(["--checkpoint", "runs/a/b/ck", "-p", "nope", "job.sh"]),
            Slurm(fake, wait=0),
        )
    assert list((script.parent / "runs").iterdir()) == []  # runs/ was there: it stays
    assert record.all_jobs() == []


def test_test_only_is_passed_through_and_records_nothing(script: Path) -> None:
    """`--test-only` failed with "sbatch printed no job id" and left folders."""
    from slurm_dispatch.control import record
    from slurm_dispatch.slurm.adapter import Slurm

    estimate = (
        "sbatch: Job 77 to start at 2026-11-30T15:00:00 using 1 processors on nodes "
        "n1 in partition debug\n"
    )
    fake = OneAnswer(0, stderr=estimate)
    result = submit.test_only(
        submit.read_request(["--checkpoint", "ck", "--test-only", "job.sh"]), Slurm(fake, wait=0)
    )
    assert result.returncode == 0 and result.stderr == estimate
    assert fake.calls[0][:2] == ["sbatch", "--test-only"]
    assert fake.calls[0][-1] == str(script)
    assert not (script.parent / "ck").exists() and record.all_jobs() == []


def test_a_root_another_live_job_of_yours_uses_is_refused(script: Path) -> None:
    """Two `dispatch-sbatch --checkpoint ck-dup` went in side by side, both at epoch
    1000000, and their publications interleaved."""
    from slurm_dispatch.control import record
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    cluster = FakeCluster(first_id=20)
    first = submit.submit_new(
        submit.read_request(["--checkpoint", "ck-dup", "job.sh"]), Slurm(cluster, wait=0)
    )
    with pytest.raises(UsageError) as info:
        submit.submit_new(
            submit.read_request(["--checkpoint", "./ck-dup/", "job.sh"]), Slurm(cluster, wait=0)
        )
    text = str(info.value)
    assert first.job.id in text and "--supersede" in text and "ck-dup" in text
    assert "RUNNING" in text and len(record.all_jobs()) == 1
    # Once its Slurm job has ended, the root is free again.
    cluster.set(first.slurm_job_id, JobState="COMPLETED")
    again = submit.submit_new(
        submit.read_request(["--checkpoint", "ck-dup", "job.sh"]), Slurm(cluster, wait=0)
    )
    assert again.job.id != first.job.id


def test_every_submission_runs_with_the_first_submissions_environment(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted with TOY_STEPS=10, then `TOY_STEPS=20 dispatch resubmit` ran to step
    20; the supervisor, run from scrontab or a timer, has none of the user's environment."""
    import stat

    from slurm_dispatch.slurm.adapter import Slurm
    from slurm_dispatch.slurm.result import Result

    seen: list[dict[str, str]] = []

    def sbatch(argv, env, cwd, timeout):  # type: ignore[no-untyped-def]
        seen.append(dict(env))
        return Result(list(argv), 0, f"Submitted batch job {30 + len(seen)}\n", "")

    monkeypatch.setenv("TOY_STEPS", "10")
    monkeypatch.setenv("ODD", "a=b\nc")
    first = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(sbatch, wait=0)
    )
    saved = Path(first.job.path) / "environment"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    monkeypatch.setenv("TOY_STEPS", "20")
    monkeypatch.delenv("ODD")
    monkeypatch.setenv("PATH", "/nowhere")
    submit.resubmit(Slurm(sbatch, wait=0), first.job)
    assert seen[1]["TOY_STEPS"] == "10" and seen[1]["ODD"] == "a=b\nc"
    assert seen[1]["PATH"] == seen[0]["PATH"] != "/nowhere"
    assert seen[1] == seen[0]


def test_resubmit_while_a_submission_runs_is_refused_without_force(script: Path) -> None:
    """`dispatch resubmit` while a submission was still running made a second copy
    (status then read "resubmits 1 of 0")."""
    from click.testing import CliRunner

    from slurm_dispatch.cli import dispatch as cli
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    cluster = FakeCluster(first_id=40)
    first = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(cluster, wait=0)
    )
    with pytest.raises(UsageError, match=r"still has Slurm job\(s\) 40 \(RUNNING\).*--force"):
        submit.refuse_while_live(Slurm(cluster, wait=0), first.job)
    cluster.set("40", JobState="FAILED")
    submit.refuse_while_live(Slurm(cluster, wait=0), first.job)  # ended: allowed
    runner = CliRunner()
    result = runner.invoke(cli.main, ["resubmit", "--help"])
    assert "--force" in result.output


@pytest.mark.parametrize(
    "value,signal,seconds",
    [
        ("300", "USR1", 300),
        ("5:00", "USR1", 300),
        ("120:TERM", "TERM", 120),
        ("5:00:usr2", "USR2", 300),
        ("10:SIGINT", "INT", 10),
    ],
)
def test_warn_before_reads_time_and_signal(value: str, signal: str, seconds: int) -> None:
    assert sbatch_args.parse_warning(value) == (signal, seconds)


@pytest.mark.parametrize(
    "value,words",
    [
        ("0", "outside 1..65535"),
        ("70000", "outside 1..65535"),
        ("x", "seconds or MM:SS"),
        ("10:KILLME", "unknown signal 'KILLME'"),
        ("1:2:3", "seconds or MM:SS"),
    ],
)
def test_warn_before_refuses_bad_values(value: str, words: str) -> None:
    with pytest.raises(UsageError, match=f"--warn-before '{value}'.*{words}"):
        sbatch_args.parse_warning(value)


def test_warn_before_signals_the_job_script_before_its_time_limit(script: Path) -> None:
    """Save before the time limit (docs/user-guide.md).  sbatch's plain --signal reaches srun steps
    only, never a trainer the job script runs itself, so the warning goes to the batch shell."""
    fake = OneAnswer(0, "Submitted batch job 60\n")
    from slurm_dispatch.slurm.adapter import Slurm

    script.write_text("#!/bin/bash\n#DISPATCH --warn-before 2:00\necho hi\n")
    submit.submit_new(submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(fake, wait=0))
    assert "--signal=B:USR1@120" in fake.calls[0]
    with pytest.raises(UsageError, match="both were given"):
        submit.read_request(
            ["--checkpoint", "ck", "--warn-before", "60", "--signal=USR2@30", "job.sh"]
        )
