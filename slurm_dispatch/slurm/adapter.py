"""The one adapter between slurm-dispatch and Slurm: the reads that give the typed views of
jobs and nodes (:mod:`.jobs`, with the one job-state vocabulary), and the few actions dispatch
takes (submit, hold, release, cancel).

:class:`Slurm` holds the retries, the timeouts and the choice of backend, nothing else: each
read or action is one try of a backend (:class:`.backend.Backend`: :class:`.cli_backend.
CliBackend`, which owns every argv and the parsing of what the tools print, or
:class:`.pyslurm_backend.PyslurmBackend`) inside one retry loop.  Every command is a list argv
with a timeout.  Transient controller errors (the controller not answering, a socket timeout,
"try again") are retried with tenacity; ``sbatch`` is not idempotent, so after a timed-out or
transient ``sbatch`` the adapter first looks for the job by its marker among the caller's own
jobs before it submits again.

Invariants:

* **Nobody else parses Slurm's output**, and no module outside this package runs Slurm's
  tools or imports pyslurm (``tests/house/test_slurm_boundary.py``).
* **The controller's cost follows the caller's jobs.**  :meth:`Slurm.own_jobs` asks for the
  caller's jobs only, and :meth:`Slurm.jobs` for one job id.
* **One vocabulary for states**, kept in :mod:`.jobs`.

By default (``SlurmBackend=auto``, see :mod:`.select`) the reads (the caller's jobs, one job or
array, nodes) and the actions (hold, release, requeue, cancel, set comment) go through pyslurm
where it is installed, matches the running Slurm's major release and loads its configuration;
otherwise through the command-line tools, which work on every Slurm.  The choice is made at the
first read or action, never when the adapter is made (``dispatch-sbatch`` submits without it).
Submission is always ``sbatch`` itself: the site's ``cli_filter`` plugins, ``SBATCH_*``
variables and grammar apply; ``sacct``, ``scontrol show config`` and dependency updates are
the tools' too.  pyslurm serves only calls made with this process's own Slurm configuration
(pyslurm loads it once per process) and whole job ids (an array task ``A_T`` to hold, release,
requeue or comment goes through scontrol, which splits a pending task off its array); any other
call goes through the tools.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time

from ..errors import ConfigError, SlurmError, SlurmUnavailable
from .backend import is_transient
from .cli_backend import CliBackend, submitted_id
from .jobs import Job, Node, Placement, index_jobs
from .result import Result

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Optional, Sequence

    from .backend import Backend


def _env_number(name: str, default: str, kind: type) -> Any:
    raw = os.environ.get(name, default)
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"${name}={raw!r} is not a {kind.__name__}") from None
    if value <= 0:
        raise ConfigError(f"${name}={raw!r} must be positive")
    return value


def default_timeout() -> float:
    """Seconds one Slurm command may take (``$DISPATCH_SLURM_TIMEOUT``, default 30)."""
    return float(_env_number("DISPATCH_SLURM_TIMEOUT", "30", float))


def default_attempts() -> int:
    """Tries for a transient controller error (``$DISPATCH_SLURM_ATTEMPTS``, default 4)."""
    return int(_env_number("DISPATCH_SLURM_ATTEMPTS", "4", int))


if TYPE_CHECKING:
    Runner = Callable[[Sequence[str], Optional[Mapping[str, str]], Optional[str], float], Result]


def run_command(
    argv: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    timeout: Optional[float] = None,
) -> Result:
    """Run one Slurm command in ``cwd`` (sbatch takes the job's default directory from it)."""
    timeout = default_timeout() if timeout is None else timeout
    try:
        proc = subprocess.run(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
    except OSError as exc:
        if cwd is not None and exc.filename == cwd:
            # sbatch runs in the job's submission folder (its default working folder), which
            # the user may have removed since: not a missing Slurm.
            what = {errno.ENOENT: "does not exist", errno.ENOTDIR: "is not a folder"}.get(
                exc.errno or 0, f"cannot be entered ({exc.strerror})"
            )
            raise SlurmError(
                f"cannot run {argv[0]} in {cwd!r}, the folder the job was "
                f"submitted from: it {what} (it is the job's working folder: "
                "make it again, or give sbatch --chdir)",
                argv=list(argv),
            ) from None
        if not isinstance(exc, FileNotFoundError):
            raise SlurmError(f"cannot run {argv[0]!r}: {exc.strerror}", argv=list(argv)) from None
        path = (os.environ if env is None else env).get("PATH", os.defpath)
        raise SlurmError(
            f"{argv[0]!r} not found on PATH ({path}); is Slurm's client "
            "installed? (a systemd unit's PATH is its own Environment=PATH=)",
            argv=list(argv),
        ) from None
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(
            f"{' '.join(argv[:2])} did not answer within {timeout:g} s",
            argv=list(argv),
            output=_text(exc.stderr),
        ) from None
    # A job's comment may hold any bytes: decode without failing, keep them visible.
    return Result(list(argv), proc.returncode, _text(proc.stdout), _text(proc.stderr))


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data if isinstance(data, str) else ""


# Where a node or login node keeps its copy of slurm.conf when the site runs configless:
# slurmd's and sackd's cache (23.11 and later), and 22.05's slurmd spool.
CONF_CACHES = ("/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf")


def _conf_value(path: str, name: str) -> Optional[str]:
    """The first ``name`` setting of the slurm.conf at ``path`` (keys case-insensitive, as
    Slurm reads them), or None when the file cannot be read or does not set it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition("#")[0].partition("=")
                if sep and key.strip().lower() == name.lower() and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


def _conf_paths(env: Mapping[str, str]) -> list[str]:
    return [env["SLURM_CONF"]] if env.get("SLURM_CONF") else ["/etc/slurm/slurm.conf", *CONF_CACHES]


def conf_value(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """A setting of this machine's slurm.conf (``$SLURM_CONF``, else /etc/slurm/slurm.conf or
    a configless cache), read from the file: no controller call.  None if none says."""
    env = os.environ if env is None else env
    return next((v for v in (_conf_value(p, name) for p in _conf_paths(env)) if v), None)


def controller_name(env: Optional[Mapping[str, str]] = None) -> str:
    """``slurmctld on HOST`` (slurm.conf's first SlurmctldHost), or ``slurmctld``."""
    host = conf_value("SlurmctldHost", env) or conf_value("ControlMachine", env) or ""
    host = host.split("(")[0].split(",")[0].strip()
    return f"slurmctld on {host}" if host else "slurmctld"


def message_timeout(env: Optional[Mapping[str, str]] = None) -> float:
    """slurm.conf's MessageTimeout (seconds a client waits for the controller), default 10."""
    raw = conf_value("MessageTimeout", env) or ""
    try:
        return max(1.0, float(raw.split()[0]))
    except (ValueError, IndexError):
        return 10.0


def local_cluster_name(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This cluster's ``ClusterName``, in lower case (Slurm maps it to lower case), from what
    is on this machine: ``$SLURM_CLUSTER_NAME`` (set in every job), else the slurm.conf
    ``$SLURM_CONF`` names, else /etc/slurm/slurm.conf or a configless cache; None if none says.
    """
    env = os.environ if env is None else env
    name = env.get("SLURM_CLUSTER_NAME", "").strip()
    if not name:
        name = conf_value("ClusterName", env) or ""
    return name.lower() or None


# --------------------------------------------------------------------------------------------
# The adapter


_UNCHOSEN = object()
NOTICE_AFTER = 2.0  # seconds a person waits before being told what for


class Slurm:
    """Slurm through one backend (pyslurm or the command-line tools), with retries for
    transient controller errors.

    ``backend``: ``auto``, ``cli`` or ``pyslurm``; None reads the setting
    (``$DISPATCH_SLURM_BACKEND``, else dispatch.conf's ``SlurmBackend``).  A ``runner`` other
    than :func:`run_command` (a test's fake controller) means the command-line tools.
    """

    def __init__(
        self,
        runner: Runner = run_command,
        attempts: Optional[int] = None,
        wait: float = 1.0,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        notice: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.runner = runner
        self.attempts = default_attempts() if attempts is None else attempts
        self.wait = wait
        self.timeout = timeout  # seconds one command may take; None: default_timeout()
        # For a person waiting at a terminal: told what the call waits for after NOTICE_AFTER
        # seconds, and a controller that does not answer is one line naming it.
        self.notice = notice
        self._told = False
        self.bytes_read = 0  # what the controller's answers weighed, for the bench
        self._setting = backend
        self._chosen: Any = _UNCHOSEN
        self._cluster: Any = _UNCHOSEN
        self._sluids: Optional[bool] = None  # the release prints SLUIDs (asked once)

    def _pyslurm(self, env: Optional[Mapping[str, str]] = None) -> Any:
        """The pyslurm backend for a call made with ``env``, or None for the tools."""
        if self._chosen is _UNCHOSEN:
            if self.runner is not run_command and self._setting is None:
                self._chosen = None
            else:
                from .select import select

                self._chosen = select(self._setting, default_timeout())
        if (
            self._chosen is not None
            and env is not None
            and env.get("SLURM_CONF") != os.environ.get("SLURM_CONF")
        ):
            return None  # pyslurm loaded this process's configuration, not that one
        return self._chosen

    def cluster(self, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The cluster this adapter talks to, lower case: :func:`local_cluster_name`, else the
        controller's ``ClusterName`` (one ``scontrol show config``, configless sites); None
        when neither says.  Read once per adapter, except that a controller which did not
        answer is asked again next time (a supervisor started in an outage must not stay
        without a cluster for life)."""
        if self._cluster is _UNCHOSEN:
            found = local_cluster_name(env)
            if found is None:
                try:
                    found = (self.config_value("ClusterName", env) or "").lower() or None
                except SlurmError:
                    return None
            self._cluster = found
        return self._cluster  # type: ignore[return-value]

    @classmethod
    def for_people(
        cls, say: Callable[[str], None], env: Optional[Mapping[str, str]] = None
    ) -> Slurm:
        """An adapter for a person at a terminal (``dispatch jobs``, ``status``, ``cancel``):
        bounded near Slurm's own MessageTimeout, one try and at most one retry (a client
        itself waits MessageTimeout for the controller), a word on stderr (``say``) after
        NOTICE_AFTER seconds, and a controller that does not answer is one line naming it."""
        return cls(attempts=2, timeout=round(1.2 * message_timeout(env) + 2, 1), notice=say)

    @property
    def backend(self) -> str:
        """``pyslurm`` or ``cli``: the backend the reads and actions go through (chosen now
        if not yet)."""
        return "cli" if self._pyslurm() is None else "pyslurm"

    def _retrying(self, attempts: Optional[int] = None) -> Any:
        import tenacity  # only the retried calls need it: keeps dispatch-sbatch's start fast

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(SlurmUnavailable),
            stop=tenacity.stop_after_attempt(attempts or self.attempts),
            wait=tenacity.wait_exponential(multiplier=self.wait, max=8 * self.wait),
            reraise=True,
        )

    def call(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Result:
        """Run a read-only or idempotent command, retrying transient errors."""
        return self._with_retries(lambda: self._once(argv, env), self.attempts)

    def _with_retries(self, once: Callable[[], Any], attempts: int) -> Any:
        # The first try needs no tenacity (dispatch-sbatch's start-up stays small).
        started = time.monotonic()
        try:
            try:
                return once()
            except SlurmUnavailable:
                if attempts <= 1:
                    raise
            time.sleep(self.wait)
            for attempt in self._retrying(attempts - 1):
                with attempt:
                    return once()
        except SlurmUnavailable as exc:
            if self.notice is None:
                raise
            said = [line.strip() for line in exc.output.splitlines() if line.strip()]
            raise SlurmUnavailable(
                f"{controller_name()} did not answer {exc.argv[0] if exc.argv else 'Slurm'} "
                f"({attempts} tries in {time.monotonic() - started:.0f} s): "
                f"{said[-1] if said else str(exc).splitlines()[0]}",
                argv=exc.argv,
                returncode=exc.returncode,
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> Result:
        timeout = default_timeout() if self.timeout is None else self.timeout
        if self.notice is None or self._told:
            result = self.runner(argv, env, cwd, timeout)
        else:
            import threading

            notice = self.notice

            def tell() -> None:
                self._told = True  # once: the person knows what the wait is for
                notice(
                    f"waiting for {controller_name(env)} to answer {argv[0]} (at most "
                    f"{timeout:g} s a try, {self.attempts} tries)"
                )

            told = threading.Timer(NOTICE_AFTER, tell)
            told.daemon = True
            told.start()
            try:
                result = self.runner(argv, env, cwd, timeout)
            finally:
                told.cancel()
        self.bytes_read += len(result.stdout) + len(result.stderr)
        if result.returncode != 0:
            output = (result.stderr + result.stdout).strip()
            cls = SlurmUnavailable if is_transient(output) else SlurmError
            raise cls(
                f"{argv[0]} failed (exit {result.returncode})",
                argv=list(argv),
                output=output,
                returncode=result.returncode,
            )
        return result

    # -- the backend of each call ----------------------------------------------------------
    def _tools(self, env: Optional[Mapping[str, str]] = None) -> CliBackend:
        """The command-line backend, one try per command through :meth:`_once` with ``env``."""
        return CliBackend(lambda argv: self._once(argv, env), lambda: self._has_sluids(env))

    def _has_sluids(self, env: Optional[Mapping[str, str]] = None) -> bool:
        """The release prints SLUIDs (squeue's version, asked once per adapter)."""
        if self._sluids is None:
            self._sluids = CliBackend(lambda argv: self._once(argv, env)).has_sluids()
        return self._sluids

    def _backend(
        self, env: Optional[Mapping[str, str]] = None, job_ids: Sequence[str] = ()
    ) -> Backend:
        """The backend for a call made with ``env`` on ``job_ids``: pyslurm where it was chosen
        and serves them (whole job ids: pyslurm acts on those; scontrol splits a pending task
        ``A_T`` off its array), else the tools."""
        backend = self._pyslurm(env)
        if backend is None or not all(j.isdigit() for j in job_ids):
            return self._tools(env)
        chosen: Backend = backend
        return chosen

    # -- reads -----------------------------------------------------------------------------
    def own_jobs(
        self, env: Optional[Mapping[str, str]] = None, retry: bool = True, sluids: bool = False
    ) -> dict[str, Job]:
        """The caller's own jobs (every array task), in one call the controller filters.

        Keyed by ``display_id`` (``97_1``) and, where one job has it alone, by ``job_id``.
        A job of another uid is dropped (``--me`` already asks for the caller's only).
        ``sluids``: with each job's SLUID where the release has them (26.05; the tools then,
        pyslurm serving no such release).
        """
        me = os.getuid()
        backend = self._backend(env)
        if sluids and self._has_sluids(env):
            tools = self._tools(env)
            listed: list[Job] = self._with_retries(
                lambda: tools.user_jobs(me, True), self.attempts if retry else 1
            )
        else:
            listed = self._with_retries(
                lambda: backend.user_jobs(me), self.attempts if retry else 1
            )
        return index_jobs(j for j in listed if j.uid == me)

    def jobs(self, job_id: str, env: Optional[Mapping[str, str]] = None) -> list[Job]:
        """Job ``job_id`` (``123``, ``97_1``, or an array's id for all its tasks, in task
        order); [] when the controller does not know it."""
        if not re.fullmatch(r"\d+(_\d+)?", job_id):
            raise SlurmError(f"{job_id!r} is not a Slurm job id (123 or 123_4)")
        backend = self._backend(env)
        found: list[Job] = self._with_retries(lambda: backend.jobs(job_id), self.attempts)
        # Task order on every backend: squeue prints an array pending remainder first, by
        # priority; pyslurm 24.11 reads the owner's jobs in the controller's order.
        return sorted(
            found, key=lambda j: (-1 if j.array_task_id is None else j.array_task_id, int(j.job_id))
        )

    def nodes(
        self, names: Sequence[str], env: Optional[Mapping[str, str]] = None
    ) -> dict[str, Node]:
        """Each named node, in one call; a node the controller does not know is absent."""
        if not names:
            return {}
        backend = self._backend(env)
        loaded: dict[str, Node] = self._with_retries(
            lambda: backend.nodes(list(names)), self.attempts
        )
        return loaded

    def placement(
        self, job_id: str, env: Optional[Mapping[str, str]] = None
    ) -> Optional[Placement]:
        """Where job ``job_id`` (``123``, ``97_1``) may run: its partitions, node count and
        excluded nodes; None when the controller does not know it.  Through the tools."""
        tools = self._tools(env)
        found: Optional[Placement] = self._with_retries(
            lambda: tools.placement(job_id), self.attempts
        )
        return found

    def partition_nodes(
        self, partitions: Sequence[str], env: Optional[Mapping[str, str]] = None
    ) -> dict[str, list[str]]:
        """Each of ``partitions``' nodes (name -> nodes, each once).  Through the tools."""
        tools = self._tools(env)
        found: dict[str, list[str]] = self._with_retries(
            lambda: tools.partition_nodes(partitions), self.attempts
        )
        return found

    def config_value(self, key: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """One setting of the controller's ``scontrol show config`` (``MailProg``), or None
        when it is unset (``(null)``) or absent."""
        tools = self._tools(env)
        found: Optional[str] = self._with_retries(lambda: tools.config_value(key), self.attempts)
        return found

    def accounting(
        self, job_id: str, env: Optional[Mapping[str, str]] = None
    ) -> Optional[list[Job]]:
        """Job ``job_id`` (an array's id: every task) as Slurm's accounting keeps it
        (``sacct``), for jobs slurmctld has forgotten (MinJobAge); None where the site keeps
        no accounting."""
        tools = self._tools(env)
        found: Optional[list[Job]] = self._with_retries(
            lambda: tools.accounting(job_id), self.attempts
        )
        return found

    def find_by_marker(self, marker: str, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The id of the caller's own job whose comment carries ``marker``, if any."""
        try:
            jobs = self.own_jobs(env, retry=False)  # the caller's loop is the retry
        except SlurmError:
            return None
        for job in jobs.values():
            if marker in job.markers and job.array_task_id is None:
                return job.job_id
        for job in jobs.values():
            if marker in job.markers:
                return job.array_job_id or job.job_id
        return None

    def sluid(self, job_id: str, env: Optional[Mapping[str, str]] = None) -> str:
        """The SLUID of plain job ``job_id`` as the controller has it now, read right after its
        submission: '' where the release gives none (before 26.05; sbatch --parsable prints
        none) or where it cannot be read (the job stands; only the proof is missing)."""
        tools = self._tools(env)
        if not tools.has_sluids():
            return ""
        try:
            found: list[Job] = self._with_retries(lambda: tools.jobs(job_id, True), self.attempts)
        except SlurmError:
            return ""
        return next((j.sluid for j in found if j.job_id == job_id and j.array_task_id is None), "")

    # -- actions ---------------------------------------------------------------------------
    def sbatch(
        self,
        argv: Sequence[str],
        marker: str,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> tuple[str, Result]:
        """Submit once; return (job id, result).  ``marker`` must be in the job's comment.

        On a transient failure the job may have landed anyway, so look for ``marker`` among
        the caller's jobs before trying again: never two jobs for one submission.  Without a
        marker there is one attempt only.
        """

        def once() -> tuple[str, Result]:
            try:
                result = self._once(argv, env, cwd)
            except SlurmUnavailable:
                found = self.find_by_marker(marker, env) if marker else None
                if found:
                    line = (
                        f"{found}\n" if "--parsable" in argv else f"Submitted batch job {found}\n"
                    )
                    return found, Result(list(argv), 0, line, "")
                raise
            return submitted_id(result), result

        result: tuple[str, Result] = self._with_retries(once, self.attempts if marker else 1)
        return result

    def cancel(self, jobids: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        if jobids:
            backend = self._backend(env)  # slurm_kill_job2 takes A_T as scancel does
            self._with_retries(lambda: backend.cancel(list(jobids)), self.attempts)

    def release(self, jobids: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        if jobids:
            backend = self._backend(env, jobids)
            self._with_retries(lambda: backend.release(list(jobids)), self.attempts)

    def requeue(self, jobids: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        """Requeue running jobs: their executions end, each comes back pending."""
        if jobids:
            backend = self._backend(env, jobids)
            self._with_retries(lambda: backend.requeue(list(jobids)), self.attempts)

    def requeue_hold(self, jobid: str, env: Optional[Mapping[str, str]] = None) -> None:
        """Requeue a running job held (``scontrol requeuehold``; a job id, ``A_T`` or, from
        26.05, an execution's SLUID): its execution ends, it waits for a release.  Through
        the tools, one try (a second would find it pending)."""
        tools = self._tools(env)
        self._with_retries(lambda: tools.requeue_hold(jobid), 1)

    def set_comment(self, jobid: str, text: str, env: Optional[Mapping[str, str]] = None) -> None:
        """Replace a job's comment (the owner's own free text; ours starts with its marker)."""
        backend = self._backend(env, [jobid])
        self._with_retries(lambda: backend.set_comment(jobid, text), self.attempts)

    def set_dependency(
        self, jobid: str, value: str, env: Optional[Mapping[str, str]] = None
    ) -> None:
        """Replace a pending job's dependency (``afterany:123``); through the tools."""
        tools = self._tools(env)
        self._with_retries(lambda: tools.set_dependency(jobid, value), self.attempts)

    def set_excluded(
        self, jobid: str, nodes: Sequence[str], env: Optional[Mapping[str, str]] = None
    ) -> None:
        """Replace a pending job's excluded nodes (``ExcNodeList``); through the tools."""
        tools = self._tools(env)
        self._with_retries(lambda: tools.set_excluded(jobid, nodes), self.attempts)

    def hold(self, jobids: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        if jobids:
            backend = self._backend(env, jobids)
            self._with_retries(lambda: backend.hold(list(jobids)), self.attempts)
