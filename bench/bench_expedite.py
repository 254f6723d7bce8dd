#!/usr/bin/env python3
"""Node declared down to replacement running, with and without Slurm's expedited requeue.

Run as root: ``python bench/bench_expedite.py`` (about four minutes a round with the default
delay, once the sandbox is up; ``--rounds``, ``--requeue-delay``, ``--slurm``, ``--dir``,
``--user``, ``--keep``, ``--json``).  On its own sandbox of 3 nodes (a Slurm release of 25.11
or later: Debian testing's by default, where the sandbox enables
``SlurmctldParameters=enable_expedited_requeue``), each round:

1. drains every node but the first, and submits two dispatch jobs side by side with
   ``dispatch-sbatch`` that both start on it: one ``--requeue=expedite``, one ``--requeue``
   (each script writes the time it starts, restart count beside it, and sleeps);
2. resumes the other nodes, so the replacements have somewhere to go, and cuts the first node
   off the network (``dispatch-sandbox partition``): slurmctld declares it DOWN after
   SlurmdTimeout and requeues both jobs;
3. reads the moment the node was declared down from slurmctld's log (``Nodes n1 not
   responding, setting DOWN``, to the millisecond) and the moment each replacement runs from
   its own first line (``date +%s.%N`` in the script of restart 1; one clock, one machine),
   and reports both intervals side by side, with slurmctld's allocation of each replacement.

The requeue delay: from 25.11 SchedulerParameters' ``requeue_delay`` keeps a requeued job
(not an expedited one) from starting for that long; it defaults to ``AuthInfo``'s
``cred_expire``, itself 120 s by default, so 120 s on a site that sets neither, on every
release.  The test sandboxes set cred_expire=5 (so 5 s); the bench's sandbox sets
``requeue_delay`` to ``--requeue-delay`` (default 120, a site's default), through
``$DISPATCH_SANDBOX_REQUEUE_DELAY``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_controller import Cluster, emit, scratch_folder, wind_up  # noqa: E402
from bench_sbatch import sandbox_options, say, source_identity  # noqa: E402

from slurm_dispatch.sandbox import cluster as sandbox  # noqa: E402
from slurm_dispatch.sandbox import layout as sandbox_layout  # noqa: E402
from slurm_dispatch.sandbox import slurm_conf as sandbox_slurm_conf  # noqa: E402

DEFAULT_DIR = "/var/tmp/sb-bench-expedite"
# Each execution says when it started (restart count beside it), then sleeps until cancelled.
JOB_SCRIPT = """#!/bin/bash
echo "$(date +%s.%N) ${SLURM_RESTART_COUNT:-0} $SLURMD_NODENAME" >> "$SLURM_SUBMIT_DIR/$1.log"
exec sleep 100000
"""
KINDS = ("expedite", "plain")
SBATCH = {"expedite": "--requeue=expedite", "plain": "--requeue"}
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")


def log_events(path: Path, since: float) -> list[tuple[float, str]]:
    """slurmctld's log lines at or after ``since``, with their times (local time, ms)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        match = _LOG_TIME.match(line)
        if match:
            when = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            if when >= since - 1:
                out.append((when, match.group(2)))
    return out


def first_at(events: list[tuple[float, str]], pattern: str) -> float | None:
    found = [when for when, text in events if re.search(pattern, text)]
    return found[0] if found else None


def started(scratch: str, kind: str, restart: int) -> tuple[float, str] | None:
    """(time, node) of the first line execution ``restart`` of job ``kind`` wrote."""
    try:
        lines = Path(scratch, f"{kind}.log").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        words = line.split()
        if len(words) == 3 and words[1] == str(restart):
            return float(words[0]), words[2]
    return None


def one_round(cl: Cluster, nodes: list[str], timeout: float) -> dict[str, Any]:
    layout = sandbox_layout.Layout(Path(cl.dir))
    first, others = nodes[0], nodes[1:]
    for name in KINDS:
        Path(cl.scratch, f"{name}.log").unlink(missing_ok=True)
    cl.root(
        [
            "scontrol",
            "update",
            f"nodename={','.join(others)}",
            "state=drain",
            "reason=bench_expedite: the jobs start on the first node",
        ]
    )
    ids = {}
    try:
        for kind in KINDS:
            proc = cl.run(
                [
                    cl.tool("dispatch-sbatch"),
                    "--parsable",
                    SBATCH[kind],
                    "--checkpoint",
                    f"ck-{kind}-{time.time_ns()}",
                    "-o",
                    "/dev/null",
                    "job.sh",
                    kind,
                ]
            )
            ids[kind] = proc.stdout.strip().split(";")[0]
        cl.wait(
            lambda: all(started(cl.scratch, kind, 0) for kind in KINDS),
            timeout,
            "both jobs running on the first node",
        )
    finally:
        cl.root(["scontrol", "update", f"nodename={','.join(others)}", "state=resume"])
    cut = time.time()
    sandbox.partition(first, cl.dir)
    try:
        cl.wait(
            lambda: all(started(cl.scratch, kind, 1) for kind in KINDS),
            timeout,
            "both replacements running",
        )
    finally:
        sandbox.heal(first, cl.dir)
        cl.run(["scancel", *ids.values()], check=False)
    events = log_events(layout.slurmctld_log, cut)
    down = first_at(events, rf"Nodes? {first}\b.*not responding, setting DOWN")
    row: dict[str, Any] = {"cut": cut, "down": down, "jobs": {}}
    for kind in KINDS:
        run_at, node = started(cl.scratch, kind, 1) or (None, "")
        requeued = first_at(events, rf"requeue job JobId={ids[kind]} ")
        allocated = first_at(events, rf"Allocate JobId={ids[kind]} ")
        row["jobs"][kind] = {
            "slurm_job_id": ids[kind],
            "node": node,
            "down_to_running_s": None
            if down is None or run_at is None
            else round(run_at - down, 3),
            "down_to_requeued_s": None
            if down is None or requeued is None
            else round(requeued - down, 3),
            "down_to_allocated_s": None
            if down is None or allocated is None
            else round(allocated - down, 3),
        }
    return row


def print_report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print(
        f"\n{env['slurm']}, requeue delay {env['requeue_delay_s']} s "
        f"(SchedulerParameters requeue_delay), SlurmdTimeout "
        f"{env['slurmd_timeout']}, load {env['loadavg_start']} -> {env.get('loadavg_end')}"
    )
    print(
        f"{'round':>5}  {'cut to down':>11}  "
        + "  ".join(f"{kind + ': down to running':>26}" for kind in KINDS)
        + "  (allocated by slurmctld)"
    )
    for index, row in enumerate(results["rounds"], 1):
        cut = "?" if row["down"] is None else f"{row['down'] - row['cut']:.1f} s"
        cells = []
        for kind in KINDS:
            job = row["jobs"][kind]
            run = job["down_to_running_s"]
            alloc = job["down_to_allocated_s"]
            cells.append(
                f"{'?' if run is None else f'{run:.2f} s':>16} "
                f"({'?' if alloc is None else f'{alloc:.2f} s'})"
            )
        print(f"{index:>5}  {cut:>11}  " + "  ".join(f"{c:>26}" for c in cells))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sandbox_options(p, DEFAULT_DIR, nodes=3)
    p.add_argument(
        "--slurm",
        default="newest",
        help="the sandbox's Slurm release, 25.11 or later (default newest: Debian testing's)",
    )
    p.add_argument("--rounds", type=int, default=1, help="node failures measured (default 1)")
    p.add_argument(
        "--requeue-delay",
        type=int,
        default=120,
        help="the sandbox's requeue_delay in seconds (default 120, Slurm's "
        "default; the test sandboxes' is 5)",
    )
    args = p.parse_args(argv)
    if args.nodes < 2:
        p.error("need --nodes 2 or more: the replacements run on another node")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench_expedite.py must run as root: it starts the sandbox and cuts a node off",
            file=sys.stderr,
        )
        return 2
    started_at = time.perf_counter()
    os.environ[sandbox_slurm_conf.REQUEUE_DELAY_ENV] = str(args.requeue_delay)
    say(
        args,
        f"sandbox {args.dir}: up ({args.nodes} nodes, Slurm {args.slurm}, "
        f"requeue_delay {args.requeue_delay} s)",
    )
    report = sandbox.up(
        args.dir, nodes=args.nodes, user=args.user, source=REPO_ROOT, slurm=args.slurm
    )
    state = report.status
    layout = sandbox_layout.Layout(Path(state.dir))
    conf = layout.slurm_conf.read_text()
    if "enable_expedited_requeue" not in conf:
        print(
            f"the sandbox's Slurm ({args.slurm}) has no expedited requeue (25.11 added it)",
            file=sys.stderr,
        )
        return 2
    scratch = scratch_folder(layout, state.user, [("job.sh", JOB_SCRIPT, 0o755)])
    cl = Cluster(state.dir, state.user, scratch)
    results: dict[str, Any] = {
        "rounds": [],
        "environment": {
            "slurm": cl.run(["sbatch", "--version"], as_user=False).stdout.strip(),
            "requeue_delay_s": args.requeue_delay,
            "slurmd_timeout": re.search(r"(?m)^SlurmdTimeout=(\d+)", conf).group(1)  # type: ignore
            + " s",
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "nodes": [n.name for n in state.nodes],
            "source": source_identity(),
        },
    }
    try:
        for index in range(args.rounds):
            say(args, f"round {index + 1}: partition {state.nodes[0].name}")
            results["rounds"].append(
                one_round(cl, [n.name for n in state.nodes], timeout=args.requeue_delay + 180)
            )
    finally:
        wind_up(cl, scratch, state.dir, args.keep, results)
    results["elapsed_s"] = round(time.perf_counter() - started_at, 1)
    emit(args, results, print_report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
