"""The sandbox's venv and the checkout installed into it.

Role: which checkout this package runs from (:func:`source_root`), a digest of the files that
make the installed package (:func:`source_digest`), and :func:`ensure_venv`, which makes
``<state>/venv`` (on the Debian root's Python for another release) and installs the checkout
into it from a copy, only when the digest changed.

Invariant: the checkout is never written into (the build runs on a copy under the state
folder); the digest file is written only after pip succeeded, so a failed install is retried
by the next ``up``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ..errors import SandboxError
from . import root as sandbox_root
from .clients import wrap
from .layout import Layout
from .state_folder import append, tail, write_text

SYSTEM_PYTHON = "/usr/bin/python3"


def source_root() -> Optional[Path]:
    """The checkout this package runs from, or None when it runs from an installed copy."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "slurm_dispatch").is_dir():
        return root
    return None


def source_digest(repo: Path) -> str:
    """SHA-256 over the files that make the installed package: pyproject, README, the package."""
    digest = hashlib.sha256()
    for path in _source_files(repo):
        digest.update(str(path.relative_to(repo)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _source_files(repo: Path) -> list[Path]:
    files = [
        repo / name
        for name in (
            "pyproject.toml",
            "README.md",
            "setup.cfg",
            "setup.py",
            "MANIFEST.in",
            "LICENSE",
        )
        if (repo / name).is_file()
    ]
    package = repo / "slurm_dispatch"
    files += sorted(
        p
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    return files


def ensure_venv(layout: Layout, repo: Path, root: Optional[Path] = None) -> list[str]:
    """Install ``repo`` into ``<state>/venv`` unless the same source is installed already.

    With ``root`` the venv is made by, and runs on, that Debian root's Python (its path is
    the same inside: sandbox_root binds the state folder), and pip runs inside it."""
    if not (repo / "pyproject.toml").is_file():
        raise SandboxError(f"{repo} is not a slurm-dispatch checkout (no pyproject.toml)")
    digest = source_digest(repo)
    python = layout.venv_bin / "python"
    works = (python.exists() or python.is_symlink()) and subprocess.run(
        wrap(layout, [str(python), "-c", ""], root=root), capture_output=True, env=_pip_env(root)
    ).returncode == 0
    try:
        installed = layout.source_hash_file.read_text().strip()
    except OSError:
        installed = ""
    if works and installed == digest:
        return []
    actions = []
    log = layout.log_dir / "venv.log"
    if not works:
        shutil.rmtree(layout.venv, ignore_errors=True)
        _logged_run(
            wrap(layout, [SYSTEM_PYTHON, "-m", "venv", str(layout.venv)], root=root),
            log,
            "creating the venv",
            env=_pip_env(root),
        )
        actions.append(f"created {layout.venv}")
    # Build from a copy: an in-tree build would write build/ and *.egg-info into the checkout,
    # and a non-editable install keeps working when the checkout is not readable by the job user.
    with tempfile.TemporaryDirectory(dir=layout.root, prefix="build-") as scratch:
        copy = Path(scratch) / "src"
        for path in _source_files(repo):
            target = copy / path.relative_to(repo)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        if not (copy / "README.md").exists():
            (copy / "README.md").write_text("slurm-dispatch\n")
        layout.source_hash_file.unlink(missing_ok=True)
        # pip always reinstalls a project given as a folder; dependencies only when missing.
        _logged_run(
            wrap(
                layout,
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--quiet",
                    str(copy),
                ],
                root=root,
            ),
            log,
            f"installing {repo} into the venv",
            env=_pip_env(root),
        )
    write_text(layout.source_hash_file, digest + "\n")
    actions.append(f"installed {repo} into {layout.venv}")
    return actions


def _pip_env(root: Optional[Path]) -> Optional[dict[str, str]]:
    """The environment of pip: ours on the host; inside a Debian root without this machine's
    pip settings (they name files of the host, such as local wheels), trusting what this
    machine trusts (its certificate store is bound inside)."""
    if root is None:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    if os.path.isfile(sandbox_root.CA_BUNDLE):
        env["PIP_CERT"] = sandbox_root.CA_BUNDLE
    return env


def _logged_run(
    argv: list[str], log: Path, what: str, env: Optional[dict[str, str]] = None
) -> None:
    with append(log) as out:
        out.write(f"--- {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            umask=0o022,
            env=env,
        )
    if proc.returncode != 0:
        raise SandboxError(f"{what} failed (exit {proc.returncode}):\n" + tail(log, 30))
