"""What one Slurm command did (:class:`Result`): its argv, exit status and output.

The adapter's runner (:func:`.adapter.run_command`, or a test's fake controller) returns one
for each command it runs; :class:`.cli_backend.CliBackend` reads it.  A home of its own so that
neither of the two imports the other for it.

Invariant: standard library only, imports nothing of ours.
"""

from __future__ import annotations


class Result:
    """What one Slurm command did."""

    __slots__ = ("argv", "returncode", "stdout", "stderr")

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
