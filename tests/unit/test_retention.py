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

from ..fakes.cluster import FakeCluster
from .test_holds import held_job
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture
from .test_siteview import SQUASHED, USER, site  # noqa: F401 - the fixture
from .test_supervisor import Clock, Signal


def test_a_standing_hold_and_an_unsettled_record_are_needed_a_settled_one_is_not(
    cluster: FakeCluster,
) -> None:  # noqa: F811
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
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
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
    site: tuple[FakeCluster, Path],
) -> None:  # noqa: F811
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
    done = subprocess.run(
        [
            *SQUASHED,
            sys.executable,
            "-c",
            NEEDS_AS_SQUASHED_ROOT,
            str(home),
            str(USER.pw_uid),
            f"{base}/%u",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": repo},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["looked"] == "root cannot look in"  # the premise: root is squashed here
    assert said["needed"] == [made.slurm_job_id]


@pytest.mark.parametrize(
    "launcher,hooks,kept",
    [
        ("recorded", "without array fields", "needed by a record"),
        # Task 1's launcher recorded nothing (the interpreter the batch script execs was gone,
        # say): no record names job 98; the controller's start names array 97 and task 1.
        ("lost", "with array fields", "needed by a record"),
        # The same, with facts of hooks that did not record arrays: nothing ties job 98 to 97_1,
        # so its facts can go while the hold stands (the admin guide says so).
        ("lost", "without array fields", None),
    ],
)
def test_an_array_tasks_facts_stay_while_its_hold_stands_and_go_once_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str, hooks: str, kept: str | None
) -> None:
    """Facts are filed under each task's own Slurm job id (SLURM_JOB_ID in the hooks: task 1
    of array 97 is job 98), while the record names the array (97) and the held task as 97_1.
    The launcher's start of each task names its own id; the hooks' starts name the task's
    array and task id (SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID): either keeps them."""
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

    def started(submission: int, task: int, own: str, of: str = array) -> None:
        # As the launcher records it.
        job.append(
            "started",
            submission=submission,
            slurm_job_id=own,
            array_job_id=of,
            array_task_id=str(task),
            restart=0,
            attempt="a" * 26,
            epoch=1_000_000,
            exec_dir="/x",
            resume_from="",
            node="n1",
            nodes="n1",
            host="h",
            pid=1,
        )

    def facts_of(own: str, of: str, task: int) -> None:
        if hooks == "with array fields":
            task_facts(state, own, of, task, monkeypatch)
        else:
            clean_job(state, own, uid=TASK_UID)

    started(1, 0, tasks[0])
    if launcher == "recorded":
        started(1, 1, tasks[1])
    fake.set(tasks[0], JobState="COMPLETED")
    fake.set(tasks[1], JobState="NODE_FAIL")
    sup = Supervisor(Slurm(fake, wait=0), Settings(signal=None))
    sup.run_pass()
    (hold,) = job.history().lineage(1).holds
    assert (hold.ended_slurm_job_id, hold.slurm_job_id) == ("97_1", "99")
    needed = retention.needed_slurm_jobs(record.home_dir())
    assert ("98" in needed) == (launcher == "recorded")  # the premise
    state = str(tmp_path / "state")
    os.mkdir(state, 0o755)
    facts_of("97", array, 0)
    facts_of("98", array, 1)

    def judge() -> dict[str, str | None]:
        needed = retention.needed_slurm_jobs(record.home_dir())
        return {j.job_id: j.reason for j in prune.plan(state, 0, lambda uid: needed)}

    # While the hold on task 1 stands, the facts dispatch-cease reads for 97_1 (job 98's)
    # stay, and so do the rest of the record's.
    assert judge() == {"97": "needed by a record", "98": kept}
    assert release(Slurm(fake, wait=0), job) == "99"
    started(2, 1, "99", of="99")
    fake.set("99", JobState="COMPLETED")
    sup.run_pass()
    assert job.history().settled_tasks([0, 1])
    facts_of("99", "99", 1)
    going = list(prune.plan(state, 0, lambda uid: retention.needed_slurm_jobs(record.home_dir())))
    assert {j.job_id: j.reason for j in going} == {"97": None, "98": None, "99": None}
    for judged in going:
        prune.remove(state, judged)
    assert os.listdir(os.path.join(state, "facts", str(TASK_UID))) == []


TASK_UID = 4321  # nobody's here: the test's facts are its own


def task_facts(
    state: str, own: str, array: str, task: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One array task's facts, each execution proven ceased: the node's and the controller's
    starts are written by the Prolog and PrologSlurmctld themselves, given the variables Slurm
    gives them (the task's own SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID); each is
    closed by an end that found nothing left."""
    from slurm_dispatch.config import Config
    from slurm_dispatch.hooks import evidence
    from slurm_dispatch.node import factstore

    from ..fakes.hooks import record as fact

    cfg = Config()
    cfg.state_dir = state
    with monkeypatch.context() as env:
        for name in [n for n in os.environ if n.startswith("SLURM")]:
            env.delenv(name)
        for name, value in {
            "SLURM_JOB_ID": own,
            "SLURM_JOB_UID": str(TASK_UID),
            "SLURM_JOB_GID": str(TASK_UID),
            "SLURM_JOB_RESTART_COUNT": "0",
            "SLURM_JOB_NODELIST": "n1",
            "SLURMD_NODENAME": "n1",
            "SLURM_ARRAY_JOB_ID": array,
            "SLURM_ARRAY_TASK_ID": str(task),
        }.items():
            env.setenv(name, value)
        evidence.prolog(cfg)
        evidence.prolog_slurmctld(cfg)
    for name in factstore.list_job(state, TASK_UID, own):
        parsed = factstore.parse_name(name)
        assert parsed is not None
        kind, node, _, token = parsed
        if kind == "start":
            factstore.write_fact(
                state,
                TASK_UID,
                TASK_UID,
                own,
                "end",
                node,
                {"time": 2.0, "restart": 0, "survivors": [], "scan_error": None},
                token=token,
            )
        elif kind == "ctld-start":
            fact(state, "ctld-end", node, own, TASK_UID, time=2.0, restart=0, start_token=token)
