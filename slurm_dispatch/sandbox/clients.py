"""How a command reaches a sandbox: Slurm's clients and the user's commands, here or in its root.

Role: the environment that points Slurm's clients and ``dispatch`` at a sandbox
(:func:`environment`, :func:`env_lines`), where a program is (:func:`program`), the command
line that runs something on the sandbox's side (:func:`command`, :func:`wrap`: unchanged for the
host's Slurm, entered into the Debian root of another release) and running a Slurm client
against it (:func:`run_slurm`).

Invariant: a command for a sandbox in a Debian root always runs inside that root (its clients
speak only to its own release); a Slurm client that :func:`run_slurm` runs never inherits the
caller's ``SLURM_*`` or ``SBATCH_*`` settings, only the sandbox's ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ..errors import SandboxError
from . import root as sandbox_root
from .layout import DEFAULT_USER, DIR_ENV, USER_ENV, Layout, PathLike, read_manifest, state_dir


def environment(
    directory: Optional[PathLike] = None,
    user: Optional[str] = None,
    base_path: Optional[str] = None,
) -> dict[str, str]:
    """The variables that point Slurm clients and ``dispatch`` at the sandbox.

    Only the sandbox's own variables (``SLURM_CONF``, ``DISPATCH_SANDBOX_DIR``,
    ``DISPATCH_SANDBOX_USER`` and ``PATH`` with ``<state>/venv/bin`` first); merge them into a
    copy of ``os.environ`` to run commands.
    """
    layout = Layout(state_dir(directory))
    if user is None:
        user = (
            read_manifest(layout).get("user", DEFAULT_USER)
            if layout.manifest.exists()
            else DEFAULT_USER
        )
    path = base_path if base_path is not None else os.environ.get("PATH", os.defpath)
    return {
        "SLURM_CONF": str(layout.slurm_conf),
        DIR_ENV: str(layout.root),
        USER_ENV: str(user),
        "PATH": f"{layout.venv_bin}{os.pathsep}{path}" if path else str(layout.venv_bin),
    }


def env_lines(directory: Optional[PathLike] = None) -> list[str]:
    """Shell lines to ``eval``: the exports of :func:`environment`, PATH prepended literally.

    Refused for a sandbox in a Debian root: its clients and venv run only inside that root
    (:func:`command`, ``dispatch-sandbox exec``)."""
    layout = Layout(state_dir(directory))
    if root_of(layout) is not None:
        release = read_manifest(layout).get("slurm", "")
        raise SandboxError(
            f"the sandbox in {layout.root} runs Slurm {release} from its Debian root; its "
            "clients and venv do not run on this machine: run them with `dispatch-sandbox "
            "exec [--user USER] -- COMMAND`"
        )
    env = environment(directory, base_path="")
    lines = [
        f"export {name}={shlex.quote(env[name])}" for name in ("SLURM_CONF", DIR_ENV, USER_ENV)
    ]
    venv_bin = Layout(state_dir(directory)).venv_bin
    lines.append(f'export PATH={shlex.quote(str(venv_bin))}:"$PATH"')
    return lines


def _client_env(layout: Layout) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_"))
    }
    env["SLURM_CONF"] = str(layout.slurm_conf)
    return env


def run_slurm(layout: Layout, argv: list[str], timeout: float = 30) -> str:
    """Run a Slurm client against the sandbox; return stdout or raise with its output."""
    root = root_of(layout)
    full = [program(argv[0], root), *argv[1:]]
    try:
        proc = subprocess.run(
            wrap(layout, full, root=root),
            capture_output=True,
            text=True,
            env=_client_env(layout),
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{shlex.join(full)} did not answer within {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise SandboxError(
            f"{shlex.join(full)} failed (exit {proc.returncode}): "
            + (proc.stderr + proc.stdout).strip()
        )
    return proc.stdout


def program(name: str, root: Optional[Path] = None) -> str:
    """The program's path on this machine, or inside ``root`` (as seen from within it)."""
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        candidate = os.path.join(folder, name)
        if os.access(f"{root}{candidate}" if root is not None else candidate, os.X_OK):
            return candidate
    return name if root is not None else shutil.which(name) or name


def root_of(layout: Layout) -> Optional[Path]:
    """The Debian root this sandbox runs from (its manifest says), or None for the host's."""
    if not layout.manifest.exists():
        return None
    rootfs = read_manifest(layout).get("rootfs")
    return Path(rootfs) if rootfs else None


def wrap(
    layout: Layout,
    argv: Sequence[str],
    user: Optional[str] = None,
    cwd: Optional[str] = None,
    root: Optional[Path] = None,
) -> list[str]:
    """``argv`` as run against this sandbox: unchanged for the host's Slurm (``user`` and
    ``cwd`` are then the caller's to apply), entered into the Debian root otherwise."""
    root = root if root is not None else root_of(layout)
    if root is None:
        return list(argv)
    return sandbox_root.enter_argv(root, layout.root, argv, user=user, cwd=cwd)


def command(
    argv: Sequence[str],
    directory: Optional[PathLike] = None,
    user: Optional[str] = None,
    cwd: Optional[PathLike] = None,
) -> list[str]:
    """The command line that runs ``argv`` on the sandbox's side, as ``user`` in ``cwd``.

    For the host's Slurm: ``runuser -u USER -- env -C CWD ARGV`` (or less).  For a sandbox
    in a Debian root, the same inside that root (see :mod:`sandbox_root`); then it must be
    run as root.  Run it with the variables of :func:`environment`.
    """
    layout = Layout(state_dir(directory))
    where = os.fspath(cwd) if cwd is not None else None
    root = root_of(layout)
    if root is not None:
        return sandbox_root.enter_argv(root, layout.root, argv, user=user, cwd=where)
    prefix = ["runuser", "-u", user, "--"] if user is not None else []
    if where is not None:
        prefix += ["env", "-C", where]
    return [*prefix, *argv]
