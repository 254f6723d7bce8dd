"""The ``dispatch`` command line: parses arguments, calls the library, prints, exits.

This is the only module of the package (with the other modules of :mod:`slurm_dispatch.cli`)
that prints or exits.  Exit codes: 0 success; 1 a refused operation; 2 usage errors,
unreadable stores and other failures.  The group's ``main`` (a :class:`~.shell.ClickShell`)
parses and invokes every command inside :func:`slurm_dispatch.cli.shell.run`, the one place
errors become exits: errors print as ``dispatch: <message>``; a broken pipe is quiet; Ctrl-C
is 130.  So a command's function is its body: it raises the library's errors, never catches
them to exit, and returns its exit code or None (tests/unit/test_cli_shell.py checks it).

The in-job commands (``publish``, ``latest``, ``list``, ``epoch``) load the checkpoint side
only: everything of the control side or the Slurm adapter is imported inside the command
that needs it (tests/house/test_cli_imports.py holds the budget).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import click

from .._table import render_table
from ..checkpoint import model
from ..checkpoint import publish as store
from ..checkpoint.stores.schemes import served
from ..errors import UsageError
from .options import table_options
from .shell import ClickShell

if TYPE_CHECKING:
    from ..checkpoint.gc import Report
    from ..checkpoint.stores.base import Store
    from ..control import record

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Shell(ClickShell, click.Group):
    prog = "dispatch"


def required(value: Optional[str], option: str, env: str) -> str:
    if value is None or value == "":
        raise UsageError(f"{option} is required (or set ${env})")
    return value


def parse_int(value: str, option: str) -> int:
    try:
        return int(value.strip(), 10)
    except (ValueError, AttributeError):
        raise UsageError(f"{option} {value!r} is not an integer") from None


def echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=None, sort_keys=True))


@click.group(cls=_Shell, context_settings=CONTEXT)
@click.version_option(package_name="slurm-dispatch", prog_name="dispatch")
def main() -> None:
    """Isolated checkpoints and append-only publication for Slurm jobs.

    Inside a job, write saves under $DISPATCH_EXEC_DIR, then make each one visible with
    `dispatch publish --step S PATH`; resume from `dispatch latest`.  The latest save is the
    publication with the greatest epoch ($DISPATCH_EPOCH), then step, so an old execution's
    late saves never outrank its replacement's.
    """


@main.command()
@click.option(
    "--generation",
    "-g",
    envvar="DISPATCH_GENERATION",
    metavar="G",
    help="Generation: 0 for a new job, +1 per supersession.  [env: DISPATCH_GENERATION]",
)
@click.option(
    "--submission",
    "-n",
    envvar="DISPATCH_SUBMISSION",
    metavar="N",
    help="Submission number, 1..999999.  [env: DISPATCH_SUBMISSION]",
)
@click.option(
    "--restart",
    "-r",
    envvar="SLURM_RESTART_COUNT",
    metavar="R",
    help="Slurm's restart count, 0..999999; unset means 0.  [env: SLURM_RESTART_COUNT]",
)
def epoch(generation: Optional[str], submission: Optional[str], restart: Optional[str]) -> None:
    """Print the epoch G*10^12 + N*10^6 + R as an integer.

    Example: `dispatch epoch -g 0 -n 2 -r 1` prints 2000001.
    """
    g = parse_int(required(generation, "--generation", "DISPATCH_GENERATION"), "--generation")
    n = parse_int(required(submission, "--submission", "DISPATCH_SUBMISSION"), "--submission")
    r = parse_int(restart, "--restart") if restart not in (None, "") else 0
    click.echo(model.Epoch(g, n, r).value)


ROOT_HELP = f"Checkpoint root: {served()}.  [env: DISPATCH_CHECKPOINT]"
TIMEOUT_HELP = (
    "Seconds a remote store's call or scan may take before it is an error (exit 2); default "
    "StoreTimeout in dispatch.conf, else 60.  [env: DISPATCH_STORE_TIMEOUT]"
)


def timeout_option(func: Any) -> Any:
    return click.option(
        "--timeout", envvar="DISPATCH_STORE_TIMEOUT", metavar="SECONDS", help=TIMEOUT_HELP
    )(func)


def parse_timeout(value: Optional[str]) -> Optional[float]:
    if value is None or value.strip() == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"--timeout {value!r} is not a number of seconds") from None


def keep_callback(ctx: click.Context, _param: click.Parameter, value: Optional[int]) -> None:
    """watch --keep: checked at once, kept aside for the watcher."""
    from ..checkpoint.gc import check_keep

    ctx.meta["gc_keep"] = None if value is None else check_keep(value)


@main.command()
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.option(
    "--epoch",
    "epoch_",
    envvar="DISPATCH_EPOCH",
    metavar="E",
    help="This execution's epoch.  [env: DISPATCH_EPOCH]",
)
@click.option("--step", required=True, metavar="S", help="The training step of the save.")
@timeout_option
@click.argument("path", type=click.Path())
def publish(
    root: Optional[str], epoch_: Optional[str], step: str, timeout: Optional[str], path: str
) -> None:
    """Make the save at PATH visible; print the publication's file name.

    PATH must exist and lie inside ROOT (usually under $DISPATCH_EXEC_DIR).  The publication
    is an empty file created once (O_EXCL) in ROOT/pub/ and synced before this returns.
    Publishing the same (epoch, step, path) again finds it there: that publication can only
    be this save's (its name is the epoch, step and path), so this says "already published,
    nothing to do" on stderr, prints the name and exits 0, as after a timeout and a retry.
    On a remote root (s3://bucket/prefix, az://container/prefix), PATH is a URL under it and
    the publication is an empty object created with If-None-Match: * (not checked for
    existence first); a create
    whose answer was lost and retried is recognised as this call's own and reported as made.

    Example: `dispatch publish --step 500 "$DISPATCH_EXEC_DIR/checkpoint-500"`
    """
    root_v = required(root, "--root", "DISPATCH_CHECKPOINT")
    epoch_v = parse_int(required(epoch_, "--epoch", "DISPATCH_EPOCH"), "--epoch")
    step_v = parse_int(step, "--step")
    click.echo(
        store.publish_done(
            root_v,
            epoch_v,
            step_v,
            path,
            timeout=parse_timeout(timeout),
            said=lambda text: click.echo(
                f"dispatch publish: already published, nothing to "
                f"do: {text}; it is this save's publication",
                err=True,
            ),
        )
    )


@main.command()
@click.argument("job", required=False)
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.option(
    "--task",
    type=click.IntRange(min=0),
    default=None,
    metavar="T",
    help="With JOB: the array task whose root (%a) to look in (JOB given as A_T, "
    "as Slurm writes a task, names it too).",
)
@click.option("--json", "as_json", is_flag=True, help="Print an object (or null).")
@timeout_option
def latest(
    job: Optional[str],
    root: Optional[str],
    task: Optional[int],
    as_json: bool,
    timeout: Optional[str],
) -> None:
    """Print the absolute path of the latest published save, or nothing.

    The latest save has the greatest epoch, then the greatest step; exact ties go to the
    greatest publication name.  A quarantined save (`dispatch quarantine`) is passed over,
    as the launcher passes over it, and said on stderr.  Exit 0 whether or not there is
    one.  With --json, print {"epoch", "step", "path", "name"} or null.  JOB (a dispatch
    job id or one of its Slurm job ids) looks in that job's root, no --root needed.

    Example: `RESUME=$(dispatch latest)`, or from a login node `dispatch latest dab2cd3e`
    """
    where = (
        _job_root(job, _task_named(job, task))
        if job
        else required(root, "--root", "DISPATCH_CHECKPOINT")
    )
    import os

    if job and "://" not in where and not os.path.lexists(where):
        found = None  # the job's (task's) root is made by its first execution: none yet
    else:
        from ..checkpoint import quarantine

        found, passed = quarantine.choose(store.open_store(where, parse_timeout(timeout)))
        if passed:
            click.echo(f"dispatch: {quarantine.passed_text(passed)}", err=True)
    if as_json:
        echo_json(found.as_json() if found else None)
    elif found:
        click.echo(found.path)


def _clock(seconds: Optional[float]) -> str:
    from ..control.status import clock  # "-" for a moment not recorded

    return clock(seconds)


def _say(line: str) -> None:
    """A word to the person waiting (what a slow call waits for): stderr."""
    click.echo(f"dispatch: {line}", err=True)


def _open(job: str, slurm: Any = None) -> record.JobRecord:
    """Dispatch job ``job`` (its id, or a Slurm job id of it) of this cluster: records of
    several clusters may share one home, and a job of another is an error naming it."""
    from ..control import record
    from ..slurm.adapter import Slurm

    return record.open_job(job, cluster=(slurm if slurm is not None else Slurm()).cluster())


def _task_named(
    job: str, task: Optional[int], record_: Optional[record.JobRecord] = None
) -> Optional[int]:
    """The array task a job id names (``14_2``, as Slurm writes it, or a task's own Slurm job
    id once its execution recorded it), checked against --task; else --task."""
    from ..control import events

    named: Optional[int] = None
    head, sep, tail = job.partition("_")
    if sep and head.isdigit() and tail.isdigit():
        named = int(tail)
    elif job.isdigit():
        try:
            found = record_ if record_ is not None else _open(job)
            named = next(
                (
                    s.task
                    for s in found.history().of(events.Started)
                    if s.slurm_job_id == job and s.array_job_id
                ),
                None,
            )
        except UsageError:
            named = None  # opening it again says why
    if named is not None and task is not None and task != named:
        raise UsageError(f"--task {task}: job id {job} names task {named}")
    return named if named is not None else task


def _job_root(job: str, task: Optional[int]) -> str:
    """The checkpoint root of dispatch job ``job`` (of array task ``task`` for a %a root)."""
    spec = _open(job).spec
    root = str(spec["checkpoint"])
    from ..checkpoint import roots

    if not roots.per_task(root):
        if task is not None:
            raise UsageError(
                f"--task {task}: dispatch job {job}'s root {root!r} is one for all tasks"
            )
        return roots.one_root(root)
    if task is None:
        raise UsageError(f"dispatch job {job}'s root {root!r} is one per array task: give --task T")
    return roots.for_task(root, task)


@main.command(name="list")
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@table_options("a JSON array")
@timeout_option
def list_(root: Optional[str], as_json: bool, noheader: bool, timeout: Optional[str]) -> None:
    """Print every publication under ROOT, oldest first (the latest is last).

    A quarantined save (`dispatch quarantine`, which the launcher passes over) is marked:
    a NOTE column says so, and --json gives it "quarantined": true."""
    from ..checkpoint import quarantine

    st = store.open_store(required(root, "--root", "DISPATCH_CHECKPOINT"), parse_timeout(timeout))
    found = st.list_publications()
    marked = quarantine.located(st) if found else set()
    if as_json:
        echo_json(
            [{**f.as_json(), **({"quarantined": True} if f.path in marked else {})} for f in found]
        )
        return
    if marked & {f.path for f in found}:
        table = render_table(
            ["EPOCH", "STEP", "PATH", "NOTE"],
            [[f.epoch, f.step, f.path, "quarantined" if f.path in marked else "-"] for f in found],
            noheader,
        )
    else:
        table = render_table(
            ["EPOCH", "STEP", "PATH"], [[f.epoch, f.step, f.path] for f in found], noheader
        )
    if table:
        click.echo(table)


@main.command(context_settings={"allow_interspersed_args": False})
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.option(
    "--dir",
    "folder",
    envvar="DISPATCH_EXEC_DIR",
    metavar="DIR",
    help="The folder whose saves to publish.  [env: DISPATCH_EXEC_DIR; on a remote "
    "root: DISPATCH_STAGE_DIR]",
)
@click.option(
    "--to",
    "upload_to",
    metavar="URL",
    help="On a remote root: the prefix to upload each save to before publishing "
    "it.  [env: DISPATCH_EXEC_DIR]",
)
@click.option(
    "--pattern",
    metavar="GLOB",
    help="Names of saves, with {step} where the step's digits are "
    "(e.g. 'model_{step}.pt').  Default: checkpoint-<N>/, checkpoint_<N>/, "
    "step-<N>/, *step=<N>*.ckpt and hpc_ckpt_<n>.ckpt.",
)
@click.option(
    "--ready",
    metavar="NAME",
    default=None,
    help="The file a save folder's writer writes last; the folder must also be "
    "unchanged and unwritten (see above).  [default: trainer_state.json; "
    "random_states_0.pkl for accelerate's checkpoint_<N>/, with as many "
    "custom_checkpoint_<k>.pkl as its other saves]",
)
@click.option(
    "--interval", type=float, default=None, metavar="S", help="Seconds between scans.  [default: 2]"
)
@click.option(
    "--timeout",
    type=float,
    default=None,
    metavar="S",
    help="A scan taking longer is an error.  [default: 300]",
)
@click.option(
    "--keep",
    type=int,
    default=None,
    metavar="K",
    expose_value=False,
    callback=keep_callback,
    help="After each publication, remove what `dispatch gc --keep K` would "
    "(publishing goes on if cleanup fails).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def watch(
    root: Optional[str],
    folder: Optional[str],
    upload_to: Optional[str],
    pattern: Optional[str],
    ready: Optional[str],
    interval: Optional[float],
    timeout: Optional[float],
    command: tuple[str, ...],
) -> int:
    """Publish each complete save in DIR as it appears, in step order, each once.

    A save is a folder checkpoint-<N>, checkpoint_<N> (accelerate's) or step-<N>, a .ckpt
    file whose name holds step=<N> (Lightning's epoch=0-step=50.ckpt), or Lightning's
    hpc_ckpt_<n>.ckpt (its own SLURM auto-requeue's save at the requeue signal, its step read
    from the file); with --pattern, every matching name.  Watch looks in DIR and below it,
    at most 4 names deep, where frameworks save by default (Lightning's
    lightning_logs/version_<V>/checkpoints/, accelerate's checkpoints/, torchtitan's
    checkpoint/): never inside a save, never through a symlink.

    Complete means, for every kind: it looks whole (a folder: its ready file, --ready, is a
    non-empty file, parsing if .json; a file: non-empty and, if a zip as torch.save writes,
    ended by its end record), nothing in it (every file and folder under a folder) changed
    between two consecutive scans, and no process of yours on this node has one of its files
    open for writing or mapped writable.  So a save is published one to two intervals after it
    is finished.  On a folder root each is fsynced (files and folders) before it is published,
    so --keep never removes an older save because of one not on disk.  Saves at or below the
    greatest step already published from DIR are never published, so a restarted watch carries
    on.

    With a COMMAND (after --), run it, forward TERM, INT, USR1, USR2, HUP and CONT to it,
    scan again when it exits (at most a second apart, until every save that looks whole is
    confirmed, for at most --timeout) and exit with its status (143 when it exits 0 after a
    forwarded TERM: its work is not done, and the job must not end COMPLETED).  Without one,
    run until TERM, INT or HUP, then do the same last scans and exit 0.  The first error (a store
    error, a scan longer than --timeout) stops publishing: exit 2, or the command's status if
    it failed.

    A folder holding .metadata is a torch.distributed.checkpoint (DCP) save, which several
    ranks write (torchtitan's step-<N>, Lightning's sharded .ckpt folder): complete once
    .metadata is in place, names only files that are there and whole, and (Lightning's)
    meta.pt is whole; DCP's coordinator renames .metadata into place only after every rank
    has written its shards.  Other saves several ranks write are published by the
    integrations.

    On a remote root (s3://, az://), DIR is the local staging folder ($DISPATCH_STAGE_DIR):
    each complete save is uploaded under the execution's prefix ($DISPATCH_EXEC_DIR, or --to)
    with its store's transfers, then published; a local copy is removed once published, the
    newest kept.  When COMMAND exits 0, the staging folder is
    removed, all but what is not in the store (a file
    never uploaded keeps it, named on stderr); a run stopped early keeps it for a replacement
    on this node.  --timeout bounds the scan and each upload.

    A DIR inside the execution's folder that does not exist yet is waited for (a framework
    makes it at its first save); the end says so if it never appeared.

    A run that published nothing says so at the end; when the execution's folder holds saves
    named with a step (checkpoint-<N>, step-<N>, epoch=E-step=S.ckpt) that were not published,
    it names each with the option that would have found it and exits non-zero (2 when the
    command succeeded).

    A resumed execution ($DISPATCH_RESUME_FROM) that publishes a step at or below the step of
    the save it resumed from is said once, with the option that restores the step where it is
    known (torchtitan: --checkpoint.no-initial-load-model-only); accelerate's checkpoint_<i>
    is said to be a save index, not a step.  Publishing goes on.

    Example: `dispatch watch -- python train.py --output_dir "$DISPATCH_EXEC_DIR"`
    """
    import os

    from ..execution import watch as watch_lib

    def report(line: str) -> None:
        click.echo(f"dispatch watch: {line}", err=True)

    root_v = required(root, "--root", "DISPATCH_CHECKPOINT")
    remote = store.is_remote_root(root_v)
    folder_v, own, upload_to = _watched_folder(folder, upload_to, remote)
    epoch_v = parse_int(
        required(os.environ.get("DISPATCH_EPOCH"), "$DISPATCH_EPOCH", "DISPATCH_EPOCH"),
        "$DISPATCH_EPOCH",
    )
    timeout_v = watch_lib.DEFAULT_TIMEOUT if timeout is None else timeout
    watcher = watch_lib.Watcher(
        root_v,
        folder_v,
        epoch_v,
        watch_lib.SaveRule.make(pattern, ready),
        report,
        upload_to=upload_to,
        timeout=timeout_v,
        exec_dir=own or None,
        resume_from=os.environ.get("DISPATCH_RESUME_FROM") or None,
    )
    watcher.keep = click.get_current_context().meta.get("gc_keep")
    loop = watch_lib.WatchLoop(
        watcher,
        list(command) or None,
        watch_lib.DEFAULT_INTERVAL if interval is None else interval,
        timeout_v,
        report,
    )
    code = loop.run()
    if (
        remote
        and command
        and code == 0
        and loop.error is None
        and own
        and os.path.abspath(folder_v) == os.path.abspath(own)
    ):
        # The execution's work is done and its saves are in the store: its node-local
        # staging folder goes, all but what is not there (said).
        from ..execution import staging

        staging.of(root_v).clear_stage(root_v, own, str(upload_to), timeout_v, report)
    if loop.error is not None and watcher.uploader is not None:
        # Stopped at an error, perhaps an upload stuck on a hung server: the transfer manager's
        # worker threads would hold the interpreter's exit until their sockets give up.
        # Nothing more is published; the command, if any, has been waited for.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _watched_folder(
    folder: Optional[str], upload_to: Optional[str], remote: bool
) -> tuple[str, str, Optional[str]]:
    """The folder `dispatch watch` publishes from, the execution's own folder ("" when the
    environment names none) and where saves are uploaded to (a remote root's).  On a remote
    root the execution's folder is its prefix and the saves are staged locally; a folder
    outside the execution's own is refused."""
    import os

    from ..execution import watch as watch_lib

    if remote:
        # $DISPATCH_EXEC_DIR is the execution's prefix there; the saves are staged locally.
        if (
            click.get_current_context().get_parameter_source("folder")
            is not click.core.ParameterSource.COMMANDLINE
        ):
            folder = os.environ.get("DISPATCH_STAGE_DIR")
        upload_to = upload_to or os.environ.get("DISPATCH_EXEC_DIR")
    folder_v = required(folder, "--dir", "DISPATCH_STAGE_DIR" if remote else "DISPATCH_EXEC_DIR")
    own = os.environ.get("DISPATCH_STAGE_DIR" if remote else "DISPATCH_EXEC_DIR", "")
    folder_v = watch_lib.spelled_as_own(folder_v, own) if own else folder_v
    if own and not (os.path.abspath(folder_v) + "/").startswith(os.path.abspath(own) + "/"):
        raise UsageError(
            f"--dir {folder_v!r} is outside this execution's folder {own!r}: "
            "watch publishes only its own execution's saves"
        )
    return folder_v, own, upload_to


def _status_data(
    job: str, marks: Optional[list[Any]] = None
) -> tuple[Any, dict[str, Any], Optional[str]]:
    """The record of ``job``, what `dispatch status` shows of it, and this cluster's name
    (``marks``: filled with the publications its goodput was figured from)."""
    from ..control import naming, record, status
    from ..slurm.adapter import Slurm

    slurm = Slurm.for_people(_say)
    # SLUIDs tell a submission made without a marker (the user's own --comment) from
    # another job under its id, where slurmctld numbered jobs anew (26.05).
    slurm_jobs = slurm.own_jobs(sluids=naming.wants_sluids(record.all_jobs()))
    here = slurm.cluster()
    record_ = status.open_job(job, slurm_jobs, here, say=_say)
    data = status.collect(record_, slurm_jobs, marks=marks)
    data["cluster"] = data["cluster"] or here
    return record_, data, here


@main.command(name="status")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--timeline",
    is_flag=True,
    help="Draw the executions as bars over time: running, ended but not proven "
    "gone (the overlap), ceased, publications, holds; the lineage that won.",
)
def status_(job: str, as_json: bool, timeline: bool) -> None:
    """Show a dispatch job: submissions, executions, end states, latest publication.

    JOB is a dispatch job id (printed by dispatch-sbatch), a Slurm job id of one of its
    submissions, or (Slurm 26.05) the SLUID of one of its submissions or executions: where
    slurmctld numbered jobs anew, a Slurm job id opens the dispatch job Slurm runs under it
    now, said on stderr.  Costs one squeue call.
    """
    from ..control import record

    _, data, here = _status_data(job)
    if as_json:
        echo_json(data)
    elif timeline:
        import shutil

        from ..checkpoint import roots
        from ..control import timeline as drawing

        root = str(data["checkpoint"])
        found = drawing.marks(root) if not roots.has_patterns(root) else []
        width = shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else 80
        click.echo(drawing.render(data, found, width=max(width, 60)))
    else:
        from ..control.status_text import render

        click.echo(render(data, several_clusters=len(record.clusters(record.all_jobs(), here)) > 1))


@main.command()
@click.argument("job")
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="Write the page here ('-': standard output); default "
    "dispatch-report-JOB.html in the current folder.",
)
def report(job: str, output: Optional[str]) -> None:
    """Write a page that draws a dispatch job's life: one self-contained HTML file.

    One lane per execution and node over time (running; ended but not proven gone, the
    overlap a replacement survived; proven ceased), each publication at its step, the work a
    successor did again, holds and their lifting, with a legend, the goodput figures of
    `dispatch status` and a table per execution.  No network, no script: open it from the
    cluster's shared folder in any browser, or mail it.  Costs one squeue call.

    \b
    Example:
      dispatch report dk3v9x2p -o ~/public_html/job.html
    """
    from .. import _fsio
    from ..control import report as page

    # The publications the figures were made from: each task's root where the root has %a.
    found: list[Any] = []
    record_, data, _ = _status_data(job, found)
    text = page.render(data, found)
    if output == "-":
        click.echo(text, nl=False)
        return
    target = output or f"dispatch-report-{record_.id}.html"
    folder, name = os.path.split(os.path.abspath(target))
    try:
        shown = os.stat(target)
    except OSError:
        shown = None
    if shown is not None and not stat.S_ISREG(shown.st_mode) and not stat.S_ISDIR(shown.st_mode):
        # A terminal, /dev/stdout, /dev/null, a pipe: written through, never replaced.
        try:
            with open(target, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            raise click.ClickException(f"cannot write {target}: {exc.strerror}") from exc
        return
    try:
        dir_fd = _fsio.open_dir(folder, follow=True)
        try:
            # Whole or not at all: an earlier page stays until the new one is written.
            _fsio.replace(name, text.encode(), 0o644, dir_fd=dir_fd, sync=False)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise click.ClickException(f"cannot write {target}: {exc.strerror}") from exc
    click.echo(
        f"{target}: {len(data.get('executions') or [])} execution(s) drawn; open it in a browser"
    )


@main.command()
@table_options("one JSON list")
@click.option(
    "--clusters",
    "-M",
    metavar="NAME[,NAME...]|all",
    help="List these clusters' jobs (records of several clusters may share one "
    "home); default: this cluster's.  Other clusters' states are as recorded.",
)
@click.option(
    "--state",
    "--states",
    "-t",
    "states",
    metavar="STATE[,STATE...]",
    help="Only jobs in these states, as squeue -t takes them (FAILED,RUNNING or "
    "F,R; a recorded end counts), or HELD, SUPERSEDED, FINISHED, UNKNOWN; all.",
)
@click.option(
    "--name",
    "-n",
    "names",
    metavar="SCRIPT[,SCRIPT...]",
    help="Only jobs of these scripts (the SCRIPT column, exactly).",
)
@click.option(
    "--since",
    "-S",
    metavar="TIME",
    help="Only jobs whose latest submission was made at TIME or later, as sacct -S "
    "reads it: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], today, midnight, "
    "now[-N[seconds|minutes|hours|days|weeks]].",
)
def jobs(
    as_json: bool,
    noheader: bool,
    clusters: Optional[str],
    states: Optional[str],
    names: Optional[str],
    since: Optional[str],
) -> None:
    """List your dispatch jobs, one line each, oldest first.

    STATE is Slurm's for the latest submission (every task's for an array), HELD for a
    standing shared-checkpoint hold, HELD (Slurm: launch failed) for a job Slurm itself
    requeued held after its launch failed (it runs only once released: `dispatch supervise`
    releases an isolated job's, or `scontrol release JOBID`). Once slurmctld has forgotten
    the job (MinJobAge), the end the record holds, as sacct names it and marked so: FAILED
    (recorded) is what the supervisor saw and acted on, or what the controller hook's end
    record proves; FINISHED when it settled the job without one; UNKNOWN when nothing is
    recorded yet. Costs one squeue call; a controller that does not answer is given two
    tries of about its MessageTimeout (slurm.conf) each, said on stderr while waiting, then
    one line (exit 2).
    A CLUSTER column shows each job's cluster where your records name more than one.
    """
    from ..control import naming, record, status
    from ..slurm.adapter import Slurm

    keep = _job_filter(states, names, since)  # bad input: refused before any call
    slurm = Slurm.for_people(_say)
    here = slurm.cluster()
    every = record.all_jobs()
    wanted = _cluster_choice(clusters, here)
    own = [j for j in every if j.of_cluster(here)] if not wanted or here in wanted else []
    # Another cluster's jobs: Slurm here cannot be asked about them, the record says.
    others = (
        []
        if wanted is None
        else [j for j in every if not j.of_cluster(here) and (not wanted or j.cluster in wanted)]
    )
    lines = status.job_lines(own, slurm.own_jobs(sluids=naming.wants_sluids(own)) if own else {})
    lines += status.job_lines(others, {})
    for line, job in zip(lines, own + others):
        line["cluster"] = _cluster_of(job) or here
    lines = [line for line in lines if keep(line)]
    lines.sort(key=lambda line: line.get("created") or 0)
    if as_json:
        echo_json(lines)
        return
    from ..control.status_text import jobs_table

    text = jobs_table(lines, len(record.clusters(every, here)) > 1, noheader)
    if text:
        click.echo(text)


# The states dispatch jobs adds to Slurm's (slurm.jobs.STATE_NAMES).
OUR_STATES = ("HELD", "SUPERSEDED", "FINISHED", "UNKNOWN")


def _job_filter(states: Optional[str], names: Optional[str], since: Optional[str]) -> Any:
    """dispatch jobs' --state, --name and --since as one test of a line; a bad value is a
    UsageError naming it."""
    from ..slurm.jobs import STATE_CODES, STATE_NAMES

    wanted: Optional[set[str]] = None
    if states and states.strip().lower() != "all":
        wanted = set()
        known = STATE_NAMES | set(OUR_STATES)
        for word in (w.strip().upper() for w in states.split(",") if w.strip()):
            state = STATE_CODES.get(word, word)
            if state not in known:
                raise UsageError(
                    f"--state {word!r} is not a job state (squeue's, as "
                    f"FAILED or F, or {', '.join(OUR_STATES)})"
                )
            wanted.add(state)
    scripts = {n.strip() for n in names.split(",") if n.strip()} if names else None
    after = parse_since(since) if since else None

    def keep(line: dict[str, Any]) -> bool:
        if wanted is not None:
            shown = {
                part.split()[0] for part in str(line.get("state") or "").split("+") if part.split()
            }
            if not shown & wanted:
                return False
        if scripts is not None and line.get("script") not in scripts:
            return False
        return after is None or float(line.get("submitted") or 0) >= after

    return keep


_UNITS = {"": 1, "second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}


def _now() -> float:
    import time as _time

    return _time.time()


def parse_since(text: str, now: Optional[float] = None, option: str = "--since") -> float:
    """A time as sacct -S reads it, in seconds: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], today
    or midnight, now[{+|-}N[seconds|minutes|hours|days|weeks]]; local time."""
    import re
    import time as _time

    now = _time.time() if now is None else now
    value = text.strip()
    bad = UsageError(
        f"{option} {text!r} is not a time sacct -S reads (YYYY-MM-DD[THH:MM[:SS]],"
        " MM/DD[/YY], today, now-2days)"
    )
    relative = re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", value.lower())
    if relative:
        sign, count, unit = relative.groups()
        if count is None:
            return now
        unit = unit[:-1] if unit.endswith("s") else unit
        if unit not in _UNITS:
            raise bad
        return now + (1 if sign == "+" else -1) * int(count) * _UNITS[unit]
    if value.lower() in ("today", "midnight"):
        day = _time.localtime(now)
        return _time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0, 0, 0, -1))
    for form in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%m/%d/%y"):
        try:
            return _time.mktime(_time.strptime(value, form))
        except ValueError:
            continue
    try:
        day = _time.strptime(f"{value}/{_time.localtime(now).tm_year}", "%m/%d/%Y")
    except ValueError:
        raise bad from None
    return _time.mktime(day)


def _cluster_choice(value: Optional[str], here: Optional[str]) -> Optional[set[str]]:
    """--clusters: None for this cluster's only, an empty set for all, else the names."""
    if value is None or value.strip() == "":
        return None
    names = {n.strip().lower() for n in value.split(",") if n.strip()}
    return set() if "all" in names else names


def _cluster_of(job: record.JobRecord) -> Optional[str]:
    from ..errors import DispatchError

    try:
        return job.cluster
    except DispatchError:
        return None  # an unreadable record: its line says so


@main.command()
@click.argument("job", nargs=-1, required=True)
def cancel(job: tuple[str, ...]) -> None:
    """Cancel dispatch jobs: whichever of each one's Slurm jobs is current (running, pending
    or held).  The supervisor then stops them: a user's cancel is never undone.

    Each JOB is a dispatch job id or a Slurm job id of it; A_T (as Slurm writes an array
    task) cancels that task only.  Every JOB is looked up first: one that is not found is an
    error naming it, and nothing is cancelled.  One squeue and one scancel for them all.

    Example: `dispatch cancel 12 13 14_2`
    """
    from ..control.naming import wants_sluids
    from ..control.submit import live_slurm_jobs
    from ..slurm.adapter import Slurm

    slurm = Slurm.for_people(_say)
    chosen = []
    for ident in job:
        record_ = _open(ident, slurm)
        chosen.append((record_, _task_named(ident, None, record_)))
    views = slurm.own_jobs(sluids=wants_sluids([r for r, _ in chosen]))
    plan = [(r, live_slurm_jobs(slurm, r, views, task=t)) for r, t in chosen]
    slurm.cancel(sorted({j for _, live in plan for j in live}))
    for record_, live in plan:
        if live:
            click.echo(f"cancelled Slurm job(s) {' '.join(live)} of dispatch job {record_.id}")
        else:
            click.echo(f"dispatch job {record_.id} has no active Slurm job")


@main.command()
@click.argument("job", nargs=-1)
@click.option(
    "--before",
    metavar="TIME",
    help="Forget every job of yours last active before TIME (sacct -S's forms, "
    "as dispatch jobs --since: 2026-11-01, now-30days).",
)
@click.option(
    "--dry-run", is_flag=True, help="Remove nothing; say what would go and why the others stay."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def forget(job: tuple[str, ...], before: Optional[str], dry_run: bool, as_json: bool) -> None:
    """Remove old dispatch job records (JOB..., or all last active before --before).

    Never forgotten: a job a Slurm job of which the controller still knows, one with a
    standing hold, one with a submission being made, one whose end the supervisor has not
    decided yet (not settled: it may be resubmitted), one another unsettled job waits for
    (--dependency).  Named JOBs are all forgotten or none (exit 1 saying why each stays);
    with --before the ones that stay are listed.  A record is removed whole (renamed out of
    sight first).  Checkpoints are never touched (that is `dispatch gc`).

    Example: `dispatch forget --before now-30days --dry-run`
    """
    from ..control import dependency, record
    from ..control import forget as forgetting
    from ..errors import RefusedError
    from ..slurm.adapter import Slurm

    if bool(job) == bool(before):
        raise UsageError("give JOB... or --before TIME (one of the two)")
    after = parse_since(before, option="--before") if before else None
    if after is not None and after > _now():
        # now+30days for now-30days would forget every settled job, however new.
        raise UsageError(
            f"--before {before!r} is in the future ({_clock(after)}): "
            "every settled job would be forgotten; give a past time "
            "(now-30days)"
        )
    slurm = Slurm.for_people(_say)
    mine = record.cluster_jobs(slurm.cluster())
    chosen = [_open(ident, slurm) for ident in job] if job else mine
    going, kept = forgetting.plan(chosen, slurm.own_jobs(), dependency.dependents(mine), after)
    if job and kept:
        raise RefusedError(
            "not forgetting anything: " + "; ".join(f"{k['id']} stays: {k['why']}" for k in kept)
        )
    if not dry_run:
        forgetting.forget_planned(chosen, going)
    if as_json:
        echo_json({"dry_run": dry_run, "forgotten": going, "kept": kept})
        return
    verb = "would forget" if dry_run else "forgot"
    for entry in going:
        click.echo(
            f"{verb} {entry['id']} (last active {_clock(entry['last'])}, "
            f"{entry['bytes']} bytes on disk)"
        )
    for entry in kept:
        click.echo(f"kept {entry['id']}: {entry['why']}")
    click.echo(
        f"{verb} {len(going)} job(s), {sum(e['bytes'] for e in going)} bytes on "
        f"disk; kept {len(kept)}"
    )


@main.command()
@click.argument("job")
@click.option(
    "--task",
    type=click.IntRange(min=0),
    default=None,
    metavar="T",
    help="Resubmit one task of an array job on its own (--array=T), in its lineage "
    "(JOB given as A_T, as Slurm writes a task, names it too).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Submit even while one of the job's Slurm jobs is still active, or while "
    "a shared-checkpoint job's last execution is not proven gone.",
)
@click.option(
    "--python",
    "python",
    metavar="PATH",
    help="Run the launcher with this interpreter (one with slurm-dispatch "
    "installed), from this submission on, the supervisor's included: for a "
    "job whose venv was moved or removed.  [default: the one it was submitted "
    "with]",
)
def resubmit(job: str, task: Optional[int], force: bool, python: Optional[str]) -> None:
    """Submit a dispatch job's script snapshot again, as submission N+1.

    The new submission runs what was first submitted, with the same sbatch options and the
    environment of the first submission, from the same directory; its executions resume from
    the latest publication.  Refused while a submission is still active (it would run beside
    it), unless --force.  Of a --shared-checkpoint job, the site's CessationSignal (default
    dispatch-cease) is asked first about its last execution, and the answer recorded: while
    that is not proven gone (a node cut off, survivors), refused with the evidence (exit 1),
    unless --force, as `dispatch release` is.  Refused too when the interpreter the job's
    launcher runs with is gone (see --python).  The job's bad nodes (--avoid-bad-nodes) are
    kept off it as the supervisor keeps them, and said.  Prints sbatch's line.
    """
    from ..control import badnodes
    from ..control.holds import refuse_unproven_restart
    from ..control.sbatch_words import array_tasks
    from ..control.settings import site_settings
    from ..control.submit import refuse_while_live
    from ..slurm.adapter import Slurm

    slurm = Slurm()
    record_ = _open(job, slurm)
    task = _task_named(job, task, record_)
    if task is not None and task not in (array_tasks(record_) or []):
        raise UsageError(
            f"--task {task}: dispatch job {record_.id} has no such array task "
            f"(its tasks: {array_tasks(record_) or 'none, not an array'})"
        )
    if not force:
        refuse_while_live(slurm, record_, task=task)
        if record_.spec.get("shared_checkpoint"):
            refuse_unproven_restart(record_, site_settings(), task=task)
    if python is not None:
        from ..control.interpreter import choose

        choose(record_, python)
    done, said = badnodes.resubmit(slurm, record_, task)
    click.echo(done.result.stdout.rstrip("\n"))
    click.echo(f"Dispatch job {done.job.id} submission {done.submission}")
    for line in said:  # its bad nodes (--avoid-bad-nodes), kept off as the supervisor does
        click.echo(f"Bad nodes: {line}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def plan(args: tuple[str, ...]) -> None:
    """Print what dispatch will do with a job, submitting nothing.

    Takes what dispatch-sbatch takes: [dispatch options] [sbatch options] script [args...].
    Shows the recovery rule for every end state and, for --shared-checkpoint, each hold that
    stands in for a restart.
    """
    from ..control.plan import describe
    from ..control.submit import read_request

    click.echo(describe(read_request(list(args))), nl=False)


@main.command()
@click.option("--loop", is_flag=True, help="Run a pass every --interval seconds, for ever.")
@click.option(
    "--interval",
    type=float,
    default=None,
    metavar="S",
    help="Seconds between passes with --loop (default: CessationInterval).",
)
@click.option("--quiet", "-q", is_flag=True, help="Print only errors.")
def supervise(loop: bool, interval: Optional[float], quiet: bool) -> None:
    """Apply your dispatch jobs' recovery rules: one idempotent pass, or --loop.

    For each of your dispatch jobs whose latest submission ended: resubmit it while its
    --resubmit budget lasts; for --shared-checkpoint jobs, submit the next submission held
    and ask the site's CessationSignal (dispatch.conf; default dispatch-cease) every
    CessationInterval whether the ended execution's processes are gone; a ceased answer
    releases the hold; after SharedHoldFor the hold expires and the job ends.

    A pass costs one squeue call (your own jobs) plus one per action.  Several supervisors
    may run at once: no submission is ever made twice.  Run it from a login node (`dispatch
    supervise --loop`), from a systemd user timer (contrib/systemd), from scrontab
    (`* * * * * dispatch supervise -q`), or from cron.

    A pass the controller does not answer (slurmctld restarting, failing over) fails as a
    whole: one line on stderr with the cause, the failure is recorded (`dispatch status`
    shows the last good pass and since when passes fail), and --loop goes on passing, sooner
    at first, never less often than every --interval, for as long as it takes.  Without
    --loop a failed pass exits 2.
    """
    from .._clock import instant
    from ..control import passes
    from ..control.settings import site_settings
    from ..control.supervisor import Supervisor
    from ..slurm.adapter import Slurm

    settings = site_settings()
    supervisor = Supervisor(Slurm(), settings)
    pause = interval if interval is not None else settings.interval
    supervisor.every = pause if loop else None

    def tell(said: passes.Said) -> None:
        stamp = instant()
        if said.report is None:
            click.echo(
                f"dispatch: {stamp} pass failed: {said.failure}"
                + (f" (next pass in {said.next_in:g} s)" if said.next_in is not None else ""),
                err=True,
            )
            return
        if said.recovered is not None and not quiet:
            click.echo(
                f"{stamp} the controller answers again, after "
                f"{said.recovered['failures']} failed pass(es) since "
                f"{_clock(said.recovered['failing_since'])}"
            )
        if not quiet:
            for action in said.report.actions:
                click.echo(f"{stamp} {action}")
        for error in said.report.errors:
            click.echo(f"dispatch: {stamp} {error}", err=True)

    status = passes.run(supervisor, pause, loop, tell)
    if status:
        sys.exit(status)


@main.command()
@click.argument("job")
@click.option(
    "--force", is_flag=True, help="Release even when the ended execution is not proven gone."
)
def release(job: str, force: bool) -> None:
    """Lift the hold on a shared-checkpoint job's next submission, as a person.

    The site's CessationSignal (dispatch.conf; default dispatch-cease) is asked first about
    the ended execution the hold waits for: when its processes are not proven gone (survivors,
    a node cut off, no record), the release is refused with the evidence (exit 1), because
    they may still write the shared checkpoint; --force releases anyway, as your decision.
    Same as `scontrol release` on the held Slurm job, and recorded.  Of an array job, every
    task's standing hold; JOB given as A_T (as Slurm writes a task), that task's only.
    """
    from ..control.holds import release as release_hold
    from ..control.settings import site_settings
    from ..slurm.adapter import Slurm

    record_ = _open(job)
    held = release_hold(
        Slurm(), record_, site_settings(), force=force, task=_task_named(job, None, record_)
    )
    click.echo(f"released Slurm job {held} of dispatch job {record_.id}")


def _size_text(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


@main.command(name="gc")
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.option(
    "--keep",
    metavar="K",
    help="Keep the saves of the K latest publications (at least 1).  [default: the "
    "largest rotation limit an execution recorded, .dispatch-keep.json]",
)
@click.option("--dry-run", is_flag=True, help="Remove nothing; say what would go.")
@click.option(
    "--sizes",
    is_flag=True,
    help="Also measure each execution folder and what would be freed (stats every file).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--all-files",
    is_flag=True,
    help="Also remove the files of old execution folders that are not saves "
    "(TensorBoard events, logs); by default they stay.",
)
@click.option(
    "--remove-unpublished",
    is_flag=True,
    help="Also remove the saves an older execution wrote and never published that "
    "look whole (by default they stay, and gc prints the command that "
    "publishes each).",
)
@timeout_option
def gc_(
    root: Optional[str],
    keep: Optional[str],
    dry_run: bool,
    sizes: bool,
    as_json: bool,
    all_files: bool,
    remove_unpublished: bool,
    timeout: Optional[str],
) -> None:
    """Remove the saves and execution folders no execution can need any more.

    Stays, whatever K: the saves of the K latest publications (by epoch, then step); every
    save an execution that may be live (its epoch at least the latest publication's, and
    its job's record here not saying the job ended) has chosen to resume from (the
    launcher's choice, or an integration's fallback when that one could not be loaded);
    pinned saves (`dispatch pin`); the framework's best saves (Lightning's save_top_k by its
    monitor, the Trainer's best model); every folder with no record; what the live
    executions have not published.  A finished job's last execution is no live one: its
    resume source and its folder go like any older execution's.
    Goes: publications below the K latest, every name of a save before the save, an older
    execution's saves cut off while being written, and old execution folders once nothing in
    them stays.  A save an older execution never published (its watch died) that looks
    whole (sealed with its manifest, or whole by watch's rules) stays with its folder, and
    gc prints the `dispatch publish` command for it; --remove-unpublished removes it
    instead.  Files that are not saves (TensorBoard events, logs, a .ckpt that is neither
    published, nor sealed, nor named step=N, a .ckpt/ folder that is no DCP save) stay
    unless --all-files.  Safe while jobs run and publish; a run killed
    midway is finished by the next, whatever K.  --dry-run lists what would go, every file
    of a whole folder included, and why each kept save stays.  Before removing saves it waits
    twice ListingLag (dispatch.conf, default 60 s; $DISPATCH_LISTING_LAG) so that a choice
    made on a node whose view of the root lags (NFS) is seen; it says so on stderr.

    Example: `dispatch gc --root /scratch/me/run1 --keep 3 --dry-run --sizes`
    """
    from ..checkpoint import gc as cleanup
    from ..checkpoint.stores.open import open_store
    from ..control.forget import ended_executions

    root_v = required(root, "--root", "DISPATCH_CHECKPOINT")
    keep_v = None if keep in (None, "") else parse_int(keep, "--keep")
    report = cleanup.collect(
        root_v,
        keep_v,
        dry_run=dry_run,
        sizes=sizes,
        timeout=parse_timeout(timeout),
        all_files=all_files,
        remove_unpublished=remove_unpublished,
        ended=ended_executions(),
        say=lambda line: click.echo(f"dispatch gc: {line}", err=True),
    )
    if as_json:
        echo_json(report.as_json())
        return
    _print_gc(report, open_store(root_v, parse_timeout(timeout)), root_v, dry_run, sizes)


def _print_gc(report: Report, where: Store, root: str, dry_run: bool, sizes: bool) -> None:
    """What `dispatch gc` removed (or would), what it kept and why, and what it left."""
    action = "would remove" if dry_run else "removed"
    rows = [
        [
            f"kept ({r.skipped})" if r.skipped else action,
            r.kind,
            _size_text(r.bytes),
            len(r.publications),
            where.locate(r.path),
        ]
        for r in report.removals
    ]
    if rows:
        click.echo(render_table(["ACTION", "KIND", "BYTES", "PUBLICATIONS", "PATH"], rows))
    if dry_run:
        # A whole folder: how much goes, and by name what is not named like a save
        # (--json lists every entry).
        for r in report.removals:
            if r.kind == "folder":
                click.echo(
                    f"  would remove {where.locate(r.path)}: {len(r.entries)} "
                    f"entries, {len(r.others)} not named like saves"
                )
            for entry in r.others:
                click.echo(f"  would remove {where.locate(r.path)}/{entry}")
    if sizes:
        click.echo("")
        click.echo(
            render_table(
                ["ATTEMPT", "EPOCH", "BYTES", "VERDICT"],
                [
                    [f.attempt, "-" if f.epoch is None else f.epoch, _size_text(f.bytes), f.verdict]
                    for f in report.folders
                ],
            )
        )
    if dry_run and report.kept:
        click.echo("")
        click.echo(
            render_table(
                ["KEPT", "WHY"],
                [[where.locate(path), why] for path, why in sorted(report.kept.items())],
            )
        )
    for path in report.left:
        click.echo(
            f"{'would leave' if dry_run else 'left'} (not a save; --all-files "
            f"removes it): {where.locate(path)}"
        )
    for save in report.unpublished:
        located = where.locate(save.path)
        step = "<its step>" if save.step is None else str(save.step)
        click.echo(
            f"{'would keep' if dry_run else 'kept'} (never published; it looks whole: "
            f"{save.why}): {located}\n  publish it: dispatch publish --root "
            f"{shlex.quote(root)} --epoch {save.epoch} --step {step} "
            f"{shlex.quote(located)}\n  (then `dispatch pin` it to keep it past "
            f"--keep), or remove it: dispatch gc --root {shlex.quote(root)} --keep "
            f"{report.keep} --remove-unpublished"
        )
    if dry_run and not sizes:
        kept = [f for f in report.folders if f.verdict != "removed"]
        if kept:
            click.echo("")
            click.echo(
                render_table(
                    ["ATTEMPT", "EPOCH", "VERDICT"],
                    [[f.attempt, "-" if f.epoch is None else f.epoch, f.verdict] for f in kept],
                )
            )
    gone = [r for r in report.removals if not r.skipped]
    freed = report.freed
    click.echo(
        f"{'would remove' if dry_run else 'removed'} {len(gone)} save(s) or "
        f"folder(s), {sum(len(r.publications) for r in gone)} publication(s)"
        + ("" if freed is None else f", {freed} bytes")
        + f"; keeping the {report.keep} latest publication(s)"
    )


@main.command()
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.argument("save", required=False)
@timeout_option
def quarantine(root: Optional[str], save: Optional[str], timeout: Optional[str]) -> None:
    """Quarantine the published SAVE: every execution's choice of the save to resume from
    (the launcher's $DISPATCH_RESUME_FROM, `dispatch latest`) passes over it, falling back to
    the newest publication below it, until `dispatch unquarantine`; without SAVE, list the
    quarantined saves.  `dispatch supervise` quarantines a save by itself after
    --quarantine-after executions in a row resumed from it and failed before publishing
    anything.  Cleanup keeps a quarantined save while it is the latest publication, and then
    the newest save below it too.  Quarantining the last save not quarantined is said on
    stderr: the next execution then starts afresh.  SAVE is spelled as `dispatch list`
    shows it.
    """
    from ..checkpoint import quarantine as marks

    _mark_or_list(root, save, timeout, marks.located, marks.mark, "quarantined")
    if save is not None and not marks.fallback(str(root), save, parse_timeout(timeout)):
        click.echo(
            f"dispatch quarantine: no other save of {root} is published and not "
            "quarantined, so the next execution starts afresh (and its saves then "
            f"outrank {save}); `dispatch unquarantine --root {root} {save}` undoes it",
            err=True,
        )


@main.command()
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.argument("save")
@timeout_option
def unquarantine(root: Optional[str], save: str, timeout: Optional[str]) -> None:
    """Lift the quarantine of SAVE: executions may resume from it again."""
    from ..checkpoint import quarantine as marks

    _lift(
        root,
        save,
        timeout,
        marks.lift,
        f"lifted the quarantine of {save}",
        f"{save} was not quarantined",
    )


@main.command()
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.argument("save", required=False)
@timeout_option
def pin(root: Optional[str], save: Optional[str], timeout: Optional[str]) -> None:
    """Keep the published SAVE through every cleanup (gc, watch --keep, the integrations'
    limits) until `dispatch unpin`; without SAVE, list the pinned saves.  SAVE is spelled as
    `dispatch list` shows it: a path under the root, or an s3://bucket/prefix/... URL.
    `dispatch gc --dry-run` lists pins among what it keeps, and why.

    Example: `dispatch pin --root /scratch/me/run1 /scratch/me/run1/exec/<attempt>/checkpoint-500`
    """
    from ..checkpoint import gc as cleanup

    _mark_or_list(
        root,
        save,
        timeout,
        lambda st: {st.locate(path) for path in cleanup.pinned(st)},
        cleanup.pin,
        "pinned",
    )


def _mark_or_list(
    root: Optional[str],
    save: Optional[str],
    timeout: Optional[str],
    listed: Callable[[Any], Iterable[str]],
    mark: Callable[[str, str, Optional[float]], bool],
    done: str,
) -> None:
    """`dispatch pin` and `dispatch quarantine`: mark SAVE (``done`` says it), or without
    SAVE print the marked saves as `dispatch list` spells them."""
    from ..checkpoint.stores.open import open_store

    root_v = required(root, "--root", "DISPATCH_CHECKPOINT")
    if save is None:
        for path in sorted(listed(open_store(root_v, parse_timeout(timeout)))):
            click.echo(path)
        return
    made = mark(root_v, save, parse_timeout(timeout))
    click.echo(f"{done} {save}" if made else f"{save} was {done} already")


@main.command()
@click.option("--root", envvar="DISPATCH_CHECKPOINT", metavar="ROOT", help=ROOT_HELP)
@click.argument("save")
@timeout_option
def unpin(root: Optional[str], save: str, timeout: Optional[str]) -> None:
    """Let cleanup treat SAVE by its rules again (it may then be removed)."""
    from ..checkpoint import gc as cleanup

    _lift(root, save, timeout, cleanup.unpin, f"unpinned {save}", f"{save} was not pinned")


def _lift(
    root: Optional[str],
    save: str,
    timeout: Optional[str],
    lift: Callable[[str, str, Optional[float]], bool],
    lifted: str,
    absent: str,
) -> None:
    """`dispatch unpin` and `dispatch unquarantine`: remove SAVE's mark, and say which."""
    root_v = required(root, "--root", "DISPATCH_CHECKPOINT")
    click.echo(lifted if lift(root_v, save, parse_timeout(timeout)) else absent)


@main.command()
@click.argument("save", required=False)
@click.argument("dest", required=False, type=click.Path())
@timeout_option
def fetch(save: Optional[str], dest: Optional[str], timeout: Optional[str]) -> None:
    """Bring a save to local disk, checked; print its local path (nothing: a fresh start).

    SAVE defaults to this execution's resume source, chosen as the framework integrations
    choose it: $DISPATCH_RESUME_FROM, or the previous save of its lineage when that one
    cannot be loaded (said on stderr).  On a remote root (s3://, az://) it is fetched with its
    store's transfers into the staging folder ($DISPATCH_STAGE_DIR/resume-<n>/), or to DEST; asked
    again, the copy already made is printed.  A save on a folder root is already local: its
    path is printed as it is (read it, never write into it), or copied when DEST is given.
    Every copy is checked before it is printed: each file at the size its store lists and its
    manifest records, and at the sha256 the manifest records (a local copy: its source's
    bytes); one that does not check out is removed (exit 2).  DEST must not exist.

    \b
    Example, in a shell trainer on either kind of root:
      resume=$(dispatch fetch)
      [ -n "$resume" ] && step=$(cat "$resume/step")
      # ... write saves under $DISPATCH_LOCAL_DIR, published by `dispatch watch`
    """
    import os

    from ..execution import fetch as fetch_lib

    if timeout is not None:
        os.environ["DISPATCH_STORE_TIMEOUT"] = str(parse_timeout(timeout))
    path = fetch_lib.fetch(save or None, dest)
    if path:
        click.echo(path)


if __name__ == "__main__":  # pragma: no cover
    main()
