"""Hook entry points for Slurm's Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld.

``run(hint)`` is what the ``contrib/prolog.d`` and ``contrib/epilog.d`` parts call.  Which hook
runs comes from ``SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd``, ``epilog_slurmd``,
``prolog_slurmctld``, ``epilog_slurmctld``); without it, from ``hint`` (``prolog``, ``epilog``,
``recheck``) and whether ``SLURMD_NODENAME`` is set.

Invariants (a hook must never fail a node or a job because of us):

* The process always exits 0.  The work runs in a forked child; the parent waits at most
  ``HookTimeout`` (5 s unless the site says otherwise) and then exits 0 whatever the child does,
  so even a child stuck in uninterruptible sleep on a hung file system cannot hold Slurm.  The
  child also gives up at the same deadline if it can (a timer of its own: it logs and ends).
  The parent never calls syslog itself (a forked process does, not waited for), and a timer
  ends it with status 0 shortly after its deadline whatever it is blocked in.
* Every fault of ours is logged to syslog (facility daemon, ident ``slurm-dispatch``) and to
  stderr (which the parts pass on to Slurm), with the hook and the job id.
* A hook that finds no dispatch.conf and no StateDir at the default (slurm.conf elsewhere,
  and Slurm gives PrologSlurmctld, EpilogSlurmctld and HealthCheckProgram no ``SLURM_CONF``)
  says where it looked (or, where the part's DISPATCH_CONF names a file it cannot read, that
  file and why: not Slurm's environment) and records nothing, and counts the run where no
  configuration is needed: ``slurm_dispatch_hook_runs_unconfigured_total`` in
  ``/run/slurm-dispatch/slurm-dispatch-unconfigured.prom`` (root's; another user's under /tmp).
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
# How long past its deadline the parent may take to kill the child and log, at most.
_GRACE = 0.3
# A run that found no dispatch.conf and no StateDir (see _unconfigured): its fault's name (it is
# counted where no configuration is needed: node/metrics.unconfigured_dir()).
UNCONFIGURED = "Unconfigured"


def log(message: str, error: bool = True, detached: bool = False) -> None:
    """Log to syslog and stderr; never raises.

    ``detached``: syslog from a forked process not waited for, so that a syslog call that
    blocks (a full /dev/log queue, a hung journald) cannot hold the caller."""
    if detached:
        try:
            if os.fork() == 0:
                # Not Slurm's output pipe: slurmd (slurmctld) reads it until every holder ends.
                os.closerange(0, 3)
                _exit_at(time.monotonic() + 5)  # a blocked syslog must not leave it for ever
                _syslog(message, error)
                os._exit(0)
        except Exception:  # noqa: S110 - logging must not fail the hook
            pass
    else:
        _syslog(message, error)
    try:
        sys.stderr.write(f"{IDENT}: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110
        pass


def _syslog(message: str, error: bool) -> None:
    try:
        import syslog

        syslog.openlog(IDENT, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR if error else syslog.LOG_INFO, message)
    except Exception:  # noqa: S110 - logging must not fail the hook
        pass


def _exit_at(deadline: float) -> None:
    """End this process with status 0 at ``deadline`` (monotonic) whatever it is doing then.

    The timer repeats, so a system call that retries after an interruption is interrupted
    again until Python can run the handler.  (Timers are not inherited by a forked child.)"""
    import _signal  # type: ignore[import-not-found]  # not signal: it imports enum (slow start)

    _signal.signal(_signal.SIGALRM, lambda *_: os._exit(0))
    _signal.setitimer(_signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()), 0.05)


def hook_kind(hint: str = "", environ: dict[str, str] | None = None) -> str:
    """The hook to run, from Slurm's script context, else from ``hint``."""
    env = os.environ if environ is None else environ
    context = env.get("SLURM_SCRIPT_CONTEXT", "")
    if context in CONTEXTS:
        return CONTEXTS[context]
    if hint in ("prolog", "epilog") and "SLURMD_NODENAME" not in env and "SLURM_JOB_ID" in env:
        return f"{hint}-slurmctld"
    if hint in HOOKS:
        return hint
    raise ValueError(
        f"cannot tell which hook to run (SLURM_SCRIPT_CONTEXT={context!r}, "
        f"hint {hint!r}); valid hints: {', '.join(HOOKS)}"
    )


def run(hint: str = "", config_path: str | None = None) -> None:
    """Run one hook and end the process with exit status 0, within the hook timeout."""
    from .. import config as config_module

    started = time.monotonic()
    job = os.environ.get("SLURM_JOB_ID", "?")
    _exit_at(started + config_module.DEFAULT_HOOK_TIMEOUT + _GRACE)
    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
    except BaseException as exc:
        log(f"{hint or 'hook'} job {job}: cannot fork ({exc}); recording nothing", detached=True)
        _exit()
    if pid == 0:
        os.close(read_end)
        label = hint or "hook"
        cfg = None
        fault = None
        try:
            cfg = config_module.load(config_path)
            if cfg.hook_timeout != config_module.DEFAULT_HOOK_TIMEOUT:
                # The parent waits the default until told otherwise: no word, no wake-up.
                os.write(write_end, f"{cfg.hook_timeout}\n".encode())
            kind = label = hook_kind(hint)
            for problem in cfg.problems:
                log(f"{kind} job {job}: dispatch.conf: {problem}")
            if _unconfigured(cfg, kind, job):
                fault = UNCONFIGURED
                return
            _start_child_watchdog(started + cfg.hook_timeout, kind, job)
            from . import evidence

            evidence.HANDLERS[kind](cfg)
        except BaseException as exc:
            fault = type(exc).__name__
            log(f"{label} job {job}: {fault}: {exc}")
        finally:
            if cfg is not None and cfg.metrics_dir:
                _count(cfg.metrics_dir, label, fault, job)
            elif fault == UNCONFIGURED:
                _count_unconfigured(label, job)
            _exit()
    os.close(write_end)
    _wait_child(pid, read_end, started, hint, job)
    _exit()


def _unconfigured(cfg: object, kind: str, job: str) -> bool:
    """Whether this hook found no dispatch.conf and no StateDir at the default: then it says
    where it looked and why, and records nothing.  (A site without dispatch.conf whose default
    StateDir exists is configured by the defaults.)  The common cause: slurm.conf is not
    /etc/slurm/slurm.conf, and Slurm gives PrologSlurmctld, EpilogSlurmctld and
    HealthCheckProgram no SLURM_CONF (only the node's Prolog and Epilog get it)."""
    from .. import config as config_module

    if getattr(cfg, "path", None) is not None:
        return False
    state_dir = getattr(cfg, "state_dir", config_module.DEFAULT_STATE_DIR)
    if os.path.isdir(state_dir):
        return False
    from ..node import metrics

    counted = f"(counted in {metrics.unconfigured_dir()}/{metrics.UNCONFIGURED_FILE})"
    named = os.environ.get(config_module.ENV_VAR)
    if named:
        # The part's DISPATCH_CONF was set: the file it names is the fault, not Slurm's
        # environment (a typo, or a file the hook's user may not read).
        problems = [p for p in getattr(cfg, "problems", []) if p.startswith(f"{named}: ")]
        why = (
            problems[0][len(named) + 2 :].split("; using the defaults")[0].split(" (named by")[0]
            if problems
            else "unreadable"
        )
        log(
            f"{kind} job {job}: DISPATCH_CONF ({config_module.ENV_VAR}) names {named}, which "
            f"cannot be read ({why}), and the default StateDir {state_dir} does not exist: "
            "recording nothing; correct DISPATCH_CONF= at the top of this hook part, or let "
            f"the user this hook runs as (uid {os.geteuid()}) read that file {counted}"
        )
        return True
    searched = config_module.config_path()
    given = os.environ.get("SLURM_CONF")
    why = (
        f"beside $SLURM_CONF={given}"
        if given
        else f"Slurm gives {kind} no SLURM_CONF, so beside {config_module.SLURM_CONF_DEFAULT}"
    )
    log(
        f"{kind} job {job}: found no dispatch.conf (looked for {searched}: {why}) and the "
        f"default StateDir {state_dir} does not exist: recording nothing; set DISPATCH_CONF= "
        f"at the top of this hook part to the site's dispatch.conf {counted}"
    )
    return True


def _count_unconfigured(hook: str, job: str) -> None:
    """Count an unconfigured run in metrics.unconfigured_dir() (made 0755 if missing; one
    another user made, or a symlink, is refused by the metrics module and logged)."""
    from ..node import metrics

    folder = metrics.unconfigured_dir()
    try:
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            pass
        tally = metrics.Tally()
        tally.add("slurm_dispatch_hook_runs_unconfigured_total", {"hook": hook})
        tally.set("slurm_dispatch_hook_last_run_timestamp_seconds", {"hook": hook}, time.time())
        metrics.update(folder, tally, file=metrics.UNCONFIGURED_FILE)
    except BaseException as exc:
        log(f"{hook} job {job}: not counted in {folder}: {type(exc).__name__}: {exc}")


def _count(metrics_dir: str, hook: str, fault: str | None, job: str) -> None:
    """Add this run to the node's metrics (MetricsDir); a fault here is logged, never raised."""
    try:
        from ..node import metrics

        tally = metrics.TALLY
        tally.add(
            "slurm_dispatch_hook_runs_total",
            {"hook": hook, "outcome": "ok" if fault is None else "fault"},
        )
        if fault is not None:
            tally.add("slurm_dispatch_hook_faults_total", {"hook": hook, "kind": fault})
        tally.set("slurm_dispatch_hook_last_run_timestamp_seconds", {"hook": hook}, time.time())
        written = sys.modules.get("slurm_dispatch.node.factstore")
        for kind, count in sorted(getattr(written, "WRITTEN", {}).items()):
            tally.add("slurm_dispatch_facts_written_total", {"kind": kind}, count)
        evidence = sys.modules.get("slurm_dispatch.hooks.evidence")
        for scanned, seconds, complete, survivors in getattr(evidence, "SCANS", ()):
            labels = {"hook": scanned}
            tally.add("slurm_dispatch_proc_scan_seconds_sum", labels, seconds)
            tally.add("slurm_dispatch_proc_scan_seconds_count", labels)
            tally.add("slurm_dispatch_proc_scans_incomplete_total", labels, 0 if complete else 1)
            tally.add("slurm_dispatch_survivors_found_total", labels, survivors)
        metrics.update(metrics_dir, tally)
    except BaseException as exc:
        log(f"{hook} job {job}: metrics not updated: {type(exc).__name__}: {exc}")


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
            try:
                os.kill(pid, 9)
            except OSError:
                pass
            log(
                f"{hint or 'hook'} job {job}: gave up after {time.monotonic() - started:.1f} s "
                "(HookTimeout); the node and the job go on, this execution has no record",
                detached=True,
            )
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
            _exit_at(deadline + _GRACE)


def _start_child_watchdog(deadline: float, kind: str, job: str) -> None:
    """Log and end the child at ``deadline``: a timer, not a thread (a thread costs every run
    its start and a handover of the interpreter's lock).  A child stuck where no signal reaches
    it (uninterruptible sleep) is the parent's to end at the same deadline."""
    import _signal  # type: ignore[import-not-found]  # not signal: it imports enum

    def watchdog(*_: object) -> None:
        log(f"{kind} job {job}: still running at HookTimeout; stopped")
        _exit()

    _signal.signal(_signal.SIGALRM, watchdog)
    _signal.setitimer(_signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
