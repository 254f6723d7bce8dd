"""The site's view across users' records and its release service (dispatch-admin holds,
release-service; control/siteview.py): run as root, they read and write a user's records only
as that user.  The records belong to a real account (nobody); the CessationSignal is a root-run
script that needs a root-only (0700) folder, as dispatch-cease does where facts/ is 0700; Slurm's
scontrol is a fake at the process boundary that logs who called it."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from slurm_dispatch.cli import admin
from slurm_dispatch.control import events, record, siteview
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import RefusedError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs children as another user")
USER = pwd.getpwnam("nobody")
# A second real account that every Debian and Ubuntu machine has (a fresh one has no job users).
OTHER_USER = pwd.getpwnam("daemon")
REAL_SLURM_INIT = Slurm.__init__  # before the fixture puts the in-process fake there
# Root as a root-squashing NFS server sees it: without the capabilities that let root pass
# by a folder's mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), for itself and what it runs.
SQUASHED = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture
def site(
    cluster: FakeCluster,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> Iterator[tuple[FakeCluster, Path]]:
    """A folder every account can pass through (pytest's own is root's 0700) holding
    nobody's record home at <base>/nobody."""
    base = Path(tempfile.mkdtemp(prefix="siteview-", dir="/var/tmp"))
    base.chmod(0o711)
    monkeypatch.setenv("DISPATCH_HOME", str(base / "nobody"))
    yield cluster, base
    shutil.rmtree(base)


def held(
    fake: FakeCluster, base: Path, user: pwd.struct_passwd = USER
) -> tuple[record.JobRecord, str, str]:
    """A shared-checkpoint job of ``user``'s (nobody's) whose node failed: its next submission
    is held.  Its records are at <base>/<user's name>."""
    home = base / user.pw_name
    os.environ["DISPATCH_HOME"] = str(home)  # the fixture's monkeypatch restores it
    done = submit_one(str(base / f"ck-{user.pw_name}"), "--shared-checkpoint", "--resubmit", "3")
    fake.set(done.slurm_job_id, JobState="NODE_FAIL", Restarts="0")
    Supervisor(Slurm(), Settings(signal=None), clock=time.time).run_pass()
    held_id = str(done.job.submissions()[-1]["slurm_job_id"])
    owned_by(base, done.slurm_job_id, user)
    for folder, _, files in os.walk(home):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.lchown(name, user.pw_uid, user.pw_gid)
    os.environ["DISPATCH_HOME"] = str(base / "nobody")
    return done.job, done.slurm_job_id, held_id


def owned_by(base: Path, job_id: str, user: pwd.struct_passwd) -> None:
    """Slurm's controller (the squeue :func:`site_conf` installs) knows ``job_id`` as
    ``user``'s ended job."""
    table = base / "slurm-jobs.json"
    jobs = json.loads(table.read_text()) if table.exists() else []
    jobs.append({"JobId": job_id, "JobState": "NODE_FAIL", "UserId": str(user.pw_uid)})
    table.write_text(json.dumps(jobs))


SQUEUE = """#!{python}
# The controller as root asks it (--jobs ID), from the test's table; an id it does not know
# is squeue's error.  Each call is logged with the caller's uid.
import json, os, sys
sys.path.insert(0, {repo!r})
from tests.fakes import squeue
args = sys.argv[1:]
with open({log!r}, "a") as out:
    out.write(f"{{os.getuid()}} {{' '.join(args)}}\\n")
if os.path.exists({table!r} + ".down"):
    sys.exit("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
table = {table!r}
jobs = json.load(open(table)) if os.path.exists(table) else []
shown = squeue.selected(args, jobs, os.getuid())
if "--jobs" in args and not shown:
    sys.exit("slurm_load_jobs error: Invalid job id specified")
sys.stdout.write(squeue.render(args, shown))
"""


def admin_cmd(base: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(admin.main, [*args, "--user", "nobody", "--records", f"{base}/%u"])
    return result.exit_code, result.stdout, result.stderr


def test_holds_shows_every_standing_hold_read_as_its_user(site: tuple[FakeCluster, Path]) -> None:
    fake, base = site
    job, ended, held_id = held(fake, base)
    code, out, err = admin_cmd(base, "holds")
    assert code == 0, err
    head, line = out.splitlines()
    assert head.split() == [
        "USER",
        "DISPATCH_JOB",
        "HELD",
        "DEADLINE",
        "LEFT",
        "WAITS_FOR",
        "LAST_ANSWER",
        "ASKED",
    ]
    cells = line.split()
    assert cells[:3] == ["nobody", job.id, held_id]
    assert cells[4].startswith("1-00:00:0") or cells[4].startswith("23:59:")
    assert cells[5:] == [f"{ended}+0", "not_asked", "-"]
    code, out, err = admin_cmd(base, "holds", "-H")  # as dispatch jobs -H
    assert (code, [row.split() for row in out.splitlines()]) == (0, [cells]), err
    code, out, err = admin_cmd(base, "holds", "--json")
    shown = json.loads(out)
    assert shown["errors"] == []
    assert [(h["user"], h["dispatch_job"], h["held_slurm_job_id"]) for h in shown["holds"]] == [
        ("nobody", job.id, held_id)
    ]
    assert shown["holds"][0]["ended"] == [
        {
            "slurm_job_id": ended,
            "restart": 0,
            "verdict": "not asked",
            "asked_at": None,
            "evidence": None,
        }
    ]


def test_a_users_symlink_leads_the_view_only_where_the_user_may_go(
    site: tuple[FakeCluster, Path],
) -> None:
    fake, base = site
    job, _, _ = held(fake, base)
    secret = base / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "events").mkdir()
    (secret / "job.json").write_text('{"secret": "root only"}')
    events = Path(job.path) / "events"
    shutil.rmtree(events)
    events.symlink_to(secret / "events")
    os.lchown(events, USER.pw_uid, USER.pw_gid)
    code, out, err = admin_cmd(base, "holds", "--json")
    assert code == 1
    shown = json.loads(out)
    assert shown["holds"] == []
    assert len(shown["errors"]) == 1 and "Permission denied" in shown["errors"][0], shown
    assert "root only" not in out + err


def site_conf(base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dispatch.conf whose CessationSignal (root's) answers ceased only if it can read a
    root-only 0700 folder, saying who ran it (``asker``: not ``uid``, which in
    dispatch-cease's answer is whose facts it judged); a fake scontrol logging its argv and
    caller's uid."""
    facts = base / "facts"
    facts.mkdir(mode=0o700)
    (facts / "proof").write_text("ceased\n")
    signal = base / "cease"
    signal.write_text(
        f"#!/bin/sh\ncat {facts}/proof >/dev/null || exit 1\n"
        f'echo "{{\\"asked\\": \\"$*\\", \\"asker\\": $(id -u)}}"\n'
    )
    signal.chmod(0o755)
    tools = base / "bin"
    tools.mkdir(mode=0o755)
    log = base / "scontrol.log"
    log.touch(mode=0o666)
    log.chmod(0o666)
    (tools / "scontrol").write_text(f'#!/bin/sh\necho "$(id -u) $*" >>{log}\n')
    (tools / "scontrol").chmod(0o755)
    (tools / "squeue").write_text(
        SQUEUE.format(
            python=sys.executable,
            repo=str(Path(__file__).resolve().parents[2]),
            log=str(base / "squeue.log"),
            table=str(base / "slurm-jobs.json"),
        )
    )
    (tools / "squeue").chmod(0o755)
    (tools / "sacct").write_text(  # as the sandbox's controller: no accounting
        f"#!/bin/sh\nif [ -e {base}/slurmdbd.down ]; then echo 'sacct: error: Problem talking "
        "to the database: Connection refused' >&2; exit 1; fi\n"
        "echo 'Slurm accounting storage is disabled' >&2\nexit 1\n"
    )
    (tools / "sacct").chmod(0o755)
    conf = base / "dispatch.conf"
    conf.write_text(f"CessationSignal={signal}\nSlurmBackend=cli\n")
    conf.chmod(0o644)
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setattr(Slurm, "__init__", REAL_SLURM_INIT)  # scontrol itself, as a site's
    return log


def test_the_release_service_lifts_a_proven_hold_as_its_user(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    job, ended, held_id = held(fake, base)
    log = site_conf(base, monkeypatch)
    code, out, err = admin_cmd(base, "release-service")
    assert (code, err) == (0, "")
    assert out == f"nobody: {job.id}: hold on Slurm job {held_id} lifted: ceased\n"
    calls = log.read_text().splitlines()
    assert calls[0] == f"{USER.pw_uid} release {held_id}"
    assert calls[1].startswith(
        f"{USER.pw_uid} update jobid={held_id} comment=dispatch:{job.id}/2 released (ceased, site) "
    )
    events = {e["event"]: e for e in job.events()}
    assert events["cessation"]["verdict"] == "ceased"
    assert events["cessation"]["evidence"] == {"asked": f"{ended} --restart 0 --json", "asker": 0}
    assert events["released"]["by"] == "the site's release service (ceased)"
    for folder, _, files in os.walk(Path(job.path) / "events"):
        for name in files:
            assert os.lstat(os.path.join(folder, name)).st_uid == USER.pw_uid, name
    code, out, _ = admin_cmd(base, "holds", "--noheader")
    assert (code, out) == (0, "")
    code, out, _ = admin_cmd(base, "release-service")  # nothing stands: nothing asked
    assert (code, out, len(log.read_text().splitlines())) == (0, "", 2)


def test_the_release_service_refuses_a_target_that_is_not_a_job_id(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who rewrites their record cannot make root's signal run with other words."""
    fake, base = site
    job, ended, held_id = held(fake, base)
    log = site_conf(base, monkeypatch)
    answer = siteview.ask_as_root("/bin/echo", 5.0, "--restart=0; rm -rf /", 0)
    assert answer["verdict"] == "error" and "not a Slurm job id" in answer["evidence"]
    assert log.read_text() == ""


def test_the_users_own_error_answers_never_postpone_the_service(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With facts/ 0700 the user's supervisor answers itself 'error' every CessationInterval;
    were the service to count from those, it would never ask."""
    fake, base = site
    job, ended, held_id = held(fake, base)
    job.append(
        events.Cessation,
        asked_at=round(time.time(), 3),
        held_slurm_job_id=held_id,
        ended_slurm_job_id=ended,
        verdict="error",
        code=2,
        evidence="facts/: Permission denied",
        command=["dispatch-cease", ended],
    )
    for folder, _, files in os.walk(base / "nobody"):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.lchown(name, USER.pw_uid, USER.pw_gid)
    code, out, _ = admin_cmd(base, "holds", "--noheader")
    assert out.split()[5:7] == [f"{ended}+0", "error"]
    site_conf(base, monkeypatch)
    code, out, err = admin_cmd(base, "release-service")
    assert (code, err) == (0, "")
    assert out == f"nobody: {job.id}: hold on Slurm job {held_id} lifted: ceased\n"


# -- the SiteViewGroup's copy ("root, or a configured group") ------------------------------

GROUP = grp.getgrgid(USER.pw_gid)  # nobody's own group: nobody is a member
OTHER = grp.getgrgid(0)  # root's: nobody is not


def group_conf(base: Path, monkeypatch: pytest.MonkeyPatch, group: str) -> Path:
    """A dispatch.conf naming ``group`` as SiteViewGroup, no CessationSignal (the service
    then only writes the view), and a root-owned StateDir; the snapshot's path."""
    state = base / "state"
    state.mkdir(mode=0o755, exist_ok=True)
    conf = base / "dispatch.conf"
    conf.write_text(f"StateDir={state}\nSiteViewGroup={group}\nCessationSignal=\n")
    conf.chmod(0o644)
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    return state / "siteview" / "holds.json"


def as_nobody(*args: str) -> tuple[int, str, str]:
    """dispatch-admin run by nobody (uid, gid and groups, in a child): not root."""

    def work(_home: str) -> dict[str, object]:
        result = CliRunner().invoke(admin.main, list(args))
        return {"code": result.exit_code, "out": result.stdout, "err": result.stderr}

    got = siteview.as_user(USER, "/", work)
    assert "code" in got, got
    return int(got["code"]), str(got["out"]), str(got["err"])  # type: ignore[call-overload]


def test_a_site_view_group_member_sees_every_hold_from_roots_snapshot(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    job, ended, held_id = held(fake, base)
    snapshot = group_conf(base, monkeypatch, GROUP.gr_name)
    code, out, err = as_nobody("holds")  # before root's service wrote one
    assert code == 1 and f"no site view at {snapshot}" in err, err
    code, out, err = admin_cmd(base, "release-service")
    assert (code, err) == (0, ""), err
    assert out == (
        f"site view: 1 standing hold(s) written to {snapshot} for group {GROUP.gr_name}\n"
    )
    for path, mode in ((snapshot, 0o640), (snapshot.parent, 0o750)):
        info = path.lstat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, GROUP.gr_gid, mode), (
            path
        )
    assert os.listdir(snapshot.parent) == ["holds.json"]
    code, out, err = as_nobody("holds")
    assert code == 0, err
    head, line = out.splitlines()
    assert line.split()[:3] == ["nobody", job.id, held_id]
    assert line.split()[5:] == [f"{ended}+0", "not_asked", "-"]
    assert err.startswith("dispatch-admin: the site view as of ") and " s old)" in err, err
    assert "stale" not in err
    code, out, err = as_nobody("holds", "--json", "--user", "someone-else")
    shown = json.loads(out)
    assert (code, shown["holds"], shown["errors"]) == (0, [], [])
    assert abs(shown["written_at"] - time.time()) < 60
    code, out, err = as_nobody("holds", "--records", "/elsewhere/%u")
    assert code == 2 and "--records '/elsewhere/%u': only root" in err, err


def test_anyone_outside_the_site_view_group_is_refused_naming_it(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    held(fake, base)
    conf_path = base / "dispatch.conf"
    group_conf(base, monkeypatch, OTHER.gr_name)
    code, _, _ = admin_cmd(base, "release-service")
    assert code == 0
    code, out, err = as_nobody("holds")
    assert (code, out) == (1, "")
    assert (
        f"nobody is not root and not in SiteViewGroup {OTHER.gr_name} ({conf_path}): "
        f"only root and members of {OTHER.gr_name} see other users' holds"
    ) in err, err
    conf_path.write_text("CessationSignal=\n")  # no group at all: root only, and it says so
    code, out, err = as_nobody("holds")
    assert code == 2 and "SiteViewGroup" in err and "sets none" in err, err


def test_the_snapshot_is_whole_or_absent_never_half_written(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write the file system refuses part way (RLIMIT_FSIZE, for real) leaves the last
    whole snapshot, or none, and no temporary file."""
    import resource
    import signal as signals

    fake, base = site
    held(fake, base)
    snapshot = group_conf(base, monkeypatch, GROUP.gr_name)
    big = {"holds": [], "errors": ["x" * 100_000]}

    def refused_write() -> str:
        pid = os.fork()
        if pid == 0:
            said = "wrote"
            try:
                signals.signal(signals.SIGXFSZ, signals.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
                siteview.write_snapshot(str(snapshot.parents[1]), GROUP, big, time.time())
            except RefusedError as exc:
                said = str(exc)
            finally:
                (base / "said").write_text(said)
                os._exit(0)
        os.waitpid(pid, 0)
        return (base / "said").read_text()

    said = refused_write()  # the first write fails: no snapshot at all
    assert "File too large" in said and "the last snapshot stands" in said, said
    assert not snapshot.parent.exists() or os.listdir(snapshot.parent) == []
    code, _, _ = admin_cmd(base, "release-service")
    assert code == 0
    whole = snapshot.read_bytes()
    said = refused_write()
    assert "File too large" in said, said
    assert snapshot.read_bytes() == whole and os.listdir(snapshot.parent) == ["holds.json"]
    assert json.loads(whole)["holds"][0]["user"] == "nobody"


def test_a_stale_snapshot_says_its_age(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    job, _, held_id = held(fake, base)
    snapshot = group_conf(base, monkeypatch, GROUP.gr_name)
    seen = siteview.view(siteview.users(["nobody"], f"{base}/%u")[0])
    siteview.write_snapshot(str(snapshot.parents[1]), GROUP, seen, time.time() - 1000)
    code, out, err = as_nobody("holds", "--noheader")
    assert code == 1, err
    assert out.split()[:3] == ["nobody", job.id, held_id]  # still shown, and said to be old
    assert "(16 min old)" in err and "stale, older than 3 CessationIntervals (180 s)" in err, err


USERS_AS_SQUASHED_ROOT = """
import json, sys
from slurm_dispatch.control import siteview
print(json.dumps([user.pw_name for user, _ in siteview.users([], sys.argv[1])[0]]))
"""


def test_a_home_root_cannot_look_into_is_still_a_user_with_records(
    site: tuple[FakeCluster, Path],
) -> None:
    """On a root-squashed home (0700, root without the capabilities to pass by its mode) root
    cannot see whether jobs/ is there: that user's holds must still be shown and lifted, and
    their old records pruned, by the process running as them."""
    import subprocess
    import sys

    fake, base = site
    held(fake, base)
    (base / "nobody").chmod(0o700)
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [*SQUASHED, sys.executable, "-c", USERS_AS_SQUASHED_ROOT, f"{base}/%u"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": repo},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["nobody"]


# -- users a directory service does not enumerate (sssd's enumerate = false) ----------------
# getpwall() lists only local accounts where LDAP/sssd do not enumerate, while getpwuid() and
# getpwnam() still answer for every user.  A test cannot make a directory service skip a real
# account, so getpwall is faked at that boundary to leave nobody out; everything else is real
# (nobody's records, a fact the hooks' own store writes, getpwuid).

UNKNOWN_UID = next(
    u for u in range(4_000_000, 4_001_000) if u not in {p.pw_uid for p in pwd.getpwall()}
)


def not_enumerated(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The account list, as a directory service with enumerate = false gives it: without
    ``name``, which getpwnam and getpwuid still find."""
    listed = pwd.getpwall
    monkeypatch.setattr(pwd, "getpwall", lambda: [u for u in listed() if u.pw_name != name])
    assert name not in {u.pw_name for u in pwd.getpwall()}
    assert pwd.getpwuid(pwd.getpwnam(name).pw_uid).pw_name == name


def with_facts(base: Path, monkeypatch: pytest.MonkeyPatch, *uids: int) -> Path:
    """A root-owned StateDir where a job of each of ``uids`` ran under the hooks (one start
    fact each, written by the hooks' own store), named by dispatch.conf (kept if there is
    one); the StateDir."""
    from slurm_dispatch.node import factstore

    state = base / "state"
    state.mkdir(mode=0o755, exist_ok=True)
    for uid in uids:
        factstore.write_fact(str(state), uid, 0, "4242", "start", "n1", {"restart": 0})
    conf = base / "dispatch.conf"
    text = conf.read_text() if conf.exists() else ""
    conf.write_text(text + f"StateDir={state}\n")
    conf.chmod(0o644)
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    return state


def admin_all(base: Path, *args: str) -> tuple[int, str, str]:
    """dispatch-admin with no --user: every user it finds."""
    result = CliRunner().invoke(admin.main, [*args, "--records", f"{base}/%u"])
    return result.exit_code, result.stdout, result.stderr


def test_a_user_the_account_list_does_not_enumerate_is_found_through_facts(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    job, ended, held_id = held(fake, base)
    not_enumerated(monkeypatch, "nobody")
    with_facts(base, monkeypatch, USER.pw_uid)
    code, out, err = admin_all(base, "holds", "--noheader")
    assert (code, err) == (0, ""), out + err
    assert [line.split()[:3] for line in out.splitlines()] == [["nobody", job.id, held_id]]
    log = site_conf(base, monkeypatch)  # the release service finds and serves them too
    with_facts(base, monkeypatch)
    code, out, err = admin_all(base, "release-service")
    assert (code, err) == (0, ""), out + err
    assert out == f"nobody: {job.id}: hold on Slurm job {held_id} lifted: ceased\n"
    assert log.read_text().splitlines()[0] == f"{USER.pw_uid} release {held_id}"


def test_a_uid_with_facts_the_account_database_does_not_answer_for_is_reported(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    job, _, held_id = held(fake, base)
    state = with_facts(base, monkeypatch, USER.pw_uid, UNKNOWN_UID)
    code, out, err = admin_all(base, "holds", "--noheader")
    assert code == 1, out + err
    assert [line.split()[:3] for line in out.splitlines()] == [["nobody", job.id, held_id]]
    assert err.splitlines() == [
        f"dispatch-admin: uid {UNKNOWN_UID} (facts in {state}/facts/{UNKNOWN_UID}): the account "
        "database does not answer for it (an account gone, or a directory service down): its "
        "records are not read"
    ], err
    code, out, err = admin_all(base, "holds", "--json")
    assert code == 1 and json.loads(out)["errors"] == [err.splitlines()[0][16:]], err


def test_a_user_the_last_site_view_names_is_still_looked_at(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release service's own state names users too: a user whose standing hold its last
    pass wrote to the group's copy is looked at again, facts or not (facts/ moved aside after
    a loss of slurmctld's state, as the admin guide says to)."""
    fake, base = site
    job, _, held_id = held(fake, base)
    group_conf(base, monkeypatch, GROUP.gr_name)
    code, _, err = admin_cmd(base, "release-service")  # its last pass saw nobody's hold
    assert (code, err) == (0, ""), err
    not_enumerated(monkeypatch, "nobody")
    code, out, err = admin_all(base, "holds", "--noheader")
    assert (code, err) == (0, ""), out + err
    assert [line.split()[:3] for line in out.splitlines()] == [["nobody", job.id, held_id]]


def test_a_facts_folder_not_trusted_is_named_and_the_listed_users_still_read(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """facts/ made writable by others (or owned by another user) is not trusted as readers
    trust it: the users it names are not taken from it, and that is said, not skipped."""
    fake, base = site
    job, _, held_id = held(fake, base)
    state = with_facts(base, monkeypatch, UNKNOWN_UID)
    (state / "facts").chmod(0o777)
    code, out, err = admin_all(base, "holds", "--noheader")
    assert code == 1, out + err
    assert [line.split()[:3] for line in out.splitlines()] == [["nobody", job.id, held_id]]
    assert err == (
        f"dispatch-admin: {state}/facts is owned by uid 0 with mode 0777; its facts "
        "are not trusted: the users whose jobs left facts there are not all looked "
        "at\n"
    ), err


def test_a_fifo_among_a_users_events_is_named_at_once_not_waited_on(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile user puts a FIFO where an event file goes: root's child reading as that user
    opened it and waited for a writer until its alarm (CHILD_TIMEOUT, 300 s), twice a pass of
    the release service (the question, then the view), and every other user's pass waited
    behind it.  The alarm is made short here, so the wait shows as the child's missing answer."""
    fake, base = site
    job, _, held_id = held(fake, base)
    fifo = Path(job.path) / "events" / "0000000000000000001-fifo-deadbeef.json"
    os.mkfifo(fifo)
    os.lchown(fifo, USER.pw_uid, USER.pw_gid)
    monkeypatch.setattr(siteview, "CHILD_TIMEOUT", 5.0)
    code, out, err = admin_cmd(base, "holds", "--json")
    assert code == 1
    shown = json.loads(out)
    assert len(shown["errors"]) == 1, shown
    assert f"{job.id}: cannot read {str(fifo)!r}" in shown["errors"][0], shown
    assert "not a regular file (prw" in shown["errors"][0], shown


def test_a_copy_written_for_some_users_says_so_to_the_group(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer admin tries the service on one user (release-service --user alice): the
    group's copy then held that user's holds only and read as the site's whole view."""
    fake, base = site
    held(fake, base)
    group_conf(base, monkeypatch, GROUP.gr_name)
    code, _, err = admin_cmd(base, "release-service")  # --user nobody
    assert (code, err) == (0, ""), err
    code, out, err = as_nobody("holds")
    assert code == 0, err
    assert err.rstrip().endswith(
        "; only the holds of nobody: root's release-service ran with --user"
    ), err
    code, out, err = as_nobody("holds", "--json")
    assert json.loads(out)["only_users"] == ["nobody"]


def test_a_copy_left_when_the_group_is_unset_is_removed_by_the_next_pass(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SiteViewGroup taken out of dispatch.conf (to end the group's view): the last copy,
    0640 root:group, stayed readable by the group for ever, though holds refused them."""
    fake, base = site
    held(fake, base)
    snapshot = group_conf(base, monkeypatch, GROUP.gr_name)
    assert admin_cmd(base, "release-service")[0] == 0 and snapshot.is_file()
    conf = base / "dispatch.conf"
    conf.write_text(f"StateDir={base / 'state'}\nCessationSignal=/bin/false\n")
    code, out, err = admin_cmd(base, "release-service")
    assert f"site view: {conf} sets no SiteViewGroup: removed {snapshot}" in out, out + err
    assert not snapshot.exists() and snapshot.parent.is_dir()
    code, out, err = admin_cmd(base, "release-service")
    assert "site view" not in out, out


LOOP = """
import sys
sys.argv = ["dispatch-admin", "release-service", "--loop", "--user", "nobody",
            "--records", {pattern!r}]
from slurm_dispatch.cli import admin
admin.main()
"""


@contextlib.contextmanager
def serving(base: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``release-service --loop`` (a pass a second) over nobody's records, and its stderr's
    file; killed when done."""
    conf = base / "dispatch.conf"
    conf.write_text(conf.read_text() + "CessationInterval=1\n")
    log = base / "loop.err"
    with open(log, "wb") as errors:
        loop = subprocess.Popen(
            [sys.executable, "-c", LOOP.format(pattern=f"{base}/%u")],
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
    try:
        yield loop, log
    finally:
        loop.kill()
        loop.wait()


def until(condition: Callable[[], bool], loop: subprocess.Popen[bytes]) -> None:
    """Wait (a minute at most) for ``condition`` while ``loop`` still runs; fail if it never
    holds."""
    deadline = time.monotonic() + 60
    while not condition() and loop.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition(), f"not seen; the loop {'ended' if loop.poll() is not None else 'runs'}"


def test_a_copy_that_cannot_be_written_is_an_error_of_the_pass_and_the_loop_goes_on(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """StateDir/siteview/ not root's (refused, rightly): the RefusedError ended the command,
    so a --loop service stopped lifting holds at its first such pass, and one pass's own
    actions went unsaid."""
    fake, base = site
    held(fake, base)
    snapshot = group_conf(base, monkeypatch, GROUP.gr_name)
    snapshot.parent.mkdir(mode=0o750)
    os.chown(snapshot.parent, USER.pw_uid, USER.pw_gid)
    code, out, err = admin_cmd(base, "release-service")
    assert code == 1, out + err
    assert err == (
        f"dispatch-admin: site view not written: {snapshot.parent} is owned by "
        f"uid {USER.pw_uid}, not root: the site view is not written there; "
        "remove it\n"
    ), err
    with serving(base) as (loop, log):
        until(lambda: log.read_text().count("site view not written") >= 2, loop)
        assert loop.poll() is None, log.read_text()  # still serving


def test_a_record_name_cannot_draw_a_row_of_another_users_in_the_table(
    site: tuple[FakeCluster, Path],
) -> None:
    """A hostile user names a record folder with a newline and columns of their choosing: the
    table root and the group read showed a second row, a hold 'of alice' that is no one's."""
    fake, base = site
    job, ended, held_id = held(fake, base)
    forged = "dk3m9x2a\nalice    dq2bxk7m 4711 2026-12-03T14:02:11 23:41:07 4700+0 ceased"
    os.rename(job.path, Path(job.path).parent / forged)
    code, out, err = admin_cmd(base, "holds")
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == "nobody", out
    assert "dk3m9x2a\\nalice" in lines[1], out
    code, out, err = admin_cmd(base, "holds", "--json")
    assert json.loads(out)["holds"][0]["dispatch_job"] == forged  # JSON keeps it as it is


def test_a_copy_written_ahead_of_the_readers_clock_is_not_taken_for_fresh(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release service's host with its clock ahead: its copies' age read negative, so a
    copy the service stopped writing looked fresh for as long as that clock was ahead."""
    fake, base = site
    held(fake, base)
    snapshot = group_conf(base, monkeypatch, GROUP.gr_name)
    seen = siteview.view(siteview.users(["nobody"], f"{base}/%u")[0])
    siteview.write_snapshot(str(snapshot.parents[1]), GROUP, seen, time.time() + 3600)
    code, out, err = as_nobody("holds", "--noheader")
    assert code == 1, err
    assert out.split()[0] == "nobody"
    assert ": written ahead of this host's clock (by 0" in err, err  # 00:59:59 or 01:00:00
    assert (
        "or so): the release service's host and this one disagree on the time, so how old "
        "it is is not known"
    ) in err, err


def test_a_user_who_stops_their_child_holds_up_no_one_else(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child reading a user's records runs as that user, who may SIGSTOP it:
    its alarm stayed pending and root's pass waited on it for ever, so no other user's
    hold was lifted.  Root's parent keeps the bound: that user alone is reported, the others
    are served."""
    import signal as signals

    from .test_account import rescued

    fake, base = site
    stopped_job, _, _ = held(fake, base)
    job, _, held_id = held(fake, base, OTHER_USER)
    site_conf(base, monkeypatch)
    # Short, but daemon's children (a read, a release through scontrol) finish in it, loaded too.
    monkeypatch.setattr(siteview, "CHILD_TIMEOUT", 6.0)
    reads = siteview.standing

    def stopping(home: str) -> dict[str, object]:
        if os.getuid() == USER.pw_uid:  # nobody's child, stopped by nobody
            os.kill(os.getpid(), signals.SIGSTOP)
        return reads(home)

    monkeypatch.setattr(siteview, "standing", stopping)
    result, took = rescued(
        lambda: CliRunner().invoke(
            admin.main,
            [
                "release-service",
                "--user",
                "nobody",
                "--user",
                OTHER_USER.pw_name,
                "--records",
                f"{base}/%u",
            ],
        )
    )
    assert took < 40, took
    assert isinstance(result, Result), result  # not what invoke raised
    assert result.exit_code == 1, result.output
    assert result.stdout == (
        f"{OTHER_USER.pw_name}: {job.id}: hold on Slurm job {held_id} lifted: ceased\n"
    )
    assert result.stderr == (
        f"dispatch-admin: nobody: reading {base}/nobody as nobody: no "
        "answer within 6 s (the child was stopped, or hung): ended with "
        "SIGKILL\n"
    ), result.stderr
    assert [e["event"] for e in stopped_job.events()].count("cessation") == 0


def test_a_site_view_group_that_does_not_resolve_stops_no_pass(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SiteViewGroup naming a group the directory service does not give (gone, or sssd not
    answering for a moment) ended release-service before its pass: no hold
    was lifted.  The pass runs; the copy not written is its error."""
    fake, base = site
    job, _, held_id = held(fake, base)
    site_conf(base, monkeypatch)
    conf = base / "dispatch.conf"
    state = base / "state"
    state.mkdir(mode=0o755)
    conf.write_text(conf.read_text() + f"StateDir={state}\nSiteViewGroup=dispatch-no-such\n")
    code, out, err = admin_cmd(base, "release-service")
    assert code == 1, out + err
    assert out == f"nobody: {job.id}: hold on Slurm job {held_id} lifted: ceased\n"
    assert err == (
        f"dispatch-admin: site view not written: SiteViewGroup=dispatch-no-such "
        f"({conf}): no such group (or the directory service does not answer for "
        "it now)\n"
    ), err
    conf.write_text(f"StateDir={state}\nSiteViewGroup=dispatch-no-such\nCessationSignal=\n")
    code, out, err = admin_cmd(base, "release-service")  # only the copy to write: still a pass
    assert (code, out) == (1, ""), out + err
    assert err.startswith("dispatch-admin: site view not written: SiteViewGroup="), err


def test_a_site_view_group_is_resolved_at_each_write(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --loop service started while the group did not resolve writes the copy once it
    does (a directory service back), with no restart."""
    import subprocess

    fake, base = site
    held(fake, base)
    name = f"dsv{os.getpid()}"
    snapshot = group_conf(base, monkeypatch, name)
    try:
        with serving(base) as (loop, log):
            until(lambda: "no such group" in log.read_text(), loop)
            subprocess.run(["groupadd", name], check=True)
            until(snapshot.exists, loop)
        assert snapshot.stat().st_gid == grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False)


# -- evidence never crosses users ------------------------------------------------------------

SECRET_SIGNAL = """#!{python}
# A CessationSignal as dispatch-cease answers: not ceased, naming whose facts it judged (the
# owner in the test's table of owners, unless told otherwise) and a survivor whose command
# line holds that user's secret.  Each question is logged.
import json, sys
job = sys.argv[1]
with open({asked!r}, "a") as out:
    out.write(job + "\\n")
owners = {{j["JobId"]: int(j["UserId"]) for j in json.load(open({table!r}))}}
uid = {judged!r} if {judged!r} is not None else owners.get(job)
print(json.dumps({{"job_id": job, "uid": uid, "ceased": False, "nodes": [{{
    "node": "n1", "survivors": [{{"pid": 4242, "cmdline": f"train.py --token SECRET-{{uid}}"}}]
}}]}}))
sys.exit(1)
"""


def secret_signal(base: Path, monkeypatch: pytest.MonkeyPatch, judged: object = None) -> Path:
    """The site's dispatch.conf with :data:`SECRET_SIGNAL` as CessationSignal; the log of the
    jobs it was asked about."""
    site_conf(base, monkeypatch)
    asked = base / "asked.log"
    asked.touch()
    signal = base / "cease-secret"
    owners = base / "owners.json"  # whose each job is, kept from what the controller says now
    owners.write_text((base / "slurm-jobs.json").read_text())
    signal.write_text(
        SECRET_SIGNAL.format(
            python=sys.executable, asked=str(asked), table=str(owners), judged=judged
        )
    )
    signal.chmod(0o755)
    (base / "dispatch.conf").write_text(
        f"CessationSignal={signal}\nSlurmBackend=cli\nStateDir={base / 'state'}\n"
    )
    (base / "state").mkdir(mode=0o755, exist_ok=True)
    return asked


def names_in_hold(job: record.JobRecord, ended: str) -> None:
    """The record's owner rewrites its hold to wait for Slurm job ``ended`` (the file is
    theirs to write)."""
    for name in (Path(job.path) / "events").iterdir():
        event = json.loads(name.read_text())
        if event["event"] == "hold":
            event["ended_slurm_job_id"] = ended
            name.write_text(json.dumps(event, sort_keys=True) + "\n")
            return
    raise AssertionError("no hold")


def everything_in(home: Path) -> str:
    return "".join(p.read_text() for p in home.rglob("*.json"))


@pytest.mark.parametrize("known_by", ["controller", "facts"])
def test_the_release_service_asks_only_about_a_users_own_jobs(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch, known_by: str
) -> None:
    """With facts/ 0700, nobody rewrote their hold to name daemon's Slurm job: root's pass asked
    the CessationSignal about it and recorded the whole answer (nodes, survivors' command
    lines, the secrets in them) in nobody's record.  Root asks only about a job whose user,
    as the controller (else Slurm's accounting, else the facts the hooks filed by the job's
    own uid) says, is the record's; daemon's own hold is asked about as before."""
    from slurm_dispatch.node import factstore

    fake, base = site
    mine, _, _ = held(fake, base)
    theirs, their_ended, their_held = held(fake, base, OTHER_USER)
    asked = secret_signal(base, monkeypatch)
    if known_by == "facts":  # the controller forgot the job; the hooks filed it under daemon
        (base / "slurm-jobs.json").write_text("[]")
        factstore.write_fact(
            str(base / "state"),
            OTHER_USER.pw_uid,
            OTHER_USER.pw_gid,
            their_ended,
            "start",
            "n1",
            {"restart": 0},
        )
    names_in_hold(mine, their_ended)
    result = CliRunner().invoke(
        admin.main,
        [
            "release-service",
            "--user",
            "nobody",
            "--user",
            OTHER_USER.pw_name,
            "--records",
            f"{base}/%u",
        ],
    )
    assert result.exit_code == 0, result.output
    assert asked.read_text().splitlines() == [their_ended]  # for daemon's hold only
    said = [e for e in mine.events() if e["event"] == "cessation"]
    assert [(e["ended_slurm_job_id"], e["verdict"]) for e in said] == [(their_ended, "error")]
    source = {
        "controller": "the controller says",
        "facts": f"the facts under {base / 'state'} say",
    }[known_by]
    assert said[0]["evidence"] == (
        f"Slurm job {their_ended} is not nobody's, as {source}: not "
        "asked; the site's release service asks only about a user's "
        "own jobs"
    ), said[0]
    assert "SECRET" not in everything_in(base / "nobody")
    assert str(OTHER_USER.pw_uid) not in json.dumps(said[0]["evidence"])  # nor whose it is
    shown = [e for e in theirs.events() if e["event"] == "cessation"]
    assert [(e["ended_slurm_job_id"], e["verdict"]) for e in shown] == [(their_ended, "not ceased")]
    assert f"SECRET-{OTHER_USER.pw_uid}" in json.dumps(shown[0]["evidence"])


def test_a_job_no_part_of_slurm_knows_is_not_asked_about(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, base = site
    mine, ended, _ = held(fake, base)
    asked = secret_signal(base, monkeypatch)
    (base / "slurm-jobs.json").write_text("[]")
    code, out, err = admin_cmd(base, "release-service")
    assert (code, err) == (0, ""), err
    assert asked.read_text() == ""
    said = [e for e in mine.events() if e["event"] == "cessation"]
    assert [(e["ended_slurm_job_id"], e["verdict"]) for e in said] == [(ended, "error")]
    assert "whose job it is" in said[0]["evidence"], said[0]


def test_an_answer_judged_from_another_users_facts_is_not_recorded(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller says the job is nobody's, but the signal judged daemon's facts (a job id
    used twice): its evidence is daemon's, and stays out of nobody's record."""
    fake, base = site
    mine, ended, _ = held(fake, base)
    asked = secret_signal(base, monkeypatch, judged=OTHER_USER.pw_uid)
    code, out, err = admin_cmd(base, "release-service")
    assert (code, err) == (0, ""), err
    assert asked.read_text().splitlines() == [ended]
    said = [e for e in mine.events() if e["event"] == "cessation"]
    assert [(e["ended_slurm_job_id"], e["verdict"]) for e in said] == [(ended, "error")]
    assert "SECRET" not in everything_in(base / "nobody")
    assert "another user's" in said[0]["evidence"], said[0]


@pytest.mark.parametrize("down", ["controller", "slurmdbd"])
def test_whose_job_it_is_when_part_of_slurm_does_not_answer(
    site: tuple[FakeCluster, Path], monkeypatch: pytest.MonkeyPatch, down: str
) -> None:
    """A controller that does not answer leaves unknown who holds the job id now: not asked,
    said so.  Accounting that does not answer (slurmdbd down) for a job the controller forgot
    leaves the facts the hooks filed to say whose it was."""
    from slurm_dispatch.node import factstore

    fake, base = site
    mine, ended, _ = held(fake, base)
    asked = secret_signal(base, monkeypatch)
    monkeypatch.setenv("DISPATCH_SLURM_ATTEMPTS", "1")
    if down == "controller":
        (base / "slurm-jobs.json.down").touch()
    else:
        (base / "slurm-jobs.json").write_text("[]")
        (base / "slurmdbd.down").touch()
        factstore.write_fact(
            str(base / "state"), USER.pw_uid, USER.pw_gid, ended, "start", "n1", {"restart": 0}
        )
    code, out, err = admin_cmd(base, "release-service")
    assert (code, err) == (0, ""), err
    said = [e for e in mine.events() if e["event"] == "cessation"]
    if down == "controller":
        assert asked.read_text() == ""
        assert said[0]["verdict"] == "error", said
        assert said[0]["evidence"].startswith(
            f"whose job Slurm job {ended} is cannot be learnt now ("
        ), said
        assert "Unable to contact slurm controller" in said[0]["evidence"], said
    else:
        assert asked.read_text().splitlines() == [ended]
        assert said[0]["verdict"] == "not ceased", said
