"""Kept for one release, 0.2.0 (the layout move's), and removed in 0.3.0 (CHANGELOG.md):
``dispatch-sbatch``'s entry point before the layout move was
``slurm_dispatch.cli_sbatch:entry``, and console scripts written by an editable install before it
still import this path.  The command is :mod:`slurm_dispatch.cli.sbatch` (no click, as there).
"""

from .cli.sbatch import entry

__all__ = ["entry"]
