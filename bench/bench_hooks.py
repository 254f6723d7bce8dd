#!/usr/bin/env python3
"""Benchmark the hooks against a bare interpreter, and dispatch-cease on 512 nodes.

Run ``python bench/bench_hooks.py`` (as root: the hooks write a root-owned StateDir).  It measures:

1. Each hook's wall time, as Slurm runs it (a fresh ``PYTHON -I -c ...`` with only Slurm's
   variables, no PATH), side by side with a bare ``PYTHON -I -c pass``; ``--repeat`` runs each,
   interleaved so that drift hits all alike; the median is reported.  Target: hook / bare <= 1.5.
   The shell part ``contrib/prolog.d/05-dispatch`` (sh + the interpreter) is shown for reference.
   The Epilog's time includes its /proc scan over every process of this machine (printed):
   ``--processes N`` starts idle processes (``sleep``) until the machine has N, so that runs on
   machines of different loads scan alike (a compute node after a job has some hundreds).
   With ``--baseline-src PATH`` (another commit's source tree, e.g. ``git archive b39dcc8 | tar
   -x -C PATH``) each hook of that tree runs too, interleaved with this checkout's, into a
   StateDir of its own: the ``vs baseline`` column is this checkout's median over its (no
   slower than before: <= 1.0x, within the noise of a loaded machine).  Each hook runs again
   with ``MetricsDir`` set (``(metrics)``, its ``vs no metrics`` column): the same target.
2. ``dispatch-cease`` on a job of 512 nodes, each with a start and a clean post-kill record:
   * in process, against a fake controller (the library's cost: reading 1,024 facts, judging);
   * end to end, the installed CLI in a fresh process with a fake ``scontrol`` on PATH that
     answers ``show job`` and ``show node`` for the 512 nodes (two calls, counted).
   Target: under one second.  With ``--baseline-src`` the baseline's CLI, by the entry point
   its pyproject.toml names, runs interleaved with this checkout's.

Exit status is 0 unless ``--fail-on-miss`` is given and a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
sys.path.insert(1, str(REPO / "bench"))

import baseline as baseline_src  # noqa: E402 - bench/ beside this script

HOOK_TARGET = 1.5
CEASE_TARGET = 1.0
NODES = 512


def run_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - started


def hook_argv(python: str, hook: str, src: Path = REPO) -> list[str]:
    return [
        python,
        "-I",
        "-c",
        f"import sys; sys.path.insert(0, {str(src)!r}); "
        f"from slurm_dispatch.hooks import run; run({hook!r})",
    ]


HOOK_CASES = (
    "prolog",
    "epilog",
    "prolog-slurmctld",
    "epilog-slurmctld",
    "recheck (nothing watched)",
)


def hook_cases(python: str, src: Path, conf: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each hook as Slurm runs it, importing slurm_dispatch from ``src``, writing per ``conf``."""
    job = {
        "SLURM_DISPATCH_CONF": str(conf),
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GID": "1000",
        "SLURM_JOB_RESTART_COUNT": "0",
        "SLURM_JOB_NODELIST": "n[1-4]",
    }
    node = {**job, "SLURMD_NODENAME": "n1"}
    return {
        "prolog": (
            hook_argv(python, "prolog", src),
            {**node, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"},
        ),
        "epilog": (
            hook_argv(python, "epilog", src),
            {**node, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"},
        ),
        "prolog-slurmctld": (
            hook_argv(python, "prolog", src),
            {**job, "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"},
        ),
        "epilog-slurmctld": (
            hook_argv(python, "epilog", src),
            {**job, "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"},
        ),
        "recheck (nothing watched)": (
            hook_argv(python, "recheck", src),
            {"SLURM_DISPATCH_CONF": str(conf)},
        ),
    }


def state_conf(scratch: Path, name: str) -> tuple[Path, Path]:
    """A StateDir and the dispatch.conf naming it: (state, conf)."""
    state = scratch / name
    state.mkdir(mode=0o755)
    conf = scratch / f"{name}.conf"
    conf.write_text(f"StateDir={state}\n")
    return state, conf


def bench_hooks(
    python: str, repeat: int, scratch: Path, baseline: Path | None = None
) -> dict[str, Any]:
    state, conf = state_conf(scratch, "state")
    part = scratch / "05-dispatch"
    text = (REPO / "contrib/prolog.d/05-dispatch").read_text()
    text = re.sub(r"(?m)^DISPATCH_PYTHON=\S+", f"DISPATCH_PYTHON={python}", text)
    text = re.sub(r"(?m)^DISPATCH_CONF=\S*", f"DISPATCH_CONF={conf}", text)
    # The bench runs the checkout, not an installed copy: put it on the part's sys.path.
    part.write_text(
        text.replace(
            "    from slurm_dispatch.hooks import run",
            f'    import sys; sys.path.insert(0, "{REPO}")\n'
            "    from slurm_dispatch.hooks import run",
        )
    )
    part.chmod(0o755)
    ours = hook_cases(python, REPO, conf)
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "bare python -I -c pass": ([python, "-I", "-c", "pass"], {}),
        **ours,
        "contrib prolog.d part (sh + prolog)": (["/bin/sh", str(part)], {**ours["prolog"][1]}),
    }
    # The same hooks with MetricsDir set (docs/admin-guide.md, metrics): each run also adds its
    # counts to the node's slurm-dispatch.prom, under its lock.
    metrics_state, metrics_conf = state_conf(scratch, "metrics-state")
    textfile = scratch / "textfile"
    textfile.mkdir(mode=0o755)
    metrics_conf.write_text(f"StateDir={metrics_state}\nMetricsDir={textfile}\n")
    cases.update(
        {f"{name} (metrics)": case for name, case in hook_cases(python, REPO, metrics_conf).items()}
    )
    for tree in (REPO, baseline) if baseline is not None else (REPO,):
        baseline_src.compile_tree(python, tree)
    states = {"this checkout": state, "metrics": metrics_state}
    if baseline is not None:
        states["baseline"], base_conf = state_conf(scratch, "baseline-state")
        cases.update(
            {
                f"{name} (baseline)": case
                for name, case in hook_cases(python, baseline, base_conf).items()
            }
        )
    for argv, env in cases.values():
        run_once(argv, env)  # warm the page cache and the bytecode cache
    # Every hook really recorded (a hook that fails early would look fast); the contrib part
    # records a second node start.
    for side, folder in states.items():
        recorded = sorted(p.name.split(".")[0] for p in (folder / "facts/1000/1").iterdir())
        wanted = ["ctld-end", "ctld-start", "end", "start"] + ["start"] * (side == "this checkout")
        if recorded != wanted:
            sys.exit(f"the hooks of {side} did not record as expected: {recorded}")
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for rnd in range(repeat):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            argv, env = cases[name]
            times[name].append(run_once(argv, env))
    medians = {name: statistics.median(values) for name, values in times.items()}
    bare = medians["bare python -I -c pass"]
    processes = sum(1 for p in os.listdir("/proc") if p.isdigit())
    result: dict[str, Any] = {
        "python": python,
        "repeat": repeat,
        "processes_scanned_by_epilog": processes,
        "median_ms": {k: round(v * 1000, 2) for k, v in medians.items()},
        "ratio_to_bare": {k: round(v / bare, 2) for k, v in medians.items()},
    }
    result["ratio_metrics_to_none"] = {
        name: round(medians[f"{name} (metrics)"] / medians[name], 3) for name in HOOK_CASES
    }
    if not (textfile / "slurm-dispatch.prom").exists():
        sys.exit("the hooks with MetricsDir wrote no slurm-dispatch.prom")
    if baseline is not None:
        result["baseline_src"] = str(baseline)
        result["ratio_to_baseline"] = {
            name: round(medians[name] / medians[f"{name} (baseline)"], 3) for name in HOOK_CASES
        }
    return result


def bench_cease(repeat: int, scratch: Path, baseline: Path | None = None) -> dict[str, Any]:
    from slurm_dispatch import config
    from slurm_dispatch.node import cease
    from tests.fakes import squeue
    from tests.fakes.hooks import FakeController, job, node, record

    state = scratch / "cease-state"
    state.mkdir(mode=0o755)
    now = time.time()
    names = [f"n{i}" for i in range(1, NODES + 1)]
    for name in names:
        start = record(str(state), "start", name, time=now - 100, restart=0)
        record(
            str(state),
            "end",
            name,
            time=now - 90,
            restart=0,
            survivors=[],
            scan_error=None,
            start_token=start.split(".")[-1],
        )
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
    squeue.install_commands(
        bin_dir,
        str(calls),
        {
            "JobId": "100",
            "UserId": "alice(1000)",
            "JobState": "COMPLETED",
            "Restarts": "0",
            "StartTime": stamp,
            "EndTime": stamp,
            "NodeList": f"n[1-{NODES}]",
        },
        boot="2026-01-01T00:00:00",
    )
    (scratch / "dispatch.conf").write_text(f"StateDir={state}\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "SLURM_DISPATCH_CONF": str(scratch / "dispatch.conf"),
    }
    clis = {
        "this checkout": [
            sys.executable,
            "-c",
            "from slurm_dispatch.cli.cease import main; main()",
            "100",
        ]
    }
    if baseline is not None:
        module, function = baseline_src.entry_point(baseline, "dispatch-cease")
        clis["baseline"] = [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(baseline)!r}); "
            f"from {module} import {function}; {function}()",
            "100",
        ]
    end_to_end: dict[str, list[float]] = {side: [] for side in clis}
    per_run_calls = 0
    for _ in range(repeat):
        for side, cli in clis.items():
            calls.write_text("")
            started = time.perf_counter()
            proc = subprocess.run(cli, env=env, capture_output=True, text=True)
            end_to_end[side].append(time.perf_counter() - started)
            assert proc.returncode == 0, (side, proc.stdout + proc.stderr)
            if side == "this checkout":
                per_run_calls = len(calls.read_text().splitlines())
    result: dict[str, Any] = {
        "nodes": NODES,
        "repeat": repeat,
        "library_median_s": round(library, 4),
        "cli_end_to_end_median_s": round(statistics.median(end_to_end["this checkout"]), 4),
        "scontrol_calls_per_run": per_run_calls,
    }
    if baseline is not None:
        result["baseline_cli_end_to_end_median_s"] = round(
            statistics.median(end_to_end["baseline"]), 4
        )
    return result


def pad_processes(wanted: int) -> list[subprocess.Popen]:
    """Idle processes until this machine has ``wanted`` (none if it has as many already)."""
    have = sum(1 for p in os.listdir("/proc") if p.isdigit())
    return [
        subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
        for _ in range(max(0, wanted - have))
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--python",
        default="/usr/bin/python3",
        help="interpreter the hooks run with (default /usr/bin/python3)",
    )
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument(
        "--baseline-src",
        metavar="PATH",
        help="another commit's source tree, timed side by side (e.g. "
        "git archive COMMIT | tar -x -C PATH)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        metavar="N",
        help="start idle processes until this machine has N, for the Epilog's "
        "scan (default: as many as there are)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fail-on-miss", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_hooks.py must run as root (the hooks write a root-owned StateDir)")
    baseline = baseline_src.checked(args.baseline_src) if args.baseline_src else None
    scratch = Path(tempfile.mkdtemp(prefix="bench-hooks-", dir="/var/tmp"))
    os.chmod(scratch, 0o755)
    padding = pad_processes(args.processes)
    try:
        hooks = bench_hooks(args.python, args.repeat, scratch, baseline)
        ceased = bench_cease(max(3, args.repeat // 5), scratch, baseline)
    finally:
        for proc in padding:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = {
        k: v
        for k, v in hooks["ratio_to_bare"].items()
        if k in HOOK_CASES or k.removesuffix(" (metrics)") in HOOK_CASES
    }
    missed = [k for k, v in ratios.items() if v > HOOK_TARGET]
    if float(ceased["cli_end_to_end_median_s"]) > CEASE_TARGET:
        missed.append("dispatch-cease 512 nodes")
    if args.json:
        print(json.dumps({"hooks": hooks, "cease": ceased, "missed": missed}, indent=2))
    else:
        print(
            f"hooks ({hooks['python']}, median of {hooks['repeat']}; the Epilog scanned "
            f"{hooks['processes_scanned_by_epilog']} processes):"
        )
        against = hooks.get("ratio_to_baseline", {})
        metered = {
            f"{name} (metrics)": ratio for name, ratio in hooks["ratio_metrics_to_none"].items()
        }
        for name, ms in hooks["median_ms"].items():
            ratio = hooks["ratio_to_bare"][name]
            vs = f"  {against[name]:5.2f}x vs baseline" if name in against else ""
            vs += f"  {metered[name]:5.2f}x vs no metrics" if name in metered else ""
            print(f"  {name:38s} {ms:8.2f} ms  {ratio:5.2f}x bare{vs}")
        if baseline is not None:
            print(f"  (baseline: {hooks['baseline_src']})")
        print(f"dispatch-cease, {ceased['nodes']} nodes, clean records:")
        print(f"  library, fake controller            {ceased['library_median_s'] * 1000:8.1f} ms")
        print(
            f"  CLI end to end, fake scontrol       "
            f"{ceased['cli_end_to_end_median_s'] * 1000:8.1f} ms  "
            f"({ceased['scontrol_calls_per_run']} scontrol calls)"
        )
        if "baseline_cli_end_to_end_median_s" in ceased:
            old = ceased["baseline_cli_end_to_end_median_s"]
            print(
                f"  CLI end to end, baseline            {old * 1000:8.1f} ms  "
                f"({ceased['cli_end_to_end_median_s'] / old:.2f}x vs baseline)"
            )
        print(
            f"targets: hook <= {HOOK_TARGET}x bare; dispatch-cease < {CEASE_TARGET} s: "
            + ("all met" if not missed else "MISSED " + ", ".join(missed))
        )
    return 1 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
