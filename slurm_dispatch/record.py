"""Dispatch job records: one folder per dispatch job, written by the job's own user.

Layout under ``$DISPATCH_HOME`` (default ``~/.local/state/slurm-dispatch``), which must be on
a file system the compute nodes see (a home directory usually is)::

    jobs/<id>/job.json          the job's spec, written once: G, rules, root, sbatch argv
    jobs/<id>/script            the script as submitted (read-only snapshot)
    jobs/<id>/batch-<N>.sh      the batch script sbatch got for submission N
    jobs/<id>/claims/<name>     O_EXCL claims: whoever creates one does that work, once
    jobs/<id>/events/<ns>-<kind>-<rand>.json   the append-only history

Invariants: an event file is written completely under a temporary name, then renamed into
place, so a reader never sees half an event; nothing is ever rewritten or deleted, except a
job folder removed whole when its first ``sbatch`` failed (no half-made job survives).
Facts about nodes and end states recorded by the site's hooks live elsewhere (the site's
state directory, written by root); this module only holds what the user's side knows.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from .errors import RecordError, UsageError

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Optional

_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l, o, 0, 1: easy to read aloud


def home_dir() -> str:
    explicit = os.environ.get("DISPATCH_HOME")
    if explicit:
        return os.path.abspath(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".local", "state")
    return os.path.join(state, "slurm-dispatch")


def jobs_dir(home: Optional[str] = None) -> str:
    return os.path.join(home or home_dir(), "jobs")


def _random_suffix() -> str:
    return os.urandom(4).hex()


def new_job_id() -> str:
    # 7 letters from 32 (os.urandom bytes, each reduced mod 32 without bias since 256 % 32 == 0)
    return "d" + "".join(_ID_ALPHABET[b % 32] for b in os.urandom(7))


def _write_new(path: str, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


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
    def script(self) -> str:
        return os.path.join(self.path, "script")

    def batch_script(self, submission: int) -> str:
        return os.path.join(self.path, f"batch-{submission}.sh")

    def append(self, kind: str, once: Optional[str] = None, **fields: Any
               ) -> Optional[dict[str, Any]]:
        """Add an event to the history; returns it.

        With ``once``, the event is recorded at most once under that key (for example the
        submission number): a second writer gets ``None``.  The event is written under a
        temporary name and then linked into place, so it appears whole or not at all.
        """
        now = time.time_ns()
        event = {"event": kind, "time": round(now / 1e9, 3), "ns": now, **fields}
        events = os.path.join(self.path, "events")
        name = (f"{kind}-{once}.json" if once is not None
                else f"{now:020d}-{kind}-{_random_suffix()}.json")
        tmp = os.path.join(events, f".{now}-{_random_suffix()}.tmp")
        try:
            _write_new(tmp, (json.dumps(event, sort_keys=True) + "\n").encode())
            try:
                os.link(tmp, os.path.join(events, name))
            except FileExistsError:
                if once is None:
                    raise
                return None
            finally:
                os.unlink(tmp)
        except OSError as exc:
            raise RecordError(f"cannot record {kind!r} in {events!r}: {exc.strerror}") from None
        return event

    def events(self) -> list[dict[str, Any]]:
        """The history, oldest first."""
        folder = os.path.join(self.path, "events")
        try:
            names = [n for n in os.listdir(folder) if n.endswith(".json")
                     and not n.startswith(".")]
        except OSError as exc:
            raise RecordError(f"cannot read {folder!r}: {exc.strerror}") from None
        found = [read_json(os.path.join(folder, n)) for n in names]
        return sorted(found, key=lambda e: (e.get("ns", 0), e["event"]))

    def claim(self, name: str) -> bool:
        """Create claim ``name`` once; True for the one caller that created it."""
        try:
            _write_new(os.path.join(self.path, "claims", name), b"%d\n" % os.getpid())
        except FileExistsError:
            return False
        except OSError as exc:
            raise RecordError(f"cannot claim {name!r} in {self.path!r}: {exc.strerror}") from None
        return True

    def has_claim(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.path, "claims", name))

    def submissions(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == "submitted"]


def read_json(path: str) -> Any:
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        raise RecordError(f"{path!r} is missing") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read {path!r}: {exc}") from None


def create_job(spec: dict[str, Any], script_bytes: bytes, home: Optional[str] = None
               ) -> JobRecord:
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
        _write_new(os.path.join(path, "script"), script_bytes, 0o555)
        _write_new(os.path.join(path, "job.json"),
                   (json.dumps({**spec, "id": job_id}, indent=2, sort_keys=True) + "\n").encode(),
                   0o444)
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise RecordError(f"cannot write the record {path!r}: {exc.strerror}") from None
    return JobRecord(path)


def remove_unsubmitted(job: JobRecord) -> None:
    """Remove a job whose first submission failed: no half-made job survives."""
    shutil.rmtree(job.path, ignore_errors=True)


def open_job(ident: str, home: Optional[str] = None) -> JobRecord:
    """Find a dispatch job by its id, or by the Slurm job id of one of its submissions."""
    base = jobs_dir(home)
    if ident and "/" not in ident and os.path.isfile(os.path.join(base, ident, "job.json")):
        return JobRecord(os.path.join(base, ident))
    slurm_id = ident.split("_")[0]
    if slurm_id.isdigit():
        matches = [job for job in all_jobs(home)
                   if any(str(s.get("slurm_job_id")) == slurm_id for s in job.submissions())]
        if matches:
            return max(matches, key=lambda j: j.spec.get("created", 0))
    raise UsageError(f"no dispatch job {ident!r} in {base!r} "
                     "(give a dispatch job id like dab2cd3e, or a Slurm job id)")


def all_jobs(home: Optional[str] = None) -> list[JobRecord]:
    base = jobs_dir(home)
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise RecordError(f"cannot list {base!r}: {exc.strerror}") from None
    return [JobRecord(os.path.join(base, n)) for n in names
            if os.path.isfile(os.path.join(base, n, "job.json"))]
