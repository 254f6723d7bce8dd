"""dispatch-cease as a command: exit codes 0/1/2, table and JSON, against a fake scontrol that
fails loudly on an unexpected call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..fakes import squeue
from ..fakes.hooks import record, slurm_clock, state_dir


def cease(
    tmp_path: Path, *args: str, state: str = "COMPLETED", conf: str | None = None
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stamp = slurm_clock(time.time() - 50)
    squeue.install_commands(
        bin_dir,
        str(tmp_path / "calls"),
        {
            "JobId": "100",
            "UserId": "alice(1000)",
            "JobState": state,
            "Restarts": "0",
            "StartTime": stamp,
            "EndTime": stamp,
            "NodeList": "n[1-2]",
        },
    )
    config = tmp_path / "dispatch.conf"
    config.write_text(conf if conf is not None else f"StateDir={tmp_path / 'state'}\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_DISPATCH_CONF": str(config),
        "DISPATCH_SLURM_ATTEMPTS": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "slurm_dispatch.cli.cease", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture()
def recorded(tmp_path: Path) -> Path:
    state, _ = state_dir(tmp_path)
    for name in ("n1", "n2"):
        start = record(state, "start", name, time=time.time() - 60, restart=0)
        record(
            state,
            "end",
            name,
            time=time.time() - 40,
            restart=0,
            survivors=[],
            scan_error=None,
            start_token=start.split(".")[-1],
        )
    return tmp_path


def test_ceased_exit_0_table_and_json(recorded: Path) -> None:
    proc = cease(recorded, "100")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "CEASED", "EVIDENCE"]
    assert lines[1].startswith("n1") and "yes" in lines[1]
    assert lines[-1].startswith("job 100 restart 0 (COMPLETED): ceased")
    data = json.loads(cease(recorded, "100", "--json").stdout)
    assert data["ceased"] is True and [n["node"] for n in data["nodes"]] == ["n1", "n2"]
    # Two controller calls per answer, whatever the node count.
    assert len((recorded / "calls").read_text().splitlines()) == 4


def test_not_proven_exit_1(recorded: Path) -> None:
    proc = cease(recorded, "100", state="COMPLETING")
    assert proc.returncode == 1 and "has not ended" in proc.stdout


@pytest.mark.parametrize(
    "args,conf,words",
    [
        (["999"], None, "unknown to the controller"),
        (["100", "--restart", "5"], None, "never ran"),
        (["100"], "StateDir=/x\nHookTimeout=forever\n", "HookTimeout"),
        (["100"], "Colour=blue\n", "unknown key 'Colour'"),
    ],
)
def test_errors_exit_2(recorded: Path, args: list[str], conf: str | None, words: str) -> None:
    proc = cease(recorded, *args, conf=conf)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("dispatch-cease: ") and words in proc.stderr


@pytest.mark.parametrize("since", ["other-starts-no-end", "an-end-since", "just-ended"])
def test_a_node_that_records_no_end_for_any_job_is_named(tmp_path: Path, since: str) -> None:
    # With a broken Epilog a node records starts and never an end; dispatch-cease
    # says so, with the time since when, beside the evidence that does not prove.
    state, _ = state_dir(tmp_path)
    start = record(state, "start", "n1", time=time.time() - 60, restart=0)
    record(
        state,
        "end",
        "n1",
        time=time.time() - 40,
        restart=0,
        survivors=[],
        scan_error=None,
        start_token=start.split(".")[-1],
    )
    record(state, "start", "n2", time=time.time() - 60, restart=0)
    if since != "just-ended":
        other = record(state, "start", "n2", job_id="101", time=time.time() - 30, restart=0)
    if since == "an-end-since":
        record(
            state,
            "end",
            "n2",
            job_id="101",
            time=time.time() - 20,
            restart=0,
            survivors=[],
            scan_error=None,
            start_token=other.split(".")[-1],
        )
    proc = cease(tmp_path, "100", "--json")
    assert proc.returncode == 1, proc.stderr
    nodes = {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}
    assert nodes["n1"]["proven"] is True and "no end" not in nodes["n1"]["evidence"]
    evidence = nodes["n2"]["evidence"]
    assert evidence.startswith("no post-kill record (its Epilog has not recorded an end)")
    hinted = "n2 has recorded no end for any job since " in evidence
    assert hinted == (since == "other-starts-no-end"), evidence
    if hinted:
        assert (
            "(2 start(s) since): its Epilog is likely not installed or not working (run "
            "`dispatch-admin doctor` on n2)" in evidence
        )
