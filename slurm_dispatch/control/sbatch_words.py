"""What a recorded sbatch command line says, as sbatch would read it: an option's last value
among the words (the command line over its ``SBATCH_*`` variable over the script's
``#SBATCH`` lines), the ``--array`` task ids, the ``--time`` limit, whether the job asked for
Slurm's expedited requeue.  :mod:`.sbatch_args` reads a command line once, pure; this module
reads the words a job's record keeps (its spec and its environment snapshot), for every
submission after the first and for the modules that ask what an array's tasks are."""

from __future__ import annotations

from ..errors import UsageError
from ..slurm import arrays
from . import record, sbatch_args
from .environment import submission_environment

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Mapping, Optional


def array_words(words: list[str]) -> tuple[Optional[str], list[str]]:
    """The last ``--array`` (``-a``) value among sbatch words, as sbatch would take it, and
    the words without any array option."""
    return option_words(words, "array", "a")


def header_words(header_lines: list[str], script_name: str) -> list[str]:
    """The words of the ``#SBATCH`` lines among a recorded header's lines."""
    words: list[str] = []
    for line in header_lines:
        text = line.lstrip()
        if text.startswith("#SBATCH"):
            words.extend(sbatch_args.directive_words(text[len("#SBATCH") :], script_name, 0))
    return words


def expedited_requeue(job: record.JobRecord) -> bool:
    """The job asked for Slurm's expedited requeue (``--requeue=expedite``, 25.11): its
    command line over its ``#SBATCH`` lines, as sbatch reads them."""
    spec = job.spec
    return sbatch_args.expedited_requeue(
        header_words(list(spec.get("header", [])), spec["script_name"]) + list(spec["sbatch"])
    )


def option_words(words: list[str], long: str, short: str) -> tuple[Optional[str], list[str]]:
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
                value, taken = (
                    (given, 1) if sep else (words[i + 1] if i + 1 < len(words) else "", 2)
                )
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
            raise UsageError(
                f"--array {spec!r}: a task id above {arrays.MAX_TASK_ID} is beyond "
                "every Slurm's MaxArraySize (at most 4000001), so sbatch would "
                "refuse it"
            ) from None
        raise UsageError(
            f"--array {spec!r} is not a list of task ids (like 0-15:4%2 or 1,3,5-7)"
        ) from None


def array_tasks(job: record.JobRecord) -> Optional[list[int]]:
    """The task ids of an array job as its first submission asked for them (the command
    line over ``SBATCH_ARRAY_INX`` of its environment over its ``#SBATCH`` lines); None for
    a job that is not an array.  Recorded in the spec at the first submission (records made
    before that are read from their parts)."""
    spec = job.spec
    if "array_tasks" in spec:
        found = spec["array_tasks"]
        return [int(t) for t in found] if isinstance(found, list) else None
    return array_of(
        list(spec["sbatch"]),
        submission_environment(job),
        list(spec.get("header", [])),
        spec["script_name"],
    )


def array_of(
    words: list[str], env: Mapping[str, str], header_lines: list[str], script_name: str
) -> Optional[list[int]]:
    """The task ids a submission asks for (sbatch ``words`` over ``SBATCH_ARRAY_INX`` in
    ``env`` over the script's ``#SBATCH`` lines), or None when it is not an array."""
    found = array_given(words, env, header_lines, script_name)
    return parse_array(found[0]) if found is not None else None


def array_given(
    words: list[str], env: Mapping[str, str], header_lines: list[str], script_name: str
) -> Optional[tuple[str, str]]:
    """The ``--array`` value sbatch would take and where it was given (as the user would
    write it), or None: the command line over ``SBATCH_ARRAY_INX`` over ``#SBATCH`` lines."""
    return option_given(words, env, header_lines, script_name, "array", "a", "SBATCH_ARRAY_INX")


def option_given(
    words: list[str],
    env: Mapping[str, str],
    header_lines: list[str],
    script_name: str,
    long: str,
    short: str,
    variable: str,
) -> Optional[tuple[str, str]]:
    """The value of sbatch option ``--long`` sbatch would take and where it was given (as the
    user would write it), or None: the command line over ``$variable`` over ``#SBATCH``."""
    value = option_words(words, long, short)[0]
    if value is not None:
        spelled = next((w for w in reversed(words) if w == "-" + short), None)
        return value, f"-{short} {value}" if spelled else f"--{long}={value}"
    value = env.get(variable) or None
    if value is not None:
        return value, f"{variable}={value}"
    value = option_words(header_words(header_lines, script_name), long, short)[0]
    return (value, f"#SBATCH --{long}={value} in {script_name}") if value is not None else None


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
