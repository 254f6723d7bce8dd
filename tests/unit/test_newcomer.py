"""What a newcomer hits on the command line (issue 9): roots that would change between
submissions, typos in option names, and dispatch options given after the script."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch import sbatch_args, submit
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
    """Item 2: with --checkpoint 'ck/%j' a resubmission got a fresh root and started from
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


@pytest.mark.parametrize("argv,wrong,right", [
    (["--checkpont", "X", "job.sh"], "--checkpont", "--checkpoint"),
    (["--resubmt", "2", "job.sh"], "--resubmit", "--resubmit"),
    (["--shared-chekpoint", "job.sh"], "--shared-chekpoint", "--shared-checkpoint"),
    (["--partitoin=debug", "job.sh"], "--partitoin", "--partition"),
])
def test_typos_name_the_option_and_suggest(argv: list[str], wrong: str, right: str) -> None:
    """Item 11: `--checkpont X` said "cannot read script '.../X'"."""
    with pytest.raises(UsageError) as info:
        sbatch_args.parse_command_line(argv)
    text = str(info.value)
    assert f"unrecognized option '{argv[0].split('=')[0]}'" in text
    assert f"did you mean {right}?" in text


def test_a_typo_in_a_dispatch_directive_is_named() -> None:
    text = "#!/bin/bash\n#DISPATCH --chekpoint /tmp/x\necho\n"
    with pytest.raises(UsageError, match=r"unrecognized option '--chekpoint'.*did you mean "
                                         r"--checkpoint\?"):
        sbatch_args.read_header(text, "job.sh")


def test_options_sbatch_may_know_and_we_do_not_still_reach_sbatch() -> None:
    # Nothing like a known option: a newer sbatch's option, passed through for sbatch to judge.
    line = sbatch_args.parse_command_line(["--zzz-new-thing", "job.sh"])
    assert line.sbatch == ["--zzz-new-thing"] and line.script == "job.sh"


def test_dispatch_options_after_the_script_go_to_it_with_a_warning() -> None:
    """Item 12: as with sbatch, words after the script are the script's; ours look like a
    mistake, so say so."""
    line = sbatch_args.parse_command_line(["--checkpoint", "ck", "job.sh", "--resubmit", "2",
                                           "--lr", "3e-4", "--checkpoint=x"])
    assert line.script_args == ["--resubmit", "2", "--lr", "3e-4", "--checkpoint=x"]
    assert line.dispatch.resubmit == 0
    assert len(line.warnings) == 1
    assert "--resubmit, --checkpoint after the script job.sh go to the script" in \
        line.warnings[0]
    assert sbatch_args.parse_command_line(["job.sh", "--lr", "1"]).warnings == []


def test_dispatch_sbatch_prints_the_warning(script: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    from slurm_dispatch import cli_sbatch
    with pytest.raises(SystemExit) as info:
        cli_sbatch.main(["--checkpoint", "ck", "--plan", "job.sh", "--resubmit", "3"])
    assert info.value.code in (0, None)
    err = capsys.readouterr().err
    assert "dispatch-sbatch: warning: --resubmit after the script job.sh go to the script" in err
