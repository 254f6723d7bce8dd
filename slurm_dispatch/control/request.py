"""A dispatch-sbatch invocation read and checked, before anything is written: the script, its
header, the options (:func:`read_request`, the commands' and the API's one path), and the
refusals that need the whole request (``--warn-before`` past the time limit, an array of
several tasks on one root).  ``dispatch plan`` reads the same request and says what would
happen; :mod:`.submit` submits it."""

from __future__ import annotations

import os
import re

from ..checkpoint import roots
from ..errors import UsageError
from . import dependency, sbatch_args
from .sbatch_words import array_given, option_given, parse_array, time_limit

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Mapping, Optional


class Request:
    """A dispatch-sbatch invocation, read and checked, nothing written yet."""

    __slots__ = (
        "options",
        "sbatch",
        "script_path",
        "script_bytes",
        "script_args",
        "header",
        "long_names",
        "cwd",
        "warnings",
    )

    def __init__(
        self,
        options: sbatch_args.DispatchOptions,
        sbatch: list[str],
        script_path: str,
        script_bytes: bytes,
        script_args: list[str],
        header: sbatch_args.ScriptHeader,
        long_names: set[str],
        cwd: str,
    ) -> None:
        self.options = options
        self.sbatch = sbatch
        self.script_path = script_path
        self.script_bytes = script_bytes
        self.script_args = script_args
        self.header = header
        self.long_names = long_names
        self.cwd = cwd
        self.warnings: list[str] = []  # likely mistakes to tell the user about

    @property
    def parsable(self) -> bool:
        return "parsable" in self.long_names

    @property
    def expedited(self) -> bool:
        """It asks for Slurm's expedited requeue (``--requeue=expedite``, 25.11)."""
        return sbatch_args.expedited_requeue(self.header.sbatch_words + self.sbatch)


def read_request(
    argv: list[str], cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None
) -> Request:
    """Read and check a dispatch-sbatch command line (``dispatch-sbatch``'s and
    :func:`slurm_dispatch.api.submit`'s one path): the script, its header, the options; raises
    :class:`UsageError` naming the bad value, before anything is written.  ``env`` is the
    environment sbatch will be given (default this process's)."""
    cwd = cwd or os.getcwd()
    env = os.environ if env is None else env
    line = sbatch_args.parse_command_line(argv)
    sbatch = list(line.sbatch)
    if "wrap" in line.long_names:
        raise UsageError(
            "--wrap is refused: every resubmission runs the snapshot of a script taken at the "
            "first submission, so put the command in a script (printf '#!/bin/bash\\n%s\\n' "
            "CMD >job.sh).  It is the one sbatch option always refused; --signal with "
            "--warn-before and --requeue with --shared-checkpoint are refused together "
            "(dispatch-sbatch --help lists them)"
        )
    if line.script is None:
        raise UsageError(
            "no batch script given: usage is "
            "dispatch-sbatch [dispatch options] [sbatch options] script [args...]"
        )
    path = os.path.join(cwd, line.script)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        unknown = line.unknown_before_script
        hint = (
            (
                f" (taken for the script because {unknown} before it is an option no sbatch "
                f"release dispatch-sbatch knows takes a value; sbatch reads it so too: give "
                f"{unknown}=VALUE)"
            )
            if unknown
            else ""
        )
        raise UsageError(f"cannot read script {line.script!r}: {exc.strerror}{hint}") from None
    try:
        text = data.decode("utf-8", "surrogateescape")
    except UnicodeDecodeError:  # pragma: no cover - surrogateescape decodes anything
        raise UsageError(f"script {line.script!r} is not text") from None
    header = sbatch_args.read_header(text, line.script)
    options = line.dispatch.merged_over(header.dispatch)
    if options.checkpoint and "checkpoint" not in line.dispatch.given:
        # A #DISPATCH line's root, which no shell read.  The command line's was expanded by the
        # shell already: a '$' left in it was quoted by the user, and stays.
        options.checkpoint = _expand_variables(options.checkpoint, env)
    names = line.long_names | header.long_names
    in_script = dependency.dependency_value(header.sbatch_words)
    if in_script is not None and dependency.named_jobs(in_script[2]):
        raise UsageError(
            f"#SBATCH --dependency={in_script[2]} in {line.script}: a dispatch job "
            "id there would reach sbatch as it is; give --dependency on the "
            "command line, where dispatch-sbatch replaces it by the job's current "
            "submission"
        )
    if options.warn_before and ("signal" in names or env.get("SBATCH_SIGNAL")):
        raise UsageError(
            "--warn-before sets sbatch's --signal; both were given (keep one: "
            "--warn-before TIME[:SIGNAL] signals the job script, --signal as "
            "sbatch defines it)"
        )
    if options.shared_checkpoint and "requeue" in names:
        raise UsageError(
            "--requeue contradicts --shared-checkpoint: a job sharing one mutable "
            "checkpoint is never restarted by Slurm behind dispatch's back (its "
            "restarts become holds; see `dispatch plan`)"
        )
    request = Request(
        options,
        sbatch,
        os.path.abspath(path),
        data,
        line.script_args,
        header,
        line.long_names | header.long_names,
        cwd,
    )
    request.warnings = line.warnings
    return request


# What a job's variable in a root stands for, as a root's pattern (checkpoint/roots.py).
_PATTERN_MEANT = {
    "SLURM_ARRAY_TASK_ID": "write %a, the array task id, for one root per task",
    "SLURM_ARRAY_JOB_ID": "%A (and %j, the job id) would change with every submission, so a "
    "resubmission would not find its saves: a root must not hold them",
}


_PATTERN_MEANT["SLURM_JOB_ID"] = _PATTERN_MEANT["SLURM_JOBID"] = _PATTERN_MEANT[
    "SLURM_ARRAY_JOB_ID"
]


_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expand_variables(root: str, env: Mapping[str, str]) -> str:
    """A ``#DISPATCH`` line's root with ``$NAME`` and ``${NAME}`` from ``env``, the environment
    the job is submitted with (the API's ``env=`` over the caller's), as a shell would have
    done on the command line (no shell reads that line).  A variable that is not set is an
    error naming it, never a folder named ``$USER``; any other ``$`` is refused too, since no
    shell would have left it either, and so is a ``$SLURM_...`` variable, the job's (unset at
    submission, or an outer job's), naming the pattern meant (``%a``).  Expanded once: a value
    holding a ``$`` keeps it.  A command line's root is never expanded again (the shell did)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name.startswith("SLURM_"):
            # The job's own variables are set when it runs, not here (unset, or the outer
            # job's where dispatch-sbatch runs inside one): never the job's value.
            meant = _PATTERN_MEANT.get(name, "")
            raise UsageError(
                f"#DISPATCH --checkpoint {root!r}: ${name} is the job's, set when it runs, not "
                "when dispatch-sbatch reads this line (unset here, or another job's where "
                "dispatch-sbatch runs inside one)" + (f"; {meant}" if meant else "")
            )
        if name not in env:
            raise UsageError(
                f"#DISPATCH --checkpoint {root!r}: ${name} is not set in the "
                "environment the job is submitted with"
            )
        return env[name]

    expanded = _VARIABLE.sub(value, root)
    if "$" in _VARIABLE.sub("", root):
        raise UsageError(
            f"#DISPATCH --checkpoint {root!r}: a '$' that names no variable ($NAME or "
            "${NAME}); a checkpoint root may not hold one"
        )
    if not expanded.strip():
        raise UsageError(
            f"#DISPATCH --checkpoint {root!r} expands to nothing (its variables are "
            "set but empty): a checkpoint root is a folder"
        )
    return expanded


def refuse_warning_past_limit(request: Request, env: Optional[Mapping[str, str]] = None) -> None:
    """Refuse ``--warn-before`` that is not less than the job's time limit: the signal would
    come before the job starts its work, or never (Slurm signals only within the limit).
    The limit is sbatch's ``--time`` (command line, ``SBATCH_TIMELIMIT``, ``#SBATCH``); with
    none given the partition's default applies, which only the controller knows."""
    warn = request.options.warn_before
    if not warn:
        return
    found = option_given(
        request.sbatch,
        os.environ if env is None else env,
        request.header.sbatch_lines,
        os.path.basename(request.script_path),
        "time",
        "t",
        "SBATCH_TIMELIMIT",
    )
    limit = time_limit(found[0]) if found is not None else None
    if found is None or limit is None or warn[1] < limit:
        return
    raise UsageError(
        f"--warn-before {warn[1]} ({warn[1]} s) is not less than {found[1]} ({limit} s): the "
        f"job script would get SIG{warn[0]} as it starts, not before its time limit.  Give "
        "--warn-before less than the limit (the time a save takes, plus a margin)"
    )


def refuse_array_on_one_root(
    request: Request, root: str, env: Optional[Mapping[str, str]] = None
) -> None:
    """Refuse an array of several tasks whose checkpoint root is the same for every task.

    Each task is a lineage of its own, with its own submission numbers, so its epochs mean
    nothing beside another task's: on one root a task resumes from another task's latest save
    and its cleanup removes the other's saves.  ``%a`` makes one root per task.  (``%A`` is the
    same for every task, and ``%j``, a task's own job id, changes when the task is
    resubmitted, so the resubmission would not find its saves: :func:`checkpoint_root`
    refuses both.)  An array of one task is one lineage, on any root.
    """
    found = array_given(
        request.sbatch,
        os.environ if env is None else env,
        request.header.sbatch_lines,
        os.path.basename(request.script_path),
    )
    if found is None and roots.per_task(root):
        given = request.options.checkpoint or root
        raise UsageError(
            f"--checkpoint {given!r} has %a (the array task id) but the job is submitted "
            "without --array: a job that is not an array has no task id.  Give --array, or "
            "remove %a from the root (write %%a for a literal '%a')"
        )
    if found is None or roots.per_task(root):
        return
    tasks = parse_array(found[0])
    if len(tasks) < 2:
        return
    given = request.options.checkpoint or root
    raise UsageError(
        f"--checkpoint {given!r} is one root for all {len(tasks)} tasks of the array "
        f"({found[1]}): each task is a lineage of its own, with its own submission numbers and "
        "epochs, so on one root a task would resume from another task's saves and its cleanup "
        "would remove them.  Put %a (the array task id) in the root for one root per task, "
        f"for example --checkpoint {given.rstrip('/')}/task%a"
    )
