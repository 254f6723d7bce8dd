"""Console scripts installed before the layout move keep working (docs/architecture.md, names kept
for one release).

An editable install (``pip install -e .``, what ``make install`` does in a clone, and the venv
``contrib/systemd``'s supervisor timer and a job's ``dispatch publish`` run from) wrote
``bin/dispatch`` and its siblings once, naming the entry points of the day
(``slurm_dispatch.cli:main``, ``slurm_dispatch.cli_sbatch:entry``, ...).  After a ``git pull`` over
the move every one of them failed to import until pip ran again.  Those four paths stay for one
release and run the same functions as the new ones; ``dispatch-sbatch``'s still imports no click.
``python -m slurm_dispatch.cli`` (the module ``cli.py`` then) runs ``dispatch`` too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What pyproject.toml's [project.scripts] said before the move, and says now.
MOVED = {
    "dispatch": ("slurm_dispatch.cli:main", "slurm_dispatch.cli.dispatch:main"),
    "dispatch-sbatch": ("slurm_dispatch.cli_sbatch:entry", "slurm_dispatch.cli.sbatch:entry"),
    "dispatch-sandbox": ("slurm_dispatch.cli_sandbox:main", "slurm_dispatch.cli.sandbox:main"),
    "dispatch-cease": ("slurm_dispatch.cli_cease:main", "slurm_dispatch.cli.cease:main"),
}

# The console script pip writes for an entry point (module:attr).
SCRIPT = """\
import re, sys
from {module} import {attr} as main
sys.argv[0] = {name!r}
sys.exit(main())
"""


def run_script(name: str, spec: str, *args: str) -> subprocess.CompletedProcess[str]:
    module, attr = spec.split(":")
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(module=module, attr=attr, name=name), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_the_current_entry_points_are_the_ones_pyproject_installs() -> None:
    text = (REPO / "pyproject.toml").read_text()
    for name, (_, new) in MOVED.items():
        assert f'{name} = "{new}"' in text


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_script_installed_before_the_move_runs_the_same_command(name: str) -> None:
    old, new = MOVED[name]
    before, now = run_script(name, old, "--help"), run_script(name, new, "--help")
    assert before.returncode == now.returncode == 0, before.stderr
    assert before.stdout == now.stdout and before.stderr == now.stderr


def test_the_old_dispatch_sbatch_path_imports_no_click() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; from slurm_dispatch.cli_sbatch import entry; "
            "print('click' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "False"


def test_python_m_slurm_dispatch_cli_is_dispatch() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "slurm_dispatch.cli", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    script = run_script("dispatch", MOVED["dispatch"][1], "--help")
    assert module.returncode == 0 and module.stdout == script.stdout
