"""The soak's checker: reads a finished run's folder and counts every invariant's violations.

The run folder holds ``history/`` (the trainers' facts, :mod:`soak.history`) and ``final.json``,
what the runner gathered after every fault was healed and every job ended or gave up:

- ``seed``, ``minutes``;
- ``faults``: ``[{"kind", "t", "target"}]``, the nemesis's log;
- ``roots``: ``{root: {"pubs": [name, ...], "present": {path: bool}, "keep": K, "watch":
  bool}}``: each checkpoint root's ``pub/`` at the end and whether each save a publication or
  an execution names is there (relative to the root); ``keep`` is the least K of the cleanups
  run on it (``dispatch gc --keep``, ``watch --keep``; 0: none); ``watch``: a ``dispatch
  watch --keep`` cleans it up all the run;
- ``cleanups``: ``[{"root", "keep", "started", "t", "live": [{"attempt", "source",
  "present"}]}]``: each ``dispatch gc`` the runner ran, and the resume sources of the
  executions live on its root then, looked at right after it returned;
- ``cases``: ``{case: {"t", ...} or null}``: the cases :mod:`soak.cases` made (null: not);
- ``pins``: ``{root: [path, ...]}``: the saves ``dispatch pin`` named (cleanup keeps them);
- ``torn``: ``[{"root", "path", "t"}]``: saves the nemesis removed under their standing
  publication (a lost or torn save: the next execution must fall back along its lineage);
- ``submissions``: ``[{"job", "submission", "task", "slurm_job_id"}]``: every ``submitted``
  event of every record;
- ``marked``: ``{marker: [slurm_job_id, ...]}``: the Slurm jobs (an array's by its array job
  id) the runner saw in the queue carrying each submission's marker (``dispatch:<id>/<N>``)
  in their comment: a record takes one ``submitted`` event per submission, so a submission
  made twice (a lost claim) shows only here;
- ``jobs``: ``[{"job", "shared", "ended", "stuck", "kind", "root", "max_no_progress",
  "quarantine_after", "started", "stops", "quarantines"}]``: ended (Slurm has nothing of it
  active), else stuck is ``dispatch status``'s reason, or null when it gave none; the kind
  the runner gave it (``noprogress`` and ``poisoned`` are :mod:`soak.cases`' jobs of issue
  33); its ``--max-no-progress`` and ``--quarantine-after``; from its record, each execution
  the launcher started (``[{"t", "attempt", "resume_from", ...}]``), each stop for want of
  progress (``[{"t", "action", "limit", "executions"}]``) and each save quarantined
  (``[{"t", "save", "root", "executions"}]``);
- ``holds``: ``[{"job", "t", "slurm_job_id", "ended_slurm_job_id"}]``: every hold made;
- ``lifts``: ``[{"job", "t", "kind", "by", "slurm_job_id"}]``: every hold lifted (``kind``
  released, by the cessation signal, a person or Slurm, or expired), when;
- ``drains``: ``[{"node", "reason", "ours"}]``: nodes drained or down with a reason, and
  whether the reason is one of our hooks'.

:func:`check` is pure (the fast tier feeds it synthetic runs of deliberately broken builds);
:func:`table` words its result.  ``python -m soak.checker RUN`` prints the table and exits 1
on any violation.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

from slurm_dispatch.checkpoint import model

from . import history

# The launcher's record (its ``time``, the history's ``chose_at``) is written just after it
# listed pub/: a publication that began more than SLACK after that cannot have been chosen, and
# one must have been seen only if it returned more than LISTED before it (the record's write,
# on a loaded machine, comes a moment after the listing).
SLACK = 0.5
LISTED = 2.0
# A hold's lift is a case for lifted-while-writing only where an execution of its job had
# written within NEAR seconds before it.
NEAR = 30.0
# The supervisor marks a save quarantined a moment before it records so: a choice made up to
# QUARANTINE_SLACK before the record may have passed it over already.
QUARANTINE_SLACK = 5.0

# What each invariant counts as a case it examined (the table's CHECKED column).
CHECKED = {
    "resume": "executions with a choice or a publication before them",
    "fallback": "executions that said what they loaded of a choice",
    "pub-missing-save": "publications at the end",
    "needed-missing": "saves needed: of the K latest, pinned, resume sources on roots a "
    "cleanup ran on while their execution lived",
    "double-submit": "submissions (the records' and those Slurm showed with a marker)",
    "not-ended": "jobs",
    "lifted-while-writing": "holds lifted of a job with an execution writing within 30 s",
    "shared-overlap": "successive executions of a shared job",
    "drained-by-us": "nodes drained or down with a reason",
    "no-progress": "jobs that never make progress, once --max-no-progress executions ran",
    "quarantine": "poisoned saves, once --quarantine-after executions resumed from one",
}

INVARIANTS = {
    "resume": "resumed from its lineage's latest publication when it started",
    "fallback": "a save that cannot be loaded passed over for the next one of its lineage",
    "pub-missing-save": "no publication names a missing save",
    "needed-missing": "no save chosen by a live execution, of the K latest, or pinned is missing",
    "double-submit": "no (job, submission, task) submitted twice",
    "not-ended": "every job ended, or dispatch status says why it is stuck",
    "lifted-while-writing": "no hold of a shared job lifted while its old execution wrote",
    "shared-overlap": "no two executions of a shared job running at once",
    "drained-by-us": "no node drained because of our hooks",
    "no-progress": "a job making no progress stopped after --max-no-progress executions, "
    "its stop recorded",
    "quarantine": "a poisoned save quarantined after --quarantine-after executions resumed "
    "from it, the next one resumed from the save below",
}


@dataclass
class Execution:
    attempt: str
    job: str = ""
    task: Optional[int] = None
    epoch: int = 0
    root: str = ""
    shared: bool = False
    resumed: str = ""
    loaded: Optional[str] = None  # what it loaded (dispatch fetch's fallback); None: not said
    chose_at: float = 0.0
    started: float = 0.0
    first: float = 0.0
    last: float = 0.0
    nodes: set[str] = field(default_factory=set)


@dataclass
class Result:
    seed: Any
    jobs: int
    executions: int
    faults: Counter[str]
    overlaps: int
    violations: dict[str, list[str]]
    holds: int = 0
    lifts: Counter[str] = field(default_factory=Counter)  # by whom (or "expired")
    # How many cases each invariant examined (see CHECKED): 0 violations of an invariant that
    # examined nothing proves nothing, and the table says so.
    checked: dict[str, int] = field(default_factory=dict)
    cases: dict[str, Any] = field(default_factory=dict)  # soak.cases: made (or None)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())


def executions(facts: list[dict[str, Any]]) -> dict[str, Execution]:
    found: dict[str, Execution] = {}
    for fact in facts:
        ex = found.setdefault(fact["attempt"], Execution(fact["attempt"], first=fact["t"]))
        ex.first = min(ex.first, fact["t"])
        ex.last = max(ex.last, fact["t"])
        ex.nodes.add(fact.get("node", ""))
        if fact["ev"] == "start":
            ex.job, ex.task, ex.epoch = fact["job"], fact.get("task"), int(fact["epoch"])
            ex.root, ex.shared = fact["root"], bool(fact.get("shared"))
            ex.resumed, ex.chose_at = fact.get("resumed") or "", float(fact["chose_at"])
            ex.loaded, ex.started = fact.get("loaded"), float(fact["t"])
    return {a: ex for a, ex in found.items() if ex.job}


def _relative(root: str, path: str) -> str:
    if root.endswith("/"):
        root = root[:-1]
    return path[len(root) + 1 :] if path.startswith(root + "/") else path


def _publications(
    facts: list[dict[str, Any]], execs: dict[str, Execution]
) -> dict[str, dict[str, dict[str, float]]]:
    """{root: {name: {"began": t, "returned": t}}} from the publishing/published facts."""
    pubs: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for fact in facts:
        if fact["ev"] not in ("publishing", "published"):
            continue
        ex = execs.get(fact["attempt"])
        if ex is None:
            continue
        entry = pubs[ex.root].setdefault(fact["name"], {})
        key = "began" if fact["ev"] == "publishing" else "returned"
        entry[key] = min(entry.get(key, fact["t"]), fact["t"])
    return pubs


def _saves(
    facts: list[dict[str, Any]], execs: dict[str, Execution]
) -> dict[tuple[str, str], float]:
    """{(root, path): when the trainer said the save was written}: a lower bound of when its
    publication began, where no "publishing" fact says it (dispatch watch's, whose stamp
    reports a publication only once watch returned)."""
    saved: dict[tuple[str, str], float] = {}
    for fact in facts:
        ex = execs.get(fact["attempt"])
        if fact["ev"] == "save" and ex is not None:
            key = (ex.root, fact["path"])
            saved[key] = min(saved.get(key, fact["t"]), fact["t"])
    return saved


def _key(name: str) -> tuple[int, int]:
    pub = model.parse_name(name)
    return (pub.epoch, pub.step)


def check(run: dict[str, Any], facts: list[dict[str, Any]]) -> Result:
    execs = executions(facts)
    pubs = _publications(facts, execs)
    saved = _saves(facts, execs)
    roots: dict[str, Any] = run.get("roots", {})
    v: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    n: Counter[str] = Counter({name: 0 for name in INVARIANTS})

    # resume: the chosen save is a publication of its root that had begun when the launcher
    # chose, and no greater one had returned by then (but a quarantined one); nothing chosen
    # only if none had.
    quarantined = _quarantined(run)
    for ex in sorted(execs.values(), key=lambda e: e.chose_at):
        known = pubs.get(ex.root, {})
        passed = {
            path
            for path, t in quarantined.get(ex.root, {}).items()
            if t < ex.chose_at + QUARANTINE_SLACK
        }
        done = [
            n
            for n, e in known.items()
            if e.get("returned", float("inf")) < ex.chose_at - LISTED
            and model.parse_name(n).path not in passed
        ]
        best = max(done, key=_key) if done else None
        if ex.resumed or best is not None:
            n["resume"] += 1
        if not ex.resumed:
            if best is not None:
                v["resume"].append(
                    f"{ex.job} {ex.attempt}: started afresh though {best} was published"
                )
            continue
        rel = _relative(ex.root, ex.resumed)
        named = [
            n
            for n in set(known) | set(roots.get(ex.root, {}).get("pubs", []))
            if model.parse_name(n).path == rel
        ]
        if not named:
            v["resume"].append(
                f"{ex.job} {ex.attempt}: resumed from {rel}, which no publication names"
            )
            continue
        began = [
            known.get(n, {}).get("began", saved.get((ex.root, rel), float("-inf"))) for n in named
        ]
        if min(began) > ex.chose_at + SLACK:
            v["resume"].append(
                f"{ex.job} {ex.attempt}: resumed from {rel}, published only after its start"
            )
            continue
        if best is not None and _key(best) > max(_key(n) for n in named):
            v["resume"].append(
                f"{ex.job} {ex.attempt} (epoch {ex.epoch}): resumed from {rel} "
                f"though {best} was the latest"
            )

    # pub-missing-save and needed-missing, from each root's state at the end.  The K latest
    # are those of every publication known (the histories' returned ones and pub/ at the end):
    # a cleanup that took one of them with its publication is caught too.  A save the nemesis
    # tore is no fault of ours.
    torn = _torn(run)
    live_epoch: dict[str, int] = {}
    for root, state in roots.items():
        present: dict[str, bool] = state.get("present", {})
        names = sorted(state.get("pubs", []), key=_key)
        n["pub-missing-save"] += len(names)
        for name in names:
            path = model.parse_name(name).path
            if not present.get(path, False) and (root, path) not in torn:
                v["pub-missing-save"].append(f"{root}: {name} names a missing save")
        keep = int(state.get("keep", 0))
        made = {n for n, e in pubs.get(root, {}).items() if "returned" in e} | set(names)
        ever = sorted(made, key=_key)
        if ever:
            live_epoch[root] = _key(ever[-1])[0]
        for name in ever[-keep:] if keep else []:
            path = model.parse_name(name).path
            if (root, path) in torn:
                continue
            n["needed-missing"] += 1
            if name not in names:
                v["needed-missing"].append(f"{root}: {name}, of the {keep} latest, was unpublished")
            elif not present.get(path, False):
                v["needed-missing"].append(f"{root}: {path}, of the {keep} latest, is missing")
        for pin in run.get("pins", {}).get(root, []):
            n["needed-missing"] += 1
            if not present.get(pin, False) and (root, pin) not in torn:
                v["needed-missing"].append(f"{root}: pinned {pin} is missing")
    # A resume source counts as a case only where a cleanup ran on its root while its
    # execution lived: a watch --keep's root (it cleans up all the run), or a dispatch gc the
    # runner ran meanwhile.  Elsewhere nothing could have removed it.  Nor where a dispatch gc
    # ran on its root after the execution, its job ended by the end: a job that ended needs
    # its choices no more (gc.py's needed 2), so that gc may have taken it (seed 63926's
    # 30-minute run: two such sources, each there right after the gc that ran while their
    # execution lived, are what its table counted as violations).
    cleanups = run.get("cleanups", [])
    ended = {j["job"] for j in run.get("jobs", []) if j.get("ended")}
    for ex in execs.values():
        if ex.resumed and ex.root in roots and ex.epoch >= live_epoch.get(ex.root, 0):
            cleaned = roots[ex.root].get("watch") or any(
                c["root"] == ex.root
                and ex.started <= c["t"]
                and c.get("started", c["t"]) <= ex.last
                for c in cleanups
            )
            later = ex.job in ended and any(
                c["root"] == ex.root and c.get("started", c["t"]) > ex.last for c in cleanups
            )
            rel = _relative(ex.root, ex.loaded if ex.loaded is not None else ex.resumed)
            if not rel or not cleaned or later:
                continue
            n["needed-missing"] += 1
            if not roots[ex.root].get("present", {}).get(rel, False) and (ex.root, rel) not in torn:
                v["needed-missing"].append(
                    f"{ex.job} {ex.attempt}: its resume source {rel} is missing"
                )
    # Each cleanup the runner ran: the resume sources of the executions live on its root then,
    # looked at right after it returned (the execution still ran: nothing else removes them).
    for cleanup in cleanups:
        for row in cleanup.get("live", []):
            rel = _relative(cleanup["root"], row["source"])
            n["needed-missing"] += 1
            if not row.get("present") and (cleanup["root"], rel) not in torn:
                v["needed-missing"].append(
                    f"{cleanup['root']}: dispatch gc --keep {cleanup['keep']} removed {rel}, "
                    f"the resume source of {row['attempt']}, which was running"
                )

    n["fallback"] = _check_fallbacks(execs, pubs, roots, run, v["fallback"])

    # double-submit.
    seen: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for sub in run.get("submissions", []):
        n["double-submit"] += 1
        key = (sub["job"], sub["submission"], sub.get("task"))
        if sub["slurm_job_id"] in seen[key] or seen[key]:
            v["double-submit"].append(
                f"{sub['job']} submission {sub['submission']} task "
                f"{sub.get('task')} submitted again as "
                f"{sub['slurm_job_id']} (before: {sorted(seen[key])})"
            )
        seen[key].add(sub["slurm_job_id"])
    recorded = {
        f"dispatch:{sub['job']}/{sub['submission']}"
        + ("" if sub.get("task") is None else f"-t{sub['task']}")
        for sub in run.get("submissions", [])
    }
    for marker, ids in sorted(run.get("marked", {}).items()):
        n["double-submit"] += marker not in recorded
        if len(set(ids)) > 1:
            v["double-submit"].append(
                f"{marker} was carried by Slurm jobs "
                f"{', '.join(sorted(set(ids)))}: submitted more than once"
            )

    # not-ended.
    for job in run.get("jobs", []):
        n["not-ended"] += 1
        if not job.get("ended") and not job.get("stuck"):
            v["not-ended"].append(f"{job['job']} still active and dispatch status gives no reason")

    # shared jobs: a lift while an old execution still beat; two executions at once.
    by_job: dict[str, list[Execution]] = defaultdict(list)
    for ex in execs.values():
        by_job[ex.job].append(ex)
    shared_jobs = {j["job"] for j in run.get("jobs", []) if j.get("shared")}
    shared_jobs |= {ex.job for ex in execs.values() if ex.shared}
    for lift in run.get("lifts", []):
        # A case only where an execution of the job had written shortly before the lift (or
        # wrote after it): one long gone could not have been lifted over.
        near = [ex for ex in by_job.get(lift["job"], []) if ex.last > lift["t"] - NEAR]
        n["lifted-while-writing"] += bool(near)
        for ex in near:
            if ex.first < lift["t"] < ex.last:
                v["lifted-while-writing"].append(
                    f"{lift['job']}: hold lifted at {lift['t']:.1f} while {ex.attempt} wrote "
                    f"until {ex.last:.1f}"
                )
    overlaps = 0
    for job, group in by_job.items():
        group.sort(key=lambda e: e.first)
        for a, b in zip(group, group[1:]):
            if a.task == b.task and job in shared_jobs:
                n["shared-overlap"] += 1
            if b.first < a.last and (a.task == b.task):
                if job in shared_jobs:
                    v["shared-overlap"].append(
                        f"{job}: {a.attempt} wrote until {a.last:.1f}, "
                        f"{b.attempt} started at {b.first:.1f}"
                    )
                else:
                    overlaps += 1

    n["drained-by-us"] = len({d["node"] for d in run.get("drains", [])})
    for drain in run.get("drains", []):
        if drain.get("ours"):
            v["drained-by-us"].append(f"{drain['node']}: {drain['reason']}")

    n["no-progress"] = _check_no_progress(run, by_job, v["no-progress"])
    n["quarantine"] = _check_quarantine(run, facts, by_job, pubs, v["quarantine"])

    faults = Counter(f["kind"] for f in run.get("faults", []))
    jobs = len(run.get("jobs", [])) or len(by_job)
    lifted = Counter(lift.get("by") or lift.get("kind") or "?" for lift in run.get("lifts", []))
    return Result(
        seed=run.get("seed"),
        jobs=jobs,
        executions=len(execs),
        faults=faults,
        overlaps=overlaps,
        violations=v,
        holds=len(run.get("holds", [])),
        lifts=lifted,
        checked=dict(n),
        cases=dict(run.get("cases") or {}),
    )


def _quarantined(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{root: {save (relative): when its quarantine was recorded first}} of every job."""
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for job in run.get("jobs", []):
        for q in job.get("quarantines", []):
            root = q.get("root") or job.get("root", "")
            path = _relative(root, q["save"])
            found[root][path] = min(found[root].get(path, q["t"]), q["t"])
    return found


def _ran(job: dict[str, Any], by_job: dict[str, list[Execution]]) -> set[str]:
    """The attempts of a job's executions: those its record says the launcher started, and
    those whose trainer wrote a start."""
    return {s["attempt"] for s in job.get("started", []) if s.get("attempt")} | {
        ex.attempt for ex in by_job.get(job["job"], [])
    }


def _check_no_progress(
    run: dict[str, Any], by_job: dict[str, list[Execution]], found: list[str]
) -> int:
    """Each job that never makes progress (kind ``noprogress``: every execution crashes
    before its first save): once its --max-no-progress N executions ran, no more ran and its
    stop is recorded.  The number of such jobs examined (N executions ran, or a stop)."""
    examined = 0
    for job in run.get("jobs", []):
        limit = int(job.get("max_no_progress") or 0)
        if job.get("kind") != "noprogress" or limit <= 0:
            continue
        ran = _ran(job, by_job)
        if len(ran) < limit and not job.get("stops"):
            continue
        examined += 1
        if len(ran) > limit:
            found.append(
                f"{job['job']}: {len(ran)} executions without progress, past its "
                f"--max-no-progress {limit}"
            )
        elif not job.get("stops"):
            found.append(
                f"{job['job']}: {len(ran)} executions without progress and no stop recorded"
            )
    return examined


def _check_quarantine(
    run: dict[str, Any],
    facts: list[dict[str, Any]],
    by_job: dict[str, list[Execution]],
    pubs: dict[str, dict[str, dict[str, float]]],
    found: list[str],
) -> int:
    """Each poisoned save (a ``save`` fact marked ``poisoned``, of a job of kind
    ``poisoned``): no more than its job's --quarantine-after N executions resumed from it,
    its quarantine recorded once N had, and the execution after the last of them resumed from
    a save below it.  The number of poisoned saves examined (N executions resumed from it)."""
    quarantined = _quarantined(run)
    examined = 0
    for job in run.get("jobs", []):
        limit = int(job.get("quarantine_after") or 0)
        if job.get("kind") != "poisoned" or limit <= 0:
            continue
        group = sorted(by_job.get(job["job"], []), key=lambda e: e.started)
        mine = {ex.attempt for ex in group}
        root = job.get("root") or (group[0].root if group else "")
        saves = sorted(
            {
                f["path"]
                for f in facts
                if f["ev"] == "save" and f.get("poisoned") and f["attempt"] in mine
            }
        )
        names = set(pubs.get(root, {})) | set(run.get("roots", {}).get(root, {}).get("pubs", []))
        for save in saves:
            froms = [
                ex
                for ex in group
                if _relative(root, ex.loaded if ex.loaded is not None else ex.resumed) == save
            ]
            if len(froms) < limit:
                continue
            examined += 1
            who = f"{job['job']}: {save}"
            if len(froms) > limit:
                found.append(
                    f"{who}: {len(froms)} executions resumed from it, past its "
                    f"--quarantine-after {limit}"
                )
                continue
            if save not in quarantined.get(root, {}):
                found.append(
                    f"{who}: {limit} executions resumed from it and failed, and it "
                    "was never quarantined"
                )
            after = [ex for ex in group if ex.started > froms[-1].started]
            if not after:
                continue
            below = _relative(
                root, after[0].loaded if after[0].loaded is not None else after[0].resumed
            )
            top = [_key(n) for n in names if model.parse_name(n).path == save]
            under = [_key(n) for n in names if model.parse_name(n).path == below]
            if not below or not top or not under or max(under) >= max(top):
                found.append(
                    f"{who}: the execution after it, {after[0].attempt}, resumed "
                    f"from {below or 'nothing'}, not a save below it"
                )
    return examined


def _torn(run: dict[str, Any]) -> set[tuple[str, str]]:
    return {(t["root"], t["path"]) for t in run.get("torn", [])}


def _owner(path: str) -> Optional[str]:
    """The attempt whose folder holds the save at ``path`` (relative: exec/<attempt>/...)."""
    parts = path.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "exec" else None


def lineage_after(bad: str, root: str, names: set[str], execs: dict[str, Execution]) -> list[str]:
    """The saves to try after ``bad``, nearest first, as the launcher's lineage goes (the
    seed's fallback): the owning execution's own earlier publications, newest first, then
    what that execution loaded, and on along its lineage; it ends where an execution started
    fresh or is not known."""
    by_attempt = {ex.attempt: ex for ex in execs.values() if ex.root == root}
    out: list[str] = []
    seen = {bad}
    current = bad
    while True:
        owner = _owner(current)
        mine = [n for n in names if model.parse_name(n).path == current]
        if owner is not None and mine:
            top = max(_key(n) for n in mine)
            own = sorted(
                (n for n in names if _owner(model.parse_name(n).path) == owner and _key(n) < top),
                key=_key,
                reverse=True,
            )
            for name in own:
                path = model.parse_name(name).path
                if path not in seen:
                    seen.add(path)
                    out.append(path)
        ex = by_attempt.get(owner or "")
        if ex is None:
            return out
        source = _relative(root, ex.loaded if ex.loaded is not None else ex.resumed)
        if not source or source in seen:
            return out
        seen.add(source)
        out.append(source)
        current = source


def _check_fallbacks(
    execs: dict[str, Execution],
    pubs: dict[str, dict[str, dict[str, float]]],
    roots: dict[str, Any],
    run: dict[str, Any],
    found: list[str],
) -> int:
    """Each execution that said what it loaded: the launcher's choice, unless that one could
    not be loaded then; else the first save of its lineage that could.  A save could not be
    loaded when the nemesis tore it before, or it is gone at the end (cleanup may have taken
    it meanwhile); one present at the end and never torn before could.  The number of
    executions examined."""
    torn_at: dict[tuple[str, str], float] = {}
    for t in run.get("torn", []):
        key = (t["root"], t["path"])
        torn_at[key] = min(torn_at.get(key, t["t"]), t["t"])

    def whole(root: str, path: str, when: float) -> bool:
        return (
            bool(roots.get(root, {}).get("present", {}).get(path))
            and torn_at.get((root, path), float("inf")) > when
        )

    def bad(root: str, path: str, when: float) -> bool:
        return torn_at.get((root, path), float("inf")) < when

    examined = 0
    for ex in sorted(execs.values(), key=lambda e: e.started):
        if ex.loaded is None or not ex.resumed or ex.root not in roots:
            continue
        examined += 1
        chosen = _relative(ex.root, ex.resumed)
        loaded = _relative(ex.root, ex.loaded) if ex.loaded else ""
        who = f"{ex.job} {ex.attempt}"
        if loaded == chosen:
            if bad(ex.root, chosen, ex.started):
                found.append(f"{who}: loaded {chosen}, torn before it started")
            continue
        if whole(ex.root, chosen, ex.started):
            found.append(
                f"{who}: passed over {chosen}, which could be loaded, for "
                f"{loaded or 'a fresh start'}"
            )
            continue
        names = set(pubs.get(ex.root, {})) | set(roots[ex.root].get("pubs", []))
        for candidate in lineage_after(chosen, ex.root, names, execs):
            if candidate == loaded:
                break
            if whole(ex.root, candidate, ex.started):
                found.append(
                    f"{who}: fell back from {chosen} to {loaded or 'a fresh start'} "
                    f"past {candidate}, which could be loaded"
                )
                break
        else:
            if loaded:
                found.append(
                    f"{who}: fell back from {chosen} to {loaded}, which is not of its lineage"
                )
    return examined


def table(result: Result) -> str:
    lines = [
        f"soak seed {result.seed}",
        f"  jobs {result.jobs}   executions {result.executions}   overlaps seen {result.overlaps}",
        "  faults: " + (", ".join(f"{k} {n}" for k, n in sorted(result.faults.items())) or "none"),
        f"  holds made {result.holds}   lifted {sum(result.lifts.values())}"
        + (
            " (" + ", ".join(f"{k} {n}" for k, n in sorted(result.lifts.items())) + ")"
            if result.lifts
            else ""
        ),
        "  cases made: "
        + (
            ", ".join(f"{k} {'yes' if made else 'NOT MADE'}" for k, made in result.cases.items())
            or "none asked"
        ),
        f"  {'INVARIANT':<22} {'VIOLATIONS':>10} {'CHECKED':>7}  MEANING",
    ]
    for name, meaning in INVARIANTS.items():
        seen = result.checked.get(name, 0)
        lines.append(
            f"  {name:<22} {len(result.violations[name]):>10} {seen:>7}  {meaning}"
            + ("" if seen else "  (NOTHING EXAMINED: proves nothing)")
        )
    for name, found in result.violations.items():
        for text in found[:20]:
            lines.append(f"  ! {name}: {text}")
        if len(found) > 20:
            lines.append(f"  ! {name}: ... {len(found) - 20} more")
    return "\n".join(lines)


def check_folder(folder: str) -> Result:
    with open(os.path.join(folder, "final.json"), encoding="utf-8") as f:
        run = json.load(f)
    return check(run, history.read(os.path.join(folder, "history")))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m soak.checker RUN_FOLDER", file=sys.stderr)
        return 2
    result = check_folder(argv[0])
    print(table(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
