#!/usr/bin/env python3
"""Benchmark ``dispatch watch`` against its targets (bench/README.md, dispatch watch).

Run ``python bench/bench_watch.py`` (about 1.5 minutes; ``--saves``, ``--repeat``,
``--idle-seconds``, ``--latency-saves``, ``--interval``, ``--dir``, ``--json``, see ``--help``).
One run measures, in a fresh scratch folder under ``--dir`` (default ``/var/tmp``, not tmpfs):

1. One scan of an execution folder holding ``--saves`` (1,000) complete ``checkpoint-N``
   saves, all published already (the steady state of a long run), through
   ``Watcher.scan`` against a bare ``os.scandir`` of the same folder that visits every
   entry.  Target: median <= 1.5x.  Also shown, not judged: a restarted watch's first scan
   (it reads ``pub/`` once for its mark), the worker thread each scan runs in, and what
   confirming a save costs once: a snapshot of one save, the pass over ``/proc``
   for writers, and the fsync of the save before its publication.
2. The idle CPU of a real ``dispatch watch -- sleep`` on that folder with the default
   interval over ``--idle-seconds`` (60), read from ``/proc/PID/stat`` (user + system
   ticks) after its first scan.  Target: < 1% of one core.
3. The time from a save becoming complete (its ``trainer_state.json`` closed) to watch's
   "published step N" line on stderr, for ``--latency-saves`` saves made at random moments
   of the scan cycle, with ``--interval`` (default 1 s).  A save is published at the second
   scan that finds it unchanged and unwritten, so the figure is one
   interval more than the first sighting: about 1.5 intervals on median, two at worst.
   Target: max <= 2 x interval + 50 ms.

Timings are wall-clock ``time.perf_counter_ns`` / ``time.monotonic``.  Exit status is 0
unless ``--fail-on-miss`` is given and a target is missed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution.saverules import files_of, open_for_writing, snapshot
from slurm_dispatch.execution.saves import sync_save
from slurm_dispatch.execution.watch import DEFAULT_INTERVAL, SaveRule, Watcher

SCAN_TARGET = 1.5  # scan / bare scandir
IDLE_TARGET = 1.0  # percent of one core
LATENCY_SLACK = 0.050  # seconds over the two intervals
EPOCH = model.Epoch(0, 1, 0).value


def make_saves(folder: str, steps: range) -> None:
    for step in steps:
        save = os.path.join(folder, f"checkpoint-{step}")
        os.mkdir(save)
        with open(os.path.join(save, "model.safetensors"), "wb") as fh:
            fh.write(b"w" * 64)
        with open(os.path.join(save, "trainer_state.json"), "w") as fh:
            fh.write(json.dumps({"global_step": step}))


def bare_scandir(folder: str) -> int:
    count = 0
    with os.scandir(folder) as entries:
        for _ in entries:
            count += 1
    return count


def median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


def bench_scan(args: argparse.Namespace, root: str, folder: str) -> dict[str, Any]:
    make_saves(folder, range(1, args.saves + 1))
    watcher = Watcher(root, folder, EPOCH, SaveRule.make())
    assert watcher.scan() == []  # sees them all
    first = watcher.scan()  # finds them unchanged, publishes them: the steady state begins
    assert len(first) == args.saves, len(first)
    bare_scandir(folder)
    scans: list[int] = []
    floors: list[int] = []
    for i in range(args.repeat):  # interleaved, alternating which goes first
        for which in (0, 1) if i % 2 else (1, 0):
            start = time.perf_counter_ns()
            if which:
                assert watcher.scan() == []
            else:
                bare_scandir(folder)
            (scans if which else floors).append(time.perf_counter_ns() - start)
    restarts = []
    for _ in range(max(3, args.repeat // 20)):
        again = Watcher(root, folder, EPOCH, SaveRule.make())
        start = time.perf_counter_ns()
        assert again.scan() == []
        restarts.append(time.perf_counter_ns() - start)
    threads = []
    for _ in range(args.repeat):
        start = time.perf_counter_ns()
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        threads.append(time.perf_counter_ns() - start)
    one = os.path.join(folder, "checkpoint-1")
    confirm: dict[str, list[int]] = {"snapshot": [], "writers": [], "sync": []}
    for _ in range(max(3, args.repeat // 20)):
        start = time.perf_counter_ns()
        entries = snapshot(one)
        confirm["snapshot"].append(time.perf_counter_ns() - start)
        assert entries is not None
        start = time.perf_counter_ns()
        assert open_for_writing(files_of(one, entries)) == []
        confirm["writers"].append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        sync_save(one)
        confirm["sync"].append(time.perf_counter_ns() - start)
    processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
    return {
        "saves": args.saves,
        "repeat": args.repeat,
        "scan_us": median_us(scans),
        "snapshot_us": median_us(confirm["snapshot"]),
        "writers_us": median_us(confirm["writers"]),
        "processes": processes,
        "sync_us": median_us(confirm["sync"]),
        "scan_min_us": min(scans) / 1e3,
        "scandir_us": median_us(floors),
        "scandir_min_us": min(floors) / 1e3,
        "ratio": statistics.median(scans) / statistics.median(floors),
        "restart_scan_us": median_us(restarts),
        "thread_us": median_us(threads),
    }


def start_watch(
    root: str, folder: str, interval: float | None, seconds: float
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DISPATCH_CHECKPOINT": root,
        "DISPATCH_EXEC_DIR": folder,
        "DISPATCH_EPOCH": str(EPOCH),
    }
    argv = [sys.executable, "-m", "slurm_dispatch.cli.dispatch", "watch"]
    if interval is not None:
        argv += ["--interval", str(interval)]
    return subprocess.Popen(
        [*argv, "--", "sleep", str(seconds)],
        env=env,
        text=True,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def bench_idle(args: argparse.Namespace, root: str, folder: str) -> dict[str, Any]:
    """watch's own CPU with the default interval, two ways.

    ``/proc/PID/stat`` ticks over the window (after start-up and the first scan), whose
    resolution is one clock tick; and, finer, the ``wait4`` rusage of two watches started
    together, one living ``idle_seconds`` longer: the difference is the idle window alone
    (start-up, imports and the first scan cancel out)."""
    short = start_watch(root, folder, None, 2 * DEFAULT_INTERVAL + 1)
    long = start_watch(root, folder, None, 2 * DEFAULT_INTERVAL + 1 + args.idle_seconds)
    time.sleep(2 * DEFAULT_INTERVAL)  # start-up and the first scan (reads pub/) are not idle
    ticks0, wall0 = cpu_ticks(long.pid), time.monotonic()
    short_cpu = _reap(short)
    time.sleep(max(0.0, wall0 + args.idle_seconds - 1 - time.monotonic()))
    ticks1, wall1 = cpu_ticks(long.pid), time.monotonic()
    long_cpu = _reap(long)
    hz = os.sysconf("SC_CLK_TCK")
    tick_cpu = (ticks1 - ticks0) / hz
    rusage_cpu = max(0.0, long_cpu - short_cpu)
    return {
        "seconds": args.idle_seconds,
        "interval": DEFAULT_INTERVAL,
        "percent": 100 * rusage_cpu / args.idle_seconds,
        "cpu_s": rusage_cpu,
        "tick_window_s": round(wall1 - wall0, 1),
        "tick_cpu_s": tick_cpu,
        "tick_percent": 100 * tick_cpu / (wall1 - wall0),
        "tick_s": 1 / hz,
        "startup_cpu_s": short_cpu,
        "saves": args.saves,
    }


def _reap(proc: subprocess.Popen[str]) -> float:
    """Wait for ``proc`` and return its user + system CPU seconds (wait4's rusage)."""
    assert proc.stderr is not None
    proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    return float(usage.ru_utime + usage.ru_stime)


def bench_latency(args: argparse.Namespace, root: str) -> dict[str, Any]:
    folder = os.path.join(root, "exec", "latency")
    os.makedirs(folder)
    proc = start_watch(root, folder, args.interval, 3600)
    seen: dict[int, float] = {}
    arrived = threading.Condition()

    def read_lines() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("dispatch watch: published step "):
                with arrived:
                    seen[int(line.split()[4].rstrip(":"))] = time.monotonic()
                    arrived.notify_all()

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    rng = random.Random(10)
    latencies = []
    try:
        time.sleep(1.0)  # watch started and made its first scan
        for step in range(1, args.latency_saves + 1):
            time.sleep(rng.uniform(0, args.interval))  # a random moment of the scan cycle
            make_saves(folder, range(step, step + 1))
            complete = time.monotonic()
            with arrived:
                if not arrived.wait_for(
                    functools.partial(seen.__contains__, step), args.interval + 30
                ):
                    raise RuntimeError(
                        f"step {step} was not published within {args.interval + 30} s"
                    )
            latencies.append(seen[step] - complete)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "interval": args.interval,
        "saves": len(latencies),
        "median_ms": 1e3 * statistics.median(latencies),
        "max_ms": 1e3 * max(latencies),
        "min_ms": 1e3 * min(latencies),
        "target_ms": 1e3 * (2 * args.interval + LATENCY_SLACK),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--saves", type=int, default=1000, help="saves in the scanned folder")
    p.add_argument("--repeat", type=int, default=400, help="timed scans of each kind")
    p.add_argument("--idle-seconds", type=float, default=60.0, help="idle CPU window")
    p.add_argument("--latency-saves", type=int, default=15, help="saves timed for latency")
    p.add_argument("--interval", type=float, default=1.0, help="watch --interval for latency")
    p.add_argument("--dir", default="/var/tmp", help="where the scratch folder goes")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 when a target is missed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="bench-watch-", dir=args.dir)
    try:
        root = os.path.join(scratch, "ck")
        folder = os.path.join(root, "exec", "a")
        os.makedirs(folder)
        results = {"scan": bench_scan(args, root, folder)}
        results["idle"] = bench_idle(args, root, folder)
        results["latency"] = bench_latency(args, root)
        assert store.latest(root) is not None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    scan, idle, lat = results["scan"], results["idle"], results["latency"]
    rows = [
        (
            "scan, 1 folder of saves",
            f"{scan['scan_us']:.1f} us",
            "os.scandir",
            f"{scan['scandir_us']:.1f} us",
            f"{scan['ratio']:.2f}x",
            f"<= {SCAN_TARGET}x",
            scan["ratio"] <= SCAN_TARGET,
        ),
        (
            "idle CPU of watch",
            f"{idle['percent']:.3f} %",
            "one core",
            "100 %",
            f"{idle['percent'] / 100:.5f}x",
            f"< {IDLE_TARGET} %",
            idle["percent"] < IDLE_TARGET,
        ),
        (
            "complete -> published (max)",
            f"{lat['max_ms']:.0f} ms",
            "interval",
            f"{1e3 * lat['interval']:.0f} ms",
            f"{lat['max_ms'] / (1e3 * lat['interval']):.2f}x",
            f"<= {lat['target_ms']:.0f} ms",
            lat["max_ms"] <= lat["target_ms"],
        ),
    ]
    results["met"] = {row[0]: row[6] for row in rows}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"{scan['saves']:,} complete saves in one folder, all published; {scan['repeat']} "
            f"interleaved scans each (min: watch {scan['scan_min_us']:.1f} us, scandir "
            f"{scan['scandir_min_us']:.1f} us); a restarted watch's first scan (reads "
            f"pub/): {scan['restart_scan_us']:.0f} us; the worker thread a scan runs in: "
            f"{scan['thread_us']:.0f} us"
        )
        print(
            f"confirming one save before publishing it (once, never while idle): its snapshot "
            f"{scan['snapshot_us']:.0f} us, the pass over /proc for writers "
            f"{scan['writers_us']:.0f} us ({scan['processes']} processes), its fsync "
            f"{scan['sync_us']:.0f} us"
        )
        print(
            f"idle, --interval {idle['interval']:g} (default), {idle['seconds']:g} s: "
            f"{idle['cpu_s'] * 1e3:.1f} ms CPU by wait4 of two watches (the longer one's "
            f"extra); /proc/PID/stat: {idle['tick_cpu_s'] * 1e3:.0f} ms in "
            f"{idle['tick_window_s']} s ({idle['tick_percent']:.3f} %, clock tick "
            f"{idle['tick_s'] * 1e3:.0f} ms); start-up and first scan: "
            f"{idle['startup_cpu_s'] * 1e3:.0f} ms"
        )
        print(
            f"latency: {lat['saves']} saves at random moments, --interval {lat['interval']:g}:"
            f" min {lat['min_ms']:.0f} ms, median {lat['median_ms']:.0f} ms, max "
            f"{lat['max_ms']:.0f} ms (a second scan confirms a save: one interval more than"
            " before)"
        )
        print()
        header = ("what", "watch", "baseline", "figure", "ratio", "target", "met")
        table = [header, *[(*row[:6], "yes" if row[6] else "NO") for row in rows]]
        widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
        for row in table:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return 1 if args.fail_on_miss and not all(results["met"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
