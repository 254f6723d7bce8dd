"""The stall watcher: an execution whose progress stopped for its job's ``--stall-timeout`` is
asked to save (its warning signal) and then ended, so the job's rules for a failure apply.

Who watches: the launcher, which runs at the start of every execution, inside the batch step,
as the job's user.  Where the job has a stall timeout (none by default) it forks the watcher
before it execs the user's script, and the watcher outlives the exec beside the script
(forked twice: the script has no child of ours to wait for).  It asks Slurm nothing; it reads
the execution's progress record (:mod:`.steps`, written by the integrations, the API and
``dispatch watch``) every few seconds, and ends with the script (``pidfd``).

When the clock runs (the invariants the tests hold):

* It starts at the first progress record the watcher sees: before any record (start-up, a
  long first step, a job that records nothing) nothing is ever called a stall; the job's
  time limit applies there as before.
* Once the record says the loop ended (``"ended": true``, the callbacks' end of training),
  it stops, as before the first record: a final evaluation or an export after training is
  never a stall.  A step after it starts it again.
* It starts again at every change of the record: a new step, a step mark repeating a step
  (``calls``: a micro-batch of gradient accumulation), a save's beginning or end.
  While the record says a save is under way, it does not run: a long save is never a stall.
* Once it reaches the timeout: the watcher marks the execution's folder (``.dispatch-stalled
  .json``, :data:`..checkpoint.execdir.STALLED`, created once, before anything is signalled:
  the integrations then save but never requeue), records a ``stalled`` event in the job's
  record ("stalled: no progress for N s since step S", which ``dispatch status`` and the
  supervisor show), says so in the job's output, and sends the script the job's warning
  signal (``--warn-before``'s, where Slurm's ``--signal=B:`` sends it; SIGUSR1 without one).
  It gives the script the ``--warn-before`` seconds (:data:`DEFAULT_GRACE` without one) to
  save, longer while a save it began is still under way (at most twice that), then sends
  SIGTERM, and SIGKILL :data:`KILL_AFTER` seconds later.  A process ended by a signal ends
  the job FAILED, and the supervisor counts the execution failed whatever its exit status.

A stall is caught between the timeout and the timeout plus twice the record's write interval
(:data:`.steps.INTERVAL`) and one poll (a tenth of the timeout, 0.5 to 5 s) after the loop's
last step: the watcher waits the timeout plus that interval after the record last changed,
since the record may be that far behind the loop (a step made within the interval of the
last write is not written), and a loop whose steps each take less than the timeout is never
caught.  Nothing here
touches the training process but the signals.  The watcher ignores the signals a job's
processes are sent to save (USR1, USR2, the job's warning signal, HUP, INT): only the script's
end, Slurm's SIGTERM or SIGKILL end it.  Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any, Callable, Mapping, Optional

from .. import _clock, _fsio
from ..checkpoint import execdir
from . import contract, steps

DEFAULT_GRACE = 60  # seconds to save after the signal, for a job without --warn-before
KILL_AFTER = 10  # seconds between SIGTERM and SIGKILL


def timeout_of(spec: Mapping[str, Any]) -> Optional[int]:
    """The job's stall timeout in seconds, or None (off)."""
    value = spec.get("stall_timeout")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def poll_every(timeout: float) -> float:
    return min(5.0, max(0.5, timeout / 10))


def warning(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(the job's warning signal, the seconds it has to save after it)."""
    warn = spec.get("warn_before")
    if isinstance(warn, (list, tuple)) and len(warn) == 2:
        found = getattr(signal, f"SIG{str(warn[0]).upper().removeprefix('SIG')}", None)
        if isinstance(found, int) and isinstance(warn[1], int):
            return int(found), int(warn[1])
    return int(signal.SIGUSR1), DEFAULT_GRACE


class StallClock:
    """Time without progress, as the watcher sees the record change (its own monotonic
    clock: the writer's wall clock, on another node perhaps, is never compared with it).

    A step is written at most every ``lag`` seconds (:data:`.steps.INTERVAL`), so the loop's
    last step may be up to that much later than the record's last change: a stall is called
    only ``timeout + lag`` after the change, never before the loop itself went ``timeout``
    without a step."""

    def __init__(self, timeout: float, lag: float = steps.INTERVAL) -> None:
        self.timeout = timeout
        self.lag = lag
        self._key: Any = None
        self._since = 0.0

    def observe(self, record: Optional[Mapping[str, Any]], now: float) -> Optional[float]:
        """The seconds without progress once they reach the timeout, else None."""
        if record is None:
            return None  # no record yet: the clock has not started
        key = (
            record.get("step"),
            record.get("calls"),
            record.get("saves"),
            bool(record.get("saving")),
            record.get("pid"),
            bool(record.get("ended")),
        )
        if key != self._key:
            self._key, self._since = key, now
            return None
        if record.get("saving") or record.get("ended"):
            return None
        waited = now - self._since
        return waited if waited >= self.timeout + self.lag else None


def mark(folder: str) -> Optional[dict[str, Any]]:
    """The stall mark in ``folder`` (None: not stalled)."""
    return steps.read(folder, execdir.STALLED)


def stalled_here(env: Optional[Mapping[str, str]] = None) -> Optional[dict[str, Any]]:
    """The stall mark of this process's execution, if the watcher made one."""
    folder = contract.Contract.read(env).local_dir
    return mark(folder) if folder else None


class _Target:
    """The script's process: whether it is gone, waiting at most a while."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: Optional[int] = None
        try:
            self._fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._fd = None  # an older kernel: signal 0 tells instead

    def gone_within(self, seconds: float) -> bool:
        if self._fd is not None:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, seconds))
            return bool(ready)
        deadline = time.monotonic() + seconds
        while True:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return True  # another's process under the id: ours is gone
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def signal(self, signum: int) -> None:
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, signum)
            else:
                os.kill(self.pid, signum)
        except (ProcessLookupError, OSError):
            pass  # gone meanwhile


def say(text: str) -> None:
    sys.stderr.write(f"==> slurm-dispatch: {_clock.instant()} {text} <==\n")
    sys.stderr.flush()


class StallWatch:
    """One execution's watch: ``record`` appends the stalled event (the launcher's job record,
    given as a callable so that this module needs no control side)."""

    def __init__(
        self,
        folder: str,
        timeout: int,
        pid: int,
        signum: int,
        grace: int,
        record: Callable[[dict[str, Any]], None],
    ) -> None:
        self.folder, self.timeout, self.signum, self.grace = folder, timeout, signum, grace
        self.target = _Target(pid)
        self.record = record
        self.poll = poll_every(timeout)

    def run(self) -> Optional[dict[str, Any]]:
        """Watch until the script ends (None) or stalls (what was recorded, once it ended)."""
        clock = StallClock(self.timeout)
        while not self.target.gone_within(self.poll):
            record = steps.read(self.folder)
            waited = clock.observe(record, time.monotonic())
            if waited is not None and record is not None:
                return self.end(record, waited)
        return None

    def end(self, record: Mapping[str, Any], waited: float) -> dict[str, Any]:
        step = record.get("step")
        facts = {
            "seconds": int(waited),
            "timeout": self.timeout,
            "step": step if isinstance(step, int) else None,
            "signal": signal.Signals(self.signum).name,
            "time": round(time.time(), 3),
        }
        try:
            _fsio.write_new(
                os.path.join(self.folder, execdir.STALLED),
                (json.dumps(facts, sort_keys=True) + "\n").encode(),
                0o444,
            )
        except OSError as exc:
            say(f"warning: cannot mark the execution stalled: {exc.strerror or exc}")
        reason = f"stalled: no progress for {facts['seconds']} s since " + (
            f"step {facts['step']}" if facts["step"] is not None else "its last record"
        )
        try:
            self.record(facts)
        except Exception as exc:  # the end matters more than its record: still end it
            say(f"warning: cannot record the stall in the job's record: {exc}")
        say(
            f"{reason} (--stall-timeout {self.timeout} s); asking it to save "
            f"({facts['signal']}, {self.grace} s), then ending it"
        )
        self.target.signal(self.signum)
        deadline = time.monotonic() + self.grace
        while True:
            now = time.monotonic()
            wait = min(self.poll, deadline - now)
            if wait <= 0:
                if not (
                    (steps.read(self.folder) or {}).get("saving") and now < deadline + self.grace
                ):
                    break
                wait = self.poll  # a save it began is under way: up to twice the grace
            if self.target.gone_within(wait):
                return facts
        say(f"{reason}: ending it (SIGTERM)")
        self.target.signal(signal.SIGTERM)
        if not self.target.gone_within(KILL_AFTER):
            self.target.signal(signal.SIGKILL)
        return facts


def start(
    folder: str, timeout: int, spec: Mapping[str, Any], record: Callable[[dict[str, Any]], None]
) -> None:
    """Fork the watcher of this process (the launcher, about to exec the script under its own
    pid) and return in the launcher.  The watcher is forked twice, so that it is not the
    script's child; it never returns into the launcher's code."""
    pid = os.getpid()
    signum, grace = warning(spec)
    first = os.fork()
    if first:
        os.waitpid(first, 0)
        return
    code = 0
    try:
        if os.fork():
            os._exit(0)
        # A signal meant for the job's processes (scancel --signal=USR1 --full, a site's
        # script) reaches the watcher too: USR1's default would end it, and nothing would be
        # caught any more.  It ends with the script, or at Slurm's SIGTERM and SIGKILL.
        for name in ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT", "SIGALRM"):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        if signum != signal.SIGTERM:
            signal.signal(signum, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        StallWatch(folder, timeout, pid, signum, grace, record).run()
    except BaseException as exc:  # noqa: BLE001 - a watcher's failure must not become the job's
        code = 1
        try:
            say(f"warning: the stall watch stopped: {exc!r}")
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)
