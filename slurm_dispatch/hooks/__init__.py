"""Hook entry points for Slurm's Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld.

``run(hint)`` is what the ``contrib/prolog.d`` and ``contrib/epilog.d`` parts call.  Which hook
runs comes from ``SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd``, ``epilog_slurmd``,
``prolog_slurmctld``, ``epilog_slurmctld``); without it, from ``hint`` (``prolog``, ``epilog``,
``recheck``) and whether ``SLURMD_NODENAME`` is set.

Invariants (a hook must never fail a node or a job because of us):

* The process always exits 0.  The work runs in a forked child; the parent waits at most
  ``HookTimeout`` (5 s unless the site says otherwise) and then exits 0 whatever the child does,
  so even a child stuck in uninterruptible sleep on a hung file system cannot hold Slurm.  The
  child also gives up at the same deadline if it can.
* Every fault of ours is logged to syslog (facility daemon, ident ``slurm-dispatch``) and to
  stderr, with the hook and the job id.
* Only the standard library is imported, no Slurm command is run, PATH is never used.
"""

from __future__ import annotations

import os
import sys
import time

IDENT = "slurm-dispatch"
CONTEXTS = {
    "prolog_slurmd": "prolog",
    "epilog_slurmd": "epilog",
    "prolog_slurmctld": "prolog-slurmctld",
    "epilog_slurmctld": "epilog-slurmctld",
}
HOOKS = ("prolog", "epilog", "prolog-slurmctld", "epilog-slurmctld", "recheck")


def log(message: str, error: bool = True) -> None:
    """Log to syslog and stderr; never raises."""
    try:
        import syslog
        syslog.openlog(IDENT, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR if error else syslog.LOG_INFO, message)
    except Exception:  # noqa: S110 - logging must not fail the hook
        pass
    try:
        sys.stderr.write(f"{IDENT}: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110
        pass


def hook_kind(hint: str = "", environ: dict[str, str] | None = None) -> str:
    """The hook to run, from Slurm's script context, else from ``hint``."""
    env = os.environ if environ is None else environ
    context = env.get("SLURM_SCRIPT_CONTEXT", "")
    if context in CONTEXTS:
        return CONTEXTS[context]
    if hint in ("prolog", "epilog") and "SLURMD_NODENAME" not in env \
            and "SLURM_JOB_ID" in env:
        return f"{hint}-slurmctld"
    if hint in HOOKS:
        return hint
    raise ValueError(f"cannot tell which hook to run (SLURM_SCRIPT_CONTEXT={context!r}, "
                     f"hint {hint!r}); valid hints: {', '.join(HOOKS)}")


def run(hint: str = "", config_path: str | None = None) -> None:
    """Run one hook and end the process with exit status 0, within the hook timeout."""
    from .. import config as config_module
    started = time.monotonic()
    job = os.environ.get("SLURM_JOB_ID", "?")
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
    except BaseException as exc:
        log(f"{hint or 'hook'} job {job}: cannot fork ({exc}); recording nothing")
        _exit()
    if pid == 0:
        os.close(read_end)
        label = hint or "hook"
        try:
            cfg = config_module.load(config_path)
            os.write(write_end, f"{cfg.hook_timeout}\n".encode())
            kind = label = hook_kind(hint)
            for problem in cfg.problems:
                log(f"{kind} job {job}: dispatch.conf: {problem}")
            _start_child_watchdog(started + cfg.hook_timeout, kind, job)
            from . import work
            work.HANDLERS[kind](cfg)
        except BaseException as exc:
            log(f"{label} job {job}: {type(exc).__name__}: {exc}")
        finally:
            _exit()
    os.close(write_end)
    _wait_child(pid, read_end, started, hint, job)
    _exit()


def _exit() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: S110
            pass
    os._exit(0)


def _wait_child(pid: int, read_end: int, started: float, hint: str, job: str) -> None:
    import select

    from ..config import DEFAULT_HOOK_TIMEOUT
    # Until the child has read the site's HookTimeout, the default applies.
    deadline = started + DEFAULT_HOOK_TIMEOUT
    buffered = b""
    told = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log(f"{hint or 'hook'} job {job}: gave up after {time.monotonic() - started:.1f} s "
                "(HookTimeout); the node and the job go on, this execution has no record")
            try:
                os.kill(pid, 9)
            except OSError:
                pass
            return
        try:
            ready, _, _ = select.select([read_end], [], [], remaining)
        except InterruptedError:
            continue
        if not ready:
            continue
        data = os.read(read_end, 64)
        if not data:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            return
        if told:
            continue
        buffered += data
        if b"\n" in buffered:
            told = True
            try:
                deadline = started + float(buffered.split(b"\n", 1)[0])
            except ValueError:
                pass


def _start_child_watchdog(deadline: float, kind: str, job: str) -> None:
    import _thread

    def watchdog() -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))
        log(f"{kind} job {job}: still running at HookTimeout; stopped")
        _exit()

    _thread.start_new_thread(watchdog, ())
