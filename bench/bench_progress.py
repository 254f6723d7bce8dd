#!/usr/bin/env python3
"""Benchmark the progress record (docs/user-guide.md, a stalled job is caught) against a loop that
records nothing.

Run ``python bench/bench_progress.py`` (about half a minute; ``--steps``, ``--rounds``,
``--work``, ``--dir``, ``--json``, see ``--help``).  In a scratch folder under ``--dir``
(default ``/var/tmp``, not tmpfs) it times a training-like loop of ``--steps`` steps, each
step ``--work`` microseconds of pure-Python arithmetic (a harsh case: real steps take
milliseconds to seconds, so the record's share of them is smaller still), three ways side by
side, their order rotated each round:

* ``none``: the loop alone;
* ``recorded``: the loop calling ``api.progress(step)`` every step (what the integrations do
  per step: one remembered step and a monotonic clock read, a write at most every 2 s);
* ``naive``: the loop writing the record every step (replace in place, no fsync), to show
  what the bound saves (a tenth of the steps, last in each round: its writes slow what
  follows them).

Reported: the cost of one ``api.progress`` call alone (200,000 in a loop, less the bare
loop), the median time per step of each, and the ratio to ``none`` (target for
``recorded``: at most 1.01x, within the noise), with the number of writes each made.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from slurm_dispatch import api  # noqa: E402
from slurm_dispatch.execution import steps  # noqa: E402


def work(units: int) -> float:
    total = 0.0
    for i in range(units):
        total += (i * 0.5) ** 0.5
    return total


def calibrate(micros: float) -> int:
    units = 1000
    while True:
        start = time.perf_counter()
        for _ in range(20):
            work(units)
        took = (time.perf_counter() - start) / 20 * 1e6
        if took > micros / 2:
            return max(1, int(units * micros / took))
        units *= 2


def loop(kind: str, n: int, units: int, folder: str) -> tuple[float, int]:
    """Seconds per step of one loop of ``kind``, and the record's writes."""
    if kind == "naive":
        rec = steps.ProgressRecorder(folder, interval=0.0)
    else:
        rec = steps.ProgressRecorder(folder)
    steps._current = rec if kind == "recorded" else None
    start = time.perf_counter()
    for step in range(n):
        work(units)
        if kind == "recorded":
            api.progress(step)
        elif kind == "naive":
            rec.step(step)
    took = (time.perf_counter() - start) / n
    return took, rec.writes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps a loop (20000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the three (7)")
    parser.add_argument(
        "--work", type=float, default=100.0, help="microseconds of arithmetic a step (100)"
    )
    parser.add_argument("--dir", default="/var/tmp", help="scratch folder's parent")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench-progress-", dir=args.dir)
    try:
        units = calibrate(args.work)
        kinds = ["none", "recorded", "naive"]
        times: dict[str, list[float]] = {k: [] for k in kinds}
        writes: dict[str, list[int]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            # none and recorded alternate; naive (20x slower, its writes disturb what follows
            # it) runs a tenth of the steps, last in each round.
            for kind in ["none", "recorded"] if r % 2 == 0 else ["recorded", "none"]:
                took, wrote = loop(kind, args.steps, units, folder)
                times[kind].append(took)
                writes[kind].append(wrote)
            took, wrote = loop("naive", max(1, args.steps // 10), units, folder)
            times["naive"].append(took)
            writes["naive"].append(wrote)
        per_call = []
        for _ in range(args.rounds):  # the call alone: 200,000 in a loop, less the bare loop
            steps._current = steps.ProgressRecorder(folder)
            start = time.perf_counter_ns()
            for step in range(200_000):
                api.progress(step)
            mid = time.perf_counter_ns()
            for _step in range(200_000):
                pass
            per_call.append((2 * mid - start - time.perf_counter_ns()) / 200_000)
        base = statistics.median(times["none"])
        rows = {
            k: {
                "step_us": statistics.median(times[k]) * 1e6,
                "ratio": statistics.median(times[k]) / base,
                "min_ratio": min(times[k]) / min(times["none"]),
                "writes_per_loop": statistics.median(writes[k]),
            }
            for k in kinds
        }
        load = os.getloadavg()[0]
        if args.json:
            print(
                json.dumps(
                    {
                        "rows": rows,
                        "steps": args.steps,
                        "load": load,
                        "call_ns": statistics.median(per_call),
                    },
                    indent=1,
                )
            )
        else:
            print(
                f"{args.steps} steps of ~{args.work:.0f} us, {args.rounds} rounds, load {load:.1f}"
            )
            print(f"{'':10} {'us/step':>9} {'vs none':>8} {'min ratio':>9} {'writes':>7}")
            for k in kinds:
                row = rows[k]
                print(
                    f"{k:10} {row['step_us']:9.2f} {row['ratio']:7.3f}x "
                    f"{row['min_ratio']:8.3f}x {row['writes_per_loop']:7.0f}"
                )
            print(
                f"one api.progress call: {statistics.median(per_call):.0f} ns (median of "
                f"{args.rounds} runs of 200,000)"
            )
    finally:
        steps._current = steps._UNSET
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
