"""Slurm's array-range grammar, read in one place: ``--array=0-15%4,20``, ``1-7:2``, and the
``array_task_str`` the controller gives for a pending array's remainder (``2-5%1``).

Pure and standard-library only.  A value is comma-separated parts, each ``N``, ``N-M`` or
``N-M:S``, optionally followed by ``%T`` (at most T tasks at once, which says nothing of the
ids).  Callers say whose value it was: a user's ``--array`` (a UsageError naming it) or the
controller's (a SlurmError naming it); here a value that does not parse is
:class:`ArrayRangeError`, a ValueError naming the part.

Invariant: a part is parsed strictly, the same for every caller: ids are whole numbers not
below 0 nor above :data:`MAX_TASK_ID`, a range does not run backwards, a step is at least 1; an
empty part is an error.
"""

from __future__ import annotations

#: The largest task id any Slurm takes: ids are below MaxArraySize, which slurm.conf(5) caps at
#: 4000001.  A larger one is refused here before a range of billions of ids is made.
MAX_TASK_ID = 4_000_000


class ArrayRangeError(ValueError):
    """An array range value that does not parse; ``part`` is the part that did not;
    ``too_large`` when it parsed but names an id above :data:`MAX_TASK_ID`."""

    def __init__(self, value: str, part: str, too_large: bool = False) -> None:
        super().__init__(
            f"{value!r}: {part!r} is not N, N-M or N-M:S"
            if not too_large
            else f"{value!r}: {part!r} names a task id above {MAX_TASK_ID}"
        )
        self.value = value
        self.part = part
        self.too_large = too_large


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
        span_ids = range(low, high + 1, stride)
        if span_ids[-1] > MAX_TASK_ID:
            raise ArrayRangeError(value, part, too_large=True)
        found.append(span_ids)
    return found


def task_ids(value: str) -> list[int]:
    """The task ids of an array value, each once, in ascending order."""
    return sorted({task for span in spans(value) for task in span})
