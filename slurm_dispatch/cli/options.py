"""The options several commands share, declared once: a command that prints a table takes
:func:`table_options` (``--json``, ``--noheader``/``-H``), so that what works for one table
(``dispatch jobs -H``) works for every one (``dispatch list``, ``dispatch-admin holds``).

Invariant: click only; nothing of ours is imported, so the in-job commands (``dispatch list``)
pay nothing for it.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

NOHEADER_HELP = "Leave out the header line (as squeue -h)."


def table_options(json_is: str) -> Callable[[F], F]:
    """``--json`` (printing ``json_is``, "one JSON list") and ``--noheader``/``-H``, passed
    to the command as ``as_json`` and ``noheader``."""

    def add(command: F) -> F:
        command = click.option("--noheader", "-H", "noheader", is_flag=True, help=NOHEADER_HELP)(
            command
        )
        return click.option(
            "--json", "as_json", is_flag=True, help=f"Print {json_is} instead of the table."
        )(command)

    return add
