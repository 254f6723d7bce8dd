"""The launcher: gives one execution its identity, then execs the user's script.

It runs at the start of every execution, inside the batch step, as the job's user, because
the restart count R is known only then (``SLURM_RESTART_COUNT``; unset means 0).  It sets the
environment contract (``DISPATCH_JOB``, ``DISPATCH_GENERATION``, ``DISPATCH_SUBMISSION``,
``DISPATCH_EPOCH``, ``DISPATCH_ATTEMPT``, ``DISPATCH_CHECKPOINT``, ``DISPATCH_EXEC_DIR``,
``DISPATCH_RESUME_FROM``; ``DISPATCH_LOCAL_DIR``, a local writable folder: the execution's
folder, or on an ``s3://`` root its staging folder ``DISPATCH_STAGE_DIR``), creates the
execution's own folder, records the start, and replaces itself with the script so Slurm's
signals reach the script directly.  A job with a stall timeout (``--stall-timeout``) gets a
watcher first, forked beside the script (:mod:`.stall`): it ends the execution once its
progress record stops for that long.  ``srun`` steps inherit the environment, so every task on
every node sees the same identity.

Invariant: a fresh attempt token and a fresh ``exec/<attempt>/`` folder for every execution;
the folder is created with ``mkdir`` (never reused), and before the script runs it holds the
execution's record ``.dispatch`` (:data:`EXEC_RECORD`): JSON, created once (``O_CREAT|O_EXCL``),
read-only, synced with its folder, never rewritten (on S3 it is copied, create-once, to
``exec/<attempt>/.dispatch`` in the store).  Cleanup reads it to learn which saves an
execution may still need (its resume source); the launcher checks, once its record exists,
that its source is still published, and starts again in a fresh folder when cleanup removed
it meanwhile.  The source is the latest publication whose save is not quarantined: one passed
over is said after the execution's header line, and named in its record.  Any failure stops
the execution with exit 2 rather than letting it run without an identity or its record.

An isolated job's requeued execution whose record already gives a stop (``--max-requeues``
spent, ``--max-no-progress`` reached: Slurm started the job again before a supervisor pass could
hold it pending) does not run its script: :mod:`.gate` records the supervisor's stop, requeues
the execution held and stops with exit 2.

A shared-checkpoint job's submission (of one array task) runs its script once: its first
execution claims it in the job's record, created once, and any later one (Slurm running the job
again behind dispatch) stops with exit 2 before the script (:func:`claim_shared`).  A start of
the submission already recorded counts as the claim held (an execution of the release before
the claim recorded its start and no claim).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any, Optional

from .. import _clock, _fsio, config
from ..checkpoint import execdir, model, quarantine, roots
from ..checkpoint import publish as store
from ..control import record
from ..errors import DispatchError, RecordError, StoreError, UsageError
from . import contract, gate, stall

CONTRACT = contract.VARIABLES
EXEC_RECORD = execdir.RECORD  # in exec/<attempt>/; a leading dot keeps it out of save patterns
EXEC_RECORD_FORMAT = execdir.RECORD_FORMAT
START_TRIES = 5  # fresh folders tried when cleanup removes the resume source meanwhile


def restart_count(env: dict[str, str]) -> int:
    raw = env.get("SLURM_RESTART_COUNT", "")
    if raw == "":
        return 0
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"SLURM_RESTART_COUNT {raw!r} is not an integer") from None


def identity(
    job: record.JobRecord, submission: int, env: dict[str, str], said: Optional[list[str]] = None
) -> dict[str, str]:
    """Compute and create this execution's identity; returns the variables to set.  The
    save to resume from is the latest publication not quarantined (``quarantine.choose``);
    what was passed over is added to ``said``, for the job's output."""
    spec = job.spec
    epoch = model.Epoch(int(spec["generation"]), submission, restart_count(env))
    root = roots.expand(spec["checkpoint"], env)
    timeout = store.store_timeout(None, env)
    st = store.open_store(root, timeout)
    for _ in range(START_TRIES):
        attempt = model.new_attempt()
        stage: dict[str, str] = {}
        if store.is_remote_root(root):
            # The execution's prefix needs no creating; frameworks that write only to local
            # disk get a fresh local folder (its record is kept there, and copied to S3).
            exec_dir = st.exec_dir(attempt)
            record_dir = stage["DISPATCH_STAGE_DIR"] = make_stage_dir(attempt, env)
        else:
            exec_parent = os.path.join(root, store.EXEC)
            exec_dir = record_dir = os.path.join(exec_parent, attempt)
            try:
                os.makedirs(exec_parent, exist_ok=True)
                os.mkdir(exec_dir, 0o755)
            except OSError as exc:
                raise RecordError(
                    f"cannot create the execution folder {exec_dir!r}: {exc.strerror}"
                ) from None
        found, passed = quarantine.choose(st)
        try:
            path = write_exec_record(
                record_dir,
                {
                    "job": job.id,
                    "generation": epoch.generation,
                    "submission": epoch.submission,
                    "restart": epoch.restart,
                    "epoch": epoch.value,
                    "attempt": attempt,
                    "resume_from": found.path if found else None,
                    "resume_publication": found.name if found else None,
                    **({"passed_over_quarantined": [f.path for f in passed]} if passed else {}),
                    "slurm_job_id": env.get("SLURM_JOB_ID", ""),
                    "node": env.get("SLURMD_NODENAME", "") or socket.gethostname(),
                },
            )
        except RecordError:
            os.rmdir(record_dir)  # empty again: no execution folder without its record
            raise
        if store.is_remote_root(root):  # cleanup (gc) reads it in the execution's prefix
            with open(path, "rb") as handle:
                st.create_exec_file(attempt, EXEC_RECORD, handle.read())
        # Cleanup removes a publication before its save, then reads the records it had not
        # seen and spares their sources: a source still published now that our record exists
        # is one it spares.  One removed meanwhile: start again in a fresh folder.
        if found is None or st.has_publication(found.name):
            break
        st.remove_exec(attempt, EXEC_RECORD)
        if stage:
            os.unlink(path)
            os.rmdir(record_dir)
    else:
        raise StoreError(
            f"the resume source in {root!r} was removed by cleanup (dispatch gc) "
            f"while this execution started, {START_TRIES} times running"
        )
    if passed and said is not None:
        said.append(quarantine.passed_text(passed))
    return {
        "DISPATCH_JOB": job.id,
        "DISPATCH_GENERATION": str(epoch.generation),
        "DISPATCH_SUBMISSION": str(epoch.submission),
        "DISPATCH_EPOCH": str(epoch.value),
        "DISPATCH_ATTEMPT": attempt,
        "DISPATCH_CHECKPOINT": root,
        "DISPATCH_EXEC_DIR": exec_dir,
        "DISPATCH_RESUME_FROM": found.path if found else "",
        # Always a local, writable folder of this execution's own: a shell trainer writes
        # its saves there on either kind of root (`dispatch watch` publishes them).
        "DISPATCH_LOCAL_DIR": stage.get("DISPATCH_STAGE_DIR", exec_dir),
        **stage,
    }


def make_stage_dir(attempt: str, env: dict[str, str]) -> str:
    """A fresh local folder for an S3 root's execution: under StageDir (dispatch.conf), else
    ``$TMPDIR`` (node-local scratch on most sites), else /tmp; made with mkdir, never reused."""
    base = config.load(environ=env).stage_dir or env.get("TMPDIR") or "/tmp"
    folder = os.path.join(base, f"dispatch-stage-{attempt}")
    os.mkdir(folder, 0o700)
    return folder


def write_exec_record(exec_dir: str, fields: dict[str, Any]) -> str:
    """Create ``exec_dir/.dispatch`` once with ``fields``, the format version and the start
    time; sync it and its folder.  An existing record is never replaced (FileExistsError)."""
    now_ns = time.time_ns()
    data = {"format": EXEC_RECORD_FORMAT, **fields, "time": round(now_ns / 1e9, 3), "ns": now_ns}
    path = os.path.join(exec_dir, EXEC_RECORD)
    try:
        _fsio.write_new(path, (json.dumps(data, sort_keys=True) + "\n").encode(), 0o444)
        _fsio.fsync_dir(exec_dir)  # the record's name is durable too, not only its bytes
    except FileExistsError:
        raise
    except OSError as exc:  # a full disk, most often: say where, and what was written
        raise RecordError(f"cannot write the execution record {path!r}: {exc.strerror}") from None
    return path


def read_exec_record(exec_dir: str) -> dict[str, Any]:
    """An execution's record, checked for its format; a missing or garbled one is a
    RecordError naming its path."""
    path = os.path.join(exec_dir, EXEC_RECORD)
    data = record.read_json(path)
    if not isinstance(data, dict) or data.get("format") != EXEC_RECORD_FORMAT:
        raise RecordError(f"{path!r} is not an execution record of format {EXEC_RECORD_FORMAT}")
    return data


def export_to_steps(env: dict[str, str]) -> None:
    """Make srun steps carry the contract also when the job was submitted --export=NONE.

    With ``--export=NONE`` Slurm sets SLURM_EXPORT_ENV=NONE in the job, and srun then passes
    only SLURM_* variables to tasks; naming our variables keeps that behaviour and adds ours.
    """
    current = env.get("SLURM_EXPORT_ENV", "")
    words = [w for w in current.split(",") if w]
    if not words or "ALL" in (w.upper() for w in words):
        return
    kept = [w for w in words if w.upper() != "NONE"]
    env["SLURM_EXPORT_ENV"] = ",".join(kept + [n for n in CONTRACT if n not in kept])


def prepend_own_bin(env: dict[str, str]) -> None:
    """Put the dispatch commands this launcher was installed with first on PATH."""
    own = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(own, "dispatch")):
        parts = [p for p in env.get("PATH", "").split(":") if p]
        if own not in parts:
            env["PATH"] = ":".join([own] + parts) if parts else own + ":/usr/bin:/bin"


def execution_sluid(env: dict[str, str]) -> dict[str, str]:
    """``{"sluid": ...}`` where Slurm gives the execution a SLUID (``SLURM_JOB_SLUID``, 26.05)
    of plain letters and digits, as the hooks record it; else nothing."""
    value = env.get("SLURM_JOB_SLUID", "")
    if 0 < len(value) <= 64 and value.isascii() and value.isalnum():
        return {"sluid": value}
    return {}


def launch(
    job_path: str,
    submission: int,
    script_args: list[str],
    env: Optional[dict[str, str]] = None,
    slurm: Any = None,
) -> None:
    env = dict(os.environ if env is None else env)
    job = record.JobRecord(job_path)
    if job.spec.get("shared_checkpoint"):
        claim_shared(job, submission, env)
    else:  # a requeued execution the record stops (a spent budget) ends here: gate's
        gate.check(
            job,
            submission,
            restart_count(env),
            _task(env),
            env,
            execution_sluid(env).get("sluid") or gate.display_id(env, _task(env)),
            slurm,
        )
    said: list[str] = []
    values = identity(job, submission, env, said)
    env.update(values)
    export_to_steps(env)
    prepend_own_bin(env)
    job.append(
        "started",
        submission=submission,
        slurm_job_id=env.get("SLURM_JOB_ID", ""),
        array_job_id=env.get("SLURM_ARRAY_JOB_ID", ""),
        array_task_id=env.get("SLURM_ARRAY_TASK_ID", ""),
        restart=restart_count(env),
        attempt=values["DISPATCH_ATTEMPT"],
        epoch=int(values["DISPATCH_EPOCH"]),
        exec_dir=values["DISPATCH_EXEC_DIR"],
        resume_from=values["DISPATCH_RESUME_FROM"],
        node=env.get("SLURMD_NODENAME", ""),
        nodes=env.get("SLURM_JOB_NODELIST", ""),
        host=socket.gethostname(),
        pid=os.getpid(),
        **execution_sluid(env),
    )
    end_hold_comment(job, submission, env)
    timeout = stall.timeout_of(job.spec)
    if timeout:
        said.append(
            f"stall watch: with no progress for {timeout} s (--stall-timeout), "
            "counted from the first progress record and never inside a save, this "
            "execution is asked to save, then ended"
        )
    sys.stdout.write(header_line(job.id, submission, env, values))
    sys.stdout.writelines(f"==> slurm-dispatch: {line} <==\n" for line in said)
    sys.stdout.flush()
    if timeout:
        start_stall_watch(job, submission, env, values, timeout)
    os.execve(job.script, [job.script, *script_args], env)


def start_stall_watch(
    job: record.JobRecord,
    submission: int,
    env: dict[str, str],
    values: dict[str, str],
    timeout: int,
) -> None:
    """Fork this execution's stall watcher (:mod:`.stall`), which records a stall as a
    ``stalled`` event in the job's record."""

    def recorded(facts: dict[str, Any]) -> None:
        job.append(
            "stalled",
            submission=submission,
            slurm_job_id=env.get("SLURM_JOB_ID", ""),
            attempt=values["DISPATCH_ATTEMPT"],
            seconds=facts["seconds"],
            timeout=facts["timeout"],
            step=facts["step"],
            signal=facts["signal"],
            task=_task(env),
        )

    stall.start(values["DISPATCH_LOCAL_DIR"], timeout, job.spec, recorded)


def _task(env: dict[str, str]) -> Optional[int]:
    raw = env.get("SLURM_ARRAY_TASK_ID", "")
    return int(raw) if raw.isdigit() else None


def claim_shared(job: record.JobRecord, submission: int, env: dict[str, str]) -> None:
    """Let one execution of a shared-checkpoint job's submission run its script, never two.

    A shared job is submitted ``--no-requeue`` and each of its restarts is a held submission of
    its own, so a submission has one execution.  Slurm may still run the job again behind
    dispatch's back: a controller that restarts from a state saved before it launched the job
    (or a backup controller taking over) schedules it anew, on another node, while the first
    launch still runs.  The first execution claims the submission (per task) in the record,
    created once; a later one finds the claim and stops here, before the script, with exit 2:
    its end is then an end of the job like any other (with budget left, a held next
    submission, released once the site's signal proves every execution of the Slurm job
    gone).

    A start of the submission already recorded (by another execution) counts as the claim held:
    an execution of the release before the claim recorded its start and made no claim."""
    from ..control.naming import execution_claim_name

    task = _task(env)
    name = execution_claim_name(submission, task)
    node = env.get("SLURMD_NODENAME", "") or socket.gethostname()
    slurm_id = env.get("SLURM_JOB_ID", "")
    restart = restart_count(env)
    # This execution records its own start only after its claim: any start is another's.
    earlier = job.history().lineage(task).started_for(submission)
    if earlier:
        first = earlier[0]
        raise _refusal(
            job,
            submission,
            task,
            env,
            {
                "node": first.node or first.host,
                "slurm_job_id": first.slurm_job_id,
                "restart": first.restart,
                "time": first.time,
            },
            first.attempt,
        )
    mine = {
        "node": node,
        "host": socket.gethostname(),
        "slurm_job_id": slurm_id,
        "restart": restart,
        "task": task,
    }
    if job.claim(name, mine):
        return
    claims = job.claims(name)
    held = claims[0][1] if claims else {}
    if held.get("pid") == os.getpid() and all(held.get(k) == v for k, v in mine.items()):
        return  # ours: a link that was made though its answer said otherwise (NFS, retried)
    attempt = next(
        (
            s.attempt
            for s in job.history().lineage(task).started_for(submission)
            if s.host == held.get("host") and s.pid == held.get("pid")
        ),
        "",
    )
    raise _refusal(job, submission, task, env, held, attempt)


def _refusal(
    job: record.JobRecord,
    submission: int,
    task: Optional[int],
    env: dict[str, str],
    held: dict[str, Any],
    attempt: str,
) -> SharedRefused:
    """The refusal of a second execution, naming the first (``held``: its claim, or its
    recorded start) and saying what follows."""
    node = env.get("SLURMD_NODENAME", "") or socket.gethostname()
    slurm_id = env.get("SLURM_JOB_ID", "")
    restart = restart_count(env)
    what = f"dispatch job {job.id} submission {submission}" + (
        "" if task is None else f" task {task}"
    )
    when = held.get("time")
    array = env.get("SLURM_ARRAY_JOB_ID", "")

    def shown(own: object) -> str:  # an array task as squeue and the job's output show it
        return f"{array}_{task}" if array and task is not None else str(own or "?")

    first = (
        f"on {held.get('node') or '?'} (Slurm job {shown(held.get('slurm_job_id'))} "
        f"restart {held.get('restart', '?')}"
        + (f", attempt {attempt}" if attempt else ", its start not recorded (yet)")
        + (f", at {_clock.instant(float(when))}" if isinstance(when, (int, float)) else "")
        + ")"
    )
    return SharedRefused(
        f"{what} already started {first}; this is a second execution of it (Slurm job "
        f"{shown(slurm_id)} restart {restart} on {node}), which Slurm started behind dispatch "
        "(a controller that restarted from a state older than the first launch, or a "
        "requeue), and it would write the job's shared checkpoint beside the first.  So it "
        "stops here without running the script.  This end is the job's like any other: with "
        "--resubmit budget left, `dispatch supervise` holds the next submission until the "
        "site's signal (dispatch-cease) proves both gone; with none left, the job stops there "
        f"(`dispatch status {job.id}` shows which)"
    )


class SharedRefused(DispatchError):
    """A second execution of a shared job's submission: it must not run (exit 2)."""


def end_hold_comment(job: record.JobRecord, submission: int, env: dict[str, str]) -> None:
    """A held submission's comment says "held: ..., expires ..." (squeue shows it); once it
    runs, however its hold was lifted (the supervisor, dispatch release, a person's scontrol
    release), the comment says the hold is over, its marker still first.  Best effort: a
    failure is a warning in the job's output, never a reason not to run."""
    slurm_id = env.get("SLURM_JOB_ID", "")
    if not job.spec.get("shared_checkpoint") or not slurm_id:
        return  # only a shared-checkpoint job is ever submitted held
    from ..control import naming

    task = _task(env)
    own: Optional[int] = None
    claims: list[tuple[str, dict[str, Any]]] = []
    for own in ([task] if task is not None else []) + [None]:  # a task's own, else the job's
        claims = job.claims(naming.claim_name(submission, own))
        if claims:
            break
    if not claims or not claims[-1][1].get("hold"):
        return
    from ..control.holds import started_comment

    text = started_comment(job, submission, own)
    try:
        from ..slurm.adapter import Slurm

        Slurm(attempts=1, timeout=10).set_comment(slurm_id, text)  # a hung controller: 10 s
    except DispatchError as exc:
        sys.stderr.write(
            f"dispatch-launch: warning: the job's comment still says it is held: {exc}\n"
        )


def header_line(job_id: str, submission: int, env: dict[str, str], values: dict[str, str]) -> str:
    """The line that starts each execution's output: with ``--open-mode=append`` (the
    default dispatch-sbatch gives), one output file holds every execution, each headed so."""
    when = _clock.instant()
    resume = values["DISPATCH_RESUME_FROM"] or "nothing (a fresh start)"
    # An array task as Slurm shows it (squeue, sacct, dispatch status): 18_0, not its own 19.
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    slurm_id = f"{array}_{task}" if array and task.isdigit() else env.get("SLURM_JOB_ID", "?")
    return (
        f"==> slurm-dispatch: {when} dispatch job {job_id} submission {submission}, "
        f"Slurm job {slurm_id} restart {restart_count(env)} on "
        f"{env.get('SLURMD_NODENAME', socket.gethostname())}: epoch "
        f"{values['DISPATCH_EPOCH']}, attempt {values['DISPATCH_ATTEMPT']}, resuming "
        f"from {resume} <==\n"
    )


def main(argv: Optional[list[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if "--" not in args:
            raise UsageError(
                "usage: python -m slurm_dispatch.launch --job PATH --submission N -- [script args]"
            )
        split = args.index("--")
        head, script_args = args[:split], args[split + 1 :]
        opts = dict(zip(head[::2], head[1::2]))
        if set(opts) != {"--job", "--submission"} or len(head) != 4:
            raise UsageError(f"launcher options {head!r} are not --job PATH --submission N")
        launch(opts["--job"], int(opts["--submission"]), script_args)
    except (DispatchError, OSError, ValueError) as exc:
        sys.stderr.write(f"dispatch-launch: {exc}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
