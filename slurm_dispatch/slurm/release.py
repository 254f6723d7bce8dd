"""Slurm's releases as the adapter compares them: a version's major release
(:func:`major_release`: ``22.05.8`` and pyslurm's ``22.5.3`` are both (22, 5)), and what the
pyslurm probe found (:class:`Probe`): whether pyslurm's release is the running Slurm's.

:mod:`.select` runs the probe and makes a :class:`Probe`; :mod:`.pyslurm_backend` reads the
release pyslurm has from it; :mod:`.cli_backend` asks whether ``squeue`` names a release that
prints SLUIDs.  A home of its own, so that the backend :mod:`.select` builds does not import
:mod:`.select` back.

Invariant: standard library only, imports nothing of ours.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Optional


class Probe:
    """What the probe found: ``usable``, or ``why`` not; the two versions when known."""

    __slots__ = ("usable", "why", "pyslurm_version", "slurm_version")

    def __init__(
        self, usable: bool, why: str = "", pyslurm_version: str = "", slurm_version: str = ""
    ) -> None:
        self.usable = usable
        self.why = why
        self.pyslurm_version = pyslurm_version
        self.slurm_version = slurm_version

    def __repr__(self) -> str:
        return (
            f"Probe(usable={self.usable}, pyslurm={self.pyslurm_version!r}, "
            f"slurm={self.slurm_version!r}, why={self.why!r})"
        )


def major_release(version: str) -> Optional[tuple[int, int]]:
    """``22.05.8`` and ``22.5.3`` are both (22, 5); None when ``version`` does not start so."""
    parts = version.strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = ""
    for char in parts[1]:
        if not char.isdigit():
            break
        minor += char
    return (int(parts[0]), int(minor)) if minor else None
