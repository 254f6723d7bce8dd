"""The record's names for a submission, and which Slurm job is which submission.

A submission is found again by the marker ``dispatch:<id>/<N>`` in its job's comment
(:func:`marker`), made at most once by its claim (:func:`claim_name`) and recorded once under
its key (:func:`once_key`).  Job ids start again when slurmctld loses its state, so an id alone
proves nothing: :func:`is_submission` says whether a job Slurm shows under a recorded id is that
submission (its marker, else its SLUID, else times).  Every module that submits, holds, shows
or cancels a dispatch job's Slurm jobs reads these; this module imports none of them.
"""

from __future__ import annotations

from ..slurm.jobs import MARKER_PREFIX, Job
from . import events, record

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Iterable, Mapping, Optional


def marker(job: record.JobRecord, submission: int, task: Optional[int] = None) -> str:
    """The word in a submission's comment that finds it again: ``dispatch:<id>/<N>``, and
    ``dispatch:<id>/<N>-t<task>`` for one array task's own submission."""
    return f"{MARKER_PREFIX}{job.id}/{submission}" + ("" if task is None else f"-t{task}")


# A Slurm job without a marker is a submission's only if Slurm took it no later than this
# after the record says the submission was made (the controller's and this host's clocks).
SUBMIT_SLACK = 60.0


def is_submission(job: record.JobRecord, submitted: events.Submitted, view: Job) -> bool:
    """Whether Slurm's job ``view`` (found under the submission's recorded Slurm job id) is
    that submission of ``job``'s.  Job ids start again when slurmctld loses its state, so an id
    alone proves nothing: a job is the submission's when its comment carries the submission's
    marker; one carrying another marker, or none where the submission's sbatch gave one (a
    plain ``sbatch`` job of the user's), is another job.  A submission made without a marker
    (a comment of the user's own) recorded the job's SLUID where the release gives one
    (26.05): a job Slurm never requeued is the submission only under that SLUID (a requeue
    draws a new one: then, as without a SLUID, times decide).  Else, and for a record from
    before markers, times: a job Slurm took more than SUBMIT_SLACK after the submission was
    recorded is another (unless Slurm requeued it, which moves its submit time)."""
    if submitted.sluid and view.sluid:
        if view.sluid == submitted.sluid:
            return True
        if view.restarts == 0:
            return False
    wanted = marker(job, submitted.submission, submitted.task)
    if wanted in view.markers:
        return True
    if view.markers or made_with_marker(submitted, wanted):
        return False
    if view.submit_time is None or view.restarts > 0:
        return True
    return view.submit_time <= submitted.time + SUBMIT_SLACK


def wants_sluids(jobs: Iterable[record.JobRecord]) -> bool:
    """Some of ``jobs`` gave sbatch a ``--comment`` of the user's own, so its submissions
    carry no marker: a read of Slurm's jobs for them asks for SLUIDs (:func:`is_submission`;
    the release's own, where it has them: the job spec, no call, says it)."""
    return any("comment" in job.spec.get("long_names", ()) for job in jobs)


def own_views(job: record.JobRecord, jobs: Mapping[str, Job]) -> dict[str, Job]:
    """``jobs`` (a read of the user's Slurm jobs, keyed as :func:`index_jobs` keys them) less
    those that are not ``job``'s to show: one carrying another dispatch job's marker, or one
    under a recorded submission's id that is not that submission (:func:`is_submission`)."""
    submitted: dict[str, list[events.Submitted]] = {}
    for sub in job.history().of(events.Submitted):
        submitted.setdefault(sub.slurm_job_id, []).append(sub)
    kept = {}
    for key, view in jobs.items():
        if view.marks_another(job.id):
            continue
        subs = submitted.get(
            view.array_job_id or view.job_id if view.array_task_id is not None else view.job_id
        )
        if subs is not None and not any(is_submission(job, sub, view) for sub in subs):
            continue
        kept[key] = view
    return kept


def accounted_as(submitted: events.Submitted, view: Job, restarted: bool) -> bool:
    """Whether Slurm's accounting's job ``view`` (the newest job of the submission's id, with
    no comment to read a marker in) may be the submission: not when Slurm took it more than
    SUBMIT_SLACK after the submission was recorded, unless the submission was requeued
    (``restarted``: Slurm moves a requeued job's submit time)."""
    if restarted or view.submit_time is None:
        return True
    return view.submit_time <= submitted.time + SUBMIT_SLACK


def made_with_marker(submitted: events.Submitted, wanted: str) -> bool:
    """The submission's recorded sbatch command gave its comment the marker ``wanted``."""
    return any(
        word.startswith("--comment=") and wanted in word.split("=", 1)[1].split()
        for word in submitted.argv
    )


def claim_name(submission: int, task: Optional[int] = None) -> str:
    """The claim made before submission N (of one array task, or of the whole job)."""
    return f"submission-{submission}" + ("" if task is None else f"-t{task}")


def execution_claim_name(submission: int, task: Optional[int] = None) -> str:
    """The claim the one execution of a shared-checkpoint job's submission N (of one array
    task) makes when it starts (the launcher's; a second execution finds it and stops)."""
    return f"execution-{submission}" + ("" if task is None else f"-t{task}")


def once_key(submission: int, task: Optional[int] = None) -> str:
    """The key a submission (and its hold) is recorded under, once."""
    return str(submission) + ("" if task is None else f"-t{task}")
