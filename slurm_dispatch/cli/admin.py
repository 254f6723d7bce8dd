"""``dispatch-admin``: the site admin's commands (run as root), one subcommand each.

``dispatch-admin doctor`` runs each installed hook part the way Slurm would and says what is
broken, with the fix.  ``holds`` is a read-only view across every user's records;
``release-service`` lifts the holds the site's CessationSignal proves ceased, on the users'
behalf (what a site that made ``facts/`` 0700 runs instead of the users' own supervisors
asking).  Both read and write users' records only as the user who owns them
(:mod:`slurm_dispatch.control.siteview`).  A new subcommand is one more ``@main.command()``
function here (its work in the side it belongs to), with its man page regenerated
(``make docs``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

import click

from .._table import one_line, render_table
from ..errors import DispatchError, UsageError
from .options import table_options
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
@click.option(
    "--controller",
    is_flag=True,
    help="Also run PrologSlurmctld and EpilogSlurmctld (on the slurmctld host).",
)
@click.option(
    "--no-node",
    "node_parts",
    is_flag=True,
    flag_value=False,
    default=True,
    help="Skip the node's Prolog, Epilog and HealthCheckProgram (with --controller "
    "on a controller that is no compute node).",
)
@click.option(
    "--node",
    metavar="NAME",
    default=None,
    help="The node name slurmd runs as (default: this host's short name).",
)
@click.option(
    "--slurm-conf",
    metavar="FILE",
    default=None,
    help="slurm.conf to read the hooks from (default: $SLURM_CONF, else /etc/slurm/slurm.conf).",
)
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="FILE",
    help="dispatch.conf to read (default: $SLURM_DISPATCH_CONF, else dispatch.conf "
    "beside slurm.conf); each part is run with the one it finds itself (its "
    "DISPATCH_CONF knob, else the search in Slurm's environment for that "
    "hook), and a part that finds none where this one exists fails.",
)
@table_options("one JSON object")
def doctor(
    controller: bool,
    node_parts: bool,
    node: Optional[str],
    slurm_conf: Optional[str],
    config_path: Optional[str],
    as_json: bool,
    noheader: bool,
) -> int:
    """Run each installed slurm-dispatch hook part the way Slurm would; say what is broken.

    Reads slurm.conf's Prolog, Epilog, HealthCheckProgram (and with --controller
    PrologSlurmctld, EpilogSlurmctld) as slurmd does, finds the slurm-dispatch parts among
    them, checks each is there and executable and that its DISPATCH_PYTHON has the package (and
    the same version as every other part and this command), then runs it as slurmd runs it
    (Slurm's environment for that hook, no PATH, SLURM_CONF only for the node's Prolog and
    Epilog, as Slurm gives it; the node's as root, PrologSlurmctld and
    EpilogSlurmctld as slurm.conf's SlurmUser, as slurmctld runs them) for a job id no Slurm
    gives (doctor-<token>) and checks that the fact it must write arrives under dispatch.conf's
    StateDir, which must be writable by the user the part runs as (with --controller, checked
    as SlurmUser).  The doctor's own facts are removed afterwards; nothing else is.

    Each check is one line (STATE ok or FAIL), then the fix of each failure.  Exit 0 when
    every check passed, 1 when one failed, 2 on an error.  Run it on every node (with pdsh or
    clush, -H leaving out each node's header), and once with --controller on the slurmctld
    host.
    """
    from ..node import doctor as doctor_module

    name = node or doctor_module.Doctor().node
    checks = doctor_module.Doctor(
        slurm_conf=slurm_conf,
        config_path=config_path,
        node=name,
        controller=controller,
        node_parts=node_parts,
    ).run()
    bad = doctor_module.failed(checks)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "node": name,
                    "ok": not bad,
                    "version": _version(),
                    "checks": list(doctor_module.iter_json(checks)),
                },
                sort_keys=True,
            )
        )
    else:
        click.echo(doctor_module.render(checks, name, noheader))
    return 1 if bad else 0


def _version() -> str:
    from .. import __version__

    return __version__


# control/siteview.DEFAULT_RECORDS, spelled here so that dispatch-admin loads no control side
# before a command needs it (test_admin_records_default keeps the two equal).
DEFAULT_RECORDS = "%h/.local/state/slurm-dispatch"
RECORDS_HELP = (
    "Where each user's records are: %u the user's name, %h their home "
    "(default %h/.local/state/slurm-dispatch, the users' default DISPATCH_HOME)."
)


def _root() -> None:
    if os.geteuid() != 0:
        raise UsageError(
            "run as root: users' records are in their homes, and are read (and "
            "written) as each user, which only root can do"
        )


def _chosen(user: tuple[str, ...], records: str, state_dir: str) -> Any:
    """(the users to look at with their record homes, the errors naming those that could
    not be): ``user``, else every account listed and every user StateDir names."""
    from ..control import siteview

    return siteview.users(list(user), records, state_dir)


def _when(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    from .. import _clock

    return _clock.instant(seconds)


def _left(now: float, deadline: float) -> str:
    if deadline <= now:
        return "EXPIRED"
    left = int(deadline - now)  # squeue's TIME_LEFT: [D-]HH:MM:SS
    days, rest = divmod(left, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


@main.command()
@click.option(
    "--user",
    "-u",
    multiple=True,
    metavar="NAME",
    help="Only this user's holds (repeatable; default: every user with records).",
)
@click.option(
    "--records",
    default=DEFAULT_RECORDS,
    show_default=False,
    metavar="PATTERN",
    help=RECORDS_HELP + " Root only.",
)
@table_options("one JSON object")
def holds(user: tuple[str, ...], records: str, as_json: bool, noheader: bool) -> Optional[int]:
    """Every standing shared-checkpoint hold across users: read-only.

    One line per hold, soonest deadline first: the user, the dispatch job, the held Slurm job
    (what squeue shows as held), its deadline and the time left, and each ended execution it
    waits for (Slurm job id and restart) with the site's last answer about it (ceased, not
    ceased, error, not asked) and when it was asked.  --json gives the evidence too.

    Root reads every user's records (as that user).  A member of dispatch.conf's
    SiteViewGroup, not root, reads the copy root's release-service writes on each pass
    (StateDir/siteview/holds.json), told on stderr how old it is; anyone else is refused.
    Exit 0; 1 when a user's records could not be read (named on stderr, the rest still
    shown) or the copy is older than three CessationIntervals (the service is not running).

    Example: `dispatch-admin holds --user alice`
    """
    from ..control import siteview

    now = time.time()
    stale = False
    if os.geteuid() == 0:
        cfg, _ = _site_config()
        chosen, unfound = _chosen(user, records, cfg.state_dir)
        seen = siteview.view(chosen)
        seen["errors"] = unfound + seen["errors"]
    else:
        seen, stale = _group_view(user, records, now)
    if as_json:
        click.echo(json.dumps(seen, sort_keys=True))
    else:
        rows = _hold_rows(seen["holds"], now)
        text = render_table(
            [
                "USER",
                "DISPATCH_JOB",
                "HELD",
                "DEADLINE",
                "LEFT",
                "WAITS_FOR",
                "LAST_ANSWER",
                "ASKED",
            ],
            rows,
            noheader,
        )
        if text:
            click.echo(text)
    for error in seen["errors"]:
        click.echo(f"dispatch-admin: {_shown(error)}", err=True)
    return 1 if seen["errors"] or stale else None


def _group_view(user: tuple[str, ...], records: str, now: float) -> tuple[dict[str, Any], bool]:
    """What a SiteViewGroup member reads: the copy root's release-service wrote (of ``user``
    only, where named), said on stderr with its age; and whether it is stale."""
    from ..control import siteview

    if records != DEFAULT_RECORDS:
        raise UsageError(
            f"--records {records!r}: only root reads users' records; a "
            "SiteViewGroup member reads the release service's copy"
        )
    cfg, where = _site_config()
    if not cfg.site_view_group:
        raise UsageError(
            "run as root, or as a member of the group dispatch.conf names "
            f"as SiteViewGroup ({where} sets none): users' records are in "
            "their homes, which only root reads"
        )
    group = siteview.site_group(cfg.site_view_group, where)
    seen = siteview.read_snapshot(cfg.state_dir, group, where)
    if user:
        seen["holds"] = [h for h in seen.get("holds", []) if h.get("user") in user]
    written = float(seen["written_at"])
    limit = 3 * cfg.cessation_interval
    ahead = written - now > 300  # another host's clock ahead: its age cannot be told
    stale = now - written > limit or ahead
    only = seen.get("only_users")
    from .. import _clock

    click.echo(
        f"dispatch-admin: the site view as of {_clock.instant(written)} "
        f"({_clock.ago(written, now)} old), from "
        f"{siteview.snapshot_path(cfg.state_dir)}"
        + (
            f": stale, older than 3 CessationIntervals ({limit:g} s); is root's "
            "release-service (dispatch-release.timer) running?"
            if stale and not ahead
            else ""
        )
        + (
            f": written ahead of this host's clock (by {_left(now, written)} or so): "
            "the release service's host and this one disagree on the time, so how "
            "old it is is not known"
            if ahead
            else ""
        )
        + (
            f"; only the holds of {', '.join(map(str, only))}: root's "
            "release-service ran with --user"
            if isinstance(only, list)
            else ""
        ),
        err=True,
    )
    return seen, stale


def _hold_rows(holds: list[dict[str, Any]], now: float) -> list[list[str]]:
    """A row of `dispatch-admin holds`' table per hold."""
    rows = []
    for hold in holds:
        waits = ",".join(f"{e['slurm_job_id']}+{e['restart']}" for e in hold["ended"])
        verdicts = ",".join(e["verdict"].replace(" ", "_") for e in hold["ended"])
        asked = max(
            (e["asked_at"] for e in hold["ended"] if e["asked_at"] is not None), default=None
        )
        held = hold["held_slurm_job_id"] + (f"_{hold['task']}" if hold["task"] is not None else "")
        rows.append(
            [
                _shown(cell)
                for cell in (
                    hold["user"],
                    hold["dispatch_job"],
                    held,
                    _when(hold["deadline"]),
                    _left(now, hold["deadline"]),
                    waits,
                    verdicts,
                    _when(asked),
                )
            ]
        )
    return rows


def _shown(text: object) -> str:
    """``text`` on one line: what a user wrote (a record folder's name, an event's job id)
    has each character that is not printable escaped, so that it can neither start a row of
    its own in the table root and the group read nor move the terminal."""
    return one_line(text)


def _site_config() -> Any:
    """dispatch.conf, and where it is for messages; a bad file is an error."""
    from .. import config as config_module
    from ..errors import ConfigError

    cfg = config_module.load()
    if cfg.problems:
        raise ConfigError(config_module.refusal(cfg))
    return cfg, cfg.path or config_module.config_path()


@main.command("release-service")
@click.option(
    "--user",
    "-u",
    multiple=True,
    metavar="NAME",
    help="Only this user's holds (repeatable; default: every user with records).",
)
@click.option("--records", default=DEFAULT_RECORDS, metavar="PATTERN", help=RECORDS_HELP)
@click.option("--loop", is_flag=True, help="A pass every CessationInterval, for ever.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors.")
def release_service(user: tuple[str, ...], records: str, loop: bool, quiet: bool) -> Optional[int]:
    """Lift, on the users' behalf, the holds proven ceased: one pass, or --loop.

    For every standing hold of every user (or --user), asks the site's CessationSignal
    (dispatch.conf; default dispatch-cease) as root about each ended execution the hold waits
    for, at most every CessationInterval; records each answer in the user's record and, when
    every one is ceased, releases the held Slurm job, as that user.  Root never opens a user's
    files: each user's records are read and written by a process running as that user.  It
    asks only about a user's own Slurm jobs (whose, the controller says, else sacct, else the
    facts under StateDir): a record naming another's is answered with an error, not asked.

    Run it where a site made facts/ 0700 (so users' supervisors cannot ask dispatch-cease):
    from a systemd timer (contrib/systemd/dispatch-release.*) or root's cron
    (`* * * * * dispatch-admin release-service -q`).  With SiteViewGroup set in dispatch.conf,
    each pass then writes the view `dispatch-admin holds` shows root, whole, to
    StateDir/siteview/holds.json (0640 root:that group), for that group's members (without a
    CessationSignal it writes only that); the group is looked up at each write, so one that
    does not resolve (a directory service down a moment) fails that write alone.  Exit 0; 1
    when something failed (each failure on stderr, the other users still served).
    """
    from ..control import siteview
    from ..control.settings import site_settings

    _root()
    settings = site_settings()
    cfg, where = _site_config()
    if not cfg.site_view_group:  # a copy the group read stays readable by it until removed
        gone = siteview.remove_snapshot(cfg.state_dir)
        if gone and not quiet:
            click.echo(
                f"site view: {where} sets no SiteViewGroup: removed {gone}, which "
                "its group could still read"
            )
    if not settings.signal and not cfg.site_view_group:
        raise UsageError(
            "dispatch.conf sets no CessationSignal: holds wait for a person "
            "(dispatch release), there is nothing to ask"
        )
    while True:
        chosen, unfound = _chosen(user, records, cfg.state_dir)
        done: dict[str, list[str]] = {"actions": [], "errors": []}
        if settings.signal:
            done = siteview.release_pass(
                chosen,
                settings.signal,
                settings.signal_timeout,
                settings.interval,
                state_dir=cfg.state_dir,
            )
        done["errors"] = unfound + done["errors"]
        if cfg.site_view_group:
            try:  # resolved at each write: a directory service may be back, or gone a moment
                group = siteview.site_group(cfg.site_view_group, where)
                now = time.time()
                seen = siteview.view(chosen)
                seen["errors"] = unfound + seen["errors"]
                if user:  # the group reads it as the site's: it says whose it is
                    seen["only_users"] = sorted(set(user))
                path = siteview.write_snapshot(cfg.state_dir, group, seen, now)
                done["actions"].append(
                    f"site view: {len(seen['holds'])} standing hold(s) "
                    f"written to {path} for group {group.gr_name}"
                )
            except DispatchError as exc:  # the pass's own work is still said, and --loop goes on
                done["errors"].append(f"site view not written: {exc}")
        if not quiet:
            for action in done["actions"]:
                click.echo(_shown(action))
        for error in done["errors"]:
            click.echo(f"dispatch-admin: {_shown(error)}", err=True)
        if not loop:
            return 1 if done["errors"] else None
        time.sleep(settings.interval)


@main.command()
@click.option(
    "--older-than",
    metavar="DURATION",
    default=None,
    help="Remove facts older than this (seconds, HH:MM:SS or D-HH:MM:SS; default: "
    "dispatch.conf's FactRetention).",
)
@click.option(
    "--records-older-than",
    metavar="DURATION",
    default=None,
    help="Also forget users' settled records last active before this long ago "
    "(default: dispatch.conf's RecordRetention; unset, records are left alone).",
)
@click.option(
    "--records", default=DEFAULT_RECORDS, show_default=False, metavar="PATTERN", help=RECORDS_HELP
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option(
    "--verbose", "-v", is_flag=True, help="Also name each job folder and record kept, and why."
)
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="FILE",
    help="dispatch.conf to read (default: $SLURM_DISPATCH_CONF, else dispatch.conf "
    "beside slurm.conf).",
)
def prune(
    older_than: Optional[str],
    records_older_than: Optional[str],
    records: str,
    dry_run: bool,
    verbose: bool,
    config_path: Optional[str],
) -> int:
    """Remove the facts under StateDir/facts, and the users' records, nothing needs (cron).

    Facts: a job's folder facts/UID/JOBID goes whole, and only when its newest fact is older
    than the retention, every fact in it reads whole, its facts prove every execution ceased
    (each node's start has an end with no survivor, or a later re-check found them gone; the
    controller's start has its end), no node still watches its survivors, and its user's
    records neither hold it nor are unsettled about it.  A user whose records cannot be read
    keeps everything; nothing that is not a fact file of ours (a symlink, another owner's
    file) is removed or followed.

    Records (with RecordRetention or --records-older-than): for every user with records, the
    records of this cluster last active before that are forgotten by dispatch forget's own
    rules: never one a Slurm job of which the controller still knows, one with a standing
    hold, one being submitted, one not settled, one an unsettled job waits for.  Each user's
    records are read and removed by a process running as that user, never by root; one that
    cannot be read keeps all of them (named on stderr).  A record goes whole.

    Prints each record forgotten and each folder removed (with --verbose each kept, and why),
    progress on stderr, then a summary of each.  Run it as root (the owner of StateDir) where
    StateDir is mounted, for example daily: `dispatch-admin prune --older-than 30-00:00:00`.
    Exit 0; 1 when a user's records could not be read or forgotten; 2 on an error.
    """
    import sys

    from .. import config as config_module
    from ..errors import ConfigError

    cfg = config_module.load(config_path)
    if cfg.problems:
        raise ConfigError(config_module.refusal(cfg, "--config" if config_path else ""))
    keep_for = _duration("--older-than", older_than, cfg.fact_retention)
    records_for = _duration("--records-older-than", records_older_than, cfg.record_retention)
    if keep_for is None and records_for is None:
        where = cfg.path or config_module.config_path()
        raise UsageError(
            "no retention: give --older-than DURATION or set FactRetention in "
            f"{where} (facts), --records-older-than DURATION or RecordRetention "
            "(users' records)"
        )
    failed = False
    if records_for is not None:
        _root()
        failed = _prune_records(records, records_for, dry_run, verbose, cfg.state_dir)
    if keep_for is not None:
        _prune_facts(cfg.state_dir, keep_for, records, dry_run, verbose)
    sys.stdout.flush()
    return 1 if failed else 0


def _prune_facts(
    state_dir: str, keep_for: float, records: str, dry_run: bool, verbose: bool
) -> None:
    """Remove (or, dry, name) the job folders of facts nothing needs; say each, and why each
    kept one stays where ``verbose``, then a summary."""
    from ..control import retention
    from ..node import prune as prune_module

    needs: dict[int, Optional[set[str]]] = {}

    def needed(uid: int) -> Optional[set[str]]:
        if uid not in needs:
            needs[uid] = retention.user_needs(uid, records)
        return needs[uid]

    verb = "would remove" if dry_run else "removed"
    removed = facts = size = judged_count = 0
    kept: dict[str, int] = {}
    for judged in prune_module.plan(state_dir, keep_for, needed):
        judged_count += 1
        if judged_count % 1000 == 0:
            click.echo(f"dispatch-admin prune: {judged_count} job folders judged", err=True)
        if judged.reason is not None:
            kept[judged.reason] = kept.get(judged.reason, 0) + 1
            if verbose:
                click.echo(f"kept {judged.path}: {judged.reason} ({judged.detail})")
            continue
        count = len(judged.names) if dry_run else prune_module.remove(state_dir, judged)
        removed += 1
        facts += count
        size += judged.size
        click.echo(f"{verb} {judged.path} ({count} facts, {judged.size} bytes)")
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(kept.items()))
    click.echo(
        f"{verb} {removed} job folders ({facts} facts, {size} bytes) older than "
        f"{keep_for:g} s under {state_dir}/facts; kept {sum(kept.values())}"
        + (f": {why}" if why else "")
    )


def _duration(option: str, given: Optional[str], configured: Optional[float]) -> Optional[float]:
    if given is None:
        return configured
    from .. import config as config_module

    try:
        return config_module.parse_duration(given)
    except ValueError as exc:
        raise UsageError(f"{option} {exc}") from None


def _prune_records(
    records: str, older_than: float, dry_run: bool, verbose: bool, state_dir: str
) -> bool:
    """Forget every user's records last active before ``older_than`` ago (as each user);
    True when a user's records could not be read or forgotten, or a user named in
    ``state_dir`` could not be looked up."""
    from ..control import retention
    from ..slurm.adapter import Slurm

    cluster = Slurm().cluster()
    if cluster is None:
        raise UsageError(
            "records not pruned: this host's slurm.conf names no ClusterName and "
            "the controller did not say it; records of several clusters may "
            "share a home, and only this cluster's are judged"
        )
    before = time.time() - older_than
    verb = "would forget" if dry_run else "forgot"
    chosen, unfound = _chosen((), records, state_dir)
    failed = bool(unfound)
    going = kept = size = 0
    for name, got in retention.forget_old(chosen, cluster, before, dry_run):
        for left in got.get("finished", []):
            click.echo(
                f"finished forgetting {name}/{_shown(left)} (left half removed by a killed run)"
            )
        for entry in got.get("forgotten", []):
            going += 1
            size += entry["bytes"]
            click.echo(
                f"{verb} {name}/{_shown(entry['id'])} (last active {_when(entry['last'])}, "
                f"{entry['bytes']} bytes on disk)"
            )
        for entry in got.get("kept", []):
            kept += 1
            if verbose:
                click.echo(_shown(f"kept {name}/{entry['id']}: {entry['why']}"))
        for error in got.get("errors", []):
            failed = True
            click.echo(f"dispatch-admin: {name}: {_shown(error)}", err=True)
    click.echo(
        f"{verb} {going} records ({size} bytes on disk) of cluster {cluster} last "
        f"active before {_when(before)}; kept {kept}"
    )
    for error in unfound:
        click.echo(f"dispatch-admin: {error}", err=True)
    return failed


@main.command()
@click.option(
    "--user",
    "-u",
    multiple=True,
    metavar="NAME",
    help="Only this user's records (repeatable; default: every user with records).",
)
@click.option(
    "--records", default=DEFAULT_RECORDS, show_default=False, metavar="PATTERN", help=RECORDS_HELP
)
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="FILE",
    help="dispatch.conf to read (default: $SLURM_DISPATCH_CONF, else dispatch.conf "
    "beside slurm.conf).",
)
def metrics(user: tuple[str, ...], records: str, config_path: Optional[str]) -> int:
    """Write the users' records' numbers for a dashboard into MetricsDir (run from cron).

    Reads every user's records as that user (read-only) and writes
    MetricsDir/slurm-dispatch-records.prom whole, in node_exporter's textfile format:
    standing holds and those expiring within HoldWarning, the CessationSignal's answers by
    verdict ("not ceased" is not proven), the supervisor's last good pass and its failed
    passes since, per user (and cluster), what their jobs' restarts cost (restarts by cause,
    seconds allocated and lost, steps redone, restore and save latency, end to ceased, jobs
    stopped for lack of progress, the longest a running job has gone without a publication,
    holds by age and the soonest deadline), and a 1 for each user whose records could not be
    read (named on stderr).  The hooks' own counters are in slurm-dispatch.prom beside it.
    Exit 0; 1 when a user's records could not be read; 2 on an error.

    Example (every 5 minutes, on the host node_exporter scrapes for the site):
    `dispatch-admin metrics`
    """
    from .. import config as config_module
    from ..control import dashboard, siteview
    from ..errors import ConfigError
    from ..node import metrics as metrics_module

    _root()
    cfg = config_module.load(config_path)
    if cfg.problems:
        raise ConfigError(config_module.refusal(cfg, "--config" if config_path else ""))
    if not cfg.metrics_dir:
        raise UsageError(
            "MetricsDir is not set in "
            f"{cfg.path or config_module.config_path()}: say where "
            "node_exporter's textfile collector reads"
        )
    now = time.time()
    values: dict[str, float] = {}
    chosen, unfound = _chosen(user, records, cfg.state_dir)
    failed = bool(unfound)
    for error in unfound:
        click.echo(f"dispatch-admin: {error}", err=True)
    for account, home in chosen:
        name = account.pw_name
        got = siteview.as_user(account, home, dashboard.numbers, cfg.hold_warning, now)
        errors = got.get("errors") or []
        series = metrics_module.series
        values[series("slurm_dispatch_records_unreadable", {"user": name})] = 1 if errors else 0
        for error in errors:
            failed = True
            click.echo(f"dispatch-admin: {name}: {_shown(error)}", err=True)
        if errors:
            continue
        values[series("slurm_dispatch_holds_standing", {"user": name})] = got["holds"]
        values[series("slurm_dispatch_holds_expiring", {"user": name})] = got["expiring"]
        for verdict, count in got["answers"].items():
            values[
                series("slurm_dispatch_cessation_answers_total", {"user": name, "verdict": verdict})
            ] = count
        for cluster, seen in got["passes"].items():
            labels = {"user": name, "cluster": cluster}
            if seen["time"] is not None:
                values[series("slurm_dispatch_supervisor_last_pass_timestamp_seconds", labels)] = (
                    seen["time"]
                )
            values[series("slurm_dispatch_supervisor_failed_passes", labels)] = seen["failures"]
            values[series("slurm_dispatch_supervisor_interval_seconds", labels)] = seen["every"]
        values.update(_cost_series(name, got["costs"]))
    values["slurm_dispatch_records_read_timestamp_seconds"] = now
    metrics_module.replace(cfg.metrics_dir, values)
    return 1 if failed else 0


def _cost_series(user: str, costs: dict[str, Any]) -> dict[str, float]:
    """The series of one user's job costs (dashboard.job_costs); every label from a bounded
    set (the causes, the hold ages)."""
    from ..node.metrics import series

    mine = {"user": user}
    values = {
        series("slurm_dispatch_restarts_total", {**mine, "cause": cause}): count
        for cause, count in costs["restarts"].items()
    }
    values[series("slurm_dispatch_allocated_seconds_total", mine)] = costs["allocated"]
    values[series("slurm_dispatch_lost_seconds_total", mine)] = costs["lost"]
    values[series("slurm_dispatch_steps_redone_total", mine)] = costs["redone"]
    for family, key in (
        ("slurm_dispatch_restore_seconds", "restore"),
        ("slurm_dispatch_save_latency_seconds", "save_latency"),
        ("slurm_dispatch_ceased_after_end_seconds", "to_ceased"),
    ):
        values[series(family + "_sum", mine)] = costs[key]["sum"]
        values[series(family + "_count", mine)] = costs[key]["count"]
    values[series("slurm_dispatch_jobs_active", mine)] = costs["active"]
    values[series("slurm_dispatch_jobs_stopped_no_progress", mine)] = costs["stopped_no_progress"]
    if costs["progress_age"] is not None:
        values[series("slurm_dispatch_progress_age_seconds", mine)] = costs["progress_age"]
    for age, count in costs["hold_ages"].items():
        values[series("slurm_dispatch_holds_by_age", {**mine, "age": age})] = count
    if costs["next_deadline"] is not None:
        values[series("slurm_dispatch_hold_next_deadline_timestamp_seconds", mine)] = costs[
            "next_deadline"
        ]
    return values


if __name__ == "__main__":  # pragma: no cover
    main()
