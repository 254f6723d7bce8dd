"""pyslurm for the sandbox's Slurm: a wheel built once from the vendored source release.

PyPI has pyslurm only for Slurm 25.11 (and very old releases); the source releases matching the
sandbox's two Slurm releases are in ``../shared/vendor/`` (``$DISPATCH_VENDOR_DIR``).  A wheel
is built once per release and Python (``pip wheel`` against Debian's ``libslurm-dev``, about 3
to 5 minutes on 2 cores) into ``$DISPATCH_WHEEL_CACHE`` (default
``/var/cache/slurm-dispatch/wheels``), then installed where a test wants it.  ``.ci/run``
builds it up front (``python3 -m tests.real.pyslurm_build``) so the real tier finds it.

Invariant: the wheel built is the release matching the Slurm that will run it (picked by
that Slurm's major release, never a bare ``pyslurm`` from PyPI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = {(22, 5): "pyslurm-22.5.3.tar.gz", (24, 11): "pyslurm-24.11.0.tar.gz"}
# Debian's libslurm-dev puts the library under the multiarch folder, not /usr/lib64 (where
# pyslurm's setup.py looks by default: "Cannot locate Slurm shared library").
BUILD_ENV = {"SLURM_LIB_DIR": "/usr/lib/x86_64-linux-gnu", "SLURM_INCLUDE_DIR": "/usr/include"}

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
        raise RuntimeError(f"no vendored pyslurm for Slurm {release[0]}.{release[1]:02d} "
                           f"(have {sorted(SOURCES)})")
    path = vendor_dir() / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: the pyslurm source releases are expected in "
                           f"{vendor_dir()} ($DISPATCH_VENDOR_DIR)")
    return path


def _local(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=1800)


def wheel_for(release: tuple[int, int], python: str = sys.executable, run: Run = _local,
              cache: Optional[Path] = None) -> Path:
    """The wheel of the pyslurm matching Slurm ``release`` for ``python`` (its cpXY tag),
    built into ``cache`` unless there already.  ``run`` runs a command where ``python`` and
    libslurm live (this machine, or a sandbox's Debian root whose state folder holds
    ``cache``)."""
    cache = cache or cache_dir()
    source = source_for(release)
    version = source.name[len("pyslurm-"):-len(".tar.gz")]
    tag = _checked(run([python, "-c", "import sys; print('cp%d%d' % sys.version_info[:2])"]),
                   "asking the interpreter its tag").stdout.strip()
    found = sorted(cache.glob(f"pyslurm-{version}-{tag}-{tag}-*.whl"))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    if run(["test", "-f", "/usr/include/slurm/slurm.h"]).returncode != 0:
        _checked(run(["apt-get", "install", "-y", "-qq", "libslurm-dev"]),
                 "installing libslurm-dev")
    local_source = cache / source.name  # visible where `run` runs (a root binds the cache)
    if not local_source.exists():
        shutil.copyfile(source, local_source)
    _checked(run(["env", *(f"{k}={v}" for k, v in BUILD_ENV.items()), python, "-m", "pip",
                  "wheel", "-q", "--no-deps", "-w", str(cache), str(local_source)]),
             f"building {source.name}")
    found = sorted(cache.glob(f"pyslurm-{version}-{tag}-{tag}-*.whl"))
    if not found:
        raise RuntimeError(f"pip built no pyslurm-{version} wheel for {tag} in {cache}")
    return found[-1]


def install_into(target: Path, wheel: Path, python: str, run: Run = _local) -> Path:
    """Install ``wheel`` into the folder ``target`` (``pip --target``), readable by everyone:
    put it on ``PYTHONPATH`` to use it.  Kept when already there."""
    marker = target / f".{wheel.name}"
    if marker.exists():
        return target
    _checked(run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                  "--upgrade", "--target", str(target), str(wheel)]),
             f"installing {wheel.name} into {target}")
    marker.touch()
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644 if not name.endswith(".so") else 0o755)
    return target


def _checked(proc: subprocess.CompletedProcess[str], what: str
             ) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    return proc


def main() -> None:
    """Build (or find) the wheel for this machine's Slurm and Python; print its path."""
    started = time.monotonic()
    said = _checked(_local(["slurmctld", "-V"]), "slurmctld -V").stdout.split()
    major, minor = said[-1].split(".")[:2]
    wheel = wheel_for((int(major), int(minor)))
    print(f"{wheel} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
