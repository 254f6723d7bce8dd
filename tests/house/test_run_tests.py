"""tools/run-tests takes the releases `make test` runs, their job users and their real tests
from the sandbox's release table (slurm_dispatch/sandbox/root.py), not from the Makefile: adding
a release is a row there.

A fake Python stands at the process boundary: it answers ``-c`` with the real interpreter (the
table as the script reads it) and records each pytest session it is asked for, with the
sandbox variables it was given, instead of running it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import root as sandbox_root

REPO = Path(__file__).resolve().parents[2]

FAKE = """#!/bin/sh
if [ "$1" = -c ]; then exec {python} "$@"; fi
{python} -c 'import json, os, sys; line = json.dumps({{"argv": sys.argv[1:], "env": {{k: v
    for k, v in os.environ.items() if k.startswith("DISPATCH_SANDBOX")}}}}) + "\\n"
os.write(os.open("{log}", os.O_WRONLY | os.O_APPEND | os.O_CREAT),
         line.encode())' "$@"
"""
# Each session's line is one write with O_APPEND: the two lanes of make test run at once, and
# print's buffered writes to a shared file interleaved them once ('{...}{...}').


def sessions(tmp_path: Path, *args: str, **env: str) -> list[dict]:
    log = tmp_path / "sessions.jsonl"
    fake = tmp_path / "python"
    fake.write_text(FAKE.format(python=sys.executable, log=log))
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_SANDBOX")}
    proc = subprocess.run(
        ["bash", "tools/run-tests", str(fake), *args],
        cwd=REPO,
        env={**clean, "TEST_SERIAL": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_make_test_runs_the_tables_tested_releases_with_their_users_and_tests(
    tmp_path: Path,
) -> None:
    tested = [r for r in sandbox_root.RELEASES.values() if r.tested]
    assert [r.name for r in tested] == ["24.11", sandbox_root.NEWEST]
    fast, *on_roots, host = sessions(tmp_path)
    assert fast["argv"][-2:] == ["not real", "--ignore=tests/real"]
    assert host["argv"][-1] == "tests/real" and "DISPATCH_SANDBOX_SLURM" not in host["env"]
    assert [s["env"]["DISPATCH_SANDBOX_SLURM"] for s in on_roots] == [r.name for r in tested]
    for session, release in zip(on_roots, tested):
        assert session["env"]["DISPATCH_SANDBOX_USER"] == release.job_user
        assert session["argv"][-len(sandbox_root.REAL_ON_ROOTS) :] == list(
            sandbox_root.REAL_ON_ROOTS
        )
        assert (
            "DISPATCH_SANDBOX_DIR" not in session["env"]
            or session["env"]["DISPATCH_SANDBOX_DIR"] == ""
        )


def test_a_folder_user_and_tests_given_override_the_table(tmp_path: Path) -> None:
    _fast, on_root, _newest, _host = sessions(
        tmp_path,
        "tests/real/test_hooks.py",
        DISPATCH_SANDBOX_DIR="/var/tmp/sb",
        DISPATCH_SANDBOX_USER_24_11="someone",
    )
    assert on_root["argv"][-1] == "tests/real/test_hooks.py"
    assert on_root["env"]["DISPATCH_SANDBOX_DIR"] == "/var/tmp/sb-24.11"
    assert on_root["env"]["DISPATCH_SANDBOX_USER"] == "someone"


# Each session records when it started and ended; one on a release from a Debian root waits up
# to 20 s for the host's real tier to have started.
OVERLAPPING = """#!/bin/sh
if [ "$1" = -c ]; then exec {python} "$@"; fi
case "$*" in *"not real"*) tier=fast;; *) tier=${{DISPATCH_SANDBOX_SLURM:-host}};; esac
echo "start $tier" >> {log}
if [ "$tier" = host ]; then touch {folder}/host-started; fi
if [ "$tier" != fast ] && [ "$tier" != host ]; then
    i=0; while [ ! -e {folder}/host-started ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done
fi
echo "end $tier" >> {log}
"""


def test_the_hosts_real_tier_runs_beside_the_releases_from_roots(tmp_path: Path) -> None:
    """With a third release (the newest) `make test` had to fit 60 minutes
    with .ci/run: the host's real tier (the longest) waited for every release's tier to end
    before it started, so adding one added all of its time.  It now starts once the fast tier
    has ended, beside whatever releases' tiers are still running."""
    log = tmp_path / "order"
    fake = tmp_path / "python"
    fake.write_text(OVERLAPPING.format(python=sys.executable, log=log, folder=tmp_path))
    fake.chmod(0o755)
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DISPATCH_SANDBOX") and k != "TEST_SERIAL"
    }
    proc = subprocess.run(
        ["bash", "tools/run-tests", str(fake)],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = log.read_text().splitlines()
    first = next(r.name for r in sandbox_root.RELEASES.values() if r.tested)
    assert events.index("end fast") < events.index("start host") < events.index(f"end {first}"), (
        events
    )
    assert "every run passed" in proc.stdout


def test_the_hosts_real_tier_runs_over_two_workers_each_file_on_one(tmp_path: Path) -> None:
    """.ci/run took 61.6 minutes, most of it the first lane's host real tier
    (136 tests, 28 to 32+ minutes, waiting on Slurm at a tenth of a core).  make test now splits
    it over two pytest-xdist workers, each with a sandbox of its own (tests/real/conftest.py),
    a whole file on one worker; TEST_SERIAL=1 still runs it in one session."""
    clean = {k: v for k, v in os.environ.items() if k != "TEST_SERIAL"}
    log = tmp_path / "sessions.jsonl"
    fake = tmp_path / "python"
    fake.write_text(FAKE.format(python=sys.executable, log=log))
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", "tools/run-tests", str(fake)],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    (host,) = [argv for argv in runs if argv[-1] == "tests/real"]
    assert host[host.index("-n") + 1] == "2" and host[host.index("--dist") + 1] == "loadfile"
    assert all("-n" not in argv for argv in runs if argv is not host)
    (tmp_path / "serial").mkdir()
    *_, serial = sessions(tmp_path / "serial")
    assert serial["argv"][-1] == "tests/real" and "-n" not in serial["argv"]


@pytest.mark.parametrize("worker", ["", "gw0", "gw1", "gw3"])
@pytest.mark.parametrize(
    "given",
    [
        {},
        {"DISPATCH_SANDBOX_DIR": "/var/tmp/sb", "DISPATCH_SANDBOX_USER": "jun"},
        {"DISPATCH_SANDBOX_SLURM": "24.11"},
    ],
)
def test_each_xdist_worker_of_the_real_tier_has_a_sandbox_and_home_of_its_own(
    worker: str, given: dict[str, str]
) -> None:
    from tests.real.conftest import worker_sandbox

    environ = {**given, **({"PYTEST_XDIST_WORKER": worker} if worker else {})}
    chosen = {**given, **worker_sandbox(environ)}
    folder = chosen.get("DISPATCH_SANDBOX_DIR") or str(
        sandbox_layout.default_dir(given.get("DISPATCH_SANDBOX_SLURM", "host"))
    )
    user = chosen.get("DISPATCH_SANDBOX_USER", sandbox_layout.DEFAULT_USER)
    base = given.get("DISPATCH_SANDBOX_DIR") or str(
        sandbox_layout.default_dir(given.get("DISPATCH_SANDBOX_SLURM", "host"))
    )
    if worker in ("", "gw0"):  # the folder and user the environment names, as without xdist
        assert worker_sandbox(environ) == {}
    else:
        named = given.get("DISPATCH_SANDBOX_USER", sandbox_layout.DEFAULT_USER)
        assert (folder, user) == (f"{base}-{worker}", f"{named}-{worker}")
        # Not a release's folder or job user (make test runs those beside it), nor the folder
        # test_clusters gives its second cluster (<folder>2).
        assert user not in {r.job_user for r in sandbox_root.RELEASES.values()}
        assert folder not in {f"{base}-{r}" for r in sandbox_root.RELEASES} | {f"{base}2"}
    sandbox_layout.state_dir(folder)  # a folder slurm.conf and a socket path can hold


@pytest.mark.parametrize(
    "release", list(sandbox_root.RELEASES.values()), ids=list(sandbox_root.RELEASES)
)
def test_every_release_has_a_job_user_of_its_own(release: sandbox_root.Release) -> None:
    users = [r.job_user for r in sandbox_root.RELEASES.values()]
    assert release.job_user and users.count(release.job_user) == 1
    assert release.job_user != "dispatchuser"  # the host's tier's


def test_the_tables_real_tests_exist() -> None:
    for name in sandbox_root.REAL_ON_ROOTS:
        assert (REPO / name).is_file(), name
