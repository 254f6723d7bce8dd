"""The soak's checker: reads a finished run's folder and counts every invariant's violations.

The run folder holds ``history/`` (the trainers' facts, :mod:`soak.history`) and ``final.json``,
what the runner gathered after every fault was healed and every job ended or gave up:

- ``seed``, ``minutes``;
- ``faults``: ``[{"kind", "t", "target"}]``, the nemesis's log;
- ``roots``: ``{root: {"pubs": [name, ...], "present": {path: bool}, "keep": K}}``: each
  checkpoint root's ``pub/`` at the end and whether each save a publication or an execution
  names is there (relative to the root); ``keep`` is the K of the gc runs on it (0: none);
- ``pins``: ``{root: [path, ...]}``;
- ``submissions``: ``[{"job", "submission", "task", "slurm_job_id"}]``: every ``submitted``
  event of every record;
- ``jobs``: ``[{"job", "shared", "ended", "stuck"}]``: ended (Slurm has nothing of it active),
  else stuck is ``dispatch status``'s reason, or null when it gave none;
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

INVARIANTS = {
    "resume": "resumed from its lineage's latest publication when it started",
    "pub-missing-save": "no publication names a missing save",
    "needed-missing": "no save chosen by a live execution, of the K latest, or pinned is missing",
    "double-submit": "no (job, submission, task) submitted twice",
    "not-ended": "every job ended, or dispatch status says why it is stuck",
    "lifted-while-writing": "no hold of a shared job lifted while its old execution wrote",
    "shared-overlap": "no two executions of a shared job running at once",
    "drained-by-us": "no node drained because of our hooks",
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
    chose_at: float = 0.0
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
    return {a: ex for a, ex in found.items() if ex.job}


def _relative(root: str, path: str) -> str:
    if root.endswith("/"):
        root = root[:-1]
    return path[len(root) + 1:] if path.startswith(root + "/") else path


def _publications(facts: list[dict[str, Any]], execs: dict[str, Execution]
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


def _key(name: str) -> tuple[int, int]:
    pub = model.parse_name(name)
    return (pub.epoch, pub.step)


def check(run: dict[str, Any], facts: list[dict[str, Any]]) -> Result:
    execs = executions(facts)
    pubs = _publications(facts, execs)
    roots: dict[str, Any] = run.get("roots", {})
    v: dict[str, list[str]] = {name: [] for name in INVARIANTS}

    # resume: the chosen save is a publication of its root that had begun when the launcher
    # chose, and no greater one had returned by then; nothing chosen only if none had.
    for ex in sorted(execs.values(), key=lambda e: e.chose_at):
        known = pubs.get(ex.root, {})
        done = [n for n, e in known.items()
                if e.get("returned", float("inf")) < ex.chose_at - LISTED]
        best = max(done, key=_key) if done else None
        if not ex.resumed:
            if best is not None:
                v["resume"].append(f"{ex.job} {ex.attempt}: started afresh though {best} "
                                   "was published")
            continue
        rel = _relative(ex.root, ex.resumed)
        named = [n for n in set(known) | set(roots.get(ex.root, {}).get("pubs", []))
                 if model.parse_name(n).path == rel]
        if not named:
            v["resume"].append(f"{ex.job} {ex.attempt}: resumed from {rel}, which no "
                               "publication names")
            continue
        began = [known.get(n, {}).get("began", float("-inf")) for n in named]
        if min(began) > ex.chose_at + SLACK:
            v["resume"].append(f"{ex.job} {ex.attempt}: resumed from {rel}, published only "
                               "after its start")
            continue
        if best is not None and _key(best) > max(_key(n) for n in named):
            v["resume"].append(f"{ex.job} {ex.attempt} (epoch {ex.epoch}): resumed from {rel} "
                               f"though {best} was the latest")

    # pub-missing-save and needed-missing, from each root's state at the end.
    live_epoch: dict[str, int] = {}
    for root, state in roots.items():
        present: dict[str, bool] = state.get("present", {})
        names = sorted(state.get("pubs", []), key=_key)
        for name in names:
            if not present.get(model.parse_name(name).path, False):
                v["pub-missing-save"].append(f"{root}: {name} names a missing save")
        keep = int(state.get("keep", 0))
        if names:
            live_epoch[root] = _key(names[-1])[0]
        for name in names[-keep:] if keep else []:
            path = model.parse_name(name).path
            if not present.get(path, False):
                v["needed-missing"].append(f"{root}: {path}, of the {keep} latest, is missing")
        for pin in run.get("pins", {}).get(root, []):
            if not present.get(pin, False):
                v["needed-missing"].append(f"{root}: pinned {pin} is missing")
    for ex in execs.values():
        if ex.resumed and ex.root in roots and ex.epoch >= live_epoch.get(ex.root, 0):
            rel = _relative(ex.root, ex.resumed)
            if not roots[ex.root].get("present", {}).get(rel, False):
                v["needed-missing"].append(f"{ex.job} {ex.attempt}: its resume source {rel} "
                                           "is missing")

    # double-submit.
    seen: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for sub in run.get("submissions", []):
        key = (sub["job"], sub["submission"], sub.get("task"))
        if sub["slurm_job_id"] in seen[key] or seen[key]:
            v["double-submit"].append(f"{sub['job']} submission {sub['submission']} task "
                                      f"{sub.get('task')} submitted again as "
                                      f"{sub['slurm_job_id']} (before: {sorted(seen[key])})")
        seen[key].add(sub["slurm_job_id"])

    # not-ended.
    for job in run.get("jobs", []):
        if not job.get("ended") and not job.get("stuck"):
            v["not-ended"].append(f"{job['job']} still active and dispatch status gives no "
                                  "reason")

    # shared jobs: a lift while an old execution still beat; two executions at once.
    by_job: dict[str, list[Execution]] = defaultdict(list)
    for ex in execs.values():
        by_job[ex.job].append(ex)
    shared_jobs = {j["job"] for j in run.get("jobs", []) if j.get("shared")}
    shared_jobs |= {ex.job for ex in execs.values() if ex.shared}
    for lift in run.get("lifts", []):
        for ex in by_job.get(lift["job"], []):
            if ex.first < lift["t"] < ex.last:
                v["lifted-while-writing"].append(
                    f"{lift['job']}: hold lifted at {lift['t']:.1f} while {ex.attempt} wrote "
                    f"until {ex.last:.1f}")
    overlaps = 0
    for job, group in by_job.items():
        group.sort(key=lambda e: e.first)
        for a, b in zip(group, group[1:]):
            if b.first < a.last and (a.task == b.task):
                if job in shared_jobs:
                    v["shared-overlap"].append(f"{job}: {a.attempt} wrote until {a.last:.1f}, "
                                               f"{b.attempt} started at {b.first:.1f}")
                else:
                    overlaps += 1

    for drain in run.get("drains", []):
        if drain.get("ours"):
            v["drained-by-us"].append(f"{drain['node']}: {drain['reason']}")

    faults = Counter(f["kind"] for f in run.get("faults", []))
    jobs = len(run.get("jobs", [])) or len(by_job)
    lifted = Counter(lift.get("by") or lift.get("kind") or "?" for lift in run.get("lifts", []))
    return Result(seed=run.get("seed"), jobs=jobs, executions=len(execs), faults=faults,
                  overlaps=overlaps, violations=v, holds=len(run.get("holds", [])),
                  lifts=lifted)


def table(result: Result) -> str:
    lines = [f"soak seed {result.seed}",
             f"  jobs {result.jobs}   executions {result.executions}   "
             f"overlaps seen {result.overlaps}",
             "  faults: " + (", ".join(f"{k} {n}" for k, n in sorted(result.faults.items()))
                             or "none"),
             f"  holds made {result.holds}   lifted {sum(result.lifts.values())}"
             + (" (" + ", ".join(f"{k} {n}" for k, n in sorted(result.lifts.items())) + ")"
                if result.lifts else ""),
             f"  {'INVARIANT':<22} {'VIOLATIONS':>10}  MEANING"]
    for name, meaning in INVARIANTS.items():
        lines.append(f"  {name:<22} {len(result.violations[name]):>10}  {meaning}")
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
