"""Work done as another account: root forks a child that becomes the account and runs it.

The one home of "run this as that account" for the sides that run as root: the site's view
reads each user's records as that user (``control/siteview.py``), the doctor runs a probe as
the controller's SlurmUser (``node/doctor.py``).  :func:`run_as` forks; the child takes the
account's groups, gid and uid (the uid last: from then on nothing of root's is left), then,
where the caller asks, a whole new environment and working folder, runs the work and writes
what it returned (or the caller's words for what it raised) into a pipe; the parent reads the
pipe to its end and reaps the child.  Each caller keeps its own answer's form: the bytes are
theirs to decode.

Invariants: the child never returns into the caller's code (``os._exit`` whatever happens), so
nothing of the parent runs twice; buffered output is flushed before the fork, so none is
written twice; a child an alarm ends (a hung file system, a directory service that does not
answer the account's groups) gives what it wrote, often nothing, and its wait status says
why.  The bound is the parent's too: the child runs as the account, which may stop it
(SIGSTOP; its alarm then stays pending), so past the alarm and :data:`GRACE` the parent kills
it (SIGKILL), reaps it (a child it cannot reap within GRACE more, stuck in the kernel, is
reaped by a later call) and raises TimeoutError; the parent never waits on the account.
Only the standard library is imported.
"""

from __future__ import annotations

import os
import pwd
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping

__all__ = ["GRACE", "LIMIT", "run_as"]

LIMIT = 64 << 20  # bytes of an answer, at most
GRACE = 3.0  # seconds the parent gives a child past its alarm, and again to reap it
_unreaped: list[int] = []  # children killed that could not be reaped in time


def run_as(
    account: pwd.struct_passwd,
    work: Callable[[], bytes],
    failed: Callable[[BaseException], bytes],
    *,
    alarm: int = 0,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    limit: int = LIMIT,
) -> tuple[bytes, int]:
    """``work()`` in a forked child running as ``account`` (its uid, gid and groups): the bytes
    it returned, or ``failed(exc)`` of what it raised, and the child's wait status.

    ``alarm`` (seconds, 0 for none) ends the child by SIGALRM, whatever the caller's own
    SIGALRM disposition or mask; ``env`` replaces the child's whole environment and ``cwd``
    its working folder, after it became the account.  An answer longer than ``limit`` bytes
    (what the account wrote can make it any size) ends the child and raises OverflowError:
    nothing of it is kept.  With an alarm, a child that has not ended ``alarm`` + GRACE
    seconds on (the account stopped it) is killed and TimeoutError raised: nothing of it is
    kept either."""
    _reap_left()
    sys.stdout.flush()
    sys.stderr.flush()
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        data = b""
        try:
            os.close(readable)
            if alarm:
                # Its own disposition and mask: an ignored or blocked SIGALRM survives fork and
                # exec (a wrapper's trap, a supervisor's mask), and would make the alarm nothing.
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
                signal.alarm(alarm)
            # The groups come from the directory service (sssd, LDAP), which can hang: looked
            # up here, under the alarm, never in the caller.
            os.setgroups(os.getgrouplist(account.pw_name, account.pw_gid))
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)  # last: from here on nothing of root's is left
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            if cwd is not None:
                os.chdir(cwd)
            data = work()
        except BaseException as exc:  # noqa: B036 - the child reports everything, then ends
            data = failed(exc)
        finally:
            try:
                left = memoryview(data)
                while left:
                    left = left[os.write(writable, left) :]
            finally:
                os._exit(0)
    os.close(writable)
    deadline = time.monotonic() + alarm + GRACE if alarm else None
    try:
        data = _read(readable, account, alarm, deadline, limit)
        status = _wait(pid, account, alarm, deadline)
    except BaseException:
        _end(pid)
        raise
    finally:
        os.close(readable)
    return data, status


def _read(
    readable: int, account: pwd.struct_passwd, alarm: int, deadline: float | None, limit: int
) -> bytes:
    """The child's answer, read to its end (the child's exit closes the pipe) by
    ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    poll = select.poll()
    poll.register(readable, select.POLLIN)
    while True:
        if deadline is not None and not poll.poll(_left_ms(deadline)):
            raise _late(account, alarm)
        chunk = os.read(readable, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise OverflowError(
                f"the child running as {account.pw_name} answered more "
                f"than {limit} bytes; it was ended, nothing of it kept"
            )
        chunks.append(chunk)


def _wait(pid: int, account: pwd.struct_passwd, alarm: int, deadline: float | None) -> int:
    """The child's wait status, once it has ended, by ``deadline`` (it may close the pipe and
    then be stopped before its exit)."""
    if deadline is None:
        return os.waitpid(pid, 0)[1]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            raise _late(account, alarm)
        time.sleep(0.01)  # the pipe is closed: its exit is a moment away


def _late(account: pwd.struct_passwd, alarm: int) -> TimeoutError:
    return TimeoutError(
        f"the child running as {account.pw_name} gave no answer within "
        f"{alarm + GRACE:g} s (stopped, or hung): ended with SIGKILL, nothing "
        "of it kept"
    )


def _left_ms(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))


def _end(pid: int) -> None:
    """Kill the child (stopped or not: SIGKILL ends a stopped process) and reap it within
    GRACE; one stuck in the kernel (a hung NFS read) is left for a later call to reap."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    until = time.monotonic() + GRACE
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if time.monotonic() >= until:
            _unreaped.append(pid)
            return
        time.sleep(0.01)


def _reap_left() -> None:
    """Reap the children killed earlier that had not ended then."""
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.remove(pid)
