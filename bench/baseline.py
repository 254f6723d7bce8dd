"""A second source tree as a bench's baseline (``--baseline-src PATH``): another commit of this
project (a ``git archive`` or a worktree of it), timed side by side with this checkout in one
run, so that "no slower than before" is one ratio under the same load.

Invariant: the baseline runs on the same interpreter as this checkout's side, only its source
tree put first on ``sys.path``, through the entry point its own ``pyproject.toml`` names (a
module may have moved between the two commits); nothing of the baseline is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path


def entry_point(src: Path, script: str) -> tuple[str, str]:
    """(module, function) of console script ``script`` in ``src``'s ``pyproject.toml``."""
    text = (src / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(rf'(?m)^{re.escape(script)}\s*=\s*"([\w.]+):(\w+)"', text)
    if found is None:
        raise SystemExit(f"{src}/pyproject.toml names no console script {script!r}")
    return found.group(1), found.group(2)


def checked(src: str) -> Path:
    """``src`` as a source tree of this project, or exit naming what is missing."""
    path = Path(src).resolve()
    if not (path / "pyproject.toml").is_file() or not (path / "slurm_dispatch").is_dir():
        raise SystemExit(
            f"--baseline-src {src}: not a slurm-dispatch source tree "
            "(no pyproject.toml and slurm_dispatch/ there)"
        )
    return path


def console_script(python: str, src: Path, script: str) -> str:
    """The text of ``script``'s console script as pip writes it (``#!python``, ``import re,
    sys``, the entry point's import, ``sys.exit(entry())``), importing from ``src`` first."""
    module, function = entry_point(src, script)
    return (
        f"#!{python}\nimport re\nimport sys\nsys.path.insert(0, {str(src)!r})\n"
        f"from {module} import {function}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        f"    sys.exit({function}())\n"
    )


def copy_package(src: Path, target: Path) -> Path:
    """Copy ``src``'s ``pyproject.toml`` and ``slurm_dispatch/`` (no bytecode) into ``target``,
    for a baseline another user must read; returns ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "pyproject.toml", target / "pyproject.toml")
    shutil.copytree(
        src / "slurm_dispatch",
        target / "slurm_dispatch",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return target


def compile_tree(python: str, src: Path) -> None:
    """Byte-compile ``src/slurm_dispatch`` for ``python``, as pip does for an installed copy: a
    tree never compiled is compiled again by every process where bytecode is not written
    (``PYTHONDONTWRITEBYTECODE``, a folder the runner cannot write), which a bench would count."""
    subprocess.run(
        [python, "-m", "compileall", "-q", str(src / "slurm_dispatch")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
