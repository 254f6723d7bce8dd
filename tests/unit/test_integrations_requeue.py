"""The job's own requeue (integrations/requeue.py) names its execution where Slurm gives the
execution an id (``SLURM_JOB_SLUID``, 26.05): a late call from an old execution then names no
job, instead of its replacement.  Slurm's scontrol is faked at the process boundary: a script
on PATH that records its arguments (the real one runs in tests/real/test_self_requeue.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from slurm_dispatch.integrations import requeue as module
from slurm_dispatch.integrations.requeue import requeue


def _fake_scontrol(folder: Path, status: int = 0, stderr: str = "") -> Path:
    calls = folder / "calls"
    program = folder / "scontrol"
    program.write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {calls}\n"
        f"printf '%s\\n' '{stderr}' >&2\nexit {status}\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return calls


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return _fake_scontrol(tmp_path)


def test_the_requeue_names_the_executions_sluid_where_slurm_gives_one(
    scontrol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_SLUID", "s0CXM950AMXP00")
    assert requeue("checkpoint-5", False) is None
    assert scontrol.read_text().splitlines() == ["requeue s0CXM950AMXP00"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SLURM_JOB_ID": "41"}, "41"),
        ({"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}, "40_3"),
        # Not a SLUID Slurm prints: the job id, as on releases without one.
        ({"SLURM_JOB_ID": "41", "SLURM_JOB_SLUID": "s0-1;rm"}, "41"),
        ({"SLURM_JOB_ID": "41", "SLURM_JOB_SLUID": ""}, "41"),
    ],
)
def test_without_a_sluid_the_job_is_named(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert module.own_execution() == named


def test_a_late_requeue_slurm_refuses_says_the_job_moved_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    _fake_scontrol(tmp_path, 1, "slurm_requeue error: Invalid job id specified")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_SLUID", "s0CXM950AMXP00")
    why = requeue("checkpoint-5", False)
    assert why is not None
    assert (
        "`scontrol requeue s0CXM950AMXP00` failed (exit 1): slurm_requeue error: Invalid "
        "job id specified" in why
    )
    assert "s0CXM950AMXP00, this execution's SLUID, names no job any more" in why
    assert why in capsys.readouterr().err


def test_the_requeue_is_marked_in_the_executions_folder_before_it_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So that --max-requeues does not count the job's own requeue as Slurm's: the
    mark is there before scontrol runs (a pass may see the requeued job at once)."""
    from slurm_dispatch.checkpoint import execdir
    from slurm_dispatch.execution.saves import Execution

    folder = tmp_path / "ck" / "exec" / "a1"
    folder.mkdir(parents=True)
    mark = folder / execdir.REQUEUED
    calls = tmp_path / "calls"
    program = tmp_path / "scontrol"
    program.write_text(
        f"#!/bin/sh\n[ -e {mark} ] && echo marked >> {calls}\nprintf '%s\\n' \"$*\" >> {calls}\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    execution = Execution(
        root=str(tmp_path / "ck"),
        exec_dir=str(folder),
        epoch=10**6,
        attempt="a1",
        job="j",
        resume_from="",
    )
    assert requeue(str(folder / "checkpoint-5"), False, execution=execution) is None
    assert calls.read_text().splitlines() == ["marked", "requeue 41"]


def test_a_stalled_execution_saves_but_is_never_requeued(
    scontrol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stall watcher marks the folder before its signal; the callbacks'
    save at that signal then ends the run failed instead of requeuing it."""
    import json

    from slurm_dispatch.checkpoint import execdir

    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(tmp_path))
    (tmp_path / execdir.STALLED).write_text(json.dumps({"seconds": 61, "step": 40}))
    said = requeue("checkpoint-40", False)
    assert said is not None and said.startswith(
        "stalled: no progress for 61 s since step 40 (--stall-timeout): published "
        "checkpoint-40 at the signal, not requeued"
    ), said
    assert not scontrol.exists()  # scontrol never ran
