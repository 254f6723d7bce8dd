"""Time as people (and the site's programs) read it: one function per kind of time shown.

Every time this project prints, writes into a Slurm comment or hands to a program is formatted
here, so one kind of time reads the same wherever it appears:

* :func:`instant`: a moment in a log line, a report or an error message, local time to the
  second, ``2026-12-02T06:10:00``;
* :func:`with_zone`: a time a person reads away from this machine (a Slurm comment squeue
  shows, a hold's expiry in a notice), to the minute with its zone, ``2026-12-02 06:10 UTC``;
* :func:`for_program`: a time given to the site's notify program, with its UTC offset,
  ``2026-12-02T06:10:00+0000``;
* :func:`duration`: a span, ``3h05m`` or ``4m07s``;
* :func:`ago`: how long ago, ``40 s``, ``12 min``, ``3 h``.

Invariant: only the standard library's ``time`` is imported (hooks' and the launcher's start-up).
"""

from __future__ import annotations

import time

__all__ = ["ago", "duration", "for_program", "instant", "with_zone"]


def _local(seconds: float | None) -> time.struct_time:
    return time.localtime(seconds)  # None: now


def instant(seconds: float | None = None) -> str:
    """A moment (now if None) in a log line, a report or a message: local, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", _local(seconds))


def with_zone(seconds: float | None = None) -> str:
    """A time (now if None) a person reads elsewhere (squeue's comment, a mail): local, to the
    minute, with its zone."""
    return time.strftime("%Y-%m-%d %H:%M %Z", _local(seconds))


def for_program(seconds: float) -> str:
    """A moment given to another program: local, to the second, with its UTC offset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", _local(seconds))


def duration(seconds: float) -> str:
    """A span: hours and minutes, or minutes and seconds under an hour."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def ago(seconds: object, now: float | None = None) -> str:
    """How long before ``now`` the moment ``seconds`` was; ``?`` when it is no number."""
    if not isinstance(seconds, (int, float)):
        return "?"
    since = max(0, int((time.time() if now is None else now) - float(seconds)))
    return (
        f"{since} s"
        if since < 120
        else f"{since // 60} min"
        if since < 7200
        else f"{since // 3600} h"
    )
