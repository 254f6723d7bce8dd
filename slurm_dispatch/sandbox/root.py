"""Another Slurm release for the sandbox: a Debian root made with debootstrap, entered per command.

Debian 12 ships Slurm 22.05 only, and a 24.11 controller speaks only to 23.02 and later
clients, so a 24.11 sandbox runs everything that talks to it inside a Debian 13 root made from
Debian's own packages (``debootstrap --variant=minbase``): its daemons, its Slurm tools, the
project's venv on that root's Python, the jobs and the hooks.  The releases it can run are
one table, :data:`RELEASES`: a row per release (its suite, its packages, the extras a root
built before them gets installed without a rebuild: slurmdbd), and a ``newest`` row
for Debian's testing, whose Slurm moves on with the suite (26.05 when written): what a root of
it holds is read from the root (:func:`held`), never assumed.

Invariant: the host's mount table is never changed.  Each command enters the root through
:func:`enter_argv`: ``unshare --mount`` gives it a private mount namespace, in which ``/proc``,
``/sys``, ``/dev``, ``/tmp``, ``/var/tmp``, ``/home``, the sandbox folder and the account files
are bound into the root before ``chroot``; the binds vanish with the last process of that
namespace (a daemon, or jobs that outlive it).  Paths are therefore the same inside and out, and
so are users and their ids (``/etc/passwd`` is the host's).  Removing the cache folder can never
reach through a bind into the host's ``/dev`` or ``/home``.

The root is built once per cache folder (``/var/cache/slurm-dispatch``, or
``$DISPATCH_SANDBOX_ROOTFS``) under a temporary name and renamed into place complete, with a
marker naming what it holds; later ``up`` calls reuse it.  The library never prints.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import SandboxError
from . import state_folder

HOST = "host"
CACHE_ENV = "DISPATCH_SANDBOX_ROOTFS"
DEFAULT_CACHE = Path("/var/cache/slurm-dispatch")
MARKER = ".slurm-dispatch-root"
# Bound whole (with what is mounted below them): the kernel's views, and the folders where
# jobs, tests and the sandbox keep files, so a path means the same inside and out; and the
# machine's trust store (pip inside reaches the package index through what this machine trusts).
BOUND_FOLDERS = ("/proc", "/sys", "/dev", "/tmp", "/var/tmp", "/home", "/etc/ssl/certs")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The host's accounts (uids of the job user, the munge user, test users made on the fly) and
# name resolution (pip reaches the package index from inside).
BOUND_FILES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/hosts",
    "/etc/resolv.conf",
)


NEWEST = "newest"


@dataclass(frozen=True)
class Release:
    """A Slurm release the sandbox can run from a Debian root.

    ``name`` is what ``--slurm`` names: a major release (``24.11``), whose root must hold it,
    or :data:`NEWEST`, a moving suite (Debian's testing) whose root holds whatever Slurm the
    suite shipped when it was built: ``expects`` is the major release it shipped when this row
    was written (``--slurm`` accepts that too), and what a root holds is read from its marker
    (:func:`held`), so a fresh machine still builds it once the suite moves on and the tests
    say which release ran.
    """

    name: str
    suite: str
    debian: str
    packages: tuple[str, ...]
    expects: str = ""
    # What `make test` does with it (tools/run-tests reads these): whether it runs
    # REAL_ON_ROOTS on it, and the job user of its sandbox there (one of its own, so that
    # tiers running side by side never share a home and its dispatch records).
    tested: bool = False
    job_user: str = ""
    # Packages a finished root gets when it lacks them (apt-get inside it, recorded in its
    # marker), never by building it again: a root is shared by every sandbox of its release on
    # the machine, some of them running.  A fresh root gets them with the rest.
    extras: tuple[str, ...] = ()

    @property
    def moving(self) -> bool:
        return self.name == NEWEST

    @property
    def expected(self) -> str:
        """The major release this row expects its root to hold."""
        return self.expects or self.name

    @property
    def folder(self) -> str:
        return f"debian-{self.suite}-slurm-{self.name}"


# What every root needs: the daemons, the clients, munge, and a Python with venv for the
# project's venv inside.
_SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "python3", "python3-venv")
# The release's own slurmdbd, for the sandbox's accounting (the database server is the host's).
_ACCOUNTING_PACKAGES = ("slurmdbd",)

# The real tier's files that run again on each tested release from a Debian root (the host's
# Slurm runs all of tests/real): the release itself, hooks, cease, the supervisor,
# dispatch-sbatch with the launcher (the demo's partition scenario among them), arrays,
# survivors, trust, watch, preemption, the doctor, the Slurm adapter's contract on both backends,
# a supervisor pass's RPCs by sdiag, and a job's own requeue (fenced by its SLUID on 26.05).
# On the host's only: test_sandbox, whose subject is the host-side verbs (`env`, the venv's
# own dispatch-sandbox; a sandbox in a root refuses `env` by design); test_frameworks,
# test_frameworks_ddp, test_dcp_watch and test_s3_jobs, which install torch's CPU build from
# this machine's local wheels into the sandbox's venv (a root's pip does not see them, and a
# bare torch there would pull a CUDA build of several GB); and test_gc, whose subject (the
# store's cleanup) does not depend on the Slurm release.  test_sbatch_grammar runs no cluster:
# it probes the root's sbatch for the options dispatch-sbatch reads; test_expedite runs where
# the release has expedited requeue (25.11), test_ids_restart where it gives SLUIDs (26.05);
# each skips, naming the release, where it has none.
REAL_ON_ROOTS = (
    "tests/real/test_release.py",
    "tests/real/test_hooks.py",
    "tests/real/test_cease.py",
    "tests/real/test_supervisor.py",
    "tests/real/test_dispatch_sbatch.py",
    "tests/real/test_arrays.py",
    "tests/real/test_survivors.py",
    "tests/real/test_trust.py",
    "tests/real/test_watch.py",
    "tests/real/test_adapter_contract.py",
    "tests/real/test_upgrade_in_place.py",
    "tests/real/test_controller_bill.py",
    "tests/real/test_preemption.py",
    "tests/real/test_doctor.py",
    "tests/real/test_sbatch_grammar.py",
    "tests/real/test_expedite.py",
    "tests/real/test_self_requeue.py",
    "tests/real/test_ids_restart.py",
    "tests/real/test_expedite_gate.py",
)

RELEASES = {
    # libslurm-dev (slurm.h; libslurmfull.so comes with slurmd's plugins), gcc, libc6-dev (a
    # recommendation of gcc that debootstrap does not follow) and libpython3-dev (Python.h,
    # without python3-dev's documentation): what building pyslurm 24.11 in the root needs
    # (tests/real/pyslurm_build.py), about 240 MB more.
    "24.11": Release(
        name="24.11",
        suite="trixie",
        debian="Debian 13",
        packages=(*_SLURM_PACKAGES, "libslurm-dev", "gcc", "libc6-dev", "libpython3-dev"),
        tested=True,
        job_user="dispatchuser2",
        extras=_ACCOUNTING_PACKAGES,
    ),
    # Debian's testing (and unstable) ship 26.05 today; no pyslurm supports it (the adapter's
    # SlurmBackend=auto falls back to Slurm's tools), so nothing to build pyslurm with.  Tested:
    # make test runs REAL_ON_ROOTS on it too, after 24.11, beside the host's real tier.
    NEWEST: Release(
        name=NEWEST,
        suite="testing",
        debian="Debian testing",
        packages=_SLURM_PACKAGES,
        expects="26.05",
        tested=True,
        job_user="dispatchuser3",
        extras=_ACCOUNTING_PACKAGES,
    ),
}


def tier_plan() -> str:
    """What tools/run-tests runs beside the fast tier and the host's real tier, one release
    after another in this order: a line per tested release, its name and its job user, then
    ``tests`` and REAL_ON_ROOTS (for a shell to read)."""
    lines = [f"{r.name} {r.job_user}" for r in RELEASES.values() if r.tested]
    return "\n".join([*lines, "tests " + " ".join(REAL_ON_ROOTS)])


def choices(host: bool = True) -> str:
    """The releases ``--slurm`` takes, in words (for help texts); ``host`` too unless not."""
    rows = [
        f"{r.name} (Debian {r.suite}'s, {r.expects} today)"
        if r.moving
        else f"{r.name} (from a {r.debian} root)"
        for r in RELEASES.values()
    ]
    return (f"{HOST} (this machine's), " if host else "") + ", ".join(rows)


def cache_folder() -> Path:
    """Where roots are kept: ``$DISPATCH_SANDBOX_ROOTFS``, else /var/cache/slurm-dispatch."""
    return Path(os.path.abspath(os.environ.get(CACHE_ENV) or DEFAULT_CACHE))


def host_release() -> str:
    """The host's Slurm major release (``22.05``), or '' when no slurmctld is installed."""
    for folder in ("/usr/sbin", "/usr/bin"):
        program = os.path.join(folder, "slurmctld")
        if os.access(program, os.X_OK):
            proc = subprocess.run([program, "-V"], capture_output=True, text=True, timeout=30)
            return _major(proc.stdout)
    return ""


def _major(version_line: str) -> str:
    """``slurm 24.11.5`` or ``slurm-wlm 22.05.8`` -> ``24.11`` / ``22.05``."""
    words = version_line.split()
    numbers = words[-1].split(".") if words else []
    return ".".join(numbers[:2]) if len(numbers) >= 2 else ""


def normalize(value: Optional[str]) -> str:
    """``host``, a key of :data:`RELEASES`, or the host's own release (meaning ``host``).

    The newest row is also named by the major release it expects and by the one its built
    root holds (``26.05`` means ``newest`` while testing ships 26.05).
    """
    if value is None or value.strip() in ("", HOST):
        return HOST
    value = value.strip()
    if value in RELEASES:
        return value
    if value == host_release():
        return HOST
    newest = RELEASES[NEWEST]
    if value == newest.expected or value == held(cache_folder() / newest.folder):
        return NEWEST
    choices = ", ".join([HOST, *RELEASES, newest.expected])
    raise SandboxError(
        f"unknown Slurm release {value!r} for the sandbox: choose one of "
        f"{choices} (host is this machine's own Slurm; {NEWEST} is "
        f"{newest.debian}'s, {newest.expected} when this was written)"
    )


def held(path: Path) -> str:
    """The major Slurm release the finished root in ``path`` holds (its marker), or ''."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return ""
    return _major(str(marker.get("slurm", ""))) if isinstance(marker, dict) else ""


def root_complete(path: Path, release: Release) -> bool:
    """Whether ``path`` holds a finished root for ``release`` (its marker names it)."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("release") == release.name
        and marker.get("packages") == list(release.packages)
    )


def ensure_root(
    release: Release,
    cache: Path,
    claim: Callable[[Path], object],
    install: Callable[[list[str]], object],
) -> tuple[Path, list[str]]:
    """The finished root of ``release`` under ``cache``, built now when missing.

    ``claim`` makes a folder root's and closed to others (the sandbox's rule), ``install``
    apt-installs host packages (debootstrap).  Concurrent callers for one release wait on its
    lock in ``cache`` (two releases build side by side); an interrupted build is thrown away
    and redone.  Returns the root and what was done.
    """
    claim(cache)
    target = cache / release.folder
    if root_complete(target, release) and not missing_extras(target, release):
        return target, []
    with state_folder.locked(cache / f".{release.folder}.lock"):
        actions = [] if root_complete(target, release) else _build(release, cache, target, install)
        missing = missing_extras(target, release)
        if missing:
            actions += _add_extras(release, cache, target, missing)
        return target, actions


def missing_extras(path: Path, release: Release) -> list[str]:
    """The extras of ``release`` that the root in ``path`` does not hold (by its marker)."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return list(release.extras)
    held = marker.get("extras", []) if isinstance(marker, dict) else []
    return [name for name in release.extras if name not in held]


def _add_extras(release: Release, cache: Path, target: Path, missing: list[str]) -> list[str]:
    """apt-get ``missing`` into the finished root ``target`` (no service started: a
    policy-rc.d that refuses them all), and name them in its marker.  A Slurm package is
    pinned to the version of the root's slurmctld: a suite that moved on since the root was
    built would otherwise bring a newer slurmdbd and, with it, newer plugins under the
    root's older daemons (apt-get then fails instead, naming the version it lacks)."""
    started = time.monotonic()
    policy = target / "usr" / "sbin" / "policy-rc.d"
    if not policy.exists():
        state_folder.write_text(
            policy, "#!/bin/sh\n# No service starts in a sandbox root.\nexit 101\n", 0o755
        )
    log = cache / f"{release.folder}.log"
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "DEBIAN_FRONTEND": "noninteractive",
        "LANG": "C.UTF-8",
    }
    version = subprocess.run(
        ["chroot", str(target), "dpkg-query", "-W", "-f", "${Version}", "slurmctld"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    ).stdout.strip()
    wanted = [
        f"{name}={version}" if version and name.startswith("slurm") else name for name in missing
    ]
    # A moving suite's Release file is valid for a week or so, and this machine's mirror (or
    # clock) may be past it: "Release file ... is expired" made apt-get update fail (its
    # signature is still checked).
    for argv in (
        ["apt-get", "-o", "Acquire::Check-Valid-Until=false", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", *wanted],
    ):
        full = ["chroot", str(target), *argv]
        with state_folder.append(log) as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(full)}\n".encode())
            out.flush()
            proc = subprocess.run(
                full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                umask=0o022,
            )
        if proc.returncode != 0:
            raise SandboxError(
                f"{shlex.join(full)} failed (exit {proc.returncode}); see {log}:\n" + _tail(log)
            )
    marker = json.loads((target / MARKER).read_text())
    marker["extras"] = sorted({*marker.get("extras", []), *missing})
    state_folder.write_text(target / MARKER, json.dumps(marker, indent=2) + "\n")
    return [
        f"installed {' '.join(missing)} into the {release.debian} root {target} "
        f"({time.monotonic() - started:.0f} s)"
    ]


def _build(
    release: Release, cache: Path, target: Path, install: Callable[[list[str]], object]
) -> list[str]:
    actions = []
    if shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        install(["debootstrap"])
        actions.append("installed debootstrap")
    started = time.monotonic()
    build = cache / f".{release.folder}.build"
    # Only ever a folder of ours: the cache is root's and closed (claimed above).
    shutil.rmtree(build, ignore_errors=True)
    log = cache / f"{release.folder}.log"
    included = [*release.packages, *release.extras]
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(included)}",
        release.suite,
        str(build),
    ]
    with state_folder.append(log) as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, umask=0o022
        )
    if proc.returncode != 0:
        raise SandboxError(
            f"{shlex.join(argv)} failed (exit {proc.returncode}); see {log}:\n" + _tail(log)
        )
    version = subprocess.run(
        ["chroot", str(build), "/usr/sbin/slurmctld", "-V"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    check_holds(release, version, build)
    seconds = round(time.monotonic() - started, 1)
    marker = {
        "release": release.name,
        "packages": list(release.packages),
        "extras": list(release.extras),
        "slurm": version,
        "suite": release.suite,
        "seconds": seconds,
    }
    (build / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    os.chmod(build, 0o755)
    if target.exists() or target.is_symlink():
        shutil.rmtree(target)  # an older or unfinished root: ours, like the cache
    os.rename(build, target)
    actions.append(f"built the {release.debian} root with {version} in {target} ({seconds:.0f} s)")
    return actions


def check_holds(release: Release, version: str, where: Path) -> None:
    """Refuse a root whose ``slurmctld -V`` said ``version`` when ``release`` cannot hold it:
    another major release for a fixed row; none at all for any row (the newest takes
    whatever its suite ships)."""
    major = _major(version)
    if not major or (not release.moving and major != release.name):
        raise SandboxError(
            f"the {release.debian} root built in {where} has {version!r}, not "
            f"Slurm {release.expected}"
        )


def mount_point(root: Path, state: Path) -> Optional[Path]:
    """Where ``state`` is bound inside ``root``, or None when a bound folder already shows it."""
    if any(state == Path(f) or Path(f) in state.parents for f in BOUND_FOLDERS):
        return None
    return root / state.relative_to("/")


def enter_argv(
    root: Path,
    state: Path,
    argv: Sequence[str],
    user: Optional[str] = None,
    cwd: Optional[str] = None,
) -> list[str]:
    """A command line that runs ``argv`` inside ``root`` (as ``user`` when given, in ``cwd``).

    Must itself run as root (it mounts); the environment passes through unchanged.  The mount
    point of ``state`` (:func:`mount_point`) must exist already: it is made once by ``up``
    through the state-folder checks, never here.
    """
    quoted = shlex.quote(str(root))
    lines = ["set -e"]
    for folder in BOUND_FOLDERS:
        lines.append(
            f"if [ -d {folder} ]; then mkdir -p {quoted}{folder}; "
            f"mount --rbind {folder} {quoted}{folder}; fi"
        )
    for name in BOUND_FILES:
        lines.append(
            f"if [ -f {name} ] && [ -f {quoted}{name} ]; then "
            f"mount --bind {name} {quoted}{name}; fi"
        )
    point = mount_point(root, state)
    if point is not None:
        lines.append(f"mount --bind {shlex.quote(str(state))} {shlex.quote(str(point))}")
    inner: list[str] = []
    if user is not None:
        inner += ["runuser", "-u", user, "--"]
    if cwd is not None:
        inner += ["env", "-C", cwd]
    lines.append(
        f'exec chroot {quoted} {shlex.join(inner)} "$@"' if inner else f'exec chroot {quoted} "$@"'
    )
    return [
        _host_program("unshare"),
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        "\n".join(lines),
        "in-root",
        *argv,
    ]


def _host_program(name: str) -> str:
    found = shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise SandboxError(
            f"{name} is not installed on this machine (util-linux): the "
            "sandbox's Debian root is entered with it"
        )
    return found


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
    except OSError:
        return ""
