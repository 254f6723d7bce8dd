"""Attack on a job whose interpreter is gone: an interpreter that exists but cannot import
slurm_dispatch (a venv made again at the same path without it; `--python /usr/bin/python3`) fails
every submission at once just as a removed one does, so it is refused the same way."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_dispatch.control import interpreter


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    return str(venv / "bin" / "python")


def test_an_interpreter_without_slurm_dispatch_is_refused(bare_python: str) -> None:
    why = interpreter.missing(bare_python)
    assert why is not None and "cannot import slurm_dispatch" in why, why
    assert bare_python in why


def test_this_interpreter_is_fine() -> None:
    assert interpreter.missing(sys.executable) is None
