"""The Makefile installs into a venv of its own, never into the interpreter it was given (issue
18 item 1): Debian's own python3 refuses installs into itself (PEP 668), and `make test` used to
install into whatever `python3` was, leaving its packages inconsistent.

`make -n` prints what each target would run; every install must go through the venv's Python,
and the venv's bin/ must come first on the PATH the recipes see."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dry_run(target: str, tmp_path: Path, python: str = "/usr/bin/python3") -> list[str]:
    venv = tmp_path / "venv"
    out = subprocess.run(["make", "-n", "-B", target, f"PYTHON={python}", f"VENV={venv}"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("target", ["install", "install-test", "test", "test-fast", "demo",
                                    "demo-protocol", "bench", "dist", "check"])
def test_every_install_goes_through_the_venv(target: str, tmp_path: Path) -> None:
    lines = dry_run(target, tmp_path)
    venv_python = f"{tmp_path / 'venv'}/bin/python"
    installs = [line for line in lines if re.search(r"\bpip\b.*\b(install|wheel)\b", line)]
    for line in installs:
        assert line.lstrip().startswith(venv_python), line
    for line in lines:
        assert not re.match(r"\s*(/usr/bin/python3|python3)\s+-m\s+pip\b", line), line
    if target not in ("install", "install-test", "dist"):
        assert any(line.lstrip().startswith(venv_python) or line.startswith("bash ")
                   for line in lines), lines


def test_recipes_see_the_venv_first_on_path(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    out = subprocess.run(["make", "-s", "--eval", "show-path: ; @echo $$PATH", "show-path",
                          f"VENV={venv}"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split(os.pathsep)[0] == f"{venv}/bin"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root to run as another user")
def test_make_venv_names_the_package_when_it_cannot_make_one() -> None:
    # A Python without ensurepip (Debian's without python3-venv), for a user who cannot install
    # it: one line naming the package, and no venv left half-made.  (In a folder the other user
    # can reach: pytest's own tmp_path is root's alone.)
    tmp_path = Path(tempfile.mkdtemp(prefix="make-venv-"))
    fake = tmp_path / "python-without-venv"
    fake.write_text("#!/bin/sh\n"
                    "case \"$*\" in *ensurepip*) exit 1;; *version_info*) echo 3.11;; esac\n"
                    "exit 1\n")
    fake.chmod(0o755)
    tmp_path.chmod(0o777)
    out = subprocess.run(["runuser", "-u", "nobody", "--", "sh", str(REPO / "tools/make-venv"),
                          str(fake), str(tmp_path / "venv")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert "python3-venv" in out.stderr and "python3.11-venv" in out.stderr, out.stderr
    assert not (tmp_path / "venv").exists()
    shutil.rmtree(tmp_path)
