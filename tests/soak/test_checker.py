"""The soak's checker against synthetic runs: a correct build's history passes, and each
deliberately broken build (a launcher that hands out the greatest step whatever the epoch, the
shared-folder baseline, a supervisor that forgets its claims, a hold lifted too soon) is caught
by the invariant it breaks, and by no other."""

from __future__ import annotations

from typing import Any, Optional

from slurm_dispatch.checkpoint import model
from soak import cases, checker

ROOT = "/home/u/ck"
G0 = 1_000_000  # epoch of submission 1, restart 0


class Sim:
    """A tiny world: executions writing saves and publications at given times."""

    def __init__(self) -> None:
        self.facts: list[dict[str, Any]] = []
        self.pubs: list[str] = []
        self.present: dict[str, bool] = {}

    def start(
        self,
        attempt: str,
        t: float,
        epoch: int,
        resumed: str = "",
        job: str = "j1",
        shared: bool = False,
        task: Optional[int] = None,
        loaded: Optional[str] = None,
    ) -> None:
        fact = {
            "ev": "start",
            "t": t,
            "attempt": attempt,
            "node": "n1",
            "job": job,
            "task": task,
            "submission": 1,
            "epoch": epoch,
            "root": ROOT,
            "shared": shared,
            "chose_at": t - 0.1,
            "resumed": f"{ROOT}/{resumed}" if resumed else "",
        }
        if loaded is not None:  # what dispatch fetch gave ("": a fresh start)
            fact["loaded"] = f"{ROOT}/{loaded}" if loaded else ""
        self.facts.append(fact)

    def publish(self, attempt: str, t: float, epoch: int, step: int, watched: bool = False) -> str:
        """``watched``: published by dispatch watch, whose stamp writes no "publishing" fact,
        only the trainer's "save" before and "published" when watch said so."""
        path = f"exec/{attempt}/checkpoint-{step}"
        name = model.format_name(epoch, step, path)
        for ev, when in (("save", t - 0.02), ("publishing", t - 0.01), ("published", t)):
            if watched and ev == "publishing":
                continue
            self.facts.append(
                {
                    "ev": ev,
                    "t": when,
                    "attempt": attempt,
                    "node": "n1",
                    "step": step,
                    "path": path,
                    "name": name,
                }
            )
        self.pubs.append(name)
        self.present[path] = True
        return path

    def beat(self, attempt: str, t: float) -> None:
        self.facts.append({"ev": "beat", "t": t, "attempt": attempt, "node": "n1"})

    def run(self, **extra: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "seed": 7,
            "roots": {ROOT: {"pubs": self.pubs, "present": self.present, "keep": 2}},
            "jobs": [{"job": "j1", "shared": False, "ended": True}],
            "submissions": [{"job": "j1", "submission": 1, "task": None, "slurm_job_id": "10"}],
            "faults": [{"kind": "partition", "t": 1.0, "target": "n1"}],
            # A dispatch gc on the root while C (70 s to 80 s) lived.
            "cleanups": [{"root": ROOT, "keep": 2, "started": 75.0, "t": 75.5, "live": []}],
        }
        base.update(extra)
        return base


def partitioned_world(pick_greatest_step: bool) -> Sim:
    """A runs on a cut-off node and keeps publishing after B replaced it; C replaces B.  The
    correct launcher gives C B's latest (the greater epoch); the broken one A's greater step."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    sim.publish("A", 20.0, G0, 5)
    a10 = sim.publish("A", 30.0, G0, 10)
    sim.start("B", 40.0, G0 + 1, resumed=a10)
    b15 = sim.publish("B", 50.0, G0 + 1, 15)
    a40 = sim.publish("A", 60.0, G0, 40)  # the old lineage, far ahead in steps, still writing
    sim.start("C", 70.0, G0 + 2, resumed=a40 if pick_greatest_step else b15)
    sim.publish("C", 80.0, G0 + 2, 20)
    return sim


def counts(result: checker.Result) -> dict[str, int]:
    return {k: len(found) for k, found in result.violations.items() if found}


def test_a_correct_build_passes_and_counts_its_overlap() -> None:
    sim = partitioned_world(pick_greatest_step=False)
    result = checker.check(sim.run(), sim.facts)
    assert counts(result) == {}, checker.table(result)
    assert result.ok and result.executions == 3 and result.overlaps >= 1
    text = checker.table(result)
    assert "soak seed 7" in text and "partition 1" in text
    for name in checker.INVARIANTS:
        assert f"{name} " in text


def test_a_launcher_handing_out_the_greatest_step_whatever_the_epoch_is_caught() -> None:
    sim = partitioned_world(pick_greatest_step=True)
    result = checker.check(sim.run(), sim.facts)
    assert counts(result) == {"resume": 1}
    assert "C (epoch 1000002)" in result.violations["resume"][0]
    assert "1000001" in result.violations["resume"][0]  # names the publication it skipped


def test_the_shared_folder_baseline_is_caught() -> None:
    """Both executions write one folder, resume from its highest checkpoint-N (never a
    publication), and the old run's rotation deletes the replacement's saves."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    shared = "shared/checkpoint-10"
    sim.start("B", 40.0, G0 + 1, resumed=shared)
    name = model.format_name(G0 + 1, 15, "shared/checkpoint-15")
    sim.pubs.append(name)
    sim.present.update({"shared/checkpoint-10": True, "shared/checkpoint-15": False})
    result = checker.check(sim.run(), sim.facts)
    assert counts(result) == {"resume": 1, "pub-missing-save": 1, "needed-missing": 1}
    assert "which no publication names" in result.violations["resume"][0]


def test_a_save_gc_should_have_kept_is_caught() -> None:
    sim = partitioned_world(pick_greatest_step=False)
    removed = "exec/B/checkpoint-15"  # C's resume source, and of the 2 latest
    sim.present[removed] = False
    result = checker.check(sim.run(), sim.facts)
    assert counts(result) == {"pub-missing-save": 1, "needed-missing": 2}


def test_a_resume_from_a_publication_made_after_the_start_is_caught() -> None:
    sim = Sim()
    sim.start("A", 10.0, G0)
    later = sim.publish("A", 90.0, G0, 10)
    sim.start("B", 40.0, G0 + 1, resumed=later)
    assert counts(checker.check(sim.run(), sim.facts)) == {"resume": 1}


def test_starting_afresh_past_a_publication_is_caught() -> None:
    sim = Sim()
    sim.start("A", 10.0, G0)
    sim.publish("A", 20.0, G0, 10)
    sim.start("B", 40.0, G0 + 1)
    assert counts(checker.check(sim.run(), sim.facts)) == {"resume": 1}


def test_a_supervisor_forgetting_its_claims_is_caught() -> None:
    """Two passes both resubmit submission 2: the claim that makes it one is forgotten."""
    sim = partitioned_world(pick_greatest_step=False)
    subs = [
        {"job": "j1", "submission": 1, "task": None, "slurm_job_id": "10"},
        {"job": "j1", "submission": 2, "task": None, "slurm_job_id": "11"},
        {"job": "j1", "submission": 2, "task": None, "slurm_job_id": "12"},
        {"job": "j2", "submission": 1, "task": 0, "slurm_job_id": "13_0"},
        {"job": "j2", "submission": 1, "task": 1, "slurm_job_id": "13_1"},
    ]
    result = checker.check(sim.run(submissions=subs), sim.facts)
    assert counts(result) == {"double-submit": 1}
    assert "submitted again as 12" in result.violations["double-submit"][0]


def test_a_submission_slurm_saw_twice_is_caught_though_its_record_has_one() -> None:
    """A record takes one submitted event per submission (created once): a resubmission
    made twice (its claim skipped, two supervisors' passes) leaves one event and two Slurm
    jobs carrying its marker, which only the queue shows."""
    sim = partitioned_world(pick_greatest_step=False)
    marked = {
        "dispatch:j1/1": ["10"],
        "dispatch:j1/2": ["11", "12"],
        "dispatch:j2/1": ["13", "13"],
        "dispatch:j2/2-t1": ["14"],
    }
    subs = [
        {"job": "j1", "submission": 1, "task": None, "slurm_job_id": "10"},
        {"job": "j1", "submission": 2, "task": None, "slurm_job_id": "11"},
    ]
    result = checker.check(sim.run(submissions=subs, marked=marked), sim.facts)
    assert counts(result) == {"double-submit": 1}
    assert result.violations["double-submit"] == [
        "dispatch:j1/2 was carried by Slurm jobs 11, 12: submitted more than once"
    ]
    assert result.checked["double-submit"] == 2 + 2  # the records' two, and two only seen


def test_a_shared_job_lifted_while_its_old_execution_wrote_is_caught() -> None:
    sim = Sim()
    sim.start("A", 10.0, G0, shared=True)
    for t in (20.0, 30.0, 90.0):  # a heartbeat at 9 s: still writing
        sim.beat("A", t)
    sim.start("B", 60.0, 2 * G0, shared=True)
    sim.beat("B", 100.0)
    run = sim.run(
        jobs=[{"job": "j1", "shared": True, "ended": True}],
        lifts=[{"job": "j1", "t": 55.0, "ended_slurm_job_id": "10"}],
    )
    assert counts(checker.check(run, sim.facts)) == {"lifted-while-writing": 1, "shared-overlap": 1}
    # The same lift after the old execution's last beat is fine.
    ok = Sim()
    ok.start("A", 10.0, G0, shared=True)
    ok.beat("A", 30.0)
    ok.start("B", 60.0, 2 * G0, shared=True)
    run = ok.run(
        jobs=[{"job": "j1", "shared": True, "ended": True}],
        lifts=[{"job": "j1", "t": 55.0, "ended_slurm_job_id": "10"}],
    )
    assert checker.check(run, ok.facts).ok


def test_a_job_left_running_unexplained_and_a_node_drained_by_our_hooks_are_caught() -> None:
    sim = partitioned_world(pick_greatest_step=False)
    run = sim.run(
        jobs=[
            {"job": "j1", "ended": False, "stuck": None},
            {"job": "j2", "ended": False, "stuck": "held: shared checkpoint"},
        ],
        drains=[
            {"node": "n2", "reason": "Prolog error", "ours": True},
            {"node": "n3", "reason": "Not responding", "ours": False},
        ],
    )
    result = checker.check(run, sim.facts)
    assert counts(result) == {"not-ended": 1, "drained-by-us": 1}


def test_a_publication_returning_while_the_launcher_wrote_its_record_is_no_violation() -> None:
    """The record's time comes just after the listing: a save published in that moment may
    or may not have been seen, so resuming from the one before is not a violation; one
    published well before (LISTED) must have been."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    a10 = sim.publish("A", 20.0, G0, 10)
    sim.publish("A", 39.9 - checker.LISTED / 2, G0, 15)
    sim.start("B", 40.0, G0 + 1, resumed=a10)
    assert checker.check(sim.run(), sim.facts).ok
    late = Sim()
    late.start("A", 10.0, G0)
    a10 = late.publish("A", 20.0, G0, 10)
    late.publish("A", 39.9 - checker.LISTED * 2, G0, 15)
    late.start("B", 40.0, G0 + 1, resumed=a10)
    assert counts(checker.check(late.run(), late.facts)) == {"resume": 1}


def test_holds_made_and_lifted_are_counted_in_the_table() -> None:
    """A shared job held after its first execution, the hold lifted by a ceased answer once
    that execution's last heartbeat was written: no violation, and the table says so."""
    sim = Sim()
    sim.start("A", 10.0, G0, shared=True)
    sim.beat("A", 30.0)
    sim.start("B", 60.0, 2 * G0, shared=True)
    run = sim.run(
        jobs=[{"job": "j1", "shared": True, "ended": True}],
        holds=[{"job": "j1", "t": 35.0, "slurm_job_id": "11", "ended_slurm_job_id": "10"}],
        lifts=[
            {
                "job": "j1",
                "t": 55.0,
                "kind": "released",
                "by": "cessation signal",
                "slurm_job_id": "11",
            }
        ],
    )
    result = checker.check(run, sim.facts)
    assert result.ok and result.holds == 1
    assert "holds made 1   lifted 1 (cessation signal 1)" in checker.table(result)


def four_saves(keep: int, removed: str) -> dict[str, int]:
    """One execution publishing steps 5 to 20; a cleanup took the save ``removed`` with its
    publication; the root's cleanups ran with ``keep``."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    for step in (5, 10, 15, 20):
        sim.publish("A", 10.0 + step, G0, step)
    gone = f"exec/A/{removed}"
    sim.pubs[:] = [n for n in sim.pubs if model.parse_name(n).path != gone]
    sim.present[gone] = False
    run = sim.run()
    run["roots"][ROOT]["keep"] = keep
    return counts(checker.check(run, sim.facts))


def test_each_roots_own_keep_is_read_and_a_cleanup_taking_one_of_its_k_latest_is_caught() -> None:
    """The third latest unpublished and removed: right for a root cleaned with --keep 2, a
    violation for one cleaned with --keep 3 (the checker read K=2 for every root before, and
    only the publications left at the end, so it saw neither)."""
    assert four_saves(keep=2, removed="checkpoint-10") == {}
    assert four_saves(keep=3, removed="checkpoint-5") == {}
    assert four_saves(keep=3, removed="checkpoint-10") == {"needed-missing": 1}
    assert four_saves(keep=1, removed="checkpoint-20") == {"needed-missing": 1}


def test_a_pinned_save_taken_by_cleanup_is_caught() -> None:
    sim = Sim()
    sim.start("A", 10.0, G0)
    old = sim.publish("A", 15.0, G0, 5)
    for step in (10, 15):
        sim.publish("A", 10.0 + step, G0, step)
    sim.pubs[:] = sim.pubs[1:]  # gc --keep 2 unpublished step 5 ...
    run = sim.run(pins={ROOT: [old]})
    assert counts(checker.check(run, sim.facts)) == {}  # ... and kept its pinned save
    sim.present[old] = False  # ... and removed it
    result = checker.check(run, sim.facts)
    assert counts(result) == {"needed-missing": 1}
    assert f"pinned {old} is missing" in result.violations["needed-missing"][0]


def torn_world(loaded: str, tear: bool = True) -> dict[str, int]:
    """As the partitioned world, but B's save of step 15, the latest publication when C
    starts, was torn before (the nemesis removed it): C's launcher chose it, and C loaded
    ``loaded``.  Its lineage's fallback is B's source, A's step 10; A's step 40 is the
    previous publication in (epoch, step) order, of the old lineage."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    sim.publish("A", 20.0, G0, 5)
    a10 = sim.publish("A", 30.0, G0, 10)
    sim.start("B", 40.0, G0 + 1, resumed=a10, loaded=a10)
    b15 = sim.publish("B", 50.0, G0 + 1, 15)
    sim.publish("A", 60.0, G0, 40)
    sim.start("C", 70.0, G0 + 2, resumed=b15, loaded=loaded)
    sim.publish("C", 80.0, G0 + 2, 20)
    torn = []
    if tear:
        sim.present[b15] = False
        torn = [{"root": ROOT, "path": b15, "t": 65.0}]
    return counts(checker.check(sim.run(torn=torn), sim.facts))


def test_the_fallback_from_a_torn_save_is_its_lineages_previous_save() -> None:
    assert torn_world(loaded="exec/A/checkpoint-10") == {}
    # The previous publication in (epoch, step) order: the old lineage's late save.
    assert torn_world(loaded="exec/A/checkpoint-40") == {"fallback": 1}
    # Past the lineage's previous save, which could be loaded.
    assert torn_world(loaded="exec/A/checkpoint-5") == {"fallback": 1}
    # A fresh start though the lineage had a whole save.
    assert torn_world(loaded="") == {"fallback": 1}
    # The torn save itself loaded; a whole one passed over.
    assert torn_world(loaded="exec/B/checkpoint-15") == {"fallback": 1}
    assert torn_world(loaded="exec/A/checkpoint-10", tear=False) == {"fallback": 1}


def test_the_table_says_how_many_cases_each_invariant_examined() -> None:
    """A correct build's run: each invariant's CHECKED is the cases it examined (B's and C's
    choices; the five publications; the K=2 latest and C's source; one submission, job and
    node), and one that examined nothing (no shared job, no hold lifted) is named so in the
    table."""
    sim = partitioned_world(pick_greatest_step=False)
    run = sim.run(drains=[{"node": "n1", "reason": "Not responding", "ours": False}])
    result = checker.check(run, sim.facts)
    assert result.ok
    assert result.checked == {
        "resume": 2,
        "fallback": 0,
        "pub-missing-save": 5,
        "needed-missing": 3,
        "double-submit": 1,
        "not-ended": 1,
        "lifted-while-writing": 0,
        "shared-overlap": 0,
        "drained-by-us": 1,
        "no-progress": 0,
        "quarantine": 0,
    }, result.checked
    lines = {line.split()[0]: line for line in checker.table(result).splitlines()[5:]}
    assert lines["double-submit"].split()[1:3] == ["0", "1"]
    for name in ("fallback", "lifted-while-writing", "shared-overlap"):
        assert lines[name].split()[1:3] == ["0", "0"]
        assert lines[name].endswith("(NOTHING EXAMINED: proves nothing)")
    assert "NOTHING EXAMINED" not in lines["resume"]


def test_a_runner_blind_to_the_records_shows_its_invariants_examined_nothing() -> None:
    """The runner that read record events under 'kind' (they store 'event') gathered no
    submission, hold or lift: double-submit and lifted-while-writing then had 0 violations of
    nothing, and the table printed them like any 0.  Now their CHECKED is 0 and said; a shared
    job whose hold was lifted is checked once, its two executions once."""
    sim = Sim()
    sim.start("A", 10.0, G0, shared=True)
    sim.beat("A", 30.0)
    sim.start("B", 60.0, 2 * G0, shared=True)
    blind = sim.run(jobs=[{"job": "j1", "shared": True, "ended": True}], submissions=[])
    result = checker.check(blind, sim.facts)
    assert result.ok
    assert result.checked["double-submit"] == 0 and result.checked["lifted-while-writing"] == 0
    text = checker.table(result)
    assert text.count("(NOTHING EXAMINED: proves nothing)") >= 2
    seen = sim.run(
        jobs=[{"job": "j1", "shared": True, "ended": True}],
        lifts=[
            {
                "job": "j1",
                "t": 55.0,
                "kind": "released",
                "by": "cessation signal",
                "slurm_job_id": "11",
            }
        ],
    )
    result = checker.check(seen, sim.facts)
    assert result.checked["double-submit"] == 1
    assert result.checked["lifted-while-writing"] == 1 and result.checked["shared-overlap"] == 1


def test_a_watch_jobs_resume_from_a_save_published_after_its_start_is_caught() -> None:
    """A dispatch watch job's publications have no "publishing" fact (its stamp reports each
    when watch returned), so the resume check's "published only after its start" took their
    start for -inf and could never fire on a watch root: 10 of the 105 choices of seed
    239998's 30-minute run.  Its lower bound is now the trainer's "save" of that path, written
    before watch could publish it."""

    def world(late: bool) -> dict[str, int]:
        sim = Sim()
        sim.start("A", 10.0, G0)
        a5 = sim.publish("A", 20.0, G0, 5, watched=True)
        a10 = sim.publish("A", 45.0, G0, 10, watched=True)  # saved and published after B chose
        sim.start("B", 40.0, G0 + 1, resumed=a10 if late else a5)
        return counts(checker.check(sim.run(), sim.facts))

    assert world(late=True) == {"resume": 1}
    assert world(late=False) == {}


def test_a_resume_source_counts_only_where_a_cleanup_ran_while_it_lived() -> None:
    """C's source on a root no cleanup touched while C ran could not have
    gone missing; it is no case, and the table's CHECKED no longer counts it."""
    sim = partitioned_world(pick_greatest_step=False)
    late = sim.run(cleanups=[{"root": ROOT, "keep": 2, "started": 95.0, "t": 96.0, "live": []}])
    assert checker.check(late, sim.facts).checked["needed-missing"] == 2  # the 2 latest
    watched = sim.run(cleanups=[])
    watched["roots"][ROOT]["watch"] = True  # a dispatch watch --keep cleans it all the run
    assert checker.check(watched, sim.facts).checked["needed-missing"] == 3


def test_a_cleanup_that_removed_a_live_executions_resume_source_is_caught() -> None:
    """What the runner saw right after its dispatch gc: the resume source of an execution
    still running was gone (a gc sparing no resume choice), even where a later requeue makes
    another execution the root's newest."""
    sim = partitioned_world(pick_greatest_step=False)
    live = [{"attempt": "C", "source": f"{ROOT}/exec/B/checkpoint-15", "present": False}]
    run = sim.run(cleanups=[{"root": ROOT, "keep": 1, "started": 75.0, "t": 75.5, "live": live}])
    result = checker.check(run, sim.facts)
    assert counts(result) == {"needed-missing": 1}
    assert (
        "removed exec/B/checkpoint-15, the resume source of C"
        in result.violations["needed-missing"][0]
    )
    live[0]["present"] = True
    assert checker.check(run, sim.facts).ok


def test_a_lift_counts_only_where_an_execution_had_written_shortly_before() -> None:
    """A lift long after the job's last execution stopped could not have
    been a lift over a writer; it is no case."""
    sim = Sim()
    sim.start("A", 10.0, G0, shared=True)
    sim.beat("A", 20.0)
    jobs = [{"job": "j1", "shared": True, "ended": True}]
    far = sim.run(
        jobs=jobs,
        lifts=[
            {
                "job": "j1",
                "t": 20.0 + checker.NEAR + 5,
                "kind": "released",
                "by": "cessation signal",
                "slurm_job_id": "11",
            }
        ],
    )
    assert checker.check(far, sim.facts).checked["lifted-while-writing"] == 0
    near = sim.run(
        jobs=jobs,
        lifts=[
            {
                "job": "j1",
                "t": 25.0,
                "kind": "released",
                "by": "cessation signal",
                "slurm_job_id": "11",
            }
        ],
    )
    assert checker.check(near, sim.facts).checked["lifted-while-writing"] == 1


def test_the_table_names_a_case_the_run_did_not_make() -> None:
    sim = partitioned_world(pick_greatest_step=False)
    made: dict[str, dict[str, float] | None] = {case: None for case in cases.CASES}
    made["torn-latest"] = {"t": 1.0}
    result = checker.check(sim.run(cases=made), sim.facts)
    text = checker.table(result)
    assert "torn-latest yes" in text and "shared-relaunch NOT MADE" in text
    assert cases.missing(made) == [c for c in cases.CASES if c != "torn-latest"]


def no_progress_run(executions: int, stopped: bool) -> tuple[dict[str, Any], Sim]:
    """A job whose every execution crashes before its first save (--max-no-progress 3)."""
    sim = Sim()
    for i in range(executions):
        sim.start(f"N{i}", 10.0 + 20 * i, G0 + i)
    stops = (
        [
            {
                "t": 10.0 + 20 * executions,
                "action": "not resubmitted",
                "limit": 3,
                "executions": [[1 + i, 0, f"N{i}"] for i in range(3)],
            }
        ]
        if stopped
        else []
    )
    job = {
        "job": "j1",
        "ended": True,
        "kind": "noprogress",
        "root": ROOT,
        "max_no_progress": 3,
        "started": [{"t": 10.0 + 20 * i, "attempt": f"N{i}"} for i in range(executions)],
        "stops": stops,
    }
    return sim.run(jobs=[job]), sim


def test_a_job_without_progress_stopped_at_its_limit_passes_and_is_examined() -> None:
    run, sim = no_progress_run(3, stopped=True)
    result = checker.check(run, sim.facts)
    assert counts(result) == {}, checker.table(result)
    assert result.checked["no-progress"] == 1
    # Not yet at its limit (the run ended first): nothing examined, nothing wrong.
    run, sim = no_progress_run(2, stopped=False)
    result = checker.check(run, sim.facts)
    assert counts(result) == {} and result.checked["no-progress"] == 0


def test_a_job_without_progress_restarted_past_its_limit_or_never_stopped_is_caught() -> None:
    """A supervisor that never finds the executions stalled restarts the job for its whole
    budget (soak/mutants.py's no-progress-never-stops); one that stops it without recording
    why leaves a person nothing to read."""
    run, sim = no_progress_run(6, stopped=False)
    result = checker.check(run, sim.facts)
    assert counts(result) == {"no-progress": 1}
    assert (
        "6 executions without progress, past its --max-no-progress 3"
        in result.violations["no-progress"][0]
    )
    run, sim = no_progress_run(3, stopped=False)
    assert checker.check(run, sim.facts).violations["no-progress"] == [
        "j1: 3 executions without progress and no stop recorded"
    ]


def poisoned_world(
    resumes_from_it: int, quarantined: bool, then: str = "below"
) -> tuple[dict[str, Any], Sim]:
    """A publishes step 5, then step 10 (poisoned) and crashes; P0, P1 (and more) resume from
    step 10 and crash before publishing; then D resumes from step 5, A's save below it (or,
    with ``then`` "fresh", from nothing), and goes on."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    a5 = sim.publish("A", 20.0, G0, 5)
    a10 = sim.publish("A", 30.0, G0, 10)
    next(f for f in sim.facts if f["ev"] == "save" and f["path"] == a10)["poisoned"] = True
    t = 40.0
    for i in range(resumes_from_it):
        sim.start(f"P{i}", t, G0 + 100 * (i + 1), resumed=a10, loaded=a10)
        t += 20.0
    quarantines = [{"t": t - 5.0, "save": f"{ROOT}/{a10}", "root": ROOT}] if quarantined else []
    after = a5 if then == "below" else ""
    sim.start("D", t, G0 + 1000, resumed=after, loaded=after)
    sim.publish("D", t + 10.0, G0 + 1000, 10)
    job = {
        "job": "j1",
        "ended": True,
        "kind": "poisoned",
        "root": ROOT,
        "quarantine_after": 2,
        "quarantines": quarantines,
    }
    return sim.run(jobs=[job]), sim


def test_a_poisoned_save_quarantined_after_its_limit_passes_and_the_fallback_is_no_resume_violation() -> (  # noqa: E501
    None
):
    """The execution after the quarantine resumes from the save below the latest
    publication: the resume invariant passes over a quarantined save too."""
    run, sim = poisoned_world(2, quarantined=True)
    result = checker.check(run, sim.facts)
    assert counts(result) == {}, checker.table(result)
    assert result.checked["quarantine"] == 1


def test_a_poisoned_save_resumed_from_past_its_limit_or_never_quarantined_is_caught() -> None:
    """A supervisor that records the quarantine but never marks the save (soak/mutants.py's
    quarantine-marks-nothing): a third execution resumes from it."""
    run, sim = poisoned_world(3, quarantined=True)
    result = checker.check(run, sim.facts)
    assert "quarantine" in counts(result)
    assert (
        "3 executions resumed from it, past its --quarantine-after 2"
        in result.violations["quarantine"][0]
    )
    run, sim = poisoned_world(2, quarantined=False)
    assert checker.check(run, sim.facts).violations["quarantine"] == [
        "j1: exec/A/checkpoint-10: 2 executions resumed from it and failed, and it was never "
        "quarantined"
    ]
    run, sim = poisoned_world(2, quarantined=True, then="fresh")
    assert checker.check(run, sim.facts).violations["quarantine"] == [
        "j1: exec/A/checkpoint-10: the execution after it, D, resumed from nothing, not a save "
        "below it"
    ]


def test_a_resume_source_a_cleanup_took_after_its_job_ended_is_no_violation() -> None:
    """Seed 63926's 30-minute run: B resumed from A's step 10 (there, the save its fetch fell
    back to); a dispatch gc while B ran kept it (right after, it was there); B completed, and
    a later gc with K=2 removed it, as it may (a save a job that ended chose is needed no
    more: gc.py, needed 2).  The end state alone then showed B's source missing, a violation
    of nothing.  A source gone at the end with no cleanup after its execution is still one."""
    sim = Sim()
    sim.start("A", 10.0, G0)
    a5 = sim.publish("A", 20.0, G0, 5)
    a10 = sim.publish("A", 30.0, G0, 10)
    sim.start("B", 40.0, G0 + 1, resumed=a10, loaded=a10)
    sim.publish("B", 50.0, G0 + 1, 15)
    sim.publish("B", 60.0, G0 + 1, 20)
    sim.facts.append({"ev": "end", "t": 65.0, "attempt": "B", "node": "n1", "reason": "done"})
    for path in (a5, a10):
        sim.present[path] = False
    sim.pubs = sim.pubs[2:]
    during = {
        "root": ROOT,
        "keep": 2,
        "started": 45.0,
        "t": 46.0,
        "live": [{"attempt": "B", "source": f"{ROOT}/{a10}", "present": True}],
    }
    after = {"root": ROOT, "keep": 2, "started": 100.0, "t": 101.0, "live": []}
    result = checker.check(sim.run(cleanups=[during, after]), sim.facts)
    assert counts(result) == {}, checker.table(result)
    result = checker.check(sim.run(cleanups=[during]), sim.facts)
    assert counts(result) == {"needed-missing": 1}
    assert (
        "its resume source exec/A/checkpoint-10 is missing"
        in result.violations["needed-missing"][0]
    )
