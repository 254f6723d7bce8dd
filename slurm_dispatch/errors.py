"""The one error tree of slurm-dispatch.

Every error the library raises derives from :class:`DispatchError`; the CLI catches that root
once, prints ``dispatch: <message>`` and exits with the class's ``exit_code``.  The library
never prints.  Messages name the offending value and, where it helps, what would be valid.

::

    DispatchError                      exit 2  (usage errors and unreadable stores by default)
    ├── UsageError                     exit 2  bad option or argument value
    ├── StoreError                     exit 2  a store that cannot be read or written
    │   ├── BadPublicationName (ValueError)   a name in pub/ that does not parse
    │   ├── StoreFull (OSError)        no space left while publishing
    │   └── StoreTimeout (TimeoutError)   a remote store's call or scan not done in time
    ├── RefusedError                   exit 1  a refused operation
    │   ├── OutOfBounds (ValueError)   an epoch component or step outside its bounds
    │   ├── AlreadyPublished (FileExistsError)
    │   └── OutsideRoot (ValueError)   a path that is not inside the checkpoint root
    ├── RecordError                    exit 2  a dispatch job record missing or garbled
    ├── SlurmError                     exit 2  a Slurm command failed; keeps its raw output
    │   └── SlurmUnavailable           the controller did not answer
    ├── NotRequeued                    exit 1  a job that stopped to be requeued and was not
    ├── SandboxError                   exit 2  the sandbox cluster could not be set up
    ├── ConfigError                    exit 2  dispatch.conf has an unknown key or a bad value
    ├── FactError                      exit 2  a hook fact that cannot be written or read safely
    └── MetricsError                   exit 2  the node's metrics file could not be updated

The node hooks import this module (through the fact store): it imports nothing.
"""

from __future__ import annotations


class DispatchError(Exception):
    """Root of every error slurm-dispatch raises."""

    exit_code = 2


class UsageError(DispatchError):
    exit_code = 2


class StoreError(DispatchError):
    exit_code = 2


class BadPublicationName(StoreError, ValueError):
    pass


class StoreFull(StoreError, OSError):
    pass


class StoreTimeout(StoreError, TimeoutError):
    pass


class RefusedError(DispatchError):
    exit_code = 1


class OutOfBounds(RefusedError, ValueError):
    pass


class AlreadyPublished(RefusedError, FileExistsError):
    pass


class OutsideRoot(RefusedError, ValueError):
    pass


class RecordError(DispatchError):
    exit_code = 2


class SlurmError(DispatchError):
    """A Slurm command failed.  ``output`` keeps what the command printed."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        argv: list[str] | None = None,
        output: str = "",
        returncode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.argv = list(argv or [])
        self.output = output
        self.returncode = returncode

    def __str__(self) -> str:
        text = super().__str__()
        if self.output.strip() and self.output.strip() not in text:
            text += "\n" + self.output.rstrip()
        return text


class SlurmUnavailable(SlurmError):
    pass


class NotRequeued(DispatchError):
    """A job stopped at the requeue signal (its save published) and was not requeued: raised
    so that the job ends with a failure status, never COMPLETED, and dispatch's rule for a
    failed job applies."""

    exit_code = 1


class SandboxError(DispatchError):
    exit_code = 2


class ConfigError(DispatchError):
    """dispatch.conf has an unknown key or a bad value (named with its file and line)."""

    exit_code = 2


class FactError(DispatchError):
    """A fact could not be written or read safely (the message says why and where)."""

    exit_code = 2


class MetricsError(DispatchError):
    """The node's metrics file (``MetricsDir``) could not be updated; the hook logs it and goes
    on (its facts are written before)."""

    exit_code = 2
