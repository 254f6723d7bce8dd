"""``python -m slurm_dispatch.cli``: ``dispatch``, as when the command was the module ``cli.py``
(before the layout move); kept for one release, 0.2.0, for scripts that run it so, and removed
in 0.3.0 (CHANGELOG.md)."""

from .dispatch import main

main()
