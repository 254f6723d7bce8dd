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
from .test_siteview import SQUASHED, USER, site  # noqa: F401 - the fixture
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


def test_an_array_tasks_facts_stay_while_its_hold_stands_and_go_once_settled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Facts are filed under each task's own Slurm job id (SLURM_JOB_ID in the hooks: task 1
    of array 97 is job 98), while the record names the array (97) and the held task as 97_1;
    the launcher's start of each task names its own id, which is what keeps them."""
    from slurm_dispatch.control.holds import release
    from slurm_dispatch.control.supervisor import Supervisor
    from slurm_dispatch.node import prune
    from slurm_dispatch.slurm.adapter import Slurm

    from ..hooks.test_prune import clean_job
    from .test_arrays import task_ids
    from .test_supervisor import new_job

    monkeypatch.setenv("DISPATCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    fake = FakeCluster(first_id=97)
    job, array = new_job(fake, "--shared-checkpoint", "--resubmit", "2", "--array=0-1")
    tasks = task_ids(fake, array)
    assert (array, tasks) == ("97", {0: "97", 1: "98"})

    def started(submission: int, task: int, own: str) -> None:  # as the launcher records it
        job.append("started", submission=submission, slurm_job_id=own, array_job_id=array,
                   array_task_id=str(task), restart=0, attempt="a" * 26, epoch=1_000_000,
                   exec_dir="/x", resume_from="", node="n1", nodes="n1", host="h", pid=1)

    started(1, 0, tasks[0])
    started(1, 1, tasks[1])
    fake.set(tasks[0], JobState="COMPLETED")
    fake.set(tasks[1], JobState="NODE_FAIL")
    sup = Supervisor(Slurm(fake, wait=0), Settings(signal=None))
    sup.run_pass()
    (hold,) = job.history().lineage(1).holds
    assert (hold.ended_slurm_job_id, hold.slurm_job_id) == ("97_1", "99")
    state = str(tmp_path / "state")
    os.mkdir(state, 0o755)
    for own in ("97", "98"):
        clean_job(state, own)

    def judge() -> dict[str, str | None]:
        needed = retention.needed_slurm_jobs(record.home_dir())
        return {j.job_id: j.reason for j in prune.plan(state, 0, lambda uid: needed)}

    # While the hold on task 1 stands, the facts dispatch-cease reads for 97_1 (job 98's)
    # stay, and so do the rest of the record's.
    assert judge() == {"97": "needed by a record", "98": "needed by a record"}
    assert release(Slurm(fake, wait=0), job) == "99"
    started(2, 1, "99")
    fake.set("99", JobState="COMPLETED")
    sup.run_pass()
    assert job.history().settled_tasks([0, 1])
    clean_job(state, "99")
    going = [j for j in prune.plan(state, 0, lambda uid: retention.needed_slurm_jobs(
        record.home_dir()))]
    assert {j.job_id: j.reason for j in going} == {"97": None, "98": None, "99": None}
    for judged in going:
        prune.remove(state, judged)
    assert os.listdir(os.path.join(state, "facts", "1000")) == []
