"""The plan printed before anything is submitted: rules, and holds standing in for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.control import plan, rules, submit
from slurm_dispatch.errors import ConfigError, UsageError


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck\necho hi\n")
    return tmp_path


def rows(text: str) -> dict[str, str]:
    lines = text.split("END STATE")[1].splitlines()[1:]
    return {line[2:17].strip(): line[17:].strip() for line in lines if line.startswith("  ")}


def test_isolated_plan_keeps_slurms_requeue(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(script / "none.conf"))
    (script / "none.conf").write_text("")
    text = plan.describe(submit.read_request(["--resubmit", "2", "job.sh"]))
    table = rows(text)
    assert table["node failure"].startswith("Slurm requeues it (R+1)")
    assert table["failed"] == "resubmit (budget 2)"
    assert table["cancelled"].startswith("stop")
    assert f"checkpoint  {script / 'ck'}" in text and "Nothing was submitted." in text
    assert "array" not in text
    with pytest.raises(UsageError, match="one root for all 4 tasks"):  # as dispatch-sbatch
        plan.describe(submit.read_request(["--resubmit", "2", "--array=0-3", "job.sh"]))
    text = plan.describe(
        submit.read_request(["--checkpoint", "ck/t%a", "--resubmit", "2", "--array=0-3", "job.sh"])
    )
    assert (
        "  array       4 task(s), each on its own: a task's end, budget, submission "
        "numbers and holds are its own; a failed task is resubmitted alone" in text
    )


def test_shared_plan_shows_each_substitution_with_site_settings(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = script / "dispatch.conf"
    conf.write_text("SharedHoldFor=12:00:00\nCessationSignal=/opt/site/bin/cease\n")
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    table = rows(
        plan.describe(submit.read_request(["--shared-checkpoint", "--resubmit", "3", "job.sh"]))
    )
    assert table["node failure"] == (
        "resubmit (budget 3) -> hold for a person, up to 12 h; lifted by /opt/site/bin/cease"
    )
    # Every end is shown in the rule table's own words (a rule changed there shows here).
    shown = rules.rules_for(True, 3, "12 h", "/opt/site/bin/cease")
    assert {rule.end_state: rule.text for rule in shown} == {
        state: table[state] for state in rules.ORDER
    }
    conf.write_text("HoldNotify=/opt/site/bin/tell\nHoldWarning=1:00:00\n")
    text = plan.describe(submit.read_request(["--shared-checkpoint", "--resubmit", "1", "job.sh"]))
    assert (
        "A hold is told by mail (Slurm's MailProg, to --mail-user or you) and by "
        "/opt/site/bin/tell when it is made and 1 h before it expires" in text
    )
    conf.write_text("CessationSignal=\n")
    table = rows(
        plan.describe(submit.read_request(["--shared-checkpoint", "--resubmit", "1", "job.sh"]))
    )
    assert table["timeout"].endswith("up to 24 h; lifted by a person (no CessationSignal)")


def test_bad_site_config_is_an_error_naming_it(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = script / "dispatch.conf"
    conf.write_text("SharedHoldFor=soon\n")
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    with pytest.raises(ConfigError, match="SharedHoldFor.*'soon'"):
        plan.describe(submit.read_request(["--shared-checkpoint", "job.sh"]))


def test_the_plan_says_what_slurms_requeue_does(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's requeued job starts again after the requeue delay (the plan
    said "at once"); --requeue=expedite (25.11) passes through, and the plan says what Slurm
    then does: a node failure's requeue at once and first, a non-zero exit's held
    (REQUEUE_HOLD) unless an Epilog failed."""
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(script / "none.conf"))
    (script / "none.conf").write_text("")
    plain = rows(plan.describe(submit.read_request(["--resubmit", "2", "job.sh"])))
    assert plain["node failure"] == (
        "Slurm requeues it (R+1); it may start again after the requeue delay (120 s by default)"
    )
    assert plain["preempted"] == plain["node failure"] and "at once" not in plain["preempted"]
    request = submit.read_request(["--resubmit", "2", "--requeue=expedite", "job.sh"])
    assert request.sbatch == ["--requeue=expedite"] and request.expedited
    fast = rows(plan.describe(request))
    assert fast["node failure"].startswith(
        "Slurm requeues it (R+1), EXPEDITING: it starts again at once, first in the queue"
    )
    assert "eligible again at once" in fast["preempted"]
    assert "held (REQUEUE_HOLD) until `scontrol release`" in fast["failed"]
    assert fast["timeout"] == "resubmit (budget 2)" and fast["cancelled"] == plain["cancelled"]
    # In the script too; the last of --requeue and --no-requeue wins, the command line last.
    (script / "fast.sh").write_text(
        "#!/bin/bash\n#DISPATCH --checkpoint ck\n#SBATCH --requeue=expedite\necho hi\n"
    )
    assert submit.read_request(["fast.sh"]).expedited
    assert not submit.read_request(["--no-requeue", "fast.sh"]).expedited
    assert not submit.read_request(["--requeue", "job.sh"]).expedited
    assert (
        submit.read_request(["--comment", "--requeue", "--requeue=exp", "job.sh"]).expedited
        is False
    )  # '--requeue' there is --comment's value; --requeue=exp is sbatch's to refuse
    with pytest.raises(UsageError, match="--requeue contradicts --shared-checkpoint"):
        submit.read_request(["--shared-checkpoint", "--requeue=expedite", "job.sh"])


@pytest.mark.parametrize("where", ["afile", "afile/run1"])
def test_a_root_that_is_a_file_is_refused_as_dispatch_sbatch_refuses_it(
    script: Path, where: str
) -> None:
    """Found attacking the plan: `dispatch plan --checkpoint afile job.sh` (and
    dispatch-sbatch --plan) printed the plan for a root that is a file, 'Nothing was
    submitted', exit 0, where dispatch-sbatch refuses it: the plan says what submitting it
    would do, and submitting it is refused."""
    (script / "afile").write_text("x\n")
    with pytest.raises(UsageError) as refused:
        plan.describe(submit.read_request(["--checkpoint", where, "job.sh"]))
    assert "'" + str(script / "afile") + "' is a file, not a folder: give a folder" in str(
        refused.value
    )
    assert not (script / "afile/run1").exists()
