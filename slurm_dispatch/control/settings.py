"""The settings the control side works by: the supervisor's, from the site's dispatch.conf
(:func:`site_settings`), and a job's own option over the site's default where the job may
give one (:func:`avoid_setting`, :func:`stall_setting`, recorded in its spec at the first
submission).  Read by the supervisor, the holds, ``dispatch plan`` and the submission; it
imports nothing of the control side.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Any, Optional

    from .sbatch_args import DispatchOptions


@dataclass(frozen=True)
class Settings:
    hold_for: float = 24 * 3600.0
    signal: Optional[str] = "dispatch-cease"
    interval: float = 60.0
    signal_timeout: float = 120.0
    # slurm.conf's MinJobAge: an ended job stays known to slurmctld at least this long.
    # None: ask the controller (once a pass, only when a claim needs it).
    min_job_age: Optional[float] = 300.0
    mail: bool = False  # tell a hold's owner through Slurm's MailProg
    notify: Optional[str] = None  # the site's HoldNotify command
    warn_before: float = 7200.0  # HoldWarning


def site_settings() -> Settings:
    """The supervisor's settings from the site's dispatch.conf; a bad file is an error."""
    from .. import config
    from ..errors import ConfigError

    conf = config.load()
    if conf.problems:
        # Not the hooks' "using the defaults": a command stops on a dispatch.conf it cannot read.
        raise ConfigError(
            f"site configuration: {config.refusal(conf)}; nothing done (the "
            "commands stop where dispatch.conf or $SLURM_DISPATCH_CONF is wrong; "
            "only the hooks go on with the defaults)"
        )
    return Settings(
        hold_for=float(conf.shared_hold_for),
        signal=conf.cessation_signal or None,
        interval=float(conf.cessation_interval),
        min_job_age=None,
        mail=True,
        notify=conf.hold_notify or None,
        warn_before=float(conf.hold_warning),
    )


def avoid_setting(options: DispatchOptions) -> tuple[int, bool, int]:
    """(N, whether the job gave it, the site's default) for a job submitted with
    ``options``: its own ``--avoid-bad-nodes``, else the site's ``AvoidBadNodes``
    (dispatch.conf, 0 where it sets none)."""
    from .. import config

    site = config.load().avoid_bad_nodes
    if options.avoid_bad_nodes is not None:
        return options.avoid_bad_nodes, True, site
    return site, False, site


def stall_setting(options: Any) -> tuple[int, str]:
    """(seconds, where it comes from) for a job submitted with ``options``: its own
    ``--stall-timeout`` (0: off), else the site's ``StallTimeout`` (dispatch.conf)."""
    if options.stall_timeout is not None:
        return options.stall_timeout, "--stall-timeout"
    from .. import config

    site = config.load().stall_timeout
    return site, ("the site's StallTimeout" if site else "default")
