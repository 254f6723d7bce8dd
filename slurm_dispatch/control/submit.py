"""Submitting dispatch jobs through sbatch: first submissions, resubmissions, supersessions.

Invariants:

* Nothing is recorded before the input is known good (script readable, ``#!`` first line, no
  DOS line breaks, checkpoint root usable, one root per task for an array of several tasks);
  a job whose first ``sbatch`` fails is removed whole.
* Submission N is made at most once: its claim file is created with ``O_EXCL`` before
  ``sbatch`` runs, and the job carries the marker ``dispatch:<id>/<N>`` in its comment so a
  timed-out ``sbatch`` is looked up, not blindly repeated.  A job given the user's own comment
  has no marker: where the release gives SLUIDs (26.05) the submission records its job's,
  read right after ``sbatch``, to tell it from another job under its id
  (:func:`.naming.is_submission`).
* Every submission runs the snapshot taken at the first one, with the same sbatch options, from
  the same working directory.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import DispatchError, RecordError, SlurmError, UsageError
from ..slurm.adapter import Slurm, default_timeout
from ..slurm.cli_backend import sbatch_argv
from ..slurm.jobs import Job, unique_jobs
from ..slurm.result import Result
from . import dependency, events, record, sbatch_args
from .environment import save_environment, submission_environment
from .naming import claim_name, marker, once_key, own_views, wants_sluids
from .request import Request, refuse_array_on_one_root, refuse_warning_past_limit
from .request import read_request as read_request  # the commands', the API's and tests' name
from .root_setup import checkpoint_root, prepare_root, refuse_shared_root, remove_new_folders
from .sbatch_words import array_of, array_words, option_words

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional


def test_only(request: Request, slurm: Slurm) -> Result:
    """``--test-only``: sbatch only checks the job and says when it would start.  Passed
    through as given (the user's own script), nothing recorded and no folder made."""
    argv = sbatch_argv([*request.sbatch, request.script_path, *request.script_args])
    return slurm.runner(argv, dict(os.environ), request.cwd, default_timeout())


def _spec(
    request: Request,
    root: str,
    generation: int,
    supersedes: Optional[str],
    shared: bool,
    env: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    from .settings import avoid_setting, stall_setting

    return {
        "generation": generation,
        "checkpoint": root,
        "resubmit": request.options.resubmit,
        "max_no_progress": request.options.max_no_progress,
        "quarantine_after": request.options.quarantine_after,
        "stop_on_exit": request.options.stop_on_exit,
        "restart_on_exit": request.options.restart_on_exit,
        "max_requeues": request.options.max_requeues,
        # Its own --avoid-bad-nodes, else the site's AvoidBadNodes now: a later change of
        # the site's default leaves the job as its plan said.
        "avoid_bad_nodes": avoid_setting(request.options)[0],
        # Its own --stall-timeout, else the site's StallTimeout now (0: off).
        "stall_timeout": stall_setting(request.options)[0],
        "shared_checkpoint": shared,
        # The environment sbatch is given (SBATCH_ARRAY_INX) is the submission's, not ours.
        "array_tasks": array_of(
            request.sbatch,
            os.environ if env is None else env,
            request.header.sbatch_lines,
            os.path.basename(request.script_path),
        ),
        "warn_before": list(request.options.warn_before) if request.options.warn_before else None,
        "supersedes": supersedes,
        "sbatch": request.sbatch,
        "script_args": request.script_args,
        "script_name": os.path.basename(request.script_path),
        "script_path": request.script_path,
        "header": request.header.sbatch_lines,
        "shebang": request.header.shebang,
        "long_names": sorted(request.long_names),
        "cwd": request.cwd,
        "python": (os.environ if env is None else env).get("DISPATCH_PYTHON") or sys.executable,
        "created": round(time.time(), 3),
        "user": _user(),
    }


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):  # pragma: no cover
        return str(os.getuid())


class SubmissionMade:
    """One submission made just now, as its maker gets it back: its dispatch job, number,
    Slurm job id and sbatch's output.  (The record's own account of a submission, read back
    later, is the event :class:`slurm_dispatch.control.events.Submitted`.)"""

    __slots__ = ("job", "submission", "slurm_job_id", "result")

    def __init__(
        self, job: record.JobRecord, submission: int, slurm_job_id: str, result: Result
    ) -> None:
        self.job = job
        self.submission = submission
        self.slurm_job_id = slurm_job_id
        self.result = result


def _sbatch_argv(
    job: record.JobRecord,
    submission: int,
    extra: list[str],
    env: Mapping[str, str],
    task: Optional[int] = None,
    words: Optional[list[str]] = None,
) -> tuple[list[str], bool]:
    spec = job.spec
    names = set(spec["long_names"])
    words = list(spec["sbatch"]) if words is None else words
    if task is None:
        argv = sbatch_argv([*words, *extra])
    else:
        # One task of the array on its own: the same snapshot and options, --array=<task>
        # (the command line wins over the script's #SBATCH --array and SBATCH_ARRAY_INX).
        argv = sbatch_argv([*array_words(words)[1], f"--array={task}", *extra])
    if "job-name" not in names and not env.get("SBATCH_JOB_NAME"):
        argv.append(f"--job-name={spec['script_name']}")
    warn = spec.get("warn_before")
    if warn:
        # To the batch shell (B:): the launcher execs the job script there, and a plain
        # --signal reaches only srun steps, never a script running its trainer directly.
        argv.append(f"--signal=B:{warn[0]}@{warn[1]}")
    if "open-mode" not in names and not env.get("SBATCH_OPEN_MODE"):
        # Slurm truncates the output file when it requeues a job; append keeps every
        # execution's output (the launcher heads each with a line of its own).
        argv.append("--open-mode=append")
    if spec.get("shared_checkpoint") and "no-requeue" not in names:
        # Slurm must not restart a shared-checkpoint job behind dispatch's back.
        argv.append("--no-requeue")
    has_marker = "comment" not in names and not env.get("SBATCH_COMMENT")
    if has_marker and not any(a.startswith("--comment=") for a in extra):
        argv.append(f"--comment={marker(job, submission, task)}")
    argv.append(job.batch_script(submission, task))
    argv.extend(spec["script_args"])
    return argv, has_marker


def _write_batch(job: record.JobRecord, submission: int, task: Optional[int] = None) -> None:
    """The batch script of submission N (``batch-<N>.sh``; ``batch-<N>-t<task>.sh`` for one
    task's own): the launcher learns N from it, so a task's submission number is fixed
    before the task can start, whatever the record says by then."""
    spec = job.spec
    header = sbatch_args.ScriptHeader(
        spec["shebang"], spec["header"], [], sbatch_args.DispatchOptions(), set()
    )
    from .interpreter import recorded  # spec["python"], unless a person chose another

    text = sbatch_args.render_batch_script(
        header=header, python=recorded(job), job_path=job.path, submission=submission
    )
    path = job.batch_script(submission, task)
    try:
        with open(path, "x", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
    except FileExistsError:
        pass  # a pass that died after writing it; the content is the same
    except OSError as exc:
        raise RecordError(f"cannot write {path!r}: {exc.strerror}") from None


def _submit(
    slurm: Slurm,
    job: record.JobRecord,
    submission: int,
    reason: str,
    extra: Optional[list[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    hold: Optional[dict[str, Any]] = None,
    task: Optional[int] = None,
) -> SubmissionMade:
    _write_batch(job, submission, task)
    run_env = dict(env) if env is not None else submission_environment(job)
    words = list(job.spec["sbatch"])
    named = dependency.dependency_value(words)
    if named is not None and dependency.named_jobs(named[2]):
        # --dependency names dispatch jobs: their current submissions, at each submission.
        words = dependency.resolve(
            words,
            os.path.dirname(os.path.dirname(job.path)),
            slurm.own_jobs(run_env),
            cluster=job.cluster or slurm.cluster(run_env),
        )
    argv, has_marker = _sbatch_argv(job, submission, list(extra or []), run_env, task, words)
    cwd = job.spec["cwd"]
    if has_marker:
        jobid, result = slurm.sbatch(argv, marker(job, submission, task), run_env, cwd)
    else:
        # No marker to look the job up by: one attempt, never a blind second sbatch.
        jobid, result = slurm.sbatch(argv, "", run_env, cwd)
    # Nor to tell the job from another under its id once ids start again: its SLUID does,
    # where the release gives one (a plain job's; an array's tasks each have their own).
    sluid = (
        ""
        if has_marker or task is not None or array_words(argv)[0] is not None
        else slurm.sluid(jobid, run_env)
    )
    job.append(
        "submitted",
        once=once_key(submission, task),
        submission=submission,
        slurm_job_id=jobid,
        reason=reason,
        argv=argv,
        hold=hold,
        task=task,
        **({"sluid": sluid} if sluid else {}),
    )
    return SubmissionMade(job, submission, jobid, result)


def submit_new(
    request: Request,
    slurm: Slurm,
    home: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> SubmissionMade:
    """The first submission of a new dispatch job (or of a superseding one).

    A job superseding a shared-checkpoint job shares that checkpoint too, so it is submitted
    held, like any other restart of a shared job, and the old job's Slurm jobs are cancelled
    only once it is: the two generations never run side by side.  The supervisor asks the
    site's CessationSignal about the old execution and releases the hold on a ceased answer.
    """
    old, generation, root = _generation(request, slurm, home, env)
    shared = request.options.shared_checkpoint or bool(old and old.spec["shared_checkpoint"])
    refuse_array_on_one_root(request, root, env)
    refuse_warning_past_limit(request, env)
    refuse_shared_root(root, slurm, home, env, allowed=old.id if old else None)
    created = prepare_root(root)
    job = _record_new(request, slurm, home, env, root, generation, old, shared, created)
    intent: Optional[dict[str, Any]] = None
    sbatch_begun = False
    try:
        # The old generation as Slurm sees it, read before sbatch: a held submission's intent
        # (what it waits for) is recorded with its claim, so a kill after sbatch keeps the hold.
        jobs = slurm.own_jobs(env) if old is not None else {}
        held_after = _latest_slurm_id(old) if old is not None and shared else None
        extra: list[str] = []
        if held_after:
            intent, extra = _held_after(job, old, held_after, jobs)
        if not job.claim("submission-1", {"reason": "first", "hold": intent}):
            raise RecordError(f"{job.id}: submission 1 already claimed")  # pragma: no cover
        save_environment(job, env if env is not None else os.environ)
        sbatch_begun = True
        submitted = _submit(slurm, job, 1, "first", extra=extra, env=env, hold=intent)
    except (DispatchError, OSError):
        record.remove_unsubmitted(job)
        remove_new_folders(created)
        raise
    except KeyboardInterrupt:
        if not sbatch_begun:
            record.remove_unsubmitted(job)
            remove_new_folders(created)
            raise Interrupted(NOTHING_SUBMITTED) from None
        raise interrupted_in_sbatch(slurm, job, env, created, intent, old) from None
    if intent is not None:
        from .events import Hold

        job.append(Hold, once="1", submission=1, slurm_job_id=submitted.slurm_job_id, **intent)
    if old is not None:
        live = live_slurm_jobs(slurm, old, jobs)
        slurm.cancel(live, env)
        # A controller that restarts before it saves this cancel may run them again: the
        # supervisor cancels a superseded job's active Slurm jobs again (Supervisor._superseded).
        old.append("superseded", by=job.id, cancelled=live)
    return submitted


def _generation(
    request: Request, slurm: Slurm, home: Optional[str], env: Optional[Mapping[str, str]]
) -> tuple[Optional[record.JobRecord], int, str]:
    """(the job it supersedes, its generation, its root): a superseding job's root is the
    one it supersedes, and its generation the next."""
    if not request.options.supersede:
        return None, 0, checkpoint_root(request.options, request.cwd)
    # This cluster's job only: another's Slurm jobs cannot be held after nor cancelled here.
    old = record.open_job(request.options.supersede, home, cluster=slurm.cluster(env))
    generation = int(old.spec["generation"]) + 1
    old_root = old.spec["checkpoint"]
    if request.options.checkpoint and checkpoint_root(request.options, request.cwd) != old_root:
        raise UsageError(
            f"--checkpoint {request.options.checkpoint!r} differs from {old.id}'s root "
            f"{old_root!r}: a superseding job resumes from the root it supersedes"
        )
    return old, generation, old_root


def _record_new(
    request: Request,
    slurm: Slurm,
    home: Optional[str],
    env: Optional[Mapping[str, str]],
    root: str,
    generation: int,
    old: Optional[record.JobRecord],
    shared: bool,
    created: list[str],
) -> record.JobRecord:
    """The new job's record, checked again for another live job on its root once made; on a
    refusal or Ctrl-C, the record and the folders ``created`` go."""
    try:
        # The cluster: records of several clusters may share one home (one $HOME, several
        # clusters), and each cluster's commands act on its own jobs only.
        job = record.create_job(
            {
                **_spec(request, root, generation, old.id if old else None, shared, env),
                "cluster": slurm.cluster(env),
            },
            request.script_bytes,
            home,
        )
    except DispatchError:
        remove_new_folders(created)
        raise
    except KeyboardInterrupt:  # create_job removes what it had made of the record
        remove_new_folders(created)
        raise Interrupted(NOTHING_SUBMITTED) from None
    try:
        # Again, now that this job is recorded: one submitted on the same root meanwhile (by
        # another process or thread) is seen, or sees this one.
        refuse_shared_root(root, slurm, home, env, allowed=old.id if old else None, new=job)
    except DispatchError:
        record.remove_unsubmitted(job)
        remove_new_folders(created)
        raise
    except KeyboardInterrupt:
        record.remove_unsubmitted(job)
        remove_new_folders(created)
        raise Interrupted(NOTHING_SUBMITTED) from None
    return job


def _held_after(
    job: record.JobRecord, old: Optional[record.JobRecord], held_after: str, jobs: Mapping[str, Job]
) -> tuple[dict[str, Any], list[str]]:
    """The hold a job superseding a shared-checkpoint job is submitted with, until the old
    one's Slurm job ``held_after`` is proven gone: (its intent, the sbatch words)."""
    from .events import HoldIntent
    from .holds import hold_comment

    ended = jobs.get(held_after)
    intent = HoldIntent(
        deadline=round(time.time() + _hold_for(), 3),
        ended_slurm_job_id=held_after,
        ended_restart=ended.restarts if ended is not None else 0,
        end_state="superseded",
        instead_of="start",
    ).as_dict()
    extra = [
        "--hold",
        hold_comment(
            job,
            1,
            None,
            f"supersedes {old.id if old else '?'} (Slurm job {held_after})",
            intent["deadline"],
        ),
    ]
    return intent, extra


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a first submission, with what became of it in one sentence: the record
    is whole either way (removed, or kept with its submission or its claim)."""


NOTHING_SUBMITTED = "interrupted before sbatch ran: nothing was submitted, nothing is recorded"


def interrupted_in_sbatch(
    slurm: Slurm,
    job: record.JobRecord,
    env: Optional[Mapping[str, str]],
    created: list[str],
    intent: Optional[dict[str, Any]],
    old: Optional[record.JobRecord],
) -> Interrupted:
    """Ctrl-C once sbatch may have run: ask Slurm once for the job by its marker.  Found: its
    submission is recorded.  Slurm answers without it: sbatch submitted nothing, and the
    record goes.  Slurm cannot be asked (or the user gave the comment, so there is no
    marker): the record stays with its claim, which ``dispatch supervise`` completes."""
    wanted = marker(job, 1)
    name = _job_name(job, env)
    left = f"; {old.id} was not cancelled" if old is not None else ""
    jobs = None
    if intent is not None or _sbatch_argv(job, 1, [], env or os.environ)[1]:
        try:
            jobs = slurm.own_jobs(env, retry=False)
        except (DispatchError, KeyboardInterrupt):
            jobs = None
    if jobs is not None:
        landed = [j for j in jobs.values() if wanted in j.markers]
        if landed:
            slurm_id = landed[0].array_job_id or landed[0].job_id
            job.append(
                "submitted",
                once="1",
                submission=1,
                slurm_job_id=slurm_id,
                reason="first",
                argv=[],
                hold=intent,
                recovered=True,
            )
            if intent is not None:
                from .events import Hold

                job.append(Hold, once="1", submission=1, slurm_job_id=slurm_id, **intent)
            return Interrupted(
                f"interrupted, but sbatch had submitted it: Slurm job {slurm_id}, dispatch job "
                f"{job.id} (recorded; `scancel {slurm_id}` if it is unwanted){left}"
            )
        record.remove_unsubmitted(job)
        remove_new_folders(created)
        return Interrupted(
            f"interrupted while sbatch ran; no job of yours carries {wanted}, "
            "so nothing was submitted and nothing is recorded"
        )
    return Interrupted(
        f"interrupted while sbatch ran: the job may have reached Slurm (it could not be asked). "
        f"See `squeue --me -n {name}` or `dispatch status {job.id}`; the record of dispatch "
        f"job {job.id} is kept with its claim, so `dispatch supervise` records it once Slurm "
        f"shows it{left}"
    )


def _job_name(job: record.JobRecord, env: Optional[Mapping[str, str]]) -> str:
    """The job name sbatch was given (the last --job-name/-J), else the script's name."""
    found = option_words(list(job.spec["sbatch"]), "job-name", "J")[0]
    return found or (env or os.environ).get("SBATCH_JOB_NAME") or job.spec["script_name"]


def _latest_slurm_id(job: record.JobRecord) -> Optional[str]:
    submitted = job.submissions()
    return str(submitted[-1]["slurm_job_id"]) if submitted else None


def _hold_for() -> float:
    from .. import config

    return float(config.load().shared_hold_for)


def live_slurm_jobs(
    slurm: Slurm,
    job: record.JobRecord,
    jobs: Optional[dict[str, Job]] = None,
    env: Optional[Mapping[str, str]] = None,
    task: Optional[int] = None,
) -> list[str]:
    """The job's Slurm jobs still active: plain jobs by id, array tasks by display id (a task
    that started has an id of its own, so an array's id alone says nothing of its tasks).
    With ``task``, only that array task's.  Only a job that is one of the record's
    submissions (:func:`.naming.is_submission`: ids start again when slurmctld loses its state, and
    a plain job of the user's under a recorded id is not the record's to cancel)."""
    jobs = jobs if jobs is not None else slurm.own_jobs(env, sluids=wants_sluids([job]))
    submitted = {sub.slurm_job_id for sub in job.history().of(events.Submitted)}
    live: list[str] = []
    for view in unique_jobs(own_views(job, jobs)):
        if not view.is_active:
            continue
        if view.array_task_id is not None and view.array_job_id in submitted:
            if task is None or view.array_task_id == task:
                live.append(view.display_id)
        elif view.array_task_id is None and view.job_id in submitted and task is None:
            live.append(view.job_id)
    return sorted(live)


def cancel_job(
    slurm: Slurm, job: record.JobRecord, env: Optional[Mapping[str, str]] = None
) -> list[str]:
    """Cancel whichever of the dispatch job's Slurm jobs are active (running, pending, held);
    returns their ids.  A user's cancel is never undone: the supervisor then stops the job."""
    live = live_slurm_jobs(slurm, job, env=env)
    slurm.cancel(live, env)
    return live


def next_submission(job: record.JobRecord) -> int:
    return max((int(s["submission"]) for s in job.submissions()), default=0) + 1


def refuse_while_live(
    slurm: Slurm,
    job: record.JobRecord,
    env: Optional[Mapping[str, str]] = None,
    task: Optional[int] = None,
) -> None:
    """A person's resubmission while one of the job's Slurm jobs (of array task ``task``) is
    still active would run beside it on the same root: refuse, saying which and what to do."""
    jobs = slurm.own_jobs(env, sluids=wants_sluids([job]))
    live = live_slurm_jobs(slurm, job, jobs, env, task)
    if live:
        shown = ", ".join(f"{j} ({jobs[j].state})" for j in live)
        raise UsageError(
            f"dispatch job {job.id} still has Slurm job(s) {shown}: a resubmission now would "
            f"run beside it on the same checkpoint root.  Wait for it to end, cancel it "
            f"(scancel {' '.join(live)}), or give --force to submit anyway"
        )


def resubmit(
    slurm: Slurm,
    job: record.JobRecord,
    reason: str = "manual",
    extra: Optional[list[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    expected: Optional[int] = None,
    claim: Optional[str] = None,
    hold: Optional[dict[str, Any]] = None,
    task: Optional[int] = None,
) -> SubmissionMade:
    """Submit the snapshot again as submission N+1 (claimed once, never doubled).

    ``expected`` refuses to submit unless N+1 is that number (a supervisor acting on what it
    saw); ``claim`` names a claim the caller already holds for it; ``hold`` is the hold
    intent (:class:`events.HoldIntent` fields) a held submission is recorded with.  ``task``
    resubmits one array task on its own (``--array=<task>``), numbered in its own lineage.
    """
    if task is None:
        submission = next_submission(job)
    else:
        submission = job.history().lineage(task).next_submission
    if expected is not None and submission != expected:
        raise RecordError(f"{job.id}: submission {expected} was already made")
    if submission > 999_999:
        raise UsageError(f"{job.id} has made 999,999 submissions; no epoch is left for another")
    cwd = job.spec["cwd"]
    if not os.path.isdir(cwd):  # checked before claiming, so nothing is left half-made
        raise UsageError(
            f"the submission directory {cwd!r} is gone; sbatch would take the "
            "job's working directory from it"
        )
    from ..errors import RefusedError
    from .interpreter import problem

    why = problem(job)  # it would fail at once, after taking a submission number
    if why is not None:
        raise RefusedError(f"not resubmitted: {why}")
    if claim is None and not job.claim(claim_name(submission, task)):
        found = slurm.find_by_marker(marker(job, submission, task), env)
        if found:
            job.append(
                "submitted",
                once=once_key(submission, task),
                submission=submission,
                slurm_job_id=found,
                reason=reason,
                argv=[],
                recovered=True,
                task=task,
            )
            raise RecordError(
                f"{job.id}: submission {submission} had already been made "
                f"(Slurm job {found}); recorded it"
            )
        raise RecordError(
            f"{job.id}: submission {submission} is being made by another "
            "process (its claim exists but no submission is recorded yet)"
        )
    try:
        return _submit(slurm, job, submission, reason, extra, env, hold, task)
    except SlurmError as exc:
        job.append("submit-failed", submission=submission, error=str(exc), task=task)
        raise
