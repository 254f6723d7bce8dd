"""dispatch-sbatch's submission logic against a fake controller that fails loudly on any
call it was not told to expect (the process boundary), plus the launcher run for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pytest

from slurm_dispatch.control import record, submit
from slurm_dispatch.errors import RecordError, SlurmError, SlurmUnavailable, UsageError
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes import squeue


class FakeController:
    """Answers exactly the calls queued with expect(); anything else fails the test."""

    def __init__(self) -> None:
        self.expected: list[tuple[list[str], Result, Optional[list[dict[str, str]]]]] = []
        self.calls: list[list[str]] = []
        self.cwds: list[Optional[str]] = []

    def expect(
        self,
        prefix: list[str],
        stdout: str = "",
        rc: int = 0,
        stderr: str = "",
        jobs: Optional[list[dict[str, str]]] = None,
    ) -> None:
        """Queue an answer; ``jobs`` (scontrol-style fields) answers a squeue read."""
        self.expected.append((prefix, Result(prefix, rc, stdout, stderr), jobs))

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        argv = list(argv)
        self.calls.append(argv)
        self.cwds.append(cwd)
        if not self.expected:
            raise AssertionError(f"unexpected Slurm call {argv}")
        prefix, result, jobs = self.expected.pop(0)
        if argv[: len(prefix)] != prefix:
            raise AssertionError(f"expected a call starting {prefix}, got {argv}")
        if jobs is not None:
            return Result(argv, 0, squeue.render(argv, jobs), "")
        return result

    def done(self) -> None:
        assert not self.expected, f"calls never made: {self.expected}"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH -N 1\necho hi\n")
    return tmp_path


def make(argv: list[str], fake: FakeController) -> submit.SubmissionMade:
    return submit.submit_new(submit.read_request(argv), Slurm(fake, wait=0))


def test_first_submission_records_job_and_sbatch_line(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 42\n")
    done = make(["--checkpoint", "ck", "--resubmit", "2", "-t", "5", "job.sh", "a b"], fake)
    fake.done()
    argv = fake.calls[0]
    assert argv[:3] == ["sbatch", "-t", "5"]
    assert "--job-name=job.sh" in argv and f"--comment=dispatch:{done.job.id}/1" in argv
    assert argv[-2:] == [done.job.batch_script(1), "a b"]
    assert fake.cwds == [str(env)], "sbatch runs where the user submitted (its default chdir)"
    spec = done.job.spec
    assert (spec["generation"], spec["resubmit"], spec["checkpoint"]) == (0, 2, str(env / "ck"))
    assert (env / "ck").is_dir()
    assert Path(done.job.script).read_text() == (env / "job.sh").read_text()
    assert os.stat(done.job.path).st_mode & 0o077 == 0, "records are the user's alone"
    assert [e["slurm_job_id"] for e in done.job.submissions()] == ["42"]


def test_user_job_name_and_comment_are_kept(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], "7;cluster\n")
    # No marker: the job's SLUID would tell it apart, but 24.11 has none (no controller call)
    fake.expect(["squeue", "--version"], "slurm 24.11.5\n")
    done = make(["--checkpoint", "ck", "-J", "mine", "--comment=c", "job.sh"], fake)
    assert done.slurm_job_id == "7"
    assert not any(
        a.startswith("--job-name=") or a.startswith("--comment=dispatch") for a in fake.calls[0]
    )
    assert fake.calls[1:] == [["squeue", "--version"]]


def test_shared_checkpoint_disables_slurm_requeue(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 8\n")
    make(["--checkpoint", "ck", "--shared-checkpoint", "job.sh"], fake)
    assert "--no-requeue" in fake.calls[0]


def test_sbatch_refusal_leaves_no_job(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], rc=1, stderr="sbatch: error: invalid partition specified: nope\n")
    with pytest.raises(SlurmError) as info:
        make(["--checkpoint", "ck", "-p", "nope", "job.sh"], fake)
    assert "invalid partition specified: nope" in str(info.value)
    assert info.value.returncode == 1
    assert record.all_jobs() == []


def test_transient_failure_finds_the_landed_job_instead_of_resubmitting(env: Path) -> None:
    calls: list[list[str]] = []

    def answer(argv, env_, cwd, timeout):  # type: ignore[no-untyped-def]
        argv = list(argv)
        calls.append(argv)
        if argv[0] == "sbatch":
            return Result(argv, 1, "", "sbatch: error: Socket timed out on send/recv\n")
        assert argv[0] == "squeue", f"unexpected Slurm call {argv}"
        if len(calls) < 4:
            return Result(argv, 0, "", "")  # the first timed-out sbatch had not landed
        marker = [a for a in calls[-2] if a.startswith("--comment=")][0].split("=", 1)[1]
        jobs = [{"JobId": "98", "Comment": "other"}, {"JobId": "99", "Comment": marker}]
        return Result(argv, 0, squeue.render(argv, jobs), "")  # the second one had

    done = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(answer, wait=0)
    )
    assert done.slurm_job_id == "99"
    assert [c[0] for c in calls] == ["sbatch", "squeue", "sbatch", "squeue"]
    assert [e["slurm_job_id"] for e in done.job.submissions()] == ["99"]


def test_controller_down_is_clear_and_leaves_no_job(env: Path) -> None:
    fake = FakeController()
    for _ in range(2):
        fake.expect(
            ["sbatch"],
            rc=1,
            stderr="sbatch: error: Batch job submission failed: Unable to contact "
            "slurm controller (connect failure)\n",
        )
        fake.expect(["squeue"], rc=1, stderr="squeue: error: Unable to contact slurm controller")
    with pytest.raises(SlurmUnavailable, match="Unable to contact slurm controller"):
        submit.submit_new(
            submit.read_request(["--checkpoint", "ck", "job.sh"]), Slurm(fake, attempts=2, wait=0)
        )
    fake.done()
    assert record.all_jobs() == []


@pytest.mark.parametrize(
    "argv,content,word",
    [
        (["--checkpoint", "ck"], None, "no batch script"),
        (["--checkpoint", "ck", "missing.sh"], None, "'missing.sh'"),
        (["job.sh"], None, "no checkpoint root"),
        (["--checkpoint", "ck", "crlf.sh"], "#!/bin/bash\r\necho\r\n", "DOS line breaks"),
        (["--checkpoint", "ck", "--wrap=hostname"], None, "--wrap"),
        (
            ["--checkpoint", "ck", "--shared-checkpoint", "--requeue", "job.sh"],
            None,
            "--requeue contradicts --shared-checkpoint",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_made(
    env: Path, argv: list[str], content: Optional[str], word: str
) -> None:
    if content is not None:
        (env / argv[-1]).write_text(content)
    with pytest.raises(UsageError, match=word):
        make(argv, FakeController())
    assert record.all_jobs() == []


@pytest.mark.parametrize(
    "given,named",
    [
        ("afile", "checkpoint root '.*/afile' is a file, not a folder"),
        (
            "afile/run1",
            "checkpoint root '.*/afile/run1': its folder '.*/afile' is a file, not a folder",
        ),
    ],
)
def test_a_root_that_is_a_file_is_named_so(env: Path, given: str, named: str) -> None:
    (env / "afile").write_text("notes\n")
    with pytest.raises(UsageError, match=named):
        make(["--checkpoint", given, "job.sh"], FakeController())
    assert (env / "afile").read_text() == "notes\n"
    assert record.all_jobs() == []


def test_unwritable_root_is_refused(tmp_path: Path) -> None:
    public = Path(tempfile.mkdtemp(prefix="dispatch-test-"))
    public.chmod(0o755)
    (public / "job.sh").write_text("#!/bin/bash\necho hi\n")
    (public / "ro").mkdir(mode=0o555)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child, as nobody
        os.setgid(65534)
        os.setuid(65534)
        os.environ["DISPATCH_HOME"] = str(public / "home")
        os.chdir(public)
        try:
            make(["--checkpoint", "ro", "job.sh"], FakeController())
        except UsageError as exc:
            os._exit(0 if "not writable" in str(exc) else 3)
        os._exit(4)
    _, status = os.waitpid(pid, 0)
    shutil.rmtree(public)
    assert os.waitstatus_to_exitcode(status) == 0


def test_resubmit_claims_each_submission_once(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 1\n")
    job = make(["--checkpoint", "ck", "job.sh"], fake).job
    fake.expect(["sbatch"], "Submitted batch job 2\n")
    done = submit.resubmit(Slurm(fake, wait=0), job)
    assert done.submission == 2 and f"--comment=dispatch:{job.id}/2" in fake.calls[-1]
    assert Path(job.batch_script(2)).read_text().count("--submission 2") == 1
    # A second resubmitter that lost the claim race for submission 3 finds it taken.
    assert job.claim("submission-3")
    fake.expect(["squeue"], "")
    with pytest.raises(RecordError, match="submission 3 is being made"):
        submit.resubmit(Slurm(fake, wait=0), job)
    fake.done()


def test_resubmit_runs_sbatch_from_the_first_submissions_directory(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 1\n")
    job = make(["--checkpoint", "ck", "job.sh"], fake).job
    os.chdir("/")
    fake.expect(["sbatch"], "Submitted batch job 2\n")
    submit.resubmit(Slurm(fake, wait=0), job)
    assert fake.cwds == [str(env), str(env)] and os.getcwd() == "/"


def test_resubmit_refuses_when_the_submission_directory_is_gone(tmp_path: Path, env: Path) -> None:
    sub = env / "sub"
    sub.mkdir()
    (sub / "job.sh").write_text("#!/bin/bash\necho hi\n")
    os.chdir(sub)
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 1\n")
    job = make(["--checkpoint", "ck", "job.sh"], fake).job
    os.chdir(env)
    shutil.rmtree(sub)
    with pytest.raises(UsageError, match="submission directory .* is gone"):
        submit.resubmit(Slurm(fake, wait=0), job)
    fake.done()
    assert not job.has_claim("submission-2")


def test_supersede_raises_generation_and_cancels_old(env: Path) -> None:
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 10\n")
    old = make(["--checkpoint", "ck", "job.sh"], fake).job
    # The old job carries its submission's marker, as sbatch gave it.
    fake.expect(
        ["squeue", "--me"],
        jobs=[{"JobId": "10", "JobState": "RUNNING", "Comment": f"dispatch:{old.id}/1"}],
    )
    fake.expect(["sbatch"], "Submitted batch job 11\n")
    fake.expect(["scancel", "10"])
    new = make(["--supersede", old.id, "job.sh"], fake).job
    fake.done()
    assert new.spec["generation"] == 1 and new.spec["checkpoint"] == old.spec["checkpoint"]
    assert [e["by"] for e in old.events() if e["event"] == "superseded"] == [new.id]
    assert fake.calls[2][0] == "sbatch" and "--hold" not in fake.calls[2]  # isolated: not held


LAUNCHED = """#!/usr/bin/env python3
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                  if k.startswith("DISPATCH_") or k == "SLURM_EXPORT_ENV"}}))
"""


def test_launcher_gives_identity_and_execs_script(env: Path) -> None:
    (env / "job.py").write_text(LAUNCHED)
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 5\n")
    job = make(["--checkpoint", "ck", "job.py"], fake).job
    run_env = {
        **os.environ,
        "SLURM_JOB_ID": "5",
        "SLURM_RESTART_COUNT": "2",
        "SLURMD_NODENAME": "n9",
        "SLURM_EXPORT_ENV": "NONE",
    }
    outs = []
    for _ in range(2):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "slurm_dispatch.launch",
                "--job",
                job.path,
                "--submission",
                "1",
                "--",
                "x",
                "y z",
            ],
            env=run_env,
            capture_output=True,
            text=True,
            check=True,
        )
        header, _, printed = proc.stdout.partition("\n")
        assert header.startswith("==> slurm-dispatch: ") and header.endswith(" <==")
        assert f"dispatch job {job.id} submission 1, Slurm job 5 restart 2 on n9" in header
        outs.append(json.loads(printed))
    first = outs[0]
    assert first["argv"] == ["x", "y z"]
    e = first["env"]
    assert e["DISPATCH_EPOCH"] == "1000002" and e["DISPATCH_JOB"] == job.id
    assert e["DISPATCH_EXEC_DIR"] == str(env / "ck" / "exec" / e["DISPATCH_ATTEMPT"])
    assert os.path.isdir(e["DISPATCH_EXEC_DIR"]) and e["DISPATCH_RESUME_FROM"] == ""
    assert "DISPATCH_ATTEMPT" in e["SLURM_EXPORT_ENV"].split(",")
    assert outs[1]["env"]["DISPATCH_ATTEMPT"] != e["DISPATCH_ATTEMPT"]
    started = [ev for ev in job.events() if ev["event"] == "started"]
    assert [(s["restart"], s["node"]) for s in started] == [(2, "n9"), (2, "n9")]


def test_launcher_refuses_a_garbled_store(env: Path) -> None:
    (env / "job.py").write_text(LAUNCHED)
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 5\n")
    job = make(["--checkpoint", "ck", "job.py"], fake).job
    (env / "ck" / "pub").mkdir()
    (env / "ck" / "pub" / "junk").touch()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            job.path,
            "--submission",
            "1",
            "--",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "'junk'" in proc.stderr and proc.stdout == ""


def test_superseding_a_shared_job_is_held_until_the_old_one_ceased(env: Path) -> None:
    """Finding 7: --supersede of a shared-checkpoint job started generation G+1 un-held
    before cancelling the old one (sbatch, sbatch, scancel): two generations on one mutable
    checkpoint.  The superseding job is held like any other restart of a shared job."""
    fake = FakeController()
    fake.expect(["sbatch"], "Submitted batch job 10\n")
    old = make(["--checkpoint", "ck", "--shared-checkpoint", "--resubmit", "1", "job.sh"], fake).job
    # The old job carries its submission's marker, as sbatch gave it.
    fake.expect(
        ["squeue", "--me"],
        jobs=[{"JobId": "10", "JobState": "RUNNING", "Comment": f"dispatch:{old.id}/1"}],
    )
    fake.expect(["sbatch"], "Submitted batch job 11\n")
    fake.expect(["scancel", "10"])
    new = make(["--supersede", old.id, "job.sh"], fake).job
    fake.done()
    sbatch = fake.calls[2]
    assert "--hold" in sbatch, sbatch
    assert any(a.startswith("--comment=dispatch:") and "held" in a for a in sbatch)
    holds = [e for e in new.events() if e["event"] == "hold"]
    assert len(holds) == 1
    hold = holds[0]
    assert (hold["submission"], hold["slurm_job_id"], hold["ended_slurm_job_id"]) == (1, "11", "10")
    assert hold["deadline"] > time.time() + 23 * 3600
    assert new.spec["shared_checkpoint"] is True  # the new generation shares it too
    # Killed between sbatch and the hold event: the submission carries the hold it was made
    # with, so the supervisor still knows what it waits for and when it expires.
    for name in os.listdir(os.path.join(new.path, "events")):
        if name.startswith("hold-"):
            os.unlink(os.path.join(new.path, "events", name))
    recovered = new.history().lineage().hold
    assert recovered is not None and recovered.ended_slurm_job_id == "10"
    assert recovered.deadline == hold["deadline"]


def test_a_dispatch_lines_root_expands_variables_as_the_command_line_would(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user guide's `/scratch/$USER/run1`, written in a `#DISPATCH` line (which no shell
    reads), is the same root as on the command line, not a folder named `$USER`."""
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("RUN", "run1")
    (env / "job.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck/$USER/${RUN}\necho\n")
    request = submit.read_request(["job.sh"])
    assert submit.checkpoint_root(request.options, request.cwd) == str(env / "ck/alice/run1")


@pytest.mark.parametrize(
    "root,named",
    [
        ("ck/$NOT_SET_HERE/r", r"\$NOT_SET_HERE is not set"),
        ("ck/a$/r", "a '\\$' that names no variable"),
    ],
)
def test_a_root_with_a_variable_that_cannot_expand_is_refused(
    env: Path, root: str, named: str
) -> None:
    (env / "job.sh").write_text(f"#!/bin/bash\n#DISPATCH --checkpoint {root}\necho\n")
    with pytest.raises(UsageError, match=named):
        make(["job.sh"], FakeController())
    assert not (env / "ck").exists()
    assert record.all_jobs() == []


@pytest.mark.parametrize("root", ["ck\nrun", "ck\trun", "ck\x1b[2Jrun"])
def test_a_root_with_a_control_character_is_refused(env: Path, root: str) -> None:
    with pytest.raises(UsageError, match="holds a control character"):
        make(["--checkpoint", root, "job.sh"], FakeController())
    assert not any(p.name.startswith("ck") for p in env.iterdir())
    assert record.all_jobs() == []


def test_every_table_shows_a_cell_on_one_line() -> None:
    from slurm_dispatch._table import render_table

    text = render_table(["JOBID", "ROOT"], [["1", "/ck\nfake-row"], ["2", "/ck\x1b[2J"]])
    assert text.splitlines() == ["JOBID ROOT", "1     /ck\\nfake-row", "2     /ck\\x1b[2J"]


def test_a_command_line_root_is_taken_as_the_shell_left_it(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell expanded the command line already: a '$' still in it is one the user quoted
    (a folder named so), never expanded a second time nor refused."""
    monkeypatch.setenv("B", "expanded")
    request = submit.read_request(["--checkpoint", "ck/a$B/p$5", "job.sh"])
    assert submit.checkpoint_root(request.options, request.cwd) == str(env / "ck/a$B/p$5")
    monkeypatch.setenv("RUN", "x$B")  # a value holding a '$': expanded once, as the shell did
    (env / "job.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck/$RUN\necho\n")
    request = submit.read_request(["job.sh"])
    assert submit.checkpoint_root(request.options, request.cwd) == str(env / "ck/x$B")


@pytest.mark.parametrize(
    "root",
    ["ck\x85run", "ck\u2028run", "ck\u2029run", "ck\x9b2Jrun", "ck\u202etxt.run", "ck\u2066run"],
)
def test_a_root_that_breaks_a_line_or_turns_text_is_refused(env: Path, root: str) -> None:
    """What str.splitlines() splits on (NEL, the Unicode line and paragraph separators), C1
    controls (CSI) and the bidi controls that show a name reversed ('Trojan source') are
    refused as the C0 controls are."""
    with pytest.raises(UsageError, match="holds a control character"):
        make(["--checkpoint", root, "job.sh"], FakeController())
    assert not any(p.name.startswith("ck") for p in env.iterdir())
    assert record.all_jobs() == []


@pytest.mark.parametrize("below", ["", "/run1"])
def test_a_root_through_a_dangling_symlink_is_not_called_a_file(env: Path, below: str) -> None:
    """A root (or its folder) that is a symlink to a folder that is not there (a file system
    not mounted) is named so, with its target; it was called 'a file, not a folder'."""
    (env / "ck").symlink_to(env / "scratch-not-mounted" / "u")
    with pytest.raises(UsageError) as info:
        make(["--checkpoint", f"ck{below}", "job.sh"], FakeController())
    text = str(info.value)
    assert "is a file" not in text
    assert "is a symlink to" in text and "scratch-not-mounted/u" in text and "not there" in text
    assert not (env / "scratch-not-mounted").exists()
    assert record.all_jobs() == []


@pytest.mark.parametrize("name,hint", [("SLURM_ARRAY_TASK_ID", "%a"), ("SLURM_JOB_ID", "%j")])
@pytest.mark.parametrize("outer", [None, "4242"])
def test_a_dispatch_lines_root_with_a_jobs_slurm_variable_is_refused(
    env: Path, monkeypatch: pytest.MonkeyPatch, name: str, hint: str, outer: str | None
) -> None:
    """`#DISPATCH --checkpoint ck/run_$SLURM_ARRAY_TASK_ID`: the job's variable, as the script
    would read it; at submission it is unset (refused as 'not set', no word of %a), or, where
    dispatch-sbatch runs inside another job (a driver job), the outer job's value, so every task
    and submission took that job's root.  Refused by name, with the pattern meant."""
    if outer is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, outer)
    (env / "job.sh").write_text(f"#!/bin/bash\n#DISPATCH --checkpoint ck/run_${name}\necho\n")
    with pytest.raises(UsageError) as info:
        make(["job.sh"], FakeController())
    text = str(info.value)
    assert f"${name} is the job's" in text and hint in text, text
    assert not (env / "ck").exists() and not (env / "ck" / f"run_{outer}").exists()
    assert record.all_jobs() == []


def test_a_dispatch_lines_root_that_expands_to_nothing_is_named(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`#DISPATCH --checkpoint $SCRATCH_RUN` with SCRATCH_RUN set but empty: it said 'no
    checkpoint root: give --checkpoint DIR', though the line gives one."""
    monkeypatch.setenv("SCRATCH_RUN", "")
    (env / "job.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint $SCRATCH_RUN\necho\n")
    with pytest.raises(UsageError, match=r"'\$SCRATCH_RUN' expands to nothing"):
        make(["job.sh"], FakeController())
    assert record.all_jobs() == []
