#!/usr/bin/env python3
"""What ``dispatch watch``'s scan below its folder costs (the frameworks' nested save folders)
on an execution folder of ``--files`` (10,000) files, against the scan of the folder alone that
watch made before.

Run ``python bench/bench_watch_deep.py`` (about two minutes under load; ``--files``, ``--repeat``,
``--dir``, ``--json``).  In a scratch folder under ``--dir`` (default ``/var/tmp``, not tmpfs)
that it removes afterwards, two execution folders are built, each with ``--files`` files:

* *flat*: every file directly in the folder (a log folder, or the old layout of a trainer
  writing its files beside its saves);
* *tree*: Lightning's default layout, ``lightning_logs/version_0/checkpoints/`` holding 100
  published ``epoch=E-step=S.ckpt`` saves, beside ``logs/run-<i>/`` folders (100 of them)
  holding the rest of the files two names deep, where watch enters every folder at every scan.

Each is timed in the steady state of a long run (every save already published, every file
decided once), ``Watcher.scan`` median of ``--repeat`` (200) interleaved runs: the scan as it
is now (``SCAN_DEPTH`` 4) against the scan of the folder alone (``SCAN_DEPTH`` 1, what watch
did before: on the tree it finds none of Lightning's saves), and a bare ``os.scandir`` of
every folder the deep scan enters, visiting every entry (the floor).
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
import zipfile
from typing import Any

from slurm_dispatch.checkpoint import model
from slurm_dispatch.execution import watch
from slurm_dispatch.execution.watch import SaveRule, Watcher

EPOCH = model.Epoch(0, 1, 0).value
SAVES = 100


def make_flat(folder: str, files: int) -> None:
    for i in range(files):
        with open(os.path.join(folder, f"events-{i}.log"), "wb") as fh:
            fh.write(b"x")


def make_tree(folder: str, files: int) -> None:
    checkpoints = os.path.join(folder, "lightning_logs", "version_0", "checkpoints")
    os.makedirs(checkpoints)
    for step in range(1, SAVES + 1):
        with zipfile.ZipFile(os.path.join(checkpoints, f"epoch=0-step={step}.ckpt"), "w") as z:
            z.writestr("archive/data.pkl", b"w" * 64)
    rest, folders = files - SAVES, 100
    for i in range(folders):
        run = os.path.join(folder, "logs", f"run-{i}")
        os.makedirs(run)
        for j in range(rest // folders):
            with open(os.path.join(run, f"f{j}.txt"), "wb") as fh:
                fh.write(b"x")


def floor(folder: str, depth: int) -> int:
    """A bare scandir of every folder the deep scan enters, every entry visited."""
    count, pending = 0, [(folder, 1)]
    while pending:
        path, level = pending.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                count += 1
                if (
                    level < depth
                    and not entry.name.startswith(".")
                    and entry.is_dir(follow_symlinks=False)
                ):
                    pending.append((entry.path, level + 1))
    return count


def scan_at(w: Watcher, depth: int) -> int:
    watch.SCAN_DEPTH = depth
    try:
        start = time.perf_counter_ns()
        w.scan()
        return time.perf_counter_ns() - start
    finally:
        watch.SCAN_DEPTH = DEEP


DEEP = watch.SCAN_DEPTH


def measure(root: str, folder: str, repeat: int) -> dict[str, Any]:
    deep = Watcher(root, folder, EPOCH, SaveRule.make())
    flat = Watcher(root, folder, EPOCH, SaveRule.make())
    deep.scan()
    published = len(deep.scan())  # the steady state: every save published, every name decided
    scan_at(flat, 1)
    samples: dict[str, list[int]] = {"deep": [], "folder_only": [], "floor": []}
    for i in range(repeat):
        order = ("deep", "folder_only", "floor") if i % 2 else ("floor", "folder_only", "deep")
        for which in order:
            if which == "deep":
                samples[which].append(scan_at(deep, DEEP))
            elif which == "folder_only":
                samples[which].append(scan_at(flat, 1))
            else:
                start = time.perf_counter_ns()
                floor(folder, DEEP)
                samples[which].append(time.perf_counter_ns() - start)
    med = {k: statistics.median(v) / 1e3 for k, v in samples.items()}
    return {
        "published": published,
        "deep_us": round(med["deep"]),
        "folder_only_us": round(med["folder_only"]),
        "floor_us": round(med["floor"]),
        "deep_vs_folder_only": round(med["deep"] / med["folder_only"], 2),
        "deep_vs_floor": round(med["deep"] / med["floor"], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-watch-deep-", dir=args.dir)
    report: dict[str, Any] = {
        "files": args.files,
        "repeat": args.repeat,
        "scan_depth": DEEP,
        "load": os.getloadavg()[0],
    }
    try:
        for name, make in (("flat", make_flat), ("tree", make_tree)):
            root = os.path.join(scratch, name)
            folder = os.path.join(root, "exec", "a")
            os.makedirs(folder)
            make(folder, args.files)
            report[name] = measure(root, folder, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.files} files, median of {args.repeat} scans each, load {report['load']:.1f}")
    for name in ("flat", "tree"):
        r = report[name]
        print(
            f"  {name}: deep scan {r['deep_us']} us, folder only (before) "
            f"{r['folder_only_us']} us ({r['deep_vs_folder_only']}x), bare scandir of the "
            f"same folders {r['floor_us']} us ({r['deep_vs_floor']}x); "
            f"{r['published']} saves published"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
