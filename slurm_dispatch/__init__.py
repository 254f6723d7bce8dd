"""slurm-dispatch: make overlapping Slurm executions harmless.

Every execution writes only into ``<checkpoint>/exec/<DISPATCH_ATTEMPT>/``; a save becomes
visible only through an append-only publication in ``<checkpoint>/pub/``, ordered by
``DISPATCH_EPOCH`` then step.  See ``docs/user-guide.md``.
"""

__version__ = "0.1.0"
