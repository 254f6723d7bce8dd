"""Facts grouped into executions: what the hooks recorded about each run of one Slurm job.

An execution is one run of a job id (Slurm's restart count R).  A node's ``end`` is tied to the
``start`` the same node recorded (by token), never to the restart count the Epilog saw, which is
not reliable (FIELD-NOTES); a ``recheck`` is tied to the ``end`` it re-checks (by token).  Where
the starts carry SLUIDs (26.05), two runs of one count with different SLUIDs are two executions
(``"sluid"`` in each), oldest first: the job id was used twice, once a controller lost its
state; facts without one go by the count alone.

Invariant: pure grouping over facts read through :mod:`slurm_dispatch.node.factstore`; a problem met
while reading is carried in every execution's ``problems``, never dropped.
"""

from __future__ import annotations

import os

from ..errors import FactError
from .factstore import job_uids, read_job_facts

__all__ = ["collect", "execution_facts", "group_executions"]

TYPE_CHECKING = False  # typing is not imported at run time: the hooks import this module
if TYPE_CHECKING:
    from typing import Optional, TypedDict

    from .factstore import Fact
    from .procscan import Process

    # The typed views of what this module returns, for its readers (status text, cessation):
    # defined for the type checker only, so they cost the hooks nothing.  A fact itself is a
    # dict as the hooks wrote it (node/factstore.py's Fact).

    class _EndState(TypedDict, total=False):
        # Not written by this version's hooks (Slurm 22.05 gives them no job state); the
        # readers (status) prefer it where an end carries it.
        state: str

    class EndSummary(_EndState):
        """How an execution ended, as the hooks saw it (:func:`_end_summary`)."""

        time: Optional[float]
        source: Optional[str]  # "controller" | "node"; None when only a later run shows it
        exit_code: Optional[str]  # Slurm's "3:0"
        derived_exit_code: Optional[str]
        requeued: bool

    class NodeFacts(TypedDict):
        """One node's word on one execution; ``ceased`` None: the node recorded no end."""

        start: Optional[Fact]
        end: Optional[Fact]
        recheck: Optional[Fact]
        survivors: list[Process]
        ceased: Optional[bool]

    class ControllerFacts(TypedDict):
        start: Optional[Fact]
        end: Optional[Fact]

    class _Ended(TypedDict, total=False):
        end: Optional[EndSummary]  # set once every execution of the job is grouped
        # Slurm's id of the run (26.05), where its facts carry one: two runs of one count are
        # two jobs under one id (ids started again once a controller lost its state).
        sluid: str

    class ExecutionFacts(_Ended):
        """One execution of a Slurm job: :func:`execution_facts`' items."""

        job_id: str
        restart: int
        allocated: list[str]
        controller: ControllerFacts
        nodes: dict[str, NodeFacts]
        problems: list[str]


def _restart_of(fact: Fact) -> int | None:
    value = fact.get("restart")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def execution_facts(
    slurm_job_id: str, state_dir: str | None = None, uid: int | None = None
) -> list[ExecutionFacts]:
    """What the hooks recorded about each execution of a Slurm job, oldest execution first.

    ``slurm_job_id`` is Slurm's own id (for an array element, its JobId, not ``A_T``).
    ``state_dir`` defaults to the site's ``StateDir``; ``uid`` to the caller's uid (root, which
    may list every user's folder, finds the owner itself).  Each item::

        {"job_id": "123", "restart": 0,
         "allocated": ["n1", "n2"],          # nodes the controller allocated (ctld facts), or []
         "controller": {"start": fact | None, "end": fact | None},
         "nodes": {"n1": {"start": fact | None, "end": fact | None, "recheck": fact | None,
                          "survivors": [...], "ceased": True | False | None}},
         "end": {"time", "source": "controller" | "node", "exit_code": "3:0",
                 "derived_exit_code", "requeued": bool} | None,
         "problems": ["..."]}

    ``ceased`` is the node's own word: True when its post-kill scan (or a later re-check) found
    nothing left, False when something was left, None when the node recorded no end.  A fact is a
    dict as written (``time`` in seconds since the epoch, ``boot_id``, ``boot_time``, ...).
    Unreadable or untrusted facts are named in ``problems`` of every execution; when nothing
    could be read at all, :class:`FactError` says why.  No facts at all is an empty list.
    """
    if state_dir is None:
        from .. import config

        state_dir = config.load().state_dir
    if uid is None:
        uid = os.getuid()
        if uid == 0:
            owners = job_uids(state_dir, slurm_job_id)
            if owners:
                uid = owners[0]
    found, problems = collect(slurm_job_id, state_dir, uid)
    if problems and not found:
        raise FactError("; ".join(problems))
    return found


def collect(slurm_job_id: str, state_dir: str, uid: int) -> tuple[list[ExecutionFacts], list[str]]:
    """:func:`execution_facts` and the problems met, without raising."""
    found, problems = read_job_facts(state_dir, uid, slurm_job_id)
    return group_executions(slurm_job_id, found, problems), problems


def group_executions(job_id: str, facts: list[Fact], problems: list[str]) -> list[ExecutionFacts]:
    """Group facts by execution; an end is tied to the start its own node recorded."""
    grouping = _Grouping(job_id, facts, problems)
    for fact in facts:
        kind = fact.get("kind")
        if kind == "start":
            grouping.node_start(fact)
        elif kind == "end":
            grouping.node_end(fact)
        elif kind in ("ctld-start", "ctld-end"):
            grouping.controller_fact(fact)
    for fact in facts:
        if fact.get("kind") == "recheck":
            grouping.recheck(fact)
    return grouping.ordered()


class _Grouping:
    """One job's facts being grouped: the executions met so far, and the ties between facts."""

    def __init__(self, job_id: str, facts: list[Fact], problems: list[str]) -> None:
        self.job_id = job_id
        self.problems = problems
        self.starts = {f.get("token"): f for f in facts if f.get("kind") == "start"}
        self.ctld_starts = {f.get("token"): f for f in facts if f.get("kind") == "ctld-start"}
        self.executions: dict[tuple[int, str], ExecutionFacts] = {}
        self.lives = _lives(facts)
        self.ends_by_token: dict[str, tuple[tuple[int, str], str]] = {}
        # Tokens of ends tied to no start, so far, by execution and node.
        self.untied: dict[tuple[tuple[int, str], str], list[str]] = {}

    def key_of(self, restart: int, fact: Fact) -> tuple[int, str]:
        """The execution a fact of count ``restart`` belongs to: the run of its SLUID where
        it carries one the count's starts do, else the count's latest run."""
        known = self.lives.get(restart) or [""]
        sluid = str(fact.get("sluid") or "")
        return (restart, sluid if sluid in known else known[-1])

    def execution(self, key: tuple[int, str]) -> ExecutionFacts:
        if key not in self.executions:
            self.executions[key] = {
                "job_id": self.job_id,
                "restart": key[0],
                "allocated": [],
                "controller": {"start": None, "end": None},
                "nodes": {},
                "problems": list(self.problems),
            }
            if key[1]:
                self.executions[key]["sluid"] = key[1]
        return self.executions[key]

    def node_entry(self, key: tuple[int, str], node: str) -> NodeFacts:
        return self.execution(key)["nodes"].setdefault(
            node, {"start": None, "end": None, "recheck": None, "survivors": [], "ceased": None}
        )

    def drop_stray_end(self, key: tuple[int, str], node: str) -> None:
        # Called for a start of the node's execution: an end of the node read before it
        # (facts come oldest first, the node's own by its own clock) that is tied to no start
        # was written by an Epilog that found no open start before this execution began, and
        # says nothing of it, nor do the re-checks of its survivors (the start's own end,
        # which shares its token, may have been read before it).
        entry = self.node_entry(key, node)
        for token in self.untied.pop((key, node), []):
            self.ends_by_token.pop(token, None)
        stray = entry["end"]
        if stray is not None and stray.get("start_token") not in self.starts:
            entry.update({"end": None, "survivors": [], "ceased": None})

    def node_start(self, fact: Fact) -> None:
        restart = _restart_of(fact)
        if restart is None:
            return
        node = str(fact.get("node", ""))
        key = self.key_of(restart, fact)
        entry = self.node_entry(key, node)
        self.drop_stray_end(key, node)
        if entry["start"] is None or entry["start"].get("time", 0) < fact.get("time", 0):
            entry["start"] = fact

    def node_end(self, fact: Fact) -> None:
        start = self.starts.get(fact.get("start_token"))
        restart = _restart_of(start) if start is not None else _restart_of(fact)
        if restart is None or start is None and restart > 0:
            # Tied to no start, under a count after a requeue: the Epilog of the execution
            # before, given the next count (24.11), or this execution's whose Prolog
            # recorded nothing; which one, nothing but the order of two clocks (the node's
            # and the controller's) would say.  It is no execution's post-kill record.
            return
        node = str(fact.get("node", ""))
        key = self.key_of(restart, start if start is not None else fact)
        entry = self.node_entry(key, node)
        entry["end"] = fact
        if start is not None:
            entry["start"] = start
        survivors = fact.get("survivors") or []
        entry["survivors"] = survivors
        entry["ceased"] = not survivors and not fact.get("scan_error")
        self.ends_by_token[str(fact.get("token"))] = (key, node)
        if start is None:
            self.untied.setdefault((key, node), []).append(str(fact.get("token")))

    def controller_fact(self, fact: Fact) -> None:
        kind = fact.get("kind")
        # A controller's end is tied to the start it closes (its restart count may be the
        # next execution's: Slurm gives EpilogSlurmctld the count after a requeue).
        closes = self.ctld_starts.get(fact.get("start_token")) if kind == "ctld-end" else None
        restart = _restart_of(closes if closes is not None else fact)
        if restart is None:
            return
        item = self.execution(self.key_of(restart, closes if closes is not None else fact))
        if kind == "ctld-start":
            # An end tied to no start that it may take for an earlier one's is under count 0
            # (no execution before it), and the controller's clock is not the node's: it
            # drops none (a node's own start, read by the node's clock, does).
            stray = item["controller"]["end"]
            if stray is not None and stray.get("start_token") not in self.ctld_starts:
                item["controller"]["end"] = None  # the same of the controller's end
        item["controller"]["start" if kind == "ctld-start" else "end"] = fact
        allocated = fact.get("nodes")
        # A controller's end tied to no start under a count after a requeue may be the
        # execution before's (given the next count, its PrologSlurmctld having recorded
        # nothing): its nodes are no allocation of this one.
        if (
            isinstance(allocated, list)
            and allocated
            and (not item["allocated"] or kind == "ctld-start")
            and (kind == "ctld-start" or closes is not None or restart == 0)
        ):
            item["allocated"] = [str(n) for n in allocated]

    def recheck(self, fact: Fact) -> None:
        tied = self.ends_by_token.get(str(fact.get("end_token")))
        if tied is None:
            return
        entry = self.node_entry(*tied)
        if entry["recheck"] is None or entry["recheck"].get("time", 0) <= fact.get("time", 0):
            entry["recheck"] = fact
            if not fact.get("scan_error"):
                entry["survivors"] = fact.get("survivors") or []
                entry["ceased"] = not entry["survivors"]

    def ordered(self) -> list[ExecutionFacts]:
        """By count, and a count's runs oldest first (its SLUIDs in the order they were met),
        each with its end summed up."""
        executions = self.executions
        ordered = [
            executions[(r, life)]
            for r in sorted({k[0] for k in executions})
            for life in self.lives.get(r) or [""]
            if (r, life) in executions
        ]
        for item in ordered:
            item["end"] = _end_summary(item, later=item is not ordered[-1])
        return ordered


def _lives(facts: list[Fact]) -> dict[int, list[str]]:
    """Each restart count's runs, by the SLUID its starts carry, oldest first: one, unless the
    job id started again (a controller that lost its state) and two jobs ran under it."""
    lives: dict[int, list[str]] = {}
    for fact in facts:
        restart, sluid = _restart_of(fact), str(fact.get("sluid") or "")
        if fact.get("kind") in ("start", "ctld-start") and restart is not None and sluid:
            if sluid not in lives.setdefault(restart, []):
                lives[restart].append(sluid)
    return lives


def _end_summary(execution: ExecutionFacts, later: bool) -> EndSummary | None:
    """The end as the hooks saw it.  Slurm 22.05 gives hooks no job state (no SLURM_JOB_STATE;
    the exit code is 0:0 for a cancelled or node-failed job too), so this is the exit code, and
    ``requeued`` when a later execution of the same job id was recorded."""
    source = execution["controller"].get("end")
    origin = "controller"
    if source is None:
        ends = [n["end"] for n in execution["nodes"].values() if n.get("end")]
        source = ends[-1] if ends else None
        origin = "node"
    if source is None and not later:
        return None
    slurm = (source or {}).get("slurm") or {}
    return {
        "time": (source or {}).get("time"),
        "source": origin if source else None,
        "exit_code": slurm.get("SLURM_JOB_EXIT_CODE2"),
        "derived_exit_code": slurm.get("SLURM_JOB_DERIVED_EC"),
        "requeued": later,
    }
