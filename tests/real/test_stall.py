"""A stalled job is caught (docs/user-guide.md), on the real sandbox: a job whose progress stops for
its --stall-timeout is asked to save, ended, recorded as stalled and resubmitted per its rule; a
save longer than the timeout is no stall.  A plain-Python loop using the progress API, and a shell
trainer under `dispatch watch` (whose publications are the progress)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from tests.real import test_supervisor as supervisor_tests
from tests.real.test_supervisor import User, submissions

user = supervisor_tests.user  # the fixture: a folder of the sandbox user's

TIMEOUT = 15  # --stall-timeout, seconds
GRACE = 8  # --warn-before: the seconds it has to save after the signal

# Five steps, then (its first submission only) a hang; a save at the warning signal.
LOOP = """#!{python}
#SBATCH --time=5
import os, signal, time
from slurm_dispatch import api
run = api.execution()
start = int(open(os.path.join(run.resume_from, "step")).read()) if run.resume_from else 0
current = [start]

def save(step):
    path = os.path.join(run.exec_dir, f"save-{{step}}")
    os.mkdir(path)
    with open(os.path.join(path, "step"), "w") as handle:
        handle.write(str(step))
    api.publish(path, step)

def on_warning(signum, frame):
    save(current[0])
    print("saved at the signal, step", current[0], flush=True)

signal.signal(signal.SIGUSR1, on_warning)
for step in range(start + 1, start + 6):
    time.sleep(0.5)
    current[0] = step
    api.progress(step)
if run.submission == 1:
    print("hanging at step", current[0], flush=True)
    while True:
        time.sleep(1)  # no progress any more; the signal's save does not end it
print("done at step", current[0], "from", start, flush=True)
"""

# Three steps, a save that takes longer than the timeout, three more.
LONG_SAVE = """#!{python}
#SBATCH --time=5
import time
from slurm_dispatch import api
for step in range(1, 4):
    time.sleep(0.5)
    api.progress(step)
with api.saving(3):
    time.sleep({long})
for step in range(4, 7):
    time.sleep(0.5)
    api.progress(step)
print("done", flush=True)
"""

# A shell trainer under dispatch watch: a save every 2 steps (0.3 s each); its first
# submission stops making saves after step 6.
WATCHED = """#!/bin/bash
#SBATCH --time=5
set -euo pipefail
if [ "${1:-}" != "--train" ]; then
    exec dispatch watch --interval 1 -- "$0" --train
fi
step=0
resume=$(dispatch fetch)
[ -z "$resume" ] || step=$(cat "$resume/weights")
while [ "$step" -lt 12 ]; do
    step=$((step + 1))
    sleep 0.3
    if [ "$DISPATCH_SUBMISSION" = 1 ] && [ "$step" -gt 6 ]; then
        echo "hanging at step $step"; sleep 600
    fi
    if [ $((step % 2)) -eq 0 ]; then
        save="$DISPATCH_LOCAL_DIR/checkpoint-$step"
        mkdir "$save"; echo "$step" > "$save/weights"
        echo "{\\"global_step\\": $step}" > "$save/trainer_state.json"
    fi
done
echo "done at step $step"
"""


def write(user: User, name: str, text: str) -> None:
    path = user.path / name
    path.write_text(text)
    path.chmod(0o755)
    shutil.chown(path, user.sandbox.user)


def output(user: User) -> str:
    return "".join(p.read_text() for p in sorted(user.path.glob("*.out")))


def caught_and_resubmitted(user: User, job: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for the stall, the first execution's end, the resubmission and its end; the
    stalled event and the status then."""
    user.sandbox.wait_for(
        lambda: user.events(job, "stalled"), 150, f"{job} caught stalled", interval=1
    )

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    user.sandbox.wait_for(finished, 200, f"{job} resubmitted and done", interval=2)
    (event,) = user.events(job, "stalled")
    return event, user.status(job)


def test_a_loop_that_hangs_is_asked_to_save_ended_and_resubmitted(user: User) -> None:
    write(user, "loop.py", LOOP.format(python=user.sandbox.venv_bin / "python"))
    job, _ = user.submit(
        "--checkpoint",
        "ck",
        "--resubmit",
        "1",
        "--stall-timeout",
        str(TIMEOUT),
        "--warn-before",
        str(GRACE),
        "loop.py",
    )
    event, status = caught_and_resubmitted(user, job)
    first = status["executions"][0]
    progress = json.loads((Path(first["exec_dir"]) / ".dispatch-progress.json").read_text())
    assert event["submission"] == 1 and event["step"] == 5 and event["signal"] == "SIGUSR1"
    assert progress["step"] == 5 and not progress["saving"]
    # Caught after the timeout plus the record's interval (2 s: the loop may be that far past
    # the record), within a poll (1.5 s) more and some seconds of a loaded machine.
    late = event["time"] - progress["time"]
    assert TIMEOUT + 2 <= late <= TIMEOUT + 2 + 1.5 + 5, late
    subs = submissions(user, job)
    assert [s["submission"] for s in subs] == [1, 2]
    assert subs[0]["state"] == "FAILED", subs[0]
    assert subs[1]["reason"].startswith("failed (budget 1) (stalled: no progress for "), subs[1]
    assert subs[1]["reason"].endswith(" s since step 5)"), subs[1]
    said = output(user)
    assert "saved at the signal, step 5" in said, said  # asked to save, and it did
    assert f"stalled: no progress for {event['seconds']} s since step 5" in said
    assert "ending it (SIGTERM)" in said, said  # the handler saved, and it still hung
    assert "done at step 10 from 5" in said, said  # the resubmission resumed the save
    text = user.run("dispatch", "status", job).stdout
    assert (
        f"STALLED submission 1: stalled: no progress for {event['seconds']} s since step 5" in text
    ), text


def test_a_save_longer_than_the_timeout_is_not_caught(user: User) -> None:
    write(
        user, "long.py", LONG_SAVE.format(python=user.sandbox.venv_bin / "python", long=TIMEOUT * 2)
    )
    job, _ = user.submit("--checkpoint", "ck", "--stall-timeout", str(TIMEOUT), "long.py")

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    user.sandbox.wait_for(finished, 150, f"{job} done", interval=2)
    assert [s["state"] for s in submissions(user, job)] == ["COMPLETED"]
    assert user.events(job, "stalled") == []
    assert "done" in output(user) and "stalled" not in output(user)


def test_a_watched_trainer_whose_saves_stop_is_caught(user: User) -> None:
    """The integration route: `dispatch watch` records each save it publishes as progress."""
    write(user, "watched.sh", WATCHED)
    job, _ = user.submit(
        "--checkpoint",
        "ck",
        "--resubmit",
        "1",
        "--stall-timeout",
        str(TIMEOUT),
        "--warn-before",
        str(GRACE),
        "watched.sh",
    )
    event, status = caught_and_resubmitted(user, job)
    assert event["submission"] == 1 and event["step"] == 6, event
    subs = submissions(user, job)
    assert subs[0]["state"] == "FAILED" and "stalled: no progress" in subs[1]["reason"]
    assert "done at step 12" in output(user)


# Steps every half second for ever: the job ends only at scancel.
STEADY = """#!{python}
#SBATCH --time=5
import time
from slurm_dispatch import api
step = 0
while True:
    step += 1
    time.sleep(0.5)
    api.progress(step)
"""


def watchers(job: str) -> list[int]:
    """The stall watchers of dispatch job ``job`` alive on this machine (the sandbox's nodes
    share its processes): forks of the launcher, whose command line they keep."""
    found = []
    for name in os.listdir("/proc"):
        try:
            words = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            name.isdigit()
            and b"slurm_dispatch.launch" in words
            and any(job.encode() in w for w in words)
        ):
            found.append(int(name))
    return found


def test_the_watcher_ends_with_its_execution_at_a_requeue_and_at_scancel(user: User) -> None:
    """Nothing of the watcher is left behind: Slurm's requeue ends the first execution's
    watcher (the second has one of its own, and neither signals the other's script), scancel
    the second's; a job making progress is never taken for stalled."""
    write(user, "steady.py", STEADY.format(python=user.sandbox.venv_bin / "python"))
    job, slurm_id = user.submit("--checkpoint", "ck", "--stall-timeout", "10", "steady.py")
    sandbox = user.sandbox
    sandbox.wait_for(lambda: len(watchers(job)) == 1, 90, f"{job}'s watcher")
    (first,) = watchers(job)
    sandbox.run(["scontrol", "requeue", slurm_id])
    sandbox.wait_for(lambda: first not in watchers(job), 30, "the first watcher to end")

    def running_again() -> bool:
        state = sandbox.job_state(slurm_id)
        return (
            state.get("JobState") == "RUNNING"
            and state.get("Restarts") == "1"
            and len(watchers(job)) == 1
        )

    sandbox.wait_for(running_again, 180, f"Slurm job {slurm_id} to run again, watched")
    time.sleep(15)  # longer than the timeout: a job making progress all along
    assert user.events(job, "stalled") == []
    (second,) = watchers(job)
    sandbox.run(["scancel", slurm_id])
    sandbox.wait_for(lambda: not watchers(job), 30, "the second watcher to end")
    # The watcher ends as the job's processes do, before slurmctld hears every node's Epilog
    # (COMPLETING until then: seen under load).
    sandbox.wait_for(
        lambda: sandbox.job_state(slurm_id).get("JobState") == "CANCELLED",
        60,
        f"Slurm job {slurm_id} CANCELLED",
    )
    assert user.events(job, "stalled") == []
