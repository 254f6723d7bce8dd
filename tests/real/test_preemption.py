"""Preemption on the real sandbox: an urgent job takes a dispatch job's node, Slurm requeues it.

The sandbox's slurm.conf (slurm_dispatch.sandbox.slurm_conf) has a second partition over the
same nodes, ``urgent``, in a higher PriorityTier, with ``PreemptType=preempt/partition_prio``
and ``PreemptMode=REQUEUE``: a job there that needs a busy node makes slurmctld signal the
default partition's job holding it at once (SIGTERM, then SIGKILL KillWait later: Slurm applies
no GraceTime under REQUEUE), requeue it, and start it again later with its restart count one
higher.  What a trainer does in that window is the preemption save sites ask of their users; a
process that outlives the job (escaped from Slurm's tracking) may publish later still.  Both
carry the old execution's epoch, so however high their step, they never outrank the
replacement's saves.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.base import Found
from slurm_dispatch.sandbox import slurm_conf as sandbox_slurm_conf
from tests.real import test_dispatch_sbatch as sbatch_tests
from tests.real.test_dispatch_sbatch import Workdir, wait_executions

pytestmark = pytest.mark.real
work = sbatch_tests.work  # the fixture, used by name

# A trainer that saves every third step and, on SIGTERM, saves once more at a step far ahead
# (a "save on preemption" handler, as sites ask of their users) and publishes it, then keeps
# printing until Slurm kills it.  Each line starts with the time, so the window shows.  Its
# handler also leaves a straggler behind (setsid and a double fork escape proctrack/linuxproc,
# as a user's stray process does): it waits for the replacement's first publication, then
# publishes a save from the old execution with a higher step still.
TRAINER = r"""#!/bin/bash
#SBATCH --time=10
log="$SLURM_SUBMIT_DIR/trainer-${SLURM_RESTART_COUNT:-0}.log"
say() { echo "$(date +%s.%N) epoch=$DISPATCH_EPOCH $*" >> "$log"; }
step=0
if [ -n "$DISPATCH_RESUME_FROM" ]; then
    step=$(cat "$DISPATCH_RESUME_FROM/step")
    say "resumed step=$step from=$DISPATCH_RESUME_FROM"
else
    say "fresh"
fi
save() {
    local dir="$DISPATCH_EXEC_DIR/checkpoint-$1"
    mkdir -p "$dir.partial" && echo "$1" > "$dir.partial/step" && mv "$dir.partial" "$dir"
    dispatch publish --step "$1" "$dir" > /dev/null && say "published step=$1"
}
on_term() {
    say "sigterm"
    if [ -z "${SLURM_RESTART_COUNT:-}" ]; then
        (setsid bash "$SLURM_SUBMIT_DIR/straggler.sh" "$((step + 1000000))" \
            < /dev/null >> "$log" 2>&1 &)
    fi
    step=$((step + 1000))
    save "$step"
    while true; do sleep 0.2; say "alive"; done
}
trap on_term TERM
while true; do
    step=$((step + 1))
    sleep 0.3
    if [ $((step % 3)) -eq 0 ]; then save "$step"; fi
done
"""

STRAGGLER = r"""#!/bin/bash
# Outlives the job: once a publication of a greater epoch exists, saves and publishes one
# more from the old execution (its epoch, its folder), at a step beyond anything else.
echo $$ > "$SLURM_SUBMIT_DIR/straggler.pid"
echo "$(date +%s.%N) epoch=$DISPATCH_EPOCH straggler waiting"
for _ in $(seq 600); do
    for name in $(ls "$DISPATCH_CHECKPOINT/pub"); do
        if [ $((10#${name%%-*})) -gt "$DISPATCH_EPOCH" ]; then
            dir="$DISPATCH_EXEC_DIR/checkpoint-$1"
            mkdir -p "$dir" && echo "$1" > "$dir/step"
            dispatch publish --step "$1" "$dir" > /dev/null
            echo "$(date +%s.%N) epoch=$DISPATCH_EPOCH straggler published step=$1"
            exit 0
        fi
    done
    sleep 0.2
done
"""


def _lines(path: Path) -> list[tuple[float, str]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        when, _, rest = line.partition(" ")
        try:
            out.append((float(when), rest))
        except ValueError:
            continue
    return out


def _said(path: Path, word: str) -> list[tuple[float, str]]:
    return [(t, text) for t, text in _lines(path) if f" {word}" in f" {text}"]


def _pubs(root: Path) -> list[Found]:
    return sorted(store.list_publications(str(root)), key=lambda p: (p.epoch, p.step))


def test_a_preempted_job_is_requeued_resumes_its_term_save_and_outranks_late_saves(
    work: Workdir,
) -> None:
    sandbox: Any = work.sandbox
    work.write("trainer.sh", TRAINER)
    work.write("straggler.sh", STRAGGLER)
    root = work.path / "ck"
    job, slurm_id = work.submit("--checkpoint", "ck", "-o", "out-%j.txt", "trainer.sh")
    urgent = ""
    try:
        old = wait_executions(work, job, 1)[0]
        node = old["node"]
        sandbox.wait_for(lambda: [p for p in _pubs(root) if p.step >= 3], 60, "a first save")
        # The urgent job needs the whole node the dispatch job runs on.
        urgent = sandbox.submit(
            "#!/bin/sh\nsleep 15\n",
            "-p",
            sandbox_slurm_conf.URGENT_PARTITION,
            "--exclusive",
            "-w",
            node,
            "-t",
            "2",
            "-o",
            "/dev/null",
        )
        first_log, second_log = work.path / "trainer-0.log", work.path / "trainer-1.log"
        sandbox.wait_for(lambda: _said(first_log, "sigterm"), 60, "SIGTERM to the preempted job")
        new = wait_executions(work, job, 2, timeout=120)[1]
        assert (old["restart"], new["restart"]) == (0, 1)
        assert (old["epoch"], new["epoch"]) == (1_000_000, 1_000_001)
        assert new["attempt"] != old["attempt"]
        state = sandbox.job_state(urgent)
        assert state["NodeList"] == node and state["JobState"] in ("RUNNING", "COMPLETED"), state
        assert sandbox.job_state(slurm_id)["Restarts"] == "1"

        # The window: the old execution got SIGTERM, saved and published step+1000 while it
        # ran on, and was killed KillWait later, before the replacement started.
        ((term_at, _),) = _said(first_log, "sigterm")
        term_save = max(
            (p for p in _pubs(root) if p.epoch == 1_000_000 and p.step < 1_000_000),
            key=lambda p: p.step,
        )
        assert term_save.step >= 1003 and term_save.path.startswith(old["exec_dir"] + "/")
        last_alive = max(t for t, _ in _said(first_log, "alive"))
        ran_on = last_alive - term_at
        wait = sandbox_slurm_conf.KILL_WAIT
        assert wait - 1.5 <= ran_on <= wait + 2, (
            f"the preempted execution ran {ran_on:.1f} s after SIGTERM (KillWait {wait} s)"
        )
        ((started_at, resumed),) = sandbox.wait_for(
            lambda: _said(second_log, "resumed"), 30, "the replacement's first line"
        )
        assert started_at > last_alive

        # The replacement resumed from its job's latest publication when it started: the
        # save it made on SIGTERM.
        assert new["resume_from"] == term_save.path
        assert resumed.endswith(f"resumed step={term_save.step} from={term_save.path}")

        # The straggler's save, published after the replacement's first, names a far higher
        # step; the replacement's saves still rank first.
        stray = sandbox.wait_for(
            lambda: [p for p in _pubs(root) if p.step >= 1_000_000], 60, "the straggler's save"
        )
        assert stray[0].epoch == 1_000_000 and stray[0].path.startswith(old["exec_dir"] + "/")
        before = max(p.step for p in _pubs(root) if p.epoch == 1_000_001)
        sandbox.wait_for(
            lambda: max(p.step for p in _pubs(root) if p.epoch == 1_000_001) > before,
            30,
            "the replacement saving after the straggler",
        )
        latest = json.loads(work.run("dispatch", "latest", "--json", "--root", "ck").stdout)
        assert latest["epoch"] == 1_000_001, f"a late save outranked the replacement: {latest}"
        assert latest["path"].startswith(new["exec_dir"] + "/")
        assert latest["step"] < stray[0].step
        assert _said(first_log, "straggler published")  # the straggler's own word
        # The record: the preempted execution ended requeued, the replacement runs.
        assert [e["state"] for e in work.status(job)["executions"]] == ["REQUEUED", "RUNNING"]
    finally:
        sandbox.run(["scancel", slurm_id, *([urgent] if urgent else [])], check=False)
        pid_file = work.path / "straggler.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def test_jobs_of_the_default_partition_are_preemptable_and_urgent_ones_rank_higher(
    sandbox: Any,
) -> None:
    config = sandbox.run(["scontrol", "show", "config"]).stdout
    settings = {
        k.strip(): v.strip()
        for k, _, v in (line.partition("=") for line in config.splitlines() if " = " in line)
    }
    assert settings["PreemptType"] == "preempt/partition_prio"
    assert settings["PreemptMode"] == "REQUEUE"
    parts = {}
    for line in sandbox.run(["scontrol", "-o", "show", "partition"]).stdout.splitlines():
        fields = dict(pair.partition("=")[::2] for pair in line.split())
        parts[fields["PartitionName"]] = fields
    default = parts[sandbox_slurm_conf.PARTITION_NAME]
    urgent = parts[sandbox_slurm_conf.URGENT_PARTITION]
    assert default["Default"] == "YES" and urgent["Default"] == "NO"
    assert int(urgent["PriorityTier"]) > int(default["PriorityTier"])
    assert default["Nodes"] == urgent["Nodes"]
