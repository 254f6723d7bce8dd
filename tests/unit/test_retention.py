"""What the users' records still need of facts/ (control/retention.py), which
``dispatch-admin prune`` keeps: a standing hold's held and ended jobs, every job of a record
not settled, nothing of a settled one; a user whose records cannot be read needs everything."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.control import record, retention, siteview
from slurm_dispatch.control.supervisor import Settings

from .fake_cluster import FakeCluster
from .test_holds import held_job
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture
from .test_siteview import USER, site  # noqa: F401 - the fixture
from .test_supervisor import Clock, Signal


def test_a_standing_hold_and_an_unsettled_record_are_needed_a_settled_one_is_not(
        cluster: FakeCluster) -> None:  # noqa: F811
    clock, signal = Clock(), Signal("not ceased")
    job, ended, held, sup = held_job(cluster, clock, signal, Settings(interval=60))
    done = submit_one("ck-done")
    cluster.set(done.slurm_job_id, JobState="COMPLETED", Restarts="0")
    running = submit_one("ck-running")
    sup.run_pass()
    assert done.job.history().settled  # a plain job that completed: nothing more to decide
    needed = retention.needed_slurm_jobs(record.home_dir())
    assert {ended, held, running.slurm_job_id} <= needed
    assert done.slurm_job_id not in needed


def test_records_are_read_as_their_user_and_unreadable_ones_need_everything(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("reads records in a child that takes the user's uid: needs root")
    home = tmp_path / "user"
    monkeypatch.setattr(siteview, "records_of", lambda pattern, user: str(home))
    assert retention.user_needs(os.geteuid()) == set()  # no records at all
    made = submit_one("ck-x")
    shutil.copytree(record.home_dir(), home)
    assert retention.user_needs(os.geteuid()) == {made.slurm_job_id}
    for path in (home / "jobs" / made.job.id).rglob("*"):
        if path.is_file():
            os.chmod(path, 0o644)
            path.write_text("{garbled")
    assert retention.user_needs(os.geteuid()) is None


def test_a_uid_the_directory_does_not_answer_for_keeps_everything() -> None:
    # getpwuid says KeyError for an account that is gone and for a directory service that did
    # not answer (sssd down) alike: prune cannot tell them apart, so it keeps the facts.
    uid = 2_000_000_000
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    assert retention.user_needs(uid) is None


# Root as a root-squashing NFS server sees it: without the capabilities that let root pass
# by a folder's mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), for itself and what it runs.
SQUASHED = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
NEEDS_AS_SQUASHED_ROOT = """
import json, os, sys
from slurm_dispatch.control import retention
home, uid, pattern = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    os.stat(os.path.join(home, "jobs"))
    looked = "root saw in"
except PermissionError:
    looked = "root cannot look in"
needed = retention.user_needs(uid, pattern)
print(json.dumps({"looked": looked, "needed": None if needed is None else sorted(needed)}))
"""


def test_a_home_root_cannot_look_into_is_read_by_the_user_and_its_needs_kept(
        site: tuple[FakeCluster, Path]) -> None:  # noqa: F811
    """A 0700 home on a root-squashed file system: root cannot tell whether there are
    records, so only the user's own child may say (it was asked as root, which saw no jobs/
    folder and answered 'nothing needed': every fact of the user's could go)."""
    if os.geteuid() != 0:
        pytest.skip("reads records in a child that takes the user's uid: needs root")
    fake, base = site
    made = submit_one(str(base / "ck"))  # running: its record is not settled
    home = base / "nobody"
    for folder, _, files in os.walk(home):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.lchown(name, USER.pw_uid, USER.pw_gid)
    home.chmod(0o700)
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([*SQUASHED, sys.executable, "-c", NEEDS_AS_SQUASHED_ROOT, str(home),
                           str(USER.pw_uid), f"{base}/%u"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": repo}, timeout=120)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["looked"] == "root cannot look in"  # the premise: root is squashed here
    assert said["needed"] == [made.slurm_job_id]
