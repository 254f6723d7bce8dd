"""Which way the Slurm adapter reaches Slurm: pyslurm where it matches, else the tools.

The setting is ``SlurmBackend=auto|cli|pyslurm`` in dispatch.conf, overridden by
``$DISPATCH_SLURM_BACKEND``.  ``auto`` takes pyslurm when it is installed, its release matches
the running controller's major release (pyslurm ``22.5.x`` for Slurm ``22.05``, ``24.11.x`` for
``24.11``) and it can load the configuration; otherwise the command-line tools.  ``pyslurm``
that cannot be used is a :class:`ConfigError` that says why.

Invariants:

* **Probed in a child first.**  ``import pyslurm`` initialises libslurm, and libslurm without a
  configuration source (no ``SLURM_CONF``, no DNS SRV record: configless sites) ends the process
  with ``fatal()``, no exception.  So a child interpreter imports it, with this process's
  environment, and asks the controller for its version; only when that child answered is pyslurm
  imported here.  A missing pyslurm is seen without a child (``find_spec`` runs no code).
* One probe per process and environment (the answer is cached by what the import depends on:
  ``SLURM_CONF`` and the import path).
* The node hooks never import this module (they use the standard library only).
"""

from __future__ import annotations

import os
import sys

from .. import config as config_module
from ..errors import ConfigError
from .release import Probe, major_release

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional

ENV_VAR = "DISPATCH_SLURM_BACKEND"

# Run in a child interpreter: import pyslurm, load the controller's configuration, print both
# versions as one JSON line.  A fatal exit inside libslurm ends only this child.  config()
# loads the configuration (one RPC, REQUEST_BUILD_INFO) and key_pairs() reads what it loaded;
# get() would load it a second time (pyslurm 22.5.3 and 24.11.0 alike), so it is only the
# fallback for a pyslurm whose key pairs lack the version.
PROBE = """\
import json, sys
import pyslurm
loaded = pyslurm.config()
pairs = loaded.key_pairs()
version = pairs.get(b"SLURM_VERSION") or pairs.get("SLURM_VERSION") or ""
if isinstance(version, bytes):
    version = version.decode()
version = version or loaded.get().get("version") or ""
sys.stdout.write(json.dumps({"pyslurm": pyslurm.__version__, "slurm": version}) + "\\n")
"""


def setting(environ: Optional[Mapping[str, str]] = None) -> tuple[str, str]:
    """(backend, where it was set): ``$DISPATCH_SLURM_BACKEND`` if set, else dispatch.conf's
    ``SlurmBackend`` (its default ``auto``).  A bad value in the environment is an error
    naming it; one in dispatch.conf is among that file's problems and leaves ``auto``."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR, "")
    if raw:
        try:
            return config_module.slurm_backend(raw), f"${ENV_VAR}"
        except ValueError as exc:
            raise ConfigError(f"${ENV_VAR}: {exc}") from None
    loaded = config_module.load(environ=dict(env))
    return loaded.slurm_backend, (
        f"SlurmBackend in {loaded.path}" if loaded.path else "the default"
    )


_probes: dict[tuple[str, str, str], Probe] = {}


def probe(
    environ: Optional[Mapping[str, str]] = None, timeout: float = 30.0, python: Optional[str] = None
) -> Probe:
    """Can pyslurm be used here, against the running controller?  Never risks this process:
    the import runs in a child interpreter (``python``, default this one).  Cached."""
    env = dict(os.environ if environ is None else environ)
    key = (python or sys.executable, env.get("SLURM_CONF", ""), env.get("PYTHONPATH", ""))
    found = _probes.get(key)
    if found is None:
        found = _probes[key] = _probe(env, timeout, python)
    return found


def _probe(env: dict[str, str], timeout: float, python: Optional[str]) -> Probe:
    if python is None:
        import importlib.util

        if importlib.util.find_spec("pyslurm") is None:
            return Probe(False, f"pyslurm is not installed for {sys.executable}")
    import json
    import subprocess

    argv = [python or sys.executable, "-c", PROBE]
    try:
        proc = subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Probe(False, f"importing pyslurm did not finish within {timeout:g} s")
    except OSError as exc:
        return Probe(False, f"cannot start {argv[0]}: {exc.strerror}")
    if proc.returncode != 0:
        said = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        last = said[-1] if said else "no message"
        if "No module named 'pyslurm'" in proc.stderr:
            return Probe(False, f"pyslurm is not installed for {argv[0]}")
        return Probe(
            False,
            f"importing pyslurm and loading Slurm's configuration failed "
            f"(exit {proc.returncode}): {last}",
        )
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        ours, theirs = str(answer["pyslurm"]), str(answer["slurm"])
    except (ValueError, KeyError, IndexError, TypeError):
        return Probe(False, f"the pyslurm probe printed {proc.stdout[-200:]!r}")
    if major_release(ours) is None or major_release(ours) != major_release(theirs):
        return Probe(
            False,
            f"pyslurm {ours} does not match the running Slurm {theirs} "
            "(pyslurm's release must be Slurm's major release)",
            ours,
            theirs,
        )
    return Probe(True, "", ours, theirs)


def select(name: Optional[str] = None, timeout: float = 30.0) -> Any:
    """The pyslurm backend (a :class:`slurm_pyslurm.PyslurmBackend`) when the setting (``name``,
    else :func:`setting`) and the probe allow it, else None (the command-line tools).  Raises
    ConfigError when the setting is ``pyslurm`` and it cannot be used.  The probe runs with
    this process's environment: the one pyslurm will be imported with."""
    source = "the caller"
    if name is None:
        name, source = setting()
    else:
        try:
            name = config_module.slurm_backend(name)
        except ValueError as exc:
            raise ConfigError(f"Slurm backend: {exc}") from None
    if name == "cli":
        return None
    found = probe(None, timeout)
    if not found.usable:
        if name == "pyslurm":
            raise ConfigError(f"SlurmBackend=pyslurm (from {source}) cannot be used: {found.why}")
        return None
    from .pyslurm_backend import PyslurmBackend  # imports pyslurm: the child survived it

    return PyslurmBackend(found)
