"""How every command ends: library errors become ``<prog>: <message>`` and the error's exit
code; a closed pipe is quiet; Ctrl-C is 130.  No click here, so ``dispatch-sbatch`` starts fast.
"""

from __future__ import annotations

import os
import sys

from .errors import DispatchError


def fail(error: DispatchError, prog: str = "dispatch") -> None:
    sys.stderr.write(f"{prog}: {error}\n")
    sys.exit(error.exit_code)


def run_guarded(function, prog: str = "dispatch") -> None:  # type: ignore[no-untyped-def]
    """Run a command's body, mapping the library's errors to messages and exit codes."""
    try:
        function()
    except DispatchError as error:
        fail(error, prog)
    except BrokenPipeError:
        quiet_broken_pipe(1)
    except KeyboardInterrupt:
        sys.exit(130)


def quiet_broken_pipe(code: int) -> None:
    """Exit quietly on a closed pipe (`dispatch list | head`): stdout goes to devnull so the
    interpreter's final flush does not complain again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(code)
