"""The four commands: ``dispatch`` (:mod:`.dispatch`), ``dispatch-sbatch`` (:mod:`.sbatch`, no
click), ``dispatch-cease`` (:mod:`.cease`), ``dispatch-sandbox`` (:mod:`.sandbox`); how each ends
(:mod:`.shell`); man pages and completions from their own help (:mod:`.manpages`).  They parse,
call the library, print and exit; no rule lives here.  Imports nothing here.
"""
