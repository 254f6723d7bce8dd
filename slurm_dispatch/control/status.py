"""A dispatch job's status: its record joined with one view of Slurm and the site's facts.

Costs one ``squeue`` call (the caller's own jobs) whatever the number of submissions.  Pure
over its inputs apart from reading the record, the store and the site facts.  An array job is
shown task by task as well: each task's latest submission (``97_1``, as Slurm shows it) and,
where each task has its own root (``%a``), that root's latest publication.  Each execution
shows what it published (its folder's publications and any with its epoch, the root listed
once): nothing, the steps, accelerate's save indices as such, and a step at or below the one it
resumed from (``checkpoint/progress``).  ``goodput`` is what each restart cost
(:mod:`slurm_dispatch.control.goodput`), from the same listing and each publication's time.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from .. import _clock
from ..checkpoint import progress, quarantine, roots
from ..checkpoint import publish as store
from ..errors import DispatchError
from ..slurm.jobs import LAUNCH_FAILED_HOLD, SLURM_END, Job, Snapshot
from . import events, goodput, naming, noprogress, record, rules, sbatch_words

FactsReader = Callable[[str], Sequence[Mapping[str, Any]]]
# dispatch jobs' state for a job Slurm held after its launch failed (Job.held_after_failed_launch).
LAUNCH_HELD = "HELD (Slurm: launch failed)"


def _state(info: Optional[Job]) -> str:
    if info is None:
        return "UNKNOWN (no longer known to slurmctld)"
    return info.state or "?"


def _rule_end(text: str) -> Optional[str]:
    """Slurm's state for a recorded end (``failed``) or a reason that starts with one
    (``failed (budget 2)``, ``node failure: held (shared checkpoint)``)."""
    for name, state in SLURM_END.items():
        if text == name or text.startswith((name + " ", name + ":")):
            return state
    return None


def recorded_end(
    history: events.History,
    sub: events.Submitted,
    facts: Optional[Sequence[Mapping[str, Any]]] = None,
) -> Optional[str]:
    """How submission ``sub`` ended as the record says, in Slurm's words (FAILED, TIMEOUT,
    ...), for a submission slurmctld has forgotten; None when the record does not say.

    In order: the supervisor's end of the lineage at it (finished), the hold or resubmission
    the supervisor made after it (what it saw then), Slurm ending it while held (released),
    the controller hook's end record of its last execution (``facts``: a non-zero exit of
    its own is FAILED; ``0:0`` or a signal says nothing by itself)."""
    line = history.lineage(sub.task)
    done = line.finished
    if done is not None and done.submission == sub.submission:
        if done.end_state == "hold expired":
            return "CANCELLED"  # the supervisor cancelled the expired hold
        found = done.slurm_state or _rule_end(done.end_state)
        if found:
            return str(found)
    later = [s for s in line.submissions if s.submission > sub.submission]
    if later:
        after = min(later, key=lambda s: s.submission)
        hold = line.hold_for(after.submission)
        found = _rule_end(hold.end_state) if hold is not None else None
        found = found or _rule_end(after.reason)
        if found:
            return found
    lifted = line.lifted(sub.slurm_job_id)
    if isinstance(lifted, events.Released) and lifted.slurm_state:
        return lifted.slurm_state
    for fact in reversed(facts or []):
        end = fact.get("end") if isinstance(fact, dict) else None
        if isinstance(end, dict):
            if end.get("state"):
                return str(end["state"]).split()[0].upper()
            from .supervisor import exit_end

            return exit_end(end.get("exit_code"))
    return None


def _recorded(state: Optional[str]) -> str:
    return f"{state} (recorded)" if state else _state(None)


def _facts_reader() -> Optional[FactsReader]:
    """The site's facts, read where the hooks wrote them (a broken import is an error, not
    "no facts")."""
    from ..node.facts import execution_facts

    return execution_facts


def _submission_view(
    slurm_id: str, task: Optional[int], array: bool, slurm_jobs: Snapshot
) -> tuple[str, Optional[Job], str]:
    """(the id as squeue shows it, Slurm's view of it, its state) for one submission."""
    if task is not None:
        views = slurm_jobs.tasks(slurm_id, task)
        return (
            f"{slurm_id}_{task}",
            (views[0] if views else None),
            _state(views[0] if views else None),
        )
    if array:
        views = slurm_jobs.tasks(slurm_id)
        if views:
            return slurm_id, None, "+".join(sorted({v.state for v in views}))
        return slurm_id, None, _state(None)
    info = slurm_jobs.get(slurm_id)
    return slurm_id, info, _state(info)


def _latest(root: str, missing_is_none: bool = False) -> Any:
    """The root's latest publication (as JSON), None, or {"error": why}.  With
    ``missing_is_none``, a local root not made yet (a task that has not run) has none."""
    if missing_is_none and not store.is_remote_root(root) and not os.path.lexists(root):
        return None
    try:
        found = store.latest(root)
        return found.as_json() if found else None
    except DispatchError as exc:
        return {"error": str(exc)}


def _listing(root: str, task: Optional[int], cache: dict[str, Any]) -> Any:
    """Every publication of the execution's root (a task's own, with %a), listed once per
    root; {"error": why} when it cannot be read."""
    one = (
        roots.for_task(root, task)
        if task is not None and roots.per_task(root)
        else roots.one_root(root)
    )
    if one not in cache:
        try:
            cache[one] = (
                []
                if not store.is_remote_root(one) and not os.path.lexists(one)
                else store.list_publications(one)
            )
        except DispatchError as exc:
            cache[one] = {"error": str(exc)}
    return cache[one]


def _published(execution: dict[str, Any], listing: Any) -> dict[str, Any]:
    """What an execution published: how many saves, the first and last step, whether
    those are steps (not accelerate's save indices) and, for a resumed execution, a step at
    or below the one it resumed from, in words (progress); {"error": why} when the store
    cannot say."""
    if isinstance(listing, dict):
        return listing
    folder = str(execution.get("exec_dir") or "").rstrip("/")
    epoch = execution.get("epoch")
    # Its folder's saves, and any save published with its epoch (as --max-no-progress
    # judges them: noprogress._own).
    own = [
        (f.path, f.step)
        for f in listing
        if (folder and f.path.startswith(folder + "/")) or (epoch and f.epoch == epoch)
    ]
    # The save it loaded: an integration may have passed over the launcher's choice.
    source = str(execution.get("loaded", execution.get("resume_from")) or "")
    resumed = [f.step for f in listing if source and f.path == source]
    steps = [step for _, step in own]
    return {
        "count": len(own),
        "first": min(steps, default=None),
        "last": max(steps, default=None),
        "steps_known": all(progress.step_known(path) for path, _ in own),
        "backwards": progress.went_backwards(source, max(resumed), own) if resumed else None,
    }


def _add_loaded(execution: dict[str, Any], root: str, stores: dict[str, Any]) -> None:
    """What an execution that had a save to resume from finally loaded, where its integration
    recorded it (the execution folder's resume record) and it is not the launcher's choice: a
    save passed over as unloadable (torn, replaced on S3) is not what the execution resumed
    from.  ``loaded`` ('' for a fresh start) and ``passed_over`` (the saves' paths) are added;
    a record that cannot be read leaves the launcher's choice standing.  ``stores``: each root's
    store, opened once per status (one S3 client, not one per execution)."""
    attempt = str(execution.get("attempt") or "")
    if not execution.get("resume_from") or not attempt:
        return
    from ..checkpoint import execdir

    task = str(execution.get("array_task_id") or "")
    try:
        where = roots.for_task(root, int(task)) if task.isdigit() else roots.one_root(root)
        st = stores.get(where) or stores.setdefault(where, store.open_store(where))
        data = execdir.load(st.read_exec_file(attempt, execdir.RESUME))
    except (DispatchError, OSError, ValueError):
        return
    if (
        not data
        or not isinstance(data.get("resume_from"), str)
        or data["resume_from"] == execution["resume_from"]
    ):
        return
    execution["loaded"] = data["resume_from"]
    execution["passed_over"] = [
        str(p.get("path"))
        for p in data.get("passed_over") or []
        if isinstance(p, dict) and p.get("path")
    ]


def _own_facts(
    facts: Sequence[Mapping[str, Any]], restart: int, sluid: str
) -> list[Mapping[str, Any]]:
    """The facts of the execution of count ``restart`` whose launcher recorded ``sluid``:
    where a run of the job id carries another SLUID it is another job's (ids start again once
    a controller lost its state); runs with none, and an execution without one, go by the
    count alone, as before."""
    return [
        f
        for f in facts
        if f.get("restart") in (None, restart)
        and (not sluid or not f.get("sluid") or f.get("sluid") == sluid)
    ]


class _Gathering:
    """One job's status being gathered: Slurm's view of it this once, its history, and the
    hooks' facts, each Slurm job's read once."""

    def __init__(
        self, job: record.JobRecord, slurm_jobs: dict[str, Job], reader: Optional[FactsReader]
    ) -> None:
        self.slurm_jobs = slurm_jobs
        self.seen = Snapshot(slurm_jobs)
        self.history = job.history()
        self.reader = reader
        self.tasks = sbatch_words.array_tasks(job)
        self.facts_cache: dict[str, Sequence[Mapping[str, Any]]] = {}
        # Each submission's end as the record holds it, where slurmctld forgot the job.
        self.ends: dict[tuple[int, Optional[int]], tuple[str, Optional[str]]] = {}

    def facts_of(self, slurm_id: str) -> Sequence[Mapping[str, Any]]:
        if self.reader is None or not slurm_id:
            return []
        if slurm_id not in self.facts_cache:
            try:
                self.facts_cache[slurm_id] = self.reader(slurm_id)
            except Exception as exc:  # noqa: BLE001 - status still shows the rest
                self.facts_cache[slurm_id] = [{"error": str(exc)}]
        return self.facts_cache[slurm_id]

    def forgotten(self, sub: events.Submitted, task: Optional[int]) -> tuple[str, Optional[str]]:
        starts = self.history.lineage(task).started_for(sub.submission)
        own = (
            starts[-1].slurm_job_id if starts else (sub.slurm_job_id if self.tasks is None else "")
        )
        facts = [f for f in self.facts_of(own) if "error" not in f]
        last = facts[-1].get("end") if facts else None
        code = last.get("exit_code") if isinstance(last, dict) else None
        return _recorded(recorded_end(self.history, sub, facts)), code

    def submissions(self) -> list[dict[str, Any]]:
        submissions = []
        for sub in self.history.submissions:
            shown, info, state = _submission_view(
                sub.slurm_job_id, sub.task, self.tasks is not None, self.seen
            )
            code = None
            if info is None and state == _state(None):
                # Forgotten by slurmctld: the end the record holds, and the hook's exit code.
                state, code = self.forgotten(sub, sub.task)
                self.ends[(sub.submission, sub.task)] = (state, code)
            submissions.append(
                {
                    "submission": sub.submission,
                    "slurm_job_id": sub.slurm_job_id,
                    "task": sub.task,
                    "display_id": shown,
                    "reason": sub.reason,
                    "submitted": sub.time,
                    "state": state,
                    "exit_code": code,
                    "restarts": info.restarts if info else None,
                    "slurm_reason": info.reason if info else "",
                    **({"sluid": sub.sluid} if sub.sluid else {}),
                }
            )
        return submissions

    def slurm_holds(self, lanes: list[Optional[int]]) -> list[dict[str, Any]]:
        """Slurm's own holds after a failed launch, of each lineage's latest submission: they
        run only once released (the supervisor does it for an isolated job)."""
        slurm_holds = []
        for lane in lanes:
            latest_sub = self.history.lineage(lane).current
            if latest_sub is not None:
                slurm_holds += [
                    {
                        "display_id": v.display_id,
                        "reason": LAUNCH_FAILED_HOLD,
                        "restarts": v.restarts,
                    }
                    for v in self.seen.views(latest_sub.slurm_job_id, lane)
                    if v.held_after_failed_launch
                ]
        return slurm_holds

    def execution_state(
        self, ev: Mapping[str, Any], starts: list[dict[str, Any]], info: Optional[Job]
    ) -> str:
        """An execution's state: Slurm's, else REQUEUED where a later restart of it started,
        else its submission's end as the record holds it."""
        restart = int(ev.get("restart", 0))
        array = ev.get("array_task_id") or ""
        if info is not None and info.restarts > restart:
            return "REQUEUED"
        if info is not None:
            return _state(info)
        task = int(array) if array.isdigit() else None
        later = [
            e
            for e in starts
            if e.get("submission") == ev.get("submission")
            and str(e.get("array_task_id") or "") == array
            and int(e.get("restart", 0)) > restart
        ]
        return (
            "REQUEUED (recorded)"
            if later
            else self.ends.get((int(ev.get("submission", 0)), task), (_state(None), None))[0]
        )

    def executions(
        self,
        starts: list[dict[str, Any]],
        root: str,
        stores: dict[str, Any],
        listings: dict[str, Any],
    ) -> list[dict[str, Any]]:
        executions = []
        for ev in starts:
            slurm_id = str(ev.get("slurm_job_id", ""))
            array = ev.get("array_task_id") or ""
            key = f"{ev.get('array_job_id')}_{array}" if array else slurm_id
            info = self.slurm_jobs.get(key) or self.slurm_jobs.get(slurm_id)
            restart = int(ev.get("restart", 0))
            state = self.execution_state(ev, starts, info)
            execution = {
                k: ev.get(k)
                for k in (
                    "submission",
                    "restart",
                    "attempt",
                    "epoch",
                    "node",
                    "nodes",
                    "exec_dir",
                    "resume_from",
                )
            }
            execution.update(
                {
                    "slurm_job_id": slurm_id,
                    "array_task_id": array,
                    "started": ev["time"],
                    "state": state,
                    "display_id": key,
                    "sluid": ev.get("sluid") or "",
                }
            )
            if (
                info is not None
                and info.restarts == restart
                and info.end_time is not None
                and info.execution_ended
            ):
                execution["ended"] = clock(info.end_time)
            if self.reader is not None and slurm_id:
                execution["facts"] = _own_facts(
                    self.facts_of(slurm_id), restart, str(ev.get("sluid") or "")
                )
            _add_loaded(execution, root, stores)
            task = int(array) if array.isdigit() else None
            execution["published"] = _published(execution, _listing(root, task, listings))
            executions.append(execution)
        return executions

    def task_lines(self, root: str, per_task: bool, latest: Any) -> list[dict[str, Any]]:
        lines = []
        for task in self.tasks or []:
            # Each task's lineage: its latest submission and, where each task has a root of
            # its own (%a), that root's latest publication.
            line = self.history.lineage(task)
            current = line.current
            shown, info, state = (
                _submission_view(current.slurm_job_id, task, True, self.seen)
                if current is not None
                else ("-", None, "-")
            )
            if current is not None and info is None and state == _state(None):
                state = self.forgotten(current, task)[0]
            lines.append(
                {
                    "task": task,
                    "submission": current.submission if current else 0,
                    "display_id": shown,
                    "state": state,
                    "resubmits_used": max(0, len(line.submissions) - 1),
                    "settled": line.settled,
                    "checkpoint": roots.for_task(root, task),
                    "latest": _latest(roots.for_task(root, task), True) if per_task else latest,
                }
            )
        return lines


def collect(
    job: record.JobRecord,
    slurm_jobs: dict[str, Job],
    facts_reader: Optional[FactsReader] = None,
    marks: Optional[list[goodput.Mark]] = None,
) -> dict[str, Any]:
    """What ``dispatch status`` shows of ``job`` (JSON-ready); ``marks``, where given, is
    filled with the publications its goodput was figured from (every root's, a root per
    array task's too), for a page that draws them."""
    # Another dispatch job's Slurm jobs are never this one's (an old record has no cluster),
    # nor a job under a submission's id without its marker (ids start again when slurmctld
    # loses its state).
    slurm_jobs = naming.own_views(job, slurm_jobs)
    spec = job.spec
    reader = facts_reader if facts_reader is not None else _facts_reader()
    gathering = _Gathering(job, slurm_jobs, reader)
    history, tasks = gathering.history, gathering.tasks
    # The starts as stored (every field the launcher wrote, unknown ones too), picked by type.
    starts = [e.raw for e in history.of(events.Started)]
    submissions = gathering.submissions()
    lanes: list[Optional[int]] = list(tasks) if tasks else [None]
    one_line = lanes == [None]  # not an array (or one of no tasks): one lineage, the job's
    slurm_holds = gathering.slurm_holds(lanes)
    root = spec["checkpoint"]
    listings: dict[str, Any] = {}
    stores: dict[str, Any] = {}
    executions = gathering.executions(starts, root, stores, listings)
    per_task = tasks is not None and roots.per_task(root)
    latest: Any = None if per_task else _latest(roots.one_root(root))
    others = [e.raw for e in history.decisions()]
    lines = gathering.task_lines(root, per_task, latest)
    # Restarts --restart-on-exit made spend no budget: counted apart.
    free = sum(1 for s in submissions[1:] if rules.FREE in str(s["reason"]))
    used = (
        max(0, len(submissions) - 1 - free)
        if tasks is None
        else max((t["resubmits_used"] for t in lines), default=0)
    )
    found = {
        "id": job.id,
        "cluster": job.cluster,
        "generation": spec["generation"],
        "checkpoint": root,
        "shared_checkpoint": spec["shared_checkpoint"],
        "resubmit_budget": spec["resubmit"],
        "resubmits_used": used,
        "supersedes": spec.get("supersedes"),
        "resubmits_free": free,
        # A person's `dispatch resubmit`s (reason "manual"): counted in resubmits_used, as the
        # supervisor counts them against the budget, and shown apart so "1 of 0" is not read
        # as the supervisor going past the budget.
        "resubmits_by_hand": sum(
            1 for s in submissions[1:] if s["reason"] == "manual" and s["task"] is None
        ),
        "script": spec["script_name"],
        "user": spec.get("user"),
        "created": spec["created"],
        "submissions": submissions,
        "executions": executions,
        "events": others,
        "slurm_holds": slurm_holds,
        # Each lineage's standing stop for want of progress (--max-no-progress), in words.
        "requeues_spent": [
            requeues_text(spent, job.id)
            for spent in (history.lineage(lane).spent for lane in lanes)
            if spent is not None and (one_line or spent.task is not None)
        ],
        # Each lineage's bad nodes (--avoid-bad-nodes): why each, and where they were kept
        # off last.
        "bad_nodes": [
            said for lane in lanes for said in bad_nodes_text(history.lineage(lane), lane)
        ],
        "no_progress": [
            noprogress.stop_text(stop, job.id)
            for stop in (history.lineage(lane).stopped for lane in lanes)
            if stop is not None and (one_line or stop.task is not None)
        ],
        "latest": latest,
        "tasks": lines if tasks is not None else None,
        # The saves quarantined in the job's root(s) now: the launcher passes over them.
        "quarantined": [
            mark
            for mark in _quarantined(job, lanes, stores)
            # a store that cannot be read is said once, by the latest's line
            if not (
                isinstance(latest, dict)
                and "error" in mark
                and mark["error"] == latest.get("error")
            )
        ],
        "supervisor": _last_pass(job),
        # Why the next submission would fail at once (its interpreter is gone), with the fix.
        "launcher_problem": None if history.lineage().settled else _launcher_problem(job),
    }
    found_marks = _marks(listings)
    if marks is not None:
        marks[:] = found_marks
    found["goodput"] = goodput.figures(found, found_marks, time.time())
    return found


def _marks(listings: dict[str, Any]) -> list[goodput.Mark]:
    """Each listed root's publications with their times (a local root's: an S3 root's
    entries have none here)."""
    out: list[goodput.Mark] = []
    for where, listed in listings.items():
        if isinstance(listed, list) and listed and not store.is_remote_root(where):
            out += goodput.marks(where, listed)
    return out


def _quarantined(
    job: record.JobRecord, lanes: list[Optional[int]], stores: dict[str, Any]
) -> list[dict[str, str]]:
    """Every quarantined save of the job's root(s) ({"root", "save"}, or {"root", "error"}
    where the marks cannot be read); a root not made yet has none."""
    out: list[dict[str, str]] = []
    for root in sorted({noprogress.root_of(job, lane) for lane in lanes}):
        if not store.is_remote_root(root) and not os.path.lexists(root):
            continue
        try:
            st = stores.get(root) or stores.setdefault(root, store.open_store(root))
            out.extend({"root": root, "save": save} for save in sorted(quarantine.located(st)))
        except DispatchError as exc:
            out.append({"root": root, "error": str(exc)})
    return out


def bad_nodes_text(line: events.Lineage, lane: Optional[int]) -> list[str]:
    """A lineage's bad nodes in words (--avoid-bad-nodes): the nodes and why, then where
    they were last kept off; an array's whole-job line says nothing of its tasks'."""
    from .badnodes import avoided_text, excluded_text

    own = [e for e in line.avoided if lane is None or e.task is not None]
    if not own:
        return []
    task = "" if lane is None else f"task {lane}: "
    said = [f"{task}avoids {'; '.join(avoided_text(e) for e in own)}"]
    last = [e for e in line.excluded if lane is None or e.task is not None]
    if last:
        said.append(f"{task}{excluded_text(last[-1])}")
    return said


def requeues_text(spent: events.RequeuesSpent, job_id: str = "") -> str:
    """A hold past --max-requeues in words; with ``job_id``, the command that lifts it."""
    return (
        f"Slurm requeued it {spent.used} time(s), past its --max-requeues "
        f"{spent.budget}: Slurm job {spent.slurm_job_id} held (restart {spent.restarts})"
        + (f"; `dispatch release {job_id}` lets it run" if job_id else "")
    )


def _launcher_problem(job: record.JobRecord) -> Optional[str]:
    from .interpreter import problem

    try:
        return problem(job)
    except DispatchError as exc:
        return str(exc)


def _last_pass(job: record.JobRecord) -> Optional[dict[str, Any]]:
    from .heartbeat import read

    cluster = job.spec.get("cluster")
    return read(
        os.path.dirname(os.path.dirname(job.path)), cluster if isinstance(cluster, str) else None
    )


def open_job(
    ident: str,
    slurm_jobs: dict[str, Job],
    cluster: Optional[str] = None,
    say: Optional[Callable[[str], None]] = None,
) -> record.JobRecord:
    """The dispatch job ``ident`` names: its id, a Slurm job id of it (an array task's own id
    too, ``98`` for ``97_1``: from the record, else from Slurm's view of the task), or the
    SLUID of one of its submissions or executions (26.05).  With ``cluster``, that cluster's
    jobs only (:func:`record.made_as`).  A Slurm job id that several dispatch jobs were
    given (slurmctld lost its state and numbered jobs anew) opens the one Slurm runs under it
    now (:func:`naming.is_submission`: its marker, else its SLUID), else the newest record;
    ``say`` is told which, and how to open another."""
    try:
        found = record.made_as(ident, cluster=cluster)
    except DispatchError:
        info = slurm_jobs.get(ident)
        if info is not None and info.array_job_id and info.array_job_id != ident:
            return record.open_job(info.array_job_id, cluster=cluster)
        run = _by_sluid(ident, cluster)
        if run is None:
            raise
        return run
    if len(found) == 1:
        return found[0]
    found.sort(key=lambda j: j.created, reverse=True)
    view = slurm_jobs.get(ident)
    now = [j for j in found if view is not None and _submission_now(j, ident, view)]
    chosen = now[0] if len(now) == 1 else found[0]
    if say is not None:
        why = f"Slurm's job {ident} now" if len(now) == 1 else "the newest"
        others = ", ".join(j.id for j in found if j is not chosen)
        say(
            f"Slurm job {ident} was a submission of {len(found)} dispatch jobs (slurmctld "
            f"numbered jobs anew): showing {chosen.id}, {why}; the other: {others} "
            f"(dispatch status <dispatch job id>)"
        )
    return chosen


def _submission_now(job: record.JobRecord, ident: str, view: Job) -> bool:
    try:
        made = job.history().submission_of(ident)
    except DispatchError:
        return False
    return made is not None and naming.is_submission(job, made, view)


def _by_sluid(sluid: str, cluster: Optional[str]) -> Optional[record.JobRecord]:
    """The dispatch job of ``cluster`` one of whose submissions or executions Slurm gave
    the SLUID ``sluid`` (a SLUID names one run of one job, whatever the job ids did)."""
    for job in record.cluster_jobs(cluster):
        try:
            events_ = job.history().events
        except DispatchError:
            continue
        if any(getattr(e, "sluid", "") == sluid for e in events_):
            return job
    return None


def clock(seconds: Optional[float]) -> str:
    if not seconds:
        return "-"
    return _clock.instant(seconds)


def job_lines(jobs: list[record.JobRecord], slurm_jobs: dict[str, Job]) -> list[dict[str, Any]]:
    """One summary per dispatch job, for ``dispatch jobs``: the latest submission and what
    Slurm says of it (or what the record says once Slurm has forgotten it).  A record that
    cannot be read is a line saying so, never a silent gap."""
    lines: list[dict[str, Any]] = []
    seen = Snapshot(slurm_jobs)
    for job in jobs:
        try:
            spec = job.spec
            history = job.history()
        except DispatchError as exc:
            lines.append({"id": job.id, "error": str(exc)})
            continue
        current = history.lineage().current
        info = slurm_jobs.get(current.slurm_job_id) if current is not None else None
        if (
            info is not None
            and current is not None
            and not naming.is_submission(job, current, info)
        ):
            info = None  # its id, now another job's (another dispatch job's, a plain one)
        array = sbatch_words.array_tasks(job)
        tasks: list[Job] = []
        for task in array or []:  # each task's latest submission, as Slurm sees it
            now = history.lineage(task).current
            tasks.extend(
                v
                for v in (seen.tasks(now.slurm_job_id, task) if now else [])
                if now is not None and naming.is_submission(job, now, v)
            )
        if history.lineage().superseded is not None:
            state = "SUPERSEDED"
        elif history.hold is not None and (info is None or info.is_held):
            state = "HELD"
        elif tasks:
            state = "+".join(
                sorted(
                    {
                        "HELD"
                        if t.is_held
                        else LAUNCH_HELD
                        if t.held_after_failed_launch
                        else t.state
                        for t in tasks
                    }
                )
            )
        elif info is not None and array is None:
            state = LAUNCH_HELD if info.held_after_failed_launch else info.state
        else:
            # Forgotten by slurmctld: the end the record holds (each task's, for an array).
            subs = [history.lineage(t).current for t in array] if array else [current]
            ends = {recorded_end(history, sub) for sub in subs if sub is not None}
            if ends and None not in ends:
                state = "+".join(sorted(str(e) for e in ends)) + " (recorded)"
            elif history.settled or (array is not None and history.settled_tasks(array)):
                state = "FINISHED"
            else:
                state = "UNKNOWN"  # ended and forgotten by slurmctld, not yet settled
        lines.append(
            {
                "id": job.id,
                "script": spec.get("script_name"),
                "generation": spec["generation"],
                "submission": current.submission if current is not None else 0,
                "slurm_job_id": current.slurm_job_id if current is not None else None,
                "state": state,
                "checkpoint": spec["checkpoint"],
                "created": spec.get("created"),
                "submitted": current.time if current is not None else None,
            }
        )
    return lines
