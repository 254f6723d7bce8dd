"""The supervisor's heartbeat: a small record of its last pass in the user's dispatch home.

``--resubmit`` and ``--shared-checkpoint`` act only while ``dispatch supervise`` runs.  Each
pass leaves ``supervisor-pass.json`` (``supervisor-pass@<cluster>.json`` where the cluster is
known: several clusters may share one home) beside ``jobs/``: when the last good pass was,
and while passes fail (the controller not answering), since when, how many and why.
``dispatch status`` shows it; ``dispatch-sbatch`` reads it to warn at submission when none has
passed lately.  Standard library only, and nothing heavy: ``dispatch-sbatch`` imports it.

Replaced whole (a new file renamed into place); best effort: a pass is not undone by a record
that cannot be written.
"""

from __future__ import annotations

import json
import os
import time

from .. import _clock
from . import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

PASS_FILE = "supervisor-pass.json"
# A supervisor that passed within this long runs (a timer passes every minute, a --loop every
# interval: then three of its intervals, if longer).
RECENT = 600.0
WAYS = (
    "`systemctl --user enable --now dispatch-supervise.timer` (contrib/systemd), a "
    "scrontab line `* * * * * dispatch supervise -q`, or `dispatch supervise --loop`"
)


def path(home: Optional[str] = None, cluster: Optional[str] = None) -> str:
    name = PASS_FILE
    safe = "".join(c for c in (cluster or "") if c.isalnum() or c in "-_.")
    if safe:
        name = f"supervisor-pass@{safe}.json"
    return os.path.join(home or record.home_dir(), name)


def read(home: Optional[str] = None, cluster: Optional[str] = None) -> Optional[dict[str, Any]]:
    """What the last pass wrote, or None (no supervisor has passed, or unreadable).
    ``time``: the last good pass (None if none was); ``failing_since``, ``failures``,
    ``failed_at``, ``error``: present while passes fail; ``every``: a loop's interval."""
    try:
        found = json.loads(record.read_regular(path(home, cluster)))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict):
        return None
    good = isinstance(found.get("time"), (int, float))
    failing = isinstance(found.get("failing_since"), (int, float))
    return found if good or failing else None


def good(
    home: Optional[str],
    cluster: Optional[str],
    jobs: int,
    actions: int,
    errors: int,
    every: Optional[float] = None,
) -> None:
    """A pass over the user's jobs was made (its own jobs' errors included): it ends a run of
    failed passes."""
    _write(
        home,
        cluster,
        {
            "time": round(time.time(), 3),
            "host": os.uname().nodename,
            "pid": os.getpid(),
            "cluster": cluster,
            "jobs": jobs,
            "actions": actions,
            "errors": errors,
            "every": every,
        },
    )


def failed(
    home: Optional[str], cluster: Optional[str], cause: str, every: Optional[float] = None
) -> dict[str, Any]:
    """A pass failed as a whole (the controller did not answer): the last good pass stays
    (``time``, None if there was none), with since when passes fail, how many did and the
    latest cause.  Returns what was written."""
    before = read(home, cluster) or {}
    now = round(time.time(), 3)
    since = before.get("failing_since")
    last_good = before.get("time")
    body = {
        "time": last_good if isinstance(last_good, (int, float)) else None,
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "cluster": cluster,
        "failing_since": since if isinstance(since, (int, float)) else now,
        "failures": int(before.get("failures") or 0) + 1 if since else 1,
        "failed_at": now,
        "error": cause,
        "every": every,
    }
    _write(home, cluster, body)
    return body


def _write(home: Optional[str], cluster: Optional[str], body: dict[str, Any]) -> None:
    target = path(home, cluster)
    tmp = os.path.join(os.path.dirname(target), f".{PASS_FILE}.{os.getpid()}.tmp")
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(body, handle)
        os.replace(tmp, target)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def missing_warning(
    home: Optional[str], cluster: Optional[str], options: list[str], now: Optional[float] = None
) -> Optional[str]:
    """The submission-time warning: ``options`` (``--resubmit 3``, ``--shared-checkpoint``)
    act only through a supervisor, and none of this user's has passed lately; or None."""
    seen = read(home, cluster)
    now = time.time() if now is None else now
    window = RECENT
    if seen is not None:
        last = max(float(seen.get(key) or 0) for key in ("time", "failed_at"))
        every = seen.get("every")
        if isinstance(every, (int, float)):
            window = max(RECENT, 3 * float(every))
        if now - last <= window:
            return None
        when = _clock.instant(last)
        said = f"the last one passed {when}"
    else:
        said = "none has passed yet"
    verb = "act" if len(options) > 1 else "acts"
    return (
        f"{' and '.join(options)} {verb} only while `dispatch supervise` runs, and no "
        f"supervisor of yours has passed in the last {window / 60:.0f} min ({said}); "
        f"run one: {WAYS}"
    )
