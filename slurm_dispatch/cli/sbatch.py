"""``dispatch-sbatch``: sbatch, plus an identity for every execution.

Not a click command: sbatch's grammar (clustered short options, abbreviations, a script
followed by its own arguments) passes through untouched, so this reads argv itself.
"""

from __future__ import annotations

import sys

from ..control import record, submit
from ..errors import SlurmError
from ..slurm.adapter import Slurm
from .shell import run

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Optional

HELP = """\
Usage: dispatch-sbatch [dispatch options] [sbatch options] script [args...]

Submit a batch script through sbatch so that every execution of it (first run, Slurm
requeues, resubmissions) gets its own identity and its own checkpoint folder:

  DISPATCH_EPOCH     G*10^12 + N*10^6 + R (generation, submission, Slurm restart count)
  DISPATCH_ATTEMPT   an opaque token, new for every execution
  DISPATCH_EXEC_DIR  <checkpoint>/exec/<attempt>/, created for you: write saves here
  DISPATCH_RESUME_FROM  the latest published save when the execution started, or empty
  (also DISPATCH_JOB, DISPATCH_GENERATION, DISPATCH_SUBMISSION, DISPATCH_CHECKPOINT)

Publish a complete save with `dispatch publish --step S PATH`; resume with `dispatch latest`.

Dispatch options (also as `#DISPATCH` lines in the script's header, like `#SBATCH`;
the command line wins):
  --checkpoint DIR      the checkpoint root (required), the same for every submission: a
                        folder, s3://bucket/prefix or az://container/prefix (each needs
                        its extra: 's3' or 'azure');
                        %a expands to the array task id (one root per task: an array of
                        several tasks must have it, a job without --array must not)
  --resubmit N          resubmit up to N times after failure, timeout or out-of-memory
                        (carried out by `dispatch supervise`, which must be running)
  --shared-checkpoint   the job shares one mutable checkpoint: no Slurm requeue, each
                        restart becomes a hold until its processes are proven gone
  --supersede JOB       replace dispatch job JOB: generation G+1, same root, JOB cancelled
  --warn-before TIME[:SIGNAL]
                        signal the job script TIME (seconds or MM:SS, less than --time)
                        before its time limit, USR1 unless named, so it can save first
                        (sets sbatch's --signal=B:SIGNAL@TIME)
  --max-no-progress N   stop restarting after N executions in a row that published
                        nothing past the save they resumed from (default 3; 0: never):
                        Slurm's requeued job is held (where it starts before a pass,
                        at its start, before the script), an ended one not resubmitted
  --quarantine-after N  quarantine a save after N executions in a row resumed from it and
                        failed before publishing anything (default 2; 0: never): the
                        next execution resumes from the publication below it
  --stop-on-exit CODES  never restart after the script exits with one of CODES (3,5-7)
  --restart-on-exit CODES
                        restart after one of CODES without spending the --resubmit budget
                        (default for both: none)
  --max-requeues N      past N of Slurm's requeues (node failure, preemption), hold the
                        requeued job for a person (where it starts before a pass, at its
                        start, before the script); apart from --resubmit (default: none)
  --avoid-bad-nodes N   keep a node off the job's next submission and requeued job once N
                        of its executions failed there, or one ended NODE_FAIL; never so
                        many that the job cannot run (default: the site's AvoidBadNodes, 0
                        unless it sets one: never)
  --stall-timeout TIME  ask the job to save (its --warn-before signal, USR1 without one)
                        and end it, a failure, when its progress stops for TIME (seconds
                        or [HH:]MM:SS) outside a save, counted from its first progress
                        record (default: the site's StallTimeout, off unless it sets one)
  --plan                print the plan (rules, holds) and submit nothing
  -h, --help            print this help;  -V, --version  print the version

Every other sbatch option and #SBATCH directive works as with sbatch (see `sbatch
--help`), read as Slurm 22.05 to 26.05 read them; one dispatch-sbatch does not know (a
SPANK plugin's) reaches sbatch as it is, with a value only as --option=VALUE; except:
  --wrap                refused: every resubmission runs the snapshot of a script taken at
                        the first; put the command in a script
  --signal              refused with --warn-before (which sets it)
  --requeue             refused with --shared-checkpoint (Slurm must not restart it)
  --dependency          in #SBATCH lines, naming a dispatch job is refused (give it on the
                        command line, where it becomes the job's current submission)
  --array               of several tasks, refused on a root without %a
The job name defaults to the script's name.  Prints sbatch's own line, then the dispatch
job id (on stderr with --parsable, so stdout stays exactly what sbatch prints).

Example:
  dispatch-sbatch --checkpoint /scratch/$USER/run1 -N 2 --time=4:00:00 train.sh --lr 3e-4
"""


def version() -> str:
    """The installed package's version, as ``dispatch --version`` reads it."""
    from importlib import metadata

    try:
        return metadata.version("slurm-dispatch")
    except metadata.PackageNotFoundError:  # a checkout run without installing
        from .. import __version__

        return __version__


def entry() -> None:
    """The console script ``dispatch-sbatch``: :func:`main`, ending the process without the
    interpreter's teardown once its output is flushed (start-up speed)."""
    main(fast_exit=True)


def main(argv: Optional[list[str]] = None, fast_exit: bool = False) -> None:
    """Ends the process through the shell (sbatch's own refusal ends with sbatch's exit
    code)."""
    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> None:
        script_seen = False
        for word in args:
            if not word.startswith("-"):
                script_seen = True
            if not script_seen and word in ("-h", "--help"):
                sys.stdout.write(HELP)
                return
            if not script_seen and word in ("-V", "--version"):
                sys.stdout.write(f"dispatch-sbatch, version {version()}\n")
                return
        request = submit.read_request(args)
        for warning in request.warnings:
            sys.stderr.write(f"dispatch-sbatch: warning: {warning}\n")
        if "test-only" in request.long_names:
            checked = submit.test_only(request, Slurm())  # sbatch's own check, as it prints it
            sys.stdout.write(checked.stdout)
            sys.stderr.write(checked.stderr)
            sys.exit(checked.returncode)
        if request.options.plan:
            from ..control.plan import describe  # the plan is printed, nothing submitted

            sys.stdout.write(describe(request))
            return
        try:
            done = submit.submit_new(request, Slurm())
        except SlurmError as exc:
            if exc.argv and exc.argv[0] == "sbatch" and exc.returncode:
                # sbatch's own refusal: its words and its exit code, as plain sbatch gives.
                sys.stderr.write(exc.output.rstrip("\n") + "\n")
                sys.exit(exc.returncode)
            raise
        out = done.result.stdout
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
        if done.result.stderr:
            sys.stderr.write(done.result.stderr)
        spec = done.job.spec
        line = (
            f"Dispatch job {done.job.id} (generation {spec['generation']}, submission "
            f"{done.submission}, checkpoint {spec['checkpoint']})\n"
        )
        (sys.stderr if request.parsable else sys.stdout).write(line)
        sys.stdout.flush()
        unsupervised = _no_supervisor(request, done.job)
        if unsupervised:
            sys.stderr.write(f"dispatch-sbatch: warning: {unsupervised}\n")

    run(body, "dispatch-sbatch", fast_exit=fast_exit)


def _no_supervisor(request: submit.Request, job: record.JobRecord) -> Optional[str]:
    """--resubmit and --shared-checkpoint act only through `dispatch supervise`: say so when no
    supervisor of this user has passed lately (its heartbeat in the dispatch home)."""
    used = ([f"--resubmit {request.options.resubmit}"] if request.options.resubmit else []) + (
        ["--shared-checkpoint"] if request.options.shared_checkpoint else []
    )
    if not used:
        return None
    import os

    from ..control.heartbeat import missing_warning

    cluster = job.spec.get("cluster")
    return missing_warning(
        os.path.dirname(os.path.dirname(job.path)),
        cluster if isinstance(cluster, str) else None,
        used,
    )


if __name__ == "__main__":  # pragma: no cover
    entry()
