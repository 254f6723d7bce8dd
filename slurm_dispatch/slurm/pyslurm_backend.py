"""The pyslurm backend of the Slurm adapter: the same reads and actions, through libslurm.

Imported only by :func:`slurm_backend.select`, after a child interpreter has imported pyslurm
with this process's environment and found its release matching the controller's (importing
pyslurm without a configuration source ends the process).

Invariants:

* **Structured fields only.**  pyslurm hands over the controller's records field by field; the
  comment is the ``comment`` field and never read as anything else (no text is split into
  fields here).
* **The caller's jobs only, filtered by the controller.**  :meth:`own_jobs` loads the jobs of one
  uid (``slurm_load_job_user``, what ``squeue --me`` asks) and drops any other uid; one job or
  array is one ``slurm_load_job``.
* **Every array task is a job of its own**, as ``squeue -r`` shows them: a pending array's
  remainder (one record, ``array_task_str`` ``2-5%1``) is spread into one Job per task, each
  with the record's job id, as squeue prints it.
* Errors are the adapter's: a transient controller error is :class:`SlurmUnavailable` (retried
  by the adapter), anything else :class:`SlurmError`, both naming the call and the job.
"""

from __future__ import annotations

import pyslurm  # the probe imported it in a child first: see slurm_backend

from ..errors import SlurmError, SlurmUnavailable
from . import arrays
from .backend import is_transient
from .hostlist import expand_hostlist
from .jobs import WAITING_STATES, Job, Node, execution_ended, exit_code_text
from .release import major_release

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Optional, Sequence

    from .release import Probe


_NO_VAL = 0xFFFFFFFE  # Slurm's "no value" for a 32-bit field (an array task id never set)


def task_ids(text: str) -> list[int]:
    """The task ids of the controller's array task string (``0-3``, ``1,4-10:3``, ``2-9%2``),
    in the order written (the grammar is :mod:`.arrays`)."""
    try:
        return [task for span in arrays.spans(text) for task in span]
    except arrays.ArrayRangeError:
        raise SlurmError(
            f"pyslurm gave the array task string {text!r}, which does not parse"
        ) from None


def _time(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, int) and value > 0 else None


def jobs_from_record(record: dict[str, Any]) -> list[Job]:
    """One record of pyslurm's job dictionary as Jobs (a pending array's remainder: one per
    task)."""
    state = str(record.get("job_state") or "").split(" ")[0]
    common = dict(
        state=state,
        reason=str(record.get("state_reason") or ""),
        restarts=int(record.get("restart_cnt") or 0),
        nodes=expand_hostlist(record.get("nodes") or ""),
        uid=int(record.get("user_id", -1)),
        comment=str(record.get("comment") or ""),
        submit_time=_time(record.get("submit_time")),
        # A waiting job's start_time is the scheduler's estimate: not a start.
        start_time=None if state in WAITING_STATES else _time(record.get("start_time")),
        # Before the execution ends, end_time is the controller's estimate.
        end_time=_time(record.get("end_time")) if execution_ended(state) else None,
        # "3:0" as the dictionary API gives it; anything else is not known.
        # none before the execution ended (the library's is then not one).
        exit_code=exit_code_text(record["exit_code"])
        if isinstance(record.get("exit_code"), str) and execution_ended(state)
        else None,
    )
    job_id = str(record["job_id"])
    array = record.get("array_job_id")
    task = record.get("array_task_id")
    if record.get("array_task_str"):
        tasks = task_ids(record["array_task_str"])
    elif array and isinstance(task, int) and task < _NO_VAL:
        tasks = [task]
    else:  # not an array, or an array's remainder ended before it was spread (squeue: N/A)
        return [Job(job_id, **common)]  # type: ignore[arg-type]
    return [Job(job_id, array_job_id=str(array), array_task_id=task, **common) for task in tasks]  # type: ignore[arg-type]


def record_of(job: Any) -> dict[str, Any]:
    """A ``pyslurm.Job`` of the object API (24.11's ``Job.load``) as a record of the
    dictionary API, the fields :func:`jobs_from_record` reads; a job that is no array only
    (an array's records come from ``find_user``)."""
    # The dictionary API writes a state description's spaces as "_" (a reason has none).
    reason = (job.state_reason or "").replace(" ", "_")
    return {
        "job_id": job.id,
        "job_state": job.state,
        "state_reason": reason,
        "restart_cnt": job.requeue_count,
        "nodes": job.allocated_nodes,
        "user_id": job.user_id,
        "comment": job.comment,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "exit_code": _exit_code(job),
    }


def _exit_code(job: Any) -> Optional[str]:
    """The object API's exit code and signal as the dictionary API writes them (``3:0``)."""
    status, signal = getattr(job, "exit_code", None), getattr(job, "exit_code_signal", 0)
    if isinstance(status, int) and isinstance(signal or 0, int):
        return f"{status}:{signal or 0}"
    return None


def _bound(act: Callable[[str], Any], job_id: str) -> Callable[[], Any]:
    return lambda: act(job_id)


class PyslurmBackend:
    """Reads and actions through pyslurm; the adapter (:class:`slurm.Slurm`) calls these."""

    name = "pyslurm"

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        release = major_release(probe.pyslurm_version)
        # 22.5's job().find_id() loads one job (slurm_load_job, the id translated from text by
        # slurm_xlate_job_id); 24.11.0's passes the id's text where libslurm takes a number,
        # and every call is a TypeError ("an integer is required"; PySlurm/pyslurm#357: that
        # dictionary API is deprecated).  Its object API's Job.load keeps one record of an
        # array only, so there it tells the owner, whose jobs are then loaded.
        self._load_one = (
            self._find_id if release is not None and release[0] < 23 else self._find_via_owner
        )

    def _rpc(self, what: str, target: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (ValueError, pyslurm.RPCError) as exc:
            said = str(exc.args[0]) if exc.args else str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever else pyslurm raises is this call's
            said = f"{type(exc).__name__}: {exc}"  # (24.11.0's old API: TypeError)
        cls = SlurmUnavailable if is_transient(said) else SlurmError
        raise cls(
            f"pyslurm {what} {target} failed: {said}", argv=["pyslurm", what, target], output=said
        ) from None

    # -- reads -----------------------------------------------------------------------------
    def user_jobs(self, uid: int) -> list[Job]:
        """Every job of ``uid`` (every array task), as the controller filters them."""
        found = self._rpc("find_user", str(uid), lambda: pyslurm.job().find_user(uid))
        jobs = [job for record in (found or {}).values() for job in jobs_from_record(record)]
        return [job for job in jobs if job.uid == uid]

    def jobs(self, job_id: str) -> list[Job]:
        """Job ``job_id`` (``123``, ``97_1``, an array's id: all its tasks); [] if unknown."""
        # A_T: the whole array is loaded (a pending task lives in its array's remainder, which
        # libslurm's A_T translation does not find), then the task asked for is kept.
        array, _, task = job_id.partition("_")
        records = self._load_one(array)
        jobs = [job for record in records for job in jobs_from_record(record)]
        if task:
            jobs = [
                job for job in jobs if job.array_task_id == int(task) and job.array_job_id == array
            ]
        return jobs

    def _find_id(self, array: str) -> list[dict[str, Any]]:
        """The records of job ``array`` (every record of an array), [] if unknown."""
        found: Optional[list[dict[str, Any]]] = self._rpc_known(
            "find_id", array, lambda: pyslurm.job().find_id(array)
        )
        return found or []

    def _rpc_known(self, what: str, target: str, call: Callable[[], Any]) -> Any:
        """:meth:`_rpc` for a read of one job: None when the controller does not know the id
        ("Invalid job id specified"), which is an answer (no such job), not a failure."""
        try:
            return self._rpc(what, target, call)
        except SlurmError as exc:
            if "invalid job id" in exc.output.lower():
                return None
            raise

    def _find_via_owner(self, array: str) -> list[dict[str, Any]]:
        """The records of job ``array`` (what ``find_id`` returns: the job's own record, or
        every record of the array whose id it is).  ``Job.load`` answers with the first
        record only; a job that is no array has no other, so that one answer is all.  For
        an array, the owner's jobs are then loaded (``slurm_load_job_user``) and the
        array's records kept: two calls bounded by one user's jobs, never the whole queue a
        big site holds."""
        if not array.isdigit():
            return []  # what the controller answers for an id that is not one: no such job
        wanted = int(array)
        first = self._rpc_known("Job.load", array, lambda: pyslurm.Job.load(wanted))
        if first is None:
            return []
        if not first.array_id:  # 0 (no array) reads as None
            return [record_of(first)]
        uid = int(first.user_id)
        loaded = self._rpc("find_user", str(uid), lambda: pyslurm.job().find_user(uid))
        return [
            record
            for record in (loaded or {}).values()
            if record.get("job_id") == wanted or record.get("array_job_id") == wanted
        ]

    def nodes(self, names: Sequence[str]) -> dict[str, Node]:
        """Each named node that the controller knows (one load of every node)."""
        loaded = self._rpc("Nodes.load", ",".join(names), pyslurm.Nodes.load)
        wanted = set(names)
        found = {}
        for node in loaded.values():
            if node.name in wanted:
                found[node.name] = Node(
                    node.name, node.state or "", node.reason or "", _time(node.boot_time)
                )
        return found

    # -- actions (whole job ids; the adapter sends an array task A_T through scontrol) ------
    def _each(self, what: str, job_ids: Iterable[str], act: Callable[[str], Any]) -> None:
        for job_id in job_ids:
            self._rpc(what, job_id, _bound(act, job_id))

    def cancel(self, job_ids: Iterable[str]) -> None:
        self._each("kill_job", job_ids, lambda j: pyslurm.slurm_kill_job2(j.encode(), 9, 0))

    def hold(self, job_ids: Iterable[str]) -> None:
        self._each("hold", job_ids, lambda j: pyslurm.Job(int(j)).hold())

    def release(self, job_ids: Iterable[str]) -> None:
        self._each("release", job_ids, lambda j: pyslurm.Job(int(j)).release())

    def requeue(self, job_ids: Iterable[str]) -> None:
        self._each("requeue", job_ids, lambda j: pyslurm.Job(int(j)).requeue())

    def set_comment(self, job_id: str, text: str) -> None:
        changes = pyslurm.JobSubmitDescription(comment=text)
        self._rpc("modify", job_id, lambda: pyslurm.Job(int(job_id)).modify(changes))
