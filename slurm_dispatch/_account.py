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
why.  Only the standard library is imported.
"""

from __future__ import annotations

import os
import pwd
import signal
import sys
from collections.abc import Callable, Mapping

__all__ = ["LIMIT", "run_as"]

LIMIT = 64 << 20  # bytes of an answer, at most


def run_as(account: pwd.struct_passwd, work: Callable[[], bytes],
           failed: Callable[[BaseException], bytes], *, alarm: int = 0,
           env: Mapping[str, str] | None = None, cwd: str | None = None,
           limit: int = LIMIT) -> tuple[bytes, int]:
    """``work()`` in a forked child running as ``account`` (its uid, gid and groups): the bytes
    it returned, or ``failed(exc)`` of what it raised, and the child's wait status.

    ``alarm`` (seconds, 0 for none) ends the child by SIGALRM, whatever the caller's own
    SIGALRM disposition or mask; ``env`` replaces the child's whole environment and ``cwd``
    its working folder, after it became the account.  An answer longer than ``limit`` bytes
    (what the account wrote can make it any size) ends the child and raises OverflowError:
    nothing of it is kept."""
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
                    left = left[os.write(writable, left):]
            finally:
                os._exit(0)
    os.close(writable)
    chunks = []
    size = 0
    with os.fdopen(readable, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(1 << 16)  # to its end: the child's exit closes it
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise OverflowError(f"the child running as {account.pw_name} answered more "
                                    f"than {limit} bytes; it was ended, nothing of it kept")
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status
