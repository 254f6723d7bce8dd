"""Bad nodes avoided (``--avoid-bad-nodes N``): which nodes a lineage's next execution keeps
off, and how many of them it can keep off.

A node is bad for a lineage (the whole job, or one array task) once an execution of the
lineage ended by the node's failure there (Slurm's ``NODE_FAIL``), or once N of its executions
failed (``FAILED``: the script's own non-zero exit) on it.  What an execution's end was comes
from what the project already holds: Slurm's end state of a submission (the supervisor's view
of it, the next submission's reason, the finished event), and for an execution Slurm requeued,
the hooks' per-node facts: a node of it that recorded no end when the controller ended it was
cut off (the controller's end state where the release gives the hooks one; else no end before
its successor's allocation, goodput's rule; else, while the requeued job pends, a node the
controller says it lost; for a NODE_FAIL Slurm gave, of the nodes that recorded no end, the
ones the controller says it lost, where it says so of any).  A multi-node execution's
failure counts on each of its nodes.

Invariants:

* Opt-in: N is the job's ``--avoid-bad-nodes`` (``#DISPATCH`` too), else the site's
  ``AvoidBadNodes`` when the job was submitted (:func:`setting`), recorded in its spec;
  0 never avoids a node, and nothing here is asked.
* Never so many that the job cannot run (:func:`within`, :func:`exclusion`): at least the
  job's node count of the nodes of one of its partitions stay usable; a node the job asks
  for (``--nodelist``) is never excluded, nor one no partition has (removed from
  slurm.conf: Slurm refuses its name); where sbatch refuses the next submission with them
  kept off (a constraint only they meet: :func:`refusal`), it is made without them, and a
  requeued job that pends :data:`CANNOT_RUN` with them kept off gets its list back; a bad
  node left in is said.  The owner's own exclusions are never dropped, and only added to.
* Each node's decision is recorded once per lineage (a node-avoided event); the supervisor
  (and a person's ``dispatch resubmit``: :func:`resubmit`) applies it (``sbatch --exclude``
  of the next submission, ``ExcNodeList`` of a requeued pending job), for a job slurmctld
  forgot as the last exclusion found it placed (:func:`recorded_placement`), and records
  each application (a nodes-excluded event).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from ..errors import SlurmError, SlurmUnavailable
from ..slurm.backend import is_transient
from ..slurm.hostlist import expand_hostlist
from ..slurm.jobs import END_STATES
from . import events, naming

if TYPE_CHECKING:
    from ..slurm.adapter import Slurm
    from ..slurm.jobs import Placement
    from .record import JobRecord

_REFUSED = re.compile(r"Batch job submission failed: *([^\n]*)")
# A pending job's reason where nothing can run it (Slurm takes an ExcNodeList that leaves it
# no node its constraint, GRES or memory fits, and the job pends so for ever).
CANNOT_RUN = "BadConstraints"
NODE_FAILURE = "node failure"  # the rules' name for NODE_FAIL (slurm.jobs.END_STATES)
FAILED = "failed"

# Slurm job id -> the hooks' facts of its executions (node/executions.py's ExecutionFacts);
# node names -> the ones the controller lost.
Facts = Callable[[str], Sequence[Mapping[str, Any]]]
Execution = Optional[Mapping[str, Any]]
Lost = Callable[[list[str]], list[str]]


def limit_of(spec: dict[str, Any]) -> int:
    value = spec.get("avoid_bad_nodes")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def plan_text(limit: int, given: bool, site: int) -> str:
    """The plan's line for ``--avoid-bad-nodes``: the setting, and its default."""
    default = f"the site's AvoidBadNodes, {site}" if site else "0, the site's AvoidBadNodes"
    shown = (
        f"--avoid-bad-nodes {limit}; default {default}"
        if given
        else f"default {default}; --avoid-bad-nodes N sets it"
    )
    if limit <= 0:
        return (
            f"never avoided ({shown}: a node where N executions failed, or one ended "
            "NODE_FAIL, is kept off the next)"
        )
    return (
        f"a node on which {limit} execution(s) failed, or one ended NODE_FAIL, is "
        "excluded from the next submission and the requeued job (sbatch --exclude, "
        f"ExcNodeList), keeping enough of the partition's nodes for the job ({shown})"
    )


@dataclass(frozen=True)
class Ended:
    """One ended execution of a lineage, as far as nodes go."""

    submission: int
    restart: int
    slurm_job_id: str
    nodes: tuple[str, ...]
    end: str  # the rules' name of its end, '' where not known or not one that counts
    failed_nodes: tuple[str, ...] = ()  # for a node failure: the nodes that failed

    @property
    def named(self) -> str:
        return f"Slurm job {self.slurm_job_id} restart {self.restart}"


@dataclass(frozen=True)
class Bad:
    node: str
    why: str  # NODE_FAILURE or FAILED
    executions: tuple[Ended, ...]

    def text(self) -> str:
        return why_text(self.node, self.why, [e.named for e in self.executions])


def why_text(node: str, why: str, executions: Sequence[str]) -> str:
    if why == NODE_FAILURE:
        return f"{node} (node failure under {', '.join(executions)})"
    return f"{node} ({len(executions)} failed executions: {', '.join(executions)})"


def nodes_of(started: events.Started) -> tuple[str, ...]:
    """Where an execution ran: its node list as the launcher recorded it, else its node."""
    try:
        listed = expand_hostlist(started.nodes) if started.nodes else []
    except ValueError:
        listed = []
    return tuple(listed or ([started.node] if started.node else []))


def _submission_end(line: events.Lineage, submission: int) -> str:
    """How a submission that is over ended, in the rules' words, from the record."""
    for later in line.submissions:
        if later.submission == submission + 1:
            reason = later.reason.split(" (")[0].split(":")[0]
            return reason if reason in END_STATES.values() else ""
    if line.finished is not None and line.finished.submission == submission:
        return line.finished.end_state
    return ""


def _facts_of(facts: Facts, slurm_job_id: str, restart: int) -> Execution:
    try:
        found = facts(slurm_job_id)
    except Exception:  # noqa: BLE001 - a site without readable facts: nothing proven
        return None
    return next((e for e in found if e.get("restart") == restart), None)


def _silent(execution: Execution, nodes: Sequence[str], before: Optional[float]) -> list[str]:
    """The nodes of an execution that recorded no end (``before``: by then)."""
    if execution is None:
        return []
    out = []
    for node in nodes:
        end = ((execution.get("nodes") or {}).get(node) or {}).get("end")
        when = end.get("time") if isinstance(end, dict) else None
        if end is None or before is not None and isinstance(when, (int, float)) and when > before:
            out.append(node)
    return out


def _controller_state(execution: Execution) -> str:
    end = ((execution or {}).get("controller") or {}).get("end") or {}
    state = str((end.get("slurm") or {}).get("SLURM_JOB_STATE") or "").split(" ")[0]
    return END_STATES.get(state, "")


def _allocated_at(execution: Execution) -> Optional[float]:
    start = ((execution or {}).get("controller") or {}).get("start") or {}
    when = start.get("time")
    return float(when) if isinstance(when, (int, float)) else None


def _requeued(
    first: events.Started, successor: Optional[events.Started], facts: Facts, lost: Lost
) -> Ended:
    """An execution Slurm requeued: a node failure where a node of it was cut off."""
    nodes = nodes_of(first)
    own = _facts_of(facts, first.slurm_job_id, first.restart)
    said = _controller_state(own)
    if said and said != NODE_FAILURE:
        return Ended(first.submission, first.restart, first.slurm_job_id, nodes, said)
    if successor is not None:
        then = _allocated_at(_facts_of(facts, successor.slurm_job_id, successor.restart))
        failed = _silent(own, nodes, then if then is not None else successor.time)
    else:
        silent = _silent(own, nodes, None)
        failed = lost(silent) if silent else []
    if said == NODE_FAILURE and not failed:
        failed = list(nodes)
    return Ended(
        first.submission,
        first.restart,
        first.slurm_job_id,
        nodes,
        NODE_FAILURE if failed else "",
        tuple(failed),
    )


def _recorded(line: events.Lineage, run: events.Started) -> tuple[str, ...]:
    """The nodes already recorded as failing execution ``run`` by their failure: a decision
    made once stays (the nodes' states now are not those of then)."""
    return tuple(
        e.node
        for e in line.avoided
        if e.why == NODE_FAILURE
        and any(list(x[:2]) == [run.submission, run.restart] for x in e.executions)
    )


def _failed_nodes(
    run: events.Started, nodes: Sequence[str], facts: Facts, lost: Lost
) -> tuple[str, ...]:
    """The nodes whose failure ended ``run`` (Slurm's NODE_FAIL): of those that recorded
    no end (every node, without the hooks' facts), the ones the controller says it lost;
    all of them where it lost none (a node back already)."""
    own = _facts_of(facts, run.slurm_job_id, run.restart)
    silent = _silent(own, nodes, None) or list(nodes)
    return tuple((lost(silent) if len(silent) > 1 else []) or silent)


def ends(
    line: events.Lineage,
    facts: Facts,
    lost: Lost,
    current_end: Optional[tuple[int, str]] = None,
    pending_requeue: bool = False,
) -> list[Ended]:
    """The lineage's ended executions, oldest first.  ``current_end``: (submission, end) of
    the submission the supervisor sees ended now; ``pending_requeue``: Slurm requeued the
    current submission's newest execution and its next one pends."""
    started = sorted(line.started, key=lambda s: (s.submission, s.restart, s.time))
    out: list[Ended] = []
    for i, run in enumerate(started):
        after = started[i + 1] if i + 1 < len(started) else None
        if after is not None and after.submission == run.submission:
            if after.restart != run.restart:
                out.append(_requeued(run, after, facts, lost))
            continue
        if after is None and pending_requeue:
            out.append(_requeued(run, None, facts, lost))
            continue
        if current_end is not None and current_end[0] == run.submission:
            end = current_end[1]
        elif after is None and current_end is None:
            continue  # it runs, or its end is not known yet
        else:
            end = _submission_end(line, run.submission)
        nodes = nodes_of(run)
        failed: tuple[str, ...] = ()
        if end == NODE_FAILURE:
            failed = _recorded(line, run) or _failed_nodes(run, nodes, facts, lost)
        out.append(Ended(run.submission, run.restart, run.slurm_job_id, nodes, end, failed))
    return out


def bad_nodes(ended: Sequence[Ended], limit: int) -> list[Bad]:
    """The nodes a lineage's next execution avoids: node failures first, then nodes where
    ``limit`` executions failed, each node once, in the order found."""
    if limit <= 0:
        return []
    found: dict[str, Bad] = {}
    for one in ended:
        for node in one.failed_nodes if one.end == NODE_FAILURE else ():
            if node not in found:
                found[node] = Bad(node, NODE_FAILURE, (one,))
    failures: dict[str, list[Ended]] = {}
    for one in ended:
        if one.end != FAILED:
            continue
        for node in one.nodes:
            failures.setdefault(node, []).append(one)
            if len(failures[node]) >= limit and node not in found:
                found[node] = Bad(node, FAILED, tuple(failures[node]))
    return list(found.values())


def within(
    partitions: Mapping[str, Sequence[str]], count: int, theirs: Sequence[str], ours: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(the nodes of ``ours`` to exclude, those left in so the job can run): the job runs in
    one of its ``partitions`` (name -> its nodes), so one of them at least keeps ``count``
    of its nodes outside the owner's exclusions (``theirs``, kept whole) and ours, ``ours``
    taken in order.  A node no partition has is never named to Slurm: sbatch refuses an
    exclusion of a node slurm.conf no longer has, and the job cannot run there anyway."""
    usable = {name: [n for n in nodes if n not in theirs] for name, nodes in partitions.items()}
    need = max(count, 1)
    excluded: list[str] = []
    kept: list[str] = []
    for node in ours:
        if (
            node in theirs
            or node in excluded
            or node in kept
            or not any(node in nodes for nodes in usable.values())
        ):
            continue
        if any(len(nodes) - (node in nodes) >= need for nodes in usable.values()):
            excluded.append(node)
            for nodes in usable.values():
                if node in nodes:
                    nodes.remove(node)
        else:
            kept.append(node)
    return excluded, kept


def merged(theirs: Sequence[str], ours: Sequence[str]) -> list[str]:
    """The exclusion list given to Slurm: the owner's, then ours, each node once."""
    out = list(theirs)
    out += [n for n in ours if n not in out]
    return out


@dataclass(frozen=True)
class Exclusion:
    """What a lineage's bad nodes come to for one Slurm job: ``given`` is the exclusion
    list Slurm gets (the owner's, then ``ours``); ``kept``: bad nodes left in so that
    ``node_count`` nodes of a partition stay usable; ``asked``: bad nodes the job asks for
    (``--nodelist``: Slurm refuses a job that requires a node it excludes, sbatch at once,
    a requeued job by pending for ever)."""

    given: list[str]
    ours: list[str]
    kept: list[str]
    asked: list[str]
    node_count: int
    partitions: tuple[str, ...] = ()
    off: tuple[str, ...] = ()  # the bad nodes ``given`` keeps off: ``ours`` and earlier ones


def exclusion(
    placement: Placement, partitions: Mapping[str, Sequence[str]], bad: Sequence[str]
) -> Exclusion:
    """The bad nodes ``bad`` kept off a job placed so (:func:`within`), never a node it
    asks for."""
    asked = [n for n in bad if n in placement.required and n not in placement.excluded]
    ours, kept = within(
        partitions,
        placement.node_count,
        placement.excluded,
        [n for n in bad if n not in placement.required],
    )
    given = merged(placement.excluded, ours)
    return Exclusion(
        given,
        ours,
        kept,
        asked,
        placement.node_count,
        placement.partitions,
        tuple(n for n in bad if n in given),
    )


def recorded_placement(line: events.Lineage) -> Optional[Placement]:
    """Where the lineage's last recorded exclusion found its job placed (its partitions,
    node count, the exclusion list Slurm got and the bad nodes it asks for), for a job
    slurmctld forgot: the same snapshot and options place the next one alike.  None
    before any (or from a record older than these fields)."""
    from ..slurm.jobs import Placement

    last = next((e for e in reversed(line.excluded) if e.partitions), None)
    if last is None:
        return None
    return Placement(last.partitions, last.node_count, last.given, last.asked)


def placed(
    slurm: Slurm, slurm_id: str, line: events.Lineage, nodes: Sequence[str]
) -> tuple[Optional[Exclusion], str, int]:
    """(What keeping ``nodes`` off Slurm job ``slurm_id`` comes to, or None; why not, the
    controller calls made): as slurmctld has it placed, else as the lineage's last
    exclusion recorded it.  Raises SlurmError."""
    placement = slurm.placement(slurm_id)
    if placement is None:
        placement = recorded_placement(line)
        if placement is None:
            return (
                None,
                f"Slurm job {slurm_id} is no longer known to slurmctld, and no "
                "exclusion of the job's recorded where it may run",
                1,
            )
    return exclusion(placement, slurm.partition_nodes(placement.partitions), nodes), "", 2


def record(
    job: JobRecord,
    how: str,
    slurm_job_id: str,
    submission: int,
    restarts: int,
    task: Optional[int],
    avoid: Exclusion,
    refused: str = "",
    once: str = "",
) -> Optional[events.NodesExcluded]:
    """Record what ``avoid`` kept off Slurm job ``slurm_job_id`` (``how``: resubmission or
    requeued), once (``once``: its key; the submission's by default); ``refused``: Slurm's
    words where it refused the job with our exclusions, which it then got without them.
    The new event, or None where it was recorded before."""
    if not once:
        once = f"excluded-{submission}-{'' if task is None else task}"
    off, kept, given = list(avoid.off), avoid.kept, avoid.given
    if refused:
        off, kept, given = [], [], [n for n in avoid.given if n not in avoid.ours]
    event = job.append(
        events.NodesExcluded,
        once=once,
        slurm_job_id=slurm_job_id,
        how=how,
        submission=submission,
        restarts=restarts,
        nodes=off,
        kept=kept,
        asked=avoid.asked,
        refused=[*avoid.kept, *avoid.off] if refused else [],
        refusal=refused,
        node_count=avoid.node_count,
        given=given,
        partitions=list(avoid.partitions),
        task=task,
    )
    return event if isinstance(event, events.NodesExcluded) else None


def resubmit(slurm: Slurm, job: JobRecord, task: Optional[int]) -> tuple[Any, list[str]]:
    """A person's resubmission (``dispatch resubmit``) with the lineage's bad nodes kept off
    as the supervisor keeps them: (the submission made, what to say of them).  Where
    sbatch refuses it with them kept off, made again without them."""
    from . import submit

    line = job.history().lineage(task)
    bad = [e.node for e in line.avoided]
    said: list[str] = []
    avoid: Optional[Exclusion] = None
    if limit_of(job.spec) > 0 and bad and line.current is not None:
        slurm_id = line.current.slurm_job_id
        shown = slurm_id if task is None or "_" in slurm_id else f"{slurm_id}_{task}"
        try:
            avoid, why, _ = placed(slurm, shown, line, bad)
        except SlurmError as exc:
            why = str(exc)
        if avoid is None:
            said.append(f"its bad node(s) {', '.join(bad)} are not kept off: {why}")
    extra = [f"--exclude={','.join(avoid.given)}"] if avoid and avoid.given else []
    number = line.next_submission if task is not None else submit.next_submission(job)
    refused = ""
    try:
        done = submit.resubmit(slurm, job, extra=extra, task=task)
    except SlurmError as exc:
        words = refusal(exc) if extra else None
        if words is None:
            raise
        refused = words
        done = submit.resubmit(
            slurm, job, task=task, expected=number, claim=naming.claim_name(number, task)
        )
    if avoid is not None:
        event = record(
            job, "resubmission", done.slurm_job_id, done.submission, 0, task, avoid, refused
        )
        if event is not None:
            said.append(excluded_text(event))
    return done, said


def excluded_text(event: events.NodesExcluded) -> str:
    """A nodes-excluded event in words."""
    where = (
        f"submission {event.submission} (Slurm job {event.slurm_job_id})"
        if event.how == "resubmission"
        else f"requeued Slurm job {event.slurm_job_id} (restart {event.restarts})"
    )
    said = f"{', '.join(event.nodes) or 'no node'} kept off {where}"
    if event.kept:
        said += (
            f"; {', '.join(event.kept)} left in: the job needs {event.node_count} of "
            "its partition's nodes"
        )
    if event.asked:
        said += f"; {', '.join(event.asked)} left in: the job asks for it (--nodelist)"
    if event.refused:
        said += (
            f"; {', '.join(event.refused)} left in: Slurm refused the job without "
            f"{'it' if len(event.refused) == 1 else 'them'} ({event.refusal})"
        )
    return said


def refusal(exc: SlurmError) -> Optional[str]:
    """Slurm's words where sbatch refused a submission outright ('Batch job submission
    failed: Requested node configuration is not available': nothing was submitted), else
    None (a controller that did not answer may have taken the job)."""
    text = str(exc)
    found = _REFUSED.search(text)
    if found is None or isinstance(exc, SlurmUnavailable) or is_transient(text):
        return None
    return found.group(1).strip()


def avoided_text(event: events.NodeAvoided) -> str:
    """A node-avoided event in words."""
    return why_text(
        event.node,
        event.why,
        [f"Slurm job {e[2]} restart {e[1]}" for e in event.executions if len(e) > 2],
    )
