"""What a newcomer hits at submission and in the launcher: each command runs as a real process, so
what is checked is what a user sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cli_shell import COMMANDS, command, one_error_line

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("prog", ["dispatch-sbatch", "dispatch-sandbox"])
def test_version_reads_like_dispatchs_own(prog: str) -> None:
    theirs = command("dispatch", "--version")
    assert theirs.returncode == 0 and theirs.stdout.startswith("dispatch, version ")
    version = theirs.stdout.split("version ", 1)[1]
    ours = command(prog, "--version")
    assert (ours.returncode, ours.stdout, ours.stderr) == (0, f"{prog}, version {version}", "")


# -- --help teaches every option, and says which sbatch options are refused -----------------


def test_sbatch_help_lists_every_dispatch_option_and_the_refused_sbatch_ones() -> None:
    from slurm_dispatch.control import sbatch_args

    shown = command("dispatch-sbatch", "--help")
    assert shown.returncode == 0
    for name in sorted(sbatch_args.DISPATCH_WITH_ARG | sbatch_args.DISPATCH_FLAGS):
        assert f"  --{name}" in shown.stdout, name
    refused = shown.stdout.split("except:", 1)[1]
    for name in ("--wrap", "--signal", "--requeue", "--dependency", "--array"):
        assert f"  {name} " in refused, name


@pytest.mark.parametrize("wrap", ["--wrap=hostname", "--wra=hostname"])
def test_wrap_is_refused_saying_why_and_what_else_is(tmp_path: Path, wrap: str) -> None:
    refused = command(
        "dispatch-sbatch",
        "--checkpoint",
        str(tmp_path / "ck"),
        wrap,
        cwd=tmp_path,
        env={"DISPATCH_HOME": str(tmp_path / "home")},
    )
    one_error_line(refused, "dispatch-sbatch", 2, "--wrap is refused: every resubmission")
    assert "--signal with --warn-before" in refused.stderr
    assert not (tmp_path / "ck").exists() and not (tmp_path / "home").exists()


# -- submission inputs that cannot mean what they say ----------------------------------------


def submit_refused(
    tmp_path: Path, *args: str, header: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """dispatch-sbatch with ``args`` before job.sh; sbatch itself must never be reached."""
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n{header}true\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for client in ("sbatch", "squeue", "scontrol"):
        (bin_dir / client).write_text(f"#!/bin/sh\ntouch {tmp_path}/reached-slurm\nexit 1\n")
        (bin_dir / client).chmod(0o755)
    proc = command(
        "dispatch-sbatch",
        *args,
        "job.sh",
        cwd=tmp_path,
        env={
            "DISPATCH_HOME": str(tmp_path / "home"),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            **(env or {}),
        },
    )
    assert not (tmp_path / "reached-slurm").exists(), proc.stderr
    assert not (tmp_path / "home" / "jobs").exists() or not list(
        (tmp_path / "home" / "jobs").iterdir()
    ), "a record was made"
    return proc


@pytest.mark.parametrize(
    "time_args,env,header,words",
    [
        (["--time=5"], {}, "", "--warn-before 600 (600 s) is not less than --time=5 (300 s)"),
        (["-t", "0:10:00"], {}, "", "not less than -t 0:10:00 (600 s)"),
        ([], {"SBATCH_TIMELIMIT": "9"}, "", "not less than SBATCH_TIMELIMIT=9 (540 s)"),
        ([], {}, "#SBATCH --time=00:08:00\n", "not less than #SBATCH --time=00:08:00 in job.sh"),
    ],
)
def test_warn_before_not_shorter_than_the_time_limit_is_refused(
    tmp_path: Path, time_args: list[str], env: dict[str, str], header: str, words: str
) -> None:
    proc = submit_refused(
        tmp_path, "--checkpoint", "ck", "--warn-before", "600", *time_args, header=header, env=env
    )
    one_error_line(proc, "dispatch-sbatch", 2, words)
    assert not (tmp_path / "ck").exists()


def test_warn_before_within_the_time_limit_is_taken(tmp_path: Path) -> None:
    from slurm_dispatch.control import submit

    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --time=1-00:00\ntrue\n")
    for given in (["--time=UNLIMITED"], ["--time=11"], []):
        request = submit.read_request(
            ["--checkpoint", "ck", "--warn-before", "10:00", *given, "job.sh"], cwd=str(tmp_path)
        )
        assert request.options.warn_before == ("USR1", 600)


def test_a_per_task_root_without_an_array_is_refused(tmp_path: Path) -> None:
    proc = submit_refused(tmp_path, "--checkpoint", "ck/task%a")
    one_error_line(proc, "dispatch-sbatch", 2, "--checkpoint 'ck/task%a' has %a")
    assert "without --array" in proc.stderr
    assert not (tmp_path / "ck").exists()


def test_a_literal_percent_a_needs_no_array(tmp_path: Path) -> None:
    from slurm_dispatch.control import submit

    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    request = submit.read_request(["--checkpoint", "ck/100%%a", "job.sh"], cwd=str(tmp_path))
    submit.refuse_array_on_one_root(request, str(tmp_path / "ck/100%%a"), {})  # no refusal


@pytest.mark.parametrize("root", ["s3:/bucket/run1", "S3:bucket/run1"])
def test_an_s3_url_with_one_slash_is_not_taken_for_a_folder(tmp_path: Path, root: str) -> None:
    proc = submit_refused(tmp_path, "--checkpoint", root)
    one_error_line(proc, "dispatch-sbatch", 2, f"checkpoint root {root!r}")
    assert "s3://bucket/run1" in proc.stderr and "./" + root in proc.stderr
    assert not list(tmp_path.glob("[sS]3*"))
    listed = command("dispatch", "list", "--root", root)
    one_error_line(listed, "dispatch", 2, "s3://bucket/run1")


# -- an s3:// root where boto3 cannot be imported --------------------------------------------


def without_boto(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import boto3 or botocore (as in a venv without the
    's3' extra): a sitecustomize on PYTHONPATH blocks both, in every process started so."""
    block = tmp_path / "no-boto"
    block.mkdir(exist_ok=True)
    (block / "sitecustomize.py").write_text(
        "import sys\nsys.modules.update({'boto3': None, 'botocore': None})\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(block), str(REPO)])}


def one_line_naming_the_extra(proc: subprocess.CompletedProcess[str], prog: str) -> None:
    one_error_line(proc, prog, 2, "an s3:// checkpoint root needs boto3")
    assert "the 's3' extra" in proc.stderr and ".whl[s3]" in proc.stderr, proc.stderr


def test_without_the_s3_extra_each_command_says_so_in_one_line(tmp_path: Path) -> None:
    env = without_boto(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-c", "import botocore"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr  # the block holds
    for args in (["latest", "--root", "s3://bucket/run1"], ["list", "--root", "s3://bucket/x"]):
        one_line_naming_the_extra(command("dispatch", *args, env=env), "dispatch")
    refused = submit_refused(tmp_path, "--checkpoint", "s3://bucket/run1", env=env)
    one_line_naming_the_extra(refused, "dispatch-sbatch")


def test_without_the_s3_extra_the_job_and_its_status_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.control import submit
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho ran\n")
    done = submit.submit_new(
        submit.read_request(["--checkpoint", "s3://bucket/run1", "job.sh"], cwd=str(tmp_path)),
        Slurm(FakeCluster(), wait=0),
    )
    env = {
        **without_boto(tmp_path),
        "DISPATCH_HOME": str(tmp_path / "home"),
        "SLURM_JOB_ID": done.slurm_job_id,
    }
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            done.job.path,
            "--submission",
            "1",
            "--",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    one_line_naming_the_extra(launched, "dispatch-launch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")  # Slurm knows none of them now
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'accounting storage is disabled' >&2\nexit 1\n")
    for client in ("squeue", "sacct"):
        (bin_dir / client).chmod(0o755)
    status = command(
        "dispatch", "status", done.job.id, env={**env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    )
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    shown = [line for line in status.stdout.splitlines() if "boto3" in line]
    assert len(shown) == 1 and ".whl[s3]" in shown[0], status.stdout


# -- a dispatch.conf named but missing is an error, not "the defaults" -----------------------


def test_cease_with_a_named_config_that_is_missing_is_one_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.conf"
    named = command("dispatch-cease", "--config", str(missing), "100")
    one_error_line(named, "dispatch-cease", 2, f"{missing}: no such file (named by --config)")
    by_env = command("dispatch-cease", "100", env={"SLURM_DISPATCH_CONF": str(missing)})
    one_error_line(by_env, "dispatch-cease", 2, "no such file (named by $SLURM_DISPATCH_CONF)")
    for proc in (named, by_env):
        assert "defaults" not in proc.stderr  # it gives no verdict: nothing went on
    bad = tmp_path / "bad.conf"
    bad.write_text("HookTimeout=soon\n")
    one_error_line(
        command("dispatch-cease", "--config", str(bad), "100"),
        "dispatch-cease",
        2,
        f"{bad}:1: bad value for HookTimeout",
    )


# -- Ctrl-C while sbatch runs says what became of the job, the record whole -----------------

FAKE_SBATCH = """#!{python}
import json, os, sys, time
state = {state!r}
comment = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--comment="))
if open(os.path.join(state, "mode")).read() == "landed":  # the controller took it
    with open(os.path.join(state, "jobs.json"), "w") as handle:
        json.dump([{{"JobId": "4242", "JobState": "PENDING", "Comment": comment}}], handle)
open(os.path.join(state, "sbatch-started"), "w").close()
time.sleep(60)  # its answer never comes: the user presses Ctrl-C
"""
FAKE_SQUEUE = """#!{python}
import json, os, sys
sys.path.insert(0, {repo!r})
from tests.fakes import squeue
state = {state!r}
if open(os.path.join(state, "mode")).read() == "down":
    sys.exit("squeue: error: Unable to contact slurm controller (connect failure)")
path = os.path.join(state, "jobs.json")
jobs = json.load(open(path)) if os.path.exists(path) else []
sys.stdout.write(squeue.render(sys.argv, jobs))
"""


def interrupt_sbatch(
    tmp_path: Path, mode: str
) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    """dispatch-sbatch, Ctrl-C once its sbatch runs; (what it said, the records left)."""
    import signal
    import time

    from .test_cli_shell import as_at_a_terminal

    state = tmp_path / "slurm"
    bin_dir = tmp_path / "bin"
    for folder in (state, bin_dir):
        folder.mkdir()
    (state / "mode").write_text(mode)
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(
            text.format(python=sys.executable, state=str(state), repo=str(REPO))
        )
        (bin_dir / name).chmod(0o755)
    (tmp_path / "train.sh").write_text("#!/bin/bash\ntrue\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DISPATCH_HOME": str(tmp_path / "home"),
        "DISPATCH_SLURM_ATTEMPTS": "1",
        "PYTHONPATH": str(REPO),
    }
    with subprocess.Popen(
        [*COMMANDS["dispatch-sbatch"], "--checkpoint", "ck/run", "-J", "mytrain", "train.sh"],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=as_at_a_terminal,
    ) as proc:
        try:
            deadline = time.monotonic() + 30
            while not (state / "sbatch-started").exists():
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the fake sbatch never started"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    jobs = tmp_path / "home" / "jobs"
    return (
        subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
        sorted(jobs.iterdir()) if jobs.exists() else [],
    )


def test_ctrl_c_after_sbatch_landed_records_the_job_and_says_so(tmp_path: Path) -> None:
    from slurm_dispatch.control import record

    said, left = interrupt_sbatch(tmp_path, "landed")
    one_error_line(said, "dispatch-sbatch", 130, "sbatch had submitted it: Slurm job 4242")
    assert len(left) == 1 and f"dispatch job {left[0].name}" in said.stderr
    assert [s["slurm_job_id"] for s in record.JobRecord(str(left[0])).submissions()] == ["4242"]


def test_ctrl_c_when_nothing_landed_leaves_nothing(tmp_path: Path) -> None:
    said, left = interrupt_sbatch(tmp_path, "lost")
    one_error_line(said, "dispatch-sbatch", 130, "nothing was submitted and nothing is recorded")
    assert left == [] and not (tmp_path / "ck").exists()


def test_ctrl_c_when_slurm_cannot_be_asked_says_it_may_have_landed(tmp_path: Path) -> None:
    from slurm_dispatch.control import record

    said, left = interrupt_sbatch(tmp_path, "down")
    one_error_line(said, "dispatch-sbatch", 130, "the job may have reached Slurm")
    assert (
        "squeue --me -n mytrain" in said.stderr and f"dispatch status {left[0].name}" in said.stderr
    )
    job = record.JobRecord(str(left[0]))  # whole: its spec, and the claim the supervisor reads
    assert job.spec["script_name"] == "train.sh" and job.has_claim("submission-1")
    assert job.submissions() == []


# -- a full disk in the launcher names the path; status counts resubmits plainly -------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> object:
    """A 64 KiB tmpfs, filled up: a real ENOSPC from the kernel (root only)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path) -> None:
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC: full
    finally:
        os.close(fd)


def test_a_full_disk_in_the_launcher_names_the_path_and_leaves_no_half_record(
    tmp_path: Path, tiny_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.control import submit
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho ran\n")
    root = tiny_disk / "ck"
    done = submit.submit_new(
        submit.read_request(["--checkpoint", str(root), "job.sh"], cwd=str(tmp_path)),
        Slurm(FakeCluster(), wait=0),
    )
    fill(tiny_disk)
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            done.job.path,
            "--submission",
            "1",
            "--",
        ],
        env={
            **os.environ,
            "DISPATCH_HOME": str(tmp_path / "home"),
            "SLURM_JOB_ID": done.slurm_job_id,
            "PYTHONPATH": str(REPO),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    one_error_line(launched, "dispatch-launch", 2, "No space left on device")
    assert f"{root}/exec/" in launched.stderr and "execution record" in launched.stderr
    assert list((root / "exec").iterdir()) == []  # no folder with a half-written record


def test_status_counts_resubmissions_by_hand_apart_from_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the full disk, the job was resubmitted by hand (`dispatch resubmit`) and status
    read "resubmits 1 of 0", as if the supervisor had gone past the budget."""
    from slurm_dispatch.control import status, status_text, submit
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    (tmp_path / "job.sh").write_text("#!/bin/bash\ntrue\n")
    cluster = FakeCluster(first_id=40)
    first = submit.submit_new(
        submit.read_request(["--checkpoint", "ck", "job.sh"], cwd=str(tmp_path)),
        Slurm(cluster, wait=0),
    )
    cluster.set("40", JobState="FAILED")
    submit.resubmit(Slurm(cluster, wait=0), first.job)
    head = status_text.render(status.collect(first.job, {})).splitlines()[0]
    assert "resubmits 1 of 0" not in head
    assert "resubmitted 1 time by hand (dispatch resubmit); resubmit budget 0" in head, head


# -- a held job's comment no longer says "held" once it runs ---------------------------------


def run_launcher(tmp_path: Path, job_path: str, slurm_id: str) -> list[str]:
    """The launcher as a process, with a logging scontrol on PATH; the scontrol calls made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >>{log}\n")
    (bin_dir / "scontrol").chmod(0o755)
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.launch",
            "--job",
            job_path,
            "--submission",
            "1",
            "--",
        ],
        env={
            **os.environ,
            "SLURM_JOB_ID": slurm_id,
            "PYTHONPATH": str(REPO),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launched.returncode == 0 and "ran" in launched.stdout, launched.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_a_held_submission_says_its_hold_is_over_once_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.control import submit
    from slurm_dispatch.slurm.adapter import Slurm

    from ..fakes.cluster import FakeCluster

    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho ran\n")
    cluster = FakeCluster(first_id=10)
    slurm = Slurm(cluster, wait=0)
    old = submit.submit_new(
        submit.read_request(
            ["--checkpoint", "ck", "--shared-checkpoint", "job.sh"], cwd=str(tmp_path)
        ),
        slurm,
    )
    assert run_launcher(tmp_path, old.job.path, old.slurm_job_id) == []  # never held: no call
    new = submit.submit_new(
        submit.read_request(["--supersede", old.job.id, "job.sh"], cwd=str(tmp_path)), slurm
    )
    assert "held" in cluster.jobs[new.slurm_job_id]["Comment"]  # as squeue shows it, held
    calls = run_launcher(tmp_path, new.job.path, new.slurm_job_id)
    assert len(calls) == 1, calls
    (update,) = calls
    assert update.startswith(f"update jobid={new.slurm_job_id} comment=dispatch:{new.job.id}/1 ")
    assert "held" not in update and "hold over" in update


def test_the_plan_refuses_what_submission_would(tmp_path: Path) -> None:
    for args, words in (
        (["--checkpoint", "ck/%a"], "without --array"),
        (["--checkpoint", "ck", "--warn-before", "600", "--time=5"], "not less than --time=5"),
    ):
        proc = submit_refused(tmp_path, "--plan", *args)
        one_error_line(proc, "dispatch-sbatch", 2, words)
