"""``dispatch-admin``: the site admin's commands (run as root), one subcommand each.

``dispatch-admin doctor`` runs each installed hook part the way Slurm would and says what is
broken, with the fix.  A new subcommand is one more ``@main.command()`` function here (its work
in the side it belongs to), with its man page regenerated (``make docs``).
"""

from __future__ import annotations

import json
from typing import Optional

import click

from .shell import ClickShell

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Shell(ClickShell, click.Group):
    prog = "dispatch-admin"


@click.group(cls=_Shell, context_settings=CONTEXT)
@click.version_option(package_name="slurm-dispatch", prog_name="dispatch-admin")
def main() -> None:
    """The site admin's slurm-dispatch commands: run them as root.

    Example: `dispatch-admin doctor` on a compute node after installing or upgrading.
    """


@main.command()
@click.option("--controller", is_flag=True,
              help="Also run PrologSlurmctld and EpilogSlurmctld (on the slurmctld host).")
@click.option("--no-node", "node_parts", is_flag=True, flag_value=False, default=True,
              help="Skip the node's Prolog, Epilog and HealthCheckProgram (with --controller "
                   "on a controller that is no compute node).")
@click.option("--node", metavar="NAME", default=None,
              help="The node name slurmd runs as (default: this host's short name).")
@click.option("--slurm-conf", metavar="FILE", default=None,
              help="slurm.conf to read the hooks from (default: $SLURM_CONF, else "
                   "/etc/slurm/slurm.conf).")
@click.option("--config", "config_path", default=None, metavar="FILE",
              help="dispatch.conf to read (default: $SLURM_DISPATCH_CONF, else dispatch.conf "
                   "beside slurm.conf); a part's own DISPATCH_CONF knob wins for that part.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def doctor(controller: bool, node_parts: bool, node: Optional[str], slurm_conf: Optional[str],
           config_path: Optional[str], as_json: bool) -> int:
    """Run each installed slurm-dispatch hook part the way Slurm would; say what is broken.

    Reads slurm.conf's Prolog, Epilog, HealthCheckProgram (and with --controller
    PrologSlurmctld, EpilogSlurmctld) as slurmd does, finds the slurm-dispatch parts among
    them, checks each is there and executable and that its DISPATCH_PYTHON has the package (and
    the same version as every other part and this command), then runs it as slurmd runs it
    (Slurm's environment for that hook, no PATH, as root) for a job id no Slurm gives
    (doctor-<token>) and checks that the fact it must write arrives under dispatch.conf's
    StateDir.  The doctor's own facts are removed afterwards; nothing else is.

    Each check is one line (STATE ok or FAIL), then the fix of each failure.  Exit 0 when
    every check passed, 1 when one failed, 2 on an error.  Run it on every node (with pdsh or
    clush), and once with --controller on the slurmctld host.
    """
    from ..node import doctor as doctor_module
    name = node or doctor_module.Doctor().node
    checks = doctor_module.Doctor(slurm_conf=slurm_conf, config_path=config_path, node=name,
                                  controller=controller, node_parts=node_parts).run()
    bad = doctor_module.failed(checks)
    if as_json:
        click.echo(json.dumps({"node": name, "ok": not bad, "version": _version(),
                               "checks": list(doctor_module.iter_json(checks))},
                              sort_keys=True))
    else:
        click.echo(doctor_module.render(checks, name))
    return 1 if bad else 0


def _version() -> str:
    from .. import __version__
    return __version__


if __name__ == "__main__":  # pragma: no cover
    main()
