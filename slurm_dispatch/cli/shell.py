"""The one shell of the four commands (dispatch, dispatch-sbatch, dispatch-cease,
dispatch-sandbox): how each of them ends.

Invariant: a command's body runs inside :func:`run`, which ends the process once: the body's
exit code (0 when it returns nothing); a library error (:class:`DispatchError`, caught here and
nowhere else) as one line ``<prog>: <message>`` on stderr with the error class's exit code; a
closed pipe quietly with 1 (dispatch-cease: 2); Ctrl-C with 130.  No traceback reaches the
user for any of these.

No click here (only inside :class:`ClickShell`'s methods, which only the click commands call),
so that ``dispatch-sbatch`` starts without importing it.
"""

from __future__ import annotations

import os
import sys

from ..errors import DispatchError

TYPE_CHECKING = False  # typing is not imported at run time: dispatch-sbatch's start-up
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Callable, NoReturn, Optional

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
BROKEN_PIPE = 1


def run(
    body: Callable[[], Optional[int]],
    prog: str,
    error_code: Optional[int] = None,
    fast_exit: bool = False,
) -> NoReturn:
    """Run a command's body and end the process as the module docstring says.

    ``error_code``, when given, replaces every error class's own exit code and the closed
    pipe's: dispatch-cease answers 1 for "not proven" and so ends every failure with 2.
    ``fast_exit`` (a console entry point only, never a caller in a test's process): once
    stdout and stderr are flushed, the process ends without the interpreter's teardown of its
    modules, about 3 ms of dispatch-sbatch's start-to-end (bench/bench_sbatch.py).  Safe
    where the body writes its files with ``os`` calls it closes itself and registers no
    ``atexit`` work: dispatch-sbatch's does.
    """
    try:
        code = body()
        sys.stdout.flush()  # a closed pipe shows here at the latest, not in the final flush
    except DispatchError as error:
        sys.stderr.write(f"{prog}: {error}\n")
        code = error.exit_code if error_code is None else error_code
    except BrokenPipeError:
        quiet_broken_pipe(BROKEN_PIPE if error_code is None else error_code)
    except KeyboardInterrupt as stop:
        if str(stop):  # what became of the work, when the body knows (dispatch-sbatch)
            sys.stderr.write(f"{prog}: {stop}\n")
        code = INTERRUPTED
    except SystemExit as stop:  # the body's own ending (sbatch's refusal, --test-only)
        if not fast_exit:
            raise
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            sys.stderr.write(f"{stop.code}\n")
    code = code if isinstance(code, int) else 0
    if fast_exit:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:
            quiet_broken_pipe(BROKEN_PIPE if error_code is None else error_code)
        os._exit(code)
    sys.exit(code)


def quiet_broken_pipe(code: int) -> NoReturn:
    """Exit quietly on a closed pipe (`dispatch list | head`): stdout goes to devnull so the
    interpreter's final flush does not complain again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(code)


class ClickShell:
    """Mixed into a click command or group: its ``main`` (the console entry point, and what
    ``click.testing.CliRunner`` calls) parses and invokes inside :func:`run`.

    Click's own ``main`` would answer a closed pipe, Ctrl-C and errors its own way; this one
    keeps click's parsing and help (usage errors print as click prints them, exit 2) and
    leaves the ending to :func:`run`.  Subclasses set ``prog`` (the name usage and errors
    show, whatever ``prog_name`` says) and may set ``error_code``.
    """

    prog = "dispatch"
    error_code: Optional[int] = None

    def main(
        self,
        args: Optional[Sequence[str]] = None,
        prog_name: Optional[str] = None,
        complete_var: Optional[str] = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        import click

        argv = list(sys.argv[1:] if args is None else args)
        command: Any = self
        # Shell completion, as click's own main does it: `_DISPATCH_COMPLETE=bash_source
        # dispatch` prints the script, which calls back with `bash_complete`.
        variable = complete_var or "_" + self.prog.replace("-", "_").upper() + "_COMPLETE"
        instruction = os.environ.get(variable)
        if instruction:
            from click.shell_completion import shell_complete

            sys.exit(shell_complete(command, extra, self.prog, variable, instruction))

        def body() -> Optional[int]:
            try:
                with command.make_context(self.prog, argv, **extra) as ctx:
                    result = command.invoke(ctx)
            except click.exceptions.Exit as done:  # --help, --version, ctx.exit(code)
                return int(done.exit_code)
            except click.exceptions.Abort:  # click's name for Ctrl-C (and EOF) while parsing
                raise KeyboardInterrupt from None
            except click.ClickException as error:
                error.show()
                return int(error.exit_code)
            return result if isinstance(result, int) else None

        run(body, self.prog, self.error_code)
