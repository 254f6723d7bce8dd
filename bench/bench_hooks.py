#!/usr/bin/env python3
"""Benchmark the hooks against a bare interpreter, and dispatch-cease on 512 nodes.

Run ``python bench/bench_hooks.py`` (as root: the hooks write a root-owned StateDir).  It measures:

1. Each hook's wall time, as Slurm runs it (a fresh ``PYTHON -I -c ...`` with only Slurm's
   variables, no PATH), side by side with a bare ``PYTHON -I -c pass``; ``--repeat`` runs each,
   interleaved so that drift hits all alike; the median is reported.  Target: hook / bare <= 1.5.
   The shell part ``contrib/prolog.d/05-dispatch`` (sh + the interpreter) is shown for reference.
   The Epilog's time includes its /proc scan over every process of this machine (printed).
2. ``dispatch-cease`` on a job of 512 nodes, each with a start and a clean post-kill record:
   * in process, against a fake controller (the library's cost: reading 1,024 facts, judging);
   * end to end, the installed CLI in a fresh process with a fake ``scontrol`` on PATH that
     answers ``show job`` and ``show node`` for the 512 nodes (two calls, counted).
   Target: under one second.

Exit status is 0 unless ``--fail-on-miss`` is given and a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HOOK_TARGET = 1.5
CEASE_TARGET = 1.0
NODES = 512


def run_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def hook_argv(python: str, hook: str) -> list[str]:
    return [python, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            f"from slurm_dispatch.hooks import run; run({hook!r})"]


def bench_hooks(python: str, repeat: int, scratch: Path) -> dict[str, Any]:
    state = scratch / "state"
    state.mkdir(mode=0o755)
    conf = scratch / "dispatch.conf"
    conf.write_text(f"StateDir={state}\n")
    part = scratch / "05-dispatch"
    text = (REPO / "contrib/prolog.d/05-dispatch").read_text()
    text = text.replace("DISPATCH_PYTHON=/usr/bin/python3", f"DISPATCH_PYTHON={python}")
    # The bench runs the checkout, not an installed copy: put it on the part's sys.path.
    part.write_text(text.replace("    from slurm_dispatch.hooks import run",
                                 f'    import sys; sys.path.insert(0, "{REPO}")\n'
                                 "    from slurm_dispatch.hooks import run"))
    part.chmod(0o755)
    job = {"SLURM_DISPATCH_CONF": str(conf), "SLURM_JOB_ID": "1", "SLURM_JOB_UID": "1000",
           "SLURM_JOB_GID": "1000", "SLURM_JOB_RESTART_COUNT": "0",
           "SLURM_JOB_NODELIST": "n[1-4]"}
    node = {**job, "SLURMD_NODENAME": "n1"}
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "bare python -I -c pass": ([python, "-I", "-c", "pass"], {}),
        "prolog": (hook_argv(python, "prolog"), {**node, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}),
        "epilog": (hook_argv(python, "epilog"), {**node, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}),
        "prolog-slurmctld": (hook_argv(python, "prolog"),
                             {**job, "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"}),
        "epilog-slurmctld": (hook_argv(python, "epilog"),
                             {**job, "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"}),
        "recheck (nothing watched)": (hook_argv(python, "recheck"),
                                      {"SLURM_DISPATCH_CONF": str(conf)}),
        "contrib prolog.d part (sh + prolog)": (["/bin/sh", str(part)],
                                                {**node, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}),
    }
    for argv, env in cases.values():
        run_once(argv, env)  # warm the page cache and the bytecode cache
    # Every hook really recorded (a hook that fails early would look fast).
    recorded = sorted(p.name.split(".")[0] for p in (state / "facts/1000/1").iterdir())
    if recorded != ["ctld-end", "ctld-start", "end", "start", "start"]:
        sys.exit(f"the hooks did not record as expected: {recorded}")
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, (argv, env) in cases.items():
            times[name].append(run_once(argv, env))
    medians = {name: statistics.median(values) for name, values in times.items()}
    bare = medians["bare python -I -c pass"]
    processes = sum(1 for p in os.listdir("/proc") if p.isdigit())
    return {"python": python, "repeat": repeat, "processes_scanned_by_epilog": processes,
            "median_ms": {k: round(v * 1000, 2) for k, v in medians.items()},
            "ratio_to_bare": {k: round(v / bare, 2) for k, v in medians.items()}}


def bench_cease(repeat: int, scratch: Path) -> dict[str, Any]:
    from slurm_dispatch import config
    from slurm_dispatch.node import cease
    from tests import squeue_fake
    from tests.hooks.fakes import FakeController, job, node, record

    state = scratch / "cease-state"
    state.mkdir(mode=0o755)
    now = time.time()
    names = [f"n{i}" for i in range(1, NODES + 1)]
    for name in names:
        start = record(str(state), "start", name, time=now - 100, restart=0)
        record(str(state), "end", name, time=now - 90, restart=0, survivors=[], scan_error=None,
               start_token=start.split(".")[-1])
    cfg = config.Config()
    cfg.state_dir = str(state)

    def in_process() -> float:
        controller = FakeController(job(nodelist=f"n[1-{NODES}]"), {n: node(n) for n in names})
        started = time.perf_counter()
        verdict = cease.cessation("100", cfg=cfg, controller=controller)
        elapsed = time.perf_counter() - started
        assert verdict.ceased and len(verdict.nodes) == NODES and len(controller.calls) == 2
        return elapsed

    in_process()
    library = statistics.median(in_process() for _ in range(repeat))

    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    calls = scratch / "scontrol-calls"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 95))
    squeue_fake.install_commands(bin_dir, str(calls), {
        "JobId": "100", "UserId": "alice(1000)", "JobState": "COMPLETED", "Restarts": "0",
        "StartTime": stamp, "EndTime": stamp, "NodeList": f"n[1-{NODES}]"},
        boot="2026-01-01T00:00:00")
    (scratch / "dispatch.conf").write_text(f"StateDir={state}\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "SLURM_DISPATCH_CONF": str(scratch / "dispatch.conf")}
    cli = [sys.executable, "-c", "from slurm_dispatch.cli.cease import main; main()", "100"]
    end_to_end = []
    for _ in range(repeat):
        calls.write_text("")
        started = time.perf_counter()
        proc = subprocess.run(cli, env=env, capture_output=True, text=True)
        end_to_end.append(time.perf_counter() - started)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    per_run_calls = len(calls.read_text().splitlines())
    return {"nodes": NODES, "repeat": repeat, "library_median_s": round(library, 4),
            "cli_end_to_end_median_s": round(statistics.median(end_to_end), 4),
            "scontrol_calls_per_run": per_run_calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="interpreter the hooks run with (default /usr/bin/python3)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fail-on-miss", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_hooks.py must run as root (the hooks write a root-owned StateDir)")
    scratch = Path(tempfile.mkdtemp(prefix="bench-hooks-", dir="/var/tmp"))
    os.chmod(scratch, 0o755)
    try:
        hooks = bench_hooks(args.python, args.repeat, scratch)
        ceased = bench_cease(max(3, args.repeat // 5), scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = {k: v for k, v in hooks["ratio_to_bare"].items()
              if not k.startswith(("bare", "contrib"))}
    missed = [k for k, v in ratios.items() if v > HOOK_TARGET]
    if float(ceased["cli_end_to_end_median_s"]) > CEASE_TARGET:
        missed.append("dispatch-cease 512 nodes")
    if args.json:
        print(json.dumps({"hooks": hooks, "cease": ceased, "missed": missed}, indent=2))
    else:
        print(f"hooks ({hooks['python']}, median of {hooks['repeat']}; the Epilog scanned "
              f"{hooks['processes_scanned_by_epilog']} processes):")
        for name, ms in hooks["median_ms"].items():
            ratio = hooks["ratio_to_bare"][name]
            print(f"  {name:38s} {ms:8.2f} ms  {ratio:5.2f}x bare")
        print(f"dispatch-cease, {ceased['nodes']} nodes, clean records:")
        print(f"  library, fake controller            {ceased['library_median_s'] * 1000:8.1f} ms")
        print(f"  CLI end to end, fake scontrol       "
              f"{ceased['cli_end_to_end_median_s'] * 1000:8.1f} ms  "
              f"({ceased['scontrol_calls_per_run']} scontrol calls)")
        print(f"targets: hook <= {HOOK_TARGET}x bare; dispatch-cease < {CEASE_TARGET} s: "
              + ("all met" if not missed else "MISSED " + ", ".join(missed)))
    return 1 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
