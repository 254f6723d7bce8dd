#!/usr/bin/env python3
"""Benchmark ``dispatch gc --dry-run`` against ``dispatch latest`` on the same store
(bench/README.md, dispatch gc).

Run ``python bench/bench_gc.py``.  The store: ``--folders`` execution folders (1,000), each with
the launcher's record and ``--per-folder`` saves (100, each a small file) all published, so
``pub/`` holds 100,000 names; each execution resumed from the one before, at a higher epoch.
One run measures, each with one untimed warm-up, then ``--repeat`` timed runs interleaved:

1. the commands a user runs, as processes: ``dispatch latest`` and ``dispatch gc --keep 2
   --dry-run`` (target: gc / latest <= 2x);
2. the same as library calls in one process (``store.latest`` and ``gc.collect(dry_run=True)``),
   without the interpreter's start;
3. ``dispatch gc --keep 2 --dry-run --sizes`` on its own (it stats every file).

Medians of wall-clock ``time.perf_counter``.  The scratch folder is a fresh ``mkdtemp`` under
``--dir`` (default ``/var/tmp``), removed at the end.  Exit 0 unless ``--fail-on-miss`` and the
target is missed.
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
from typing import Callable

from slurm_dispatch.checkpoint import gc, model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import launch

TARGET = 2.0  # gc --dry-run / latest, as commands


def build(root: str, folders: int, per_folder: int) -> None:
    pub = os.path.join(root, "pub")
    os.makedirs(pub)
    previous = None
    for n in range(1, folders + 1):
        epoch = model.Epoch(0, n, 0).value
        attempt = model.new_attempt()
        folder = os.path.join(root, "exec", attempt)
        os.makedirs(folder)
        launch.write_exec_record(
            folder,
            {
                "epoch": epoch,
                "attempt": attempt,
                "resume_publication": previous,
                "resume_from": None,
            },
        )
        for step in range(per_folder):
            relative = f"exec/{attempt}/epoch=0-step={n * per_folder + step}.ckpt"
            with open(os.path.join(root, relative), "wb") as handle:
                handle.write(b"w" * 64)
            previous = model.format_name(epoch, n * per_folder + step, relative)
            os.close(os.open(os.path.join(pub, previous), os.O_CREAT | os.O_WRONLY, 0o444))


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def command(*args: str) -> Callable[[], object]:
    argv = [sys.executable, "-m", "slurm_dispatch.cli.dispatch", *args]
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folders", type=int, default=1000)
    parser.add_argument("--per-folder", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fail-on-miss", action="store_true")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-gc-", dir=args.dir)
    try:
        root = os.path.join(scratch, "root")
        started = time.perf_counter()
        build(root, args.folders, args.per_folder)
        built = time.perf_counter() - started
        ops = {
            "latest (command)": command("latest", "--root", root),
            "gc --dry-run (command)": command("gc", "--root", root, "--keep", "2", "--dry-run"),
            "latest (library)": lambda: store.latest(root),
            "gc --dry-run (library)": lambda: gc.collect(root, 2, dry_run=True),
        }
        samples: dict[str, list[float]] = {name: [] for name in ops}
        for call in ops.values():
            call()  # warm-up: caches and the interpreter's own files
        for _ in range(args.repeat):
            for name, call in ops.items():
                samples[name].append(timed(call))
        sizes_call = command("gc", "--root", root, "--keep", "2", "--dry-run", "--sizes")
        sizes_call()
        sizes = [timed(sizes_call) for _ in range(max(3, args.repeat // 2))]
        plan = gc.collect(root, 2, dry_run=True)
        median = {name: statistics.median(values) for name, values in samples.items()}
        ratio = median["gc --dry-run (command)"] / median["latest (command)"]
        library_ratio = median["gc --dry-run (library)"] / median["latest (library)"]
        result = {
            "publications": args.folders * args.per_folder,
            "folders": args.folders,
            "build_s": round(built, 1),
            "median_s": {k: round(v, 4) for k, v in median.items()},
            "sizes_median_s": round(statistics.median(sizes), 4),
            "ratio_commands": round(ratio, 2),
            "ratio_library": round(library_ratio, 2),
            "target": TARGET,
            "would_remove": len(plan.removals),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        }
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(
                f"store: {result['publications']:,} publications, {args.folders:,} "
                f"execution folders (built in {built:.1f} s); a dry run would remove "
                f"{len(plan.removals)} folder(s) or save(s)"
            )
            for name, value in median.items():
                print(f"  {name:<26} median {value * 1000:8.1f} ms")
            print(
                f"  gc --dry-run --sizes (command) median {statistics.median(sizes) * 1000:8.1f} ms"
            )
            print(
                f"gc --dry-run / latest: {ratio:.2f}x as commands (target <= {TARGET}x), "
                f"{library_ratio:.2f}x as library calls"
            )
        return 1 if args.fail_on_miss and ratio > TARGET else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
