"""Dispatch job records: one folder per dispatch job, written by the job's own user.

Layout under ``$DISPATCH_HOME`` (default ``~/.local/state/slurm-dispatch``), which must be on
a file system the compute nodes see (a home directory usually is)::

    jobs/<id>/job.json          the job's spec, written once: G, rules, root, sbatch argv
    jobs/<id>/script            the script as submitted (read-only snapshot)
    jobs/<id>/batch-<N>.sh      the batch script sbatch got for submission N
    jobs/<id>/batch-<N>-t<T>.sh the batch script of array task T's own submission N
    jobs/<id>/claims/<name>     create-once claims: whoever creates one does that work, once;
                                a claim holds what its maker meant to do (JSON: pid, time, and
                                for a submission its reason and hold), so a pass killed after
                                acting is completed by the next one as it was meant
    jobs/<id>/events/<ns>-<kind>-<rand>.json   the append-only history (schema: events.py)

Invariants: an event or claim file is written completely under a temporary name, then linked
into place, so a reader never sees half of one; every event is checked against the schema when
written and when read, and a bad one is an error naming its file, for its own job only; nothing
is ever rewritten or deleted, except a job folder removed whole when its first ``sbatch``
failed (no half-made job survives).
Facts about nodes and end states recorded by the site's hooks live elsewhere (the site's
state directory, written by root); this module only holds what the user's side knows.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time

from .. import _fsio
from ..errors import DispatchError, RecordError, UsageError
from . import events as schema

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l, o, 0, 1: easy to read aloud


def home_dir() -> str:
    explicit = os.environ.get("DISPATCH_HOME")
    if explicit:
        return os.path.abspath(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(state, "slurm-dispatch")


def jobs_dir(home: Optional[str] = None) -> str:
    return os.path.join(home or home_dir(), "jobs")


def _random_suffix() -> str:
    return os.urandom(4).hex()


def new_job_id() -> str:
    # 7 letters from 32 (os.urandom bytes, each reduced mod 32 without bias since 256 % 32 == 0)
    return "d" + "".join(_ID_ALPHABET[b % 32] for b in os.urandom(7))


class JobRecord:
    """One dispatch job's folder."""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def id(self) -> str:
        return os.path.basename(self.path)

    @property
    def spec(self) -> dict[str, Any]:
        return self._spec_cache()

    def _spec_cache(self) -> dict[str, Any]:
        cached = getattr(self, "_spec", None)
        if cached is None:
            cached = read_json(os.path.join(self.path, "job.json"))
            self._spec = cached
        return cached

    @property
    def created(self) -> float:
        """When the record was made (job.json's ``created``); 0.0 where it is absent or not a
        number (a hand-edited job.json), so that readers judge such a record by its events."""
        value = self.spec.get("created")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return 0.0
        return float(value)

    @property
    def cluster(self) -> Optional[str]:
        """The Slurm cluster (``ClusterName``, lower case) the job was submitted to; None for
        a record made before records carried it."""
        value = self.spec.get("cluster")
        return str(value) if value else None

    def of_cluster(self, cluster: Optional[str]) -> bool:
        """The job belongs to ``cluster``: a record without a cluster belongs to every one
        (it was made before records carried it), and so does every record where the current
        cluster is not known; an unreadable record too (it is reported where it is read)."""
        if cluster is None:
            return True
        try:
            return self.cluster in (None, cluster)
        except DispatchError:
            return True

    @property
    def script(self) -> str:
        return os.path.join(self.path, "script")

    def batch_script(self, submission: int, task: Optional[int] = None) -> str:
        """``batch-<N>.sh``, or ``batch-<N>-t<task>.sh`` for one array task's own."""
        suffix = "" if task is None else f"-t{task}"
        return os.path.join(self.path, f"batch-{submission}{suffix}.sh")

    def append(
        self, kind: str | type[schema.Event], once: Optional[str] = None, **fields: Any
    ) -> Optional[schema.Event]:
        """Add an event of ``kind`` (a schema class, or its kind name) to the history.

        The event is checked against the schema first: a caller's mistake is an error here,
        never a record that breaks every later reader.  With ``once``, the event is recorded at
        most once under that key (for example the submission number): a second writer gets
        ``None``.  Written under a temporary name, then linked into place: whole or not at all.
        """
        cls = schema.KINDS.get(kind) if isinstance(kind, str) else kind
        if cls is None:
            raise RecordError(f"unknown event kind {kind!r}")
        now = time.time_ns()
        try:
            event = schema.new(cls, now, **fields)
        except schema.EventError as exc:
            raise RecordError(
                f"{self.id}: refusing to record a bad {cls.kind!r} event: {exc}"
            ) from None
        events = os.path.join(self.path, "events")
        name = (
            f"{cls.kind}-{once}.json"
            if once is not None
            else f"{now:020d}-{cls.kind}-{_random_suffix()}.json"
        )
        data = (json.dumps(event.fields(), sort_keys=True) + "\n").encode()
        try:
            if not _link_new(events, name, data):
                if once is None:  # pragma: no cover - a random suffix collided
                    raise FileExistsError(17, "File exists")
                return None
        except OSError as exc:
            raise RecordError(f"cannot record {cls.kind!r} in {events!r}: {exc.strerror}") from None
        return event

    def events(self) -> list[dict[str, Any]]:
        """The history as stored objects, oldest first, each checked against the schema."""
        return [e.raw for e in self.history().events]

    def history(self) -> schema.History:
        """The history, checked: an event of the wrong shape is a RecordError naming its file."""
        folder = os.path.join(self.path, "events")
        names = _names(folder, lambda n: n.endswith(".json") and not n.startswith("."))
        found = []
        for name in names:
            path = os.path.join(folder, name)
            try:
                found.append(schema.parse(read_json(path)))
            except schema.EventError as exc:
                raise RecordError(f"event {path!r} is not a valid event: {exc}") from None
        found.sort(key=lambda e: (e.ns, e.kind))
        return schema.History(self.id, found)

    def claim(
        self, name: str, intent: Optional[dict[str, Any]] = None, now: Optional[float] = None
    ) -> bool:
        """Create claim ``name`` once, holding ``intent``; True for the one caller that did.

        The claim appears whole (written aside, then linked), so whoever finds it can read what
        its maker meant to do; ``now`` is the maker's clock (the supervisor's, in tests).
        """
        body = {
            "v": schema.VERSION,
            "pid": os.getpid(),
            "time": round(time.time() if now is None else now, 3),
            **(intent or {}),
        }
        try:
            return _link_new(
                os.path.join(self.path, "claims"),
                name,
                (json.dumps(body, sort_keys=True) + "\n").encode(),
            )
        except OSError as exc:
            raise RecordError(f"cannot claim {name!r} in {self.path!r}: {exc.strerror}") from None

    def has_claim(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.path, "claims", name))

    def claims(self, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        """Claims named ``prefix`` or ``prefix.<anything>``, oldest first, with what each holds.

        A claim of version 1 holds only a pid: its time is the file's, its intent unknown.
        """
        folder = os.path.join(self.path, "claims")
        names = _names(folder, lambda n: n == prefix or n.startswith(prefix + "."))
        found = []
        for name in names:
            path = os.path.join(folder, name)
            try:
                raw = read_regular(path)
                mtime = os.stat(path).st_mtime
            except OSError as exc:
                raise RecordError(f"cannot read claim {path!r}: {exc.strerror}") from None
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not isinstance(body, dict) or not isinstance(body.get("time"), (int, float)):
                body = {"v": 1, "time": mtime}
            found.append((name, body))
        return sorted(found, key=lambda c: (c[1]["time"], c[0]))

    def submissions(self) -> list[dict[str, Any]]:
        return [e.raw for e in self.history().submissions]


def _names(folder: str, keep: Callable[[str], bool]) -> list[str]:
    try:
        return [n for n in os.listdir(folder) if keep(n)]
    except OSError as exc:
        raise RecordError(f"cannot read {folder!r}: {exc.strerror}") from None


def _link_new(folder: str, name: str, data: bytes) -> bool:
    """Write ``data`` as ``folder/name`` if no such file exists: False if one does."""
    tmp = os.path.join(folder, f".{time.time_ns()}-{_random_suffix()}.tmp")
    _fsio.write_new(tmp, data)
    try:
        os.link(tmp, os.path.join(folder, name))
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


def read_regular(path: str) -> bytes:
    """The bytes of the regular file ``path``; OSError for anything else.  Opened
    ``O_NONBLOCK``: a FIFO put where a record's file belongs answers at once instead of hanging
    its reader, and the readers include root's child for each user (the site's view, its
    release service, metrics, prune), which would stall every other user's pass behind it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({stat.filemode(mode)})")
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_json(path: str) -> Any:
    try:
        return json.loads(read_regular(path))
    except FileNotFoundError:
        raise RecordError(f"{path!r} is missing") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read {path!r}: {exc}") from None


def create_job(spec: dict[str, Any], script_bytes: bytes, home: Optional[str] = None) -> JobRecord:
    """Create a new job folder with its spec and script snapshot."""
    base = jobs_dir(home)
    try:
        # Only the user: a record holds the script, which may hold secrets.
        os.makedirs(base, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise RecordError(f"cannot create the record folder {base!r}: {exc.strerror}") from None
    for _ in range(20):
        job_id = new_job_id()
        path = os.path.join(base, job_id)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise RecordError(f"cannot create {path!r}: {exc.strerror}") from None
        break
    else:  # pragma: no cover - 32^7 ids
        raise RecordError(f"could not find a free job id in {base!r}")
    try:
        os.mkdir(os.path.join(path, "events"), 0o700)
        os.mkdir(os.path.join(path, "claims"), 0o700)
        _fsio.write_new(os.path.join(path, "script"), script_bytes, 0o555)
        _fsio.write_new(
            os.path.join(path, "job.json"),
            (json.dumps({**spec, "id": job_id}, indent=2, sort_keys=True) + "\n").encode(),
            0o444,
        )
    except OSError as exc:
        remove_unsubmitted(JobRecord(path))
        raise RecordError(f"cannot write the record {path!r}: {exc.strerror}") from None
    except BaseException:  # Ctrl-C: no half-made record either
        remove_unsubmitted(JobRecord(path))
        raise
    return JobRecord(path)


def remove_unsubmitted(job: JobRecord) -> None:
    """Remove a job whose first submission failed: no half-made job survives."""
    import shutil  # only here: its import costs every submission 2 ms

    shutil.rmtree(job.path, ignore_errors=True)


def open_job(ident: str, home: Optional[str] = None, cluster: Optional[str] = None) -> JobRecord:
    """Find a dispatch job by its id, or by the Slurm job id of one of its submissions (the
    newest record of those that made it: :func:`made_as`).

    With ``cluster`` (this cluster's name), only that cluster's jobs: a Slurm job id names a
    job of its own cluster (ids repeat across clusters), and a job of another cluster is an
    error naming it (Slurm here knows nothing of it)."""
    return max(made_as(ident, home, cluster), key=lambda j: j.created)


def made_as(
    ident: str, home: Optional[str] = None, cluster: Optional[str] = None
) -> list[JobRecord]:
    """The dispatch job ``ident`` names (its id), else those of ``cluster`` that made a
    submission as Slurm job ``ident``: more than one where slurmctld lost its state and
    numbered jobs from its FirstJobId again.  None is an error naming ``ident``."""
    base = jobs_dir(home)
    if ident and "/" not in ident and os.path.isfile(os.path.join(base, ident, "job.json")):
        job = JobRecord(os.path.join(base, ident))
        if not job.of_cluster(cluster):
            raise UsageError(
                f"dispatch job {ident} was submitted to cluster {job.cluster!r}, "
                f"not this one ({cluster!r}): run this command on "
                f"{job.cluster!r}"
            )
        return [job]
    if ident.split("_")[0].isdigit():
        matches = [job for job in all_jobs(home) if _made(job, ident)]
        mine = [job for job in matches if job.of_cluster(cluster)]
        if mine:
            return mine
        if matches:
            named = ", ".join(
                sorted(f"dispatch job {j.id} of cluster {j.cluster!r}" for j in matches)
            )
            raise UsageError(
                f"Slurm job {ident} of this cluster ({cluster!r}) is no dispatch "
                f"job's; on another cluster it is {named}"
            )
    raise UsageError(
        f"no dispatch job {ident!r} in {base!r} "
        "(give a dispatch job id like dab2cd3e, or a Slurm job id)"
    )


def _made(job: JobRecord, slurm_job_id: str) -> bool:
    try:
        return job.history().submission_of(slurm_job_id) is not None
    except RecordError:
        return False  # a garbled record is reported when opened by its own id


def all_jobs(home: Optional[str] = None) -> list[JobRecord]:
    base = jobs_dir(home)
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RecordError(f"cannot list {base!r}: {exc.strerror}") from None
    # A dot name is a record being removed whole (dispatch forget): no reader sees it.
    return [
        JobRecord(os.path.join(base, n))
        for n in names
        if not n.startswith(".") and os.path.isfile(os.path.join(base, n, "job.json"))
    ]


def cluster_jobs(cluster: Optional[str], home: Optional[str] = None) -> list[JobRecord]:
    """The dispatch jobs of ``cluster`` (:meth:`JobRecord.of_cluster`): those a command run
    on that cluster acts on.  Several clusters may share one home, and Slurm job ids repeat
    across clusters."""
    return [job for job in all_jobs(home) if job.of_cluster(cluster)]


def clusters(jobs: list[JobRecord], current: Optional[str]) -> list[str]:
    """The clusters ``jobs`` were submitted to, ``current`` for a record that names none
    (and with it): more than one means a command shows each job's cluster."""
    found = set() if current is None else {current}
    for job in jobs:
        try:
            found.add(job.cluster or current or "")
        except DispatchError:
            continue
    return sorted(found - {""})
