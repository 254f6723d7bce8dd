"""Shared test set-up: every test starts with no SLURM_* or DISPATCH_* in its environment
(but ``DISPATCH_LISTING_LAG=0``: its roots are on one local disk; below the real tier,
``SLURM_CLUSTER_NAME=fake``, the fakes' cluster).

Tests below the real tier talk to fakes (a fake controller, fake Slurm commands on PATH): they
use the command-line backend, whatever pyslurm the machine may have, so a fake is never passed
by for a real controller that `SLURM_CONF` happens to name.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

_KEEP = {"SLURM_CONF", "DISPATCH_SANDBOX_DIR", "DISPATCH_SANDBOX_USER"}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    for name in list(os.environ):
        if (name.startswith("SLURM_") or name.startswith("DISPATCH_")) and name not in _KEEP:
            monkeypatch.delenv(name)
    if request.node.get_closest_marker("real") is None:
        monkeypatch.setenv("DISPATCH_SLURM_BACKEND", "cli")
        # The fakes' cluster, as a job's environment names it: no test asks a fake
        # controller for its ClusterName unless it means to.
        monkeypatch.setenv("SLURM_CLUSTER_NAME", "fake")
    # Every root of these tests is on this machine's own disk, seen by all at once: no listing
    # lag to wait for (tests/store/test_gc_lag.py models the lag itself, and the default).
    monkeypatch.setenv("DISPATCH_LISTING_LAG", "0")


# Signals whose disposition a test process hands on to every command a later test starts:
# SIGINT (a Ctrl-C test then hangs) and SIGTERM (a command meant to end at a TERM, the launcher's
# script at its stall watcher's, a supervisor's loop, is then killed 10 s later or never ends).
_GUARDED: dict[int, Any] = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
}


def _signal_state(signum: int) -> str:
    """'' when ``signum`` would reach this process as usual; else what keeps it from doing so."""
    said = []
    if signal.getsignal(signum) is signal.SIG_IGN:
        said.append("ignored")
    if signum in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        said.append("blocked")
    return " and ".join(said)


@pytest.fixture(autouse=True)
def signals_left_as_found(request: pytest.FixtureRequest) -> object:
    """A test that leaves SIGINT or SIGTERM ignored or blocked in the test process passes that
    on to every command a later test starts: it fails here, naming itself, and the signal is
    put back so the tests after it run as they would alone."""
    before = {signum: _signal_state(signum) for signum in _GUARDED}
    yield
    for signum, handler in _GUARDED.items():
        after = _signal_state(signum)
        if after and after != before[signum]:
            signal.signal(signum, handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
            name = signal.Signals(signum).name
            pytest.fail(f"{request.node.nodeid} left {name} {after} in the test process")
