"""What a hook run costs beyond the interpreter's own start (the hooks' target: every hook <= 1.5x
a bare interpreter, bench/bench_hooks.py): what the child loads, the threads it starts, the
wake-ups of the waiting parent, and the reads it makes, checked by property, not by the clock.

Hooks run as Slurm runs them (a fresh ``-I`` interpreter, only Slurm's variables); the probe
replaces ``hooks._exit`` to say what the process holds at its end, as test_metrics does.
Needs root (root-owned StateDir; the facts are given the job's group).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UID, GID = 4321, 4322
CONTEXT = {
    "prolog": "prolog_slurmd",
    "epilog": "epilog_slurmd",
    "prolog-slurmctld": "prolog_slurmctld",
    "epilog-slurmctld": "epilog_slurmctld",
}

# At its end, each process prints: child or parent, whether the survivor scan is loaded, the
# threads it started that still run, and every os.write of a HookTimeout line it made.
PROBE = """
import os, sys, _thread
sys.path.insert(0, {repo!r})
import slurm_dispatch.hooks as h
PARENT = os.getpid()
WRITES = []
real_write = os.write
def write(fd, data):
    WRITES.append(bytes(data))
    return real_write(fd, data)
os.write = write
end = h._exit
def told():
    told_timeout = [w.decode() for w in WRITES if w.endswith(b"\\n") and w[:1].isdigit()]
    print("child" if os.getpid() != PARENT else "parent",
          "slurm_dispatch.node.procscan" in sys.modules, _thread._count(),
          repr(told_timeout), flush=True)
    end()
h._exit = told
h.run({hint!r})
"""


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the hook cost tests need root (a root-owned StateDir)")


def conf_file(tmp_path: Path, extra: str = "") -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o755, exist_ok=True)
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"StateDir={state}\n{extra}")
    return conf


def probe(conf: Path, hook: str) -> dict[str, list[str]]:
    env = {"SLURM_DISPATCH_CONF": str(conf)}
    if hook in CONTEXT:
        env.update(
            {
                "SLURM_JOB_ID": "500",
                "SLURM_JOB_UID": str(UID),
                "SLURM_JOB_GID": str(GID),
                "SLURM_JOB_RESTART_COUNT": "0",
                "SLURM_SCRIPT_CONTEXT": CONTEXT[hook],
                "SLURM_JOB_NODELIST": "n1",
            }
        )
        if not hook.endswith("slurmctld"):
            env["SLURMD_NODENAME"] = "n1"
    code = PROBE.format(repo=str(REPO), hint=hook.split("-")[0])
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done
    said = {line.split()[0]: line.split(maxsplit=3)[1:] for line in done.stdout.splitlines()}
    assert set(said) == {"child", "parent"}, done
    return said


@pytest.mark.parametrize("hook", ["prolog", "prolog-slurmctld", "epilog-slurmctld", "recheck"])
def test_a_hook_that_does_not_scan_loads_no_scan_and_starts_no_thread(
    tmp_path: Path, hook: str
) -> None:
    # The survivor scan is the Epilog's (and a re-check's with survivors to watch): the other
    # hooks paid its import (about 1 M instructions) and a watchdog thread (its start and a
    # handover of the interpreter's lock) on every run.
    said = probe(conf_file(tmp_path), hook)
    assert said["child"][:2] == ["False", "0"], said
    assert said["parent"][:2] == ["False", "0"], said


def test_the_epilog_loads_the_scan_and_records(tmp_path: Path) -> None:
    conf = conf_file(tmp_path)
    said = probe(conf, "epilog")
    assert said["child"][0] == "True", said
    assert [p.name.split(".")[0] for p in (tmp_path / "state/facts/4321/500").iterdir()] == ["end"]


def test_the_default_hook_timeout_wakes_no_parent(tmp_path: Path) -> None:
    # The parent waits HookTimeout's default until the child tells it the site's: with the
    # default there is nothing to tell, and a word would wake the parent mid-run for nothing.
    said = probe(conf_file(tmp_path), "prolog")
    assert said["child"][2] == "[]", said
    # A site's own HookTimeout still reaches the parent.
    other = tmp_path / "other"
    other.mkdir()
    said = probe(conf_file(other, "HookTimeout=20\n"), "prolog")
    assert said["child"][2] == repr(["20.0\n"]), said


@pytest.mark.parametrize(
    "blocked", ["time.sleep(30)", "l = _thread.allocate_lock(); l.acquire(); l.acquire(timeout=30)"]
)
def test_the_childs_watchdog_logs_and_ends_it_at_its_deadline(blocked: str) -> None:
    # In Python code or waiting on a lock (as the Epilog waits on its scan), the child's own
    # timer ends it at HookTimeout with its words; where no signal reaches it (uninterruptible
    # sleep), the parent's kill does (test_hook_faults.test_hung_file_system).
    code = (
        f"import sys, time, _thread; sys.path.insert(0, {str(REPO)!r}); "
        "import slurm_dispatch.hooks as h; "
        "h._start_child_watchdog(time.monotonic() + 0.3, 'prolog', '77'); " + blocked
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done
    assert "prolog job 77: still running at HookTimeout; stopped" in done.stderr, done
    assert took < 10, took


def test_the_epilog_reads_the_boot_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc/stat (the boot time) is long on a node of many CPUs; the Epilog read it, and the
    # boot id, twice: for its end and again to settle watched survivors, with none watched.
    from slurm_dispatch import config
    from slurm_dispatch.hooks import evidence
    from slurm_dispatch.node import factstore

    reads: list[str] = []

    def counted(name: str, real: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            reads.append(name)
            return real()

        return call

    for name in ("boot_id", "boot_time"):
        monkeypatch.setattr(factstore, name, counted(name, getattr(factstore, name)))
    for key, value in {
        "SLURM_JOB_ID": "500",
        "SLURM_JOB_UID": str(UID),
        "SLURM_JOB_GID": str(GID),
        "SLURM_JOB_RESTART_COUNT": "0",
        "SLURMD_NODENAME": "n1",
    }.items():
        monkeypatch.setenv(key, value)
    cfg = config.load(str(conf_file(tmp_path)))
    evidence.epilog(cfg)
    assert sorted(reads) == ["boot_id", "boot_time"]
    end = next((tmp_path / "state/facts/4321/500").iterdir())
    assert end.name.startswith("end.n1.0.")
    assert f'"boot_id":"{factstore.boot_id()}"' in end.read_text()


def test_the_epilog_parses_only_its_own_nodes_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job's folder holds every node's facts: the Epilog parsed all of them to find its own
    # node's open start (2,000 parses for a 1,000-node job), where a prefix tells.
    from slurm_dispatch import config
    from slurm_dispatch.hooks import evidence
    from slurm_dispatch.node import factstore

    cfg = config.load(str(conf_file(tmp_path)))
    for node in ["n1", "n1.x"] + [f"n{i}" for i in range(2, 200)]:
        factstore.write_fact(cfg.state_dir, UID, GID, "500", "start", node, {"restart": 0})
    parsed: list[str] = []
    real = factstore.parse_name

    def counted(name: str) -> tuple[str, str, str, str] | None:
        parsed.append(name)
        return real(name)

    monkeypatch.setattr(factstore, "parse_name", counted)
    start = evidence._unended_start(cfg, UID, "500", "n1", 0)
    # n1's own and n1.x's (which the prefix of n1 lets through and the parse tells apart)
    assert start is not None and sorted(n.split(".")[1] for n in parsed) == ["n1", "n1"], parsed
    assert len(parsed) == 2, parsed
    assert evidence._unended_start(cfg, UID, "500", "n1.x", 0) is not None
