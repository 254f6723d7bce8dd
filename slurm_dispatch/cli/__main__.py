"""``python -m slurm_dispatch.cli``: ``dispatch``, as when the command was the module ``cli.py``
(before the layout move); kept for one release, for scripts that run it so."""

from .dispatch import main

main()
