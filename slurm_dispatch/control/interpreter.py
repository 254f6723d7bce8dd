"""The interpreter a dispatch job's submissions run the launcher with, and whether it is there.

Every submission's batch script execs ``<python> -m slurm_dispatch.launch``: ``python`` is the
interpreter ``dispatch-sbatch`` ran under (or ``$DISPATCH_PYTHON``) at the first submission,
kept in the job's spec.  A venv moved or removed since makes every later submission fail at
once, in the batch shell, after it took a submission number and a resubmission from the
budget.  So a resubmission is checked first (:func:`problem`): the interpreter must be an
executable file here (the submit host; a cluster's software tree is the nodes' too).

``dispatch resubmit --python PATH`` names another one; it is kept in the job's record
(``python``, replaced whole) for every later submission, the supervisor's included.
"""

from __future__ import annotations

import os

from ..errors import RecordError, UsageError
from . import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

FILE = "python"
FIND_TIMEOUT = 30.0  # seconds for the interpreter to say whether it finds slurm_dispatch


def recorded(job: record.JobRecord) -> str:
    """The interpreter the job's next submission runs the launcher with."""
    try:
        with open(os.path.join(job.path, FILE), encoding="utf-8") as handle:
            chosen = handle.read().strip()
    except FileNotFoundError:
        chosen = ""
    except OSError as exc:
        raise RecordError(f"cannot read {os.path.join(job.path, FILE)!r}: {exc.strerror}") from None
    return chosen or str(job.spec["python"])


def missing(python: str) -> Optional[str]:
    """Why ``python`` cannot run the launcher here, or None."""
    if not os.path.isabs(python):
        return f"the interpreter {python!r} is not an absolute path"
    if not os.path.exists(python):
        return f"the interpreter {python} is gone"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        return f"the interpreter {python} is not an executable file"
    # There, but perhaps a venv made again without slurm-dispatch, or another Python: the
    # launcher's import fails as surely.  Asked without importing it (tens of ms).
    import subprocess

    try:
        found = subprocess.run(
            [
                python,
                "-c",
                "import importlib.util, sys; "
                "sys.exit(importlib.util.find_spec('slurm_dispatch') is None)",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=FIND_TIMEOUT,
            cwd="/",
        )
    except subprocess.TimeoutExpired:
        return None  # a slow file system is no proof: the launcher will say
    except OSError as exc:
        return f"the interpreter {python} cannot be run ({exc.strerror})"
    if found.returncode == 1:
        return (
            f"the interpreter {python} cannot import slurm_dispatch (slurm-dispatch is not "
            "installed for it)"
        )
    return None


def problem(job: record.JobRecord) -> Optional[str]:
    """Why the job's next submission would fail at once (its interpreter), with the fix; or
    None."""
    python = recorded(job)
    why = missing(python)
    if why is None:
        return None
    return (
        f"{why} (the launcher of every submission of {job.id} runs with it; was its venv "
        "moved or removed?): reinstall slurm-dispatch there, or resubmit by hand with "
        f"another: `dispatch resubmit --python PATH {job.id}` (later submissions keep it)"
    )


def choose(job: record.JobRecord, python: str) -> None:
    """Make ``python`` the interpreter of the job's submissions from now on."""
    python = os.path.abspath(os.path.expanduser(python))
    why = missing(python)
    if why is not None:
        raise UsageError(f"--python {python}: {why[len('the ') :]}")
    path = os.path.join(job.path, FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(python + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise RecordError(f"cannot write {path!r}: {exc.strerror}") from None
