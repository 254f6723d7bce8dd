"""Tables for people: columns aligned the way squeue aligns them, the last column left free.

Role: the one table renderer of the commands' text (``dispatch list``, ``jobs``, ``gc`` and
:mod:`slurm_dispatch.control.status_text`).  Invariant: pure, standard library only and
importing nothing, so an in-job command (``dispatch list``) pays nothing for it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: the in-job commands' start-up
if TYPE_CHECKING:
    from collections.abc import Sequence


def one_line(text: object) -> str:
    """``text`` on one line: each character that is not printable escaped (``\\n``, ``\\x1b``),
    so that what a user named (a root, a record folder, a job name) can neither start a row
    of its own nor move the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], noheader: bool = False
) -> str:
    """Columns aligned the way squeue aligns them, with the last column left free.  A row may
    end early (``dispatch jobs``' line for an unreadable record): its last cell is free too.
    Every cell is shown on one line (:func:`one_line`)."""
    cells = [[one_line(c) for c in row] for row in rows]
    all_rows = cells if noheader else [list(headers)] + cells
    if not all_rows:
        return ""
    widths = [
        max((len(r[i]) for r in all_rows if i < len(r)), default=0) for i in range(len(headers))
    ]
    lines = []
    for row in all_rows:
        parts = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        lines.append(" ".join(parts).rstrip())
    return "\n".join(lines)
