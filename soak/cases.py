"""The cases every soak run makes, whatever its seed: each invariant examined for real.

A seeded nemesis alone may never hit what an invariant needs (seed 802312's 3-minute runs
with four broken builds: no old execution published past a newer one, no cleanup ran on a
root whose live execution had resumed, no controller kill fell after a shared launch, the one
partition hit no running shared execution; each ended with 0 violations).  So the runner makes
these on purpose, as soon as what each needs is running, and the seed draws the rest:

- ``shared-relaunch``: a controller that lost a shared job's launch runs it again on another
  node (its saved state from while the job was pending put back, the first node cut off, as
  tests/real/test_shared_relaunch.py does): the launcher's claim must stop the second
  execution (``shared-overlap``), and the next submission's hold wait for both to be gone
  (``lifted-while-writing``).  Made first, before the workload, so that putting the
  controller's job state back touches no other job;
- ``shared-partition``: the node of a running shared execution cut off long enough for Slurm
  to end it and the supervisor to hold the next submission while the cut-off one writes on
  (``lifted-while-writing``);
- ``isolated-overlap``: the node of a running isolated job cut off; once its replacement has
  published and the cut-off execution has published a greater step after that, the
  replacement is requeued: the next execution must resume from the newer epoch's save, not
  the greater step (``resume``);
- ``cleanup-resumed``: ``dispatch gc --keep 1`` on the root of a live execution that resumed
  and has published since, its resume source looked at right after (``needed-missing``);
- ``torn-latest``: a running job's latest save removed under its publication and the job
  requeued (``fallback``);
- ``racing-passes``: two supervisors' passes deciding one resubmission at once: with both
  ``dispatch supervise --loop`` stopped (SIGSTOP), a running isolated job's batch script is
  killed (it ends FAILED, its budget left), then two single passes run at the same moment
  (slurmctld stopped while they start, so that both read the queue as it answers); the
  submission's claim must make one of them submit it, and the queue's markers, read right
  after, show a second Slurm job of it otherwise (``double-submit``; two loops meet in one
  such moment only by chance);
- ``no-progress``: a job whose every execution crashes before its first save, with a resubmit
  budget (:data:`NO_PROGRESS_BUDGET`) larger than its ``--max-no-progress``
  (:data:`NO_PROGRESS_LIMIT`): made once that many executions of it started; the supervisor must
  stop it there and record why (``no-progress``);
- ``poisoned-save``: a job whose first execution to reach step :data:`POISON_STEP` poisons
  that save (every resume from it crashes before publishing), published, then crashes: made
  once ``--quarantine-after`` (:data:`QUARANTINE_AFTER`) executions resumed from it and a later
  one resumed from another save; the supervisor must quarantine it after that many
  (``quarantine``).  Both are submitted with the first wave, and the nemesis's requeues and
  cancels leave them alone (a cancel would end them before their case).

:func:`missing` names the cases a run did not make; the runner fails such a run, since its
invariants were not all examined.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import TYPE_CHECKING, Any, Optional

from slurm_dispatch.sandbox import cluster, daemons, slurm_conf

from . import history

if TYPE_CHECKING:
    from .run import Soak


def log(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


CASES = (
    "shared-relaunch",
    "shared-partition",
    "isolated-overlap",
    "cleanup-resumed",
    "torn-latest",
    "racing-passes",
    "no-progress",
    "poisoned-save",
)
# A shared job's trainer publishes nothing (one state file in the root), so every execution
# of it counts as one without progress: --max-no-progress's default (3) would stop its
# restarts, and the holds and pairs of executions its invariants examine, after three.
SHARED = ("--shared-checkpoint", "--max-no-progress", "0")
# The no-progress job: stopped after NO_PROGRESS_LIMIT executions, though its budget is more.
NO_PROGRESS_LIMIT = 3  # --max-no-progress's default, given explicitly
NO_PROGRESS_BUDGET = 6
# The poisoned job: its save of this step is poisoned, quarantined after QUARANTINE_AFTER
# executions resumed from it and failed; a budget for those and the crash that published it.
POISON_STEP = 10
QUARANTINE_AFTER = 2  # --quarantine-after's default, given explicitly
POISON_BUDGET = 5
# The kinds of the jobs these two cases follow.
CASE_KINDS = ("noprogress", "poisoned")
# The jobs the nemesis's requeues and cancels spare: those two cases' and the one the
# isolated-overlap case follows (a restart before its cut spoils it: see isolated_overlap).
SPARED_KINDS = CASE_KINDS + ("overlap",)
# How long a case's partition lasts: Slurm declares the node down after SlurmdTimeout (10 s
# in the sandbox), requeues or ends its job, and the replacement (or the held submission) is
# asked about well within it, while the cut-off execution writes on.
CUT_FOR = 90.0
# The nemesis cuts off at most 2 nodes at once; a case cuts off its node whatever the nemesis
# has cut (the run has 8), so that a short run makes it too.


def missing(made: dict[str, Any]) -> list[str]:
    return [case for case in CASES if not made.get(case)]


class Cases:
    """The state of each case across the runner's passes (:meth:`step`)."""

    def __init__(self, soak: Soak) -> None:
        self.soak = soak
        self.made: dict[str, Any] = {case: None for case in CASES}
        self.overlap_job = ""  # the isolated job the overlap case follows (its name)
        self.overlap: dict[str, Any] = {}
        self.cleanups: list[dict[str, Any]] = []  # every cleanup the runner ran, and after it

    def done(self, case: str, **what: Any) -> None:
        self.made[case] = {"t": time.time(), **what}
        log(f"case {case} made: {what}")

    # -- shared-relaunch, before the workload -------------------------------------------------

    def relaunch_shared(self) -> None:
        """The controller runs a shared job's launch again (see the module docstring); the
        first node stays cut off for CUT_FOR, healed by the runner's healer."""
        soak = self.soak
        layout = soak.layout
        saved = layout.state_save / "job_state"
        kept = os.path.join(soak.run_dir, "job_state.pending")
        part = slurm_conf.PARTITION_NAME
        nodes = list(soak.nodes)
        first, others = nodes[0], nodes[1:]
        scontrol = ["scontrol", "update"]
        try:
            soak.slurm([*scontrol, f"partitionname={part}", "state=down"])
            since = time.time_ns()
            job = soak.submit(
                "shared-relaunch", *SHARED, "--resubmit", "1", env={"SOAK_STEPS": "600"}
            )
            if job is None:
                return
            if not _wait(lambda: _saved_after(saved, since), 30):
                return
            shutil.copy2(saved, kept)
            soak.slurm(
                [
                    *scontrol,
                    f"nodename={','.join(others)}",
                    "state=drain",
                    "reason=soak_shared_relaunch",
                ]
            )
            soak.slurm([*scontrol, f"partitionname={part}", "state=up"])
            name = soak.jobs[job]["name"]
            if not _wait(lambda: first in soak.nodes_of(name), 60):
                return
            cluster.partition(first, soak.directory)
            soak.pending_heals.append((time.monotonic() + CUT_FOR, "partition", first))
            nodes_saved = layout.state_save / "node_state"
            since = time.time_ns()
            soak.slurm(
                [*scontrol, f"nodename={first}", "state=drain", "reason=soak_shared_relaunch"]
            )
            soak.slurm([*scontrol, f"nodename={','.join(others)}", "state=resume"])
            _wait(lambda: _saved_after(nodes_saved, since), 30)
            pid = daemons.live_pid(daemons.slurmctld(layout))
            if pid is None:
                return
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: daemons.live_pid(daemons.slurmctld(layout)) is None, 30)
            shutil.copy2(kept, saved)
            cluster.start_controller(soak.directory)
            soak.faults.append(
                {
                    "kind": "slurmctld-kill",
                    "t": time.time(),
                    "target": f"slurmctld, state from before {name}'s launch",
                }
            )
            # Made once the controller ran it again: a second execution's launcher refused
            # (its output says so), or a second execution ran the script (a broken build).
            out = os.path.join(soak.run_dir, "out")
            if _wait(lambda: _relaunched(out, name, job, soak.history), 90):
                self.done("shared-relaunch", job=job, node=first)
        except Exception as exc:  # the run goes on; the case is reported not made
            log(f"case shared-relaunch failed: {exc}")
        finally:
            soak.slurm([*scontrol, f"partitionname={part}", "state=up"])
            soak.slurm([*scontrol, f"nodename={','.join(others)}", "state=resume"])

    # -- the others, tried at each pass of the runner's loop -----------------------------------

    def step(self) -> None:
        soak = self.soak
        facts = history.read(soak.history)
        if not self.made["shared-partition"]:
            self.partition_shared()
        if not self.made["isolated-overlap"]:
            self.isolated_overlap(facts)
        if not self.made["cleanup-resumed"]:
            self.cleanup_resumed(facts)
        if not self.made["torn-latest"]:
            target = soak.tear()
            if target:
                soak.faults.append({"kind": "tear", "t": time.time(), "target": target})
                self.done("torn-latest", target=target)
        if not self.made["racing-passes"]:
            self.racing_passes()
        self.settle(facts)

    def settle(self, facts: list[dict[str, Any]]) -> None:
        """Mark the no-progress and poisoned-save cases made once their jobs' histories show
        them (also at the end of the run, after the drain)."""
        soak = self.soak
        for job, info in soak.jobs.items():
            starts = [f for f in facts if f["ev"] == "start" and f.get("job") == job]
            if (
                info["kind"] == "noprogress"
                and not self.made["no-progress"]
                and len(starts) >= NO_PROGRESS_LIMIT
            ):
                self.done("no-progress", job=job, executions=len(starts))
            if info["kind"] != "poisoned" or self.made["poisoned-save"]:
                continue
            poisoned = {
                f["path"]
                for f in facts
                if f["ev"] == "save"
                and f.get("poisoned")
                and f["attempt"] in {s["attempt"] for s in starts}
            }
            if not poisoned:
                continue
            (save,) = poisoned
            froms = [s for s in starts if _relative(info["root"], s.get("loaded") or "") == save]
            later = [
                s
                for s in starts
                if froms and s["t"] > froms[-1]["t"] and s.get("loaded") and s not in froms
            ]
            if len(froms) >= QUARANTINE_AFTER and later:
                self.done(
                    "poisoned-save",
                    job=job,
                    save=save,
                    resumed_from_it=len(froms),
                    then=_relative(info["root"], later[0]["loaded"]),
                )

    def submit_broken(self) -> None:
        """The two jobs of the no-progress and poisoned-save cases (with the first wave)."""
        soak = self.soak
        soak.submit(
            "noprogress",
            "--resubmit",
            str(NO_PROGRESS_BUDGET),
            "--max-no-progress",
            str(NO_PROGRESS_LIMIT),
            env={"SOAK_CRASH_AT_START": "1"},
        )
        mark = os.path.join(soak.run_dir, f"poison-{soak.counter + 1}")
        soak.submit(
            "poisoned",
            "--resubmit",
            str(POISON_BUDGET),
            "--quarantine-after",
            str(QUARANTINE_AFTER),
            env={
                "SOAK_POISON_STEP": str(POISON_STEP),
                "SOAK_POISON_MARK": mark,
                "SOAK_STEPS": str(POISON_STEP + 20),
            },
        )

    def racing_passes(self) -> None:
        """See the module docstring: one resubmission decided by two passes at once."""
        soak = self.soak
        names = {
            info["name"]: job
            for job, info in soak.jobs.items()
            if info["kind"] in ("publish", "failing")
        }
        out = soak.slurm(["squeue", "-h", "-u", soak.user, "-t", "R", "-o", "%j %i"])
        running = sorted(
            (line.split()[0], line.split()[1])
            for line in out.splitlines()
            if len(line.split()) == 2 and line.split()[0] in names
        )
        if not running:
            return
        name, slurm_id = running[0]
        loops = [p for p in (soak.supervisor, soak.second) if p is not None and p.poll() is None]
        for loop in loops:
            os.killpg(loop.pid, signal.SIGSTOP)
        try:
            soak.slurm(["scancel", "--batch", "--signal=KILL", slurm_id])
            if not _wait(
                lambda: (
                    slurm_id
                    not in soak.slurm(
                        ["squeue", "-h", "-u", soak.user, "-t", "PD,R,CG,S", "-o", "%i"]
                    ).split()
                ),
                60,
            ):
                return
            # Both passes wait on a stopped controller for their read of the queue, so that
            # they decide at one moment (two merely started together may not: Python's start
            # takes seconds under load).
            controller = daemons.live_pid(daemons.slurmctld(soak.layout))
            if controller is not None:
                os.kill(controller, signal.SIGSTOP)
            try:
                passes = [soak.spawn_user(["dispatch", "supervise", "-q"]) for _ in range(2)]
                time.sleep(6)  # both started, blocked on it (within its MessageTimeout, 10 s)
            finally:
                if controller is not None:
                    os.kill(controller, signal.SIGCONT)
            for each in passes:
                try:
                    each.wait(timeout=120)
                except Exception:  # noqa: BLE001 - a pass stuck: the case is not made
                    each.kill()
                    return
            soak.watch_markers()
        finally:
            for loop in loops:
                if loop.poll() is None:
                    os.killpg(loop.pid, signal.SIGCONT)
        soak.faults.append(
            {
                "kind": "scancel",
                "t": time.time(),
                "target": f"{slurm_id} (its batch script, two passes after)",
            }
        )
        self.done("racing-passes", job=names[name], slurm_job_id=slurm_id)

    def partition_shared(self) -> None:
        soak = self.soak
        busy = {t for _, _, t in soak.pending_heals}
        nodes = [n for n in soak.shared_nodes() if n not in busy]
        if not nodes:
            return
        node = nodes[0]
        log(f"case shared-partition: cutting off {node}, where a shared job runs")
        cluster.partition(node, soak.directory)
        soak.pending_heals.append((time.monotonic() + CUT_FOR, "partition", node))
        soak.faults.append({"kind": "partition", "t": time.time(), "target": node})
        self.done("shared-partition", node=node)

    def submit_overlap(self) -> None:
        """The isolated job the overlap case cuts off (submitted with the first wave)."""
        job = self.soak.submit("overlap", "--resubmit", "2", env={"SOAK_STEPS": "150"})
        if job:
            self.overlap_job = self.soak.jobs[job]["name"]
            self.overlap = {"job": job}

    def isolated_overlap(self, facts: list[dict[str, Any]]) -> None:
        soak = self.soak
        if not self.overlap_job:
            self.submit_overlap()
            return
        job = self.overlap["job"]
        root = soak.jobs[job]["root"]
        starts = [f for f in facts if f["ev"] == "start" and f.get("job") == job]
        published = [f for f in facts if f["ev"] == "published"]
        if "cut" not in self.overlap:
            # Cut the first execution off once it has published twice.
            if len(starts) > 1:
                # Restarted by another fault (its node cut for another case, a preemption)
                # before its cut: the case can no longer be made on it, so follow a new one
                # (seed 186313's 5-minute run waited on this one to its end: NOT MADE).
                log(
                    f"case isolated-overlap: {self.overlap_job} was restarted before its cut; "
                    "following a new job"
                )
                self.overlap_job, self.overlap = "", {}
                self.submit_overlap()
                return
            if len(starts) != 1:
                return
            old = starts[0]["attempt"]
            if sum(1 for f in published if f["attempt"] == old) < 2:
                return
            busy = {t for _, _, t in soak.pending_heals}
            nodes = soak.nodes_of(self.overlap_job)
            if len(nodes) != 1 or nodes[0] in busy:
                return
            log(f"case isolated-overlap: cutting off {nodes[0]}, where {self.overlap_job} runs")
            cluster.partition(nodes[0], soak.directory)
            soak.pending_heals.append((time.monotonic() + CUT_FOR, "partition", nodes[0]))
            soak.faults.append({"kind": "partition", "t": time.time(), "target": nodes[0]})
            self.overlap.update(cut=nodes[0], old=old)
            return
        if "requeued" in self.overlap:
            return
        old = self.overlap["old"]
        new = [f for f in starts if f["attempt"] != old]
        if not new:
            return
        replacement = new[-1]["attempt"]
        mine = [f["step"] for f in published if f["attempt"] == replacement]
        late = [f["step"] for f in published if f["attempt"] == old and f["t"] > new[-1]["t"]]
        if not mine or not late or max(late) <= max(mine):
            return
        slurm_id = new[-1].get("slurm_job_id") or ""
        if not slurm_id:
            return
        soak.slurm(["scontrol", "requeue", slurm_id])
        soak.faults.append({"kind": "requeue", "t": time.time(), "target": slurm_id})
        self.overlap["requeued"] = slurm_id
        self.done(
            "isolated-overlap",
            job=job,
            root=root,
            old=old,
            replacement=replacement,
            old_step=max(late),
            replacement_step=max(mine),
        )

    def cleanup_resumed(self, facts: list[dict[str, Any]]) -> None:
        soak = self.soak
        candidates = [
            ex
            for ex in live(facts)
            if ex["resumed"]
            and ex["published_since"]
            and not ex["shared"]
            and not ex["root"].startswith("s3://")
            and "%a" not in ex["root"]
        ]
        if not candidates:
            return
        target = sorted(candidates, key=lambda ex: ex["attempt"])[0]
        record = soak.cleanup(target["root"], 1)
        if any(ex["attempt"] == target["attempt"] for ex in record["live"]):
            self.done("cleanup-resumed", root=target["root"], attempt=target["attempt"])

    def after_cleanup(self, root: str, keep: int, started: float) -> dict[str, Any]:
        """What a cleanup of ``root`` left of the resume sources of the executions live on it
        then (each looked at right after it returned): the cases ``needed-missing`` checks."""
        soak = self.soak
        facts = history.read(soak.history)
        rows = [
            {
                "attempt": ex["attempt"],
                "source": ex["resumed"],
                "present": soak.present(root, _relative(root, ex["resumed"])),
            }
            for ex in live(facts, since=started)
            if ex["root"] == root and ex["resumed"]
        ]
        record = {"root": root, "keep": keep, "started": started, "t": time.time(), "live": rows}
        self.cleanups.append(record)
        return record


def live(facts: list[dict[str, Any]], since: Optional[float] = None) -> list[dict[str, Any]]:
    """The executions that beat within the last 3 s (or since ``since``) and have not ended:
    each with its root, resume source, and whether it published after it started."""
    now = time.time()
    found: dict[str, dict[str, Any]] = {}
    for fact in facts:
        attempt = fact["attempt"]
        if fact["ev"] == "start":
            # What it loaded where it said (a fallback past a torn choice), else the choice.
            source = fact["loaded"] if fact.get("loaded") is not None else fact.get("resumed")
            found[attempt] = {
                "attempt": attempt,
                "root": fact["root"],
                "resumed": source or "",
                "shared": bool(fact.get("shared")),
                "started": fact["t"],
                "published_since": False,
                "last": fact["t"],
                "ended": False,
            }
        elif attempt in found:
            ex = found[attempt]
            ex["last"] = max(ex["last"], fact["t"])
            if fact["ev"] == "published":
                ex["published_since"] = True
            elif fact["ev"] == "end":
                ex["ended"] = True
    floor = (since if since is not None else now) - 3.0
    return [ex for ex in found.values() if not ex["ended"] and ex["last"] >= floor]


def _relative(root: str, path: str) -> str:
    root = root.rstrip("/")
    return path[len(root) + 1 :] if path.startswith(root + "/") else path


def _saved_after(path: Any, since_ns: int) -> bool:
    try:
        return os.stat(path).st_mtime_ns > since_ns
    except FileNotFoundError:
        return False


def _relaunched(out: str, name: str, job: str, folder: str) -> bool:
    """A second execution of ``name``'s submission: refused by its launcher (its output), or
    running the script beside the first (two starts in the histories)."""
    starts = {
        f["attempt"] for f in history.read(folder) if f["ev"] == "start" and f.get("job") == job
    }
    if len(starts) > 1:
        return True
    try:
        names = [n for n in os.listdir(out) if n.startswith(f"{name}-")]
    except OSError:
        return False
    for entry in names:
        try:
            with open(os.path.join(out, entry), encoding="utf-8", errors="replace") as f:
                if "already started" in f.read():
                    return True
        except OSError:
            continue
    return False


def _wait(condition: Any, seconds: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())
