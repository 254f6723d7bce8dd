"""The one adapter between slurm-dispatch and Slurm's command-line tools.

Every call is a list argv with a timeout.  Transient controller errors (the controller not
answering, a socket timeout, "try again") are retried with tenacity; ``sbatch`` is not
idempotent, so after a timed-out or transient ``sbatch`` the adapter first looks for the job
by its marker (the job's comment) before it submits again.  Callers pay a fixed number of
controller calls: :func:`show_jobs` reads every job in one ``scontrol`` call.

pyslurm is not used here: it is an optional backend only where its version matches the
installed Slurm, and the command-line tools work on every Slurm.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

from .errors import SlurmError, SlurmUnavailable

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Optional, Sequence

TIMEOUT = float(os.environ.get("DISPATCH_SLURM_TIMEOUT", "30"))
ATTEMPTS = int(os.environ.get("DISPATCH_SLURM_ATTEMPTS", "4"))

_TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Resource temporarily unavailable|Slurm temporarily unavailable|try again|"
    r"Communication connection failure|Zero Bytes were transmitted", re.IGNORECASE)
_SUBMITTED = re.compile(r"^(?:Submitted batch job (\d+)|(\d+)(?:;\S+)?)\s*$", re.MULTILINE)


class Result:
    """What one Slurm command did."""

    __slots__ = ("argv", "returncode", "stdout", "stderr")

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


if TYPE_CHECKING:
    Runner = Callable[[Sequence[str], Optional[Mapping[str, str]], Optional[str], float],
                      Result]


def run_command(argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
                cwd: Optional[str] = None, timeout: float = TIMEOUT) -> Result:
    """Run one Slurm command in ``cwd`` (sbatch takes the job's default directory from it)."""
    try:
        proc = subprocess.run(list(argv), env=None if env is None else dict(env), cwd=cwd,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]!r} not found on PATH; is Slurm's client installed?",
                         argv=list(argv)) from None
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnavailable(f"{' '.join(argv[:2])} did not answer within {timeout:g} s",
                               argv=list(argv), output=_text(exc.stderr)) from None
    return Result(list(argv), proc.returncode, proc.stdout, proc.stderr)


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data if isinstance(data, str) else ""


class Slurm:
    """Slurm's command-line tools, with retries for transient controller errors."""

    def __init__(self, runner: Runner = run_command, attempts: int = ATTEMPTS,
                 wait: float = 1.0) -> None:
        self.runner = runner
        self.attempts = attempts
        self.wait = wait

    def _retrying(self) -> Any:
        import tenacity  # only the retried calls need it: keeps dispatch-sbatch's start fast
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(SlurmUnavailable),
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=self.wait, max=8 * self.wait),
            reraise=True)

    def call(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> Result:
        """Run a read-only or idempotent command, retrying transient errors."""
        for attempt in self._retrying():
            with attempt:
                return self._once(argv, env)
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None,
              cwd: Optional[str] = None) -> Result:
        result = self.runner(argv, env, cwd, TIMEOUT)
        if result.returncode != 0:
            output = (result.stderr + result.stdout).strip()
            cls = SlurmUnavailable if _TRANSIENT.search(output) else SlurmError
            raise cls(f"{argv[0]} failed (exit {result.returncode})", argv=list(argv),
                      output=output, returncode=result.returncode)
        return result

    def sbatch(self, argv: Sequence[str], marker: str,
               env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None) -> tuple[str, Result]:
        """Submit once; return (job id, result).  ``marker`` must be in the job's comment.

        On a transient failure the job may have landed anyway, so look for ``marker`` among
        the user's jobs before trying again: never two jobs for one submission.
        """
        last: Optional[SlurmUnavailable] = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(min(self.wait * 2 ** (attempt - 1), 8 * self.wait))
            try:
                result = self._once(argv, env, cwd)
            except SlurmUnavailable as exc:
                last = exc
                found = self.find_by_marker(marker, env) if marker else None
                if found:
                    line = f"{found}\n" if "--parsable" in argv else \
                        f"Submitted batch job {found}\n"
                    return found, Result(list(argv), 0, line, "")
                continue
            match = _SUBMITTED.search(result.stdout)
            if not match:
                raise SlurmError("sbatch printed no job id", argv=list(argv),
                                 output=result.stdout + result.stderr)
            return (match.group(1) or match.group(2)), result
        assert last is not None
        raise last

    def find_by_marker(self, marker: str, env: Optional[Mapping[str, str]] = None
                       ) -> Optional[str]:
        try:
            result = self._once(["squeue", "--me", "-h", "--states=all", "-o", "%A|%k"], env)
        except SlurmError:
            return None
        for line in result.stdout.splitlines():
            jobid, _, comment = line.partition("|")
            if marker in comment.split():
                return jobid.strip()
        return None

    def show_jobs(self, env: Optional[Mapping[str, str]] = None) -> dict[str, dict[str, str]]:
        """Every job the controller knows, in one call, keyed by job id (``123`` or ``123_4``)."""
        result = self.call(["scontrol", "-o", "show", "job"], env)
        jobs: dict[str, dict[str, str]] = {}
        for line in result.stdout.splitlines():
            if not line.strip() or line.startswith("No jobs"):
                continue
            fields = parse_record(line)
            jobid = fields.get("JobId", "")
            jobs[jobid] = fields
            if fields.get("ArrayJobId") and fields.get("ArrayTaskId"):
                jobs[f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"] = fields
        return jobs

    def cancel(self, jobids: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        if jobids:
            self.call(["scancel", *jobids], env)

    def release(self, jobids: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
        if jobids:
            self.call(["scontrol", "release", ",".join(jobids)], env)


_FIELD = re.compile(r"(\S+?)=")


def parse_record(line: str) -> dict[str, str]:
    """Split one ``scontrol -o`` line into fields; values may contain spaces (Command=, Reason=).

    A key is a word followed by ``=`` at the start or after a space; everything up to the next
    key belongs to the value.
    """
    fields: dict[str, str] = {}
    keys = [m for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=", line)]
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    return fields
