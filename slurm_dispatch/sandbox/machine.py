"""What this machine needs for a sandbox: root, Debian's Slurm and munge, and the accounts.

Role: :func:`require_root` for the verbs that start daemons; :func:`ensure_packages` installs
``slurm-wlm``, ``munge`` and ``python3-venv`` with apt-get when missing (CI starts from a bare
box), and ``mariadb-server`` and ``slurmdbd`` for a sandbox that keeps accounting
(:func:`ensure_database_server`: the server alone for a Debian root, which holds its
slurmdbd); the job user and its home (:func:`ensure_user`), the munge user a Debian root shares
with the host (:func:`ensure_munge_user`); :func:`home_of`.  The job user is never root.

Invariant: installs only what is missing and says what it installed; apt's output goes to a log
under the state folder (or the cache folder), never to the caller's terminal.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
from pathlib import Path

from ..errors import SandboxError
from .clients import program
from .install import SYSTEM_PYTHON
from .layout import MUNGE_USER, USER_ENV, Layout
from .state_folder import append, tail

APT_PACKAGES = ("slurm-wlm", "munge")
SLURM_PROGRAMS = (
    "slurmctld",
    "slurmd",
    "munged",
    "munge",
    "unmunge",
    "sinfo",
    "scontrol",
    "sbatch",
    "squeue",
    "scancel",
)


def require_root(verb: str) -> None:
    if os.geteuid() != 0:
        raise SandboxError(
            f"`dispatch-sandbox {verb}` must run as root: the sandbox's "
            f"daemons run as root; try: sudo dispatch-sandbox {verb}"
        )


def _missing_programs() -> list[str]:
    return [p for p in SLURM_PROGRAMS if not os.path.isabs(program(p))]


def _venv_missing() -> bool:
    try:
        proc = subprocess.run(
            [SYSTEM_PYTHON, "-c", "import venv, ensurepip"], capture_output=True, timeout=30
        )
    except OSError:
        return True
    return proc.returncode != 0


DATABASE_PROGRAMS = {"mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server"}


def _missing_database(programs: dict[str, str]) -> list[str]:
    return sorted(
        {package for name, package in programs.items() if not os.path.isabs(program(name))}
    )


def ensure_database_server(layout: Layout) -> list[str]:
    """apt-get install MariaDB's server when missing (a sandbox's accounting runs one of its
    own; the package's own service, where its install starts one, is left alone)."""
    packages = _missing_database(DATABASE_PROGRAMS)
    if not packages:
        return []
    apt_install(layout, packages)
    return [f"installed {' '.join(packages)}"]


def ensure_packages(layout: Layout, accounting: bool = False) -> list[str]:
    """apt-get install Slurm, munge and python3-venv when missing (CI starts from a bare box),
    and with ``accounting`` MariaDB's server and the host's slurmdbd."""
    packages = list(APT_PACKAGES) if _missing_programs() else []
    if _venv_missing():
        packages.append("python3-venv")
    if accounting:
        packages += _missing_database(
            {
                **DATABASE_PROGRAMS,
                "slurmdbd": "slurmdbd",
                "sacct": "slurm-client",
                "sacctmgr": "slurm-client",
            }
        )
    if not packages:
        return []
    apt_install(layout, packages)
    still = _missing_programs()
    if still:
        raise SandboxError(
            f"after installing {' '.join(packages)}, still missing: " + ", ".join(still)
        )
    return [f"installed {' '.join(packages)}"]


def apt_install(layout: Layout, packages: list[str]) -> None:
    log = layout.root / "apt.log"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        with append(log) as out:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        if proc.returncode != 0:
            raise SandboxError(f"{shlex.join(argv)} failed (exit {proc.returncode}):\n" + tail(log))


def ensure_munge_user(layout: Layout) -> list[str]:
    """A sandbox in a Debian root shares the host's accounts (sandbox_root binds /etc/passwd):
    its munged runs as the host's munge user, made by the host's munge package when missing."""
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        apt_install(layout, ["munge"])
        return ["installed munge (for its user)"]
    return []


def home_of(user: str) -> str:
    """``user``'s home folder (where `exec --user` runs by default)."""
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        raise SandboxError(f"no user {user!r} on this machine") from None


def ensure_user(user: str) -> list[str]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        entry = None
    if entry is not None and entry.pw_uid == 0:
        raise SandboxError(
            f"job user {user!r} is root (uid 0): the sandbox's jobs run unprivileged, as a "
            f"cluster's do; choose another user (--user, or ${USER_ENV})"
        )
    if entry is None:
        proc = subprocess.run(
            ["useradd", "-m", "-s", "/bin/bash", user], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SandboxError(f"useradd -m {user} failed: {(proc.stderr + proc.stdout).strip()}")
        return [f"created user {user}"]
    home = Path(entry.pw_dir)
    if not home.is_dir():
        home.mkdir(parents=True, mode=0o755)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        return [f"created home {home} of {user}"]
    return []
