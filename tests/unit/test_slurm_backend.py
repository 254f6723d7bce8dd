"""Choosing the Slurm backend: the setting, release matching, array task strings, and a
``pyslurm`` that cannot be used named as such (the probe's child dying in libslurm's fatal(),
a mismatched release and the backend itself: tests/real/test_adapter_contract.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from slurm_dispatch import config
from slurm_dispatch.errors import ConfigError
from slurm_dispatch.slurm import select as slurm_backend
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.release import major_release


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("22.05.8", (22, 5)),
        ("22.5.3", (22, 5)),
        ("24.11.0", (24, 11)),
        ("24.11.5-1", (24, 11)),
        ("25.11", (25, 11)),
        ("slurm", None),
        ("22", None),
        ("", None),
    ],
)
def test_major_release(version: str, release: tuple[int, int] | None) -> None:
    assert major_release(version) == release


def test_setting_from_the_environment_then_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "dispatch.conf"
    conf.write_text("SlurmBackend=CLI\n")
    env = {"SLURM_DISPATCH_CONF": str(conf)}
    assert slurm_backend.setting(env) == ("cli", f"SlurmBackend in {conf}")
    assert slurm_backend.setting({**env, "DISPATCH_SLURM_BACKEND": "pyslurm"}) == (
        "pyslurm",
        "$DISPATCH_SLURM_BACKEND",
    )
    with pytest.raises(ConfigError, match=r"DISPATCH_SLURM_BACKEND: 'fast' is not one of auto"):
        slurm_backend.setting({**env, "DISPATCH_SLURM_BACKEND": "fast"})
    conf.write_text("SlurmBackend=fast\n")
    loaded = config.load(str(conf))
    assert loaded.slurm_backend == "auto" and "'fast' is not one of" in loaded.problems[0]
    assert slurm_backend.setting({"SLURM_DISPATCH_CONF": str(tmp_path / "none")})[0] == "auto"


def test_pyslurm_missing_is_seen_without_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("pyslurm") is not None:
        pytest.skip("pyslurm is installed for this interpreter")  # the real tier covers it
    monkeypatch.setattr(slurm_backend, "_probes", {})
    found = slurm_backend.probe()
    assert not found.usable and "pyslurm is not installed" in found.why
    monkeypatch.setenv("DISPATCH_SLURM_BACKEND", "pyslurm")
    with pytest.raises(
        ConfigError,
        match=r"SlurmBackend=pyslurm \(from \$DISPATCH_SLURM_"
        r"BACKEND\) cannot be used: pyslurm is not installed",
    ):
        Slurm().own_jobs()
    monkeypatch.setenv("DISPATCH_SLURM_BACKEND", "auto")
    assert Slurm().backend == "cli"


# A stand-in pyslurm for the probe's child, shaped as 22.5.3 and 24.11.0 are: ``config()``
# loads the controller's configuration (one REQUEST_BUILD_INFO) in its constructor, ``get()``
# loads it again, ``key_pairs()`` reads what was loaded (bytes keys in 22.5).  Each load is a
# line in LOADS, so the test counts what the probe costs the controller.
FAKE_PYSLURM = """\
import os
__version__ = "22.5.3"
def _load():
    with open(os.environ["LOADS"], "a") as f:
        f.write("BUILD_INFO\\n")
class config:
    def __init__(self):
        _load()
    def key_pairs(self):
        return {b"SLURM_VERSION": b"22.05.8", b"ClusterName": b"c"}
    def get(self):
        _load()
        return {"version": "22.05.8"}
"""


def test_the_probe_asks_the_controller_once(tmp_path: Path) -> None:
    """The controller's bill (bench/README.md): pyslurm.config().get() read the configuration twice
    (constructor and get), so every process of the pyslurm backend cost slurmctld two
    REQUEST_BUILD_INFO before its first question (sdiag: a pass 4 RPCs, squeue --me 3)."""
    (tmp_path / "pyslurm.py").write_text(FAKE_PYSLURM)
    loads = tmp_path / "loads"
    import sys

    found = slurm_backend._probe(
        {"PYTHONPATH": str(tmp_path), "LOADS": str(loads)}, 30, sys.executable
    )
    assert found.usable, found
    assert (found.pyslurm_version, found.slurm_version) == ("22.5.3", "22.05.8")
    assert loads.read_text().split() == ["BUILD_INFO"]
