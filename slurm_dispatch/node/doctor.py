"""``dispatch-admin doctor``: run each installed hook part the way Slurm would, say what is broken.

A broken hook is silent by design (it exits 0 and logs to syslog), so a node whose Epilog cannot
run records starts and never an end, and nothing else says so.  The doctor finds the parts the
way Slurm does (``slurm.conf``'s ``Prolog``, ``Epilog``, ``PrologSlurmctld``,
``EpilogSlurmctld``, ``HealthCheckProgram``, ``Include`` files followed, globs expanded), and
for each slurm-dispatch part checks that it is there and executable, that its ``DISPATCH_PYTHON``
has the package and of which version, and then runs it as slurmd (or slurmctld) runs it: its
absolute path, Slurm's environment for that hook and no ``PATH`` (``SLURM_CONF`` for the node's
Prolog and Epilog only: slurmctld gives PrologSlurmctld and EpilogSlurmctld none, slurmd gives
HealthCheckProgram only ``SLURMD_NODENAME``, so a part whose ``DISPATCH_CONF`` is empty finds
dispatch.conf there only at ``/etc/slurm/dispatch.conf``), the working folder ``/``, no
stdin, for a job id no Slurm gives (``doctor-<token>``, uid and gid 0), as root (node parts)
or as slurm.conf's ``SlurmUser`` (the controller's: slurmctld runs PrologSlurmctld and
EpilogSlurmctld as SlurmUser), and looks for the fact it must write under ``StateDir``,
which must then be SlurmUser's own.  Parts that record into different StateDirs (each
reading another dispatch.conf, or none) are named, though each records.  It reads too the
settings of later releases that change what the hooks prove and when a hold lifts
(:meth:`Doctor.check_slurm_settings`).  What it finds is a list of :class:`Check`, each
with the fix when it failed.

Invariants:

* Standard library only (it runs as root on every node); it imports no other side.
* A part is run, never imported; a part that hangs is stopped at its deadline.
* The only files it removes are the facts of its own ``doctor-<token>`` job, and its probe file.
* A broken site is a list of failed checks, never an exception.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

from .. import __version__, _account, _clock, _fsio
from .. import config as config_module
from . import factstore as store
from . import metrics, slurmconf

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
OK, FAIL, WARN = "ok", "FAIL", "warn"
MARK = "slurm_dispatch.hooks"  # what makes a part one of ours
CONTROLLER = "slurmctld"  # the node name controller facts are recorded under (hooks/evidence)
SLURM_USER_DEFAULT = "root"  # slurm.conf(5): SlurmUser's default

# slurm.conf key -> (the hint the part passes, slurmd's SLURM_SCRIPT_CONTEXT, the fact it writes)
HOOK_KEYS = {
    "Prolog": ("prolog", "prolog_slurmd", "start"),
    "Epilog": ("epilog", "epilog_slurmd", "end"),
    "PrologSlurmctld": ("prolog", "prolog_slurmctld", "ctld-start"),
    "EpilogSlurmctld": ("epilog", "epilog_slurmctld", "ctld-end"),
    "HealthCheckProgram": ("recheck", "", ""),
}
NODE_KEYS = ("Prolog", "Epilog", "HealthCheckProgram")
CONTROLLER_KEYS = ("PrologSlurmctld", "EpilogSlurmctld")
SHIPPED = {
    "Prolog": "contrib/prolog.d/05-dispatch",
    "Epilog": "contrib/epilog.d/05-dispatch",
    "PrologSlurmctld": "contrib/prolog.d/05-dispatch",
    "EpilogSlurmctld": "contrib/epilog.d/05-dispatch",
    "HealthCheckProgram": "site-config/dispatch-recheck",
}


class Check:
    """One thing the doctor looked at: ``state`` ok, FAIL or warn, what it saw, and the fix."""

    __slots__ = ("name", "state", "detail", "fix")

    def __init__(self, name: str, state: str, detail: str, fix: str = "") -> None:
        self.name, self.state, self.detail, self.fix = name, state, detail, fix

    def as_json(self) -> dict[str, str]:
        return {"check": self.name, "state": self.state, "detail": self.detail, "fix": self.fix}

    def __repr__(self) -> str:
        return f"Check({self.name!r}, {self.state!r}, {self.detail!r})"


# --------------------------------------------------------------------------------------------
# slurm.conf, as far as the hooks go


# The settings of slurm.conf that change what the hooks can prove (check_slurm_settings).
SETTINGS = (
    "SlurmUser",
    "PrologEpilogTimeout",
    "PrologTimeout",
    "EpilogTimeout",
    "HealthCheckInterval",
    "HealthCheckNodeState",
    "ProctrackType",
)


def read_slurm_conf(
    path: str, keys: tuple[str, ...] = (*HOOK_KEYS, *SETTINGS)
) -> tuple[dict[str, str], list[str]]:
    """``{Key: value}`` of slurm.conf (keys in Slurm's spelling for those the doctor knows,
    ``Include`` files followed relative to the file's folder) and the problems met.  The same
    reader reads cgroup.conf for ``keys`` of its own."""
    return slurmconf.read(path, keys)


def expand_parts(value: str) -> list[str]:
    """The programs a hook setting names: comma-separated (Slurm 23.02 and later), globbed."""
    found: list[str] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        if glob.has_magic(item):
            found += sorted(glob.glob(item))
        else:
            found.append(item)
    return found


def is_ours(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return MARK.encode() in handle.read(1 << 16)
    except OSError:
        return False


def knob(path: str, name: str) -> str | None:
    """A part's ``NAME=value`` knob line, its value as sh reads it (quotes removed: an admin
    may write ``DISPATCH_CONF="/etc/x/dispatch.conf"``; up to a space or a comment; the last
    such line, as sh keeps the last assignment: an admin may set it again below), or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 16)
    except OSError:
        return None
    found = re.findall(rf"^{name}=(.*)$", text, re.M)
    if not found:
        return None
    rest: str = found[-1]
    if not rest or rest[0].isspace():
        return ""  # NAME= then a space: sh gives it the empty value
    try:
        words = shlex.split(rest, comments=True)
    except ValueError:  # an unclosed quote: sh refuses the part; the value as written
        return rest.split()[0]
    return words[0] if words else ""


# --------------------------------------------------------------------------------------------
# The checks


class Doctor:
    """One run of the doctor; :meth:`run` returns the checks in the order they were made."""

    def __init__(
        self,
        slurm_conf: str | None = None,
        config_path: str | None = None,
        node: str | None = None,
        controller: bool = False,
        node_parts: bool = True,
        timeout: float = 60.0,
    ) -> None:
        self.slurm_conf = slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF
        self.config_path = config_path
        self.node = node or os.uname().nodename.split(".")[0]
        self.controller = controller
        self.node_parts = node_parts
        self.timeout = timeout
        self.job_id = f"doctor-{store.new_token()}"
        self.checks: list[Check] = []
        self.versions: dict[str, str] = {}  # part -> version of its Python's package
        self.parts_run: list[tuple[str, str]] = []  # (key, part) whose Python has the package
        # where root's hooks count the runs that found no dispatch.conf (node/metrics.py)
        self.unconfigured_dir = metrics.unconfigured_dir(0)
        self.slurm_user: pwd.struct_passwd | None = None  # the controller parts' user

    def add(self, name: str, state: str, detail: str, fix: str = "") -> Check:
        check = Check(name, state, detail, fix)
        self.checks.append(check)
        return check

    def run(self) -> list[Check]:
        settings, problems = read_slurm_conf(self.slurm_conf)
        if problems:
            self.add(
                "slurm.conf",
                FAIL,
                "; ".join(problems),
                "point --slurm-conf (or $SLURM_CONF) at the slurm.conf slurmd reads",
            )
            return self.checks
        self.add("slurm.conf", OK, self.slurm_conf)
        cfg = self.check_config()
        ctld_ok = True
        if self.controller:
            ctld_ok = self.check_slurm_user(settings)
        if self.node_parts or not self.controller or self.as_root():
            self.check_state_dir(cfg)
        keys = (NODE_KEYS if self.node_parts else ()) + (CONTROLLER_KEYS if self.controller else ())
        parts: list[tuple[str, str]] = []
        for key in keys:
            parts += self.find_parts(key, settings)
        if self.controller and not self.as_root() and self.slurm_user is not None:
            for state_dir in sorted(
                {self.part_config(p, k).state_dir for k, p in parts if k in CONTROLLER_KEYS}
                or {cfg.state_dir}
            ):
                self.check_state_dir(
                    cfg,
                    f"StateDir (SlurmUser {self.slurm_user.pw_name})",
                    state_dir,
                    self.slurm_user,
                )
        started: dict[str, str] = {}
        unread: list[tuple[str, str]] = []  # parts named for the dispatch.conf they miss
        for key, part in parts:
            if key in CONTROLLER_KEYS and not ctld_ok:
                continue
            if not self.check_part_config(key, part, cfg):
                unread.append((key, part))
            if not self.check_python(key, part):
                continue
            if key != "HealthCheckProgram":
                self.run_part(key, part, settings, started)
            else:
                self.run_recheck(part)
        self.check_state_dirs(
            [
                (key, part)
                for key, part in parts
                if (key, part) not in unread
                and (key not in CONTROLLER_KEYS or ctld_ok and self.as_root())
            ],
            cfg,
        )
        self.check_metrics(
            [(key, part) for key, part in parts if key not in CONTROLLER_KEYS or ctld_ok]
        )
        if self.node_parts:
            self.check_slurm_settings(settings, [k for k, _ in parts], cfg)
        self.check_unconfigured_runs()
        self.check_versions()
        self.clean_up(cfg)
        self.check_releases(cfg)
        return self.checks

    def check_config(self) -> config_module.Config:
        environ = {"SLURM_CONF": self.slurm_conf}
        if os.environ.get(config_module.ENV_VAR):
            environ[config_module.ENV_VAR] = os.environ[config_module.ENV_VAR]
        cfg = config_module.load(self.config_path, environ=environ)
        where = cfg.path or config_module.config_path(environ)
        if cfg.problems:
            self.add(
                "dispatch.conf",
                FAIL,
                "; ".join(cfg.problems),
                "correct those lines (the hooks log each and use the default)",
            )
        else:
            self.add(
                "dispatch.conf",
                OK,
                f"{where}: StateDir={cfg.state_dir} HookTimeout={cfg.hook_timeout:g}",
            )
        return cfg

    def as_root(self) -> bool:
        return self.slurm_user is None or self.slurm_user.pw_uid == 0

    def check_slurm_user(self, settings: dict[str, str]) -> bool:
        """The user slurmctld runs PrologSlurmctld and EpilogSlurmctld as: it must exist here."""
        name = settings.get("SlurmUser") or SLURM_USER_DEFAULT
        try:
            self.slurm_user = pwd.getpwnam(name)
        except KeyError:
            try:
                self.slurm_user = pwd.getpwuid(int(name))  # slurm.conf may give a uid
            except (KeyError, ValueError):
                self.add(
                    "SlurmUser",
                    FAIL,
                    f"{self.slurm_conf}: SlurmUser={name} is no user "
                    "on this host: slurmctld runs its hooks as that "
                    "user",
                    "run the doctor with --controller on the "
                    "slurmctld host, where SlurmUser exists",
                )
                return False
        self.add(
            "SlurmUser",
            OK,
            f"{self.slurm_user.pw_name} (uid {self.slurm_user.pw_uid}):"
            " PrologSlurmctld and EpilogSlurmctld run as this user",
        )
        return True

    def check_state_dir(
        self,
        cfg: config_module.Config,
        name: str = "StateDir",
        where: str | None = None,
        account: pwd.struct_passwd | None = None,
    ) -> bool:
        """Whether the hooks can write facts under ``StateDir``: what they require of it (it
        exists, is owned by the user they run as, is writable by nobody else) and a probe file
        created and removed, as ``account`` (root unless given)."""
        where = where or cfg.state_dir
        owner = account.pw_name if account is not None else "root"

        def probe() -> str:
            try:
                fd = store.open_state_dir(where)
            except store.FactError as exc:
                return f"{exc}: the hooks record nothing"
            probe = f".doctor-probe-{store.new_token()}"
            try:
                os.close(_fsio.create_new(probe, 0o600, dir_fd=fd))
                os.unlink(probe, dir_fd=fd)
            except OSError as exc:
                return (
                    f"{where}: cannot create a file there: {exc.strerror}: the hooks record nothing"
                )
            finally:
                os.close(fd)
            return ""

        if account is None:
            fix = (
                f"as root: mkdir -p {where} && chown root: {where} && chmod 0755 {where} "
                "(on a controller whose SlurmUser is not root, owned by SlurmUser); the "
                "same folder on every node, the controller and where dispatch-cease runs"
            )
            why = probe()
        else:
            fix = (
                f"as root: mkdir -p {where} && chown {owner}: {where} && chmod 0755 {where}: "
                f"a StateDir of the controller's own (its parts' DISPATCH_CONF), owned by "
                f"SlurmUser {owner} and collected where dispatch-cease runs (admin guide: "
                "Controllers whose SlurmUser is not root)"
            )
            why = as_account(account, probe)
            if why:
                why = f"as SlurmUser {owner} (uid {account.pw_uid}): {why}"
        if why:
            self.add(
                name,
                FAIL,
                why,
                fix + (" on a writable file system" if "cannot create" in why else ""),
            )
            return False
        uid = account.pw_uid if account is not None else os.geteuid()
        self.add(
            name, OK, f"{where}: writable, owned by uid {uid} ({owner}), not writable by others"
        )
        return True

    def find_parts(self, key: str, settings: dict[str, str]) -> list[tuple[str, str]]:
        value = settings.get(key, "")
        shipped = SHIPPED[key]
        # HealthCheckProgram is optional, and a site's NHC may call dispatch-recheck itself.
        severity = WARN if key == "HealthCheckProgram" else FAIL
        if not value:
            self.add(
                key,
                severity,
                f"{self.slurm_conf} sets no {key}: no slurm-dispatch part runs",
                f"add the {key}= line of site-config/slurm.conf.dispatch to slurm.conf "
                f"and install {shipped} where it points (root, 0755)",
            )
            return []
        named = expand_parts(value)
        ours = [p for p in named if is_ours(p)]
        missing = [p for p in named if not glob.has_magic(p) and not os.path.exists(p)]
        if not ours:
            target = (
                missing[0]
                if missing
                else os.path.join(os.path.dirname(value.split(",")[0]), "05-dispatch")
            )
            what = (
                f"{key}={value}: {', '.join(missing)} is missing"
                if missing
                else f"{key}={value} runs no slurm-dispatch part"
                + (f" ({', '.join(named)})" if named else " (the glob matches nothing)")
            )
            self.add(
                key,
                severity,
                what
                + (
                    ": survivors are re-checked only by the next Epilog"
                    if severity == WARN
                    else ": this node records nothing for that hook"
                ),
                f"install {shipped} as {target} (root, 0755) with DISPATCH_PYTHON set to "
                f"the Python that has slurm-dispatch (this doctor's: {sys.executable})",
            )
            return []
        if len(ours) > 1 and key in ("Prolog", "Epilog"):
            # A copy kept beside the edited part (05-dispatch.orig) runs too: a second start
            # of each execution that no end closes (its folder is never pruned), or a second
            # end tied to no start.
            self.add(
                key,
                WARN,
                f"{key}={value} runs slurm-dispatch twice or more "
                f"({', '.join(ours)}): every execution records its "
                f"{'start' if key == 'Prolog' else 'end'} once per part",
                "keep one part (the one whose DISPATCH_PYTHON is right) and move the "
                f"others out of the folder: {', '.join(ours[1:])}",
            )
        found = []
        for part in ours:
            if not os.access(part, os.X_OK):
                self.add(
                    key,
                    FAIL,
                    f"{part}: not executable: slurmd cannot run it (a failed "
                    f"{key} drains the node)",
                    f"chmod 0755 {part}",
                )
                continue
            self.add(key, OK, part)
            found.append((key, part))
        return found

    def runs_as(self, key: str) -> dict[str, object]:
        """subprocess's user/group/extra_groups for that hook: SlurmUser's for the
        controller's, nothing (root) for the node's."""
        account = self.slurm_user
        if key not in CONTROLLER_KEYS or account is None or account.pw_uid == 0:
            return {}
        return {
            "user": account.pw_uid,
            "group": account.pw_gid,
            "extra_groups": os.getgrouplist(account.pw_name, account.pw_gid),
        }

    def who(self, key: str) -> str:
        return (
            f" as SlurmUser {self.slurm_user.pw_name}"
            if self.runs_as(key) and self.slurm_user is not None
            else ""
        )

    def check_python(self, key: str, part: str) -> bool:
        python = knob(part, "DISPATCH_PYTHON")
        label = f"{key} python"
        fix = (
            f"set DISPATCH_PYTHON= in {part} to the Python that has slurm-dispatch "
            f"(this doctor's: {sys.executable})"
        )
        if not python:
            self.add(label, FAIL, f"{part}: no DISPATCH_PYTHON= line", fix)
            return False
        if not (os.path.isabs(python) and os.path.isfile(python) and os.access(python, os.X_OK)):
            self.add(
                label,
                FAIL,
                f"{part}: DISPATCH_PYTHON={python} is not an executable: the "
                "part records nothing (and says so only to syslog)",
                fix,
            )
            return False
        try:
            proc = subprocess.run(
                [python, "-I", "-c", "import slurm_dispatch; print(slurm_dispatch.__version__)"],
                env={},
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout,
                **self.runs_as(key),
            )  # type: ignore
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.add(
                label,
                FAIL,
                f"{part}: DISPATCH_PYTHON={python} cannot be run{self.who(key)}: {exc}",
                fix
                + (
                    f", one SlurmUser {self.slurm_user.pw_name} may run"
                    if self.who(key) and self.slurm_user
                    else ""
                ),
            )
            return False
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            self.add(
                label,
                FAIL,
                f"{part}: DISPATCH_PYTHON={python} cannot import "
                f"slurm_dispatch{self.who(key)} ({reason}): the part records "
                "nothing (and says so only to syslog)",
                fix,
            )
            return False
        version = proc.stdout.strip()
        self.versions[part] = version
        self.parts_run.append((key, part))
        self.add(label, OK, f"{python}: slurm-dispatch {version}")
        return True

    def environment(self, key: str, settings: dict[str, str]) -> dict[str, str]:
        """The environment slurmd (slurmctld) gives that hook, for the doctor's job."""
        _, context, _ = HOOK_KEYS[key]
        env = {
            "SLURM_SCRIPT_CONTEXT": context,
            "SLURM_JOB_ID": self.job_id,
            "SLURM_JOBID": self.job_id,
            "SLURM_JOB_UID": "0",
            "SLURM_JOB_GID": "0",
            "SLURM_JOB_USER": "root",
            "SLURM_JOB_RESTART_COUNT": "0",
            "SLURM_JOB_NODELIST": self.node,
            "SLURM_JOB_PARTITION": "doctor",
            "SLURM_JOB_NAME": "dispatch-admin-doctor",
        }
        if key in ("Prolog", "Epilog"):
            env["SLURMD_NODENAME"] = self.node
        if key.startswith("Epilog"):
            env.update({"SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_STATE": "COMPLETED"})
        env.update(self.slurm_gives(key))
        return env

    def slurm_gives(self, key: str) -> dict[str, str]:
        """What of the configuration's whereabouts Slurm gives that hook: ``SLURM_CONF`` to the
        node's Prolog and Epilog (slurmd's own slurm.conf), ``SLURMD_NODENAME`` alone to
        HealthCheckProgram, nothing to PrologSlurmctld and EpilogSlurmctld (slurmctld builds
        their environment from the job alone).  Never ``$SLURM_DISPATCH_CONF``: Slurm passes
        no variable of the admin's shell to a hook."""
        if key in ("Prolog", "Epilog"):
            return {"SLURM_CONF": self.slurm_conf}
        if key == "HealthCheckProgram":
            return {"SLURMD_NODENAME": self.node}
        return {}

    def part_config(self, part: str, key: str = "Prolog") -> config_module.Config:
        """dispatch.conf as that part reads it when Slurm runs it for ``key``: its
        DISPATCH_CONF knob, else the search in the environment Slurm gives that hook."""
        named = knob(part, "DISPATCH_CONF")
        return config_module.load(named or None, environ=self.slurm_gives(key))

    def check_part_config(self, key: str, part: str, cfg: config_module.Config) -> bool:
        """A part that finds no dispatch.conf where the doctor found one: it takes the
        defaults (StateDir, HookTimeout, MetricsDir) when Slurm runs it.  False when named."""
        if cfg.path is None or self.part_config(part, key).path is not None:
            return True
        searched = config_module.config_path(self.slurm_gives(key))
        why = (
            "slurmd gives HealthCheckProgram no SLURM_CONF"
            if key == "HealthCheckProgram"
            else f"slurmctld gives {key} no SLURM_CONF"
            if key in CONTROLLER_KEYS
            else f"beside SLURM_CONF={self.slurm_conf}"
        )
        self.add(
            f"{key} config",
            FAIL,
            f"{part}: DISPATCH_CONF is empty and {why}, so it reads {searched}, which does "
            f"not exist: it takes the defaults (StateDir {config_module.DEFAULT_STATE_DIR}),"
            f" not {cfg.path}",
            f"set DISPATCH_CONF={cfg.path} at the top of {part}",
        )
        return False

    def check_state_dirs(self, parts: list[tuple[str, str]], cfg: config_module.Config) -> None:
        """Parts that record into different StateDirs (each reading another dispatch.conf, or
        none): an execution's start, end and re-check are filed apart, and dispatch-cease,
        which reads one StateDir, proves nothing.  Each part records somewhere, so no other
        check fails.  The controller's parts are compared only where they run as root (a
        SlurmUser that is not root has a StateDir of its own, collected by the site)."""
        read: dict[str, dict[str, list[str]]] = {}  # StateDir -> the file read -> hooks
        for key, part in parts:
            found = self.part_config(part, key)
            where = found.path or (
                f"no dispatch.conf at "
                f"{config_module.config_path(self.slurm_gives(key))}: "
                "the defaults"
            )
            read.setdefault(found.state_dir, {}).setdefault(where, []).append(key)
        if len(read) < 2:
            return
        named = [self.part_config(part, key).path for key, part in parts]
        target = cfg.path or next((path for path in named if path), None)
        if target is None:
            return
        wanted = config_module.load(target).state_dir
        wrong = sorted(
            {part for key, part in parts if self.part_config(part, key).state_dir != wanted}
        )
        said = "; ".join(
            f"{state_dir} ("
            + "; ".join(f"{', '.join(keys)}: {where}" for where, keys in files.items())
            + ")"
            for state_dir, files in read.items()
        )
        self.add(
            "StateDirs",
            FAIL,
            f"the parts record into {len(read)} StateDirs, so an execution's start and "
            "end are filed apart and dispatch-cease, which reads one, proves nothing: " + said,
            f"set DISPATCH_CONF={target} at the top of {', '.join(wrong)}",
        )

    def run_part(
        self, key: str, part: str, settings: dict[str, str], started: dict[str, str]
    ) -> None:
        hint, _, kind = HOOK_KEYS[key]
        label = f"{key} runs"
        env = self.environment(key, settings)
        cfg = self.part_config(part, key)
        node = self.node if key in ("Prolog", "Epilog") else CONTROLLER
        deadline = cfg.hook_timeout + 10
        began = time.monotonic()
        try:
            proc = subprocess.run(
                [part],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=deadline,
                **self.runs_as(key),
            )  # type: ignore
        except subprocess.TimeoutExpired:
            self.add(
                label,
                FAIL,
                f"{part}: still running after {deadline:g} s (HookTimeout {cfg.hook_timeout:g} s)",
                "look for a hung StateDir mount",
            )
            return
        except OSError as exc:
            self.add(
                label,
                FAIL,
                f"{part}: Slurm could not run it{self.who(key)}: {exc.strerror}",
                f"check its first line (#!) and mode: chmod 0755 {part}",
            )
            return
        seconds = time.monotonic() - began
        if proc.returncode != 0:
            self.add(
                label,
                FAIL,
                f"{part}: exit {proc.returncode} (Slurm drains the node or fails the job)",
                f"restore {SHIPPED[key]}: a slurm-dispatch part always exits 0",
            )
            return
        facts = self.facts_of(cfg, kind, node, key)
        if facts:
            self.add(
                label,
                OK,
                f"{part}: exit 0 in {seconds:.1f} s{self.who(key)}, recorded "
                f"{cfg.state_dir}/{store.FACTS}/0/{self.job_id}/{facts[-1]}",
            )
            started[node] = facts[-1]
            return
        why = self.hook_complaint(part, hint, env, key)
        self.add(
            label,
            FAIL,
            f"{part}: exit 0 in {seconds:.1f} s but no {kind} fact under "
            f"{cfg.state_dir}" + (f": {why}" if why else ""),
            "fix what the hook says above (its complaints go to syslog, ident "
            "slurm-dispatch, and stderr, which slurmd discards)",
        )

    def hook_complaint(self, part: str, hint: str, env: dict[str, str], key: str) -> str:
        """What the hook says on stderr when run as the part runs it (the part discards it)."""
        python = knob(part, "DISPATCH_PYTHON") or ""
        named = knob(part, "DISPATCH_CONF")
        if named:
            env = {**env, config_module.ENV_VAR: named}
        try:
            proc = subprocess.run(
                [python, "-I", "-c", f"from slurm_dispatch.hooks import run; run({hint!r})"],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout,
                **self.runs_as(key),
            )  # type: ignore
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        lines = [
            line.removeprefix("slurm-dispatch: ")
            for line in proc.stderr.splitlines()
            if line.strip()
        ]
        return "; ".join(lines[-3:])

    def run_recheck(self, part: str) -> None:
        try:
            proc = subprocess.run(
                [part],
                env=self.slurm_gives("HealthCheckProgram"),
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.add(
                "HealthCheckProgram runs",
                FAIL,
                f"{part}: {exc}",
                f"restore {SHIPPED['HealthCheckProgram']} (root, 0755)",
            )
            return
        if proc.returncode != 0:
            self.add(
                "HealthCheckProgram runs",
                FAIL,
                f"{part}: exit {proc.returncode}",
                f"restore {SHIPPED['HealthCheckProgram']}: it always exits 0",
            )
            return
        said = [
            line.removeprefix("slurm-dispatch: ")
            for line in proc.stderr.splitlines()
            if line.strip()
        ]
        if said:
            self.add(
                "HealthCheckProgram runs",
                FAIL,
                f"{part}: exit 0, but it says: {'; '.join(said[-3:])}",
                "fix what it says (its complaints go to syslog, ident slurm-dispatch)",
            )
            return
        self.add("HealthCheckProgram runs", OK, f"{part}: exit 0")

    def facts_of(self, cfg: config_module.Config, kind: str, node: str, key: str = "") -> list[str]:
        """The facts of ``kind`` the doctor's job has from ``node``, listed as the hook's user
        (the hooks' StateDir is that user's own)."""

        def names_of() -> str:
            try:
                return "\n".join(store.list_job(cfg.state_dir, 0, self.job_id))
            except (OSError, store.FactError):
                return ""

        account = self.slurm_user if self.runs_as(key) else None
        names = (as_account(account, names_of) if account is not None else names_of()).split()
        parsed = ((n, store.parse_name(n)) for n in names)
        return sorted(n for n, p in parsed if p is not None and p[0] == kind and p[1] == node)

    def check_metrics(self, parts: list[tuple[str, str]]) -> None:
        """Where a part's dispatch.conf sets MetricsDir, that the hook can count there as the
        user it runs as (root, or SlurmUser for the controller's parts): a hook that cannot
        says so only to syslog, on every run, and records its facts all the same."""
        seen: set[tuple[str, int]] = set()
        for key, part in parts:
            where = self.part_config(part, key).metrics_dir
            account = self.slurm_user if self.runs_as(key) else None
            if not where or (where, account.pw_uid if account else 0) in seen:
                continue
            seen.add((where, account.pw_uid if account else 0))

            def probe(folder: str = where) -> str:
                try:
                    metrics.check_dir(folder)
                except metrics.MetricsError as exc:
                    return str(exc)
                return ""

            name = "MetricsDir" + (f" (SlurmUser {account.pw_name})" if account else "")
            why = as_account(account, probe) if account is not None else probe()
            if not why:
                self.add(name, OK, f"{where}: the hooks{self.who(key)} count there")
                continue
            if account is not None:
                fix = (
                    f"the controller's parts run as SlurmUser {account.pw_name}: give them a "
                    "dispatch.conf of their own (their DISPATCH_CONF) without MetricsDir, or "
                    f"with a folder of SlurmUser's: as root: mkdir -p DIR && chown "
                    f"{account.pw_name}: DIR && chmod 0755 DIR, a second textfile folder "
                    "for node_exporter"
                )
                why = f"as SlurmUser {account.pw_name} (uid {account.pw_uid}): {why}"
            else:
                fix = (
                    f"as root: mkdir -p {where} && chown root: {where} && chmod 0755 "
                    f"{where} (a local folder: node_exporter's --collector.textfile."
                    "directory)"
                )
            self.add(
                name,
                FAIL,
                f"{why}: the hooks' counts are not added (each run says so only to syslog)",
                fix,
            )

    def check_slurm_settings(
        self, settings: dict[str, str], keys: list[str], cfg: config_module.Config
    ) -> None:
        """The slurm.conf (and cgroup.conf) settings of recent releases that change what the
        hooks prove and when a hold lifts: when the re-check runs (HealthCheckInterval,
        HealthCheckNodeState's START_ONLY of 25.11 and REBOOT_ONLY of 26.05), the bound Slurm
        puts on the Prolog and Epilog (PrologEpilogTimeout, split by 25.05 into PrologTimeout
        and EpilogTimeout), and where a job's cgroup is (CgroupRoot, 26.05's CgroupJobIdPaths)."""
        if "HealthCheckProgram" in keys:
            self.check_recheck_schedule(settings)
        for hook, key in (("Prolog", "PrologTimeout"), ("Epilog", "EpilogTimeout")):
            if hook not in keys:
                continue
            named = key if settings.get(key) else "PrologEpilogTimeout"
            value = settings.get(named, "")
            try:
                bound = float(value)
            except ValueError:
                continue  # unset: Slurm puts no bound of its own on the part
            if 0 < bound <= cfg.hook_timeout:
                self.add(
                    key,
                    FAIL,
                    f"{named}={value}: Slurm stops the {hook} at {value} s, "
                    f"before the part's HookTimeout {cfg.hook_timeout:g} s: a "
                    f"{hook} Slurm stops drains the node",
                    f"set {key}= (or PrologEpilogTimeout= before 25.05) well above "
                    f"HookTimeout, e.g. {key}=60, or lower HookTimeout in dispatch.conf",
                )
            else:
                self.add(
                    key,
                    OK,
                    f"{named}={value}: the {hook} part ends (HookTimeout "
                    f"{cfg.hook_timeout:g} s) before Slurm would stop it",
                )
        self.check_cgroup_paths(settings, cfg)

    def check_recheck_schedule(self, settings: dict[str, str]) -> None:
        later = (
            "survivors an Epilog found are re-checked only by the next Epilog on that node, "
            "so a shared-checkpoint hold waiting on them lifts that late or by a person"
        )
        interval = settings.get("HealthCheckInterval", "0").strip() or "0"
        if interval == "0":
            self.add(
                "HealthCheckInterval",
                WARN,
                f"HealthCheckInterval={interval} (Slurm's "
                "default): slurmd never runs "
                f"HealthCheckProgram: {later}",
                "set HealthCheckInterval=60 in slurm.conf (site-config/slurm.conf.dispatch)",
            )
            return
        states = {
            s.strip().upper()
            for s in settings.get("HealthCheckNodeState", "").split(",")
            if s.strip()
        }
        only = {
            "START_ONLY": "only when slurmd starts (25.11)",
            "REBOOT_ONLY": "only after the node reboots (26.05)",
        }
        for state in sorted(states & set(only)):
            self.add(
                "HealthCheckNodeState",
                WARN,
                f"HealthCheckNodeState={settings['HealthCheckNodeState']}: slurmd runs "
                f"HealthCheckProgram {only[state]}, not every {interval} s: {later}",
                "drop START_ONLY/REBOOT_ONLY, or run dispatch-recheck every minute from "
                "NHC or a systemd timer of root's on each node",
            )
            return
        self.add(
            "HealthCheckInterval",
            OK,
            f"HealthCheckInterval={interval}: the re-check runs on schedule",
        )

    def check_cgroup_paths(self, settings: dict[str, str], cfg: config_module.Config) -> None:
        """With proctrack/cgroup, where the Epilog reads a job's cgroup: under dispatch.conf's
        CgroupRoot, which must be cgroup.conf's CgroupMountpoint, by ``job_<id>`` or (26.05's
        cgroup/v2, unless CgroupJobIdPaths=yes) the execution's SLUID, in whatever slice
        (25.11's CgroupSlice) holds slurmstepd's scope."""
        if settings.get("ProctrackType", "").strip() != "proctrack/cgroup":
            return
        cgroup_conf = os.path.join(os.path.dirname(self.slurm_conf), "cgroup.conf")
        values, _ = read_slurm_conf(
            cgroup_conf, ("CgroupJobIdPaths", "CgroupPlugin", "CgroupMountpoint", "CgroupSlice")
        )
        mount = values.get("CgroupMountpoint", "").strip().rstrip("/") or "/sys/fs/cgroup"
        if os.path.normpath(cfg.cgroup_root) != os.path.normpath(mount):
            self.add(
                "CgroupRoot",
                FAIL,
                f"CgroupRoot={cfg.cgroup_root} in dispatch.conf, but {cgroup_conf} mounts "
                f"cgroups at {mount}: the Epilog reads no job's cgroup, and its end says "
                "the proof rests on /proc alone (a survivor that scrubbed its environment "
                "is missed)",
                f"set CgroupRoot={mount} in dispatch.conf",
            )
            return
        by_id = values.get("CgroupJobIdPaths", "").strip().lower() in ("yes", "true", "1")
        self.add(
            "CgroupJobIdPaths",
            OK,
            f"ProctrackType=proctrack/cgroup: the Epilog reads a job's cgroup under "
            f"{mount} by its "
            + (
                "job id (CgroupJobIdPaths=yes)"
                if by_id
                else "SLUID (26.05's cgroup/v2) or job_<id> (earlier releases)"
            )
            + f", in slurmstepd's scope of {values.get('CgroupSlice') or 'any slice'}",
        )

    def check_unconfigured_runs(self, within: float = 86400.0) -> None:
        """The hook runs of the last day on this machine that found no dispatch.conf and no
        StateDir and recorded nothing, as the hooks counted them where no configuration is
        needed: root's under /run, and with --controller SlurmUser's (PrologSlurmctld and
        EpilogSlurmctld, which Slurm gives no SLURM_CONF) under /tmp/slurm-dispatch-<uid>.
        A folder there the hooks cannot count in (another user made it first) is named."""
        self._unconfigured_runs(self.unconfigured_dir, 0, "unconfigured runs", within)
        user = self.slurm_user
        if self.controller and user is not None and user.pw_uid != 0:
            self._unconfigured_runs(
                metrics.unconfigured_dir(user.pw_uid),
                user.pw_uid,
                f"unconfigured runs (SlurmUser {user.pw_name})",
                within,
            )

    def _unconfigured_runs(self, folder: str, uid: int, check: str, within: float) -> None:
        try:
            values = metrics.read(folder, metrics.UNCONFIGURED_FILE, owner=uid)
        except metrics.MetricsError as exc:
            self.add(
                check,
                WARN,
                f"{exc}: the hooks running as uid {uid} cannot count there "
                "the runs that found no dispatch.conf (they log each)",
                f"remove {folder} (the next such hook run makes it, as its own)",
            )
            return
        since = time.time() - within
        recent = []
        for key, count in sorted(values.items()):
            name, _, labels = key.partition("{")
            last = values.get("slurm_dispatch_hook_last_run_timestamp_seconds{" + labels, 0.0)
            if name == metrics.UNCONFIGURED_RUNS and last >= since:
                hook = labels.partition('"')[2].rpartition('"')[0]
                recent.append(f"{hook} {count:g} (the last {_clock.with_zone(last)})")
        if recent:
            self.add(
                check,
                WARN,
                f"{folder}/{metrics.UNCONFIGURED_FILE}: hook runs that found "
                f"no dispatch.conf and recorded nothing: {', '.join(recent)}",
                "set DISPATCH_CONF= in those parts (see the config checks above); the "
                "counts stay, this warning goes a day after the last such run",
            )

    def check_versions(self) -> None:
        found = sorted(set(self.versions.values()))
        if not found:
            return
        if found == [__version__]:
            self.add("versions", OK, f"every part and this doctor: slurm-dispatch {__version__}")
            return
        each = ", ".join(f"{part} {version}" for part, version in sorted(self.versions.items()))
        self.add(
            "versions",
            FAIL,
            f"mixed slurm-dispatch versions: {each}; this doctor {__version__}",
            "install one release everywhere (nodes, controller, login nodes): the same "
            "wheel into each DISPATCH_PYTHON's venv, then run the doctor again",
        )

    def check_releases(self, cfg: config_module.Config, within: float = 86400.0) -> None:
        """The release each node's and the controller's latest fact (of the jobs recorded in
        the last day) was written by: a site where they differ is upgraded in part.  Skipped
        when ``facts/`` cannot be listed or nothing recent has a release recorded."""
        since = time.time() - within
        latest: dict[str, tuple[float, int, str, str]] = {}  # node -> (when, uid, job, name)
        top = os.path.join(cfg.state_dir, store.FACTS)
        try:
            users = [u for u in os.listdir(top) if u.isdigit()]
        except OSError:
            return
        for user in users:
            try:
                jobs = [
                    j
                    for j in os.scandir(os.path.join(top, user))
                    if j.is_dir(follow_symlinks=False)
                    and j.stat(follow_symlinks=False).st_mtime >= since
                ]
                for job in jobs:
                    for name in os.listdir(job.path):
                        parsed = store.parse_name(name)
                        made = store.token_time(parsed[3]) if parsed else None
                        if parsed is None or made is None or job.name == self.job_id:
                            continue
                        if made > latest.get(parsed[1], (0.0,))[0]:
                            latest[parsed[1]] = (made, int(user), job.name, name)
            except OSError:
                continue
        releases: dict[str, str] = {}
        for node, (_, uid, job_id, name) in sorted(latest.items()):
            found, _ = store.read_job_facts(cfg.state_dir, uid, job_id, prefixes=(name,))
            release = found[0].get("release") if found else None
            if isinstance(release, str):
                releases[node] = f"{release} (job {job_id})"
        if not releases:
            return
        distinct = sorted({r.split(" ", 1)[0] for r in releases.values()})
        each = ", ".join(f"{node} {release}" for node, release in releases.items())
        if distinct == [__version__]:
            self.add(
                "releases recorded",
                OK,
                f"the latest fact of each of {len(releases)} node(s) was written by {__version__}",
            )
            return
        self.add(
            "releases recorded",
            FAIL,
            f"the latest facts under {cfg.state_dir} were "
            f"written by different releases: {each}; this "
            f"doctor {__version__}",
            "install one release on every node and the controller (the same wheel into "
            "each DISPATCH_PYTHON's venv); run the doctor on each",
        )

    def clean_up(self, cfg: config_module.Config) -> None:
        """Remove the doctor's own job's facts (facts/0/doctor-<token>/), nothing else, as
        the owner of each StateDir (SlurmUser's is removed as SlurmUser, whose hooks wrote
        it: root never walks a path that account could have turned into a symlink)."""
        for state_dir in {
            cfg.state_dir,
            *(self.part_config(p, k).state_dir for k, p in self.parts_run),
        }:
            folder = os.path.join(state_dir, store.FACTS, "0", self.job_id)

            def remove(folder: str = folder) -> str:
                if os.path.isdir(folder) and not os.path.islink(folder):
                    shutil.rmtree(folder, ignore_errors=True)
                return ""

            try:
                owner = os.lstat(state_dir).st_uid
            except OSError:
                continue
            if owner == os.geteuid():
                remove()
                continue
            try:
                account = pwd.getpwuid(owner)
            except KeyError:
                continue  # no account: its hooks wrote nothing there
            as_account(account, remove)


#: Seconds a probe run as SlurmUser may take: a StateDir on a file system that hangs (its NFS
#: server gone) would otherwise hang the doctor.
PROBE_TIMEOUT = 60


def as_account(account: pwd.struct_passwd, work: Callable[[], str]) -> str:
    """``work()`` in a forked child running as ``account`` (its uid, gid and groups): what it
    returned, or the exception it raised, in words; a child that did not end by itself (its
    alarm after :data:`PROBE_TIMEOUT`, the OOM killer, a crash) says so, so that no words,
    which the checks read as ok, come only from a probe that finished."""

    def failed(exc: BaseException) -> bytes:
        return f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")

    try:
        said, status = _account.run_as(
            account, lambda: work().encode("utf-8", "replace"), failed, alarm=PROBE_TIMEOUT
        )
    except TimeoutError:  # the account stopped the probe: its alarm waits, root does not
        return (
            f"the probe as {account.pw_name} gave no answer within {PROBE_TIMEOUT} s "
            "(stopped, or hung): ended with SIGKILL"
        )
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum == signal.SIGALRM:
            return (
                f"the probe as {account.pw_name} gave no answer within {PROBE_TIMEOUT} s "
                "(a file system that hangs?)"
            )
        return f"the probe as {account.pw_name} was killed by signal {signum}"
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return f"the probe as {account.pw_name} ended with wait status {status}"
    return said.decode("utf-8", "replace")


def diagnose(**options: object) -> list[Check]:
    return Doctor(**options).run()  # type: ignore[arg-type]


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.state == FAIL]


def render(checks: list[Check], node: str, noheader: bool = False) -> str:
    """Lines a person reads: a table in squeue's style (``noheader``: without its header
    line), then each fix."""
    from .._table import render_table

    lines = [
        render_table(
            ("STATE", "CHECK", "DETAIL"), [(c.state, c.name, c.detail) for c in checks], noheader
        )
    ]
    bad = failed(checks)
    for check in [c for c in checks if c.state != OK]:
        lines.append(f"fix {check.name}: {check.fix}")
    lines.append(
        f"{node}: {len(bad)} problem{'s' if len(bad) != 1 else ''} found"
        if bad
        else f"{node}: every check passed"
    )
    return "\n".join(lines)


def iter_json(checks: list[Check]) -> Iterator[dict[str, str]]:
    for check in checks:
        yield check.as_json()
