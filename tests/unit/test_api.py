"""The Python API: the environment contract read as a typed value, publish/latest/list with
the execution's defaults, and errors naming what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch import api
from slurm_dispatch.checkpoint import model
from slurm_dispatch.errors import AlreadyPublished, OutsideRoot, UsageError


@pytest.fixture
def contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ck"
    attempt = model.new_attempt()
    exec_dir = root / "exec" / attempt
    exec_dir.mkdir(parents=True)
    for name, value in {
        "DISPATCH_JOB": "dabcdefg",
        "DISPATCH_GENERATION": "1",
        "DISPATCH_SUBMISSION": "2",
        "DISPATCH_EPOCH": str(1_000_002_000_003),
        "DISPATCH_ATTEMPT": attempt,
        "DISPATCH_CHECKPOINT": str(root),
        "DISPATCH_EXEC_DIR": str(exec_dir),
        "DISPATCH_RESUME_FROM": "",
    }.items():
        monkeypatch.setenv(name, value)
    return exec_dir


def test_outside_a_dispatch_execution_there_is_none() -> None:
    assert api.execution() is None and api.resume_from() is None


def test_the_contract_as_a_value(contract: Path) -> None:
    run = api.execution()
    assert run is not None
    assert (run.job, run.generation, run.submission, run.restart) == ("dabcdefg", 1, 2, 3)
    assert run.exec_dir == str(contract) and run.resume_from is None


def test_publish_latest_list_with_the_executions_defaults(contract: Path) -> None:
    save = contract / "checkpoint-10"
    save.mkdir()
    name = api.publish(str(save), 10)
    assert name.startswith(f"{1_000_002_000_003:020d}-{10:020d}-")
    found = api.latest()
    assert found is not None and found.path == str(save) and found.step == 10
    assert [f.step for f in api.list_publications()] == [10]
    assert api.resume_from() == str(save)
    with pytest.raises(AlreadyPublished):
        api.publish(str(save), 10)
    with pytest.raises(FileExistsError):  # the builtin meaning, for callers that use it
        api.publish(str(save), 10)


def test_a_path_outside_the_root_is_refused(contract: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(OutsideRoot):
        api.publish(str(outside), 1)


def test_a_partial_or_garbled_contract_names_the_variable(
    contract: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_EPOCH", "12x")
    with pytest.raises(UsageError, match="DISPATCH_EPOCH='12x'"):
        api.execution()
    monkeypatch.delenv("DISPATCH_EXEC_DIR")
    with pytest.raises(UsageError, match="lacks DISPATCH_EXEC_DIR"):
        api.execution()


def test_no_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="no checkpoint root"):
        api.latest()


def test_the_api_imports_no_click_and_no_training_library() -> None:
    code = (
        "import sys, slurm_dispatch.api; "
        "print(','.join(m for m in ('click', 'torch', 'transformers', 'lightning') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items()},
    ).stdout
    assert out.strip() == ""
