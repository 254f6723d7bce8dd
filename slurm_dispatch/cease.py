"""Cessation: are an ended execution's processes gone on every node it ran on?

This is the Slurm adapter's CessationSignal (``dispatch-cease``).  It proves, or fails to prove;
it never guesses.  For each node of the execution, evidence that proves:

* the node's post-kill record (its Epilog, which runs after slurmd killed the job's tracked
  processes) found no process of the execution left, or a later re-check found them all gone;
* the node booted after the execution's last known moment on it (``BootTime`` later than the
  start, end and controller end recorded, plus ``BootTimeTolerance``).

Evidence that does not prove: the node being down or not responding, survivors found, a drain
with "Kill task failed" (unless the node rebooted since), no record.  An execution that is still
running, completing or not yet started is not ceased.

Invariant: the controller is asked a fixed number of questions whatever the node count: one
``scontrol -o show job`` and at most one ``scontrol -o show node`` for all the nodes.  The
questions go through :class:`Controller`, so tests and the bench use a fake one.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Protocol

from . import config as config_module
from . import facts
from .errors import ConfigError, RecordError, SlurmError, UsageError

# Job states in which the current execution has ended (scontrol JobState, 22.05).
ENDED_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT",
})


class Controller(Protocol):
    """The two questions cessation asks Slurm's controller."""

    def job(self, job_id: str) -> Optional[dict[str, str]]:
        """``scontrol -o show job`` fields, or None when the controller does not know the job."""

    def nodes(self, names: list[str]) -> dict[str, dict[str, str]]:
        """``scontrol -o show node`` fields of each named node, in one call."""


class ScontrolController:
    """The real controller, through ``scontrol`` (slurm_dispatch.slurm, with its retries)."""

    def __init__(self, env: Optional[dict[str, str]] = None) -> None:
        from .slurm import Slurm
        self.slurm = Slurm()
        self.env = env
        self.calls = 0

    def job(self, job_id: str) -> Optional[dict[str, str]]:
        from .slurm import parse_record
        self.calls += 1
        try:
            result = self.slurm.call(["scontrol", "-o", "show", "job", job_id], self.env)
        except SlurmError as exc:
            if "invalid job id" in exc.output.lower():
                return None
            raise
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        if not lines:
            return None
        return parse_record(lines[0])

    def nodes(self, names: list[str]) -> dict[str, dict[str, str]]:
        from .slurm import parse_record
        self.calls += 1
        result = self.slurm.call(["scontrol", "-o", "show", "node", ",".join(names)], self.env)
        found = {}
        for line in result.stdout.splitlines():
            if line.strip():
                record = parse_record(line)
                found[record.get("NodeName", "")] = record
        return found


@dataclass
class NodeEvidence:
    """What one node's records and state say about the execution."""

    node: str
    state: str  # the controller's State= for the node ("" when unknown)
    proven: bool
    evidence: str  # one line, for people
    survivors: list[dict[str, Any]] = field(default_factory=list)


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

    @property
    def exit_code(self) -> int:
        return 0 if self.ceased else 1

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def load_config(path: Optional[str] = None) -> config_module.Config:
    """The site configuration; a bad file is an error naming key, value, file and line."""
    cfg = config_module.load(path)
    if cfg.problems:
        raise ConfigError("dispatch.conf: " + "; ".join(cfg.problems))
    return cfg


def slurm_time(value: Optional[str]) -> Optional[float]:
    """``2026-11-30T06:22:31`` (local time, as scontrol prints it) to seconds; else None."""
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _uid(fields: dict[str, str]) -> Optional[int]:
    # UserId=alice(1000)
    value = fields.get("UserId", "")
    if "(" in value and value.endswith(")"):
        inner = value[value.rfind("(") + 1:-1]
        if inner.isdigit():
            return int(inner)
    return None


def _clock(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value))


def _describe(survivors: list[dict[str, Any]], limit: int = 3) -> str:
    shown = [f"pid {s.get('pid')} ({str(s.get('cmdline', ''))[:60]})" for s in survivors[:limit]]
    more = len(survivors) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def cessation(job_id: str, restart: Optional[int] = None, *,
              controller: Optional[Controller] = None,
              cfg: Optional[config_module.Config] = None,
              uid: Optional[int] = None) -> Verdict:
    """Whether execution ``restart`` (default: the latest) of Slurm job ``job_id`` has ceased.

    Raises :class:`UsageError` for a job unknown to both the controller and the records or a
    restart count the job never reached, :class:`ConfigError` for a bad dispatch.conf and
    :class:`SlurmError` when the controller cannot answer.
    """
    cfg = cfg if cfg is not None else load_config()
    ctl: Controller = controller if controller is not None else ScontrolController()
    if restart is not None and restart < 0:
        raise UsageError(f"--restart {restart} is negative")
    info = ctl.job(job_id)
    if info is not None:
        slurm_job_id = info.get("JobId", job_id)
        uid = uid if uid is not None else _uid(info)
        restarts = int(info.get("Restarts", "0") or 0)
        state = info.get("JobState", "")
    else:
        slurm_job_id, restarts, state = job_id, -1, "(unknown to the controller)"
    try:
        facts.check_name(slurm_job_id, "job id")
    except facts.FactError as exc:
        raise UsageError(str(exc)) from None
    if uid is None:
        uid = os.getuid()
        if uid == 0:
            owners = facts.job_uids(cfg.state_dir, slurm_job_id)
            uid = owners[0] if owners else 0
    executions, problems = facts.collect(slurm_job_id, cfg.state_dir, uid)
    if problems and not executions:
        raise RecordError(f"cannot read the records of job {job_id}: " + "; ".join(problems))
    by_restart = {e["restart"]: e for e in executions}
    if restart is None:
        restart = max([restarts, *by_restart]) if (restarts >= 0 or by_restart) else None
        if restart is None:
            raise UsageError(f"job {job_id} is unknown to the controller and has no records "
                             f"under {cfg.state_dir}")
    if info is not None and restart > restarts:
        raise UsageError(f"job {job_id} has restart count {restarts}; --restart {restart} "
                         f"never ran (valid: 0 to {restarts})")
    if info is None and restart not in by_restart:
        raise UsageError(f"job {job_id} is unknown to the controller and has no records of "
                         f"restart {restart} under {cfg.state_dir}")
    execution = by_restart.get(restart) or {"allocated": [], "nodes": {}, "problems": [],
                                            "controller": {"start": None, "end": None}}
    verdict = Verdict(job_id=job_id, slurm_job_id=slurm_job_id, restart=restart,
                      job_state=state, ceased=False, reason="",
                      problems=list(execution.get("problems", [])))
    current = info is not None and restart == restarts
    if current and state not in ENDED_STATES:
        verdict.reason = f"execution {restart} has not ended (JobState={state})"
        return verdict

    nodes: list[str] = []
    if current:
        try:
            nodes = facts.expand_hostlist(info.get("NodeList", "") if info else "")
        except ValueError as exc:
            verdict.problems.append(str(exc))
    allocated = list(execution.get("allocated") or [])
    recorded = list(execution["nodes"])
    for name in [*allocated, *recorded]:
        if name not in nodes:
            nodes.append(name)
    if not nodes:
        if current and slurm_time(info.get("StartTime") if info else None) is None:
            verdict.ceased = True
            verdict.reason = f"execution {restart} never started on any node"
        else:
            verdict.reason = (f"no record of the nodes execution {restart} ran on (no "
                              "controller or node facts)")
        return verdict
    if not current and not allocated:
        verdict.problems.append(f"no controller record of execution {restart}'s allocation: "
                                "the nodes are those that recorded a start")

    node_info = ctl.nodes(nodes)
    ctld_end = execution["controller"].get("end") or {}
    ends = [ctld_end.get("time")]
    if current and info is not None:
        ends.append(slurm_time(info.get("EndTime")))
    for name in nodes:
        verdict.nodes.append(_node_evidence(name, execution["nodes"].get(name), node_info.get(name),
                                            [t for t in ends if isinstance(t, (int, float))],
                                            cfg.boot_time_tolerance))
    unproven = [n.node for n in verdict.nodes if not n.proven]
    if not current and not allocated:
        unproven.append("(allocation unknown)")
    verdict.ceased = not unproven
    verdict.reason = (f"all {len(nodes)} node(s) proven" if verdict.ceased else
                      f"not proven on {len(unproven)} of {len(nodes)} node(s): "
                      + ", ".join(unproven[:8]) + (" ..." if len(unproven) > 8 else ""))
    return verdict


def _node_evidence(name: str, recorded: Optional[dict[str, Any]],
                   node: Optional[dict[str, str]], ends: list[float],
                   tolerance: float) -> NodeEvidence:
    state = (node or {}).get("State", "") if node is not None else "(unknown node)"
    reason = (node or {}).get("Reason", "")
    recorded = recorded or {}
    start, end = recorded.get("start") or {}, recorded.get("end")
    moments = [*ends, *(f.get("time") for f in (start, end or {}, recorded.get("recheck") or {}))]
    last_moment = max((t for t in moments if isinstance(t, (int, float))), default=None)
    booted = slurm_time((node or {}).get("BootTime"))
    if booted is not None and last_moment is not None and booted > last_moment + tolerance:
        return NodeEvidence(name, state, True, f"rebooted at {_clock(booted)}, after the "
                            f"execution's last record there ({_clock(last_moment)})")
    if "kill task failed" in reason.lower():
        return NodeEvidence(name, state, False, f"drained: {reason}; not rebooted since",
                            list(recorded.get("survivors") or []))
    if end is None:
        flags = [f for f in ("DOWN", "NOT_RESPONDING", "FAIL") if f in state.upper()]
        why = f"; node {'+'.join(flags)}" if flags else ""
        return NodeEvidence(name, state, False,
                            f"no post-kill record (its Epilog has not recorded an end){why}")
    if end.get("scan_error"):
        return NodeEvidence(name, state, False, f"Epilog at {_clock(end.get('time'))} could not "
                            f"look for survivors: {end.get('scan_error')}")
    survivors = list(recorded.get("survivors") or [])
    recheck = recorded.get("recheck")
    if survivors:
        when = _clock((recheck or end).get("time"))
        return NodeEvidence(name, state, False,
                            f"{len(survivors)} survivor(s) at {when}: {_describe(survivors)}",
                            survivors)
    if recheck is not None:
        return NodeEvidence(name, state, True, f"Epilog at {_clock(end.get('time'))} found "
                            f"{len(end.get('survivors') or [])} survivor(s); all gone at "
                            f"{_clock(recheck.get('time'))} ({recheck.get('reason', 're-check')})")
    return NodeEvidence(name, state, True,
                        f"Epilog at {_clock(end.get('time'))}: no process left after the kill")


def render(verdict: Verdict) -> str:
    """The table ``dispatch-cease`` prints, aligned as squeue aligns, and a last verdict line."""
    rows = [["NODE", "STATE", "CEASED", "EVIDENCE"]]
    rows += [[n.node, n.state or "-", "yes" if n.proven else "no", n.evidence]
             for n in verdict.nodes]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [" ".join([*(r[i].ljust(widths[i]) for i in range(3)), r[3]]).rstrip()
             for r in rows] if verdict.nodes else []
    for problem in verdict.problems:
        lines.append(f"problem: {problem}")
    answer = "ceased" if verdict.ceased else "not proven"
    lines.append(f"job {verdict.job_id} restart {verdict.restart} ({verdict.job_state}): "
                 f"{answer}: {verdict.reason}")
    return "\n".join(lines)

