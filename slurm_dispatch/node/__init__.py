"""Root-run evidence on every node: what the hooks record (:mod:`.factstore`, never through a
user's link), the survivor scan over /proc (:mod:`.procscan`), facts grouped into executions
(:mod:`.executions`), and the cessation question ``dispatch-cease`` answers (:mod:`.cease`).
:mod:`.factstore` and :mod:`.procscan` are standard library only, as the hooks import them.
Imports nothing here.
"""
