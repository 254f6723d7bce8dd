"""Slurm's array-range grammar, read in one place: ``--array=0-15%4,20``, ``1-7:2``, and the
``array_task_str`` the controller gives for a pending array's remainder (``2-5%1``).

Pure and standard-library only.  A value is comma-separated parts, each ``N``, ``N-M`` or
``N-M:S``, optionally followed by ``%T`` (at most T tasks at once, which says nothing of the
ids).  Callers say whose value it was: a user's ``--array`` (a UsageError naming it) or the
controller's (a SlurmError naming it); here a value that does not parse is
:class:`ArrayRangeError`, a ValueError naming the part.

Invariant: a part is parsed strictly, the same for every caller: ids are whole numbers not
below 0, a range does not run backwards, a step is at least 1; an empty part is an error.
"""

from __future__ import annotations


class ArrayRangeError(ValueError):
    """An array range value that does not parse; ``part`` is the part that did not."""

    def __init__(self, value: str, part: str) -> None:
        super().__init__(f"{value!r}: {part!r} is not N, N-M or N-M:S")
        self.value = value
        self.part = part


def spans(value: str) -> list[range]:
    """The ranges of an array value, in the order written (``0-15:4%2`` is
    ``[range(0, 16, 4)]``; the ``%`` limit is dropped)."""
    body = value.split("%", 1)[0]
    found = []
    for part in body.split(","):
        span, _, step = part.strip().partition(":")
        first, dash, last = span.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
            stride = int(step) if step else 1
        except ValueError:
            raise ArrayRangeError(value, part) from None
        if low < 0 or high < low or stride < 1:
            raise ArrayRangeError(value, part)
        found.append(range(low, high + 1, stride))
    return found


def task_ids(value: str) -> list[int]:
    """The task ids of an array value, each once, in ascending order."""
    return sorted({task for span in spans(value) for task in span})
