"""The Python API for training scripts: what ``dispatch publish|latest|list`` and the
execution's environment give, without shelling out.

::

    from slurm_dispatch import api

    run = api.execution()            # None outside a dispatch execution
    resume = api.resume_from()       # the save to resume from, or None
    ...                              # train; write each save under run.exec_dir
    api.publish(save_path, step)     # now the next execution can see it

and in the training loop, for a job submitted with ``--stall-timeout`` (cheap: at most one
small write every few seconds)::

    for step in range(start, steps):
        train_one(step)
        api.progress(step)           # the launcher's stall watcher sees the step
        if step % 100 == 0:
            with api.saving(step):   # time inside a save is never taken for a stall
                save(step)

and for the process that submits (a sweep: hundreds of jobs from one interpreter)::

    for lr in (1e-4, 3e-4, 1e-3):
        job = api.submit("train.sh", "-N", "2", "--time=4:00:00", args=["--lr", str(lr)],
                         checkpoint=f"/scratch/me/lr{lr}", resubmit=3)
        print(job.job, job.slurm_job_id)

Every function takes its root and epoch from the execution's environment (the contract the
launcher sets: ``DISPATCH_CHECKPOINT``, ``DISPATCH_EPOCH``, ...) unless given, and raises the
package's errors (:mod:`slurm_dispatch.errors`): an existing publication is
:class:`~slurm_dispatch.errors.AlreadyPublished` (a ``FileExistsError``), a path outside the
root :class:`~slurm_dispatch.errors.OutsideRoot`, an unreadable store a
:class:`~slurm_dispatch.errors.StoreError`; :func:`submit` raises what ``dispatch-sbatch``
reports (bad input a :class:`~slurm_dispatch.errors.UsageError`, sbatch's refusal a
:class:`~slurm_dispatch.errors.SlurmError` with sbatch's words and exit code).  It imports no
training library and no click.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, ContextManager, Iterable, Mapping, Optional, Sequence, Union

from .checkpoint import publish as store
from .errors import UsageError
from .execution import contract, steps
from .execution.contract import Execution  # the public path of the identity is this one

if TYPE_CHECKING:
    from .slurm.adapter import Slurm

__all__ = [
    "Execution",
    "Publication",
    "Submission",
    "execution",
    "latest",
    "list_publications",
    "progress",
    "progress_ended",
    "publish",
    "resume_from",
    "saving",
    "submit",
]

Publication = store.Found  # epoch, step, path (absolute), name; .as_json()


def execution(environ: Optional[Mapping[str, str]] = None) -> Optional[Execution]:
    """This execution's identity, or None outside a dispatch execution (no DISPATCH_JOB).

    A partial or garbled contract (some variables missing, a number that is not one) is a
    :class:`UsageError` naming the variable: a script must not guess its epoch.
    """
    found = contract.Contract.read(environ)
    if not found.job:
        return None
    missing = found.missing(contract.IDENTITY)
    if missing:
        raise UsageError(
            f"a dispatch execution's environment lacks {', '.join(missing)} "
            "(was the script started by the dispatch launcher?)"
        )
    try:
        return Execution(
            job=found.job,
            generation=found.number("generation"),
            submission=found.number("submission"),
            epoch=found.number("epoch"),
            attempt=found.text("attempt"),
            checkpoint=found.text("checkpoint"),
            exec_dir=found.text("exec_dir"),
            resume_from=found.resume_from or None,
        )
    except contract.NotANumber as exc:
        raise UsageError(f"${exc}") from None


def _root(root: Optional[str]) -> str:
    value = root or contract.Contract.read().checkpoint
    if not value:
        raise UsageError(
            "no checkpoint root: pass root=... or run inside a dispatch execution "
            "($DISPATCH_CHECKPOINT)"
        )
    return value


def publish(
    path: str, step: int, *, root: Optional[str] = None, epoch: Optional[int] = None
) -> str:
    """Make the complete save at ``path`` visible; returns the publication's name.

    ``path`` must lie inside the root (under this execution's ``exec_dir``); ``root`` and
    ``epoch`` default to this execution's.  Durable when it returns (the publication and its
    folders are synced; the save's own files are as durable as the script made them).
    """
    if epoch is None:
        found = contract.Contract.read()
        if not found.epoch:
            raise UsageError(
                "no epoch: pass epoch=... or run inside a dispatch execution ($DISPATCH_EPOCH)"
            )
        try:
            epoch = found.number("epoch")
        except contract.NotANumber as exc:
            raise UsageError(f"${exc}") from None
    return store.publish(_root(root), epoch, step, path)


def latest(root: Optional[str] = None) -> Optional[Publication]:
    """The latest publication (greatest epoch, then step) whose save is not quarantined (as
    ``dispatch latest`` and the launcher pass over one), or None when there is none."""
    from .checkpoint import quarantine

    return quarantine.resumable(_root(root))


def list_publications(root: Optional[str] = None) -> list[Publication]:
    """Every publication under the root, oldest first (the latest is last)."""
    return store.list_publications(_root(root))


def resume_from(root: Optional[str] = None) -> Optional[str]:
    """The save to resume from: ``DISPATCH_RESUME_FROM`` (fixed when the execution started),
    else the latest publication's path (:func:`latest`: not a quarantined save's), else None
    (a fresh start)."""
    given = contract.Contract.read()
    if given.resume_from:
        return given.resume_from
    if root is None and not given.checkpoint:
        return None
    found = latest(root)
    return found.path if found is not None else None


def progress(step: int) -> None:
    """Record that the loop reached ``step``, for the stall watcher of a job submitted with
    ``--stall-timeout`` (the clock starts at the first call: a long first step is never a
    stall).  Cheap: remembered, written at most every few seconds, never synced; nothing
    outside an execution.  Call it from one process of the job (rank 0)."""
    found = steps.recorder()
    if found is not None:
        found.step(step)


def progress_ended(step: Optional[int] = None) -> None:
    """Record that the loop ended: what follows (a final evaluation, an export) is never a
    stall, however long; a later :func:`progress` starts the clock again.  Nothing outside an
    execution."""
    found = steps.recorder()
    if found is not None:
        found.ended(step)


def saving(step: Optional[int] = None) -> ContextManager[None]:
    """``with api.saving(step): save(...)``: the time inside the block is a save's, which the
    stall watcher never counts as time without progress; its end counts as progress."""
    found = steps.recorder()
    return found.saving(step) if found is not None else nullcontext()


# --------------------------------------------------------------------------- submitting

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Submission:
    """A dispatch job submitted: what ``dispatch-sbatch`` prints, as a value."""

    job: str  # the dispatch job id (DISPATCH_JOB of its executions; `dispatch status JOB`)
    slurm_job_id: str  # sbatch's job id of this submission (an array's id for an array)
    generation: int  # G: 0, or the superseded job's plus one
    submission: int  # N: 1 for a new job
    epoch: int  # the first execution's epoch, G*10^12 + N*10^6 (R=0; a requeue adds to R)
    checkpoint: str  # the root, absolute (or the s3:// URL)
    record: str  # the job's record folder (spec, script snapshot, events)
    sbatch_output: str  # what sbatch printed on stdout
    warnings: tuple[str, ...] = ()  # what dispatch-sbatch prints as "warning:" lines


def submit(
    script: PathLike,
    *sbatch_args: str,
    args: Sequence[str] = (),
    checkpoint: Optional[PathLike] = None,
    resubmit: Optional[int] = None,
    shared_checkpoint: bool = False,
    warn_before: Union[int, str, None] = None,
    supersede: Optional[str] = None,
    array: Union[str, Iterable[int], None] = None,
    env: Optional[Mapping[str, Optional[str]]] = None,
    cwd: Optional[PathLike] = None,
    slurm: Optional[Slurm] = None,
) -> Submission:
    """Submit ``script`` as ``dispatch-sbatch`` would, from this process; returns its
    :class:`Submission`.

    ``dispatch-sbatch [dispatch options] SBATCH_ARGS... SCRIPT ARGS...`` with its options as
    keywords: ``checkpoint`` (the root, required unless the script's ``#DISPATCH`` lines or
    ``supersede`` give it; ``%a`` for one root per array task), ``resubmit`` (N resubmissions
    after failures, by ``dispatch supervise``), ``shared_checkpoint``, ``warn_before``
    (seconds, or ``"TIME[:SIGNAL]"`` as on the command line), ``supersede`` (a dispatch job
    id).  ``sbatch_args`` are sbatch's own options, word by word as on its command line
    (``"-N", "2", "--time=4:00:00"``); ``array`` is ``--array`` (``"0-15%4"`` or task ids);
    ``args`` are the script's arguments.  ``env`` sets variables for this job over this
    process's environment (``None`` removes one): sbatch sees that environment, and every
    resubmission gets it again.  ``cwd`` is the folder it is submitted from (the script is
    found there, and sbatch runs there), default this process's.  ``slurm`` is the Slurm
    adapter to use (:class:`slurm_dispatch.slurm.adapter.Slurm`); without it, one made at the first
    call is used by every call of the process (give one for another cluster).

    The same checks, record, injected identity and sbatch line as ``dispatch-sbatch`` (one
    code path); bad input raises :class:`UsageError` naming the value before anything is
    written, sbatch's refusal :class:`~slurm_dispatch.errors.SlurmError` (its ``output`` and
    ``returncode`` are sbatch's), and nothing of a refused job is kept.  ``--wrap`` is refused
    as by the command: a job is a script, snapshotted, so every resubmission runs the same
    thing.  Warnings (likely mistakes) are issued with :func:`warnings.warn` and kept in
    :attr:`Submission.warnings`.
    """
    import warnings

    from .checkpoint import model
    from .control import submit as submitting
    from .slurm.adapter import Slurm

    words = _dispatch_words(checkpoint, resubmit, shared_checkpoint, warn_before, supersede)
    sbatch_words = _sbatch_words(sbatch_args, array)
    if isinstance(args, (str, bytes)):
        raise UsageError(
            f"args={args!r} is one string: give the script's arguments as a "
            "list of words (args=['--lr', '3e-4'])"
        )
    script_args = [os.fspath(a) for a in args]
    folder = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
    environment = _environment(env)
    # `--` ends the options: a script named like an option is still the script.
    request = submitting.read_request(
        [*words, *sbatch_words, "--", os.fspath(script)], folder, environment
    )
    request.sbatch.remove("--")
    # Given apart, so never mistaken for options (the command warns of dispatch options
    # after the script: here they are the script's by construction).
    request.script_args = script_args
    if "test-only" in request.long_names:
        raise UsageError(
            "--test-only submits nothing: it asks sbatch when the job would start "
            "(run `dispatch-sbatch --test-only ...` or sbatch's own)"
        )
    for text in request.warnings:
        warnings.warn(text, stacklevel=2)
    if slurm is None:
        if not _ADAPTER:  # one for the process: what it learns once (the cluster) is kept
            _ADAPTER.append(Slurm())
        slurm = _ADAPTER[0]
    done = submitting.submit_new(request, slurm, env=environment)
    spec = done.job.spec
    generation = int(spec["generation"])
    return Submission(
        job=done.job.id,
        slurm_job_id=done.slurm_job_id,
        generation=generation,
        submission=done.submission,
        epoch=model.Epoch(generation, done.submission, 0).value,
        checkpoint=str(spec["checkpoint"]),
        record=done.job.path,
        sbatch_output=done.result.stdout,
        warnings=tuple(request.warnings),
    )


_ADAPTER: list[Slurm] = []


def _dispatch_words(
    checkpoint: Optional[PathLike],
    resubmit: Optional[int],
    shared_checkpoint: bool,
    warn_before: Union[int, str, None],
    supersede: Optional[str],
) -> list[str]:
    """The keywords as dispatch-sbatch's options (checked there, by the command's rules)."""
    words: list[str] = []
    if checkpoint is not None:
        words.append(f"--checkpoint={os.fspath(checkpoint)}")
    if resubmit is not None:
        if isinstance(resubmit, bool) or not isinstance(resubmit, int):
            raise UsageError(
                f"resubmit={resubmit!r} is not an int (the number of resubmissions after failures)"
            )
        words.append(f"--resubmit={resubmit}")
    if not isinstance(shared_checkpoint, bool):
        raise UsageError(f"shared_checkpoint={shared_checkpoint!r} is not a bool")
    if shared_checkpoint:
        words.append("--shared-checkpoint")
    if warn_before is not None:
        if isinstance(warn_before, bool) or not isinstance(warn_before, (int, str)):
            raise UsageError(
                f"warn_before={warn_before!r} is neither seconds (an int) nor 'TIME[:SIGNAL]'"
            )
        words.append(f"--warn-before={warn_before}")
    if supersede is not None:
        words.append(f"--supersede={supersede}")
    return words


def _sbatch_words(given: Sequence[str], array: Union[str, Iterable[int], None]) -> list[str]:
    """sbatch's options as given, refusing dispatch's own among them and anything that is
    not an option (the script and its arguments have their own parameters)."""
    from .control import sbatch_args as grammar

    words = [os.fspath(w) for w in given]
    if "--" in words:
        raise UsageError(
            "'--' among the sbatch options: the script is the first parameter "
            "and its arguments go in args=[...]"
        )
    found, _, index, _ = grammar.parse_options(words, stop_at_script=True)
    if found.given:
        name = sorted(found.given)[0]
        option = "--" + name.replace("_", "-")
        if name == "plan":
            raise UsageError(
                "--plan among the sbatch options: api.submit submits; "
                "`dispatch plan` or `dispatch-sbatch --plan` prints the plan"
            )
        raise UsageError(
            f"{option} among the sbatch options: give it as {name}=... (a keyword of api.submit)"
        )
    if index < len(words):
        raise UsageError(
            f"{words[index]!r} among the sbatch options is not an option: the "
            "script is the first parameter and its arguments go in args=[...]"
        )
    if array is not None:
        if isinstance(array, str):
            value = array
        else:
            tasks = list(array)
            if not tasks or not all(isinstance(t, int) and not isinstance(t, bool) for t in tasks):
                raise UsageError(
                    f"array={tasks!r} names no task: give task ids (ints) or "
                    "sbatch's --array value ('0-15%4')"
                )
            value = ",".join(str(t) for t in tasks)
        words.append(f"--array={value}")
    return words


def _environment(env: Optional[Mapping[str, Optional[str]]]) -> dict[str, str]:
    merged = dict(os.environ)
    for name, value in (env or {}).items():
        if (
            not isinstance(name, str)
            or not name
            or "=" in name
            or not (value is None or isinstance(value, str))
        ):
            raise UsageError(
                f"env={dict(env or {})!r}: give variable names and str values "
                f"(None removes one); {name!r}: {value!r} is not"
            )
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged
