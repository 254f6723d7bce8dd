"""Cessation evidence against a fake controller: what proves, what does not, and the cost."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from slurm_dispatch.errors import RecordError, UsageError
from slurm_dispatch.node import cease
from slurm_dispatch.node import facts as facts_module

from ..fakes.hooks import FakeController, job, node, record, state_dir

if TYPE_CHECKING:
    from slurm_dispatch.node.factstore import Fact
    from slurm_dispatch.node.procscan import Process

NOW = time.time()


def start_end(
    state: str,
    name: str,
    restart: int = 0,
    survivors: list | None = None,
    t: float = NOW - 100,
    scan_error: str | None = None,
) -> None:
    start = record(state, "start", name, time=t, restart=restart)
    record(
        state,
        "end",
        name,
        time=t + 10,
        restart=restart,
        start_token=start.split(".")[-1],
        survivors=survivors or [],
        scan_error=scan_error,
    )


def test_clean_epilog_on_every_node_proves(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    for n in ("n1", "n2"):
        start_end(state, n)
    ctl = FakeController(job(nodelist="n[1-2]"), {"n1": node("n1"), "n2": node("n2")})
    verdict = cease.cessation("100", cfg=cfg, controller=ctl)
    assert verdict.ceased and verdict.exit_code == 0, cease.render(verdict)
    assert [n.node for n in verdict.nodes] == ["n1", "n2"]
    assert all("no process left after the kill" in n.evidence for n in verdict.nodes)
    assert ctl.calls == [("job", "100"), ("nodes", ["n1", "n2"])]


@pytest.mark.parametrize(
    "state_name", ["RUNNING", "COMPLETING", "PENDING", "SUSPENDED", "CONFIGURING"]
)
def test_a_job_not_ended_is_not_ceased(tmp_path: Path, state_name: str) -> None:
    state, cfg = state_dir(tmp_path)
    start_end(state, "n1")
    verdict = cease.cessation(
        "100", cfg=cfg, controller=FakeController(job(state=state_name), {"n1": node("n1")})
    )
    assert not verdict.ceased and f"JobState={state_name}" in verdict.reason


def test_survivors_are_named_and_do_not_prove(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    survivor = {"pid": 4242, "cmdline": "python train.py", "starttime": 7}
    start_end(state, "n1", survivors=[survivor])
    verdict = cease.cessation("100", cfg=cfg, controller=FakeController(job(), {"n1": node("n1")}))
    assert not verdict.ceased
    assert "pid 4242 (python train.py)" in verdict.nodes[0].evidence
    assert "4242" in cease.render(verdict)
    assert json.loads(json.dumps(verdict.as_json()))["nodes"][0]["survivors"][0]["pid"] == 4242


@pytest.mark.parametrize(
    "survivors, said",
    [
        ([{"pid": 1}], "found 1 survivor(s); all gone"),
        ([{"pid": 1, "unresolved": True}] * 4, "could not read 4 PID(s) by its deadline; all gone"),
        (
            [{"pid": 1}, {"pid": 2, "unresolved": True}],
            "found 1 survivor(s) and could not read 1 PID(s) by its deadline; all gone",
        ),
    ],
)
def test_recheck_that_found_them_gone_proves_and_says_what_the_epilog_saw(
    tmp_path: Path, survivors: list[dict[str, object]], said: str
) -> None:
    # On a loaded node an Epilog's scan that never saw a round without a PID vanishing under
    # it records those PIDs as not known to be gone; the re-check proves the execution ceased.
    # The evidence says which it was: PIDs it could not read are no survivors found.
    state, cfg = state_dir(tmp_path)
    start = record(state, "start", "n1", time=NOW - 100, restart=0)
    end = record(
        state,
        "end",
        "n1",
        time=NOW - 90,
        restart=0,
        start_token=start.split(".")[-1],
        survivors=survivors,
        scan_error=None,
    )
    record(
        state,
        "recheck",
        "n1",
        time=NOW - 50,
        restart=0,
        end_token=end.split(".")[-1],
        survivors=[],
        reason="re-scanned /proc",
    )
    verdict = cease.cessation("100", cfg=cfg, controller=FakeController(job(), {"n1": node("n1")}))
    assert verdict.ceased and said in verdict.nodes[0].evidence, verdict.nodes[0].evidence


def test_down_node_without_record_is_not_proven(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    start_end(state, "n1")
    record(state, "start", "n2", time=NOW - 100, restart=0)
    verdict = cease.cessation(
        "100",
        cfg=cfg,
        controller=FakeController(
            job(nodelist="n[1-2]"),
            {"n1": node("n1"), "n2": node("n2", state="DOWN+NOT_RESPONDING")},
        ),
    )
    assert not verdict.ceased
    assert verdict.nodes[1].evidence.startswith("no post-kill record")
    assert "DOWN+NOT_RESPONDING" in verdict.nodes[1].evidence
    assert "n2" in verdict.reason


def test_reboot_after_the_last_record_proves_and_tolerance_applies(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    cfg.boot_time_tolerance = 5
    record(state, "start", "n1", time=NOW - 100, restart=0)
    record(state, "start", "n2", time=NOW - 100, restart=0)
    ctl = FakeController(
        job(nodelist="n[1-2]", end=NOW - 90),
        {
            "n1": node("n1", boot=NOW - 10),  # well after: proves
            "n2": node("n2", boot=NOW - 88),
        },
    )  # within the tolerance: does not
    verdict = cease.cessation("100", cfg=cfg, controller=ctl)
    assert verdict.nodes[0].proven and "rebooted" in verdict.nodes[0].evidence
    assert not verdict.nodes[1].proven and not verdict.ceased


def test_kill_task_failed_drain_does_not_prove(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    start_end(state, "n1")
    verdict = cease.cessation(
        "100",
        cfg=cfg,
        controller=FakeController(
            job(), {"n1": node("n1", state="IDLE+DRAIN", reason="Kill task failed [root@...]")}
        ),
    )
    assert not verdict.ceased and "Kill task failed" in verdict.nodes[0].evidence


def test_no_record_at_all_is_not_proven(tmp_path: Path) -> None:
    _, cfg = state_dir(tmp_path)
    verdict = cease.cessation("100", cfg=cfg, controller=FakeController(job(), {"n1": node("n1")}))
    assert not verdict.ceased and "no post-kill record" in verdict.nodes[0].evidence


def test_scan_error_does_not_prove(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    start_end(state, "n1", scan_error="cannot scan /proc: Permission denied")
    verdict = cease.cessation("100", cfg=cfg, controller=FakeController(job(), {"n1": node("n1")}))
    assert not verdict.ceased and "could not look for survivors" in verdict.nodes[0].evidence


def test_older_execution_uses_the_controller_allocation(tmp_path: Path) -> None:
    """Restart 0 was requeued off n1 (partitioned); the job now runs as restart 1 on n2."""
    state, cfg = state_dir(tmp_path)
    record(state, "ctld-start", "slurmctld", time=NOW - 300, restart=0, nodes=["n1"])
    record(state, "start", "n1", time=NOW - 299, restart=0)
    record(state, "ctld-end", "slurmctld", time=NOW - 200, restart=0, nodes=["n1"])
    start_end(state, "n2", restart=1)
    ctl = FakeController(
        job(state="RUNNING", restarts=1, nodelist="n2"),
        {"n1": node("n1", state="DOWN+NOT_RESPONDING"), "n2": node("n2")},
    )
    verdict = cease.cessation("100", 0, cfg=cfg, controller=ctl)
    assert [n.node for n in verdict.nodes] == ["n1"] and not verdict.ceased
    # n1 rejoins; its Epilog runs for restart 0 although Slurm's count may say otherwise.
    starts = [
        f for f in (tmp_path / "state/facts/1000/100").iterdir() if f.name.startswith("start.n1.")
    ]
    record(
        state,
        "end",
        "n1",
        time=NOW,
        restart=1,
        survivors=[],
        scan_error=None,
        start_token=starts[0].name.split(".")[-1],
    )
    ctl.node_fields["n1"] = node("n1")
    verdict = cease.cessation("100", 0, cfg=cfg, controller=ctl)
    assert verdict.ceased, cease.render(verdict)
    # The running execution is not ceased.
    assert not cease.cessation("100", 1, cfg=cfg, controller=ctl).ceased


def test_restart_beyond_the_count_and_unknown_job_are_errors(tmp_path: Path) -> None:
    _, cfg = state_dir(tmp_path)
    with pytest.raises(UsageError, match="--restart 3 never ran"):
        cease.cessation("100", 3, cfg=cfg, controller=FakeController(job(), {}))
    with pytest.raises(UsageError, match="unknown to the controller"):
        cease.cessation("100", cfg=cfg, controller=FakeController(None, {}))


def test_purged_job_is_judged_from_records(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    record(state, "ctld-start", "slurmctld", time=NOW - 300, restart=0, nodes=["n1"])
    start_end(state, "n1")
    verdict = cease.cessation(
        "100", cfg=cfg, uid=1000, controller=FakeController(None, {"n1": node("n1")})
    )
    assert verdict.ceased, cease.render(verdict)


def test_never_started_execution_has_ceased(tmp_path: Path) -> None:
    _, cfg = state_dir(tmp_path)
    verdict = cease.cessation(
        "100", cfg=cfg, controller=FakeController(job(state="CANCELLED", nodelist="(null)"), {})
    )
    assert verdict.ceased and "never started" in verdict.reason


def test_512_nodes_cost_two_controller_calls(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    names = [f"n{i}" for i in range(1, 513)]
    for n in names:
        start_end(state, n)
    ctl = FakeController(job(nodelist="n[1-512]"), {n: node(n) for n in names})
    verdict = cease.cessation("100", cfg=cfg, controller=ctl)
    assert verdict.ceased and len(verdict.nodes) == 512
    assert [c[0] for c in ctl.calls] == ["job", "nodes"]


def test_untrusted_fact_is_a_problem_not_evidence(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    start_end(state, "n1", survivors=[{"pid": 9}])
    job_dir = tmp_path / "state/facts/1000/100"
    forged = job_dir / "recheck.n1.ffffffffffffffff00000000"
    forged.write_text(json.dumps({"kind": "recheck", "survivors": [], "node": "n1"}))
    import os

    os.chown(forged, 1000, 1000)
    verdict = cease.cessation("100", cfg=cfg, controller=FakeController(job(), {"n1": node("n1")}))
    assert not verdict.ceased
    assert any("not trusted" in p for p in verdict.problems)


def _task(task: int, job_id: str, state: str, **kw: object) -> dict[str, str]:
    fields = job(job_id=job_id, state=state, **kw)  # type: ignore[arg-type]
    fields.update({"ArrayJobId": "97", "ArrayTaskId": str(task)})
    return fields


def test_an_array_has_ceased_only_when_every_task_has(tmp_path: Path) -> None:
    """Finding 1: task 1 exited 3 while task 0 kept running; asked about the array's id,
    dispatch-cease read only the first task and answered ceased."""
    state, cfg = state_dir(tmp_path)
    start_end(state, "n2")  # job 100 = task 1's own id, ended cleanly on n2
    tasks = [_task(1, "100", "FAILED", nodelist="n2"), _task(0, "97", "RUNNING", nodelist="n1")]
    ctl = FakeController(tasks, {"n1": node("n1"), "n2": node("n2")})
    verdict = cease.cessation("97", cfg=cfg, controller=ctl)
    assert not verdict.ceased and verdict.exit_code == 1, cease.render(verdict)
    assert [t.job_id for t in verdict.tasks] == ["97_1", "97_0"]
    assert verdict.tasks[0].ceased and not verdict.tasks[1].ceased
    assert "97_0" in verdict.reason and "has not ended" in cease.render(verdict)
    # The ended task asked on its own is judged on its own.
    ctl.job_fields = [tasks[0]]
    assert cease.cessation("97_1", cfg=cfg, controller=ctl).ceased
    # Once the last task has ended and left nothing behind, the array has ceased.
    tasks[1] = _task(0, "97", "COMPLETED", nodelist="n1")
    start = record(state, "start", "n1", job_id="97", time=NOW - 100, restart=0)
    record(
        state,
        "end",
        "n1",
        job_id="97",
        time=NOW - 90,
        restart=0,
        survivors=[],
        scan_error=None,
        start_token=start.split(".")[-1],
    )  # task 0's own id is 97
    ctl.job_fields = tasks
    verdict = cease.cessation("97", cfg=cfg, controller=ctl)
    assert verdict.ceased, cease.render(verdict)
    with pytest.raises(UsageError, match="give one task with --restart"):
        cease.cessation("97", 0, cfg=cfg, controller=ctl)


def test_a_pending_task_of_an_array_is_not_ceased(tmp_path: Path) -> None:
    _, cfg = state_dir(tmp_path)
    tasks = [
        _task(1, "97", "PENDING", nodelist="(null)"),
        _task(0, "98", "COMPLETED", nodelist="(null)"),
    ]
    verdict = cease.cessation("97", cfg=cfg, controller=FakeController(tasks, {}))
    assert not verdict.ceased and "has not started" in verdict.tasks[0].reason


def test_an_array_of_many_tasks_costs_two_controller_calls(tmp_path: Path) -> None:
    state, cfg = state_dir(tmp_path)
    tasks = []
    for t in range(50):
        job_id = str(200 + t)
        start = record(state, "start", f"n{t % 4}", job_id=job_id, time=NOW - 100, restart=0)
        record(
            state,
            "end",
            f"n{t % 4}",
            job_id=job_id,
            time=NOW - 90,
            restart=0,
            survivors=[],
            scan_error=None,
            start_token=start.split(".")[-1],
        )
        fields = job(job_id=job_id, nodelist=f"n{t % 4}")
        fields.update({"ArrayJobId": "200", "ArrayTaskId": str(t)})
        tasks.append(fields)
    ctl = FakeController(tasks, {f"n{i}": node(f"n{i}") for i in range(4)})
    verdict = cease.cessation("200", cfg=cfg, controller=ctl)
    assert verdict.ceased and len(verdict.tasks) == 50, cease.render(verdict)
    assert [c[0] for c in ctl.calls] == ["job", "nodes"]


def test_a_task_the_controller_forgot_is_found_by_its_array_and_judged(tmp_path: Path) -> None:
    """dispatch-cease 97_1 after MinJobAge: the controller no longer knows 97_1, and the
    task's facts are filed under its own job id (98), which the controller's start names as
    array 97 task 1.  Before, the answer was 'unknown to the controller and has no records'."""
    state, cfg = state_dir(tmp_path)

    def task(own: str, number: int, **fields: str) -> None:
        record(
            state,
            "ctld-start",
            "slurmctld",
            job_id=own,
            uid=1000,  # whose facts: the cessations below ask as 1000 and as root
            time=NOW - 300,
            restart=0,
            nodes=["n1"],
            **fields,
        )
        start = record(state, "start", "n1", job_id=own, time=NOW - 200, restart=0)
        record(
            state,
            "end",
            "n1",
            job_id=own,
            time=NOW - 190,
            restart=0,
            survivors=[],
            scan_error=None,
            start_token=start.split(".")[-1],
        )

    task("97", 0, array_job_id="97", array_task_id="0")
    task("98", 1, array_job_id="97", array_task_id="1")
    task("99", 2)  # written by a hook that did not record arrays
    ctl = FakeController(None, {"n1": node("n1")})
    for uid in (1000, None):  # the user, and root not told whose it is
        verdict = cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=uid)
        assert verdict.ceased, cease.render(verdict)
        assert (verdict.job_id, verdict.slurm_job_id) == ("97_1", "98")
        # The person reading it is told whose facts judged it: the task's own id.
        assert (
            "job 97_1 restart 0 (unknown to the controller; judged by the facts of job 98): ceased"
        ) in cease.render(verdict)
    # A task no fact names stays unknown, as before.
    for asked in ("97_2", "96_1"):
        with pytest.raises(UsageError, match="unknown to the controller and has no records"):
            cease.cessation(asked, 0, cfg=cfg, controller=ctl, uid=1000)


def _forgotten_task(
    state: str,
    own: str,
    array: str,
    task: str,
    survivors: list,
    uid: int = 1000,
    t: float = NOW - 300,
) -> None:
    """A task's facts under its own id ``own``: the controller's start naming ``array`` and
    ``task``, node n1's start and end (``survivors`` at the end)."""
    record(
        state,
        "ctld-start",
        "slurmctld",
        job_id=own,
        uid=uid,
        time=t,
        restart=0,
        nodes=["n1"],
        array_job_id=array,
        array_task_id=task,
    )
    start = record(state, "start", "n1", job_id=own, uid=uid, time=t + 100, restart=0)
    record(
        state,
        "end",
        "n1",
        job_id=own,
        uid=uid,
        time=t + 110,
        restart=0,
        survivors=survivors,
        scan_error=None,
        start_token=start.split(".")[-1],
    )


SURVIVOR = [{"pid": 4242, "cmdline": "python train.py", "starttime": 7}]


def test_a_forgotten_task_two_folders_name_is_not_judged_by_either(tmp_path: Path) -> None:
    """Job ids used twice (slurmctld's state started anew, or MaxJobId wrapped): an old array
    97's task 1 ran as job 98 and ceased; the new array 97's task 1 ran as 105 and left a
    survivor.  dispatch-cease 97_1 judged the first folder it came to (98) and said ceased,
    while 105's process still ran.  Neither may be taken for the task: an error naming both."""
    state, cfg = state_dir(tmp_path)
    _forgotten_task(state, "98", "97", "1", [], t=NOW - 86400)
    _forgotten_task(state, "105", "97", "1", SURVIVOR)
    ctl = FakeController(None, {"n1": node("n1")})
    for uid in (1000, None):
        with pytest.raises(
            RecordError,
            match=r"facts of job 98 and job 105 \(under .*\) "
            r"each name array 97 task 1.*ask by the task's "
            r"own job id",
        ):
            cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=uid)
    # Asked by its own id, each is judged as ever.
    assert cease.cessation("98", 0, cfg=cfg, controller=ctl, uid=1000).ceased
    assert not cease.cessation("105", 0, cfg=cfg, controller=ctl, uid=1000).ceased


def test_a_forgotten_task_whose_folder_holds_another_jobs_start_is_not_judged(
    tmp_path: Path,
) -> None:
    """Job id 98 used twice: once for task 1 of array 97, once for task 2 of array 96; their
    facts share folder 98 (both restart 0), so judging 97_1 by it mixes another job's nodes
    and ends into the proof.  An error naming both, never ceased."""
    state, cfg = state_dir(tmp_path)
    _forgotten_task(state, "98", "97", "1", [], t=NOW - 86400)
    record(
        state,
        "ctld-start",
        "slurmctld",
        job_id="98",
        time=NOW - 300,
        restart=0,
        nodes=["n1"],
        array_job_id="96",
        array_task_id="2",
    )
    ctl = FakeController(None, {"n1": node("n1")})
    with pytest.raises(
        RecordError,
        match=r"job 98 also has a controller start of array 96 "
        r"task 2",
    ):
        cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=1000)


def test_a_forgotten_task_two_users_folders_name_is_not_judged_by_root(tmp_path: Path) -> None:
    """Root not told whose 97_1 it is: alice's (1000) old array 97 task 1 ceased as 98, bob's
    (1001) new one ran as 105 and left a survivor.  Root took the first user whose facts named
    the task and said ceased.  Now an error naming both; each user asking is judged on their own."""
    state, cfg = state_dir(tmp_path)
    _forgotten_task(state, "98", "97", "1", [], uid=1000, t=NOW - 86400)
    _forgotten_task(state, "105", "97", "1", SURVIVOR, uid=1001)
    ctl = FakeController(None, {"n1": node("n1")})
    with pytest.raises(RecordError, match=r"job 98 of uid 1000 and job 105 of uid 1001"):
        cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=None)
    assert cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=1000).ceased
    assert not cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=1001).ceased


def test_a_forgotten_arrays_own_id_is_not_judged_by_one_of_its_tasks(tmp_path: Path) -> None:
    """dispatch-cease 97 after MinJobAge, array 97 of two tasks: task 0 ran as job 97 itself
    and ceased, task 1 ran as 98 and left a survivor.  The controller knows no 97 any more, so
    cease judged folder 97 alone and said 'job 97 ... ceased' for the array while 98's process
    ran.  Asked by the array's id, the answer is an error naming its tasks, never ceased."""
    state, cfg = state_dir(tmp_path)
    _forgotten_task(state, "97", "97", "0", [])
    _forgotten_task(state, "98", "97", "1", SURVIVOR)
    ctl = FakeController(None, {"n1": node("n1")})
    for restart in (None, 0):
        with pytest.raises(
            UsageError,
            match=r"job 97 is unknown to the controller, and its "
            r"facts say it was array 97: give one task \(its "
            r"facts name 97_0 \(job 97\), 97_1 \(job 98\)\)",
        ):
            cease.cessation("97", restart, cfg=cfg, controller=ctl, uid=1000)
    assert not cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=1000).ceased
    assert cease.cessation("97_0", 0, cfg=cfg, controller=ctl, uid=1000).ceased


def test_a_forgotten_job_two_users_folders_hold_is_not_judged_by_root(tmp_path: Path) -> None:
    """Root asking about job 98 the controller forgot, with facts of job 98 under two users
    (job ids used twice: alice's old 98 ceased, bob's new 98 left a survivor): root judged the
    lowest uid's folder and said ceased.  Now an error naming both; each user is judged on
    their own facts."""
    state, cfg = state_dir(tmp_path)
    for uid, survivors in ((1000, []), (1001, SURVIVOR)):
        record(
            state,
            "ctld-start",
            "slurmctld",
            job_id="98",
            uid=uid,
            time=NOW - 300,
            restart=0,
            nodes=["n1"],
        )
        start = record(state, "start", "n1", job_id="98", uid=uid, time=NOW - 200, restart=0)
        record(
            state,
            "end",
            "n1",
            job_id="98",
            uid=uid,
            time=NOW - 190,
            restart=0,
            survivors=survivors,
            scan_error=None,
            start_token=start.split(".")[-1],
        )
    ctl = FakeController(None, {"n1": node("n1")})
    with pytest.raises(
        RecordError,
        match=r"job 98 is unknown to the controller, and facts of "
        r"job 98 are filed under uid 1000 and uid 1001",
    ):
        cease.cessation("98", 0, cfg=cfg, controller=ctl, uid=None)
    assert cease.cessation("98", 0, cfg=cfg, controller=ctl, uid=1000).ceased
    assert not cease.cessation("98", 0, cfg=cfg, controller=ctl, uid=1001).ceased


def test_root_looks_for_a_forgotten_task_among_its_arrays_owners_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's release service asks dispatch-cease as root, not told whose a held task is: the
    task's facts are looked for among the owners of the array's own folder (97) first, and
    only when none of theirs names it among every other user's, so a question about one
    user's task does not read every user's facts."""
    state, cfg = state_dir(tmp_path)
    _forgotten_task(state, "97", "97", "0", [])
    _forgotten_task(state, "98", "97", "1", [])
    for uid in (1001, 1002):
        _forgotten_task(state, "300", "300", "0", [], uid=uid)
    asked: list[int] = []
    real = facts_module.array_task_job

    def counted(state_dir: str, uid: int, array: str, task: str) -> str | None:
        asked.append(uid)
        return real(state_dir, uid, array, task)

    monkeypatch.setattr(facts_module, "array_task_job", counted)
    ctl = FakeController(None, {"n1": node("n1")})
    assert cease.cessation("97_1", 0, cfg=cfg, controller=ctl, uid=None).ceased
    assert asked == [1000]
    asked.clear()  # a task no owner of folder 97 has: every other user's are read
    with pytest.raises(UsageError, match="unknown to the controller"):
        cease.cessation("97_5", 0, cfg=cfg, controller=ctl, uid=None)
    assert sorted(asked) == [1000, 1001, 1002]


def test_the_verdict_names_whose_facts_it_judged(tmp_path: Path) -> None:
    """The asker checks it: a job id used twice names another user's job (see
    test_supervisor.test_a_ceased_answer_about_another_users_job_lifts_no_hold)."""
    state, cfg = state_dir(tmp_path)
    start_end(state, "n1")
    verdict = cease.cessation(
        "100", cfg=cfg, controller=FakeController(job(uid=1000), {"n1": node("n1")})
    )
    assert verdict.ceased and verdict.as_json()["uid"] == 1000
    # An array's verdict, and each task's, name the owner too.
    start_end(state, "n2")
    tasks = [_task(1, "100", "FAILED", nodelist="n2"), _task(0, "97", "RUNNING", nodelist="n1")]
    array = cease.cessation(
        "97", cfg=cfg, controller=FakeController(tasks, {"n1": node("n1"), "n2": node("n2")})
    ).as_json()
    assert [array["uid"], *(t["uid"] for t in array["tasks"])] == [1000, 1000, 1000]


def test_a_recheck_of_an_end_no_start_ties_never_proves_a_start_recorded_after_it() -> None:
    # An end tied to no start (u), written before execution 1's start s on n1, and a re-check
    # of u's survivors that found none; then s and its end e, which found survivors.  An end
    # shares its start's token, so the two may be read in either order: e before s kept u's
    # re-check tied to execution 1 on n1, and its "none" outweighed e's survivors.
    def survivor(pid: int) -> Process:
        # Its pid alone: the grouping passes a node's survivors on and reads none of them.
        return cast("Process", {"pid": pid})

    u: Fact = {
        "kind": "end",
        "node": "n1",
        "restart": 1,
        "token": "01",
        "start_token": None,
        "time": 1.0,
        "survivors": [survivor(7)],
    }
    s: Fact = {"kind": "start", "node": "n1", "restart": 1, "token": "02", "time": 2.0}
    e: Fact = {
        "kind": "end",
        "node": "n1",
        "restart": 1,
        "token": "02",
        "start_token": "02",
        "time": 3.0,
        "survivors": [survivor(8)],
    }
    later: Fact = {
        "kind": "recheck",
        "node": "n1",
        "restart": 1,
        "token": "03",
        "end_token": "01",
        "time": 4.0,
        "survivors": [],
    }
    for order in ([u, s, e, later], [u, e, s, later]):
        (only,) = facts_module.group_executions("100", order, [])
        n1 = only["nodes"]["n1"]
        assert n1["ceased"] is False and n1["survivors"] == [{"pid": 8}], (order, n1)


def test_a_job_id_used_twice_is_judged_by_the_sluid_of_the_run_asked_about(tmp_path: Path) -> None:
    """Once slurmctld's state started anew, job 100's facts on n1 hold two
    jobs' runs of restart 0: one that ended with a survivor left (SLUID S0OLD), then another
    job's, ended clean (S1NEW).  Both were one execution before, proven by whichever start and
    end came last; now the latest run is judged unless --sluid names another, and the verdict
    names the run it judged, for the asker to check."""
    state, cfg = state_dir(tmp_path)
    for sluid, t, left in (
        ("S0OLD", NOW - 200, [{"pid": 4242, "cmdline": "python train.py"}]),
        ("S1NEW", NOW - 100, []),
    ):
        start = record(state, "start", "n1", time=t, restart=0, sluid=sluid)
        record(
            state,
            "end",
            "n1",
            time=t + 10,
            restart=0,
            start_token=start.split(".")[-1],
            survivors=left,
            scan_error=None,
            sluid=sluid,
        )

    def asked(sluid: str | None = None) -> cease.Verdict:
        return cease.cessation(
            "100", 0, cfg=cfg, sluid=sluid, controller=FakeController(job(), {"n1": node("n1")})
        )

    latest = asked()
    assert latest.ceased and latest.sluid == "S1NEW"
    old = asked("S0OLD")
    assert not old.ceased and old.sluid == "S0OLD" and "4242" in cease.render(old)
    with pytest.raises(UsageError, match="no records of a run with SLUID S9"):
        asked("S9")


def test_a_run_before_the_controllers_job_under_its_id_is_judged_by_its_own_facts(
    tmp_path: Path,
) -> None:
    """The controller's job 100 is another job now, running, whose run S1NEW started after the
    run S0OLD asked about (ids started again): S0OLD is not its current execution, so its own
    clean end proves it; the controller's running job is S1NEW's business."""
    state, cfg = state_dir(tmp_path)
    start = record(state, "start", "n1", time=NOW - 200, restart=0, sluid="S0OLD")
    record(
        state,
        "end",
        "n1",
        time=NOW - 190,
        restart=0,
        start_token=start.split(".")[-1],
        survivors=[],
        scan_error=None,
        sluid="S0OLD",
    )
    record(
        state,
        "ctld-start",
        "slurmctld",
        time=NOW - 201,
        restart=0,
        sluid="S0OLD",
        nodes=["n1"],
        nodelist="n1",
    )
    record(state, "start", "n1", time=NOW - 100, restart=0, sluid="S1NEW")

    def asked(sluid: str | None = None) -> cease.Verdict:
        return cease.cessation(
            "100",
            0,
            cfg=cfg,
            sluid=sluid,
            controller=FakeController(job(state="RUNNING"), {"n1": node("n1")}),
        )

    old = asked("S0OLD")
    assert old.ceased and old.sluid == "S0OLD", cease.render(old)
    new = asked()
    assert not new.ceased and new.sluid == "S1NEW" and "has not ended" in new.reason


@pytest.mark.parametrize("named", [False, True])
def test_a_job_with_nothing_recorded_names_the_state_dir_and_the_dispatch_conf_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """Found attacking a slurm.conf outside /etc/slurm: where the commands read another
    dispatch.conf than the hooks (slurm.conf not in /etc/slurm and neither SLURM_CONF nor
    SLURM_DISPATCH_CONF in the user's environment: the defaults), dispatch-cease found no fact of a
    job that ran and said only 'no post-kill record (its Epilog has not recorded an end)', which the
    supervisor recorded each minute while the hold waited 24 h: nothing said where it had looked,
    nor why."""
    state, cfg = state_dir(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "etc/slurm.conf"))
    if named:
        cfg.path = str(tmp_path / "site/dispatch.conf")
    ctl = FakeController(job(start=NOW - 100, end=NOW - 90), {"n1": node("n1")})
    verdict = cease.cessation("100", cfg=cfg, controller=ctl)
    assert not verdict.ceased
    where = (
        f"the StateDir of {tmp_path}/site/dispatch.conf"
        if named
        else f"no dispatch.conf at {tmp_path}/etc/dispatch.conf, so the default StateDir"
    )
    assert verdict.reason == (
        f"nothing of job 100 is recorded under {state} ({where}): the site's hooks record "
        "elsewhere (point SLURM_DISPATCH_CONF at the dispatch.conf they read) or are not "
        "installed (dispatch-admin doctor)"
    ), verdict.reason
    assert verdict.nodes[0].evidence.startswith("no post-kill record")
    # A job with facts under it is judged as before.
    start_end(state, "n1")
    assert cease.cessation("100", cfg=cfg, controller=ctl).reason == "all 1 node(s) proven"


def test_a_job_id_that_is_no_plain_name_is_a_usage_error(tmp_path: Path) -> None:
    _, cfg = state_dir(tmp_path)
    with pytest.raises(UsageError, match="job id '../100' is not a plain name"):
        cease.cessation("../100", cfg=cfg, controller=FakeController(None, {}))


def test_records_that_cannot_be_read_at_all_are_a_record_error(tmp_path: Path) -> None:
    """A job whose only fact is untrusted has problems and no execution: no verdict."""
    import os

    _, cfg = state_dir(tmp_path)
    job_dir = tmp_path / "state/facts/1000/100"
    job_dir.mkdir(parents=True)
    forged = job_dir / "end.n1.0.ffffffffffffffff00000000"
    forged.write_text(json.dumps({"kind": "end", "survivors": [], "node": "n1"}))
    os.chown(forged, 1000, 1000)
    with pytest.raises(RecordError, match="cannot read the records of job 100: .*not trusted"):
        cease.cessation("100", cfg=cfg, uid=1000, controller=FakeController(job(), {}))


def test_an_earlier_execution_with_no_record_of_its_nodes_is_not_proven(tmp_path: Path) -> None:
    """Restart 0 of a job now at restart 1: neither the controller nor a node recorded where
    it ran, so there is nothing to judge."""
    _, cfg = state_dir(tmp_path)
    ctl = FakeController(job(restarts=1, start=NOW - 50, end=NOW - 10), {})
    verdict = cease.cessation("100", 0, cfg=cfg, controller=ctl)
    assert not verdict.ceased and verdict.nodes == []
    assert verdict.reason == (
        "no record of the nodes execution 0 ran on (no controller or node facts)"
    )
    assert [c[0] for c in ctl.calls] == ["job"]
