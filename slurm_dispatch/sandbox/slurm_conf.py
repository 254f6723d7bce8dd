"""The sandbox's configuration: slurm.conf, site.conf, and the project's hooks installed into it.

Role: :func:`render_slurm_conf` (nodes on the sandbox's bridge, fast timers, slurmdbd's
accounting unless it is off (:mod:`.accounting`), no hooks, a default partition whose jobs an
``urgent`` one preempts) and :func:`render_site_conf`,
whose :func:`site_config_lines` install the hooks' parts, the re-check script and dispatch.conf
from the checkout's ``contrib/`` and ``site-config/`` as the admin guide tells a site admin to;
:func:`write_config` writes what differs.

Invariant: the same configuration for every release but for what a release needs
(``cgroup.conf`` and a first job id of FIRST_ROOT_JOB_ID in a Debian root); a file is
rewritten only when its text changes, so an unchanged ``up`` restarts nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path

from ..errors import SandboxError
from . import accounting as accounting_lib
from . import network
from .install import source_root
from .layout import HOST_RELEASE, Layout
from .state_folder import own_folder, write_if_changed

CLUSTER_NAME = "dispatch-sandbox"
# Another ClusterName, for a second sandbox standing for another cluster over the same home.
# Fixed for a folder's life: slurmctld refuses to start on state saved under another name.
CLUSTER_ENV = "DISPATCH_SANDBOX_CLUSTER"
# How long slurmctld keeps an ended job (slurm.conf MinJobAge); a short one lets a test see
# a job forgotten (slurmctld purges about once a minute).
MIN_JOB_AGE = 600
MIN_JOB_AGE_ENV = "DISPATCH_SANDBOX_MIN_JOB_AGE"
PARTITION_NAME = "debug"
# A second partition over the same nodes whose jobs preempt the default one's (Slurm's
# preempt/partition_prio): the default partition's jobs are requeued when an urgent job needs
# their node, as on a site where a reservation-like queue displaces the everyday one.  Only a
# job that asks for it (`sbatch -p urgent`) preempts; nothing else changes.
URGENT_PARTITION = "urgent"
# slurmd's wait between SIGTERM and SIGKILL (slurm.conf KillWait) on a cancel, a requeue and a
# preemption alike.  A preempted job's window to save is this: under PreemptMode=REQUEUE Slurm
# requeues it the moment it is chosen and applies no GraceTime (measured on 22.05 and 24.11:
# with GraceTime=8 on the partition, SIGKILL came 4.5 to 4.7 s after SIGTERM).
KILL_WAIT = 5
# Job credential lifetime: a requeued job may not start again before it has passed (measured
# here: requeue-to-running 6 s with 5, 11 s with 10).  Slurm 22.05 rejects values below 5 and
# falls back to 120 (with an error in the log).
CRED_EXPIRE = 5
# slurm.conf MessageTimeout.  It is also the controller's window for a race: a job a
# registering slurmd reports as running that ended less than this ago is taken for "newly
# completed" and left alone, so heal registers a node again past it (cluster.heal).
MESSAGE_TIMEOUT = 10
FIRST_ROOT_JOB_ID = 1_000_000
# The requeue delay (how long a requeued job waits before it may start again): from 25.11
# SchedulerParameters' requeue_delay, which defaults to cred_expire, as the delay was before
# (so CRED_EXPIRE on every release here; 120 s on a site that sets neither).  The env knob
# sets it, for a measure of what a site's delay costs (bench/bench_expedite.py).
REQUEUE_DELAY_ENV = "DISPATCH_SANDBOX_REQUEUE_DELAY"
# The first release with requeue_delay and --requeue=expedite (SlurmctldParameters'
# enable_expedited_requeue, which the sandbox turns on there: a job asks for it itself).
EXPEDITE_RELEASE = (25, 11)
# How slurmd tracks a job's processes (DISPATCH_SANDBOX_PROCTRACK): proctrack/linuxproc (the
# process tree; the default, which needs no cgroups), or proctrack/cgroup with Slurm's cgroup/v2
# or cgroup/v1 plugin, on this machine's cgroup mounts, with IgnoreSystemd=yes (slurmd makes
# its slurmstepd scope itself: no systemd here).  The hooks' CgroupRoot follows it.  Slurm's
# cgroup/v2 refuses a hybrid host (v1 hierarchies beside the v2 tree: "Hybrid mode is not
# supported", on every release), which is what these VMs are: there only cgroup/v1 runs.
PROCTRACK_ENV = "DISPATCH_SANDBOX_PROCTRACK"
PROCTRACKS = ("linuxproc", "cgroup/v2", "cgroup/v1")


# Run for every task, inside its node's network namespace.  The nodes share this machine's
# name, which resolves to 127.0.0.1: a node's own loopback, where on a cluster a node's name is
# its own address.  gloo (torch.distributed) binds to what the name resolves to, so the ranks of
# a multi-node job could not meet; this points it at the node's link instead.
TASK_PROLOG = f"""#!/bin/sh
# The sandbox's TaskProlog (slurm_dispatch.sandbox.slurm_conf.TASK_PROLOG): each node's name
# resolves to its own loopback here, so gloo is told the node's link.
echo "export GLOO_SOCKET_IFNAME={network.NODE_LINK}"
"""


def site_config_lines(state_dir: Path) -> list[str]:
    """Lines of ``<state>/etc/site.conf``, included at the end of the sandbox's slurm.conf.

    This is where the project's hooks get installed the way a site admin would (Prolog, Epilog,
    PrologSlurmctld, EpilogSlurmctld, PrologFlags): the base slurm.conf sets none of those keys
    (only TaskProlog, the sandbox's own: :data:`TASK_PROLOG`), so this file may set any of
    them.  The hooks' parts and dispatch.conf are copied from the checkout's ``contrib/`` and
    ``site-config/`` (docs/admin-guide.md, "Install") with the knobs pointing at the sandbox:
    its venv's interpreter and ``<state>/etc/dispatch.conf``, whose StateDir is
    ``<state>/dispatch-state``.
    """
    layout = Layout(state_dir)
    if not _install_dispatch_site(layout):
        return []
    hooks = layout.etc
    return [
        "# slurm-dispatch hooks (site-config/slurm.conf.dispatch, with sandbox paths)",
        f"Prolog={hooks}/prolog.d/*",
        f"Epilog={hooks}/epilog.d/*",
        f"PrologSlurmctld={hooks}/prolog.d/{DISPATCH_PART}",
        f"EpilogSlurmctld={hooks}/epilog.d/{DISPATCH_PART}",
        "PrologFlags=Alloc",
        f"HealthCheckProgram={hooks}/dispatch-recheck",
        "HealthCheckInterval=5",
    ]


DISPATCH_PART = "05-dispatch"


def _dispatch_knobs(text: str, python: Path, conf: Path) -> str:
    """Set a contrib part's knobs the way the admin guide tells an admin to."""
    lines = []
    for line in text.splitlines():
        if line.startswith("DISPATCH_PYTHON="):
            line = f"DISPATCH_PYTHON={python}"
        elif line.startswith("DISPATCH_CONF="):
            line = f"DISPATCH_CONF={conf}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _install_dispatch_site(layout: Layout) -> bool:
    """Install the hook parts, the re-check script and dispatch.conf; False when the checkout
    with ``contrib/`` is not at hand and nothing was installed before."""
    repo = source_root()
    conf = layout.etc / "dispatch.conf"
    facts_dir = layout.root / "dispatch-state"
    if repo is None or not (repo / "contrib" / "prolog.d" / DISPATCH_PART).is_file():
        return conf.is_file()
    python = layout.venv_bin / "python"
    parts = {
        repo / "contrib" / "prolog.d" / DISPATCH_PART: layout.etc / "prolog.d" / DISPATCH_PART,
        repo / "contrib" / "epilog.d" / DISPATCH_PART: layout.etc / "epilog.d" / DISPATCH_PART,
        repo / "site-config" / "dispatch-recheck": layout.etc / "dispatch-recheck",
    }
    for source, target in parts.items():
        own_folder(target.parent)
        write_if_changed(target, _dispatch_knobs(source.read_text(), python, conf), 0o755)
    settings = []
    for line in (repo / "site-config" / "dispatch.conf").read_text().splitlines():
        if line.startswith("StateDir="):
            line = f"StateDir={facts_dir}"
        elif line.startswith("BootTimeTolerance="):
            line = "BootTimeTolerance=2"
        elif line.startswith("ListingLag="):
            line = "ListingLag=0"  # one machine, one local file system: no node sees late
        elif line.startswith("CgroupRoot=") and proctrack() != "linuxproc":
            line = f"CgroupRoot={cgroup_mount(proctrack())}"  # cgroup.conf's CgroupMountpoint
        settings.append(line)
    write_if_changed(conf, "\n".join(settings) + "\n", 0o644)
    own_folder(facts_dir)
    return True


def proctrack() -> str:
    """The sandbox's process tracking, one of PROCTRACKS (``$DISPATCH_SANDBOX_PROCTRACK``)."""
    value = os.environ.get(PROCTRACK_ENV, "").strip() or PROCTRACKS[0]
    if value not in PROCTRACKS:
        raise SandboxError(f"${PROCTRACK_ENV}={value!r} is not one of {', '.join(PROCTRACKS)}")
    return value


def cgroup_mount(
    plugin: str, mounts: str = "/proc/self/mounts", own: str = "/proc/self/cgroup"
) -> str:
    """cgroup.conf's CgroupMountpoint for Slurm's ``plugin`` (``cgroup/v2``, ``cgroup/v1``) on
    this machine, or an error saying why Slurm cannot run it here."""
    found: dict[str, list[str]] = {"cgroup2": [], "cgroup": []}
    with open(mounts, encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 3 and fields[2] in found:
                found[fields[2]].append(fields[1])
    if plugin == "cgroup/v1":
        if not any(p.endswith("/freezer") for p in found["cgroup"]):
            raise SandboxError(
                f"{PROCTRACK_ENV}=cgroup/v1: {mounts} mounts no cgroup v1 "
                "freezer hierarchy, which Slurm's proctrack/cgroup needs there"
            )
        return "/sys/fs/cgroup"
    with open(own, encoding="utf-8") as handle:
        hierarchies = handle.read().splitlines()
    v1 = [line for line in hierarchies if not line.startswith("0::")]
    if v1 or not found["cgroup2"]:
        raise SandboxError(
            f"{PROCTRACK_ENV}=cgroup/v2: Slurm's cgroup/v2 needs a host with cgroup v2 alone "
            f"and this one {'mounts no cgroup2' if not found['cgroup2'] else 'is hybrid'}: "
            f"{own} lists v1 hierarchies ({', '.join(v1)}), which slurmd refuses ('Hybrid "
            "mode is not supported', every release); use cgroup/v1 here"
        )
    return "/sys/fs/cgroup" if "/sys/fs/cgroup" in found["cgroup2"] else found["cgroup2"][0]


def render_cgroup_conf(plugin: str, mount: str = "") -> str:
    """cgroup.conf for the sandbox's process tracking (:func:`proctrack`)."""
    if plugin.startswith("cgroup/"):
        return (
            f"# cgroup.conf of the slurm-dispatch sandbox: proctrack/cgroup on {plugin}, its\n"
            "# cgroups made by slurmd itself (no systemd on these machines).\n"
            f"CgroupPlugin={plugin}\nIgnoreSystemd=yes\nCgroupMountpoint={mount}\n"
        )
    return (
        "# cgroup.conf of the slurm-dispatch sandbox: plain processes, no cgroups.\n"
        "CgroupPlugin=disabled\n"
    )


def render_slurm_conf(
    layout: Layout,
    nodes: Sequence[str],
    hostname: str,
    release: str = HOST_RELEASE,
    cluster: str = CLUSTER_NAME,
    min_job_age: int = MIN_JOB_AGE,
    major: str = "",
    requeue_delay: int | None = None,
    accounting: str = accounting_lib.NONE,
    tracking: str = PROCTRACKS[0],
) -> str:
    """The sandbox's slurm.conf: nodes on its bridge (:mod:`.network`), fast timers,
    slurmdbd's accounting (``accounting``: :data:`.accounting.SLURMDBD`) or none, no hooks,
    and two partitions over the nodes: the default one, whose jobs an urgent partition's job
    preempts (requeued, KILL_WAIT after SIGTERM), and that urgent one.

    The same for every release (24.11 also reads ``cgroup.conf``, written beside it), except
    that a sandbox in a Debian root numbers its jobs from FIRST_ROOT_JOB_ID: the job user is
    shared with the host's sandboxes, and the hooks' survivor scan must not take a process a
    host sandbox left behind under the same job id for one of this sandbox's jobs.

    ``major`` is the Slurm release run (``26.05``): from 25.11 expedited requeue is enabled
    (``SlurmctldParameters=enable_expedited_requeue``) and ``requeue_delay``, where given,
    is SchedulerParameters' requeue_delay; before 25.11 the delay is cred_expire."""
    spool = layout.spool / "%n"
    net = network.net_of(layout)
    expedite = _release_tuple(major) >= EXPEDITE_RELEASE
    cred_expire = CRED_EXPIRE
    delay = []
    if requeue_delay is not None and expedite:
        delay = [f"requeue_delay={requeue_delay}"]
    elif requeue_delay is not None:
        cred_expire = max(requeue_delay, CRED_EXPIRE)
    lines = [
        "# slurm.conf of the slurm-dispatch sandbox, written by `dispatch-sandbox up`: do not",
        "# edit; site settings come from the sandbox's site_config_lines (site.conf).",
        f"ClusterName={cluster}",
        f"SlurmctldHost={hostname}({net.host_address})",
        f"SlurmctldPort={layout.controller_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "",
        "# Authentication: our own munged, never the system one.  CredType signs job",
        "# credentials through the same socket; a requeued job waits cred_expire to run again.",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket},cred_expire={cred_expire}",
        "",
        *(
            [
                "# Plain processes: no cgroups on these machines.",
                "ProctrackType=proctrack/linuxproc",
            ]
            if tracking == "linuxproc"
            else [
                f"# The job's processes in its cgroup (cgroup.conf: {tracking}).",
                "ProctrackType=proctrack/cgroup",
            ]
        ),
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        f"PlugStackConfig={layout.plugstack_conf}",
        "JobAcctGatherType=jobacct_gather/none",
        *accounting_lib.slurm_conf_lines(layout, accounting),
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
        f"TaskProlog={layout.etc / 'task-prolog'}",
        "",
        "# Scheduling: start work within about a second of it becoming eligible.",
        "SchedulerType=sched/backfill",
        "SchedulerParameters="
        + ",".join(
            [
                "bf_interval=1",
                "sched_interval=1",
                "sched_min_interval=0",
                "batch_sched_delay=0",
                *delay,
            ]
        ),
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "",
        f"# Preemption: a job of the {URGENT_PARTITION} partition (a higher PriorityTier over the",
        f"# same nodes) requeues the {PARTITION_NAME} jobs holding the node it needs at once; they",
        "# get SIGTERM, SIGKILL KillWait later (no GraceTime under REQUEUE), and start again later",
        "# with their restart count one higher.",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        *(
            [
                "",
                "# Expedited requeue (25.11): a job submitted --requeue=expedite is requeued on a",
                "# node failure to start again at once, first in the queue, with no requeue delay.",
                "SlurmctldParameters=enable_expedited_requeue",
            ]
            if expedite
            else []
        ),
        "",
        "# Timers: fail fast, requeue fast, keep ended jobs visible for ten minutes.",
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        f"MessageTimeout={MESSAGE_TIMEOUT}",
        f"KillWait={KILL_WAIT}",
        "InactiveLimit=0",
        "WaitTime=0",
        f"MinJobAge={min_job_age}",
        *([f"FirstJobId={FIRST_ROOT_JOB_ID}"] if release != HOST_RELEASE else []),
        "PrologEpilogTimeout=30",
        "UnkillableStepTimeout=60",
        "JobRequeue=1",
        "ReturnToService=2",
        "",
        "# Files: all under the sandbox folder.",
        f"StateSaveLocation={layout.state_save}",
        f"SlurmdSpoolDir={spool}",
        f"SlurmctldPidFile={layout.slurmctld_pid_file}",
        f"SlurmdPidFile={layout.run_dir / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={layout.slurmctld_log}",
        f"SlurmdLogFile={layout.log_dir / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "",
        "# Nodes: one slurmd per node on this machine (`slurmd -N nX`), each in its own network",
        f"# namespace on the bridge {net.bridge} ({net.subnet}); the controller is "
        f"# {net.host_address}.",
        "SlurmdParameters=config_overrides",
    ]
    for index, node in enumerate(nodes):
        lines.append(
            f"NodeName={node} NodeHostname={hostname} NodeAddr={net.node_address(index)} "
            f"Port={layout.node_port(index)} CPUs=2 RealMemory=1000 State=UNKNOWN"
        )
    lines += [
        f"PartitionName={PARTITION_NAME} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
        "State=UP PriorityTier=1",
        f"PartitionName={URGENT_PARTITION} Nodes={','.join(nodes)} MaxTime=INFINITE State=UP "
        "PriorityTier=10",
        "",
        f"Include {layout.site_conf}",
    ]
    return "\n".join(lines) + "\n"


def render_site_conf(layout: Layout) -> str:
    """The content of ``site.conf``: a header and :func:`site_config_lines`."""
    # The header keeps the function's old path: site.conf's text is compared to decide whether
    # to restart the daemons, so a new header would restart every existing sandbox once.
    lines = ["# Site settings of the sandbox (slurm_dispatch.sandbox.cluster.site_config_lines)."]
    lines += site_config_lines(layout.root)
    return "\n".join(lines) + "\n"


def _release_tuple(major: str) -> tuple[int, ...]:
    """``(26, 5)`` of ``26.05``; ``()`` of '' (a release not known: nothing of 25.11)."""
    parts = major.split(".")
    return tuple(int(part) for part in parts) if all(p.isdigit() for p in parts) else ()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise SandboxError(f"${name}={raw!r} is not a whole number of seconds")
    return int(raw)


def write_config(
    layout: Layout,
    nodes: Sequence[str],
    release: str = HOST_RELEASE,
    major: str = "",
    accounting: str = accounting_lib.NONE,
) -> list[str]:
    """Write the config files that differ; return the names of those written (slurmdbd.conf,
    root's alone, with ``accounting``).  ``major``: the Slurm release the sandbox runs
    (``26.05``), '' where not known."""
    hostname = socket.gethostname().split(".")[0]
    delay = os.environ.get(REQUEUE_DELAY_ENV, "").strip()
    tracking = proctrack()
    wanted = {
        layout.slurm_conf: render_slurm_conf(
            layout,
            nodes,
            hostname,
            release,
            cluster=os.environ.get(CLUSTER_ENV) or CLUSTER_NAME,
            min_job_age=_env_int(MIN_JOB_AGE_ENV, MIN_JOB_AGE),
            major=major,
            requeue_delay=_env_int(REQUEUE_DELAY_ENV, 0) if delay else None,
            accounting=accounting,
            tracking=tracking,
        ),
        layout.site_conf: render_site_conf(layout),
        layout.plugstack_conf: "# No SPANK plugins in the sandbox.\n",
    }
    cgroup_conf = layout.etc / "cgroup.conf"
    if tracking != "linuxproc":
        wanted[cgroup_conf] = render_cgroup_conf(tracking, cgroup_mount(tracking))
    elif release != HOST_RELEASE:
        # 24.11's slurmd refuses to start without a cgroup plugin unless told there is none.
        wanted[cgroup_conf] = render_cgroup_conf(tracking)
    written = [path.name for path, text in wanted.items() if write_if_changed(path, text)]
    if release == HOST_RELEASE and tracking == "linuxproc" and cgroup_conf.exists():
        # Back from proctrack/cgroup on the host's 22.05, which has no CgroupPlugin=disabled.
        cgroup_conf.unlink()
        written.append("cgroup.conf (removed)")
    if write_if_changed(layout.etc / "task-prolog", TASK_PROLOG, 0o755):
        written.append("task-prolog")
    if accounting == accounting_lib.SLURMDBD and write_if_changed(
        layout.slurmdbd_conf, accounting_lib.render_slurmdbd_conf(layout, hostname), 0o600
    ):
        written.append(layout.slurmdbd_conf.name)  # slurmdbd refuses one others may read
    return written
