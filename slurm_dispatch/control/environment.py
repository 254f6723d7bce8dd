"""The environment snapshot: what sbatch was given at a job's first submission, kept in its
record (``environment``, written once, 0600: it may hold secrets) and given to every later
submission, so every execution gets the job environment of the first (sbatch exports it by
the same ``--export`` rules)."""

from __future__ import annotations

import os

from .. import _fsio
from ..errors import RecordError
from . import record

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Mapping


ENVIRONMENT = "environment"


def save_environment(job: record.JobRecord, env: Mapping[str, str]) -> None:
    """Keep the environment sbatch saw at the first submission, for every later one.

    sbatch exports it to the job by its ``--export`` rules, so keeping what sbatch was given
    (and giving the same options) gives every submission the job environment of the first.
    Written once, 0600 (it may hold secrets), as ``NAME=value`` entries ended by NUL bytes.
    """
    data = b"".join(
        os.fsencode(k) + b"=" + os.fsencode(v) + b"\0"
        for k, v in env.items()
        if "=" not in k and "\0" not in k and "\0" not in v
    )
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
