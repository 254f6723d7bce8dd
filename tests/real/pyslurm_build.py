"""pyslurm for the sandbox's Slurm: a wheel built once from the vendored source release.

PyPI has pyslurm only for Slurm 25.11 (and very old releases); the source releases matching the
sandbox's two Slurm releases are in ``../shared/vendor/`` (``$DISPATCH_VENDOR_DIR``).  A wheel
is built once per release and Python (``pip wheel`` against Debian's ``libslurm-dev``, about 3
to 5 minutes on 2 cores) into ``$DISPATCH_WHEEL_CACHE`` (default
``/var/cache/slurm-dispatch/wheels``), then installed where a test wants it.  ``.ci/run``
builds both up front so the real tier finds them: ``python3 -m tests.real.pyslurm_build`` for
the host's Slurm (22.5.3 on its Python 3.11), ``... --slurm 24.11`` for the sandbox's Debian 13
root (24.11.0 on that root's Python 3.13, built inside the root, whose package list holds what
the build needs: sandbox_root.RELEASES).  The cache is the same for both (the wheels' names
differ by release and Python); a root does not see it, so a build or install there goes
through a staging folder the root does see, and the wheel is moved into the cache from here.

Invariant: the wheel built is the release matching the Slurm that will run it (picked by
that Slurm's major release, never a bare ``pyslurm`` from PyPI).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = {(22, 5): "pyslurm-22.5.3.tar.gz", (24, 11): "pyslurm-24.11.0.tar.gz"}
# Debian's libslurm-dev puts the library under the multiarch folder, not /usr/lib64 (where
# pyslurm's setup.py looks by default: "Cannot locate Slurm shared library").  22.5.3 links
# libslurm.so there; 24.11.0 links libslurmfull.so, which its setup.py also looks for in the
# slurm-wlm folder below (Debian 13: slurm-wlm-basic-plugins ships it there, and the build's
# rpath points there).
BUILD_ENV = {"SLURM_LIB_DIR": "/usr/lib/x86_64-linux-gnu", "SLURM_INCLUDE_DIR": "/usr/include"}
# Bounds on the build's own requirements where a release's pyproject admits a version that
# cannot build it (pip's isolated build environment honours $PIP_CONSTRAINT).  24.11.0's
# core/job/submission.pyx has f"PYSLURM_JOBDESC_{spec)}", which Cython 3.1 and later reject
# ("Unmatched ')'"); its pyproject asks only Cython>=0.29.37.  (22.5.3 pins Cython<3 itself.)
BUILD_CONSTRAINTS = {(24, 11): ("Cython<3.1",)}

Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def vendor_dir() -> Path:
    """$DISPATCH_VENDOR_DIR, else ``shared/vendor`` beside the checkout, else the workplace's
    (a clean clone made elsewhere, as CI's may be, still finds it)."""
    if os.environ.get("DISPATCH_VENDOR_DIR"):
        return Path(os.environ["DISPATCH_VENDOR_DIR"])
    for candidate in (REPO_ROOT.parent / "shared" / "vendor", Path("/work/shared/vendor")):
        if candidate.is_dir():
            return candidate
    return REPO_ROOT.parent / "shared" / "vendor"


def cache_dir() -> Path:
    return Path(os.environ.get("DISPATCH_WHEEL_CACHE") or "/var/cache/slurm-dispatch/wheels")


def source_for(release: tuple[int, int]) -> Path:
    """The vendored source release for Slurm ``release`` (22, 5); an error naming both."""
    name = SOURCES.get(release)
    if name is None:
        raise RuntimeError(
            f"no vendored pyslurm for Slurm {release[0]}.{release[1]:02d} (have {sorted(SOURCES)})"
        )
    path = vendor_dir() / name
    if not path.is_file():
        raise RuntimeError(
            f"{path} is missing: the pyslurm source releases are expected in "
            f"{vendor_dir()} ($DISPATCH_VENDOR_DIR)"
        )
    return path


def _local(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=1800)


def tag_of(python: str, run: Run = _local) -> str:
    """``python``'s wheel tag (``cp313``), asked where ``run`` runs."""
    return _checked(
        run([python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"]),
        f"asking {python} its tag",
    ).stdout.strip()


def cached_wheel(
    release: tuple[int, int], tag: str, cache: Optional[Path] = None
) -> Optional[Path]:
    """The cached wheel of the pyslurm matching Slurm ``release`` for ``tag``, if built."""
    version = source_for(release).name[len("pyslurm-") : -len(".tar.gz")]
    found = sorted((cache or cache_dir()).glob(f"pyslurm-{version}-{tag}-{tag}-*.whl"))
    return found[-1] if found else None


def wheel_for(
    release: tuple[int, int],
    python: str = sys.executable,
    run: Run = _local,
    cache: Optional[Path] = None,
    staging: Optional[Path] = None,
) -> Path:
    """The wheel of the pyslurm matching Slurm ``release`` for ``python`` (its cpXY tag),
    built into ``cache`` unless there already.  ``run`` runs a command where ``python`` and
    libslurm live: this machine, or a sandbox's Debian root, which does not see ``cache``;
    then ``staging`` is a folder it does see (the build's source and output pass through it,
    and the wheel is moved into ``cache`` from here)."""
    cache = cache or cache_dir()
    source = source_for(release)
    tag = tag_of(python, run)
    found = cached_wheel(release, tag, cache)
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    if run(["test", "-f", "/usr/include/slurm/slurm.h"]).returncode != 0:
        _checked(
            run(["apt-get", "install", "-y", "-qq", "libslurm-dev"]), "installing libslurm-dev"
        )
    where = staging or cache
    where.mkdir(parents=True, exist_ok=True)
    local_source = where / source.name  # visible where `run` runs
    if not local_source.exists():
        shutil.copyfile(source, local_source)
    env = [f"{k}={v}" for k, v in BUILD_ENV.items()]
    # Both cores: 24.11.0's setup.py cythonizes $PYSLURM_BUILD_JOBS files at once, and
    # setuptools compiles in parallel as $DIST_EXTRA_CONFIG says (178 s -> 108 s on 2 cores).
    # 22.5.3 reads neither (its build pins setuptools 59, older than that setting): serial.
    jobs = len(os.sched_getaffinity(0))
    parallel = where / "build-parallel.cfg"
    parallel.write_text(f"[build_ext]\nparallel = {jobs}\n")
    env += [f"PYSLURM_BUILD_JOBS={jobs}", f"DIST_EXTRA_CONFIG={parallel}"]
    if release in BUILD_CONSTRAINTS:
        constraints = where / f"constraints-{release[0]}.{release[1]}.txt"
        constraints.write_text("".join(f"{line}\n" for line in BUILD_CONSTRAINTS[release]))
        env.append(f"PIP_CONSTRAINT={constraints}")
    out = where / f"built-{os.getpid()}"
    _checked(
        run(
            [
                "env",
                *env,
                python,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "-w",
                str(out),
                str(local_source),
            ]
        ),
        f"building {source.name}",
    )
    built = sorted(out.glob("pyslurm-*.whl"))
    if not built:
        raise RuntimeError(
            f"pip built no {source.name[: -len('.tar.gz')]} wheel for {tag} in {out}"
        )
    # Into the cache under its own name in one rename: a concurrent reader never sees half.
    part = cache / f".{built[-1].name}.{os.getpid()}"
    shutil.copyfile(built[-1], part)
    os.replace(part, cache / built[-1].name)
    shutil.rmtree(out)
    found = cached_wheel(release, tag, cache)
    if not found:
        raise RuntimeError(f"pip built {built[-1].name}, not a pyslurm wheel for {tag}")
    return found


def install_into(
    target: Path, wheel: Path, python: str, run: Run = _local, staging: Optional[Path] = None
) -> Path:
    """Install ``wheel`` into the folder ``target`` (``pip --target``), readable by everyone:
    put it on ``PYTHONPATH`` to use it.  Kept when already there.  ``staging``: a folder
    where ``run`` sees files, when it does not see the wheel's own (a Debian root)."""
    marker = target / f".{wheel.name}"
    if marker.exists():
        return target
    if staging is not None:
        staging.mkdir(parents=True, exist_ok=True)
        wheel = Path(shutil.copy(wheel, staging / wheel.name))
    _checked(
        run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                "--upgrade",
                "--target",
                str(target),
                str(wheel),
            ]
        ),
        f"installing {wheel.name} into {target}",
    )
    marker.touch()
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644 if not name.endswith(".so") else 0o755)
    return target


def _checked(proc: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
        )
    return proc


def in_root(release: str) -> Path:
    """Build (or find) the wheel for the sandbox's Debian root of Slurm ``release`` (24.11):
    inside that root (built first when missing, as ``dispatch-sandbox build-root`` does), on
    its Python, from a venv made there in a scratch folder the root sees (/var/tmp is bound)."""
    from slurm_dispatch.sandbox import cluster as sandbox
    from slurm_dispatch.sandbox import root as sandbox_root

    root, _done = sandbox.build_root(release)
    staging = Path(tempfile.mkdtemp(prefix="pyslurm-build-", dir="/var/tmp"))

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return _local(sandbox_root.enter_argv(root, staging, argv))

    try:
        major, minor = (int(n) for n in release.split("."))
        found = cached_wheel((major, minor), tag_of("python3", run))
        if found:
            return found
        venv = staging / "venv"
        _checked(run(["python3", "-m", "venv", str(venv)]), f"making a venv in {root}")
        return wheel_for((major, minor), str(venv / "bin" / "python"), run, staging=staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Build (or find) the wheel for this machine's Slurm and Python, or with ``--slurm
    RELEASE`` for the sandbox's Debian root of that release; print its path and the time."""
    parser = argparse.ArgumentParser(prog="python3 -m tests.real.pyslurm_build")
    parser.add_argument(
        "--slurm",
        default="host",
        help="host (this machine's Slurm, default) or a release the sandbox "
        "runs from a Debian root (24.11)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.slurm in ("", "host"):
        said = _checked(_local(["slurmctld", "-V"]), "slurmctld -V").stdout.split()
        major, minor = said[-1].split(".")[:2]
        wheel = wheel_for((int(major), int(minor)))
    else:
        wheel = in_root(args.slurm)
    print(f"{wheel} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
