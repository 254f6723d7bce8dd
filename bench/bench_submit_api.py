#!/usr/bin/env python3
"""Benchmark a sweep's submission: ``api.submit`` in one process against ``dispatch-sbatch``
in a loop and submitit, on the real sandbox Slurm cluster.

Run as root: ``python bench/bench_submit_api.py`` (about a minute once the sandbox is up).
Each round submits the same ``--count`` (100) jobs, a trivial script, held (``--hold``: nothing
runs, so only submission is timed and the cluster's scheduling does not enter), as the sandbox
user (``runuser -u dispatchuser --``, the sandbox's environment, a folder that user owns), once
by each of:

* ``dispatch-sbatch`` in a shell loop: ``for i in ...; do dispatch-sbatch --parsable
  --checkpoint ck-$i --hold job.sh; done``, one process, one interpreter start, per job (what a
  sweep did before ``api.submit``);
* ``api.submit``: one Python process (the sandbox venv's) that imports ``slurm_dispatch.api``
  and calls ``api.submit("job.sh", "--hold", checkpoint=f"ck-{i}")`` per job;
* the same from a pool of 8 threads (``ThreadPoolExecutor``), overlapping sbatch's answers;
* submitit (installed into the sandbox venv if missing), one process: a ``SlurmExecutor``
  (held by ``additional_parameters={"hold": True}``) submitting ``CommandFunction(["bash",
  "job.sh"])`` once per job, the same script;
* ``sbatch --parsable --hold job.sh`` in a shell loop, for reference (the floor: no record,
  no identity).

Each is timed whole, from the process's start to its end (interpreter start and imports
included, as a sweep pays them), ``time.perf_counter_ns`` around ``subprocess.run``; the
Python drivers also time each submission inside (median per job, import apart).  Every
method gets a fresh ``DISPATCH_HOME`` per round (a root-in-use check reads the caller's
records, so records left by an earlier method would slow a later one); the held jobs are
cancelled after each method.  ``--rounds`` (3) rounds after one untimed warm-up round of
``--warmup`` (5) jobs each, the order rotated per round.  Targets: ``api.submit`` per job
below submitit's and below ``dispatch-sbatch``'s in a loop (ratios of medians < 1).

The sandbox lives in ``--dir`` (default ``/var/tmp/sb-bench-api``; its ports derive from the
folder, so it runs beside the others; ``--nodes`` of them), started with
``slurm_dispatch.sandbox.cluster.up`` (this checkout installed into its venv when it changed) and
stopped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench_sbatch import (
    Cluster,
    bench_folder,
    ms,
    print_verdicts,
    sandbox_options,
    say,
    source_identity,
    summary,
)

from slurm_dispatch.sandbox import cluster as sandbox
from slurm_dispatch.sandbox import layout as sandbox_layout

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = "/var/tmp/sb-bench-api"

JOB_SCRIPT = """#!/bin/bash
#SBATCH --time=1
# bench_submit_api.py submits this with --hold: it never runs.
echo "held jobs do not run"
"""

# argv: PREFIX COUNT THREADS; prints {"import_ns", "submit_ns": [...], "ids": [...]}.
API_DRIVER = """\
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
t0 = time.perf_counter_ns()
from slurm_dispatch import api
import_ns = time.perf_counter_ns() - t0
prefix, count, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def one(i):
    t = time.perf_counter_ns()
    job = api.submit("job.sh", "--hold", checkpoint=f"{prefix}-{i}").slurm_job_id
    return job, time.perf_counter_ns() - t

if threads > 1:
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(one, range(count)))
else:
    done = [one(i) for i in range(count)]
print(json.dumps({"import_ns": import_ns, "submit_ns": [d[1] for d in done],
                  "ids": [d[0] for d in done]}))
"""

SUBMITIT_DRIVER = """\
import json, sys, time
t0 = time.perf_counter_ns()
import submitit
from submitit.helpers import CommandFunction
import_ns = time.perf_counter_ns() - t0
prefix, count = sys.argv[1], int(sys.argv[2])
executor = submitit.SlurmExecutor(folder=prefix)
executor.update_parameters(time=1, additional_parameters={"hold": True})
ids, each = [], []
for i in range(count):
    t = time.perf_counter_ns()
    ids.append(executor.submit(CommandFunction(["bash", "job.sh"])).job_id)
    each.append(time.perf_counter_ns() - t)
print(json.dumps({"import_ns": import_ns, "submit_ns": each, "ids": ids}))
"""

THREADS = 8
METHODS = [
    "dispatch-sbatch loop",
    "api.submit",
    f"api.submit, {THREADS} threads",
    "submitit",
    "sbatch loop",
]


def shell_loop(command: str, count: int) -> list[str]:
    """A bash loop running ``command`` (with ``$i``) ``count`` times, printing sbatch's ids."""
    return ["bash", "-c", f"for i in $(seq 1 {count}); do {command} || exit 1; done"]


def run_method(cl: Cluster, method: str, tag: str, count: int) -> dict[str, Any]:
    """Submit ``count`` held jobs by ``method``; returns wall ns, ids and inner timings."""
    home = os.path.join(cl.scratch, "homes", tag)
    cl.env["DISPATCH_HOME"] = home
    python = os.path.join(cl.venv_bin, "python")
    dispatch = os.path.join(cl.venv_bin, "dispatch-sbatch")
    if method == "dispatch-sbatch loop":
        argv = shell_loop(f'{dispatch} --parsable --checkpoint "ck-{tag}-$i" --hold job.sh', count)
    elif method == "sbatch loop":
        argv = shell_loop("sbatch --parsable --hold job.sh", count)
    elif method.startswith("api.submit"):
        threads = THREADS if "threads" in method else 1
        argv = [python, "api_driver.py", f"ck-{tag}", str(count), str(threads)]
    else:
        argv = [python, "submitit_driver.py", f"submitit-{tag}", str(count)]
    elapsed, proc = cl.run(argv)
    if method.endswith("loop"):
        ids = [line.split(";")[0] for line in proc.stdout.split()]
        inner: dict[str, Any] = {}
    else:
        data = json.loads(proc.stdout)
        ids = data["ids"]
        inner = {"import_ns": data["import_ns"], "submit": summary(data["submit_ns"])}
    if len(ids) != count or not all(i.isdigit() for i in ids):
        raise RuntimeError(f"{method}: expected {count} job ids, got {proc.stdout[:300]!r}")
    for i in range(0, len(ids), 200):
        cl.run(["scancel", *ids[i : i + 200]], as_user=False, check=False)
    return {"wall_ns": elapsed, "ids": ids, **inner}


def bench(args: argparse.Namespace, cl: Cluster, results: dict[str, Any]) -> None:
    for method in METHODS:  # warm-up, untimed: caches, the controller's first answers
        run_method(cl, method, f"warm-{METHODS.index(method)}", args.warmup)
    walls: dict[str, list[int]] = {m: [] for m in METHODS}
    inner: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    for rnd in range(args.rounds):
        shift = rnd % len(METHODS)
        for method in METHODS[shift:] + METHODS[:shift]:
            say(args, f"  round {rnd + 1}: {method}, {args.count} jobs")
            done = run_method(cl, method, f"r{rnd}-{METHODS.index(method)}", args.count)
            walls[method].append(done["wall_ns"])
            if "submit" in done:
                inner[method].append(done)
    results["sweep"] = {
        "count": args.count,
        "rounds": args.rounds,
        "per_job": {m: summary([w // args.count for w in walls[m]]) for m in METHODS},
        "total": {m: summary(walls[m]) for m in METHODS},
        "inner": {
            m: {
                "import": summary([d["import_ns"] for d in runs]),
                "submit_median_per_job": summary([int(d["submit"]["median_ns"]) for d in runs]),
            }
            for m, runs in inner.items()
            if runs
        },
    }


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    per = results["sweep"]["per_job"]
    rows = []
    threaded = f"api.submit, {THREADS} threads"
    for name, base, target in (
        ("api.submit", "submitit", "< 1"),
        ("api.submit", "dispatch-sbatch loop", "< 1"),
        ("api.submit", "sbatch loop", "-"),
        (threaded, "api.submit", "-"),
        (threaded, "sbatch loop", "-"),
    ):
        mine, other = per[name], per[base]
        ratio = mine["median_ns"] / other["median_ns"]
        rows.append(
            {
                "operation": name + ", per job",
                "median_ns": mine["median_ns"],
                "min_ns": mine["min_ns"],
                "baseline": base + ", per job",
                "baseline_median_ns": other["median_ns"],
                "baseline_min_ns": other["min_ns"],
                "ratio": ratio,
                "min_ratio": mine["min_ns"] / other["min_ns"],
                "target": target,
                "result": "-" if target == "-" else ("PASS" if ratio < 1 else "MISS"),
            }
        )
    return rows


def print_report(results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    env = results["environment"]
    sweep = results["sweep"]
    print()
    print(
        f"python {env['python']} (venv {env['venv_python']}), {env['slurm']}, submitit "
        f"{env['submitit']}, {env['machine']}, {env['cpus']} cpus, load average "
        f"{env['loadavg_start']} at the start, {env['loadavg_end']} at the end"
    )
    print(
        f"sandbox {env['sandbox_dir']}, user {env['user']}; checkout "
        f"{env['source']['commit']}"
        + (
            " with uncommitted changes in slurm_dispatch/"
            if env["source"]["package_changes"]
            else ""
        )
    )
    print(
        f"{sweep['count']} held jobs per method and round, {sweep['rounds']} rounds, order "
        "rotated; whole runs (process start to end), per job = run / count:"
    )
    for method in METHODS:
        per, total = sweep["per_job"][method], sweep["total"][method]
        print(
            f"  {method:26s} per job median {ms(per['median_ns']):>9s}  min "
            f"{ms(per['min_ns']):>9s}   whole run median {total['median_ns'] / 1e9:6.2f} s"
        )
    for method, data in sweep["inner"].items():
        print(
            f"  inside {method}: import {ms(data['import']['median_ns'])}, one submission "
            f"median {ms(data['submit_median_per_job']['median_ns'])}"
        )
    print_verdicts(rows)
    print(
        "ratio = median / baseline median (what the target is judged on); min ratio = min / "
        "baseline min; every method runs through runuser once per run"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sandbox_options(p, DEFAULT_DIR)
    p.add_argument("--count", type=int, default=100, help="jobs per method and round (default 100)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3)")
    p.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="jobs per method in the untimed warm-up round (default 5)",
    )
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    if args.count < 1 or args.rounds < 1 or args.warmup < 1:
        p.error("--count, --rounds and --warmup must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench_submit_api.py must run as root: it starts the sandbox's daemons and runs "
            "commands as the sandbox user through runuser",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    say(args, f"sandbox {args.dir}: up (installing {REPO_ROOT} into its venv if it changed)")
    report = sandbox.up(args.dir, nodes=args.nodes, user=args.user, source=REPO_ROOT)
    state = report.status
    layout = sandbox_layout.Layout(Path(state.dir))
    scratch = bench_folder(
        layout,
        state.user,
        "api-",
        [
            ("job.sh", JOB_SCRIPT, 0o755),
            ("api_driver.py", API_DRIVER, 0o644),
            ("submitit_driver.py", SUBMITIT_DRIVER, 0o644),
        ],
    )
    python = str(layout.venv_bin / "python")
    cl = Cluster(state.dir, state.user, scratch)
    _, version = cl.run(["sbatch", "--version"], as_user=False)
    _, info = cl.run(
        [
            python,
            "-c",
            "import platform, submitit; print(platform.python_version(), submitit.__version__)",
        ],
        as_user=False,
    )
    venv_python, submitit_version = info.stdout.split()
    results: dict[str, Any] = {
        "environment": {
            "python": platform.python_version(),
            "venv_python": venv_python,
            "submitit": submitit_version,
            "slurm": version.stdout.strip(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "sandbox_dir": state.dir,
            "user": state.user,
            "scratch": scratch,
            "source": source_identity(),
        }
    }
    try:
        say(
            args,
            f"submitting: a warm-up of {args.warmup}, then {args.rounds} rounds of "
            f"{args.count} held jobs by each of {', '.join(METHODS)}",
        )
        bench(args, cl, results)
    finally:
        results["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.keep:
            say(args, f"kept {scratch} and the sandbox in {state.dir} (running)")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
            say(args, "sandbox stopped: " + "; ".join(sandbox.down(state.dir)))
    rows = verdicts(results)
    results["verdicts"] = rows
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_report(results, rows)
        print(f"elapsed {results['elapsed_s']} s end to end")
    missed = [r for r in rows if r["result"] == "MISS"]
    return 1 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
