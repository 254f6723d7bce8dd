"""A stalled job is caught (docs/user-guide.md): the launcher's watcher asks an execution whose
progress stopped for its ``--stall-timeout`` to save, then ends it and records why; a long
save and a long first step are never taken for a stall.  Real processes through the real
launcher; only Slurm is absent (the watcher asks it nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import execdir
from slurm_dispatch.control import events, plan, record, status, status_text, submit
from slurm_dispatch.control.sbatch_args import parse_stall_timeout
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import UsageError
from slurm_dispatch.execution import stall, steps
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_no_progress import home, last_id, new_job, start  # noqa: F401 - the fixture

TIMEOUT = 2  # the job's --stall-timeout, seconds
GRACE = 4  # its --warn-before, the seconds it has to save after the signal (2 was too short for
# a job to begin its save on 2 cores loaded by make test: SIGTERM came 3 s after the signal)

# A plain loop using the progress API: three steps, then what MODE says.
SCRIPT = """#!{python}
import os, signal, sys, time
from slurm_dispatch import api
mode, log = os.environ["MODE"], open(os.environ["LOG"], "a", buffering=1)
signal.signal(signal.SIGUSR1, lambda *_: log.write("asked to save\\n"))
if mode == "long-first-step":
    time.sleep({long})
for step in range(1, 4):
    time.sleep(0.1)
    api.progress(step)
if mode == "hang":
    while True:
        time.sleep(0.1)  # no progress any more
if mode == "slow-save-at-signal":
    asked = []
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    while not asked:
        time.sleep(0.1)  # no progress, until the watcher's signal
    with api.saving(3):
        time.sleep({grace_and_half})  # a save longer than the grace
    log.write("saved\\n")
    sys.exit(0)
if mode == "steps-just-under-the-timeout":
    for step in range(4, 7):
        time.sleep({just_under})  # each step shorter than the timeout: progress
        api.progress(step)
if mode == "long-work-after-training":
    api.progress_ended()  # training is done: a final evaluation, an export follow
    time.sleep({long})
if mode == "long-save":
    with api.saving(3):
        time.sleep({long})
    for step in range(4, 7):
        time.sleep(0.1)
        api.progress(step)
log.write("done\\n")
"""


def make_job(tmp_path: Path, **spec: Any) -> record.JobRecord:
    script = SCRIPT.format(
        python=sys.executable,
        long=TIMEOUT * 2.5,
        grace_and_half=GRACE * 1.5,
        just_under=TIMEOUT * 0.75,
    ).encode()
    return record.create_job(
        {
            "generation": 0,
            "checkpoint": str(tmp_path / "ck"),
            "script": "job.py",
            "stall_timeout": TIMEOUT,
            "warn_before": ["USR1", GRACE],
            **spec,
        },
        script,
        home=str(tmp_path / "home"),
    )


def launch(tmp_path: Path, job: record.JobRecord, mode: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DISPATCH_HOME": str(tmp_path / "home"),
        "SLURM_JOB_ID": "41",
        "SLURMD_NODENAME": "n1",
        "MODE": mode,
        "LOG": str(tmp_path / "log"),
    }
    env["PATH"] = os.path.dirname(sys.executable) + ":/usr/bin:/bin"
    return subprocess.run(
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
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def stalled(job: record.JobRecord) -> list[events.Stalled]:
    return job.history().of(events.Stalled)


def log(tmp_path: Path) -> list[str]:
    path = tmp_path / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_a_job_that_hangs_is_asked_to_save_then_ended_and_recorded(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    began = time.monotonic()
    run = launch(tmp_path, job, "hang")
    took = time.monotonic() - began
    # Asked to save (its handler ran and it went on hanging), then ended by SIGTERM.
    assert run.returncode == -signal.SIGTERM, (run.returncode, run.stderr)
    assert log(tmp_path) == ["asked to save"]
    (event,) = stalled(job)
    assert event.submission == 1 and event.slurm_job_id == "41" and event.signal == "SIGUSR1"
    # The record's last change plus the timeout and the record's lag (the write interval).
    assert TIMEOUT + steps.INTERVAL <= event.seconds <= TIMEOUT + steps.INTERVAL + 1
    assert event.timeout == TIMEOUT
    assert event.step in (1, 2, 3)
    assert event.reason == f"stalled: no progress for {event.seconds} s since step {event.step}"
    # Caught within the timeout, plus twice the record's interval and a poll, plus the grace.
    assert took < TIMEOUT + 2 * steps.INTERVAL + 0.5 + GRACE + 5, took
    (started,) = job.history().of(events.Started)
    assert event.attempt == started.attempt
    mark = stall.mark(started.exec_dir)
    assert mark is not None and mark["step"] == event.step
    assert os.path.exists(os.path.join(started.exec_dir, execdir.PROGRESS))
    said = run.stderr
    assert f"stalled: no progress for {event.seconds} s since step {event.step}" in said, said
    assert "asking it to save (SIGUSR1" in said and "ending it (SIGTERM)" in said, said
    assert "stall watch: with no progress for 2 s" in run.stdout


def test_a_signal_meant_for_the_job_does_not_end_its_watcher(tmp_path: Path) -> None:
    """scancel --signal=USR1 --full (or a site's script) signals every process of the batch
    step, the watcher too: USR1's default is to end a process, and a watcher ended so caught
    nothing any more. It ignores the signals a job's processes are sent to save."""
    job = make_job(tmp_path)
    env = {
        **os.environ,
        "DISPATCH_HOME": str(tmp_path / "home"),
        "SLURM_JOB_ID": "41",
        "SLURMD_NODENAME": "n1",
        "MODE": "hang",
        "LOG": str(tmp_path / "log"),
        "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
    }
    proc = subprocess.Popen(
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
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ck").exists() or not list((tmp_path / "ck").rglob(execdir.PROGRESS)):
            assert time.monotonic() < deadline and proc.poll() is None, "no progress record"
            time.sleep(0.05)
        mine = [
            int(n)
            for n in os.listdir("/proc")
            if n.isdigit() and int(n) != proc.pid and _cmdline(int(n)).count(job.path.encode())
        ]
        assert len(mine) == 1, mine  # the watcher, a fork of the launcher
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
            os.kill(mine[0], signum)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # caught and ended all the same
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(stalled(job)) == 1


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_save_begun_at_the_signal_is_let_finish_past_the_grace(tmp_path: Path) -> None:
    """The watcher waits while a save it asked for is under way (up to twice the grace)."""
    job = make_job(tmp_path)
    run = launch(tmp_path, job, "slow-save-at-signal")
    assert run.returncode == 0, (run.returncode, run.stderr)  # not ended by SIGTERM
    assert log(tmp_path) == ["saved"] and len(stalled(job)) == 1
    assert "ending it (SIGTERM)" not in run.stderr


@pytest.mark.parametrize(
    "mode",
    ["long-save", "long-first-step", "long-work-after-training", "steps-just-under-the-timeout"],
)
def test_a_long_save_or_first_step_is_no_stall(tmp_path: Path, mode: str) -> None:
    """steps-just-under-the-timeout: steps 2 and 3 come within the record's write interval of
    step 1 and are not written, so the record lags the loop by up to that interval; steps of
    three quarters of the timeout after them are progress all the same."""
    job = make_job(tmp_path)
    run = launch(tmp_path, job, mode)
    assert run.returncode == 0, run.stderr
    assert log(tmp_path) == ["done"]
    assert stalled(job) == [] and "stalled" not in run.stderr


def test_without_a_stall_timeout_nothing_watches(tmp_path: Path) -> None:
    job = make_job(tmp_path, stall_timeout=0)
    run = launch(tmp_path, job, "long-save")
    assert run.returncode == 0 and "stall watch" not in run.stdout


def test_the_clock_starts_at_the_first_record_and_stops_inside_a_save() -> None:
    clock = stall.StallClock(10, lag=0)
    assert clock.observe(None, 0) is None and clock.observe(None, 100) is None
    assert clock.observe({"step": 1, "saves": 0}, 100) is None  # the clock starts here
    assert clock.observe({"step": 1, "saves": 0}, 109) is None
    assert clock.observe({"step": 1, "saves": 0}, 110) == 10
    assert clock.observe({"step": 2, "saves": 0}, 111) is None  # progress: again from 111
    assert clock.observe({"step": 2, "saves": 0, "saving": True}, 112) is None
    assert clock.observe({"step": 2, "saves": 0, "saving": True}, 500) is None
    assert clock.observe({"step": 2, "saves": 1}, 501) is None  # a save's end: from 501
    assert clock.observe({"step": 2, "saves": 1}, 511) == 10


def test_the_clock_waits_the_records_lag_past_the_timeout() -> None:
    """A step is written at most every INTERVAL: the loop's last step may be that much later
    than the record's last change, so a stall is called only that much later."""
    clock = stall.StallClock(10)
    assert clock.lag == steps.INTERVAL
    assert clock.observe({"step": 1, "saves": 0}, 100) is None
    assert clock.observe({"step": 1, "saves": 0}, 110 + steps.INTERVAL - 0.1) is None
    assert clock.observe({"step": 1, "saves": 0}, 110 + steps.INTERVAL) == 10 + steps.INTERVAL


def test_the_clock_stops_once_training_ended_and_starts_again_at_a_step() -> None:
    """After the loop (a final evaluation on the test set, an export, a second phase's setup)
    nothing is a stall, as before the first record; a new step starts the clock again."""
    clock = stall.StallClock(10, lag=0)
    assert clock.observe({"step": 9, "saves": 1}, 100) is None
    assert clock.observe({"step": 9, "saves": 1, "ended": True}, 105) is None
    assert clock.observe({"step": 9, "saves": 1, "ended": True}, 5000) is None
    assert clock.observe({"step": 10, "saves": 1}, 5001) is None  # a second fit
    assert clock.observe({"step": 10, "saves": 1}, 5011) == 10


def test_the_option_is_read_and_bad_values_named() -> None:
    assert parse_stall_timeout("600") == 600 and parse_stall_timeout("10:00") == 600
    assert parse_stall_timeout("1:00:00") == 3600 and parse_stall_timeout("0") == 0
    for bad in ("ten", "-5", "1.5", "8-00:00:00"):
        with pytest.raises(UsageError, match=f"--stall-timeout '{bad}'"):
            parse_stall_timeout(bad)


def test_a_stalled_execution_counts_as_failed_and_its_reason_is_shown(
    home: Path,  # noqa: F811
) -> None:
    cluster = FakeCluster()
    job = new_job(cluster, "--resubmit", "1", "--stall-timeout", "60")
    assert job.spec["stall_timeout"] == 60
    folder = start(job)
    attempt = os.path.basename(folder)
    job.append(
        events.Stalled,
        submission=1,
        slurm_job_id=last_id(job),
        attempt=attempt,
        seconds=61,
        timeout=60,
        step=40,
        signal="SIGUSR1",
    )
    # Its script trapped the signals and exited 0: still a failure, never "done".
    cluster.set(last_id(job), JobState="COMPLETED", ExitCode="0:0")
    sup = Supervisor(Slurm(cluster, wait=0), Settings())
    (said,) = sup.run_pass().actions
    assert said == (
        f"{job.id}: failed (stalled: no progress for 61 s since step 40): "
        "resubmitted as submission 2 (Slurm job "
        f"{last_id(job)})"
    ), said
    assert (
        job.history().submissions[-1].reason
        == "failed (budget 1) (stalled: no progress for 61 s since step 40)"
    )
    text = status_text.render(
        status.collect(job, Slurm(cluster, wait=0).own_jobs(), facts_reader=lambda _: [])
    )
    assert "STALLED submission 1: stalled: no progress for 61 s since step 40" in text, text
    # The next one stalls too, with no budget left: stopped, the reason in its end.
    start(job)
    job.append(
        events.Stalled,
        submission=2,
        slurm_job_id=last_id(job),
        attempt="a2r0",
        seconds=60,
        timeout=60,
        step=None,
        signal="SIGUSR1",
    )
    cluster.set(last_id(job), JobState="FAILED", ExitCode="0:15")
    sup.run_pass()
    (done,) = job.history().of(events.Finished)
    assert done.end_state == "failed"
    assert done.rule == (
        "stop (no resubmit budget) (stalled: no progress for 60 s since its last record)"
    )


def test_a_stalled_executions_exit_code_is_no_free_restart(
    home: Path,  # noqa: F811
) -> None:
    """The exit status of an execution the watcher ended answers the watcher's signals, not
    the script's own verdict: a Lightning run stopped at SIGTERM exits 143, and with
    --restart-on-exit 143 (free restarts after a preemption) each stall restarted for free,
    a job that hangs each time going on for ever. A stall spends the budget."""
    cluster = FakeCluster()
    job = new_job(
        cluster,
        "--resubmit",
        "0",
        "--restart-on-exit",
        "143",
        "--stall-timeout",
        "60",
        "--max-no-progress",
        "0",
    )
    folder = start(job)
    job.append(
        events.Stalled,
        submission=1,
        slurm_job_id=last_id(job),
        attempt=os.path.basename(folder),
        seconds=61,
        timeout=60,
        step=40,
        signal="SIGUSR1",
    )
    cluster.set(last_id(job), JobState="FAILED", ExitCode="143:0")
    (said,) = Supervisor(Slurm(cluster, wait=0), Settings()).run_pass().actions
    assert "resubmitted" not in said and "stop (no resubmit budget)" in said, said
    (done,) = job.history().of(events.Finished)
    assert done.rule == ("stop (no resubmit budget) (stalled: no progress for 61 s since step 40)")


def test_the_option_its_directive_site_default_and_plan(
    home: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (home / "d.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck --stall-timeout 5:00\n")
    request = submit.read_request(["d.sh"])
    assert request.options.stall_timeout == 300
    text = plan.describe(request)
    assert (
        "  stalled        an execution whose progress stops for 300 s (from its first "
        "progress record; never inside a save) is sent SIGUSR1, given 60 s to save, then "
        "ended"
    ) in text, text
    assert "(--stall-timeout 300, from --stall-timeout)" in text
    off = plan.describe(submit.read_request(["--checkpoint", "ck", "job.sh"]))
    assert "  stalled        not watched" in off
    (home / "none.conf").write_text("StallTimeout=30:00\n")
    site = plan.describe(
        submit.read_request(["--checkpoint", "ck", "--warn-before", "120:TERM", "job.sh"])
    )
    assert "stops for 1800 s" in site and "sent SIGTERM, given 120 s" in site
    assert "from the site's StallTimeout" in site
    # The command line's 0 turns the site's off.
    assert "not watched" in plan.describe(
        submit.read_request(["--checkpoint", "ck", "--stall-timeout", "0", "job.sh"])
    )
    with pytest.raises(UsageError, match="--stall-timeout 'soon'"):
        submit.read_request(["--checkpoint", "ck", "--stall-timeout", "soon", "job.sh"])
