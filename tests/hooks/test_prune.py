"""Retention of facts/ (docs/admin-guide.md): ``dispatch-admin prune`` removes what nothing needs
and is made to try to remove what something does: a job not proven gone, a fact being written,
a symlink a user planted, a hold standing in a user's record, records it cannot read, survivors
still watched, and facts newer than the retention.  Needs root (a root-owned StateDir)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import admin
from slurm_dispatch.control import retention
from slurm_dispatch.node import factstore

from ..fakes.hooks import dying_after, record, state_dir

UID = 1000


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the prune tests need root (a root-owned StateDir)")


def clean_job(
    state: str, job_id: str, uid: int = UID, ctld: Optional[dict[str, str]] = None, **start: str
) -> None:
    """A job whose every execution is proven gone; ``start`` adds to the nodes' starts and
    ``ctld`` (default: the same) to the controller's."""
    for node in ("n1", "n2"):
        start_name = record(state, "start", node, job_id, uid, time=1.0, restart=0, **start)
        factstore.write_fact(
            state,
            uid,
            uid,
            job_id,
            "end",
            node,
            {"time": 2.0, "restart": 0, "survivors": [], "scan_error": None},
            token=start_name.rpartition(".")[2],
        )
    ctld_name = record(
        state,
        "ctld-start",
        "slurmctld",
        job_id,
        uid,
        time=1.0,
        restart=0,
        **(start if ctld is None else ctld),
    )
    record(
        state,
        "ctld-end",
        "slurmctld",
        job_id,
        uid,
        time=2.0,
        restart=0,
        start_token=ctld_name.rpartition(".")[2],
    )


def prune(
    tmp_path: Path,
    *args: str,
    needs: Optional[Mapping[int, Optional[set[str]]]] = None,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str]:
    monkeypatch.setattr(retention, "user_needs", lambda uid, pattern: (needs or {}).get(uid, set()))
    conf = tmp_path / "dispatch.conf"
    if not conf.exists():
        conf.write_text(f"StateDir={tmp_path / 'state'}\n")
    done = CliRunner().invoke(admin.main, ["prune", "--config", str(conf), *args])
    return done.exit_code, done.output


@pytest.fixture
def state(tmp_path: Path) -> str:
    path = tmp_path / "state"
    path.mkdir(mode=0o755)
    return str(path)


def folder(state: str, job_id: str, uid: int = UID) -> Path:
    return Path(state) / "facts" / str(uid) / job_id


def test_a_proven_job_goes_after_a_dry_run_that_removes_nothing(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_job(state, "100")
    code, out = prune(tmp_path, "--older-than", "0", "--dry-run", monkeypatch=monkeypatch)
    assert code == 0, out
    assert "would remove facts/1000/100 (6 facts" in out
    assert out.splitlines()[-1].startswith("would remove 1 job folders (6 facts")
    assert len(list(folder(state, "100").iterdir())) == 6
    code, out = prune(tmp_path, "--older-than", "0", monkeypatch=monkeypatch)
    assert code == 0 and "removed facts/1000/100 (6 facts" in out, out
    assert not folder(state, "100").exists()


def test_progress_is_said_every_thousand_folders_judged(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.node import prune as prune_module

    def plan(state_dir: str, keep_for: float, needed: object) -> list[prune_module.Judged]:
        judged = [prune_module.Judged(str(UID), str(job)) for job in range(2500)]
        for one in judged:
            one.reason, one.detail = "recent", "newer than the retention"
        return judged

    monkeypatch.setattr(prune_module, "plan", plan)
    done = CliRunner().invoke(
        admin.main, ["prune", "--config", str(_conf(tmp_path)), "--older-than", "0"]
    )
    assert done.exit_code == 0, done.output
    assert done.stderr.splitlines() == [
        "dispatch-admin prune: 1000 job folders judged",
        "dispatch-admin prune: 2000 job folders judged",
    ]
    assert done.stdout.splitlines() == [
        f"removed 0 job folders (0 facts, 0 bytes) older than 0 s under {state}/facts; "
        "kept 2500: 2500 recent"
    ]


def test_a_dispatch_conf_with_problems_is_refused(tmp_path: Path, state: str) -> None:
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"StateDir={state}\nFactRetention=soon\n")
    done = CliRunner().invoke(admin.main, ["prune", "--config", str(conf)])
    assert done.exit_code == 2 and "FactRetention" in done.output, done.output
    assert "soon" in done.output


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"StateDir={tmp_path / 'state'}\n")
    return conf


def test_what_is_still_needed_is_kept_and_says_why(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node's start with no end: its execution is not proven gone.
    record(state, "start", "n1", "201", time=1.0, restart=0)
    # Survivors found and never since found gone.
    start = record(state, "start", "n1", "202", time=1.0, restart=0)
    factstore.write_fact(
        state,
        UID,
        UID,
        "202",
        "end",
        "n1",
        {
            "time": 2.0,
            "restart": 0,
            "scan_error": None,
            "survivors": [{"pid": 7, "cmdline": "sleep 600"}],
        },
        token=start.rpartition(".")[2],
    )
    # The same, then a re-check found them gone: proven, so it goes.
    start = record(state, "start", "n1", "203", time=1.0, restart=0)
    end = factstore.write_fact(
        state,
        UID,
        UID,
        "203",
        "end",
        "n1",
        {"time": 2.0, "restart": 0, "scan_error": None, "survivors": [{"pid": 7}]},
        token=start.rpartition(".")[2],
    )
    record(
        state,
        "recheck",
        "n1",
        "203",
        time=3.0,
        restart=0,
        survivors=[],
        end_token=end.rpartition(".")[2],
    )
    # The controller saw it start and never end (still running, or its end was lost).
    record(state, "ctld-start", "slurmctld", "204", time=1.0, restart=0)
    # A fact being written: created under its name, not whole yet.
    clean_job(state, "205")
    name = factstore.write_fact(state, UID, UID, "205", "recheck", "n1", {"time": 3.0})
    (folder(state, "205") / name).write_bytes(b'{"kind": "rech')
    # A hold standing in the user's record, and a job of an unsettled record.
    clean_job(state, "206")
    clean_job(state, "207")
    # Survivors a machine still watches.
    clean_job(state, "208")
    watch = Path(state) / "watch" / "host1"
    watch.mkdir(parents=True, mode=0o700)
    (watch / f"{UID}.208.{factstore.new_token()}").write_text("{}")
    # A user whose records cannot be read keeps everything.
    clean_job(state, "300", uid=2000)
    code, out = prune(
        tmp_path,
        "--older-than",
        "0",
        "-v",
        monkeypatch=monkeypatch,
        needs={UID: {"206", "207"}, 2000: None},
    )
    assert code == 0, out
    said = {line.split()[1]: line for line in out.splitlines() if line.startswith("kept ")}
    assert "not proven ceased (node n1 recorded a start and no end)" in said["facts/1000/201:"]
    assert "recorded survivors not since found gone" in said["facts/1000/202:"]
    assert (
        "not proven ceased (the controller recorded a start and no end)" in said["facts/1000/204:"]
    )
    assert "not readable" in said["facts/1000/205:"]
    assert "needed by a record" in said["facts/1000/206:"]
    assert "needed by a record" in said["facts/1000/207:"]
    assert "watched" in said["facts/1000/208:"]
    assert "records unreadable" in said["facts/2000/300:"]
    assert "removed facts/1000/203 (3 facts" in out
    for job_id in ("201", "202", "204", "205", "206", "207", "208"):
        assert folder(state, job_id).is_dir(), job_id
    assert folder(state, "300", uid=2000).is_dir()
    assert not folder(state, "203").exists()
    assert out.splitlines()[-1].endswith(
        "kept 8: 2 needed by a record, 3 not proven ceased, 1 not readable, "
        "1 records unreadable, 1 watched"
    )


def test_an_array_tasks_folder_is_needed_by_its_task_and_its_array(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's facts are filed under its own job id; records name the array (A, a record
    not settled) and a held task (A_T).  The start facts' array fields tie them."""

    def task(job_id: str, array: str, task: str) -> None:
        clean_job(state, job_id, array_job_id=array, array_task_id=task)

    task("601", "90", "1")  # held as 90_1
    task("602", "91", "2")  # array 91's record is not settled
    task("603", "92", "3")  # another task of array 92, another array, a longer id held
    clean_job(state, "604")  # facts of a hook that did not record arrays: its own id only
    # Only the controller's start says it (a node on an older release).
    clean_job(state, "605", ctld={"array_job_id": "93", "array_task_id": "0"})
    # Values no hook of ours writes are not read as ids.
    task("606", "94x", "1")
    task("607", "95", "1 ")
    needs = {UID: {"90_1", "91", "92_4", "93_3", "923", "94x", "94x_1", "93_0", "95_1 "}}
    code, out = prune(tmp_path, "--older-than", "0", "-v", monkeypatch=monkeypatch, needs=needs)
    assert code == 0, out
    said = {line.split()[1]: line for line in out.splitlines() if line.startswith("kept ")}
    assert set(said) == {"facts/1000/601:", "facts/1000/602:", "facts/1000/605:"}, out
    assert (
        "needed by a record (a standing hold or an unsettled record names its array "
        "task, 90_1)" in said["facts/1000/601:"]
    )
    assert "names its array, 91)" in said["facts/1000/602:"]
    assert "names its array task, 93_0)" in said["facts/1000/605:"]
    for gone in ("603", "604", "606", "607"):
        assert f"removed facts/1000/{gone} (6 facts" in out, gone
        assert not folder(state, gone).exists()


def test_a_planted_symlink_is_neither_followed_nor_removed(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    clean_job(state, "400")
    (folder(state, "400") / "start.n9.0.0000000000000001deadbeef").symlink_to(victim / "precious")
    clean_job(state, "401")
    # A whole job folder replaced by a link to the user's own folder.
    os.rename(folder(state, "401"), tmp_path / "moved")
    folder(state, "401").symlink_to(victim)
    # A folder others may write (a site's chmod slip): not trusted, left alone.
    clean_job(state, "402")
    os.chmod(folder(state, "402"), 0o777)
    code, out = prune(tmp_path, "--older-than", "0", "-v", monkeypatch=monkeypatch)
    assert code == 0, out
    assert (victim / "precious").read_text() == "keep me\n"
    assert folder(state, "400").is_dir() and len(list(folder(state, "400").iterdir())) == 7
    assert "kept facts/1000/400: not ours" in out
    assert folder(state, "401").is_symlink() and "kept facts/1000/401: not ours" in out
    assert folder(state, "402").is_dir() and "kept facts/1000/402: not ours" in out
    assert "removed 0 job folders" in out.splitlines()[-1]


def test_recent_facts_stay_and_a_retention_is_required(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_job(state, "500")
    code, out = prune(tmp_path, monkeypatch=monkeypatch)
    assert code == 2 and "give --older-than DURATION or set FactRetention in" in out, out
    code, out = prune(tmp_path, "--older-than", "soon", monkeypatch=monkeypatch)
    assert code == 2 and "--older-than 'soon' is not a duration" in out, out
    (tmp_path / "dispatch.conf").write_text(f"StateDir={state}\nFactRetention=1-00:00:00\n")
    code, out = prune(tmp_path, "-v", monkeypatch=monkeypatch)
    assert code == 0 and "kept facts/1000/500: recent" in out, out
    assert folder(state, "500").is_dir()


def test_admin_records_default() -> None:
    # dispatch-admin spells the users' record home itself (it loads no control side before a
    # command needs it): the same default the site view reads.
    from slurm_dispatch.control import siteview

    assert admin.DEFAULT_RECORDS == siteview.DEFAULT_RECORDS


def test_facts_from_a_clock_ahead_are_kept_and_said_to_be_from_the_future(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a node booted with its clock a year ahead (an RTC not yet corrected by
    NTP) names its facts by that clock; prune kept them as 'recent' (newer than the
    retention) for a year, counted with the jobs that are merely young, and said no more."""
    import time as time_module

    ahead = time_module.time_ns() + 365 * 86400 * 10**9
    monkeypatch.setattr(time_module, "time_ns", lambda: ahead)
    clean_job(state, "100")
    monkeypatch.undo()
    code, out = prune(tmp_path, "--older-than", "0", "-v", monkeypatch=monkeypatch)
    assert code == 0, out
    kept = [line for line in out.splitlines() if line.startswith("kept facts/1000/100:")]
    assert len(kept) == 1 and kept[0].startswith("kept facts/1000/100: from the future ("), out
    assert "a clock ahead where it was written" in kept[0], kept
    assert out.splitlines()[-1].endswith("kept 1: 1 from the future"), out
    assert folder(state, "100").is_dir()


def test_a_fact_written_between_the_judgement_and_the_removal_stays_with_its_folder(
    state: str,
) -> None:
    """Attack (a fact being written during prune): what was judged goes, a fact the
    hooks wrote after the judgement (a late Epilog, a re-check) stays, and so does its folder."""
    from slurm_dispatch.node import prune as prune_module

    clean_job(state, "100")
    judged = [j for j in prune_module.plan(state, 0, lambda uid: set()) if j.job_id == "100"]
    assert len(judged) == 1 and judged[0].reason is None, judged
    late = record(state, "recheck", "n1", "100", UID, time=3.0, end_token="x", survivors=[])
    assert prune_module.remove(state, judged[0]) == 6
    assert [p.name for p in folder(state, "100").iterdir()] == [late]


def test_a_killed_writers_leftover_goes_with_its_folder_and_never_keeps_it(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hook ended between creating a fact and naming it leaves only ".<name>"
    # (factstore.create_file), which no reader counts: it neither keeps a proven job's folder
    # forever ("not a fact's name") nor stays behind once that folder goes.
    clean_job(state, "100")
    leftover = folder(state, "100") / ".end.n3.0.0000000000000001aaaaaaaa"
    leftover.write_text('{"kind": "end", "no')
    leftover.chmod(0o600)
    code, out = prune(tmp_path, "--older-than", "0", monkeypatch=monkeypatch)
    assert code == 0 and "removed facts/1000/100 (6 facts" in out, out
    assert not folder(state, "100").exists()
    # A recent one may be a writer still at work: its folder stays, and says why.
    clean_job(state, "101")
    young = folder(state, "101") / ".end.n3.0.0000000000000002bbbbbbbb"
    young.write_text("")
    code, out = prune(tmp_path, "--older-than", "3600", monkeypatch=monkeypatch)
    assert code == 0 and folder(state, "101").exists() and young.exists(), out


# -- a prune killed at any point ------------------------------------------------------------
#
# Before the fix, a prune killed after its first unlink left a start's end without its start
# (or the controller's end without its start): every later prune kept the folder as "not
# proven ceased", and dispatch-cease read that execution as unproven.  Now the folder is
# moved out of sight first, and the next prune finishes what a killed one hid.

_KILLED_PRUNE = (
    """
import os, sys
from slurm_dispatch.cli import admin
from slurm_dispatch.control import retention
retention.user_needs = lambda uid, pattern: set()  # the users' records: none needs it
"""
    + dying_after("int(sys.argv[2])", ("rename", "unlink", "rmdir", "link"))
    + """
try:
    admin.main(["prune", "--config", sys.argv[1], "--older-than", "0"])
except SystemExit as done:
    os._exit(done.code or 0)
"""
)


def _visible(state: str) -> list[str]:
    found, problems = factstore.read_job_facts(state, UID, "100")
    assert problems == [], problems
    return sorted(f"{f['kind']}.{f['node']}" for f in found)


def _hidden(state: str) -> list[str]:
    user = Path(state) / "facts" / str(UID)
    return sorted(p.name for p in user.iterdir() if p.name.startswith(".")) if user.exists() else []


def test_a_prune_killed_at_any_point_leaves_what_was_proven_proven(tmp_path: Path) -> None:
    import subprocess
    import sys

    whole = [
        "ctld-end.slurmctld",
        "ctld-start.slurmctld",
        "end.n1",
        "end.n2",
        "start.n1",
        "start.n2",
    ]
    step = 1
    while True:
        base = tmp_path / f"step{step}"
        base.mkdir()
        state, _ = state_dir(base)
        clean_job(state, "100")
        conf = base / "dispatch.conf"
        conf.write_text(f"StateDir={state}\n")
        killed = subprocess.run(
            [sys.executable, "-c", _KILLED_PRUNE, str(conf), str(step)],
            text=True,
            capture_output=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
        assert killed.returncode in (0, 3), killed.stderr
        # Whatever a reader (dispatch-cease) sees is the folder whole or nothing at all:
        # never an end without its start.
        assert _visible(state) in (whole, []), (step, _visible(state))
        # The next prune finishes it: nothing left, in sight or hidden.
        again = CliRunner().invoke(
            admin.main, ["prune", "--config", str(conf), "--older-than", "0"]
        )
        assert again.exit_code == 0, again.output
        assert _visible(state) == [] and _hidden(state) == [], (step, again.output)
        assert not folder(state, "100").exists(), step
        if killed.returncode == 0:
            break
        step += 1
    assert step > 7  # the hiding, each of the six unlinks and the removal


class _Killed(Exception):
    pass


def _prune_with_a_late_fact(state: str, kill_at: Optional[int]) -> list[str]:
    """Prune job 100 while a late Epilog, which opened the job's folder before prune hid it,
    names a fact there; prune ends (an exception) after its ``kill_at``-th change, and the
    next one finishes.  Returns the late fact's name."""
    from slurm_dispatch.node import prune as prune_module

    [judged] = [j for j in prune_module.plan(state, 0, lambda uid: set()) if j.job_id == "100"]
    late: list[str] = []
    steps = [0]

    def step(where: str) -> None:
        steps[0] += 1
        if where == "hidden":
            [hidden] = _hidden(state)
            name = factstore.fact_name("recheck", "n1", 0, factstore.new_token())
            path = Path(state) / "facts" / str(UID) / hidden / name
            path.write_text('{"kind": "recheck"}\n')
            path.chmod(0o640)
            late.append(name)
        if steps[0] == kill_at:
            raise _Killed(where)

    try:
        prune_module.remove(state, judged, step=step)
    except _Killed:
        assert _hidden(state) and not folder(state, "100").exists()
        [finish] = [j for j in prune_module.plan(state, 0, lambda uid: set()) if j.hidden]
        assert finish.job_id == "100" and late[0] not in finish.names
        prune_module.remove(state, finish)
    return late


def test_a_fact_written_into_a_hidden_folder_is_put_back_even_after_a_kill(state: str) -> None:
    """A late Epilog that opened the job's folder before prune hid it names its fact there.
    Prune puts it back in sight; when prune was killed before it could, the next one does."""
    for kill_at in (None, 3):
        clean_job(state, "100")
        late = _prune_with_a_late_fact(state, kill_at)
        assert [p.name for p in folder(state, "100").iterdir()] == late, kill_at
        assert _hidden(state) == []
        for path in folder(state, "100").iterdir():
            path.unlink()
        folder(state, "100").rmdir()
