"""The command-line backend of the Slurm adapter: ``squeue``, ``scontrol``, ``sacct``, ``sbatch``
and ``scancel``, their argv and the parsing of what they print.

Keeps :class:`.backend.Backend` beside :class:`.pyslurm_backend.PyslurmBackend`, and adds what
only the tools do (``sbatch`` itself, ``sacct``, ``scontrol show config``, dependency updates,
array tasks given as ``A_T``).  One try per call: ``run`` (the adapter's) runs one command with
its timeout and raises on a non-zero exit; the adapter retries.

Invariants:

* **User-controlled text never moves a controller field.**  Jobs are read with ``squeue -O``,
  every Slurm-controlled field first, then the reason, then the comment (which its owner may set
  to anything, newlines included).  The reason and the comment end with two random nonces drawn
  for each call, so a record ends only where the controller ended it and a comment shaped like
  other fields (``JobState=COMPLETED Restarts=3``) is only ever a comment.
* **The controller's cost follows the caller's jobs**: ``squeue --me`` (filtered by slurmctld;
  22.05's ``squeue --json`` would return the whole queue, whatever the filter) or ``--jobs ID``;
  an array is read task by task (``--array``), so an array's tasks are jobs of their own.
* **A release's own fields only.**  From 26.05 squeue prints each job's SLUID (Slurm's id of
  one execution, which a controller that lost its state does not give again, where job ids
  start again); the backend asks for it only where its caller wants it and ``squeue
  --version`` (read once, no controller call) says the release has it: an older squeue
  refuses the whole format.
"""

from __future__ import annotations

import os
import re
import time

from ..errors import SlurmError
from .jobs import WAITING_STATES, Job, Node, Placement, execution_ended, exit_code_text

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Callable, Iterable, Optional, Sequence

    from .result import Result

    Run = Callable[[Sequence[str]], Result]

_SUBMITTED = re.compile(r"^(?:Submitted batch job (\d+)|(\d+)(?:;\S+)?)\s*$", re.MULTILINE)
_NOT_FOUND = re.compile(r"Node \S+ not found")


def slurm_time(value: Optional[str]) -> Optional[float]:
    """``2026-11-30T06:22:31`` (local time, as Slurm prints it) to seconds; else None."""
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


# squeue -O fields, Slurm-controlled ones first; then Reason and Comment, each ending with a
# nonce (see the module docstring).  Width 0: printed whole, never cut at 20 characters.
SQUEUE_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "RestartCnt",
    "UserID",
    "NodeList",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "exit_code",
)
_SEP = "|"
# The release that first prints SLUID (squeue -O SLUID, scontrol's SLUID=, SLURM_JOB_SLUID).
SLUID_RELEASE = (26, 5)


def squeue_fields(sluids: bool = False) -> tuple[str, ...]:
    """The Slurm-controlled fields read, with the SLUID where the release has it."""
    return SQUEUE_FIELDS + ("SLUID",) if sluids else SQUEUE_FIELDS


def squeue_format(nonces: tuple[str, str], sluids: bool = False) -> str:
    """The ``squeue -O`` argument for :func:`parse_squeue` (nonces: hex, one per call)."""
    fixed = ",".join(f"{name}:0{_SEP}" for name in squeue_fields(sluids))
    return f"{fixed},Reason:0{nonces[0]},Comment:0{nonces[1]}"


def has_sluids(version_text: str) -> bool:
    """``squeue --version``'s answer (``slurm 26.05.5``) names a release that prints SLUIDs."""
    from .release import major_release

    words = version_text.split()
    found = major_release(words[-1]) if words else None
    return found is not None and found >= SLUID_RELEASE


def _new_nonces() -> tuple[str, str]:
    return "#" + os.urandom(12).hex() + "#", "#" + os.urandom(12).hex() + "#"


def parse_squeue(
    text: str, nonces: tuple[str, str], argv: Sequence[str] = (), sluids: bool = False
) -> list[Job]:
    """Jobs from squeue output made with :func:`squeue_format` and the same ``nonces`` and
    ``sluids``."""
    fields = squeue_fields(sluids)
    reason_end, record_end = nonces
    chunks = text.split(record_end)
    tail = chunks.pop().strip()
    if tail:
        raise SlurmError(
            "squeue printed an unterminated record", argv=list(argv), output=tail[:500]
        )
    jobs = []
    for chunk in chunks:
        chunk = chunk.lstrip("\n")
        head, found, comment = chunk.partition(reason_end)
        parts = head.split(_SEP, len(fields))
        if not found or len(parts) != len(fields) + 1:
            raise SlurmError(
                "squeue printed a record that does not parse", argv=list(argv), output=chunk[:500]
            )
        values = dict(zip(fields, parts))
        jobs.append(_job_from_squeue(values, parts[-1], comment, argv))
    return jobs


def _job_from_squeue(values: dict[str, str], reason: str, comment: str, argv: Sequence[str]) -> Job:
    from .hostlist import expand_hostlist

    try:
        restarts = int(values["RestartCnt"])
        uid = int(values["UserID"])
        nodes = expand_hostlist(values["NodeList"])
    except ValueError as exc:
        raise SlurmError(
            f"squeue printed a field that does not parse: {exc}",
            argv=list(argv),
            output=str(values)[:500],
        ) from None
    task = values["ArrayTaskID"]
    array = task.isdigit()
    state = values["State"].split()[0] if values["State"] else ""
    sluid = values.get("SLUID", "")
    return Job(
        values["JobID"],
        state,
        sluid="" if sluid in ("", "N/A", "(null)") else sluid,
        array_job_id=values["ArrayJobID"] if array else None,
        array_task_id=int(task) if array else None,
        reason=reason,
        restarts=restarts,
        nodes=nodes,
        uid=uid,
        comment="" if comment == "(null)" else comment,
        submit_time=slurm_time(values["SubmitTime"]),
        # A waiting job's StartTime is the scheduler's estimate: not a start.
        start_time=None if state in WAITING_STATES else slurm_time(values["StartTime"]),
        # Before the execution ends, EndTime is an estimate (start + time limit).
        end_time=slurm_time(values["EndTime"]) if execution_ended(state) else None,
        # A wait status (22.05 prints 768 for exit 3), as scontrol writes it: 3:0;
        # none before the execution ended (pyslurm's is then another number).
        exit_code=exit_code_text(values["exit_code"]) if execution_ended(state) else None,
    )


def _parse_node_line(line: str) -> dict[str, str]:
    # `scontrol -o show node`: Key=Value pairs; values may hold spaces (Reason=); node fields
    # are set by Slurm and the site's admins, never by a job's owner.
    fields: dict[str, str] = {}
    keys = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=", line))
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        fields.setdefault(m.group(1), line[m.end() : end].strip())
    return fields


class CliBackend:
    """Reads and actions through Slurm's command-line tools, one try each; ``run`` runs one
    command (the adapter's, with its timeout, environment and notice)."""

    name = "cli"

    def __init__(self, run: Run, sluids: Optional[Callable[[], bool]] = None) -> None:
        self.run = run
        self._asked = sluids  # the caller's answer, kept beyond this backend
        self.sluids: Optional[bool] = None  # the release prints SLUIDs; None: not asked yet

    def has_sluids(self) -> bool:
        """The release prints SLUIDs (``squeue --version``, asked once; no controller call).
        A squeue that does not say is taken for one that does not print them."""
        if self._asked is not None:
            return self._asked()
        if self.sluids is None:
            try:
                self.sluids = has_sluids(self.run(["squeue", "--version"]).stdout)
            except SlurmError:
                self.sluids = False
        return self.sluids

    # -- reads -----------------------------------------------------------------------------
    def _squeue(self, selection: list[str], sluids: bool = False) -> list[Job]:
        nonces = _new_nonces()
        sluids = sluids and self.has_sluids()
        argv = [
            "squeue",
            *selection,
            "--noheader",
            "--array",
            "--states=all",
            "--Format",
            squeue_format(nonces, sluids),
        ]
        return parse_squeue(self.run(argv).stdout, nonces, argv, sluids)

    def user_jobs(self, uid: int, sluids: bool = False) -> list[Job]:
        """The caller's own jobs (``squeue --me``: the controller filters them; ``uid`` is the
        caller's), with their SLUIDs where asked for and the release has them."""
        return self._squeue(["--me"], sluids)

    def jobs(self, job_id: str, sluids: bool = False) -> list[Job]:
        try:
            return self._squeue(["--jobs", job_id], sluids)
        except SlurmError as exc:
            if "invalid job id" in exc.output.lower():
                return []
            raise

    def nodes(self, names: Sequence[str]) -> dict[str, Node]:
        argv = ["scontrol", "-o", "show", "node", ",".join(names)]
        try:
            text = self.run(argv).stdout
        except SlurmError as exc:
            # One unknown name fails the whole command (exit 1, "Node nx not found") after
            # the known ones are printed: those stand, the unknown are absent.
            said = [line for line in exc.output.splitlines() if line.strip()]
            if not any(_NOT_FOUND.fullmatch(line) for line in said):
                raise
            text = "\n".join(line for line in said if line.startswith("NodeName="))
        found = {}
        for line in text.splitlines():
            if not line.strip() or not line.startswith("NodeName="):
                continue
            fields = _parse_node_line(line)
            name = fields.get("NodeName", "")
            found[name] = Node(
                name,
                fields.get("State", ""),
                fields.get("Reason", ""),
                slurm_time(fields.get("BootTime")),
            )
        return found

    def placement(self, job_id: str) -> Optional[Placement]:
        """Job ``job_id``'s partitions, node count, excluded nodes and the nodes it asks for
        (``squeue --format``: Slurm-controlled fields only, ``|`` in none of them); None
        when the controller does not know it."""
        from .hostlist import expand_hostlist

        argv = [
            "squeue",
            "--jobs",
            job_id,
            "--noheader",
            "--array",
            "--states=all",
            "--format=%P|%D|%x|%n",
        ]
        try:
            text = self.run(argv).stdout
        except SlurmError as exc:
            if "invalid job id" in exc.output.lower():
                return None
            raise
        line = next((line for line in text.splitlines() if line.strip()), "")
        if not line:
            return None
        parts = line.strip().split("|")
        count = parts[1].partition("-")[0] if len(parts) == 4 else ""
        try:
            if not count.isdigit():
                raise ValueError(f"node count {count!r}")
            excluded = expand_hostlist(parts[2])
            required = expand_hostlist(parts[3])
        except ValueError as exc:
            raise SlurmError(
                f"squeue printed a placement that does not parse: {exc}",
                argv=argv,
                output=line[:500],
            ) from None
        return Placement([p for p in parts[0].split(",") if p], int(count), excluded, required)

    def partition_nodes(self, partitions: Sequence[str]) -> dict[str, list[str]]:
        """Each of ``partitions``' nodes (``sinfo``; ``--all`` is refused beside
        ``--partition``), each once, in the order listed; a partition sinfo does not list
        is left out."""
        from .hostlist import expand_hostlist

        argv = ["sinfo", "--noheader", f"--partition={','.join(partitions)}", "--format=%R|%N"]
        found: dict[str, list[str]] = {}
        for line in self.run(argv).stdout.splitlines():
            if not line.strip():
                continue
            name, _, listed = line.strip().partition("|")
            try:
                names = expand_hostlist(listed)
            except ValueError as exc:
                raise SlurmError(
                    f"sinfo printed a node list that does not parse: {exc}",
                    argv=argv,
                    output=line[:500],
                ) from None
            nodes = found.setdefault(name, [])
            nodes += [node for node in names if node not in nodes]
        return found

    def config_value(self, key: str) -> Optional[str]:
        """One setting of ``scontrol show config``, or None when unset (``(null)``) or absent."""
        for line in self.run(["scontrol", "show", "config"]).stdout.splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == key:
                value = value.strip()
                return None if value in ("", "(null)") else value
        return None

    def accounting(self, job_id: str) -> Optional[list[Job]]:
        """Job ``job_id`` as ``sacct`` keeps it (Slurm-controlled fields only,
        ``|``-separated; the newest job of the id, as sacct shows without ``--duplicates``,
        its ``Submit`` time in :attr:`Job.submit_time`, its ``ExitCode`` once ended, as
        ``--stop-on-exit`` reads it); None where the site keeps no accounting."""
        argv = [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-j",
            job_id,
            "-o",
            "JobIDRaw,JobID,State,UID,Submit,ExitCode",
        ]
        try:
            result = self.run(argv)
        except SlurmError as exc:
            said = exc.output.lower()
            if "accounting storage is disabled" in said or "not found on path" in str(exc):
                return None
            raise
        jobs = []
        for line in result.stdout.splitlines():
            if not line.strip():
                continue
            parts = line.split("|")
            if len(parts) != 6 or not parts[0].isdigit():
                raise SlurmError(
                    "sacct printed a line that does not parse", argv=argv, output=line[:500]
                )
            raw, shown, state, uid, submitted, code = parts
            array, _, task = shown.partition("_")
            named = state.split()[0] if state else ""
            jobs.append(
                Job(
                    raw,
                    named,
                    array_job_id=array if task.isdigit() else None,
                    array_task_id=int(task) if task.isdigit() else None,
                    uid=int(uid) if uid.isdigit() else -1,
                    submit_time=slurm_time(submitted),
                    exit_code=exit_code_text(code) if execution_ended(named) else None,
                )
            )
        return jobs

    # -- actions (array tasks may be given as A_T) -----------------------------------------
    def cancel(self, job_ids: Iterable[str]) -> None:
        self.run(["scancel", *job_ids])

    def hold(self, job_ids: Iterable[str]) -> None:
        self.run(["scontrol", "hold", ",".join(job_ids)])

    def release(self, job_ids: Iterable[str]) -> None:
        self.run(["scontrol", "release", ",".join(job_ids)])

    def requeue(self, job_ids: Iterable[str]) -> None:
        self.run(requeue_argv(job_ids))

    def requeue_hold(self, job_id: str) -> None:
        self.run(["scontrol", "requeuehold", job_id])

    def set_comment(self, job_id: str, text: str) -> None:
        self.run(["scontrol", "update", f"jobid={job_id}", f"comment={text}"])

    def set_dependency(self, job_id: str, value: str) -> None:
        self.run(["scontrol", "update", f"jobid={job_id}", f"dependency={value}"])

    def set_excluded(self, job_id: str, nodes: Sequence[str]) -> None:
        self.run(["scontrol", "update", f"jobid={job_id}", f"excnodelist={','.join(nodes)}"])


def sbatch_argv(words: Iterable[str]) -> list[str]:
    """The argv that submits with sbatch ``words`` (options, then the script and its
    arguments): the one place outside this module that says ``sbatch``."""
    return ["sbatch", *words]


def requeue_argv(job_ids: Iterable[str]) -> list[str]:
    """The argv that requeues ``job_ids`` (a job inside itself runs it: see
    :mod:`slurm_dispatch.integrations.requeue`)."""
    return ["scontrol", "requeue", ",".join(job_ids)]


def submitted_id(result: Result) -> str:
    """The job id ``sbatch`` printed (``Submitted batch job N``, or ``N[;cluster]`` with
    ``--parsable``)."""
    match = _SUBMITTED.search(result.stdout)
    if not match:
        raise SlurmError(
            "sbatch printed no job id", argv=list(result.argv), output=result.stdout + result.stderr
        )
    return match.group(1) or match.group(2)
