"""The event schema of a dispatch job's record, and the history read from it.

Role: the one place that knows what a recorded event looks like. Every event kind is a frozen
record (a plain class whose annotations are its fields); :func:`parse` turns one stored JSON
object into one, checking every field's type, and :class:`History` answers the questions the
supervisor, ``status``, ``submit`` and the CLI ask of a job (its next submission number, the
standing hold and its deadline, whether it is settled), per array task where the job is an
array.

Invariants:

* A stored event is valid or it is an error naming the file and the field: no reader ever
  sees a half-valid event, and nothing outside this module reads an event by its kind string.
* Format versions: ``"v": 2`` is written now.  Events written before carry no ``v`` and are
  read as version 1 (same fields, no ``task``).  An event of a newer version than this reader
  knows is an error that says to upgrade (a newer writer may mean something this reader cannot
  see); unknown *fields* of a known version are kept in :attr:`Event.raw` and otherwise ignored.
* Array jobs: rules, budgets, submission numbers, holds and cessation are per task.  An event
  carries ``task`` (the array task id) when it concerns one task only; ``task`` absent means the
  whole job (a plain job, or every task of an array submission).  A task's lineage is made of
  the whole-job submissions and its own (:meth:`History.lineage`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed (dispatch-sbatch)
if TYPE_CHECKING:
    from typing import Any, ClassVar, Optional, Union

VERSION = 2  # the format written now; events with no "v" are version 1


class EventError(ValueError):
    """One stored event has the wrong shape; the message names the field and the value."""


# How a field's annotation (a string, under ``from __future__ import annotations``) is checked
# against JSON: the outer type only, as a stored event is JSON.
_CHECKS = {"float": "float", "int": "int", "str": "str", "bool": "bool", "Any": "any"}


def _kind_of(annotation: str) -> tuple[str, bool]:
    """(check, nullable) for an annotation string such as ``Optional[dict[str, Any]]``."""
    nullable = annotation.startswith("Optional[")
    if nullable:
        annotation = annotation[len("Optional[") : -1]
    outer = annotation.split("[", 1)[0]
    if outer in ("list", "dict"):
        return outer, nullable
    if annotation not in _CHECKS:
        raise TypeError(f"event field annotation {annotation!r} has no JSON check")
    return _CHECKS[annotation], nullable


class _Field:
    __slots__ = ("name", "check", "nullable", "default", "required")

    def __init__(self, name: str, annotation: str, default: Any, required: bool) -> None:
        self.name = name
        self.check, self.nullable = _kind_of(annotation)
        self.default = default
        self.required = required


_NO_DEFAULT = object()


class _Frozen:
    """A frozen record whose fields are its class annotations (ClassVar ones excepted), in
    definition order, base classes first; a list default is copied per instance.

    Plain classes rather than dataclasses: building a dozen dataclasses cost ``dispatch-sbatch``
    about 15 ms of its start-up (bench/bench_sbatch.py), a third of its overhead over sbatch.
    """

    _fields: ClassVar[tuple[_Field, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, _Field] = {f.name: f for f in cls._fields}
        for name, annotation in cls.__dict__.get("__annotations__", {}).items():
            if annotation.startswith("ClassVar"):
                continue
            default = cls.__dict__.get(name, _NO_DEFAULT)
            if default is _NO_DEFAULT and name in fields:
                default = fields[name].default
            fields[name] = _Field(name, annotation, default, default is _NO_DEFAULT)
        cls._fields = tuple(fields.values())

    def __init__(self, **values: Any) -> None:
        for f in self._fields:
            if f.name in values:
                value = values.pop(f.name)
            elif f.required:
                raise TypeError(f"{type(self).__name__} needs {f.name!r}")
            else:
                value = (
                    list(f.default)
                    if isinstance(f.default, list)
                    else (dict(f.default) if isinstance(f.default, dict) else f.default)
                )
            object.__setattr__(self, f.name, value)
        if values:
            raise TypeError(f"{type(self).__name__} has no field {sorted(values)[0]!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")

    def _compared(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in self._fields if f.name != "raw")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._compared() == other._compared()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self._compared())))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in self._fields if f.name != "raw"
        )
        return f"{type(self).__name__}({shown})"

    def as_dict(self) -> dict[str, Any]:
        """Every field, ``raw`` excepted, as stored."""
        return {f.name: getattr(self, f.name) for f in self._fields if f.name != "raw"}


class Event(_Frozen):
    """Fields every event has.  ``raw`` is the stored object, unknown fields included."""

    kind: ClassVar[str] = ""
    required: ClassVar[tuple[str, ...]] = ()  # beyond time and ns, which every event has
    time: float = 0.0
    ns: int = 0
    v: int = 1
    task: Optional[int] = None
    raw: dict[str, Any] = {}

    def fields(self) -> dict[str, Any]:
        """The event as it is stored: ``event`` kind first, no ``raw``."""
        out: dict[str, Any] = {"event": self.kind}
        for f in self._fields:
            if f.name == "raw":
                continue
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue  # absent means None (a whole-job event has no task, as in version 1)
            out[f.name] = value
        return out


class HoldIntent(_Frozen):
    """What a held submission waits for: recorded before ``sbatch`` runs, so a pass killed
    after ``sbatch`` still knows the submission is a hold, with its deadline."""

    deadline: float
    ended_slurm_job_id: str
    ended_restart: int
    end_state: str
    instead_of: Optional[str] = None
    # For an array: every task execution that must cease first, as [display id, restart].
    ended_tasks: list[list[Any]] = []


class Submitted(Event):
    """A submission as the record holds it (written just before or after its sbatch).  What
    the submitting call returns is :class:`slurm_dispatch.control.submit.SubmissionMade`."""

    kind: ClassVar[str] = "submitted"
    required: ClassVar[tuple[str, ...]] = ("submission", "slurm_job_id")
    submission: int = 0
    slurm_job_id: str = ""
    reason: str = ""
    argv: list[str] = []
    recovered: bool = False
    hold: Optional[dict[str, Any]] = None  # a HoldIntent's fields for a held submission
    # Slurm's SLUID of the job right after its sbatch (26.05), for a plain job submitted
    # without its marker (a comment of the user's own): it tells the submission from another
    # job under its id once ids start again.
    sluid: str = ""


class SubmitFailed(Event):
    kind: ClassVar[str] = "submit-failed"
    required: ClassVar[tuple[str, ...]] = ("submission",)
    submission: int = 0
    error: str = ""


class SubmitLost(Event):
    """Version 1 only: a stale claim retried.  Read, never written now."""

    kind: ClassVar[str] = "submit-lost"
    required: ClassVar[tuple[str, ...]] = ("submission",)
    submission: int = 0
    note: str = ""


class Hold(Event):
    kind: ClassVar[str] = "hold"
    required: ClassVar[tuple[str, ...]] = (
        "submission",
        "slurm_job_id",
        "ended_slurm_job_id",
        "deadline",
    )
    submission: int = 0
    slurm_job_id: str = ""
    ended_slurm_job_id: str = ""
    ended_restart: int = 0
    end_state: str = ""
    deadline: float = 0.0
    instead_of: Optional[str] = None
    ended_tasks: list[list[Any]] = []
    recovered: bool = False


class Released(Event):
    kind: ClassVar[str] = "released"
    required: ClassVar[tuple[str, ...]] = ("slurm_job_id",)
    slurm_job_id: str = ""
    by: str = ""
    slurm_state: str = ""


class Expired(Event):
    kind: ClassVar[str] = "expired"
    required: ClassVar[tuple[str, ...]] = ("slurm_job_id",)
    slurm_job_id: str = ""
    deadline: float = 0.0


class Cessation(Event):
    kind: ClassVar[str] = "cessation"
    required: ClassVar[tuple[str, ...]] = ("held_slurm_job_id", "ended_slurm_job_id", "verdict")
    held_slurm_job_id: str = ""
    ended_slurm_job_id: str = ""
    verdict: str = ""
    code: Optional[int] = None
    evidence: Any = None
    command: list[str] = []
    asked_at: Optional[float] = None

    @property
    def asked(self) -> float:
        return self.asked_at if self.asked_at is not None else self.time


class Notified(Event):
    """A person was told about a hold (made, or about to expire); ``ok`` False: it failed."""

    kind: ClassVar[str] = "notified"
    required: ClassVar[tuple[str, ...]] = ("slurm_job_id", "about", "channel")
    slurm_job_id: str = ""
    about: str = ""  # "hold" | "expiring"
    channel: str = ""  # "mail" | "site"
    ok: bool = True
    detail: str = ""


class Finished(Event):
    kind: ClassVar[str] = "finished"
    required: ClassVar[tuple[str, ...]] = ("submission",)
    submission: int = 0
    slurm_job_id: str = ""
    end_state: str = ""  # the rule's name for the end (slurm.jobs.END_STATES)
    rule: str = ""
    slurm_state: str = ""  # Slurm's own word for what the supervisor saw (DEADLINE), if any


class Superseded(Event):
    """The job was superseded by ``by``: its Slurm jobs are cancelled and nothing more is done
    for it.  ``cancelled``: the Slurm jobs cancelled then.  A later one with ``again`` set is
    the supervisor's: Slurm ran one of them again (a controller that restarted before it saved
    the cancel), and it was cancelled again."""

    kind: ClassVar[str] = "superseded"
    required: ClassVar[tuple[str, ...]] = ("by",)
    by: str = ""
    cancelled: list[str] = []
    again: str = ""  # why it was cancelled again, in Slurm's words ("RUNNING, restart 2")


class Started(Event):
    """Written by the launcher at the start of every execution, as the job's user."""

    kind: ClassVar[str] = "started"
    required: ClassVar[tuple[str, ...]] = ("submission",)
    submission: int = 0
    slurm_job_id: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    restart: int = 0
    attempt: str = ""
    epoch: int = 0
    exec_dir: str = ""
    resume_from: str = ""
    node: str = ""
    nodes: str = ""
    host: str = ""
    pid: int = 0
    # Slurm's id of this execution (SLURM_JOB_SLUID, 26.05; a requeue draws a new one), where
    # Slurm gives one: it tells this execution from another of the same job id once ids start
    # again (a controller that lost its state), in the hooks' facts too.
    sluid: str = ""


class NoProgress(Event):
    """The supervisor stopped restarting a lineage: its last ``limit`` executions
    (``executions``: [submission, restart, attempt] each, oldest first) published nothing past
    the save each resumed from (``resumed_from``: those saves, '' for a fresh start).
    ``action``: ``held`` (Slurm's requeued job ``slurm_job_id`` held, until a person's
    release) or ``not resubmitted`` (after ``end_state``; a person's resubmit goes on).
    Recorded once per last execution (its attempt is the key)."""

    kind: ClassVar[str] = "no-progress"
    required: ClassVar[tuple[str, ...]] = ("submission", "slurm_job_id", "executions")
    submission: int = 0
    slurm_job_id: str = ""
    executions: list[list[Any]] = []
    resumed_from: list[str] = []
    limit: int = 0
    action: str = ""
    end_state: str = ""
    # The restart count of the execution the launcher stopped at its start (Slurm started the
    # requeued job before a pass could hold it; the launcher requeued it held), else None.
    at_start: Optional[int] = None

    @property
    def last_attempt(self) -> str:
        last = self.executions[-1] if self.executions else []
        return str(last[2]) if isinstance(last, list) and len(last) > 2 else ""


class Quarantined(Event):
    """The supervisor quarantined ``save`` (a mark in the root ``root``,
    :mod:`slurm_dispatch.checkpoint.quarantine`): its last executions (``executions``:
    [submission, restart, attempt] each, oldest first) all resumed from it and failed before
    publishing anything, so the next one falls back past it.  Recorded once per last
    execution (its attempt is the key)."""

    kind: ClassVar[str] = "quarantined"
    required: ClassVar[tuple[str, ...]] = ("save", "executions")
    save: str = ""
    root: str = ""
    executions: list[list[Any]] = []
    end_state: str = ""


class RequeuesSpent(Event):
    """The supervisor held Slurm's requeued job ``slurm_job_id`` (restart ``restarts``): the
    lineage's ``used`` requeues went past its ``--max-requeues`` ``budget``.  Recorded once
    per requeue; a person's release (a released event after it) lets it run."""

    kind: ClassVar[str] = "requeues-spent"
    required: ClassVar[tuple[str, ...]] = ("submission", "slurm_job_id")
    submission: int = 0
    slurm_job_id: str = ""
    restarts: int = 0
    used: int = 0
    budget: int = 0
    # The restart count of the execution the launcher stopped at its start (its own
    # ``scontrol requeuehold`` made ``restarts`` one more), else None: the supervisor's hold.
    at_start: Optional[int] = None


class NodeAvoided(Event):
    """The supervisor decided that the lineage's next executions avoid ``node``
    (``--avoid-bad-nodes``): ``why`` ``node failure`` (an execution ended by the node's
    failure there) or ``failed`` (that many of its executions failed on it);
    ``executions``: [submission, restart, Slurm job id] each, oldest first.  Recorded once
    per node (:mod:`slurm_dispatch.control.badnodes`)."""

    kind: ClassVar[str] = "node-avoided"
    required: ClassVar[tuple[str, ...]] = ("node", "why")
    node: str = ""
    why: str = ""
    executions: list[list[Any]] = []


class NodesExcluded(Event):
    """The supervisor kept the lineage's bad ``nodes`` off Slurm job ``slurm_job_id``:
    ``how`` ``resubmission`` (its submission ``submission``, ``sbatch --exclude``) or
    ``requeued`` (Slurm's requeued pending job, restart ``restarts``: ``ExcNodeList``),
    merged with the owner's own (``submission``: the one it is either way); ``kept``: bad
    nodes left in so that the job's ``node_count`` nodes of a partition stay usable;
    ``asked``: bad nodes left in because the job asks for them (``--nodelist``);
    ``refused``: bad nodes left in because sbatch refused the job without them (Slurm's
    words: ``refusal``; a constraint, GRES or memory only they have).  Recorded once per
    Slurm job and restart."""

    kind: ClassVar[str] = "nodes-excluded"
    required: ClassVar[tuple[str, ...]] = ("slurm_job_id", "how")
    slurm_job_id: str = ""
    how: str = ""
    submission: int = 1
    restarts: int = 0
    nodes: list[str] = []
    kept: list[str] = []
    node_count: int = 0
    asked: list[str] = []
    refused: list[str] = []
    refusal: str = ""
    given: list[str] = []  # the exclusion list Slurm got (the owner's, then ours)
    partitions: list[str] = []  # where the job may run, as slurmctld had it


class Stalled(Event):
    """Written inside the job, as the job's user, by the launcher's stall watcher
    (:mod:`slurm_dispatch.execution.stall`): the execution ``attempt`` (Slurm job
    ``slurm_job_id``) made no progress for ``seconds`` (its ``--stall-timeout``,
    ``timeout``) since step ``step`` (None: none recorded), not counting time inside a save;
    it was sent ``signal`` (its warning signal, to save) and then ended.  Its end counts as a
    failure, whatever its exit status."""

    kind: ClassVar[str] = "stalled"
    required: ClassVar[tuple[str, ...]] = ("submission", "attempt")
    submission: int = 0
    slurm_job_id: str = ""
    attempt: str = ""
    seconds: int = 0
    timeout: int = 0
    step: Optional[int] = None
    signal: str = ""

    @property
    def reason(self) -> str:
        """The reason in words, as the supervisor and ``dispatch status`` show it."""
        return f"stalled: no progress for {self.seconds} s since " + (
            f"step {self.step}" if self.step is not None else "its last record"
        )


KINDS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        Submitted,
        SubmitFailed,
        SubmitLost,
        Hold,
        Released,
        Expired,
        Cessation,
        Notified,
        Finished,
        Superseded,
        Started,
        NoProgress,
        Quarantined,
        RequeuesSpent,
        NodeAvoided,
        NodesExcluded,
        Stalled,
    )
}


# -- reading -----------------------------------------------------------------------------


def _check(f: _Field, value: Any) -> Any:
    """``value`` if it has the field's JSON type (an int is a float), else EventError."""
    if value is None and f.nullable:
        return None
    check = f.check
    if check == "any":
        return value
    if check == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif check == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif check == "str":
        if type(value) is str:
            return value
    elif check == "bool":
        if type(value) is bool:
            return value
    elif check == "list":
        if isinstance(value, list):
            return value
    elif check == "dict":
        if isinstance(value, dict):
            return value
    raise EventError(f"field {f.name!r} is {value!r}, not {check}")


def parse(data: Any) -> Event:
    """One stored event, checked; raises EventError naming what is wrong."""
    if not isinstance(data, dict):
        raise EventError(f"an event is a JSON object, not {type(data).__name__} {data!r:.80}")
    kind = data.get("event")
    if not isinstance(kind, str):
        raise EventError(f"no 'event' kind (got {kind!r})")
    version = data.get("v", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise EventError(f"format version 'v' is {version!r}, not an integer from 1")
    if version > VERSION:
        raise EventError(
            f"{kind!r} event is format version {version}, newer than this "
            f"slurm-dispatch reads ({VERSION}): upgrade slurm-dispatch here"
        )
    cls = KINDS.get(kind)
    if cls is None:
        raise EventError(f"unknown event kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    values: dict[str, Any] = {}
    for f in cls._fields:
        if f.name == "raw":
            continue
        if f.name not in data:
            if f.name in cls.required or f.name in ("time", "ns"):
                raise EventError(f"{kind!r} event has no {f.name!r}")
            continue
        values[f.name] = _check(f, data[f.name])
    if cls is Started and values.get("task") is None and data.get("array_task_id"):
        task = str(data["array_task_id"])
        if not task.isdigit():
            raise EventError(f"field 'array_task_id' is {task!r}, not an array task id")
        values["task"] = int(task)
    if values.get("task") is not None and values["task"] < 0:
        raise EventError(f"field 'task' is {values['task']!r}, not an array task id")
    if cls is Submitted and values.get("hold") is not None:
        intent(values["hold"])  # checked here, so a reader never meets a bad one later
    event = cls(**values, raw=data)
    if getattr(event, "submission", 1) < 1:
        raise EventError(
            f"field 'submission' is {event.submission!r}, "  # type: ignore
            "not a number from 1"
        )
    return event


def intent(data: Any) -> HoldIntent:
    """A hold intent as stored (in a submitted event or a claim); raises EventError."""
    if not isinstance(data, dict):
        raise EventError(f"a hold intent is a JSON object, not {data!r:.80}")
    values = {}
    for f in HoldIntent._fields:
        if f.name in data:
            values[f.name] = _check(f, data[f.name])
        elif f.required:
            raise EventError(f"hold intent has no {f.name!r}")
    return HoldIntent(**values)


def new(cls: type[Event], now_ns: int, **values: Any) -> Event:
    """A new event of this format version, stamped ``now_ns``; checked like a stored one."""
    data = {
        "event": cls.kind,
        "v": VERSION,
        "time": round(now_ns / 1e9, 3),
        "ns": now_ns,
        **{k: v for k, v in values.items() if not (k == "task" and v is None)},
    }
    return parse(data)


# -- the history -------------------------------------------------------------------------


class Lineage:
    """One lineage of submissions: the whole job, or one array task (``task``)."""

    def __init__(
        self,
        task: Optional[int],
        submissions: list[Submitted],
        holds: list[Hold],
        ends: list[Union[Released, Expired]],
        answers: list[Cessation],
        started: list[Started],
        finished: Optional[Finished],
        superseded: Optional[Superseded],
        no_progress: Optional[list[NoProgress]] = None,
        quarantined: Optional[list[Quarantined]] = None,
        requeues_spent: Optional[list[RequeuesSpent]] = None,
        avoided: Optional[list[NodeAvoided]] = None,
        excluded: Optional[list[NodesExcluded]] = None,
    ) -> None:
        self.task = task
        self.submissions = submissions
        self.holds = holds
        self.ends = ends
        self.answers = answers
        self.started = started
        self.finished = finished
        self.superseded = superseded
        self.no_progress = list(no_progress or [])
        self.quarantined = list(quarantined or [])
        self.requeues_spent = list(requeues_spent or [])
        self.avoided = list(avoided or [])  # bad nodes, once each (--avoid-bad-nodes)
        self.excluded = list(excluded or [])  # where they were kept off

    @property
    def spent(self) -> Optional[RequeuesSpent]:
        """The supervisor's standing hold for a spent --max-requeues: the last one, while
        no one released its job after it."""
        if not self.requeues_spent:
            return None
        last = self.requeues_spent[-1]
        if any(e.slurm_job_id == last.slurm_job_id and e.ns > last.ns for e in self.ends):
            return None
        return last

    @property
    def stopped(self) -> Optional[NoProgress]:
        """The supervisor's standing stop for want of progress: the last one, while no
        execution started after the ones it counted and, for a held job, no one released it
        (a person's release or resubmission goes on)."""
        if not self.no_progress:
            return None
        stop = self.no_progress[-1]
        newest = max(self.started, key=lambda s: (s.epoch, s.ns), default=None)
        if newest is None or newest.attempt != stop.last_attempt:
            return None
        if any(e.slurm_job_id == stop.slurm_job_id and e.ns > stop.ns for e in self.ends):
            return None
        if any(s.submission > stop.submission for s in self.submissions):
            return None
        return stop

    @property
    def current(self) -> Optional[Submitted]:
        """The latest submission (the greatest number; the first record of it wins)."""
        best: Optional[Submitted] = None
        for sub in self.submissions:
            if best is None or sub.submission > best.submission:
                best = sub
        return best

    @property
    def next_submission(self) -> int:
        return max((s.submission for s in self.submissions), default=0) + 1

    @property
    def settled(self) -> bool:
        """Nothing more is done for it: finished by a rule, an expired hold, or superseded."""
        return self.finished is not None or self.superseded is not None

    def submission(self, number: int) -> Optional[Submitted]:
        return next((s for s in self.submissions if s.submission == number), None)

    def hold_for(self, number: int) -> Optional[Hold]:
        """The hold of submission ``number``: its hold event, else the intent it was
        submitted with (a pass killed between the two), marked ``recovered``."""
        for hold in reversed(self.holds):
            if hold.submission == number:
                return hold
        sub = self.submission(number)
        if sub is None or sub.hold is None:
            return None
        wanted = intent(sub.hold)
        return Hold(
            time=sub.time,
            ns=sub.ns,
            v=sub.v,
            task=sub.task,
            submission=number,
            slurm_job_id=sub.slurm_job_id,
            ended_slurm_job_id=wanted.ended_slurm_job_id,
            ended_restart=wanted.ended_restart,
            end_state=wanted.end_state,
            deadline=wanted.deadline,
            instead_of=wanted.instead_of,
            ended_tasks=wanted.ended_tasks,
            recovered=True,
        )

    def lifted(self, slurm_job_id: str) -> Optional[Union[Released, Expired]]:
        """How the hold on ``slurm_job_id`` ended (released or expired), if it did."""
        return next((e for e in self.ends if e.slurm_job_id == slurm_job_id), None)

    @property
    def hold(self) -> Optional[Hold]:
        """The standing hold: the current submission's, while not released nor expired."""
        current = self.current
        if current is None:
            return None
        hold = self.hold_for(current.submission)
        if hold is None or self.lifted(hold.slurm_job_id) is not None:
            return None
        return hold

    def answers_for(self, held_slurm_job_id: str) -> list[Cessation]:
        return [a for a in self.answers if a.held_slurm_job_id == held_slurm_job_id]

    def started_for(self, number: int) -> list[Started]:
        return [s for s in self.started if s.submission == number]


class History:
    """A dispatch job's events, oldest first, and what they say."""

    def __init__(self, job_id: str, events: list[Event]) -> None:
        self.job_id = job_id
        self.events = events

    def __repr__(self) -> str:
        return f"History({self.job_id!r}, {len(self.events)} events)"

    def of(self, cls: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]

    @property
    def tasks(self) -> list[int]:
        """Array task ids the record speaks of (its executions and per-task events)."""
        return sorted({e.task for e in self.events if e.task is not None})

    def lineage(self, task: Optional[int] = None) -> Lineage:
        """The whole job (``task`` None) or one array task: whole-job events count for
        every task, a task's own events only for it."""

        def mine(e: Event) -> bool:
            return e.task is None or e.task == task

        superseded = self.of(Superseded)
        finished = [e for e in self.of(Finished) if e.task is None or e.task == task]
        return Lineage(
            task=task,
            submissions=[e for e in self.of(Submitted) if mine(e)],
            holds=[e for e in self.of(Hold) if mine(e)],
            ends=[e for e in self.events if isinstance(e, (Released, Expired)) and mine(e)],
            answers=[e for e in self.of(Cessation) if mine(e)],
            started=[e for e in self.of(Started) if task is None or e.task == task],
            finished=finished[-1] if finished else None,
            # When it was superseded: the first (the supervisor's later ones cancel again).
            superseded=superseded[0] if superseded else None,
            no_progress=[e for e in self.of(NoProgress) if mine(e)],
            quarantined=[e for e in self.of(Quarantined) if mine(e)],
            requeues_spent=[e for e in self.of(RequeuesSpent) if mine(e)],
            avoided=[e for e in self.of(NodeAvoided) if mine(e)],
            excluded=[e for e in self.of(NodesExcluded) if mine(e)],
        )

    def settled_tasks(self, tasks: list[int]) -> bool:
        """Every one of an array's ``tasks`` is settled (or the whole job is)."""
        return self.lineage().settled or (
            bool(tasks) and all(self.lineage(t).settled for t in tasks)
        )

    # The whole job's answers, for callers that do not deal in tasks.
    @property
    def submissions(self) -> list[Submitted]:
        return self.of(Submitted)

    @property
    def next_submission(self) -> int:
        """The number a whole-job submission gets: above every task's too, so that no task's
        lineage ever holds two submissions of one number."""
        return max((s.submission for s in self.of(Submitted)), default=0) + 1

    @property
    def hold(self) -> Optional[Hold]:
        return self.lineage().hold

    @property
    def settled(self) -> bool:
        return self.lineage().settled

    def submission_of(self, slurm_job_id: str) -> Optional[Submitted]:
        """The submission made as Slurm job ``slurm_job_id`` (``97`` or a task's ``97_1``)."""
        base = slurm_job_id.split("_")[0]
        for sub in self.of(Submitted):
            if sub.slurm_job_id == base:
                return sub
        for start in self.of(Started):  # a task's own job id (98 for 97_1)
            if start.slurm_job_id == base and start.array_job_id:
                return next(
                    (s for s in self.of(Submitted) if s.slurm_job_id == start.array_job_id), None
                )
        return None

    def decisions(self) -> list[Event]:
        """What was decided and observed beyond submissions and starts, for a reader."""
        return [e for e in self.events if not isinstance(e, (Submitted, Started))]
