"""What an execution folder (``<root>/exec/<attempt>/``) holds besides its saves: one home for
the names and the meaning of dispatch's own files there, read by cleanup (``gc``), the
launcher, ``watch``, the framework integrations and the API alike.

The files, each created once and never rewritten but the progress record (a leading dot
keeps them out of every save rule):

* ``.dispatch`` (:data:`RECORD`): the launcher's record of the execution (epoch, attempt, the
  save it resumes from and that save's publication), written before the user's script runs.
* ``.dispatch-choice-<hash>.json`` (:func:`choice_name`): a save the execution has chosen to
  load, written *before* it loads it, one per save tried (an integration that passes over an
  unloadable save records each one it tries).  With the launcher's record these are "what an
  execution has chosen": cleanup never removes such a save while the execution may be the
  live lineage's, however it chose it.
* ``.dispatch-resume.json`` (:data:`RESUME`): the integrations' account of the resume: what
  was finally loaded and what was passed over, and why.
* ``.dispatch-requeued.json`` (:data:`REQUEUED`): the execution's integration asked Slurm to
  requeue it at its warning signal, after publishing the save made there (``{"save": ...}``,
  written before ``scontrol requeue``; or ``dispatch watch`` published Lightning's own save
  at the requeue signal, ``hpc_ckpt_<n>.ckpt``, which Lightning follows with its own
  ``scontrol requeue``): the requeue that follows is the job's own continuation, which
  ``--max-requeues`` does not count.
* ``.dispatch-keep.json`` (:data:`KEEP`): the framework's rotation limit, turned off inside
  the execution and applied by dispatch's cleanup (``keep``; ``every`` when one of its
  checkpoint callbacks keeps every save, so no limit applies).
* ``.dispatch-removing`` (:data:`REMOVING`): cleanup's mark on a folder it is removing
  whole, made before it unpublishes the folder's saves, naming them (``{"unpublished":
  [path in the folder, ...]}``; an empty mark, from before marks named them, covers all): a
  save it names that no publication names any more is then one cleanup decided to remove,
  not one the execution never published (a killed cleanup's rerun finishes the folder); any
  other is judged as a save never published (one an old execution still running finished
  or wrote after the plan stays when it looks whole).
* ``.dispatch-progress.json`` (:data:`PROGRESS`): the step the execution reached and when,
  and whether it is inside a save (:mod:`slurm_dispatch.execution.steps` writes it, the
  launcher's stall watcher reads it).  The one file here that is rewritten: replaced whole in
  place (a temporary file renamed over it, never synced), at most every few seconds.
* ``.dispatch-stalled.json`` (:data:`STALLED`): the stall watcher's mark, made once when the
  execution's progress stopped for its ``--stall-timeout``, before it asks for a save: the
  integrations then save but never requeue (the execution must end failed).
* ``<save>.dispatch-manifest.json`` beside a file save, ``dispatch-manifest.json`` inside a
  folder save (:data:`MANIFEST_SUFFIX`): each file's size, and the saves the framework keeps
  as its best at that moment (``bests``: Lightning's top k by each monitor, the Trainer's best
  model), written before the save is published.

The handshake with cleanup (docs/invariants.md, 9): an execution records its choice
(create-once, durable), then checks that a publication of the chosen save is still there;
cleanup removes publications first, then reads every live execution's choices again and spares
what they name.  One of the two always sees the other.

Standard library only; no I/O of its own except through the store it is given.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

RECORD = ".dispatch"
RECORD_FORMAT = 1
RESUME = ".dispatch-resume.json"
KEEP = ".dispatch-keep.json"
CHOICE_PREFIX = ".dispatch-choice-"
CHOICE_SUFFIX = ".json"
REMOVING = ".dispatch-removing"
PROGRESS = ".dispatch-progress.json"
STALLED = ".dispatch-stalled.json"
REQUEUED = ".dispatch-requeued.json"
OWN_NAMES = frozenset(
    {RECORD, ".dispatch-resume.json", ".dispatch-keep.json", REMOVING, PROGRESS, STALLED, REQUEUED}
)
MANIFEST_SUFFIX = ".dispatch-manifest.json"  # a folder save holds MANIFEST_SUFFIX[1:]
MANIFEST_NAME = MANIFEST_SUFFIX[1:]
MANIFEST_FORMAT = 1


def mark_requeued(store: Any, attempt: str, save: str) -> None:
    """Mark execution ``attempt``'s folder in ``store`` (:data:`REQUEUED`, naming ``save``):
    the requeue that follows is the job's own.  Made once: a second mark changes nothing."""
    try:
        store.create_exec_file(attempt, REQUEUED, json.dumps({"save": save}).encode())
    except FileExistsError:
        pass


def choice_name(relative: str) -> str:
    """The file that records the choice of the save at ``relative`` (a path under the root):
    one name per save, so ranks that choose the same save write the same file."""
    digest = hashlib.sha256(relative.encode("utf-8")).hexdigest()[:32]
    return f"{CHOICE_PREFIX}{digest}{CHOICE_SUFFIX}"


def is_choice(name: str) -> bool:
    return name.startswith(CHOICE_PREFIX) and name.endswith(CHOICE_SUFFIX)


def is_own(name: str) -> bool:
    """Whether a name directly in an execution folder is one of dispatch's own files (a
    user's ``.dispatch-notes`` is not)."""
    return name in OWN_NAMES or is_choice(name) or _OWN_TMP.fullmatch(name) is not None


# One of ours being written (then linked into place): <name>.<pid>.<ns>.tmp
_OWN_TMP = re.compile(r"\.dispatch(?:-[a-z0-9-]+(?:\.json)?)?\.[0-9]+\.[0-9]+\.tmp")


def choice_bytes(relative: str, attempt: str, why: str) -> bytes:
    return (
        json.dumps({"save": relative, "attempt": attempt, "why": why}, sort_keys=True) + "\n"
    ).encode()


def load(raw: Optional[bytes]) -> Optional[dict[str, Any]]:
    """A record's JSON object, or None when absent or unreadable."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def chosen_in_choice(raw: Optional[bytes]) -> Optional[str]:
    """The save (relative to the root) a choice file names, or None."""
    data = load(raw)
    save = data.get("save") if data else None
    return save if isinstance(save, str) and save else None


def keep_of(raw: Optional[bytes]) -> Optional[int]:
    """The rotation limit a keep record holds, or None."""
    data = load(raw)
    value = data.get("keep") if data else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


def keeps_every(raw: Optional[bytes]) -> bool:
    """Whether a keep record says the framework keeps every save (a Lightning
    ``ModelCheckpoint(save_top_k=-1)`` beside others): no limit applies then."""
    data = load(raw)
    return bool(data and data.get("every") is True)


def bests_of(raw: Optional[bytes]) -> list[str]:
    """The saves (relative to the root) a manifest says the framework keeps as its best when
    that save was made (Lightning's top k by each monitor, the Trainer's best model)."""
    data = load(raw)
    found = data.get("bests") if data else None
    if not isinstance(found, list):
        return []
    return [path for path in found if isinstance(path, str) and path]


def manifest_of(relative: str, folder: bool) -> str:
    """Where the manifest of the save at ``relative`` is (relative to the root)."""
    return f"{relative}/{MANIFEST_NAME}" if folder else relative + MANIFEST_SUFFIX
