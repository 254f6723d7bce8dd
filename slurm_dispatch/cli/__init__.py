"""The four commands: ``dispatch`` (:mod:`.dispatch`), ``dispatch-sbatch`` (:mod:`.sbatch`, no
click), ``dispatch-cease`` (:mod:`.cease`), ``dispatch-sandbox`` (:mod:`.sandbox`); how each ends
(:mod:`.shell`); man pages and completions from their own help (:mod:`.manpages`).  They parse,
call the library, print and exit; no rule lives here.  Imports nothing at import time.

``main`` is kept for one release, 0.2.0, and removed in 0.3.0 (CHANGELOG.md): console scripts
written by an editable install before the layout move say ``from slurm_dispatch.cli import
main`` (``dispatch``'s entry point was ``slurm_dispatch.cli:main``); it is
:func:`.dispatch.main`, resolved at first use (PEP 562).
"""


def __getattr__(name: str) -> object:
    if name != "main":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .dispatch import main

    return main
