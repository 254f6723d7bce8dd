"""Cessation: are an ended execution's processes gone on every node it ran on?

This is the Slurm adapter's CessationSignal (``dispatch-cease``).  It proves, or fails to prove;
it never guesses.  For each node of the execution, evidence that proves:

* the node's post-kill record (its Epilog, which runs after slurmd killed the job's tracked
  processes) found no process of the execution left, or a later re-check found them all gone
  (where the node runs proctrack/cgroup but its Epilog found no place Slurm keeps jobs' cgroups,
  the evidence says the proof rests on /proc alone);
* the node booted after the execution's last known moment on it (``BootTime`` later than the
  start, end and controller end recorded, plus ``BootTimeTolerance``).

Evidence that does not prove: the node being down or not responding, survivors found, a drain
with "Kill task failed" (unless the node rebooted since), no record (a job that ran with no
fact at all under StateDir says where it looked and which dispatch.conf named it: a command
that found another file than the hooks, or none, looks elsewhere).  An execution that is still
running, completing or not yet started is not ceased.  An array has ceased only when every task
the controller knows has: each task is judged on its own, by its own records.  A task the
controller has forgotten, asked as ``A_T``, is judged by the facts filed under its own job id,
found by the controller's start that names its array and task (:func:`facts.array_task_job`).
Where a job id was used twice (a controller that lost its state numbers jobs from FirstJobId
again) and the facts carry SLUIDs (26.05), ``--sluid`` names the run judged (else the count's
latest), the verdict names it (``sluid``), and a run before the controller's job under that
id is judged by its own facts, not by the controller's word on its job.

Invariants: the controller is asked a fixed number of questions whatever the node count: one
read of the job (every task of an array, through the Slurm adapter, which never lets the job's
comment move a field) and one ``scontrol -o show node`` for all the nodes (an array's tasks
share it).  The questions go
through :class:`Controller`, so tests and the bench use a fake one.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol

from .. import _clock
from .. import config as config_module
from ..errors import ConfigError, RecordError, UsageError
from ..slurm.jobs import Job, Node
from . import facts

if TYPE_CHECKING:
    from .executions import ExecutionFacts, NodeFacts
    from .factstore import Fact
    from .procscan import Process


class Controller(Protocol):
    """The two questions cessation asks Slurm's controller (the Slurm adapter answers them)."""

    def jobs(self, job_id: str) -> list[Job]:
        """The job, or every task of an array asked by its id; [] when unknown."""

    def nodes(self, names: list[str]) -> dict[str, Node]:
        """Each named node, in one call."""


class SlurmController:
    """The real controller, through the Slurm adapter (with its retries); counts questions."""

    def __init__(self, env: Optional[dict[str, str]] = None) -> None:
        from ..slurm.adapter import Slurm

        self.slurm = Slurm()
        self.env = env
        self.calls = 0

    def jobs(self, job_id: str) -> list[Job]:
        self.calls += 1
        return self.slurm.jobs(job_id, self.env)

    def nodes(self, names: list[str]) -> dict[str, Node]:
        self.calls += 1
        return self.slurm.nodes(names, self.env)


@dataclass
class NodeEvidence:
    """What one node's records and state say about the execution."""

    node: str
    state: str  # the controller's State= for the node ("" when unknown)
    proven: bool
    evidence: str  # one line, for people
    survivors: list[Process] = field(default_factory=list)


@dataclass
class Verdict:
    """The answer: ``ceased`` is True only when every node of the execution is proven."""

    job_id: str  # as asked
    slurm_job_id: str  # Slurm's JobId
    restart: int
    job_state: str
    ceased: bool
    reason: str
    nodes: list[NodeEvidence] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tasks: list[Verdict] = field(default_factory=list)  # an array's tasks, each judged
    # Whose facts were judged (the job's owner; None: an array's tasks of several, or none
    # read): the asker checks it is its own, since a job id used twice names another's job.
    uid: Optional[int] = None
    # Slurm's id of the run judged (26.05), where its facts carry one: the asker checks it is
    # the execution it waits for, since a job id used twice holds two jobs' runs.
    sluid: str = ""

    @property
    def exit_code(self) -> int:
        return 0 if self.ceased else 1

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def load_config(path: Optional[str] = None) -> config_module.Config:
    """The site configuration; a bad file is an error naming key, value, file and line."""
    cfg = config_module.load(path)
    if cfg.problems:  # no verdict is given on a configuration other than the one meant
        raise ConfigError(config_module.refusal(cfg, "--config"))
    return cfg


def _moment(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    return _clock.instant(value)


def _describe(survivors: list[Process], limit: int = 3) -> str:
    shown = [f"pid {s.get('pid')} ({str(s.get('cmdline', ''))[:60]})" for s in survivors[:limit]]
    more = len(survivors) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def cessation(
    job_id: str,
    restart: Optional[int] = None,
    *,
    controller: Optional[Controller] = None,
    cfg: Optional[config_module.Config] = None,
    uid: Optional[int] = None,
    sluid: Optional[str] = None,
) -> Verdict:
    """Whether execution ``restart`` (default: the latest) of Slurm job ``job_id`` has ceased.

    ``sluid`` (26.05) names the run to judge among those the facts hold under the job id (a
    job id used twice, once slurmctld's state started anew, holds two jobs' runs; without it,
    the latest of the count).

    ``job_id`` may be an array's id: then every task the controller knows is judged, and the
    array has ceased only when every task's latest execution has (``--restart`` then needs a
    task id, ``97_1``).  Raises :class:`UsageError` for a job unknown to both the controller
    and the records or a restart count the job never reached, :class:`ConfigError` for a bad
    dispatch.conf and :class:`SlurmError` when the controller cannot answer.
    """
    cfg = cfg if cfg is not None else load_config()
    ctl: Controller = controller if controller is not None else SlurmController()
    if restart is not None and restart < 0:
        raise UsageError(f"--restart {restart} is negative")
    found = ctl.jobs(job_id)
    if len(found) > 1 or (
        found
        and found[0].array_task_id is not None
        and "_" not in job_id
        and found[0].job_id != job_id
    ):
        if restart is not None:
            raise UsageError(
                f"job {job_id} is an array of {len(found)} task(s); give one "
                f"task with --restart (for example {found[0].display_id})"
            )
        return _array_verdict(job_id, found, ctl, cfg, uid)
    return _one(job_id, found[0] if found else None, restart, ctl, cfg, uid, sluid)


class _NodeCache:
    """Asks the controller about nodes once for a whole array: the tasks' nodes first, in one
    call; a node only a task's records name is asked about when that task is judged."""

    def __init__(self, ctl: Controller, names: list[str]) -> None:
        self.ctl = ctl
        self.known: dict[str, Node] = ctl.nodes(names) if names else {}
        self.asked = set(names)

    def jobs(self, job_id: str) -> list[Job]:  # pragma: no cover - not asked for arrays
        return self.ctl.jobs(job_id)

    def nodes(self, names: list[str]) -> dict[str, Node]:
        missing = [n for n in names if n not in self.asked]
        if missing:
            self.known.update(self.ctl.nodes(missing))
            self.asked.update(missing)
        return {n: self.known[n] for n in names if n in self.known}


def _array_verdict(
    job_id: str, tasks: list[Job], ctl: Controller, cfg: config_module.Config, uid: Optional[int]
) -> Verdict:
    cache = _NodeCache(ctl, sorted({n for task in tasks for n in task.nodes}))
    verdicts = [_one(task.display_id, task, None, cache, cfg, uid) for task in tasks]
    unproven = [v.job_id for v in verdicts if not v.ceased]
    states = sorted({v.job_state for v in verdicts})
    reason = (
        f"all {len(verdicts)} task(s) ceased"
        if not unproven
        else f"not proven for {len(unproven)} of {len(verdicts)} task(s): "
        + ", ".join(unproven[:8])
        + (" ..." if len(unproven) > 8 else "")
    )
    owners = {v.uid for v in verdicts}
    return Verdict(
        job_id=job_id,
        slurm_job_id=tasks[0].array_job_id or job_id,
        restart=-1,
        job_state="+".join(states),
        ceased=not unproven,
        reason=reason,
        nodes=[n for v in verdicts for n in v.nodes],
        problems=[p for v in verdicts for p in v.problems],
        tasks=verdicts,
        uid=owners.pop() if len(owners) == 1 else None,
    )


#: The job state a verdict gives a job the controller does not know (MinJobAge passed).
FORGOTTEN = "unknown to the controller"


def _one(
    job_id: str,
    info: Optional[Job],
    restart: Optional[int],
    ctl: Controller,
    cfg: config_module.Config,
    uid: Optional[int],
    sluid: Optional[str] = None,
) -> Verdict:
    if info is not None:
        slurm_job_id = info.job_id
        uid = uid if uid is not None else (info.uid if info.uid >= 0 else None)
        restarts, state = info.restarts, info.state
    else:
        slurm_job_id, restarts, state = job_id, -1, FORGOTTEN
        found = _forgotten_task(job_id, cfg, uid)
        if found is not None:
            slurm_job_id, uid = found
    if (
        info is not None
        and info.array_task_id is not None
        and info.is_pending
        and info.job_id == info.array_job_id
    ):
        # A pending task shares its array's id: it has no execution of its own yet.
        return Verdict(
            job_id=job_id,
            slurm_job_id=slurm_job_id,
            restart=0,
            job_state=state,
            ceased=False,
            reason="the task has not started (PENDING)",
            uid=uid,
        )
    try:
        facts.check_name(slurm_job_id, "job id")
    except facts.FactError as exc:
        raise UsageError(str(exc)) from None
    if uid is None:
        uid = _owner(job_id, slurm_job_id, cfg)
    if info is None and slurm_job_id == job_id:
        _refuse_a_forgotten_array(job_id, cfg, uid)
    executions, problems = facts.collect(slurm_job_id, cfg.state_dir, uid)
    if problems and not executions:
        raise RecordError(f"cannot read the records of job {job_id}: " + "; ".join(problems))
    latest = {e["restart"]: e for e in executions}  # a count's latest run
    if sluid:
        executions = [e for e in executions if e.get("sluid") == sluid]
        if not executions:
            raise UsageError(
                f"job {job_id} has no records of a run with SLUID {sluid} under {cfg.state_dir}"
            )
    by_restart = {e["restart"]: e for e in executions}
    restart = _restart_judged(job_id, info, restart, by_restart, cfg)
    execution: ExecutionFacts = by_restart.get(restart) or {
        "job_id": slurm_job_id,
        "restart": restart,
        "allocated": [],
        "nodes": {},
        "problems": [],
        "controller": {"start": None, "end": None},
    }
    verdict = Verdict(
        job_id=job_id,
        slurm_job_id=slurm_job_id,
        restart=restart,
        job_state=state,
        ceased=False,
        reason="",
        problems=list(execution.get("problems", [])),
        uid=uid,
        sluid=execution.get("sluid", ""),
    )
    # The controller's job is the count's latest run: a run of the id before it (ids started
    # again) is no current execution, whatever the controller says of its own.
    current = (
        info is not None
        and restart == restarts
        and latest.get(restart) is by_restart.get(restart, latest.get(restart))
    )
    if current and info is not None and not info.execution_ended:
        verdict.reason = f"execution {restart} has not ended (JobState={state})"
        return verdict
    _judge_nodes(
        verdict, execution, info if current else None, ctl, cfg, nothing_recorded=not latest
    )
    return verdict


def _owner(job_id: str, slurm_job_id: str, cfg: config_module.Config) -> int:
    """Whose facts to judge when neither the asker nor the controller said: the caller's own,
    or for root the one user whose folder holds the job's facts (root's own where none does)."""
    uid = os.getuid()
    if uid != 0:
        return uid
    owners = facts.job_uids(cfg.state_dir, slurm_job_id)
    if len(owners) > 1:  # job ids used twice: whose this one is, nothing here says
        raise RecordError(
            f"job {job_id} is unknown to the controller, and facts of job "
            f"{slurm_job_id} are filed under "
            + " and ".join(f"uid {owner}" for owner in owners)
            + " (job ids used twice: slurmctld's state started anew, or MaxJobId "
            "wrapped); ask as the job's user"
        )
    return owners[0] if owners else 0


def _restart_judged(
    job_id: str,
    info: Optional[Job],
    restart: Optional[int],
    by_restart: Mapping[int, ExecutionFacts],
    cfg: config_module.Config,
) -> int:
    """The execution to judge: ``restart`` as asked, else the latest the controller or the
    records know; a count that never ran is a usage error."""
    restarts = info.restarts if info is not None else -1
    if restart is None:
        restart = max([restarts, *by_restart]) if (restarts >= 0 or by_restart) else None
        if restart is None:
            raise UsageError(
                f"job {job_id} is unknown to the controller and has no records "
                f"under {cfg.state_dir}"
            )
    if info is not None and restart > restarts:
        raise UsageError(
            f"job {job_id} has restart count {restarts}; --restart {restart} "
            f"never ran (valid: 0 to {restarts})"
        )
    if info is None and restart not in by_restart:
        raise UsageError(
            f"job {job_id} is unknown to the controller and has no records of "
            f"restart {restart} under {cfg.state_dir}"
        )
    return restart


def _judge_nodes(
    verdict: Verdict,
    execution: ExecutionFacts,
    current: Optional[Job],
    ctl: Controller,
    cfg: config_module.Config,
    nothing_recorded: bool,
) -> None:
    """Judge each node of the execution, and the execution by them; ``current`` is the
    controller's job where the execution judged is its current one."""
    restart = verdict.restart
    nodes: list[str] = list(current.nodes) if current is not None else []
    allocated = list(execution.get("allocated") or [])
    recorded = list(execution["nodes"])
    for name in [*allocated, *recorded]:
        if name not in nodes:
            nodes.append(name)
    if not nodes:
        if current is not None and current.start_time is None:
            verdict.ceased = True
            verdict.reason = f"execution {restart} never started on any node"
        else:
            verdict.reason = (
                f"no record of the nodes execution {restart} ran on (no controller or node facts)"
            )
        return
    if current is None and not allocated:
        verdict.problems.append(
            f"no controller record of execution {restart}'s allocation: "
            "the nodes are those that recorded a start"
        )

    node_info = ctl.nodes(nodes)
    ctld_end = execution["controller"].get("end") or {}
    ends = [ctld_end.get("time")]
    if current is not None:
        ends.append(current.end_time)
    for name in nodes:
        verdict.nodes.append(
            _node_evidence(
                name,
                execution["nodes"].get(name),
                node_info.get(name),
                [t for t in ends if isinstance(t, (int, float))],
                cfg.boot_time_tolerance,
            )
        )
    _hint_silent_epilogs(
        verdict.nodes,
        execution,
        cfg,
        max((t for t in ends if isinstance(t, (int, float))), default=None),
    )
    unproven = [n.node for n in verdict.nodes if not n.proven]
    if current is None and not allocated:
        unproven.append("(allocation unknown)")
    verdict.ceased = not unproven
    verdict.reason = (
        f"all {len(nodes)} node(s) proven"
        if verdict.ceased
        else _nothing_recorded(verdict.job_id, cfg)
        if nothing_recorded
        else f"not proven on {len(unproven)} of {len(nodes)} node(s): "
        + ", ".join(unproven[:8])
        + (" ..." if len(unproven) > 8 else "")
    )


def _nothing_recorded(job_id: str, cfg: config_module.Config) -> str:
    """Why a job that ran on nodes has no fact at all: where this command looked, and which
    dispatch.conf said so (the commands find it beside $SLURM_CONF, else in /etc/slurm: a
    user's shell without either reads another file than the hooks, or none)."""
    where = (
        f"the StateDir of {cfg.path}"
        if cfg.path
        else f"no dispatch.conf at {config_module.config_path()}, so the default StateDir"
    )
    return (
        f"nothing of job {job_id} is recorded under {cfg.state_dir} ({where}): the site's "
        "hooks record elsewhere (point SLURM_DISPATCH_CONF at the dispatch.conf they read) "
        "or are not installed (dispatch-admin doctor)"
    )


def _refuse_a_forgotten_array(job_id: str, cfg: config_module.Config, uid: int) -> None:
    """A job id the controller no longer knows whose own controller start says it was that
    array's (a task that kept the array's id): one task's facts do not judge the array, so a
    UsageError naming the tasks the facts name."""
    starts, _ = facts.read_job_facts(cfg.state_dir, uid, job_id, ("ctld-start.",))
    if not any(f.get("array_job_id") == job_id for f in starts):
        return
    tasks = sorted(
        {
            (int(t), t, name)
            for name, named in facts.array_starts(cfg.state_dir, uid, job_id)
            for a, t in named
            if a == job_id and t.isascii() and t.isdigit()
        }
    )
    shown = ", ".join(f"{job_id}_{t} (job {name})" for _, t, name in tasks[:8]) + (
        " ..." if len(tasks) > 8 else ""
    )
    raise UsageError(
        f"job {job_id} is unknown to the controller, and its facts say it was "
        f"array {job_id}: give one task (its facts name {shown}), each judged by "
        "its own facts"
    )


def _forgotten_task(
    job_id: str, cfg: config_module.Config, uid: Optional[int]
) -> Optional[tuple[str, int]]:
    """For ``A_T`` the controller no longer knows (MinJobAge passed): the task's own job id,
    under which its facts are filed, and their owner, as the controller's start of the task
    says (:func:`facts.array_task_job`); None when no facts say so.  Root, not told the user,
    looks through the facts of the owners of folder ``A`` first, then, when none of theirs
    names the task, every other user's.  Facts that name the task more than once (job ids used
    twice: in two folders, or two users' of one of those groups) are a RecordError: which job
    it was is not known, so nothing is judged, never ceased."""
    array, sep, task = job_id.partition("_")
    if not sep or not (array.isdigit() and task.isdigit()):
        return None
    if uid is None and os.getuid() != 0:
        uid = os.getuid()
    if uid is not None:
        groups = [[uid]]
    else:  # the array's own folder's owners first (one of its tasks ran as A), then the rest
        first = facts.job_uids(cfg.state_dir, array)
        try:
            groups = [first, [u for u in facts.fact_uids(cfg.state_dir) if u not in first]]
        except facts.FactError:
            groups = [first]
    for owners in groups:
        found: list[tuple[str, int]] = []
        for owner in owners:
            try:
                own = facts.array_task_job(cfg.state_dir, owner, array, task)
            except facts.FactError as exc:
                raise RecordError(
                    f"job {job_id} is unknown to the controller, and its facts "
                    f"do not say which job it was: {exc}; ask by the task's own "
                    "job id"
                ) from None
            if own is not None:
                found.append((own, owner))
        if len(found) > 1:
            raise RecordError(
                f"job {job_id} is unknown to the controller, and its facts do not "
                "say which job it was: the facts of "
                + " and ".join(f"job {own} of uid {owner}" for own, owner in found)
                + f" each name array {array} task {task} (job ids used twice: "
                "slurmctld's state started anew, or MaxJobId wrapped); ask by the "
                "task's own job id as its user"
            )
        if found:
            return found[0]
    return None


# How long after an execution's end its Epilog may still be running: before that, a node with no
# end yet is not suspected of having an Epilog that does not run.
EPILOG_GRACE = 60.0
NO_END = "no post-kill record (its Epilog has not recorded an end)"


def _hint_silent_epilogs(
    judged: list[NodeEvidence],
    execution: ExecutionFacts,
    cfg: config_module.Config,
    ended: Optional[float],
) -> None:
    """Say so on each node without an end that has recorded no end for any job since this
    execution started there: its Epilog is likely not installed or not working.  Asked only
    when some node has no end, of the file names alone (root can list them; others get no
    hint)."""
    silent = [n for n in judged if n.evidence.startswith(NO_END)]
    if not silent:
        return
    started = {}
    for evidence in silent:
        recorded: Mapping[str, Any] = execution["nodes"].get(evidence.node) or {}
        moment = (recorded.get("start") or {}).get("time")
        if not isinstance(moment, (int, float)):
            moment = (execution["controller"].get("start") or {}).get("time")
        if isinstance(moment, (int, float)):
            started[evidence.node] = float(moment)
    if not started:
        return
    activity = facts.node_activity(cfg.state_dir, set(started), min(started.values()))
    if activity is None:
        return
    import time

    late = ended is not None and time.time() - ended > EPILOG_GRACE
    for evidence in silent:
        since = started.get(evidence.node)
        if since is None:
            continue
        starts = [t for t in activity[evidence.node]["start"] if t >= since - 1]
        ends = [t for t in activity[evidence.node]["end"] if t >= since - 1]
        # Right after the end its Epilog may still be running: suspect it only once it is
        # late, or once the node has started another job since.
        if ends or not (late or len(starts) > 1):
            continue
        evidence.evidence += (
            f"; {evidence.node} has recorded no end for any job since "
            f"{_moment(since)} ({len(starts)} start(s) since): its Epilog "
            "is likely not installed or not working (run "
            f"`dispatch-admin doctor` on {evidence.node})"
        )


def _node_evidence(
    name: str,
    recorded: Optional[NodeFacts],
    node: Optional[Node],
    ends: list[float],
    tolerance: float,
) -> NodeEvidence:
    state = node.state if node is not None else "(unknown node)"
    reason = node.reason if node is not None else ""
    known: Mapping[str, Any] = recorded or {}
    start, end = known.get("start") or {}, known.get("end")
    own = [
        t
        for t in (f.get("time") for f in (start, end or {}, known.get("recheck") or {}))
        if isinstance(t, (int, float))
    ]
    last_moment = max([*ends, *own], default=None)
    booted = node.boot_time if node is not None else None
    # BootTime is the node's clock; the controller's moments are the controller's: a reboot
    # proves only past a record of the node's own (with none, a node clock ahead of the
    # controller's reads a boot before the execution's end as one after it).
    if booted is not None and own and last_moment is not None and booted > last_moment + tolerance:
        return NodeEvidence(
            name,
            state,
            True,
            f"rebooted at {_moment(booted)}, after the "
            f"execution's last record there ({_moment(last_moment)})",
        )
    if "kill task failed" in reason.lower():
        return NodeEvidence(
            name,
            state,
            False,
            f"drained: {reason}; not rebooted since",
            list(known.get("survivors") or []),
        )
    if end is None:
        flags = [f for f in ("DOWN", "NOT_RESPONDING", "FAIL") if f in state.upper()]
        why = f"; node {'+'.join(flags)}" if flags else ""
        return NodeEvidence(name, state, False, f"{NO_END}{why}")
    if end.get("scan_error"):
        return NodeEvidence(
            name,
            state,
            False,
            f"Epilog at {_moment(end.get('time'))} could not "
            f"look for survivors: {end.get('scan_error')}",
        )
    survivors = list(known.get("survivors") or [])
    recheck = known.get("recheck")
    if survivors:
        when = _moment((recheck or end).get("time"))
        return NodeEvidence(
            name,
            state,
            False,
            f"{len(survivors)} survivor(s) at {when}: {_describe(survivors)}",
            survivors,
        )
    if recheck is not None:
        return NodeEvidence(
            name,
            state,
            True,
            f"Epilog at {_moment(end.get('time'))} {_epilog_saw(end)}; all gone at "
            f"{_moment(recheck.get('time'))} ({recheck.get('reason', 're-check')})",
        )
    return NodeEvidence(
        name,
        state,
        True,
        f"Epilog at {_moment(end.get('time'))}: no process left after the kill"
        f"{_cgroup_unread(end)}",
    )


def _epilog_saw(end: Fact) -> str:
    """What an Epilog that a re-check followed saw: survivors it read, and PIDs its scan could
    not read by its deadline (on a loaded node, processes vanishing under every round), which
    are no survivors found."""
    found = list(end.get("survivors") or [])
    unread = sum(1 for s in found if s.get("unresolved"))
    said = [f"found {len(found) - unread} survivor(s)"] if len(found) > unread or not found else []
    if unread:
        said.append(f"could not read {unread} PID(s) by its deadline")
    return " and ".join(said)


def _cgroup_unread(end: Fact) -> str:
    """Where the node runs proctrack/cgroup but its Epilog found no place Slurm keeps jobs'
    cgroups: said beside the proof, which then rests on /proc alone."""
    cgroup = end.get("cgroup")
    missing = cgroup.get("missing") if isinstance(cgroup, dict) else None
    return f" (by /proc alone: {missing})" if isinstance(missing, str) and missing else ""


def render(verdict: Verdict) -> str:
    """The table ``dispatch-cease`` prints, aligned as squeue aligns, and a last verdict line
    (for an array: a TASK column, a line per task, then the array's line)."""
    judged = verdict.tasks or [verdict]
    head = ["TASK"] if verdict.tasks else []
    rows = [[*head, "NODE", "STATE", "CEASED", "EVIDENCE"]]
    for one in judged:
        rows += [
            [
                *([one.job_id] if verdict.tasks else []),
                n.node,
                n.state or "-",
                "yes" if n.proven else "no",
                n.evidence,
            ]
            for n in one.nodes
        ]
    fixed = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(fixed)]
    lines = (
        [
            " ".join([*(r[i].ljust(widths[i]) for i in range(fixed)), r[fixed]]).rstrip()
            for r in rows
        ]
        if len(rows) > 1
        else []
    )
    for problem in dict.fromkeys(verdict.problems):
        lines.append(f"problem: {problem}")
    for one in verdict.tasks:
        lines.append(_verdict_line(one))
    if verdict.tasks:
        answer = "ceased" if verdict.ceased else "not proven"
        lines.append(
            f"array job {verdict.job_id} ({len(verdict.tasks)} task(s)): {answer}: {verdict.reason}"
        )
    else:
        lines.append(_verdict_line(verdict))
    return "\n".join(lines)


def _verdict_line(verdict: Verdict) -> str:
    answer = "ceased" if verdict.ceased else "not proven"
    state = verdict.job_state
    if state == FORGOTTEN and verdict.slurm_job_id != verdict.job_id:
        # A forgotten task found by its array: whose facts judged it, for the person reading.
        state += f"; judged by the facts of job {verdict.slurm_job_id}"
    return f"job {verdict.job_id} restart {verdict.restart} ({state}): {answer}: {verdict.reason}"
