"""Checkpoint-root patterns: the rules of ``%a``, ``%A``, ``%j`` and ``%%`` in ``--checkpoint``.

A root as given may hold Slurm-like patterns, expanded by the launcher in each execution:
``%a`` the array task id (one root per task), ``%A`` the array job id, ``%j`` the job id and
``%%`` a literal '%'.  Patterns are read left to right, so ``%%a`` is a literal ``%a``; any
other ``%x`` stays as written.  Only ``%a`` may be used: ``%A`` and ``%j`` would give every
submission a new root (:func:`refuse_changing`).

Invariant: every reading of these patterns (expanding, asking whether a root is one per task,
where its fixed part ends) is here, so a root means the same to the submission, the launcher,
``dispatch status`` and ``dispatch latest``.  Only the standard library and the error tree are
imported (the launcher's start-up).
"""

from __future__ import annotations

import os

from ..errors import UsageError

__all__ = [
    "expand",
    "fixed_folder",
    "for_task",
    "has_patterns",
    "one_root",
    "per_task",
    "refuse_changing",
]


def expand(pattern: str, env: dict[str, str]) -> str:
    """Expand %a (array task id), %A (array job id), %j (job id) and %% in a root."""
    values = {
        "a": env.get("SLURM_ARRAY_TASK_ID", "0"),
        "A": env.get("SLURM_ARRAY_JOB_ID", env.get("SLURM_JOB_ID", "0")),
        "j": env.get("SLURM_JOB_ID", "0"),
        "%": "%",
    }
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def for_task(root: str, task: int) -> str:
    """The root of array task ``task`` (a root without %a: the same for every task)."""
    return expand(root, {"SLURM_ARRAY_TASK_ID": str(task)})


def _uses(root: str, letter: str) -> bool:
    """Whether ``root`` holds the pattern ``%letter`` that :func:`expand` expands (read left
    to right: ``%%`` is a literal '%', so ``%%a`` is no pattern)."""
    i = 0
    while i < len(root) - 1:
        if root[i] == "%":
            if root[i + 1] == letter:
                return True
            i += 2 if root[i + 1] == "%" else 1
        else:
            i += 1
    return False


def per_task(root: str) -> bool:
    """Whether ``root`` names one root per array task (it holds %a)."""
    return _uses(root, "a")


def one_root(root: str) -> str:
    """The root, for a root that is the same for every task (no %a): its %% read as '%'."""
    return expand(root, {})


def has_patterns(root: str) -> bool:
    """Whether ``root`` holds any '%' (a pattern, or a literal '%' written ``%%``): such a
    root is not one folder as written."""
    return "%" in root


def fixed_folder(root: str) -> str:
    """The folder of ``root`` that no pattern changes: the root itself without one, else the
    folder holding its first '%' (``/scratch/ck/task%a`` -> ``/scratch/ck``)."""
    static = root.split("%", 1)[0]
    return static if "%" not in root else os.path.dirname(static.rstrip("/")) or "/"


def refuse_changing(given: str) -> None:
    """Refuse a root with %j or %A: either gives every submission a new root (UsageError)."""
    changing = [f"%{c}" for c in "jA" if _uses(given, c)]
    if changing:
        raise UsageError(
            f"--checkpoint {given!r}: {' and '.join(changing)} would give every "
            "submission a new root, but a root must be the same for every submission of a "
            "dispatch job (a resubmission resumes from the root's latest publication); each "
            "execution already gets its own exec/<attempt>/ folder under it.  Write a fixed "
            "path, with %a for one root per task of an array (for example ck/task%a)"
        )
