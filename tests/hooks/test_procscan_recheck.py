"""The Epilog and the re-check with real survivors: keyed by execution, not by job; a watch
entry of another machine with the same host name is left alone; a scan that cannot read a
process names it rather than losing the record.

The hooks' handlers run in this process (as the hook's forked child runs them), with Slurm's
variables set as Slurm sets them; the survivors are real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurm_dispatch.config import Config
from slurm_dispatch.hooks import evidence as work
from slurm_dispatch.node import facts

from ..fakes.hooks import dying_after, state_dir

if TYPE_CHECKING:
    from slurm_dispatch.node.executions import NodeFacts

UID = os.getuid()


def _job() -> str:
    return f"6{os.getpid()}{time.monotonic_ns() % 10000}"


@pytest.fixture()
def cfg(tmp_path: Path) -> Config:
    return state_dir(tmp_path)[1]


@pytest.fixture()
def spawned() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def survivor(
    procs: list[subprocess.Popen], job: str, node: str, restart: int, user: int | None = None
) -> int:
    """A process of the job left on ``node`` (as ``user`` when given: the tests run as root)."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job, "SLURMD_NODENAME": node}
    if restart:
        env["SLURM_RESTART_COUNT"] = str(restart)
    proc = subprocess.Popen(
        ["sleep", "300"],
        env=env,
        start_new_session=True,
        user=user,
        group=user,
        extra_groups=None if user is None else [],
    )
    procs.append(proc)
    deadline = time.monotonic() + 5
    while b"SLURM_JOB_ID" not in Path(f"/proc/{proc.pid}/environ").read_bytes():
        assert time.monotonic() < deadline, "sleep did not exec"
        time.sleep(0.01)
    return proc.pid


def hook(
    monkeypatch: pytest.MonkeyPatch,
    cfg: Config,
    kind: str,
    job: str = "",
    node: str = "",
    restart: int = 0,
) -> None:
    for name in list(os.environ):
        if name.startswith("SLURM"):
            monkeypatch.delenv(name)
    if kind != "recheck":
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_UID", str(UID))
        monkeypatch.setenv("SLURM_JOB_GID", str(os.getgid()))
        monkeypatch.setenv("SLURMD_NODENAME", node)
        monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", str(restart))
    work.HANDLERS[kind](cfg)


def node_view(cfg: Config, job: str) -> dict[tuple[int, str], NodeFacts]:
    return {
        (e["restart"], name): n
        for e in facts.execution_facts(job, cfg.state_dir, UID)
        for name, n in e["nodes"].items()
    }


def test_recheck_keys_survivors_by_execution(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    first = survivor(spawned, job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    hook(monkeypatch, cfg, "prolog", job, "n2", 1)
    second = survivor(spawned, job, "n2", 1)
    hook(monkeypatch, cfg, "epilog", job, "n2", 1)
    view = node_view(cfg, job)
    assert [s["pid"] for s in view[(0, "n1")]["survivors"]] == [first]
    assert [s["pid"] for s in view[(1, "n2")]["survivors"]] == [second]
    # The first execution's survivor goes; the second's still runs.
    os.kill(first, signal.SIGKILL)
    spawned[0].wait()
    hook(monkeypatch, cfg, "recheck")
    view = node_view(cfg, job)
    assert view[(0, "n1")]["ceased"] is True
    assert view[(1, "n2")]["ceased"] is False, view[(1, "n2")]
    assert [s["pid"] for s in view[(1, "n2")]["survivors"]] == [second]
    os.kill(second, signal.SIGKILL)
    spawned[1].wait()
    hook(monkeypatch, cfg, "recheck")
    assert node_view(cfg, job)[(1, "n2")]["ceased"] is True


def test_a_later_epilog_of_the_same_job_settles_its_earlier_executions(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    first = survivor(spawned, job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    os.kill(first, signal.SIGKILL)
    spawned[0].wait()
    hook(monkeypatch, cfg, "prolog", job, "n2", 1)
    hook(monkeypatch, cfg, "epilog", job, "n2", 1)
    view = node_view(cfg, job)
    assert view[(0, "n1")]["ceased"] is True and view[(1, "n2")]["ceased"] is True


def _watch_entries(cfg: Config) -> list[Path]:
    return sorted((Path(cfg.state_dir) / "watch").rglob("*.*.*"))


def _age_entries(cfg: Config) -> None:
    """Make every watch entry older than HookTimeout, as a re-check a while later sees it."""
    for path in _watch_entries(cfg):
        if not path.name.startswith("."):
            entry = json.loads(path.read_text())
            entry["time"] -= 2 * cfg.hook_timeout
            path.write_text(json.dumps(entry))


def test_a_watch_entry_of_another_machine_with_this_host_name_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    survivor(spawned, job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    [entry] = _watch_entries(cfg)
    # The same host name, another machine (another boot id, up since before the entry): its
    # survivors are not in this machine's /proc, and it did not reboot.
    record = json.loads(entry.read_text())
    record["boot_id"] = "00000000-another-machine"
    record["survivors"] = [dict(record["survivors"][0], pid=999_999_999)]
    entry.write_text(json.dumps(record))
    hook(monkeypatch, cfg, "recheck")
    view = node_view(cfg, job)
    assert view[(0, "n1")]["ceased"] is False and view[(0, "n1")]["recheck"] is None
    assert _watch_entries(cfg) == [entry]


def test_the_epilog_counts_the_jobs_cgroup_whatever_the_environment(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list, tmp_path: Path
) -> None:
    job = _job()
    # A process that scrubbed its environment: only the job's cgroup (proctrack/cgroup) has it.
    scrubbed = subprocess.Popen(["sleep", "300"], env={"PATH": "/usr/bin:/bin"})
    spawned.append(scrubbed)
    step = tmp_path / "cgroup/system.slice/n1_slurmstepd.scope" / f"job_{job}/step_batch/user"
    step.mkdir(parents=True)
    (step / "cgroup.procs").write_text(f"{scrubbed.pid}\n")
    cfg.cgroup_root = str(tmp_path / "cgroup")
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    node = node_view(cfg, job)[(0, "n1")]
    assert node["ceased"] is False
    assert [(s["pid"], s["source"]) for s in node["survivors"]] == [(scrubbed.pid, "cgroup")]
    # Once the cgroup is empty (and the process gone), the re-check records them gone.
    scrubbed.kill()
    scrubbed.wait()
    (step / "cgroup.procs").write_text("")
    hook(monkeypatch, cfg, "recheck")
    assert node_view(cfg, job)[(0, "n1")]["ceased"] is True


class _Killed(BaseException):
    """The hook ended where it stands (its watchdog's os._exit, the parent's SIGKILL)."""


def test_a_recheck_killed_while_it_renews_a_watch_entry_keeps_the_execution_watched(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # One of two survivors goes: the re-check records it and renews the entry with the one
    # left.  Ended between dropping the old entry and writing the new one, it watched nothing
    # more: the last survivor's end was never recorded, and the execution never proven.
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    first = survivor(spawned, job, "n1", 0)
    survivor(spawned, job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    assert len(_watch_entries(cfg)) == 1
    os.kill(first, signal.SIGKILL)
    spawned[0].wait()

    def killed(*args: object) -> None:
        raise _Killed()

    with monkeypatch.context() as patch:
        patch.setattr(work, "_add_watch", killed)
        with pytest.raises(_Killed):
            hook(monkeypatch, cfg, "recheck")
    assert _watch_entries(cfg), "nothing watches the survivor left"
    spawned[1].kill()
    spawned[1].wait()
    hook(monkeypatch, cfg, "recheck")
    assert node_view(cfg, job)[(0, "n1")]["ceased"] is True
    assert _watch_entries(cfg) == []


def test_an_epilog_killed_between_its_end_and_its_watch_entry_never_records_survivors_unwatched(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # The Epilog records the end with its survivors and a watch entry for them.  Ended after
    # the first of the two, it must never leave an end with survivors nothing re-checks (it
    # did: the end first, so the survivors' going was never recorded, the execution never
    # proven).  Whichever it writes first, the second is where it dies here.
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    survivor(spawned, job, "n1", 0)
    done: list[str] = []

    def second_dies(call, what):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            if what == "watch" or args[4] == "end":
                if done:
                    raise _Killed()
                done.append(what)
            return call(*args, **kwargs)

        return wrapper

    with monkeypatch.context() as patch:
        patch.setattr(work, "_add_watch", second_dies(work._add_watch, "watch"))
        patch.setattr(work.store, "write_fact", second_dies(work.store.write_fact, "end"))
        with pytest.raises(_Killed):
            hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    spawned[0].kill()
    spawned[0].wait()
    _age_entries(cfg)  # a re-check waits out an entry's Epilog, which may be at work
    hook(monkeypatch, cfg, "recheck")
    node = node_view(cfg, job).get((0, "n1"))
    assert node is None or node["end"] is None or node["ceased"] is True, node
    assert _watch_entries(cfg) == []


def test_an_epilog_whose_watch_entry_cannot_be_written_still_records_its_end(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # The watch entry is written before the end: one refused (a full watch/, say) must not
    # cost the end and the survivors it names.
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    pid = survivor(spawned, job, "n1", 0)

    def refused(*args: object) -> None:
        raise facts.FactError("cannot create .../watch/x: No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(work, "_add_watch", refused)
        with pytest.raises(facts.FactError, match="No space"):
            hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    node = node_view(cfg, job)[(0, "n1")]
    assert node["end"] is not None and [s["pid"] for s in node["survivors"]] == [pid]


def test_an_end_no_start_ties_never_closes_a_start_recorded_after_it(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # An Epilog that finds no open start of its node (a second Epilog of an ended start: a
    # part installed twice, say; or a start its Prolog never wrote) records an end tied to no
    # start, under the count Slurm gives it: after a requeue, 24.11's Epilog is given the
    # *next* count.  That end was filed under execution 1 before execution 1 started, and was
    # taken as the post-kill record of execution 1's start on n1: with n1 cut off from the
    # controller (its Epilog never runs, its processes run on), dispatch-cease said "ceased".
    from slurm_dispatch.node import cease

    from ..fakes.hooks import FakeController, node
    from ..fakes.hooks import job as slurm_job

    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 1)  # the same Epilog again, the next count
    hook(monkeypatch, cfg, "prolog", job, "n1", 1)
    pid = survivor(spawned, job, "n1", 1)  # execution 1 runs on; n1 records no end of it
    ctl = FakeController(
        slurm_job(
            job, state="NODE_FAIL", restarts=1, uid=UID, start=time.time() - 5, end=time.time()
        ),
        {"n1": node("n1", state="DOWN+NOT_RESPONDING")},
    )
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert verdict.restart == 1
    assert not verdict.ceased, (pid, cease.render(verdict))


def test_an_end_no_start_ties_never_proves_an_execution_the_controller_started_after_it(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # As above, where execution 1's Prolog on n1 recorded nothing either (ended at its
    # HookTimeout on a slow StateDir): the controller's start of execution 1, recorded after
    # that end, names n1, and an end older than the execution is none of its.
    from slurm_dispatch.node import cease

    from ..fakes.hooks import FakeController, node
    from ..fakes.hooks import job as slurm_job
    from .test_controller_facts import controller_hook

    job = _job()
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 0, "n1")
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    hook(monkeypatch, cfg, "epilog", job, "n1", 1)  # the same Epilog again, the next count
    controller_hook(monkeypatch, cfg, "epilog-slurmctld", job, 1, "n1")
    controller_hook(monkeypatch, cfg, "prolog-slurmctld", job, 1, "n1")
    survivor(spawned, job, "n1", 1)  # execution 1 runs on; n1 records neither start nor end
    ctl = FakeController(
        slurm_job(
            job, state="NODE_FAIL", restarts=1, uid=UID, start=time.time() - 5, end=time.time()
        ),
        {"n1": node("n1", state="DOWN+NOT_RESPONDING")},
    )
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert verdict.restart == 1
    assert not verdict.ceased, cease.render(verdict)
    # Execution 0's own end still proves it.
    assert cease.cessation(job, 0, cfg=cfg, controller=ctl, uid=UID).ceased


def test_an_epilog_ended_between_its_watch_entry_and_its_end_is_proven_once_they_are_gone(
    monkeypatch: pytest.MonkeyPatch, cfg: Config, spawned: list
) -> None:
    # The Epilog writes its watch entry, then its end (4c64f89).  Ended in between (its
    # HookTimeout on a slow StateDir), it left survivors watched and no end: the re-check saw
    # them go and recorded it, but tied to no end, and the node had no post-kill record, so
    # the execution was never proven, whatever became of them (a hold waited for a person).
    # The watch entry holds what the end would have said: the re-check records it.
    from slurm_dispatch.node import cease

    from ..fakes.hooks import FakeController, node
    from ..fakes.hooks import job as slurm_job

    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    found = sorted([survivor(spawned, job, "n1", 0), survivor(spawned, job, "n1", 0)])

    def ended(
        state: str, uid: int, gid: int, job_id: str, kind: str, *rest: object, **kwargs: object
    ) -> str:
        if kind == "end":
            raise _Killed()
        return facts.write_fact(state, uid, gid, job_id, kind, *rest, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(work.store, "write_fact", ended)
        with pytest.raises(_Killed):
            hook(monkeypatch, cfg, "epilog", job, "n1", 0)
    assert len(_watch_entries(cfg)) == 1
    ctl = FakeController(slurm_job(job, uid=UID), {"n1": node("n1")})
    spawned[0].kill()
    spawned[0].wait()
    hook(monkeypatch, cfg, "recheck")  # within HookTimeout its Epilog may be writing it still
    assert len(_watch_entries(cfg)) == 1 and node_view(cfg, job)[(0, "n1")]["end"] is None
    _age_entries(cfg)
    hook(monkeypatch, cfg, "recheck")  # one of two gone: the end, then the re-check
    assert not cease.cessation(job, cfg=cfg, controller=ctl, uid=UID).ceased
    spawned[1].kill()
    spawned[1].wait()
    hook(monkeypatch, cfg, "recheck")
    assert _watch_entries(cfg) == []
    view = node_view(cfg, job)[(0, "n1")]
    assert sorted(s["pid"] for s in view["end"]["survivors"]) == found, view
    verdict = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
    assert verdict.ceased, cease.render(verdict)


# An Epilog run as its own process, ended (os._exit, as its watchdog ends it) after its Nth
# write to StateDir: every step of its watch entry and its end in turn.
_DYING_EPILOG = (
    """
import os, sys
from slurm_dispatch.config import Config
from slurm_dispatch.hooks import evidence
cfg = Config()
cfg.state_dir = sys.argv[1]
"""
    + dying_after(
        "int(sys.argv[2])", ("mkdir", "fchown", "fchmod", "write", "rename", "link", "unlink")
    )
    + """
evidence.HANDLERS["epilog"](cfg)
os._exit(0)
"""
)


def _started_with_survivors(
    monkeypatch: pytest.MonkeyPatch, folder: Path, spawned: list, count: int
) -> tuple:
    """A fresh StateDir in ``folder``, a job whose Prolog ran on n1, and ``count`` of its
    processes running there: the (config, job id) a sweep ends its hooks against."""
    folder.mkdir()
    cfg = state_dir(folder)[1]
    job = _job()
    hook(monkeypatch, cfg, "prolog", job, "n1", 0)
    for _ in range(count):
        survivor(spawned, job, "n1", 0)
    return cfg, job


def test_an_epilog_ended_at_any_step_never_proves_a_survivor_and_proves_it_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spawned: list
) -> None:
    # Whatever step it was ended at, a survivor that runs on is never proven gone; once it is
    # gone and re-checked, the execution is proven unless the Epilog left no record at all.
    from slurm_dispatch.node import cease

    from ..fakes.hooks import FakeController, node
    from ..fakes.hooks import job as slurm_job

    repo = str(Path(__file__).parents[2])
    unproven = []
    step = 1
    while True:
        cfg, job = _started_with_survivors(monkeypatch, tmp_path / str(step), spawned, 1)
        epilog = subprocess.run(
            [sys.executable, "-c", _DYING_EPILOG, cfg.state_dir, str(step)],
            env={**os.environ, "PYTHONPATH": repo},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert epilog.returncode in (0, 3), epilog.stderr
        ctl = FakeController(slurm_job(job, uid=UID), {"n1": node("n1")})
        _age_entries(cfg)  # past the entry's HookTimeout
        hook(monkeypatch, cfg, "recheck")
        alive = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
        assert not alive.ceased, (step, cease.render(alive))
        spawned[-1].kill()
        spawned[-1].wait()
        hook(monkeypatch, cfg, "recheck")
        gone = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
        assert [p for p in _watch_entries(cfg) if not p.name.startswith(".")] == [], step
        if not gone.ceased:
            unproven.append(step)
            # Only an Epilog ended before its watch entry or its end was whole: no record.
            assert node_view(cfg, job)[(0, "n1")]["end"] is None, (step, cease.render(gone))
        if epilog.returncode == 0:
            break
        step += 1
    # Unproven only while its watch entry is not yet named (watch/, its host folder, the
    # entry's mode, its bytes): once it is, the end is recorded, by the Epilog or the re-check.
    assert step > 8 and unproven == list(range(1, len(unproven) + 1)) and len(unproven) <= 4, (
        step,
        unproven,
    )


def test_a_recheck_ended_at_any_step_keeps_the_survivor_left_watched_and_proves_it_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spawned: list
) -> None:
    # One of two survivors goes; the re-check that records it (its end where missing, the
    # recheck, the renewed entry, the old one dropped) is ended after each of its writes.
    from slurm_dispatch.node import cease

    from ..fakes.hooks import FakeController, node
    from ..fakes.hooks import job as slurm_job

    program = _DYING_EPILOG.replace('HANDLERS["epilog"]', 'HANDLERS["recheck"]')
    step = 1
    while True:
        cfg, job = _started_with_survivors(monkeypatch, tmp_path / str(step), spawned, 2)
        hook(monkeypatch, cfg, "epilog", job, "n1", 0)
        spawned[-2].kill()
        spawned[-2].wait()
        ended = subprocess.run(
            [sys.executable, "-c", program, cfg.state_dir, str(step)],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ended.returncode in (0, 3), ended.stderr
        ctl = FakeController(slurm_job(job, uid=UID), {"n1": node("n1")})
        hook(monkeypatch, cfg, "recheck")
        alive = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
        assert not alive.ceased, (step, cease.render(alive))
        spawned[-1].kill()
        spawned[-1].wait()
        hook(monkeypatch, cfg, "recheck")
        gone = cease.cessation(job, cfg=cfg, controller=ctl, uid=UID)
        assert gone.ceased, (step, cease.render(gone))
        assert [p for p in _watch_entries(cfg) if not p.name.startswith(".")] == [], step
        if ended.returncode == 0:
            break
        step += 1
    assert step > 5, step
