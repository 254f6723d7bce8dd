"""``dispatch supervise``'s passes: one, or ``--loop``'s for ever.  A pass the controller does
not answer fails as a whole: it is recorded (:func:`.supervisor.mark_failure`, what ``dispatch
status`` shows), and the loop passes again sooner at first, never less often than every
interval (:func:`.supervisor.retry_pause`), for as long as it takes.  The command prints what
each pass said (:class:`Said`) and exits with what :func:`run` returns; it never loops itself."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import DispatchError
from .supervisor import PassReport, Supervisor, mark_failure, retry_pause


@dataclass(frozen=True)
class Said:
    """What one pass said: its report, or the cause it failed of (with the seconds before the
    loop's next pass); after a good pass, the failures it ended (their record), if any."""

    report: Optional[PassReport] = None
    failure: Optional[str] = None
    next_in: Optional[float] = None
    recovered: Optional[dict[str, Any]] = None


def run(
    supervisor: Supervisor,
    pause: float,
    loop: bool,
    tell: Callable[[Said], None],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """One pass (``loop`` false: the exit status, 2 where it failed or reported an error), or
    a pass every ``pause`` seconds for ever; ``tell`` gets what each pass said."""
    failed: Optional[dict[str, Any]] = None
    while True:
        try:
            report = supervisor.run_pass()
        except (DispatchError, OSError) as exc:
            cause = " ".join(str(exc).split())
            failed = mark_failure(None, cause, supervisor.slurm.cluster(), supervisor.every)
            wait = retry_pause(int(failed["failures"]), pause)
            tell(Said(failure=cause, next_in=wait if loop else None))
            if not loop:
                return 2
            sleep(wait)
            continue
        tell(Said(report=report, recovered=failed))
        failed = None
        if not loop:
            return 2 if report.errors else 0
        sleep(pause)
