"""Slurm's job states and the typed views of jobs and nodes: the one vocabulary every side of
slurm-dispatch reads Slurm's answers in.

Pure and standard-library only (no Slurm call, no import of the adapter's backends): the
control side, the node side's ``dispatch-cease`` and the commands import it for the words alone.

Invariants:

* **One home for Slurm's state names.**  Every set or map of Slurm job states (what is final,
  what ended an execution, squeue's short codes, the rules' names for ends) is here;
  ``tests/unit/test_slurm_jobs.py`` scans the package and fails on a state-name collection
  literal anywhere else.
* A state is the first word of Slurm's ``JobState`` (``CANCELLED``, never ``CANCELLED by 0``);
  :func:`is_final`, :func:`is_active` and :func:`execution_ended` answer for one, and
  :class:`Job` answers the same questions for a job.
* A job's comment is its owner's free text: read only as a comment (:attr:`Job.markers`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Iterable, Mapping, Optional

PENDING = "PENDING"
# Final: the job is over; nothing of it will run again without a new submission.
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
# Not final, but the current execution was ended by Slurm: requeued (and perhaps held, as
# SPECIAL_EXIT is), the next execution has not started.
#   EXPEDITING (25.11, a job submitted --requeue=expedite where SlurmctldParameters has
#     enable_expedited_requeue): its execution ended on a node failure or a non-zero exit and
#     Slurm requeued it (restart count +1) to start again at once, first in the queue, with no
#     requeue delay; until that launch only an admin may update it.  Once its Epilog is done
#     with none failed on a node, Slurm holds it instead (REQUEUE_HOLD): its own failure is not
#     run again at the top of the queue behind the user's back.
#   REQUEUE_HOLD: requeued and held (priority 0): `scontrol requeuehold`, the launch-failure
#     limit (MaxBatchRequeue), or an expedited requeue no Epilog failure justified.  It runs
#     again only once released (`scontrol release`; by its owner too where the reason is
#     JobHeldUser), and reads REQUEUE_HOLD until it next starts, released or not: its reason
#     says whether it is still held (Job.is_held).
REQUEUE_STATES = frozenset(
    {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "EXPEDITING"}
)
# A job in these states waits to start (Slurm's base state is PENDING; the name shown is its
# flag's): no execution of it runs now.
WAITING_STATES = frozenset({"PENDING", "EXPEDITING", "REQUEUE_HOLD", "SPECIAL_EXIT"})
# An execution is under way on its nodes (a timeline draws it up to now).
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})
HOLD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
# Slurm's own words for the hold it puts on a job it requeues (the job's reason once Slurm has
# set its text; pyslurm writes "_" for the spaces): REQUEUE_HOLD's, SPECIAL_EXIT's, and the
# launch-failure limit's (MaxBatchRequeue).  A release clears them.
REQUEUE_HOLD_REASONS = frozenset(
    {
        "job requeued in held state",
        "job requeued in special exit state",
        "launch failure limit exceeded requeued held",
    }
)
# Slurm's own hold after a batch launch failed (a Prolog that failed; a rejoining node that
# refused a second launch of a job id it still ran, "Duplicate jobid"): the job is requeued
# with priority 0 and runs only once released, by its owner too (``scontrol release``).
# squeue prints the reason so; libslurm's reason string and pyslurm write "_" for the spaces.
LAUNCH_FAILED_HOLD = "launch failed requeued held"
MARKER_PREFIX = "dispatch:"

# squeue's compact state codes (squeue(1), JOB STATE CODES): every state squeue -t takes.
STATE_CODES = {
    "BF": "BOOT_FAIL",
    "CA": "CANCELLED",
    "CD": "COMPLETED",
    "CF": "CONFIGURING",
    "CG": "COMPLETING",
    "DL": "DEADLINE",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING",
    "PR": "PREEMPTED",
    "R": "RUNNING",
    "RD": "RESV_DEL_HOLD",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "SI": "SIGNALING",
    "SE": "SPECIAL_EXIT",
    "SO": "STAGE_OUT",
    "ST": "STOPPED",
    "S": "SUSPENDED",
    "TO": "TIMEOUT",
}
# Every state name Slurm shows: squeue's codes' and EXPEDITING (25.11), which has no code
# (squeue's %t shows its base state, PD).
STATE_NAMES = frozenset(STATE_CODES.values()) | {"EXPEDITING"}

# A final state -> the name the recovery rules (control/rules.py) give that end.
END_STATES = {
    "COMPLETED": "completed",
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "NODE_FAIL": "node failure",
    "PREEMPTED": "preempted",
    "OUT_OF_MEMORY": "out of memory",
    "BOOT_FAIL": "node failure",
    "DEADLINE": "timeout",
    "CANCELLED": "cancelled",
}
# The rules' names for ends, back to Slurm's (as sacct prints them): the first of each above.
SLURM_END = {
    "completed": "COMPLETED",
    "failed": "FAILED",
    "timeout": "TIMEOUT",
    "node failure": "NODE_FAIL",
    "preempted": "PREEMPTED",
    "out of memory": "OUT_OF_MEMORY",
    "cancelled": "CANCELLED",
}


def is_final(state: str) -> bool:
    """The job is over: Slurm will not run it again."""
    return state in FINAL_STATES


def is_active(state: str) -> bool:
    """Not final: pending, running, requeued, held, suspended, special exit, ..."""
    return bool(state) and state not in FINAL_STATES


def execution_ended(state: str) -> bool:
    """The job's current execution was ended by Slurm (its processes told to stop)."""
    return state in FINAL_STATES or state in REQUEUE_STATES


def held_after_failed_launch(state: str, reason: str) -> bool:
    """Slurm requeued the job held because its launch failed (:data:`LAUNCH_FAILED_HOLD`)."""
    return state == PENDING and reason.replace("_", " ").lower() == LAUNCH_FAILED_HOLD


def is_running(state: str) -> bool:
    """An execution is under way on its nodes (running, completing, configuring, suspended)."""
    return state in RUNNING_STATES


def end_name(state: str) -> str:
    """The rules' name for how a job in ``state`` ended; ``failed`` for a state the rules do
    not name."""
    return END_STATES.get(state, "failed")


def exit_code_text(raw: object) -> Optional[str]:
    """Slurm's exit code in scontrol's ``status:signal`` form (``3:0``, ``0:9``) from what a
    reader gives: squeue's ``exit_code`` field, a wait status (``768`` for exit 3, ``9`` for
    SIGKILL), or ``3:0`` written so already; None where it is not known."""
    text = str(raw).strip() if raw is not None else ""
    if ":" in text:
        status, _, signal = text.partition(":")
        if status.isdigit() and signal.isdigit():
            return f"{int(status)}:{int(signal)}"
        return None
    if text.isdigit():
        wait = int(text)
        return f"{(wait >> 8) & 0xFF}:{wait & 0x7F}"
    return None


def exit_status(code: Optional[str]) -> Optional[int]:
    """The status a script exited with by itself (``3`` for ``3:0``); None for a signal's
    end (``0:9``) or an unknown code."""
    if not code:
        return None
    status, _, signal = code.partition(":")
    if status.isdigit() and signal in ("", "0"):
        return int(status)
    return None


class Job:
    """One Slurm job as the controller sees it; one array task is one Job.

    ``job_id`` is Slurm's own id (a task that has started has its own; a pending task still
    shares its array's), ``display_id`` what squeue shows (``97_1`` for a task).  ``comment`` is
    the owner's free text: read it only as a comment (:attr:`markers`).  ``start_time`` and
    ``end_time`` are the current execution's, None while pending or running respectively (the
    scheduler's estimates are not kept).  ``exit_code`` is Slurm's, ``status:signal``
    (:func:`exit_code_text`), once the execution ended; None before, or where not known.
    ``sluid`` is Slurm's id of the job's current execution where the release gives one (26.05),
    else ''.
    """

    __slots__ = (
        "job_id",
        "array_job_id",
        "array_task_id",
        "state",
        "reason",
        "restarts",
        "nodes",
        "uid",
        "comment",
        "submit_time",
        "start_time",
        "end_time",
        "exit_code",
        "sluid",
    )

    def __init__(
        self,
        job_id: str,
        state: str,
        *,
        array_job_id: Optional[str] = None,
        array_task_id: Optional[int] = None,
        reason: str = "",
        restarts: int = 0,
        nodes: Iterable[str] = (),
        uid: int = -1,
        comment: str = "",
        submit_time: Optional[float] = None,
        start_time: Optional[float] = None,
        end_time: Optional[float] = None,
        exit_code: Optional[str] = None,
        sluid: str = "",
    ) -> None:
        self.job_id = job_id
        self.sluid = sluid
        self.array_job_id = array_job_id
        self.array_task_id = array_task_id
        self.state = state
        self.reason = reason
        self.restarts = restarts
        self.nodes = tuple(nodes)
        self.uid = uid
        self.comment = comment
        self.submit_time = submit_time
        self.start_time = start_time
        self.end_time = end_time
        self.exit_code = exit_code  # "status:signal" (exit_code_text); None: not known

    @property
    def display_id(self) -> str:
        if self.array_task_id is not None and self.array_job_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def is_final(self) -> bool:
        return is_final(self.state)

    @property
    def exit_status(self) -> Optional[int]:
        """The status its script exited with by itself, once ended (:func:`exit_status`)."""
        return exit_status(self.exit_code) if self.is_final else None

    @property
    def is_active(self) -> bool:
        return is_active(self.state)

    @property
    def execution_ended(self) -> bool:
        return execution_ended(self.state)

    @property
    def is_pending(self) -> bool:
        """Waiting to start (held or not, requeued or not): no execution of it runs now."""
        return self.state in WAITING_STATES

    @property
    def is_held(self) -> bool:
        """Held (priority 0) until released: by a person, by dispatch, or by Slurm after a
        requeue (REQUEUE_HOLD, SPECIAL_EXIT); not Slurm's hold after a failed launch
        (:attr:`held_after_failed_launch`)."""
        return self.is_pending and (
            self.reason in HOLD_REASONS
            or self.reason.replace("_", " ").lower() in REQUEUE_HOLD_REASONS
        )

    @property
    def held_after_failed_launch(self) -> bool:
        """Slurm's own hold after a failed launch, not a person's nor ours (:attr:`is_held`)."""
        return held_after_failed_launch(self.state, self.reason)

    @property
    def started(self) -> bool:
        """The current execution has started on some node."""
        return self.start_time is not None and bool(self.nodes) and not self.is_pending

    @property
    def markers(self) -> list[str]:
        """The ``dispatch:<id>/<N>`` words of the comment (words, so no prefix matches)."""
        return [w for w in self.comment.split() if w.startswith(MARKER_PREFIX)]

    def marks(self, dispatch_id: str) -> bool:
        """Its comment carries a marker of ``dispatch_id``'s: the job is that dispatch job's."""
        return any(m.startswith(f"{MARKER_PREFIX}{dispatch_id}/") for m in self.markers)

    def marks_another(self, dispatch_id: str) -> bool:
        """Its comment carries dispatch markers, none of them ``dispatch_id``'s: the job is
        another dispatch job's (a record older than records' cluster, read on a cluster where
        its Slurm job id is another's).  A comment without one (a person's) proves nothing."""
        return bool(self.markers) and not self.marks(dispatch_id)

    def __repr__(self) -> str:
        return (
            f"Job({self.display_id} {self.state} restarts={self.restarts} "
            f"nodes={','.join(self.nodes) or '-'})"
        )


# The words of a node's state (``DOWN+NOT_RESPONDING``, ``IDLE*``) that say the controller
# lost it: down, not answering, or failing.
NODE_LOST_FLAGS = ("DOWN", "NOT_RESPONDING", "FAIL")


def node_lost(state: str) -> bool:
    """The controller lost the node whose state is ``state`` (``DOWN``, ``IDLE*``: not
    responding, ``FAIL``, ``FAILING``, in any of its ``+`` words)."""
    words = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    return any(word.startswith(flag) for word in words for flag in NODE_LOST_FLAGS)


class Placement:
    """Where one job may run, as the controller has it: its partitions (``debug``, or
    several), its node count (the least it asks for), the nodes it excludes
    (``ExcNodeList``: the owner's ``--exclude`` and any update since) and those it asks for
    (``ReqNodeList``: ``--nodelist``)."""

    __slots__ = ("partitions", "node_count", "excluded", "required")

    def __init__(
        self,
        partitions: Iterable[str],
        node_count: int,
        excluded: Iterable[str] = (),
        required: Iterable[str] = (),
    ) -> None:
        self.partitions = tuple(partitions)
        self.node_count = node_count
        self.excluded = tuple(excluded)
        self.required = tuple(required)

    def __repr__(self) -> str:
        return (
            f"Placement({','.join(self.partitions) or '-'} x{self.node_count} "
            f"excluding {','.join(self.excluded) or '-'})"
        )


class Node:
    """One node as the controller sees it."""

    __slots__ = ("name", "state", "reason", "boot_time")

    def __init__(
        self, name: str, state: str, reason: str = "", boot_time: Optional[float] = None
    ) -> None:
        self.name = name
        self.state = state
        self.reason = reason
        self.boot_time = boot_time

    @property
    def lost(self) -> bool:
        """The controller lost it (:func:`node_lost`)."""
        return node_lost(self.state)

    def __repr__(self) -> str:
        return f"Node({self.name} {self.state})"


def index_jobs(jobs: Iterable[Job]) -> dict[str, Job]:
    """Jobs keyed by ``display_id`` and, where one job has it alone, by ``job_id``."""
    found: dict[str, Job] = {}
    counts: dict[str, int] = {}
    listed = list(jobs)
    for job in listed:
        counts[job.job_id] = counts.get(job.job_id, 0) + 1
    for job in listed:
        found[job.display_id] = job
    for job in listed:
        if counts[job.job_id] == 1:
            found.setdefault(job.job_id, job)
    return found


def unique_jobs(keyed: Mapping[str, Job]) -> list[Job]:
    """Each Job of ``keyed`` once, in the order first seen (:func:`index_jobs` keys one Job
    by its display id and by its job id)."""
    return list({id(job): job for job in keyed.values()}.values())


class Snapshot:
    """The caller's jobs as one read of Slurm gave them, and Slurm's view of one submission in
    it: the one place a submission's Slurm job(s) are found in an answer.

    ``keyed`` is what :meth:`Slurm.own_jobs` returns (:func:`index_jobs`).  The index of array
    tasks by their array's id is built at the first lookup and lives as long as this object:
    one supervisor pass or one status view, never longer (a new read is a new Snapshot), so a
    pass that looks up every job in it stays linear in the user's jobs.
    """

    __slots__ = ("keyed", "_arrays")

    def __init__(self, keyed: dict[str, Job]) -> None:
        self.keyed = keyed
        self._arrays: Optional[dict[str, list[Job]]] = None

    def get(self, key: str) -> Optional[Job]:
        """The Job under ``key`` (``123`` or ``97_1``), if the read had it."""
        return self.keyed.get(key)

    def jobs(self) -> list[Job]:
        """Every Job of the read, once."""
        return unique_jobs(self.keyed)

    def tasks(self, array_id: str, task: Optional[int] = None) -> list[Job]:
        """The tasks of array ``array_id`` the read had (with ``task``, that one), in task
        order."""
        if self._arrays is None:
            index: dict[str, list[Job]] = {}
            for job in self.jobs():
                if job.array_job_id and job.array_task_id is not None:
                    index.setdefault(job.array_job_id, []).append(job)
            self._arrays = index
        found = [
            j for j in self._arrays.get(array_id, []) if task is None or j.array_task_id == task
        ]
        return sorted(found, key=lambda j: j.array_task_id or 0)

    def views(self, slurm_id: str, task: Optional[int] = None) -> list[Job]:
        """Slurm's view of one submission: every task of an array submission (with ``task``,
        that one task of it), else the job itself; [] when the read does not have it."""
        tasks = self.tasks(slurm_id, task)
        if tasks or task is not None:
            return tasks
        found = self.keyed.get(slurm_id)
        return [found] if found is not None else []

    def marked(self, marker: str) -> list[Job]:
        """The jobs whose comment carries the dispatch marker ``marker``, in read order."""
        return [job for job in self.jobs() if marker in job.markers]
