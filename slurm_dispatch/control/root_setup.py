"""The checkpoint root a submission names: read from the options and checked
(:func:`checkpoint_root`), made where it is a folder (:func:`prepare_root`, undone by
:func:`remove_new_folders` when the submission is refused), and refused while another live
dispatch job of the user's uses it (:func:`refuse_shared_root`).  A refused submission leaves
nothing behind."""

from __future__ import annotations

import os
import time

from ..checkpoint import roots
from ..errors import DispatchError, UsageError
from ..slurm.adapter import Slurm
from . import record, sbatch_args

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Mapping, Optional


def checkpoint_root(options: sbatch_args.DispatchOptions, cwd: str) -> str:
    if not options.checkpoint:
        raise UsageError(
            "no checkpoint root: give --checkpoint DIR (or a '#DISPATCH "
            "--checkpoint DIR' line in the script); every execution writes under "
            "DIR/exec/<attempt>/ and publishes into DIR/pub/"
        )
    given = options.checkpoint
    control = [c for c in given if _is_control(c)]
    if control:
        raise UsageError(
            f"--checkpoint {given!r} holds a control character ({control[0]!r}): "
            "a root's name is printed in tables and logs, one line each"
        )
    roots.refuse_changing(given)
    if ":" in given:  # imported only then: start-up speed
        from ..checkpoint.stores.open import check_root_scheme

        check_root_scheme(given)
    if "://" in given:
        from ..checkpoint.stores.schemes import SCHEMES, scheme_of

        row = scheme_of(given)
        if row is None:
            # "://" past a scheme's place (a folder's name holding it, a word no scheme starts
            # with): check_root_scheme let it by, and no store serves it.
            kinds = " or ".join(r.prefix for r in SCHEMES)
            raise UsageError(f"checkpoint root {given!r} is not an {kinds} URL")
        # Checked for shape only: dispatch-sbatch never talks to S3 (boto3 stays off this path).
        return row.store_class().checked_root(given)
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(given)))


# Bidi controls: a name holding one is shown reversed in part ('Trojan source').
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _is_control(char: str) -> bool:
    """A character a root may not hold: a C0 or C1 control (NEL and CSI are C1), the Unicode
    line and paragraph separators (str.splitlines() splits on both), a bidi control."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or code in (0x2028, 0x2029) or char in _BIDI


def _remote(root: str) -> bool:
    """A remote root (the table of stores says which: s3://) is no folder to make or check."""
    if "://" not in root:
        return False  # a folder: the table is not even imported (start-up speed)
    from ..checkpoint.stores.schemes import is_remote_root

    return is_remote_root(root)


def refuse_a_root_that_is_no_folder(root: str) -> list[str]:
    """Refuse a root, or a folder on its way, that is a file (or a link to nothing) rather
    than a folder, reading only (``dispatch plan`` asks too); the folders to make, outermost
    first."""
    if _remote(root):
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
        raise UsageError(
            f"{what} {probe!r} is {what_stands(probe) or 'not a folder'}: give a "
            "folder (it is made if missing)"
        )
    return missing


def prepare_root(root: str) -> list[str]:
    """Create the root (up to its first %-pattern) and check the user can write it.

    Returns the folders it created, outermost first, so a submission that fails can remove
    them again (:func:`remove_new_folders`): a refused submission leaves nothing behind.
    An ``s3://`` root is no folder: nothing is made and S3 is not asked.
    """
    if _remote(root):
        return []
    folder = roots.fixed_folder(root)
    missing = refuse_a_root_that_is_no_folder(root)
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


# A record this young without a submission is one being submitted (older: one that died).
BEING_SUBMITTED_FOR = 600.0


def refuse_shared_root(
    root: str,
    slurm: Slurm,
    home: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    allowed: Optional[str] = None,
    new: Optional[record.JobRecord] = None,
) -> None:
    """Refuse ``root`` when another live dispatch job of the caller's uses it.

    Two jobs on one root would publish side by side at the same epochs.  Live: one of its
    Slurm jobs is still active, or it is being submitted (recorded, no submission yet, for
    less than :data:`BEING_SUBMITTED_FOR`).  The records say which jobs use the root (nothing
    is written into the root for this); Slurm is asked only when one does.

    ``new`` is the caller's own job, checked again once recorded: of two submissions that
    both looked before either was recorded, the second to check sees the first and gives way
    (both do when both see the other: never two on one root, without a lock).
    """
    same = [
        job
        for job in record.all_jobs(home)
        if job.id not in (allowed, new.id if new else None) and _spec_root(job) == root
    ]
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
                "time, or choose another root"
            )
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
                    "choose another root"
                )


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
