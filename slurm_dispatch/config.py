"""Site configuration: ``dispatch.conf`` in Slurm's own ``Key=Value`` style.

One search path and one override: the file named by ``$SLURM_DISPATCH_CONF`` if that is set,
else ``dispatch.conf`` in the folder of ``slurm.conf``, found the way Slurm finds its own
``cgroup.conf`` or ``gres.conf``: beside ``$SLURM_CONF`` if set, else ``/etc/slurm/dispatch.conf``.
A missing default file means safe defaults.

Invariants:

* :func:`load` never raises.  Every problem (an unreadable file, an unknown key, a bad value,
  a key given twice) is collected in :attr:`Config.problems` as a message naming the key, the
  value, the file and the line, and what stands instead; a bad value leaves its key's default.
  Every value is judged, a key given again too (its first line's value stands, as the
  problem says), and an unknown key close to a known one is answered with the key meant
  (``did you mean HookTimeout?``), as every command-line typo is.  Hooks log the problems and
  go on with the defaults; the ``dispatch`` commands turn them into an error.
* This module imports only the standard library and nothing else of the package, so node hooks
  can load it cheaply (no ``typing``, ``re`` or ``dataclasses`` at run time).

File syntax (as ``slurm.conf``): one ``Key=Value`` per line (lines end at a newline alone);
keys are case-insensitive; ``#`` starts a comment (``\\#`` is a literal ``#``); blank lines
are ignored; a value may be wrapped in double quotes.  Durations are seconds (``86400``),
``MM:SS``, ``HH:MM:SS`` or ``D-HH[:MM[:SS]]`` (``1-00:00:00``).
"""

from __future__ import annotations

import os

ENV_VAR = "SLURM_DISPATCH_CONF"
SLURM_CONF_DEFAULT = "/etc/slurm/slurm.conf"
MAX_BYTES = 1 << 20

DEFAULT_STATE_DIR = "/var/lib/slurm-dispatch"
DEFAULT_HOOK_TIMEOUT = 5.0
DEFAULT_BOOT_TIME_TOLERANCE = 5.0
DEFAULT_SHARED_HOLD_FOR = 86400.0
DEFAULT_CESSATION_SIGNAL = "dispatch-cease"
DEFAULT_CESSATION_INTERVAL = 60.0
# Where the Epilog looks for the job's cgroup (proctrack/cgroup): cgroup.conf's CgroupMountpoint.
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_HOLD_NOTIFY = ""  # no site command: holds are told through Slurm's MailProg only
DEFAULT_HOLD_WARNING = 7200.0  # a hold's owner is warned this long before it expires
DEFAULT_STORE_TIMEOUT = 60.0  # a remote store's call or scan that takes longer: an error
DEFAULT_STAGE_DIR = ""  # remote roots' local staging folder: empty means $TMPDIR, else /tmp
# How old a node's view of a checkpoint root's listings may be (NFS caches directory contents
# and lookups for up to acdirmax, 60 s by default; some S3 implementations list late).
DEFAULT_LISTING_LAG = 60.0
# How the commands reach Slurm: pyslurm where it matches the running Slurm, else its tools.
DEFAULT_SLURM_BACKEND = "auto"
SLURM_BACKENDS = ("auto", "cli", "pyslurm")
# node_exporter's textfile collector folder the hooks keep their counters in: empty is off.
DEFAULT_METRICS_DIR = ""
# How long facts/ keeps a job's facts once nothing needs them (dispatch-admin prune): None is
# unset, and the command then asks for --older-than.
DEFAULT_FACT_RETENTION = None
# The group whose members read the site's view of every user's holds (dispatch-admin holds)
# from the snapshot root's release service writes: empty is root only.
DEFAULT_SITE_VIEW_GROUP = ""
# How long a settled record stays in its user's home once nothing acts on it (dispatch-admin
# prune forgets it after that, by dispatch forget's rules): None is off.
DEFAULT_RECORD_RETENTION = None

# AvoidBadNodes: a job's failed executions on a node before its next ones avoid the node (a
# node failure avoids it at once), for jobs that give no --avoid-bad-nodes; 0 is off.
DEFAULT_AVOID_BAD_NODES = 0
# StallTimeout: seconds without progress before an execution of a job that gives no
# --stall-timeout is asked to save and ended (execution/stall.py); 0 is off.
DEFAULT_STALL_TIMEOUT = 0

# Hooks must finish well under Slurm's MessageTimeout (10 s by default).
MAX_HOOK_TIMEOUT = 60.0


class Config:
    """The site settings, each with its default; ``problems`` lists what was wrong in the file."""

    __slots__ = (
        "path",
        "state_dir",
        "hook_timeout",
        "boot_time_tolerance",
        "shared_hold_for",
        "cessation_signal",
        "cessation_interval",
        "hold_notify",
        "hold_warning",
        "cgroup_root",
        "store_timeout",
        "stage_dir",
        "slurm_backend",
        "listing_lag",
        "metrics_dir",
        "fact_retention",
        "site_view_group",
        "record_retention",
        "avoid_bad_nodes",
        "stall_timeout",
        "problems",
    )

    def __init__(self) -> None:
        self.path: str | None = None  # the file read, None when none was
        self.state_dir = DEFAULT_STATE_DIR
        self.hook_timeout = DEFAULT_HOOK_TIMEOUT
        self.boot_time_tolerance = DEFAULT_BOOT_TIME_TOLERANCE
        self.shared_hold_for = DEFAULT_SHARED_HOLD_FOR
        self.cessation_signal = DEFAULT_CESSATION_SIGNAL
        self.cessation_interval = DEFAULT_CESSATION_INTERVAL
        self.hold_notify = DEFAULT_HOLD_NOTIFY
        self.hold_warning = DEFAULT_HOLD_WARNING
        self.cgroup_root = DEFAULT_CGROUP_ROOT
        self.store_timeout = DEFAULT_STORE_TIMEOUT
        self.stage_dir = DEFAULT_STAGE_DIR
        self.slurm_backend = DEFAULT_SLURM_BACKEND
        self.listing_lag = DEFAULT_LISTING_LAG
        self.metrics_dir = DEFAULT_METRICS_DIR
        self.fact_retention: float | None = DEFAULT_FACT_RETENTION
        self.site_view_group = DEFAULT_SITE_VIEW_GROUP
        self.record_retention: float | None = DEFAULT_RECORD_RETENTION
        self.avoid_bad_nodes = DEFAULT_AVOID_BAD_NODES
        self.stall_timeout = DEFAULT_STALL_TIMEOUT
        self.problems: list[str] = []

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"Config({self.as_dict()!r})"


def parse_duration(text: str) -> float:
    """Seconds in a Slurm-like duration: ``S``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``.

    A plain number is seconds (as ``KillWait`` and ``MessageTimeout`` are in slurm.conf) and may
    have a fraction.  Raises ValueError naming the text.
    """
    value = text.strip()
    bad = ValueError(f"{text!r} is not a duration (seconds, MM:SS, HH:MM:SS or D-HH:MM:SS)")
    if not value:
        raise bad
    days = 0
    if "-" in value:
        head, _, value = value.partition("-")
        if not head.isdigit() or not value:
            raise bad
        days = int(head)
        parts = value.split(":")
        if len(parts) > 3 or not all(p.isdigit() for p in parts):
            raise bad
        parts += ["0"] * (3 - len(parts))
        hours, minutes, seconds = (int(p) for p in parts)
    elif ":" in value:
        parts = value.split(":")
        if len(parts) > 3 or not all(p.isdigit() for p in parts):
            raise bad
        if len(parts) == 2:
            parts.insert(0, "0")
        hours, minutes, seconds = (int(p) for p in parts)
    else:
        try:
            number = float(value)
        except ValueError:
            raise bad from None
        if not number >= 0 or number == float("inf"):
            raise bad
        return number
    if minutes >= 60 or seconds >= 60 or (days and hours >= 24):
        raise bad
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _state_dir(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path")
    if "\0" in value:
        raise ValueError("a path cannot contain NUL")
    return os.path.normpath(value)


def _optional_dir(value: str) -> str:
    return _state_dir(value) if value else ""


def _hook_timeout(value: str) -> float:
    seconds = parse_duration(value)
    if not 0.1 <= seconds <= MAX_HOOK_TIMEOUT:
        raise ValueError(f"{value!r} is outside 0.1 to {MAX_HOOK_TIMEOUT:g} seconds")
    return seconds


def _positive_duration(value: str) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r} must be more than 0 seconds")
    return seconds


def _lag(value: str) -> float:
    seconds = parse_duration(value)
    if not 0 <= seconds <= 3600:
        raise ValueError(f"{value!r} is outside 0 to 3600 seconds")
    return seconds


def _group(value: str) -> str:
    name = value.strip()
    if any(c.isspace() or c in ":/," for c in name) or name.startswith("-"):
        raise ValueError(f"{value!r} is not a group name")
    return name


def _failures(value: str) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) > 999:
        raise ValueError(f"{value!r} is not a number of failed executions 0 to 999 (0 is off)")
    return int(text)


def _stall_timeout(value: str) -> int:
    seconds = parse_duration(value)
    if seconds != int(seconds) or not 0 <= seconds <= 7 * 24 * 3600:
        raise ValueError(f"{value!r} is not a whole number of seconds 0 to a week (0 is off)")
    return int(seconds)


def _command(value: str) -> str:
    return value.strip()


def slurm_backend(value: str) -> str:
    """``auto``, ``cli`` or ``pyslurm`` (any case); ValueError naming the value otherwise."""
    name = value.strip().lower()
    if name not in SLURM_BACKENDS:
        raise ValueError(f"{value!r} is not one of {', '.join(SLURM_BACKENDS)}")
    return name


# Key (lower case) -> (spelling, attribute, converter).
_KEYS = {
    "statedir": ("StateDir", "state_dir", _state_dir),
    "hooktimeout": ("HookTimeout", "hook_timeout", _hook_timeout),
    "boottimetolerance": ("BootTimeTolerance", "boot_time_tolerance", parse_duration),
    "sharedholdfor": ("SharedHoldFor", "shared_hold_for", _positive_duration),
    "cessationsignal": ("CessationSignal", "cessation_signal", _command),
    "cessationinterval": ("CessationInterval", "cessation_interval", _positive_duration),
    # HoldNotify=/path/cmd: run as `cmd made|expiring DISPATCH_JOB SLURM_JOB DEADLINE USER`.
    "holdnotify": ("HoldNotify", "hold_notify", _command),
    "holdwarning": ("HoldWarning", "hold_warning", parse_duration),
    "cgrouproot": ("CgroupRoot", "cgroup_root", _state_dir),
    "storetimeout": ("StoreTimeout", "store_timeout", _positive_duration),
    # StageDir=/local/scratch: where the launcher makes a remote root's local staging folder.
    "stagedir": ("StageDir", "stage_dir", _state_dir),
    # SlurmBackend=auto|cli|pyslurm ($DISPATCH_SLURM_BACKEND overrides it): see slurm/select.py.
    "slurmbackend": ("SlurmBackend", "slurm_backend", slurm_backend),
    # ListingLag=60: how stale a node's view of pub/ and exec/ may be; cleanup waits twice
    # that between removing publications and reading the executions' choices again.
    "listinglag": ("ListingLag", "listing_lag", _lag),
    # MetricsDir=/var/lib/node_exporter/textfile: the hooks' counters (node/metrics.py).
    "metricsdir": ("MetricsDir", "metrics_dir", _optional_dir),
    # FactRetention=30-00:00:00: dispatch-admin prune removes facts nothing needs after that.
    "factretention": ("FactRetention", "fact_retention", _positive_duration),
    # SiteViewGroup=slurm-admins: its members read dispatch-admin holds (the release service's
    # snapshot under StateDir/siteview); control/siteview.py.
    "siteviewgroup": ("SiteViewGroup", "site_view_group", _group),
    # RecordRetention=90-00:00:00: dispatch-admin prune forgets users' settled records after it.
    "recordretention": ("RecordRetention", "record_retention", _positive_duration),
    # AvoidBadNodes=2: jobs without --avoid-bad-nodes avoid a node after that many of their
    # executions failed on it, or one ended by its failure (control/badnodes.py); 0 is off.
    "avoidbadnodes": ("AvoidBadNodes", "avoid_bad_nodes", _failures),
    # StallTimeout=30:00: jobs without --stall-timeout are asked to save and ended after that
    # long without progress (execution/stall.py); 0 is off.
    "stalltimeout": ("StallTimeout", "stall_timeout", _stall_timeout),
}
KEYS = tuple(spelling for spelling, _, _ in _KEYS.values())


def refusal(config: Config, named_by: str = "") -> str:
    """The problems of ``config`` as one error for a command that stops on them: without the
    "using the default(s)" a hook goes on with; ``named_by`` (``--config``) says who named a
    file given as an argument."""
    said = [_without_fallback(p) for p in config.problems]
    if named_by:
        said = [p.replace("(named by the caller)", f"(named by {named_by})") for p in said]
    return "; ".join(said)


def _without_fallback(problem: str) -> str:
    """``problem`` without what a hook goes on with (the default, or an earlier line's value
    that stands): a command stops on it."""
    problem = problem.split("; using the default")[0]
    if problem.endswith(" stands") and "; line " in problem:
        problem = problem[: problem.rindex("; line ")]
    return problem


def config_path(environ: dict[str, str] | None = None) -> str:
    """The file to read: ``$SLURM_DISPATCH_CONF`` if set and not empty, else dispatch.conf
    beside slurm.conf (``$SLURM_CONF``, else /etc/slurm/slurm.conf)."""
    env = os.environ if environ is None else environ
    override = env.get(ENV_VAR)
    if override:
        return override
    slurm_conf = env.get("SLURM_CONF") or SLURM_CONF_DEFAULT
    return os.path.join(os.path.dirname(slurm_conf) or ".", "dispatch.conf")


def _strip_comment(line: str) -> str:
    out = []
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\" and i + 1 < len(line) and line[i + 1] == "#":
            out.append("#")
            i += 2
            continue
        if char == "#":
            break
        out.append(char)
        i += 1
    return "".join(out).strip()


def parse(text: str, path: str = "<text>") -> Config:
    """Parse the text of a dispatch.conf; never raises (see :attr:`Config.problems`)."""
    config = Config()
    config.path = path
    seen: dict[str, int] = {}
    # Lines end at '\n' alone, as Slurm's parser and an editor count them (splitlines() also
    # splits at a page break, ^L, and made every later problem name the wrong line).
    for number, raw in enumerate(text.split("\n"), 1):
        line = _strip_comment(raw)
        if not line:
            continue
        where = f"{path}:{number}"
        key, sep, value = line.partition("=")
        key = key.strip()
        value = value.strip()
        if not sep or not key:
            config.problems.append(f"{where}: {line!r} is not Key=Value")
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        entry = _KEYS.get(key.lower())
        if entry is None:
            config.problems.append(
                f"{where}: unknown key {key!r} (value {value!r}); " + _meant(key)
            )
            continue
        spelling, attribute, convert = entry
        first = seen.get(key.lower())
        standing = (
            f"using the default {getattr(config, attribute)!r}"
            if first is None or first < 0
            else f"line {first}'s value {getattr(config, attribute)!r} stands"
        )
        try:
            converted = convert(value)
        except ValueError as exc:
            config.problems.append(f"{where}: bad value for {spelling}: {exc}; {standing}")
            seen.setdefault(key.lower(), -number)  # negative: its value was bad
            continue
        if first is not None:
            config.problems.append(
                f"{where}: {spelling} given again (first on line "
                f"{abs(first)}" + (", whose value is bad" if first < 0 else "") + f"); {standing}"
            )
            continue
        seen[key.lower()] = number
        setattr(config, attribute, converted)
    return config


def _meant(key: str) -> str:
    """The known key ``key`` is a typo of, or every key where it is like none."""
    import difflib  # only on this path: a hook reading a good file never loads it

    simple = key.lower().replace("_", "").replace("-", "")
    close = difflib.get_close_matches(simple, list(_KEYS), n=1, cutoff=0.7)
    if close:
        return f"did you mean {_KEYS[close[0]][0]}?"
    return f"valid keys are {', '.join(KEYS)}"


def load(path: str | None = None, environ: dict[str, str] | None = None) -> Config:
    """Read the site configuration; never raises.

    ``path`` overrides the search (for tests and ``--config`` options).  A missing file at the
    default place gives the defaults with no problem; a missing file that was named explicitly
    (argument or ``$SLURM_DISPATCH_CONF``) is a problem.
    """
    explicit = path is not None or bool((os.environ if environ is None else environ).get(ENV_VAR))
    chosen = path if path is not None else config_path(environ)
    try:
        # O_NONBLOCK: a FIFO planted in place of the file must not hang us on open.
        fd = os.open(chosen, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        config = Config()
        if explicit:
            config.problems.append(
                f"{chosen}: no such file (named by "
                f"{'$' + ENV_VAR if path is None else 'the caller'}); "
                "using the defaults"
            )
        return config
    except OSError as exc:
        config = Config()
        config.problems.append(f"{chosen}: cannot open: {exc.strerror}; using the defaults")
        return config
    try:
        import stat

        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            config = Config()
            config.problems.append(f"{chosen}: not a regular file; using the defaults")
            return config
        os.set_blocking(fd, True)
        data = os.read(fd, MAX_BYTES + 1)
        chunks = [data]
        while data and sum(len(c) for c in chunks) <= MAX_BYTES:
            data = os.read(fd, MAX_BYTES + 1)
            chunks.append(data)
        raw = b"".join(chunks)
    except OSError as exc:
        config = Config()
        config.problems.append(f"{chosen}: cannot read: {exc.strerror}; using the defaults")
        return config
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        config = Config()
        config.problems.append(f"{chosen}: larger than {MAX_BYTES} bytes; using the defaults")
        return config
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        config = Config()
        config.problems.append(
            f"{chosen}: not UTF-8 ({exc.reason} at byte {exc.start}); using the defaults"
        )
        return config
    return parse(text, chosen)
