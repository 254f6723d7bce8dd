"""Retention of users' job records (docs/admin-guide.md): ``dispatch-admin prune`` with
RecordRetention (or --records-older-than) forgets, for every user with records, the settled
records last active before it, by ``dispatch forget``'s own rules, read and removed by a child
running as the user (nobody, a real account), never by root.  Slurm is the fake controller
(in the test's process, which the child forks from) or, for the run that is killed, a fake
``squeue`` on PATH that logs who asked."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import admin
from slurm_dispatch.control import record
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture
from .test_siteview import (  # noqa: F401 - the fixture
    UNKNOWN_UID,
    USER,
    held,
    not_enumerated,
    site,
    with_facts,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs children as another user")
REPO = Path(__file__).resolve().parents[2]


def owned_by_nobody(base: Path) -> None:
    for folder, _, files in os.walk(base / "nobody"):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.lchown(name, USER.pw_uid, USER.pw_gid)


def settled(fake: FakeCluster, base: Path, name: str, *extra: str) -> record.JobRecord:
    """A dispatch job of nobody's that completed, was judged, and aged out of Slurm."""
    done = submit_one(str(base / name), *extra)
    fake.set(done.slurm_job_id, JobState="COMPLETED", Restarts="0")
    Supervisor(Slurm(), Settings(signal=None), clock=time.time).run_pass()
    del fake.jobs[done.slurm_job_id]
    assert done.job.history().settled
    return done.job


def prune(base: Path, *args: str) -> tuple[int, str, str]:
    conf = base / "dispatch.conf"
    if not conf.exists():
        conf.write_text(f"StateDir={base / 'state'}\n")
    result = CliRunner().invoke(
        admin.main, ["prune", "--config", str(conf), "--records", f"{base}/%u", *args]
    )
    return result.exit_code, result.stdout, result.stderr


def test_old_settled_records_go_and_what_forget_keeps_stays(site: tuple[FakeCluster, Path]) -> None:  # noqa: F811
    fake, base = site
    old = [settled(fake, base, f"ck-old{i}") for i in range(2)]
    hold_job, ended, held_id = held(fake, base)  # a standing hold
    del fake.jobs[held_id], fake.jobs[ended]  # (Slurm has forgotten both)
    unsettled = submit_one(str(base / "ck-unsettled"))  # ended, no pass has judged it
    del fake.jobs[unsettled.slurm_job_id]
    known = submit_one(str(base / "ck-known"))  # Slurm still knows it
    fake.set(known.slurm_job_id, JobState="COMPLETED")
    upstream = settled(fake, base, "ck-up")  # a kept job waits for it
    down = submit_one(str(base / "ck-down"), f"--dependency=afterok:{upstream.id}")
    owned_by_nobody(base)
    code, out, err = prune(base, "--records-older-than", "0", "--dry-run", "-v")
    assert (code, err) == (0, ""), out + err
    assert {
        line.split()[2] for line in out.splitlines() if line.startswith("would forget nobody/")
    } == {f"nobody/{j.id}" for j in old}
    assert all(os.path.isdir(j.path) for j in old)  # a dry run removes nothing
    code, out, err = prune(base, "--records-older-than", "0", "-v")
    assert (code, err) == (0, ""), out + err
    said = {
        line.split()[1].rstrip(":"): line
        for line in out.splitlines()
        if line.split()[0] in ("forgot", "kept")
    }
    for job in old:
        assert said[f"nobody/{job.id}"].startswith(f"forgot nobody/{job.id} (last active ")
        assert not os.path.lexists(job.path)
    assert "a standing hold" in said[f"nobody/{hold_job.id}"]
    assert "not settled" in said[f"nobody/{unsettled.job.id}"]
    assert "still known to Slurm" in said[f"nobody/{known.job.id}"]
    assert f"{down.job.id} wait for it" in said[f"nobody/{upstream.id}"]
    for job in (hold_job, unsettled.job, known.job, upstream, down.job):
        assert os.path.isfile(os.path.join(job.path, "job.json")), job.id
    assert out.splitlines()[-1].startswith("forgot 2 records (") and out.splitlines()[-1].endswith(
        "; kept 5"
    )
    assert "cluster fake" in out.splitlines()[-1]
    assert not list((base / "nobody" / "jobs").glob(".*"))  # nothing left half removed


def test_recent_records_stay_and_without_a_retention_records_are_left_alone(
    site: tuple[FakeCluster, Path],
) -> None:  # noqa: F811
    fake, base = site
    job = settled(fake, base, "ck")
    owned_by_nobody(base)
    (base / "dispatch.conf").write_text(f"StateDir={base / 'state'}\nRecordRetention=1-00:00:00\n")
    code, out, err = prune(base, "-v")
    assert (code, err) == (0, ""), out + err
    assert out.splitlines()[-1].startswith("forgot 0 records (0 bytes on disk)")
    assert os.path.isdir(job.path)
    (base / "state").mkdir(mode=0o755)
    (base / "dispatch.conf").write_text(f"StateDir={base / 'state'}\nFactRetention=1\n")
    code, out, err = prune(base)  # facts only: no word of records, nothing of them touched
    assert code == 0 and "record" not in out, out + err
    assert os.path.isdir(job.path)
    code, out, err = prune(base, "--records-older-than", "soon")
    assert code == 2 and "--records-older-than 'soon' is not a duration" in err, err


def test_a_user_the_account_list_does_not_enumerate_has_old_records_forgotten(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """Where sssd does not enumerate (getpwall lists only local accounts), a user whose jobs
    ran under the hooks is found through facts/<uid>/, and a uid there that the account
    database does not answer for is named, its records left alone."""
    fake, base = site
    old = settled(fake, base, "ck-old")
    owned_by_nobody(base)
    not_enumerated(monkeypatch, "nobody")
    state = with_facts(base, monkeypatch, USER.pw_uid, UNKNOWN_UID)
    code, out, err = prune(base, "--records-older-than", "0")
    assert code == 1, out + err
    assert out.splitlines()[0].startswith(f"forgot nobody/{old.id} (last active "), out
    assert not os.path.exists(old.path)
    assert err == (
        f"dispatch-admin: uid {UNKNOWN_UID} (facts in {state}/facts/{UNKNOWN_UID}): "
        "the account database does not answer for it (an account gone, or a "
        "directory service down): its records are not read\n"
    ), err


def test_a_symlinked_jobs_folder_leads_the_child_only_where_the_user_may_go(
    site: tuple[FakeCluster, Path],
) -> None:  # noqa: F811
    """nobody points jobs/ at a folder of root's holding a settled, old record: root
    following it would rename and remove root's record; nobody may not."""
    fake, base = site
    job = settled(fake, base, "ck")
    victim = base / "root-records"
    shutil.move(str(base / "nobody" / "jobs"), victim)
    for folder, dirs, files in os.walk(victim):  # readable by all, writable by root only
        for name in dirs + files:
            os.chmod(os.path.join(folder, name), 0o755)
    os.chmod(victim, 0o755)
    (base / "nobody" / "jobs").symlink_to(victim)
    os.lchown(base / "nobody" / "jobs", USER.pw_uid, USER.pw_gid)
    os.lchown(base / "nobody", USER.pw_uid, USER.pw_gid)
    before = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    code, out, err = prune(base, "--records-older-than", "0")
    assert code == 1, out + err
    assert err.startswith("dispatch-admin: nobody: ") and "Permission denied" in err, err
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == before
    assert (victim / job.id / "job.json").is_file()


KILLED_RUN = """
import sys
sys.argv = ["dispatch-admin", "prune", "--config", {conf!r}, "--records", {pattern!r},
            "--records-older-than", "0"]
from slurm_dispatch.cli import admin
admin.main()
"""


def test_a_prune_killed_at_a_random_point_leaves_each_record_whole_or_gone(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    fake, base = site
    jobs = [settled(fake, base, f"ck{i}") for i in range(40)]
    owned_by_nobody(base)
    whole = {
        j.id: sorted(str(p.relative_to(j.path)) for p in Path(j.path).rglob("*")) for j in jobs
    }
    tools = base / "bin"
    tools.mkdir(mode=0o755)
    log = base / "squeue.log"
    log.touch()
    log.chmod(0o666)
    # Slurm knows none of the jobs any more; anything but the user's own listing is a fault.
    (tools / "squeue").write_text(
        f'#!/bin/sh\necho "$(id -u) $*" >>{log}\n'
        'case " $* " in *" --me "*) exit 0;; esac\n'
        'echo "unexpected squeue $*" >&2; exit 1\n'
    )
    (tools / "squeue").chmod(0o755)
    conf = base / "dispatch.conf"
    conf.write_text(f"StateDir={base / 'state'}\nSlurmBackend=cli\n")
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    script = KILLED_RUN.format(conf=str(conf), pattern=f"{base}/%u")
    folder = base / "nobody" / "jobs"
    rng = random.Random(os.getpid())
    kills = 0
    for _ in range(4):
        left = [n for n in os.listdir(folder) if not n.startswith(".")]
        if len(left) < 2:
            break
        run = subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # Kill it once it has begun forgetting: once 1 to 5 records (a random number) have
        # gone, a random moment into the next.  Counted in records, not in time: under load
        # a fixed window let the first run forget all 40 before its kill (kills == 0).
        gone = rng.randint(1, max(1, min(5, len(left) // 4)))
        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline:
            now_left = [n for n in os.listdir(folder) if not n.startswith(".")]
            if len(now_left) <= len(left) - gone:
                break
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.005))
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)  # the parent and its child running as nobody
            kills += 1
        run.wait()
        for name in os.listdir(folder):
            if name.startswith("."):
                continue  # renamed out of every reader's sight: the next run finishes it
            assert (
                sorted(str(p.relative_to(folder / name)) for p in (folder / name).rglob("*"))
                == whole[name]
            ), name
    assert kills >= 1
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.listdir(folder) == []  # every record gone, none left half removed
    asked = [line.split() for line in log.read_text().splitlines()]
    assert asked and all(a[0] == str(USER.pw_uid) and "--me" in a for a in asked), asked
    assert done.stdout.splitlines()[-1].startswith("forgot "), done.stdout


def test_a_symlinked_record_is_refused_once_never_followed_and_leaves_nothing_behind(
    site: tuple[FakeCluster, Path],
) -> None:  # noqa: F811
    """nobody's jobs/<id> is a symlink to a settled, old record kept elsewhere (a hostile
    user plants one, an unlucky one moved a record and linked it back).  It is no record
    folder of jobs/: prune refuses it, naming it, and neither judges nor removes through it;
    a run after that finds nothing of it half removed to finish."""
    fake, base = site
    job = settled(fake, base, "ck")
    plain = settled(fake, base, "ck-plain")
    elsewhere = base / "nobody" / "moved"
    elsewhere.mkdir()
    target = elsewhere / job.id
    shutil.move(job.path, target)
    os.symlink(target, job.path)
    owned_by_nobody(base)
    os.lchown(job.path, USER.pw_uid, USER.pw_gid)
    inside = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    code, out, err = prune(base, "--records-older-than", "0", "-v")
    assert code == 0, out + err
    kept = [line for line in out.splitlines() if line.startswith(f"kept nobody/{job.id}:")]
    assert len(kept) == 1, out
    assert "a symlink" in kept[0] and str(target) in kept[0], kept
    assert [line for line in out.splitlines() if job.id in line] == kept, out  # only there
    assert not os.path.lexists(plain.path)
    assert os.path.islink(job.path) and os.readlink(job.path) == str(target)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == inside
    assert not list((base / "nobody" / "jobs").glob(".*"))  # nothing left half removed
    code, out, err = prune(base, "--records-older-than", "0", "-v")
    assert code == 0, out + err
    assert "finished forgetting" not in out, out
    assert not list((base / "nobody" / "jobs").glob(".*"))


def test_a_record_with_a_folder_its_user_made_read_only_goes_whole(
    site: tuple[FakeCluster, Path],
) -> None:  # noqa: F811
    """An unlucky user made a record's events/ read-only (chmod -R a-w, to 'protect' it): the
    record was renamed out of sight, rmtree could not empty events/ and said nothing
    (ignore_errors), and every later run said it finished forgetting it while it stayed."""
    fake, base = site
    job = settled(fake, base, "ck")
    owned_by_nobody(base)
    (Path(job.path) / "events").chmod(0o555)
    code, out, err = prune(base, "--records-older-than", "0")
    assert (code, err) == (0, ""), out + err
    assert out.startswith(f"forgot nobody/{job.id} "), out
    assert os.listdir(base / "nobody" / "jobs") == []  # nothing left renamed out of sight
    code, out, err = prune(base, "--records-older-than", "0")
    assert (code, err) == (0, "") and "finished forgetting" not in out, out + err


def test_a_leftover_that_cannot_be_removed_is_named_not_said_finished(
    site: tuple[FakeCluster, Path],
) -> None:  # noqa: F811
    """What nobody cannot remove in a record renamed out of sight (a file of root's in it):
    an error naming it, on each run, never 'finished forgetting'; the other records go."""
    fake, base = site
    job, other = settled(fake, base, "ck"), settled(fake, base, "ck-other")
    owned_by_nobody(base)
    stuck = base / "nobody" / "jobs" / ".forgetting-dstuck00-0badcafe"
    (stuck / "events").mkdir(parents=True)
    (stuck / "events" / "root.json").write_text("{}")
    os.lchown(stuck, USER.pw_uid, USER.pw_gid)  # events/ and its file stay root's
    code, out, err = prune(base, "--records-older-than", "0")
    assert code == 1, out + err
    assert "finished forgetting" not in out, out
    assert err.startswith("dispatch-admin: nobody: ") and f"{stuck}/events" in err, err
    assert "Permission denied" in err, err
    assert not os.path.lexists(job.path) and not os.path.lexists(other.path)
    assert stuck.is_dir()
