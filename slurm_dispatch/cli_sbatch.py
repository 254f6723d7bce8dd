"""``dispatch-sbatch``: sbatch, plus an identity for every execution.

Not a click command: sbatch's grammar (clustered short options, abbreviations, a script
followed by its own arguments) passes through untouched, so this reads argv itself.
"""

from __future__ import annotations

import sys

from . import submit
from .cli_exit import run
from .errors import SlurmError
from .slurm import Slurm

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

Dispatch options (also as `#DISPATCH` lines in the script's header, like `#SBATCH`):
  --checkpoint DIR      the checkpoint root (required), the same for every submission;
                        %a expands to the array task id (one root per task)
  --resubmit N          resubmit up to N times after failures (applied by `dispatch supervise`)
  --shared-checkpoint   the job shares one mutable checkpoint: recovery becomes a hold
  --supersede JOB       replace dispatch job JOB: generation G+1, same root, JOB cancelled
  --plan                print the plan (rules, holds) and submit nothing

Every sbatch option and #SBATCH directive works as with sbatch (see `sbatch --help`).
The job name defaults to the script's name.  Prints sbatch's own line, then the dispatch
job id (on stderr with --parsable, so stdout stays exactly what sbatch prints).

Example:
  dispatch-sbatch --checkpoint /scratch/$USER/run1 -N 2 --time=4:00:00 train.sh --lr 3e-4
"""


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
        request = submit.read_request(args)
        for warning in request.warnings:
            sys.stderr.write(f"dispatch-sbatch: warning: {warning}\n")
        if "test-only" in request.long_names:
            checked = submit.test_only(request, Slurm())  # sbatch's own check, as it prints it
            sys.stdout.write(checked.stdout)
            sys.stderr.write(checked.stderr)
            sys.exit(checked.returncode)
        if request.options.plan:
            from .plan import describe  # the plan is printed, nothing submitted
            sys.stdout.write(describe(request))
            return
        try:
            done = submit.submit_new(request, Slurm())
        except SlurmError as exc:
            if exc.argv[:1] == ["sbatch"] and exc.returncode:
                # sbatch's own refusal: its words and its exit code, as plain sbatch gives.
                sys.stderr.write(exc.output.rstrip("\n") + "\n")
                sys.exit(exc.returncode)
            raise
        out = done.result.stdout
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
        if done.result.stderr:
            sys.stderr.write(done.result.stderr)
        spec = done.job.spec
        line = (f"Dispatch job {done.job.id} (generation {spec['generation']}, submission "
                f"{done.submission}, checkpoint {spec['checkpoint']})\n")
        (sys.stderr if request.parsable else sys.stdout).write(line)
        sys.stdout.flush()

    run(body, "dispatch-sbatch", fast_exit=fast_exit)


if __name__ == "__main__":  # pragma: no cover
    entry()
