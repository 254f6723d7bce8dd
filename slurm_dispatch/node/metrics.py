"""Per-node counters for a dashboard: the Prometheus text format, for node_exporter's textfile
collector.

Where ``dispatch.conf`` sets ``MetricsDir`` (off by default), every hook run adds what it did
to ``<MetricsDir>/slurm-dispatch.prom``: its run and outcome, the faults it logged by kind,
the facts it wrote by kind, and the Epilog's and re-check's /proc scans (their seconds and
whether they finished).  node_exporter reads the file as it is at each scrape.

How concurrent hooks on one node never lose a count: a hook holds an exclusive ``flock`` on
``<MetricsDir>/.slurm-dispatch.lock`` while it reads the file, adds its counts, writes the
result to a temporary name and renames it over ``slurm-dispatch.prom`` (the textfile
collector's own rule: a scrape sees the old file or the new one, never half of one; it reads
only ``*.prom``, so the lock and the temporary file are not read).  The counts live in the
file itself, so there is no second copy to drift; a file removed by hand starts the counters
from zero, which Prometheus reads as a counter reset.  A lock is held for a read and a write
of a few hundred bytes; a hook waits at most ``LOCK_WAIT`` for it and then logs that this
run's counts were not added (a lost count is told, never silent), so metrics never hold a
hook near its deadline.  ``flock`` is for a local folder, which node_exporter's is.

Invariants:

* Fail open: a fault here raises :class:`MetricsError` for the caller to log; the hook's own
  work is done before and is never undone or failed by it.
* No symlink is followed: ``MetricsDir`` must be a folder owned by the hook's user (root) and
  writable by nobody else, opened ``O_NOFOLLOW``; every name in it is opened relative to it,
  ``O_NOFOLLOW``, and a planted symlink in place of the file is replaced by the rename, never
  written through.
* Standard library only, and only ``fcntl`` beyond what the hooks load already; nothing at
  all is imported or opened when ``MetricsDir`` is unset.
"""

from __future__ import annotations

import os
import stat
import time

from .. import _fsio
from ..errors import MetricsError

FILE = "slurm-dispatch.prom"
LOCK = ".slurm-dispatch.lock"
LOCK_WAIT = 1.0
MAX_BYTES = 1 << 20

# name -> (type, help), in the order they are written.
FAMILIES = {
    "slurm_dispatch_hook_runs_total": (
        "counter",
        "Hook runs on this node, by hook and outcome (ok: recorded; fault: logged "
        "to syslog, nothing or part recorded).",
    ),
    "slurm_dispatch_hook_faults_total": (
        "counter",
        "Faults the hooks logged on this node, by hook and kind (the error's class).",
    ),
    "slurm_dispatch_hook_last_run_timestamp_seconds": (
        "gauge",
        "When each hook last ran on this node (Unix time).",
    ),
    # Counted in unconfigured_dir(), which needs no dispatch.conf:
    "slurm_dispatch_hook_runs_unconfigured_total": (
        "counter",
        "Hook runs on this node that found no dispatch.conf and no StateDir, by hook "
        "(nothing recorded: set DISPATCH_CONF in the hook part).",
    ),
    "slurm_dispatch_facts_written_total": (
        "counter",
        "Facts the hooks wrote from this node, by kind (start, end, recheck, "
        "ctld-start, ctld-end).",
    ),
    "slurm_dispatch_proc_scan_seconds": (
        "summary",
        "Seconds of the survivor scans over /proc, by hook (epilog, recheck).",
    ),
    "slurm_dispatch_proc_scans_incomplete_total": (
        "counter",
        "Survivor scans that met their deadline with processes not read (not proof "
        "of cessation), by hook.",
    ),
    "slurm_dispatch_survivors_found_total": (
        "counter",
        "Processes of ended jobs found alive by the scans, by hook.",
    ),
    # dispatch-admin metrics, from the users' records (RECORDS_FILE):
    "slurm_dispatch_holds_standing": ("gauge", "Standing shared-checkpoint holds, by user."),
    "slurm_dispatch_holds_expiring": (
        "gauge",
        "Standing holds that expire within HoldWarning, by user.",
    ),
    "slurm_dispatch_cessation_answers_total": (
        "counter",
        "The CessationSignal's answers the records hold, by user and verdict (not "
        "ceased: not proven).",
    ),
    "slurm_dispatch_supervisor_last_pass_timestamp_seconds": (
        "gauge",
        "The supervisor's last good pass (Unix time), by user and cluster.",
    ),
    "slurm_dispatch_supervisor_failed_passes": (
        "gauge",
        "Supervisor passes failed since its last good one, by user and cluster.",
    ),
    "slurm_dispatch_supervisor_interval_seconds": (
        "gauge",
        "Seconds between the supervisor's passes (--loop's interval, else a timer's "
        "minute), by user and cluster.",
    ),
    "slurm_dispatch_jobs_active": (
        "gauge",
        "Jobs (or array tasks) the supervisor still acts for (not finished, not "
        "superseded), by user.",
    ),
    "slurm_dispatch_restarts_total": (
        "counter",
        "Restarts of the users' dispatch jobs the records hold, by user and cause "
        "(preempted, node failure, failed, timeout, out of memory, no progress, by hand, "
        "unknown).",
    ),
    "slurm_dispatch_allocated_seconds_total": (
        "counter",
        "Seconds the ended executions' allocations held, by user.",
    ),
    "slurm_dispatch_lost_seconds_total": (
        "counter",
        "Seconds of those allocations the jobs did not keep (start-up, restore, "
        "work after the save a replacement resumed from), by user.",
    ),
    "slurm_dispatch_steps_redone_total": (
        "counter",
        "Steps replacements did again (from the save they resumed from to the last "
        "step their predecessor published), by user.",
    ),
    "slurm_dispatch_restore_seconds": (
        "summary",
        "Estimated seconds from an execution's start to its first step, by user.",
    ),
    "slurm_dispatch_save_latency_seconds": (
        "summary",
        "Seconds from a save's last write to its publication, by user.",
    ),
    "slurm_dispatch_ceased_after_end_seconds": (
        "summary",
        "Seconds from an execution's end to the proof its processes were gone, by user.",
    ),
    "slurm_dispatch_jobs_stopped_no_progress": (
        "gauge",
        "Jobs (or array tasks) the supervisor stopped restarting for lack of progress "
        "(--max-no-progress), while the stop stands, by user.",
    ),
    "slurm_dispatch_progress_age_seconds": (
        "gauge",
        "The longest a running execution has gone without a publication (since its "
        "start where it has none), by user.",
    ),
    "slurm_dispatch_holds_by_age": (
        "gauge",
        "Standing holds by age (under 1h, 6h, 24h; more), by user.",
    ),
    "slurm_dispatch_hold_next_deadline_timestamp_seconds": (
        "gauge",
        "The soonest deadline of a user's standing holds (Unix time).",
    ),
    "slurm_dispatch_records_unreadable": ("gauge", "1 for a user whose records could not be read."),
    "slurm_dispatch_records_read_timestamp_seconds": (
        "gauge",
        "When dispatch-admin metrics last read the users' records (Unix time).",
    ),
}
RECORDS_FILE = "slurm-dispatch-records.prom"
# Where a hook that found no dispatch.conf (and no StateDir) counts its run: a place that needs
# no configuration (unconfigured_dir()); dispatch-admin doctor reads it.
UNCONFIGURED_FILE = "slurm-dispatch-unconfigured.prom"
UNCONFIGURED_RUNS = "slurm_dispatch_hook_runs_unconfigured_total"


def unconfigured_dir(uid: int | None = None) -> str:
    """The folder of :data:`UNCONFIGURED_FILE` for a hook running as ``uid`` (this process's):
    root's under /run, another user's (a SlurmUser that is not root) under /tmp."""
    uid = os.geteuid() if uid is None else uid
    return "/run/slurm-dispatch" if uid == 0 else f"/tmp/slurm-dispatch-{uid}"


def read(folder: str, name: str, owner: int | None = None) -> dict[str, float]:
    """The series of ``<folder>/<name>``, a file this module wrote for the user ``owner`` (this
    process's by default: root reads a SlurmUser's folder too); {} when there is no folder.  A
    folder the hooks refuse to count in (a symlink, another owner, writable by others: someone
    made it first under /tmp) is MetricsError saying so, never an empty count."""
    try:
        dir_fd = _open_dir(folder, owner)
    except MetricsError:
        if not os.path.lexists(folder):
            return {}
        raise
    try:
        return _read(dir_fd, folder, name, owner)
    finally:
        os.close(dir_fd)


class Tally:
    """What one hook run adds: counters to add and gauges to set, by series."""

    __slots__ = ("added", "gauges")

    def __init__(self) -> None:
        self.added: dict[str, float] = {}
        self.gauges: dict[str, float] = {}

    def add(self, name: str, labels: dict[str, str], value: float = 1) -> None:
        key = series(name, labels)
        self.added[key] = self.added.get(key, 0) + value

    def set(self, name: str, labels: dict[str, str], value: float) -> None:
        self.gauges[series(name, labels)] = value

    def __bool__(self) -> bool:
        return bool(self.added or self.gauges)


#: This process's tally (a hook is one process; the hooks add to it as they go).
TALLY = Tally()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series(name: str, labels: dict[str, str]) -> str:
    """``name{a="x",b="y"}`` with the labels sorted, as the file writes it."""
    if not labels:
        return name
    inner = ",".join(f'{key}="{_label(labels[key])}"' for key in sorted(labels))
    return f"{name}{{{inner}}}"


def parse(text: str) -> dict[str, float]:
    """The series of a file this module wrote: ``{series: value}``.  Lines that do not read as
    ``series value`` are dropped (the next write leaves them out)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        if key.startswith("slurm_dispatch_") and number == number:
            values[key] = number
    return values


def _family(key: str) -> str:
    name = key.partition("{")[0]
    for suffix in ("_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in FAMILIES:
            return name[: -len(suffix)]
    return name


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


def render(values: dict[str, float]) -> str:
    """The exposition text of ``values``: each known family with its HELP and TYPE lines."""
    by_family: dict[str, list[str]] = {}
    for key in values:
        by_family.setdefault(_family(key), []).append(key)
    out = []
    for family in list(FAMILIES) + sorted(set(by_family) - set(FAMILIES)):
        keys = by_family.get(family)
        if not keys:
            continue
        if family in FAMILIES:
            kind, text = FAMILIES[family]
            out.append(f"# HELP {family} {text}")
            out.append(f"# TYPE {family} {kind}")
        out.extend(f"{key} {_number(values[key])}" for key in sorted(keys))
    return "\n".join(out) + "\n"


def _open_dir(metrics_dir: str, owner: int | None = None) -> int:
    """The folder, which must be ``owner``'s (this process's user by default) and writable by
    nobody else."""
    owner = os.geteuid() if owner is None else owner
    try:
        fd = _fsio.open_dir(metrics_dir)
    except OSError as exc:
        raise MetricsError(
            f"cannot open MetricsDir {metrics_dir!r}: {exc.strerror} (a symlink is refused)"
        ) from None
    info = os.fstat(fd)
    if info.st_uid != owner or info.st_mode & 0o022:
        os.close(fd)
        raise MetricsError(
            f"MetricsDir {metrics_dir!r} is owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):04o}; it must be owned by uid "
            f"{owner} and writable by nobody else"
        )
    return fd


def check_dir(metrics_dir: str) -> None:
    """Whether a hook running as this process's user can count in ``metrics_dir``: MetricsError
    saying why not (a symlink, another owner, writable by others, no lock file can be made).
    For ``dispatch-admin doctor``, which asks it as the user each hook runs as."""
    dir_fd = _open_dir(metrics_dir)
    try:
        try:
            os.close(_fsio.create_new(LOCK, 0o600, dir_fd=dir_fd, exclusive=False))
        except OSError as exc:
            raise MetricsError(f"cannot open {metrics_dir}/{LOCK}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)


def _lock(dir_fd: int, metrics_dir: str, wait: float) -> int:
    import fcntl

    try:
        # Made once, then opened again (never through a symlink); flock needs no read access.
        fd = _fsio.create_new(LOCK, 0o600, dir_fd=dir_fd, exclusive=False)
    except OSError as exc:
        raise MetricsError(f"cannot open {metrics_dir}/{LOCK}: {exc.strerror}") from None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise MetricsError(
                    f"{metrics_dir}/{LOCK} still locked after {wait:g} s; this "
                    "run's counts were not added"
                ) from None
            time.sleep(0.002)
        except OSError as exc:
            os.close(fd)
            raise MetricsError(f"cannot lock {metrics_dir}/{LOCK}: {exc.strerror}") from None


def _read(
    dir_fd: int, metrics_dir: str, name: str = FILE, owner: int | None = None
) -> dict[str, float]:
    try:
        fd = _fsio.open_file(name, dir_fd, nonblock=True)
    except FileNotFoundError:
        return {}
    except OSError:
        return {}  # a symlink planted in its place: not read, replaced by the rename
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != (
            os.geteuid() if owner is None else owner
        ):
            return {}
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise MetricsError(f"{metrics_dir}/{name} is larger than {MAX_BYTES} bytes; left as is")
    return parse(data.decode("utf-8", "replace"))


def update(metrics_dir: str, tally: Tally, wait: float = LOCK_WAIT, file: str = FILE) -> None:
    """Add ``tally`` to ``<metrics_dir>/<file>`` (``slurm-dispatch.prom``) under the lock;
    MetricsError on any fault (nothing is half-written: the file is replaced whole or not at
    all)."""
    dir_fd = _open_dir(metrics_dir)
    try:
        lock = _lock(dir_fd, metrics_dir, wait)
        try:
            values = _read(dir_fd, metrics_dir, file)
            for key, value in tally.added.items():
                values[key] = values.get(key, 0) + value
            values.update(tally.gauges)
            _write(dir_fd, metrics_dir, file, values)
        finally:
            os.close(lock)
    finally:
        os.close(dir_fd)


def _write(dir_fd: int, metrics_dir: str, name: str, values: dict[str, float]) -> None:
    """``values`` as ``name`` in the folder, whole: a temporary name renamed over it."""
    try:
        _fsio.replace(name, render(values).encode(), 0o644, dir_fd=dir_fd, sync=False)
    except OSError as exc:
        raise MetricsError(f"cannot write {metrics_dir}/{name}: {exc.strerror}") from None


def replace(metrics_dir: str, values: dict[str, float], name: str = RECORDS_FILE) -> None:
    """Write ``values`` as ``<metrics_dir>/<name>`` whole: for numbers computed afresh each
    time, which nothing else adds to (``dispatch-admin metrics``)."""
    dir_fd = _open_dir(metrics_dir)
    try:
        _write(dir_fd, metrics_dir, name, values)
    finally:
        os.close(dir_fd)
