"""The one interface the Slurm adapter's backends keep (:class:`Backend`), and the words both
read as "not now".

The adapter (:class:`.adapter.Slurm`) holds the retries, the timeouts and the choice of backend;
a backend does one try of each read or action and raises :class:`SlurmUnavailable` for a
transient controller error (the adapter retries it) or :class:`SlurmError` for any other.  Two
backends keep it: :class:`.cli_backend.CliBackend` (the command-line tools, every Slurm) and
:class:`.pyslurm_backend.PyslurmBackend` (libslurm, where it matches).

Invariant: standard library only, imports nothing of the backends (``typing`` only when type
checking).
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Iterable, Protocol, Sequence

    from .jobs import Job, Node

    class Backend(Protocol):
        """One try of each read and action; ``job_ids`` are whole job ids (``123``) or, where a
        backend says it takes them, array tasks (``97_1``)."""

        name: str

        def user_jobs(self, uid: int) -> list[Job]:
            """Every job of ``uid`` (every array task), as the controller filters them."""

        def jobs(self, job_id: str) -> list[Job]:
            """Job ``job_id`` (``123``, ``97_1``, an array's id: its tasks); [] if unknown."""

        def nodes(self, names: Sequence[str]) -> dict[str, Node]:
            """Each named node the controller knows."""

        def cancel(self, job_ids: Iterable[str]) -> None: ...

        def hold(self, job_ids: Iterable[str]) -> None: ...

        def release(self, job_ids: Iterable[str]) -> None: ...

        def requeue(self, job_ids: Iterable[str]) -> None: ...

        def set_comment(self, job_id: str, text: str) -> None: ...


_TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Resource temporarily unavailable|Slurm temporarily unavailable|try again|"
    r"Communication connection failure|Zero Bytes were transmitted",
    re.IGNORECASE,
)


def is_transient(text: str) -> bool:
    """The controller's words for "not now": worth another try."""
    return bool(_TRANSIENT.search(text))
