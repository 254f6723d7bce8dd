"""``dispatch-cease JOBID [--restart R] [--json]``: the site command that proves cessation.

Exit 0: every node of that ended execution is proven free of its processes; 1: not proven (still
running, survivors, a node down without a post-kill record, ...); 2: an error (unknown job, a bad
dispatch.conf, the controller not answering).  Prints each node's evidence.
"""

from __future__ import annotations

import json
from typing import Optional

import click

from .shell import ClickShell

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Shell(ClickShell, click.Command):
    prog = "dispatch-cease"
    error_code = 2  # 1 means "not proven": every error must say 2


@click.command(cls=_Shell, context_settings=CONTEXT)
@click.argument("jobid")
@click.option(
    "--restart",
    "-r",
    type=click.IntRange(min=0),
    default=None,
    metavar="R",
    help="The execution to judge: Slurm's restart count (default: the latest).",
)
@click.option(
    "--sluid",
    default=None,
    metavar="SLUID",
    help="Slurm 26.05 and later: the run to judge by its SLUID (SLURM_JOB_SLUID; a "
    "requeue draws a new one), where the job id was used twice once slurmctld's "
    "state started anew (default: the latest run of the restart count).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="FILE",
    help="dispatch.conf to read (default: $SLURM_DISPATCH_CONF, else dispatch.conf "
    "beside slurm.conf: the folder of $SLURM_CONF, else /etc/slurm).",
)
@click.version_option(package_name="slurm-dispatch", prog_name="dispatch-cease")
def main(
    jobid: str,
    restart: Optional[int],
    sluid: Optional[str],
    as_json: bool,
    config_path: Optional[str],
) -> int:
    """Prove that an ended Slurm execution's processes are gone on every node it ran on.

    Evidence that proves, per node: the node's Epilog (run after slurmd killed the job) found no
    process of the execution left, or a later re-check found the survivors gone; or the node
    rebooted after the execution's last record there.  Nothing else proves: a node that is down
    or not responding, survivors, a "Kill task failed" drain, no record.

    Exit 0 ceased, 1 not proven, 2 error.  Example: `dispatch-cease 1234 --restart 0`
    """
    from ..node import cease

    verdict = cease.cessation(jobid, restart, cfg=cease.load_config(config_path), sluid=sluid)
    if as_json:
        click.echo(json.dumps(verdict.as_json(), sort_keys=True))
    else:
        click.echo(cease.render(verdict))
    return verdict.exit_code


if __name__ == "__main__":  # pragma: no cover
    main()
