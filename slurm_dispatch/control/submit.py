"""Submitting dispatch jobs through sbatch: first submissions, resubmissions, supersessions.

Invariants:

* Nothing is recorded before the input is known good (script readable, ``#!`` first line, no
  DOS line breaks, checkpoint root usable, one root per task for an array of several tasks);
  a job whose first ``sbatch`` fails is removed whole.
* Submission N is made at most once: its claim file is created with ``O_EXCL`` before
  ``sbatch`` runs, and the job carries the marker ``dispatch:<id>/<N>`` in its comment so a
  timed-out ``sbatch`` is looked up, not blindly repeated.  A job given the user's own comment
  has no marker: where the release gives SLUIDs (26.05) the submission records its job's,
  read right after ``sbatch``, to tell it from another job under its id (:func:`is_submission`).
* Every submission runs the snapshot taken at the first one, with the same sbatch options, from
  the same working directory.
"""

from __future__ import annotations

import os
import re
import sys
import time

from .. import _fsio
from ..checkpoint import roots
from ..errors import DispatchError, RecordError, SlurmError, UsageError
from ..slurm import arrays
from ..slurm.adapter import Result, Slurm, default_timeout
from ..slurm.cli_backend import sbatch_argv
from ..slurm.jobs import MARKER_PREFIX, Job, unique_jobs
from . import dependency, events, record, sbatch_args

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Optional

class Request:
    """A dispatch-sbatch invocation, read and checked, nothing written yet."""

    __slots__ = ("options", "sbatch", "script_path", "script_bytes", "script_args", "header",
                 "long_names", "cwd", "warnings")

    def __init__(self, options: sbatch_args.DispatchOptions, sbatch: list[str],
                 script_path: str, script_bytes: bytes, script_args: list[str],
                 header: sbatch_args.ScriptHeader, long_names: set[str], cwd: str) -> None:
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


def read_request(argv: list[str], cwd: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None) -> Request:
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
            "(dispatch-sbatch --help lists them)")
    if line.script is None:
        raise UsageError("no batch script given: usage is "
                         "dispatch-sbatch [dispatch options] [sbatch options] script [args...]")
    path = os.path.join(cwd, line.script)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        unknown = line.unknown_before_script
        hint = (f" (taken for the script because {unknown} before it is an option no sbatch "
                f"release dispatch-sbatch knows takes a value; sbatch reads it so too: give "
                f"{unknown}=VALUE)") if unknown else ""
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
        raise UsageError(f"#SBATCH --dependency={in_script[2]} in {line.script}: a dispatch job "
                         "id there would reach sbatch as it is; give --dependency on the "
                         "command line, where dispatch-sbatch replaces it by the job's current "
                         "submission")
    if options.warn_before and ("signal" in names or env.get("SBATCH_SIGNAL")):
        raise UsageError("--warn-before sets sbatch's --signal; both were given (keep one: "
                         "--warn-before TIME[:SIGNAL] signals the job script, --signal as "
                         "sbatch defines it)")
    if options.shared_checkpoint and "requeue" in names:
        raise UsageError("--requeue contradicts --shared-checkpoint: a job sharing one mutable "
                         "checkpoint is never restarted by Slurm behind dispatch's back (its "
                         "restarts become holds; see `dispatch plan`)")
    request = Request(options, sbatch, os.path.abspath(path), data, line.script_args, header,
                      line.long_names | header.long_names, cwd)
    request.warnings = line.warnings
    return request


def checkpoint_root(options: sbatch_args.DispatchOptions, cwd: str) -> str:
    if not options.checkpoint:
        raise UsageError("no checkpoint root: give --checkpoint DIR (or a '#DISPATCH "
                         "--checkpoint DIR' line in the script); every execution writes under "
                         "DIR/exec/<attempt>/ and publishes into DIR/pub/")
    given = options.checkpoint
    control = [c for c in given if _is_control(c)]
    if control:
        raise UsageError(f"--checkpoint {given!r} holds a control character ({control[0]!r}): "
                         "a root's name is printed in tables and logs, one line each")
    roots.refuse_changing(given)
    if ":" in given:  # imported only then: start-up speed
        from ..checkpoint.stores.open import check_root_scheme

        check_root_scheme(given)
    if "://" in given:
        from ..checkpoint.stores import s3

        s3.refuse_without_sdk(quick=True)
        # Checked for shape only: dispatch-sbatch never talks to S3 (boto3 stays off this path).
        return s3.parse_root(given).url
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(given)))


# Bidi controls: a name holding one is shown reversed in part ('Trojan source').
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _is_control(char: str) -> bool:
    """A character a root may not hold: a C0 or C1 control (NEL and CSI are C1), the Unicode
    line and paragraph separators (str.splitlines() splits on both), a bidi control."""
    code = ord(char)
    return code < 0x20 or 0x7f <= code <= 0x9f or code in (0x2028, 0x2029) or char in _BIDI


# What a job's variable in a root stands for, as a root's pattern (checkpoint/roots.py).
_PATTERN_MEANT = {
    "SLURM_ARRAY_TASK_ID": "write %a, the array task id, for one root per task",
    "SLURM_ARRAY_JOB_ID": "%A (and %j, the job id) would change with every submission, so a "
                          "resubmission would not find its saves: a root must not hold them",
}
_PATTERN_MEANT["SLURM_JOB_ID"] = _PATTERN_MEANT["SLURM_JOBID"] = \
    _PATTERN_MEANT["SLURM_ARRAY_JOB_ID"]

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
                "dispatch-sbatch runs inside one)" + (f"; {meant}" if meant else ""))
        if name not in env:
            raise UsageError(f"#DISPATCH --checkpoint {root!r}: ${name} is not set in the "
                             "environment the job is submitted with")
        return env[name]

    expanded = _VARIABLE.sub(value, root)
    if "$" in _VARIABLE.sub("", root):
        raise UsageError(f"#DISPATCH --checkpoint {root!r}: a '$' that names no variable ($NAME or "
                         "${NAME}); a checkpoint root may not hold one")
    if not expanded.strip():
        raise UsageError(f"#DISPATCH --checkpoint {root!r} expands to nothing (its variables are "
                         "set but empty): a checkpoint root is a folder")
    return expanded


def prepare_root(root: str) -> list[str]:
    """Create the root (up to its first %-pattern) and check the user can write it.

    Returns the folders it created, outermost first, so a submission that fails can remove
    them again (:func:`remove_new_folders`): a refused submission leaves nothing behind.
    An ``s3://`` root is no folder: nothing is made and S3 is not asked.
    """
    if root[:5].lower() == "s3://":
        return []
    folder = roots.fixed_folder(root)
    missing: list[str] = []
    probe = folder
    while probe and not os.path.lexists(probe):
        missing.insert(0, probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if probe and os.path.lexists(probe) and not os.path.isdir(probe):  # the deepest that exists
        from ..checkpoint.stores.posix import what_stands  # this path only: start-up speed

        what = "checkpoint root" if probe == folder else f"checkpoint root {folder!r}: its folder"
        raise UsageError(f"{what} {probe!r} is {what_stands(probe) or 'not a folder'}: give a "
                         "folder (it is made if missing)")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        remove_new_folders(missing)
        raise UsageError(f"cannot create checkpoint root {folder!r}: {exc.strerror}") from None
    if not os.path.isdir(folder):
        raise UsageError(f"checkpoint root {folder!r} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        remove_new_folders(missing)
        raise UsageError(f"checkpoint root {folder!r} is not writable by you")
    return missing


def remove_new_folders(created: list[str]) -> None:
    """Remove folders :func:`prepare_root` made, innermost first, each only while empty."""
    for folder in reversed(created):
        try:
            os.rmdir(folder)
        except OSError:
            return  # something was put there meanwhile: keep it and what holds it


def test_only(request: Request, slurm: Slurm) -> Result:
    """``--test-only``: sbatch only checks the job and says when it would start.  Passed
    through as given (the user's own script), nothing recorded and no folder made."""
    argv = sbatch_argv([*request.sbatch, request.script_path, *request.script_args])
    return slurm.runner(argv, dict(os.environ), request.cwd, default_timeout())


def _spec(request: Request, root: str, generation: int, supersedes: Optional[str],
          shared: bool, env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    return {
        "generation": generation,
        "checkpoint": root,
        "resubmit": request.options.resubmit,
        "max_no_progress": request.options.max_no_progress,
        "quarantine_after": request.options.quarantine_after,
        "stop_on_exit": request.options.stop_on_exit,
        "restart_on_exit": request.options.restart_on_exit,
        "max_requeues": request.options.max_requeues,
        "shared_checkpoint": shared,
        # The environment sbatch is given (SBATCH_ARRAY_INX) is the submission's, not ours.
        "array_tasks": array_of(request.sbatch, os.environ if env is None else env,
                                request.header.sbatch_lines,
                                os.path.basename(request.script_path)),
        "warn_before": list(request.options.warn_before) if request.options.warn_before
        else None,
        "supersedes": supersedes,
        "sbatch": request.sbatch,
        "script_args": request.script_args,
        "script_name": os.path.basename(request.script_path),
        "script_path": request.script_path,
        "header": request.header.sbatch_lines,
        "shebang": request.header.shebang,
        "long_names": sorted(request.long_names),
        "cwd": request.cwd,
        "python": (os.environ if env is None else env).get("DISPATCH_PYTHON")
        or sys.executable,
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

    def __init__(self, job: record.JobRecord, submission: int, slurm_job_id: str,
                 result: Result) -> None:
        self.job = job
        self.submission = submission
        self.slurm_job_id = slurm_job_id
        self.result = result


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
        subs = submitted.get(view.array_job_id or view.job_id
                             if view.array_task_id is not None else view.job_id)
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
    return any(word.startswith("--comment=") and wanted in word.split("=", 1)[1].split()
               for word in submitted.argv)


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


def _array_words(words: list[str]) -> tuple[Optional[str], list[str]]:
    """The last ``--array`` (``-a``) value among sbatch words, as sbatch would take it, and
    the words without any array option."""
    return _option_words(words, "array", "a")


def _header_words(header_lines: list[str], script_name: str) -> list[str]:
    """The words of the ``#SBATCH`` lines among a recorded header's lines."""
    words: list[str] = []
    for line in header_lines:
        text = line.lstrip()
        if text.startswith("#SBATCH"):
            words.extend(sbatch_args.directive_words(text[len("#SBATCH"):], script_name, 0))
    return words


def expedited_requeue(job: record.JobRecord) -> bool:
    """The job asked for Slurm's expedited requeue (``--requeue=expedite``, 25.11): its
    command line over its ``#SBATCH`` lines, as sbatch reads them."""
    spec = job.spec
    return sbatch_args.expedited_requeue(
        _header_words(list(spec.get("header", [])), spec["script_name"]) + list(spec["sbatch"]))


def _option_words(words: list[str], long: str, short: str
                  ) -> tuple[Optional[str], list[str]]:
    """The last value of sbatch option ``--long`` (``-short``) among sbatch words, as sbatch
    would take it, and the words without that option."""
    found, rest = None, []
    i = 0
    while i < len(words):
        word, value, taken = words[i], None, 1
        if word.startswith("--") and len(word) > 2:
            name, sep, given = word[2:].partition("=")
            try:
                resolved = sbatch_args.resolve_long(name, "")
            except UsageError:
                resolved = name
            if resolved == long:
                value, taken = (given, 1) if sep else (
                    words[i + 1] if i + 1 < len(words) else "", 2)
        elif word == "-" + short:
            value, taken = (words[i + 1] if i + 1 < len(words) else ""), 2
        elif word.startswith("-" + short) and not word.startswith("--"):
            value = word[2:].lstrip("=")
        if value is None:
            rest.append(word)
        else:
            found = value
        i += taken
    return found, rest


def parse_array(spec: str) -> list[int]:
    """Task ids of a user's ``--array`` value (``0-15:4%2``, ``1,3,5-7``; the grammar is
    :mod:`slurm.arrays`'), ascending; raises UsageError naming the value."""
    try:
        return arrays.task_ids(spec)
    except arrays.ArrayRangeError as exc:
        if exc.too_large:
            raise UsageError(f"--array {spec!r}: a task id above {arrays.MAX_TASK_ID} is beyond "
                             "every Slurm's MaxArraySize (at most 4000001), so sbatch would "
                             "refuse it") from None
        raise UsageError(f"--array {spec!r} is not a list of task ids (like 0-15:4%2 or "
                         "1,3,5-7)") from None


def array_tasks(job: record.JobRecord) -> Optional[list[int]]:
    """The task ids of an array job as its first submission asked for them (the command
    line over ``SBATCH_ARRAY_INX`` of its environment over its ``#SBATCH`` lines); None for
    a job that is not an array.  Recorded in the spec at the first submission (records made
    before that are read from their parts)."""
    spec = job.spec
    if "array_tasks" in spec:
        found = spec["array_tasks"]
        return [int(t) for t in found] if isinstance(found, list) else None
    return array_of(list(spec["sbatch"]), submission_environment(job),
                    list(spec.get("header", [])), spec["script_name"])


def array_of(words: list[str], env: Mapping[str, str], header_lines: list[str],
             script_name: str) -> Optional[list[int]]:
    """The task ids a submission asks for (sbatch ``words`` over ``SBATCH_ARRAY_INX`` in
    ``env`` over the script's ``#SBATCH`` lines), or None when it is not an array."""
    found = _array_given(words, env, header_lines, script_name)
    return parse_array(found[0]) if found is not None else None


def _array_given(words: list[str], env: Mapping[str, str], header_lines: list[str],
                 script_name: str) -> Optional[tuple[str, str]]:
    """The ``--array`` value sbatch would take and where it was given (as the user would
    write it), or None: the command line over ``SBATCH_ARRAY_INX`` over ``#SBATCH`` lines."""
    return _given(words, env, header_lines, script_name, "array", "a", "SBATCH_ARRAY_INX")


def _given(words: list[str], env: Mapping[str, str], header_lines: list[str],
           script_name: str, long: str, short: str, variable: str
           ) -> Optional[tuple[str, str]]:
    """The value of sbatch option ``--long`` sbatch would take and where it was given (as the
    user would write it), or None: the command line over ``$variable`` over ``#SBATCH``."""
    value = _option_words(words, long, short)[0]
    if value is not None:
        spelled = next((w for w in reversed(words) if w == "-" + short), None)
        return value, f"-{short} {value}" if spelled else f"--{long}={value}"
    value = env.get(variable) or None
    if value is not None:
        return value, f"{variable}={value}"
    value = _option_words(_header_words(header_lines, script_name), long, short)[0]
    return (value, f"#SBATCH --{long}={value} in {script_name}") if value is not None \
        else None


def time_limit(value: str) -> Optional[int]:
    """Seconds of an sbatch ``--time`` value (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``); None for no limit (``INFINITE``, ``UNLIMITED``) or a value sbatch judges."""
    text = value.strip()
    try:
        days, dash, rest = text.partition("-")
        if not dash:
            parts = [int(p) for p in text.split(":")]
            scale = {1: [60], 2: [60, 1], 3: [3600, 60, 1]}[len(parts)]
            return sum(p * m for p, m in zip(parts, scale))
        parts = [int(p) for p in rest.split(":")]
        if len(parts) > 3 or any(p < 0 for p in parts):
            return None
        return int(days) * 86400 + sum(p * m for p, m in zip(parts, [3600, 60, 1]))
    except (ValueError, KeyError):
        return None


def refuse_warning_past_limit(request: Request,
                              env: Optional[Mapping[str, str]] = None) -> None:
    """Refuse ``--warn-before`` that is not less than the job's time limit: the signal would
    come before the job starts its work, or never (Slurm signals only within the limit).
    The limit is sbatch's ``--time`` (command line, ``SBATCH_TIMELIMIT``, ``#SBATCH``); with
    none given the partition's default applies, which only the controller knows."""
    warn = request.options.warn_before
    if not warn:
        return
    found = _given(request.sbatch, os.environ if env is None else env,
                   request.header.sbatch_lines, os.path.basename(request.script_path),
                   "time", "t", "SBATCH_TIMELIMIT")
    limit = time_limit(found[0]) if found is not None else None
    if found is None or limit is None or warn[1] < limit:
        return
    raise UsageError(
        f"--warn-before {warn[1]} ({warn[1]} s) is not less than {found[1]} ({limit} s): the "
        f"job script would get SIG{warn[0]} as it starts, not before its time limit.  Give "
        "--warn-before less than the limit (the time a save takes, plus a margin)")


def refuse_array_on_one_root(request: Request, root: str,
                             env: Optional[Mapping[str, str]] = None) -> None:
    """Refuse an array of several tasks whose checkpoint root is the same for every task.

    Each task is a lineage of its own, with its own submission numbers, so its epochs mean
    nothing beside another task's: on one root a task resumes from another task's latest save
    and its cleanup removes the other's saves.  ``%a`` makes one root per task.  (``%A`` is the
    same for every task, and ``%j``, a task's own job id, changes when the task is
    resubmitted, so the resubmission would not find its saves: :func:`checkpoint_root`
    refuses both.)  An array of one task is one lineage, on any root.
    """
    found = _array_given(request.sbatch, os.environ if env is None else env,
                         request.header.sbatch_lines, os.path.basename(request.script_path))
    if found is None and roots.per_task(root):
        given = request.options.checkpoint or root
        raise UsageError(
            f"--checkpoint {given!r} has %a (the array task id) but the job is submitted "
            "without --array: a job that is not an array has no task id.  Give --array, or "
            "remove %a from the root (write %%a for a literal '%a')")
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
        f"for example --checkpoint {given.rstrip('/')}/task%a")


def _sbatch_argv(job: record.JobRecord, submission: int, extra: list[str],
                 env: Mapping[str, str], task: Optional[int] = None,
                 words: Optional[list[str]] = None) -> tuple[list[str], bool]:
    spec = job.spec
    names = set(spec["long_names"])
    words = list(spec["sbatch"]) if words is None else words
    if task is None:
        argv = sbatch_argv([*words, *extra])
    else:
        # One task of the array on its own: the same snapshot and options, --array=<task>
        # (the command line wins over the script's #SBATCH --array and SBATCH_ARRAY_INX).
        argv = sbatch_argv([*_array_words(words)[1], f"--array={task}", *extra])
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
    header = sbatch_args.ScriptHeader(spec["shebang"], spec["header"], [],
                                      sbatch_args.DispatchOptions(), set())
    from .interpreter import recorded  # spec["python"], unless a person chose another
    text = sbatch_args.render_batch_script(header=header, python=recorded(job),
                                           job_path=job.path, submission=submission)
    path = job.batch_script(submission, task)
    try:
        with open(path, "x", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
    except FileExistsError:
        pass  # a pass that died after writing it; the content is the same
    except OSError as exc:
        raise RecordError(f"cannot write {path!r}: {exc.strerror}") from None


def _submit(slurm: Slurm, job: record.JobRecord, submission: int, reason: str,
            extra: Optional[list[str]] = None, env: Optional[Mapping[str, str]] = None,
            hold: Optional[dict[str, Any]] = None, task: Optional[int] = None) -> SubmissionMade:
    _write_batch(job, submission, task)
    run_env = dict(env) if env is not None else submission_environment(job)
    words = list(job.spec["sbatch"])
    named = dependency.dependency_value(words)
    if named is not None and dependency.named_jobs(named[2]):
        # --dependency names dispatch jobs: their current submissions, at each submission.
        words = dependency.resolve(words, os.path.dirname(os.path.dirname(job.path)),
                                   slurm.own_jobs(run_env),
                                   cluster=job.cluster or slurm.cluster(run_env))
    argv, has_marker = _sbatch_argv(job, submission, list(extra or []), run_env, task, words)
    cwd = job.spec["cwd"]
    if has_marker:
        jobid, result = slurm.sbatch(argv, marker(job, submission, task), run_env, cwd)
    else:
        # No marker to look the job up by: one attempt, never a blind second sbatch.
        jobid, result = slurm.sbatch(argv, "", run_env, cwd)
    # Nor to tell the job from another under its id once ids start again: its SLUID does,
    # where the release gives one (a plain job's; an array's tasks each have their own).
    sluid = "" if has_marker or task is not None or _array_words(argv)[0] is not None \
        else slurm.sluid(jobid, run_env)
    job.append("submitted", once=once_key(submission, task), submission=submission,
               slurm_job_id=jobid, reason=reason, argv=argv, hold=hold, task=task,
               **({"sluid": sluid} if sluid else {}))
    return SubmissionMade(job, submission, jobid, result)


ENVIRONMENT = "environment"


def save_environment(job: record.JobRecord, env: Mapping[str, str]) -> None:
    """Keep the environment sbatch saw at the first submission, for every later one.

    sbatch exports it to the job by its ``--export`` rules, so keeping what sbatch was given
    (and giving the same options) gives every submission the job environment of the first.
    Written once, 0600 (it may hold secrets), as ``NAME=value`` entries ended by NUL bytes.
    """
    data = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items()
                    if "=" not in k and "\0" not in k and "\0" not in v)
    path = os.path.join(job.path, ENVIRONMENT)
    try:
        # On a failure the whole new record is removed by its caller (submit_new) anyway.
        _fsio.write_new(path, data, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise RecordError(f"cannot write {path!r}: {exc.strerror}") from None


def submission_environment(job: record.JobRecord) -> dict[str, str]:
    """The environment of the job's first submission (the caller's, for a job recorded before
    environments were kept)."""
    path = os.path.join(job.path, ENVIRONMENT)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return dict(os.environ)
    except OSError as exc:
        raise RecordError(f"cannot read {path!r}: {exc.strerror}") from None
    env = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def submit_new(request: Request, slurm: Slurm, home: Optional[str] = None,
               env: Optional[Mapping[str, str]] = None) -> SubmissionMade:
    """The first submission of a new dispatch job (or of a superseding one).

    A job superseding a shared-checkpoint job shares that checkpoint too, so it is submitted
    held, like any other restart of a shared job, and the old job's Slurm jobs are cancelled
    only once it is: the two generations never run side by side.  The supervisor asks the
    site's CessationSignal about the old execution and releases the hold on a ceased answer.
    """
    old: Optional[record.JobRecord] = None
    generation = 0
    if request.options.supersede:
        # This cluster's job only: another's Slurm jobs cannot be held after nor cancelled here.
        old = record.open_job(request.options.supersede, home, cluster=slurm.cluster(env))
        generation = int(old.spec["generation"]) + 1
        old_root = old.spec["checkpoint"]
        if request.options.checkpoint and checkpoint_root(request.options,
                                                          request.cwd) != old_root:
            raise UsageError(
                f"--checkpoint {request.options.checkpoint!r} differs from {old.id}'s root "
                f"{old_root!r}: a superseding job resumes from the root it supersedes")
        root = old_root
    else:
        root = checkpoint_root(request.options, request.cwd)
    shared = request.options.shared_checkpoint or bool(old and old.spec["shared_checkpoint"])
    refuse_array_on_one_root(request, root, env)
    refuse_warning_past_limit(request, env)
    refuse_shared_root(root, slurm, home, env, allowed=old.id if old else None)
    created = prepare_root(root)
    try:
        # The cluster: records of several clusters may share one home (one $HOME, several
        # clusters), and each cluster's commands act on its own jobs only.
        job = record.create_job({**_spec(request, root, generation, old.id if old else None,
                                         shared, env), "cluster": slurm.cluster(env)},
                                request.script_bytes, home)
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
    intent: Optional[dict[str, Any]] = None
    sbatch_begun = False
    try:
        # The old generation as Slurm sees it, read before sbatch: a held submission's intent
        # (what it waits for) is recorded with its claim, so a kill after sbatch keeps the hold.
        jobs = slurm.own_jobs(env) if old is not None else {}
        held_after = _latest_slurm_id(old) if old is not None and shared else None
        extra: list[str] = []
        if held_after:
            from .events import HoldIntent
            ended = jobs.get(held_after)
            intent = HoldIntent(deadline=round(time.time() + _hold_for(), 3),
                                ended_slurm_job_id=held_after,
                                ended_restart=ended.restarts if ended is not None else 0,
                                end_state="superseded", instead_of="start").as_dict()
            from .holds import hold_comment
            extra = ["--hold", hold_comment(job, 1, None, f"supersedes {old.id if old else '?'} "
                                            f"(Slurm job {held_after})", intent["deadline"])]
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
        job.append(Hold, once="1", submission=1, slurm_job_id=submitted.slurm_job_id,
                   **intent)
    if old is not None:
        live = live_slurm_jobs(slurm, old, jobs)
        slurm.cancel(live, env)
        # A controller that restarts before it saves this cancel may run them again: the
        # supervisor cancels a superseded job's active Slurm jobs again (Supervisor._superseded).
        old.append("superseded", by=job.id, cancelled=live)
    return submitted


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a first submission, with what became of it in one sentence: the record
    is whole either way (removed, or kept with its submission or its claim)."""


NOTHING_SUBMITTED = "interrupted before sbatch ran: nothing was submitted, nothing is recorded"


def interrupted_in_sbatch(slurm: Slurm, job: record.JobRecord,
                          env: Optional[Mapping[str, str]], created: list[str],
                          intent: Optional[dict[str, Any]],
                          old: Optional[record.JobRecord]) -> Interrupted:
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
            job.append("submitted", once="1", submission=1, slurm_job_id=slurm_id,
                       reason="first", argv=[], hold=intent, recovered=True)
            if intent is not None:
                from .events import Hold
                job.append(Hold, once="1", submission=1, slurm_job_id=slurm_id, **intent)
            return Interrupted(
                f"interrupted, but sbatch had submitted it: Slurm job {slurm_id}, dispatch job "
                f"{job.id} (recorded; `scancel {slurm_id}` if it is unwanted){left}")
        record.remove_unsubmitted(job)
        remove_new_folders(created)
        return Interrupted(f"interrupted while sbatch ran; no job of yours carries {wanted}, "
                           "so nothing was submitted and nothing is recorded")
    return Interrupted(
        f"interrupted while sbatch ran: the job may have reached Slurm (it could not be asked). "
        f"See `squeue --me -n {name}` or `dispatch status {job.id}`; the record of dispatch "
        f"job {job.id} is kept with its claim, so `dispatch supervise` records it once Slurm "
        f"shows it{left}")


def _job_name(job: record.JobRecord, env: Optional[Mapping[str, str]]) -> str:
    """The job name sbatch was given (the last --job-name/-J), else the script's name."""
    found = _option_words(list(job.spec["sbatch"]), "job-name", "J")[0]
    return found or (env or os.environ).get("SBATCH_JOB_NAME") or job.spec["script_name"]


# A record this young without a submission is one being submitted (older: one that died).
BEING_SUBMITTED_FOR = 600.0


def refuse_shared_root(root: str, slurm: Slurm, home: Optional[str] = None,
                       env: Optional[Mapping[str, str]] = None,
                       allowed: Optional[str] = None,
                       new: Optional[record.JobRecord] = None) -> None:
    """Refuse ``root`` when another live dispatch job of the caller's uses it.

    Two jobs on one root would publish side by side at the same epochs.  Live: one of its
    Slurm jobs is still active, or it is being submitted (recorded, no submission yet, for
    less than :data:`BEING_SUBMITTED_FOR`).  The records say which jobs use the root (nothing
    is written into the root for this); Slurm is asked only when one does.

    ``new`` is the caller's own job, checked again once recorded: of two submissions that
    both looked before either was recorded, the second to check sees the first and gives way
    (both do when both see the other: never two on one root, without a lock).
    """
    same = [job for job in record.all_jobs(home)
            if job.id not in (allowed, new.id if new else None) and _spec_root(job) == root]
    if not same:
        return
    made: dict[str, list[dict[str, Any]]] = {}
    for other in same:
        try:
            made[other.id] = other.submissions()
            created = other.created
        except DispatchError:
            continue  # being removed (a refused submission), or unreadable: not a live job
        if made[other.id]:
            continue
        age = time.time() - created
        if age < BEING_SUBMITTED_FOR:
            raise UsageError(
                f"checkpoint root {root!r} is being submitted by your dispatch job "
                f"{other.id} (recorded {max(age, 0):.0f} s ago, no Slurm job yet): two jobs on "
                "one root would publish side by side.  Submit jobs on one root one at a "
                "time, or choose another root")
    jobs = slurm.own_jobs(env)
    for other in same:
        for sub in reversed(made.get(other.id, [])):
            info = jobs.get(str(sub["slurm_job_id"]))
            if info is not None and info.is_active:
                raise UsageError(
                    f"checkpoint root {root!r} is in use by your dispatch job {other.id} "
                    f"(Slurm job {info.display_id}, {info.state}): two jobs on one root would "
                    f"publish side by side.  To replace it, submit with --supersede "
                    f"{other.id} (the new generation resumes from its saves); otherwise "
                    "choose another root")


# Each record's root as read by this process: (job.json's identity, root), by record folder.
_ROOTS: dict[str, tuple[tuple[int, int, int, int], Optional[str]]] = {}


def _spec_root(job: record.JobRecord) -> Optional[str]:
    """The job's root.  A record's job.json is written once and never changed (0444), so a
    process that submits many jobs (a sweep through ``api.submit``) reads each once, not once
    per submission: kept by the file's inode, times and size, so a record removed and made
    again under the same id is read again."""
    try:
        info = os.stat(os.path.join(job.path, "job.json"))
    except OSError:
        return None  # gone meanwhile, or unreadable: reported where it is used, not here
    key = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
    known = _ROOTS.get(job.path)
    if known is not None and known[0] == key:
        return known[1]
    try:
        root: Optional[str] = str(job.spec["checkpoint"])
    except (DispatchError, KeyError):
        root = None  # an unreadable record is reported where it is used, not here
    _ROOTS[job.path] = (key, root)
    return root


def _latest_slurm_id(job: record.JobRecord) -> Optional[str]:
    submitted = job.submissions()
    return str(submitted[-1]["slurm_job_id"]) if submitted else None


def _hold_for() -> float:
    from .. import config
    return float(config.load().shared_hold_for)


def live_slurm_jobs(slurm: Slurm, job: record.JobRecord,
                    jobs: Optional[dict[str, Job]] = None,
                    env: Optional[Mapping[str, str]] = None,
                    task: Optional[int] = None) -> list[str]:
    """The job's Slurm jobs still active: plain jobs by id, array tasks by display id (a task
    that started has an id of its own, so an array's id alone says nothing of its tasks).
    With ``task``, only that array task's.  Only a job that is one of the record's
    submissions (:func:`is_submission`: ids start again when slurmctld loses its state, and
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


def cancel_job(slurm: Slurm, job: record.JobRecord,
               env: Optional[Mapping[str, str]] = None) -> list[str]:
    """Cancel whichever of the dispatch job's Slurm jobs are active (running, pending, held);
    returns their ids.  A user's cancel is never undone: the supervisor then stops the job."""
    live = live_slurm_jobs(slurm, job, env=env)
    slurm.cancel(live, env)
    return live


def next_submission(job: record.JobRecord) -> int:
    return max((int(s["submission"]) for s in job.submissions()), default=0) + 1


def refuse_while_live(slurm: Slurm, job: record.JobRecord,
                      env: Optional[Mapping[str, str]] = None,
                      task: Optional[int] = None) -> None:
    """A person's resubmission while one of the job's Slurm jobs (of array task ``task``) is
    still active would run beside it on the same root: refuse, saying which and what to do."""
    jobs = slurm.own_jobs(env, sluids=wants_sluids([job]))
    live = live_slurm_jobs(slurm, job, jobs, env, task)
    if live:
        shown = ", ".join(f"{j} ({jobs[j].state})" for j in live)
        raise UsageError(
            f"dispatch job {job.id} still has Slurm job(s) {shown}: a resubmission now would "
            f"run beside it on the same checkpoint root.  Wait for it to end, cancel it "
            f"(scancel {' '.join(live)}), or give --force to submit anyway")


def resubmit(slurm: Slurm, job: record.JobRecord, reason: str = "manual",
             extra: Optional[list[str]] = None, env: Optional[Mapping[str, str]] = None,
             expected: Optional[int] = None, claim: Optional[str] = None,
             hold: Optional[dict[str, Any]] = None, task: Optional[int] = None) -> SubmissionMade:
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
        raise UsageError(f"the submission directory {cwd!r} is gone; sbatch would take the "
                         "job's working directory from it")
    from ..errors import RefusedError
    from .interpreter import problem
    why = problem(job)  # it would fail at once, after taking a submission number
    if why is not None:
        raise RefusedError(f"not resubmitted: {why}")
    if claim is None and not job.claim(claim_name(submission, task)):
        found = slurm.find_by_marker(marker(job, submission, task), env)
        if found:
            job.append("submitted", once=once_key(submission, task), submission=submission,
                       slurm_job_id=found, reason=reason, argv=[], recovered=True, task=task)
            raise RecordError(f"{job.id}: submission {submission} had already been made "
                              f"(Slurm job {found}); recorded it")
        raise RecordError(f"{job.id}: submission {submission} is being made by another "
                          "process (its claim exists but no submission is recorded yet)")
    try:
        return _submit(slurm, job, submission, reason, extra, env, hold, task)
    except SlurmError as exc:
        job.append("submit-failed", submission=submission, error=str(exc), task=task)
        raise
