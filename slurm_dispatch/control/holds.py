"""The cessation question on the control side: have an ended execution's processes ceased?

A shared-checkpoint job's next submission is made held (:mod:`.supervisor`, and
:func:`.submit.submit_new` for a superseding job); the hold waits for the site's
CessationSignal (``dispatch-cease`` by default) to prove every ended execution it waits for
gone, or for a person (``dispatch release``).  Both ask here, the same way: the signal run once
per ended execution (an array hold's every task), each answer recorded as a cessation fact.
A person's ``dispatch resubmit`` of a shared job restarts it as a lifted hold does, so it asks
here too, about the job's last execution (:func:`refuse_unproven_restart`).
The texts a held Slurm job's comment carries through its hold (held, released, hold over) are
written here too.  ``dispatch release`` also lifts the supervisor's hold of an isolated job's
requeued Slurm job made for want of progress (``--max-no-progress``): nothing to prove there.

Invariants:

* Each answer is recorded (a cessation fact) before anything is decided on it.
* A hold is lifted on the signal's word only when every answer is "ceased" (an error is not);
  a person's release, and a person's resubmission of a shared job, is refused while one is
  not, unless the person forces it.
* The signal means 0 ceased, 1 not ceased, anything else an error; asking never raises.
* A signal named without a folder (``dispatch-cease``) is found on PATH, else beside the
  interpreter (a systemd unit's PATH lacks the venv's ``bin/``); one found nowhere is an error
  that says where it was looked for.
* Every comment starts with the submission's marker, so the job is still found by it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import _clock
from ..errors import RecordError, RefusedError, SlurmError
from . import events, naming, record, sbatch_words

if TYPE_CHECKING:
    from ..slurm.adapter import Slurm
    from .settings import Settings


@dataclass
class Answer:
    verdict: str  # "ceased" | "not ceased" | "error"
    code: Optional[int]
    evidence: Any


# (argv, timeout) -> the answer; the site's signal, or a test's stand-in.
SignalRunner = Callable[[list[str], float], Answer]


def locate(command: str) -> Optional[str]:
    """Where a CessationSignal command named without a folder is: on PATH, as a user's shell
    finds it, else beside this process's interpreter (the venv's ``bin/``, where the wheel
    installs ``dispatch-cease`` beside ``dispatch``: a systemd unit's PATH lacks it); None
    when neither has it.  A command with a ``/`` is taken as it is."""
    if "/" in command:
        return command
    found = shutil.which(command)
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), command)
    return beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None


def ask_signal(argv: list[str], timeout: float) -> Answer:
    """Run the site's CessationSignal (found by :func:`locate`): exit 0 ceased, 1 not ceased,
    anything else an error."""
    where = locate(argv[0])
    if where is None:
        return Answer(
            "error",
            None,
            f"{argv[0]!r} not found on PATH "
            f"({os.environ.get('PATH', os.defpath)}) nor beside "
            f"{sys.executable}: set CessationSignal= to its absolute "
            "path in dispatch.conf",
        )
    try:
        # errors="replace": bytes that are not UTF-8 are still an answer, read as far as text.
        proc = subprocess.run(
            [where, *argv[1:]], capture_output=True, text=True, errors="replace", timeout=timeout
        )
    except FileNotFoundError:
        return Answer("error", None, f"{argv[0]!r} not found")
    except OSError as exc:  # not executable, a folder: the site's signal cannot be run
        return Answer("error", None, f"{argv[0]!r} cannot be run: {exc.strerror}")
    except subprocess.TimeoutExpired:
        return Answer("error", None, f"no answer within {timeout:g} s")
    evidence: Any = proc.stdout.strip()
    try:
        evidence = json.loads(proc.stdout)
    except ValueError:
        pass
    verdict = {0: "ceased", 1: "not ceased"}.get(proc.returncode, "error")
    if verdict == "error" and proc.stderr.strip():
        evidence = {"output": evidence, "stderr": proc.stderr.strip()[-2000:]}
    return Answer(verdict, proc.returncode, evidence)


def why(answer: Answer) -> str:
    """What an error answer says went wrong, in one short line (empty for any other verdict):
    the pass line carries it beside the verdict."""
    if answer.verdict != "error":
        return ""
    text = " ".join(_evidence_text(answer).split())[-300:]
    return text or (f"exit {answer.code}" if answer.code is not None else "")


@dataclass(frozen=True)
class Asked:
    """One ended execution the hold waits for, and what the signal said about it."""

    target: str
    answer: Answer


def ask_one(
    signal: str, target: str, restart: object, timeout: float, runner: SignalRunner
) -> tuple[list[str], Answer]:
    """Ask ``signal`` about one ended execution: the argv run (or, when the setting does not
    split into words, the setting as written before the usual target) and the answer."""
    tail = [target, "--restart", str(restart), "--json"]
    try:
        argv = [*shlex.split(signal), *tail]
    except ValueError as exc:  # an unbalanced quote: nothing can be run, which is an answer
        return [signal, *tail], Answer(
            "error", None, f"CessationSignal {signal!r} does not split into words: {exc}"
        )
    return argv, runner(argv, timeout)


def ask(
    job: record.JobRecord,
    hold: events.Hold,
    signal: str,
    timeout: float,
    runner: SignalRunner,
    clock: Callable[[], float],
    task: Optional[int],
    heard: Optional[Callable[[Asked], None]] = None,
) -> list[Asked]:
    """Ask ``signal`` about every ended execution ``hold`` waits for (an array hold: each
    task's), recording each answer as a cessation fact of ``task``'s lineage as it comes,
    then telling ``heard`` (so a caller's report has every answer recorded before a later
    one fails)."""
    asked = []
    history = job.history()
    for target, restart in hold.ended_tasks or [[hold.ended_slurm_job_id, hold.ended_restart]]:
        argv, answer = ask_one(signal, str(target), restart, timeout, runner)
        answer = owned(answer, str(target), sluid=_sluid_of(history, str(target), restart))
        job.append(
            events.Cessation,
            asked_at=round(clock(), 3),
            held_slurm_job_id=hold.slurm_job_id,
            ended_slurm_job_id=str(target),
            verdict=answer.verdict,
            code=answer.code,
            evidence=answer.evidence,
            command=argv,
            task=task,
        )
        asked.append(Asked(str(target), answer))
        if heard is not None:
            heard(asked[-1])
    return asked


def _sluid_of(history: events.History, target: str, restart: Optional[int]) -> str:
    """The SLUID the launcher recorded for execution ``restart`` of Slurm job ``target`` (a
    plain id or an array task's ``A_T``), '' where none was."""
    for start in history.of(events.Started):
        key = (
            f"{start.array_job_id}_{start.array_task_id}"
            if start.array_task_id
            else start.slurm_job_id
        )
        if target in (key, start.slurm_job_id) and start.restart == restart and start.sluid:
            return start.sluid
    return ""


def owned(answer: Answer, target: str, uid: Optional[int] = None, sluid: str = "") -> Answer:
    """``answer``, unless it says ceased about facts of another uid than ``uid`` (default: this
    process's, the held job's owner), or of another run than ``sluid`` (the SLUID the record
    holds for the execution, 26.05): then an error.  A job id used twice (slurmctld's state
    started anew, MaxJobId wrapped) names another job, whose end proves nothing about this
    user's execution; ``dispatch-cease --json`` names whose facts it judged (``uid``) and
    which run (``sluid``), a signal that does not is taken at its word."""
    evidence = answer.evidence if isinstance(answer.evidence, dict) else {}
    judged, run = evidence.get("uid"), evidence.get("sluid")
    if answer.verdict == "ceased" and sluid and isinstance(run, str) and run and run != sluid:
        return Answer(
            "error",
            answer.code,
            {
                "output": answer.evidence,
                "problem": f"Slurm job {target} was judged from the facts of its run {run}, not "
                f"of this execution's, {sluid}: the job id was used twice (slurmctld's "
                "state started anew), so that run's end proves nothing about this "
                f"one; `dispatch-cease {target} --sluid {sluid}` judges this one",
            },
        )
    mine = os.getuid() if uid is None else uid
    if (
        answer.verdict != "ceased"
        or not isinstance(judged, int)
        or isinstance(judged, bool)
        or judged == mine
    ):
        return answer
    return Answer(
        "error",
        answer.code,
        {
            "output": answer.evidence,
            "problem": f"Slurm job {target} was judged from uid {judged}'s facts, not uid "
            f"{mine}'s: the job id now names another user's job (job ids used twice: "
            "slurmctld's state started anew, or MaxJobId wrapped), so its end proves "
            "nothing about this one; release it by hand once you know",
        },
    )


def ceased(asked: list[Asked]) -> bool:
    """Every ended execution proven gone: the hold may be lifted on the signal's word."""
    return all(a.answer.verdict == "ceased" for a in asked)


def unproven(asked: list[Asked]) -> list[str]:
    """One line of evidence per ended execution not proven gone."""
    return [
        f"{a.target}: {a.answer.verdict}: {_evidence_text(a.answer)}"
        for a in asked
        if a.answer.verdict != "ceased"
    ]


def release(
    slurm: Slurm,
    job: record.JobRecord,
    settings: Optional[Settings] = None,
    force: bool = False,
    signal_runner: SignalRunner = ask_signal,
    clock: Callable[[], float] = time.time,
    task: Optional[int] = None,
) -> str:
    """A person lifts the standing hold of ``job`` (of an array: every task's standing
    hold, or with ``task`` that task's only); returns the released Slurm job id(s),
    comma-separated.

    With a CessationSignal in ``settings``, it is asked first about every ended execution the
    hold waits for (each answer recorded): when one is not proven ceased, the release is
    refused with the evidence (:class:`RefusedError`), unless ``force`` (the person's call).
    """
    history = job.history()
    tasks = sbatch_words.array_tasks(job) or []
    lines = (
        [history.lineage()] + [history.lineage(t) for t in tasks]
        if task is None
        else [history.lineage(task)]
    )
    standing: list[tuple[events.Lineage, events.Hold]] = []
    for line in lines:
        hold = line.hold
        if (
            hold is not None
            and (line.task is None or hold.task is not None)
            and hold.slurm_job_id not in {h.slurm_job_id for _, h in standing}
        ):
            standing.append((line, hold))
    if not standing:
        stopped: list[Union[events.NoProgress, events.RequeuesSpent]] = [
            line.stopped
            for line in lines
            if line.stopped is not None and line.stopped.action == "held"
        ]
        stopped += [line.spent for line in lines if line.spent is not None]
        if stopped:
            return _release_stopped(slurm, job, stopped)
        line = lines[0]
        last = line.holds[-1] if line.holds else None
        lifted = line.lifted(last.slurm_job_id) if last is not None else None
        if last is not None and lifted is not None:
            raise RecordError(
                f"the hold on Slurm job {last.slurm_job_id} of {job.id} is already {lifted.kind}"
            )
        raise RecordError(f"dispatch job {job.id} has no hold to release")
    if settings is not None and settings.signal and not force:
        refused = []
        for _, hold in standing:
            refused += unproven(
                ask(
                    job,
                    hold,
                    settings.signal,
                    settings.signal_timeout,
                    signal_runner,
                    clock,
                    hold.task,
                )
            )
        if refused:
            raise RefusedError(
                f"the ended execution the hold of {job.id} waits for is not proven gone, so "
                "its processes may still write the shared checkpoint: "
                + "; ".join(refused)
                + f".  Release anyway with `dispatch release --force {job.id}`"
            )
    held_ids = [hold.slurm_job_id for _, hold in standing]
    slurm.release(held_ids)
    for _, hold in standing:
        job.append(
            events.Released,
            slurm_job_id=hold.slurm_job_id,
            by="a person (dispatch release" + (" --force)" if force else ")"),
            task=hold.task,
        )
        mark_released(slurm, job, hold, "by a person")
    return ",".join(held_ids)


def _release_stopped(
    slurm: Slurm,
    job: record.JobRecord,
    stopped: list[Union[events.NoProgress, events.RequeuesSpent]],
) -> str:
    """A person lifts the supervisor's hold of Slurm's requeued job made for want of progress
    (--max-no-progress) or past --max-requeues: no cessation to prove, the job is
    isolated (Slurm requeued it)."""
    held_ids = sorted({stop.slurm_job_id for stop in stopped})
    slurm.release(held_ids)
    for stop in stopped:
        why = "no progress" if isinstance(stop, events.NoProgress) else "requeue budget"
        job.append(
            events.Released,
            slurm_job_id=stop.slurm_job_id,
            by=f"a person (dispatch release), after {why}",
            task=stop.task,
        )
    return ",".join(held_ids)


def refuse_unproven_restart(
    job: record.JobRecord,
    settings: Optional[Settings],
    force: bool = False,
    signal_runner: SignalRunner = ask_signal,
    clock: Callable[[], float] = time.time,
    task: Optional[int] = None,
) -> None:
    """A person's resubmission of a shared-checkpoint job starts it again on the shared
    checkpoint, as a lifted hold does, so it is held to the same proof: the CessationSignal
    is asked about the job's last execution (of each array task's lineage, or of ``task``'s),
    each answer recorded; when one is not proven ceased, the resubmission is refused with the
    evidence, naming that execution (:class:`RefusedError`), unless ``force`` (the person's
    call).  An isolated job, a site without a signal, or a job none of whose executions
    recorded a start is not asked about."""
    if force or not job.spec.get("shared_checkpoint") or settings is None or not settings.signal:
        return
    history = job.history()
    tasks = sbatch_words.array_tasks(job)
    lines = (
        [history.lineage(task)]
        if task is not None
        else ([history.lineage(t) for t in tasks] if tasks else [history.lineage()])
    )
    refused = []
    for line in lines:
        if not line.started:
            continue
        last = line.started[-1]
        target = (
            f"{last.array_job_id}_{last.array_task_id}"
            if last.array_job_id and last.array_task_id
            else last.slurm_job_id
        )
        argv, answer = ask_one(
            settings.signal, target, last.restart, settings.signal_timeout, signal_runner
        )
        answer = owned(answer, target)
        job.append(
            events.Cessation,
            asked_at=round(clock(), 3),
            held_slurm_job_id="",
            ended_slurm_job_id=target,
            verdict=answer.verdict,
            code=answer.code,
            evidence=answer.evidence,
            command=argv,
            task=line.task,
        )
        if answer.verdict != "ceased":
            refused.append(
                f"Slurm job {target} restart {last.restart} on "
                f"{last.node or last.host or '?'}: {answer.verdict}: "
                f"{_evidence_text(answer)}"
            )
    if refused:
        raise RefusedError(
            f"the last execution of {job.id} (a shared-checkpoint job) is not proven gone, so "
            "a resubmission now could run beside its processes on the shared checkpoint: "
            + "; ".join(refused)
            + f".  Resubmit once the site's signal ({settings.signal}) "
            "answers ceased, or anyway with `dispatch resubmit --force "
            + ("" if task is None else f"--task {task} ")
            + f"{job.id}`"
        )


# -- the held job's comment, through its hold ---------------------------------------------


def hold_comment(
    job: record.JobRecord, submission: int, task: Optional[int], why: str, deadline: float
) -> str:
    """The ``--comment=`` option of a held submission: its marker first, then why and until
    when (a date, so squeue shows when the hold expires)."""
    return (
        f"--comment={naming.marker(job, submission, task)} held: shared checkpoint; "
        f"{why}; waits until its processes are proven gone or a person releases it; "
        f"expires {_clock.with_zone(deadline)}"
    )


def mark_released(slurm: Slurm, job: record.JobRecord, hold: events.Hold, by: str) -> None:
    """Say in the released job's comment that the hold is over (its marker stays first, so
    the job is still found by it); best effort: the release itself is what matters."""
    text = f"{naming.marker(job, hold.submission, hold.task)} released {by} {_clock.with_zone()}"
    try:
        slurm.set_comment(hold.slurm_job_id, text)
    except SlurmError:
        pass


def started_comment(job: record.JobRecord, submission: int, task: Optional[int]) -> str:
    """The comment of a once-held submission whose execution started: the hold is over."""
    return f"{naming.marker(job, submission, task)} hold over: started {_clock.with_zone()}"


def _evidence_text(answer: Answer) -> str:
    evidence = answer.evidence
    if isinstance(evidence, dict):
        reason = evidence.get("reason") or evidence.get("problem") or evidence.get("stderr") or ""
        nodes = [
            f"{n.get('node')}: {n.get('evidence')}"
            for n in evidence.get("nodes") or []
            if isinstance(n, dict) and not n.get("proven")
        ]
        return "; ".join([str(reason), *nodes[:4]]).strip("; ")
    return str(evidence)[:300]
