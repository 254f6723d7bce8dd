#!/usr/bin/env python3
"""Benchmark the POSIX publication store against its floors and against Hugging Face.

Run ``python bench/bench_store.py`` (``make bench``).  One run measures:

1. ``store.latest(root)`` on ``--count`` publications in one ``pub/`` against
   * the floor: ``os.listdir(pub/)`` and ``name.split('-')`` for every name, no parsing;
   * ``transformers.trainer_utils.get_last_checkpoint`` on a folder of ``--count``
     ``checkpoint-N`` folders (skipped, and said so, when transformers is not installed).
   Each operation gets one untimed warm-up call (page and dentry caches warm), then
   ``--repeat`` timed calls, interleaved so that drift hits all three alike.
2. ``store.publish`` against the bare syscall floor: ``os.open(O_CREAT|O_EXCL|O_WRONLY)`` +
   ``close`` + ``fsync(pub/ fd)`` + ``fsync(root fd)`` on fresh names with both directories
   already open.  ``--publish-count`` operations each, in ``--rounds`` interleaved rounds
   (floor and store alternate which goes first), each in its own fresh root on the same
   file system.

Timings are wall-clock ``time.perf_counter_ns``.  The scratch directory is a fresh
``mkdtemp`` under ``--dir`` (default ``/var/tmp``), removed at the end unless ``--keep``.
Exit status is 0 unless ``--fail-on-miss`` is given and a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store

LATEST_FLOOR_TARGET = 1.5  # latest / (listdir + split) must be <= this
LATEST_HF_TARGET = 1.0  # latest / get_last_checkpoint must be < this
PUBLISH_TARGET = 1.3  # publish / bare syscalls must be <= this

# A few executions, each with its own epoch and attempt folder, as the seed's rules describe.
EPOCHS = [model.Epoch(0, 1, 0), model.Epoch(0, 1, 1), model.Epoch(0, 2, 0), model.Epoch(1, 1, 0)]


# --------------------------------------------------------------------------- helpers


def file_system_of(path: str) -> dict[str, str]:
    """The mount that holds ``path``: mount point, type and source, from /proc/self/mountinfo."""
    real = os.path.realpath(path)
    best = {"mount_point": "?", "type": "?", "source": "?"}
    best_len = -1
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                sep = fields.index("-")
                mount_point = fields[4].replace("\\040", " ")
                inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= best_len:
                    best_len = len(mount_point)
                    best = {
                        "mount_point": mount_point,
                        "type": fields[sep + 1],
                        "source": fields[sep + 2],
                    }
    except (OSError, ValueError, IndexError):
        pass
    return best


def fmt_time(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} us"


def summary(samples_ns: list[int]) -> dict[str, Any]:
    return {
        "n": len(samples_ns),
        "samples_ms": [round(x / 1e6, 3) for x in samples_ns] if len(samples_ns) <= 50 else None,
        "median_ns": float(statistics.median(samples_ns)),
        "min_ns": float(min(samples_ns)),
        "mean_ns": float(statistics.fmean(samples_ns)),
        "max_ns": float(max(samples_ns)),
    }


def say(args: argparse.Namespace, text: str) -> None:
    """Progress goes to stderr with --json, so stdout stays one JSON document."""
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def profile(args: argparse.Namespace, label: str, fn: Callable[[], Any]) -> None:
    """cProfile ``fn`` once and print the most expensive functions (--profile)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.profile_lines)
    say(args, f"--- profile: {label} (cProfile, by own time; cProfile inflates small calls)")
    say(args, out.getvalue().strip())


# --------------------------------------------------------------------------- setup


def make_publications(root: str, count: int) -> str:
    """Create ``count`` publications in ``root/pub`` directly; return the greatest name.

    The publications are hard links to one empty file per epoch (kept outside ``pub/``):
    to a reader of ``pub/`` they are empty files like any other, and a link costs a
    fraction of creating an inode, which keeps the setup of 100,000 names to seconds.
    ext4 allows 65,000 links to one inode, so a fresh source is started every 50,000.
    """
    pub = os.path.join(root, store.PUB)
    sources = os.path.join(root, "link-sources")
    os.makedirs(pub)
    os.makedirs(sources)
    per_epoch = -(-count // len(EPOCHS))
    greatest = ""
    made = 0
    pub_fd = os.open(pub, os.O_RDONLY | os.O_DIRECTORY)
    src_fd = os.open(sources, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for epoch in EPOCHS:
            attempt = model.new_attempt()
            for step in range(per_epoch):
                if made == count:
                    break
                if made % 50_000 == 0:
                    source = f"empty-{made}"
                    os.close(
                        os.open(source, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444, dir_fd=src_fd)
                    )
                name = model.format_name(epoch.value, step, f"exec/{attempt}/checkpoint-{step}")
                os.link(source, name, src_dir_fd=src_fd, dst_dir_fd=pub_fd)
                greatest = max(greatest, name)
                made += 1
    finally:
        os.close(src_fd)
        os.close(pub_fd)
    return greatest


def make_hf_checkpoints(folder: str, count: int) -> str:
    os.makedirs(folder)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for step in range(count):
            os.mkdir(f"checkpoint-{step}", dir_fd=fd)
    finally:
        os.close(fd)
    return os.path.join(folder, f"checkpoint-{count - 1}")


def remove_scratch(scratch: str, count: int) -> None:
    """Remove the scratch tree; the big folders by their known names first.

    Unlinking known names skips the ``lstat`` that ``shutil.rmtree`` makes per entry, which
    matters with 100,000 folders on a slow disk.
    """
    hf_dir = os.path.join(scratch, "hf-output")
    if os.path.isdir(hf_dir) and not os.path.islink(hf_dir):
        fd = os.open(hf_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for step in range(count):
                try:
                    os.rmdir(f"checkpoint-{step}", dir_fd=fd)
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)
    shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- part 1: latest


def floor_latest(pub: str) -> list[list[str]]:
    return [name.split("-") for name in os.listdir(pub)]


def bench_latest(args: argparse.Namespace, scratch: str, results: dict[str, Any]) -> None:
    count = args.count
    root = os.path.join(scratch, "latest-root")
    hf_dir = os.path.join(scratch, "hf-output")

    get_last_checkpoint: Callable[[str], str | None] | None = None
    try:
        t0 = time.perf_counter()
        import transformers
        from transformers.trainer_utils import get_last_checkpoint  # type: ignore[no-redef]

        results["transformers"] = {
            "version": transformers.__version__,
            "import_s": round(time.perf_counter() - t0, 3),
        }
    except Exception as exc:  # ImportError, or a transformers that needs more than it has
        results["transformers"] = {"version": None, "error": f"{type(exc).__name__}: {exc}"}
        say(
            args,
            f"transformers unavailable ({exc}); get_last_checkpoint baseline skipped "
            "(pip install transformers; torch is not needed)",
        )

    t0 = time.perf_counter()
    expected = make_publications(root, count)
    setup_pub_s = time.perf_counter() - t0
    expected_hf = None
    setup_hf_s = 0.0
    if get_last_checkpoint is not None:
        t0 = time.perf_counter()
        expected_hf = make_hf_checkpoints(hf_dir, count)
        setup_hf_s = time.perf_counter() - t0
    say(
        args,
        f"setup: {count:,} publications in {setup_pub_s:.1f} s"
        + (f", {count:,} checkpoint-N folders in {setup_hf_s:.1f} s" if expected_hf else ""),
    )

    pub = os.path.join(root, store.PUB)
    ops: dict[str, Callable[[], Any]] = {
        "latest": lambda: store.latest(root),
        "floor": lambda: floor_latest(pub),
    }
    if get_last_checkpoint is not None:
        ops["get_last_checkpoint"] = lambda: get_last_checkpoint(hf_dir)

    # Warm-up: one untimed call each (fills the page/dentry/inode caches), and a check
    # that every operation finds what it should.
    found = ops["latest"]()
    assert found is not None and found.name == expected, (found, expected)
    assert len(ops["floor"]()) == count
    if "get_last_checkpoint" in ops:
        got = ops["get_last_checkpoint"]()
        assert got == expected_hf, (got, expected_hf)

    samples: dict[str, list[int]] = {key: [] for key in ops}
    order = list(ops)
    for rep in range(args.repeat):
        # Rotate the order each repetition so none of them always runs first or last.
        for key in order[rep % len(order) :] + order[: rep % len(order)]:
            gc.collect()
            t0 = time.perf_counter_ns()
            ops[key]()
            samples[key].append(time.perf_counter_ns() - t0)

    if args.profile:
        profile(args, f"store.latest on {count:,} names", lambda: store.latest(root))

    results["latest"] = {
        "count": count,
        "repeat": args.repeat,
        "warm_cache": True,
        "setup_s": {"publications": round(setup_pub_s, 2), "hf_folders": round(setup_hf_s, 2)},
        "latest_name": expected,
        "ops": {key: summary(val) for key, val in samples.items()},
    }


# --------------------------------------------------------------------------- part 2: publish


def bench_publish(args: argparse.Namespace, scratch: str, results: dict[str, Any]) -> None:
    n = args.publish_count
    rounds = max(1, min(args.rounds, n))
    floor_root = os.path.join(scratch, "publish-floor")
    store_root = os.path.join(scratch, "publish-store")
    attempt = model.new_attempt()
    save_rel = f"exec/{attempt}/checkpoint"
    epoch = EPOCHS[0].value
    for root in (floor_root, store_root):
        os.makedirs(os.path.join(root, save_rel))
    # The floor creates exactly the names the store will create, in its own fresh root.
    names = [model.format_name(epoch, step, save_rel) for step in range(n)]
    save_abs = os.path.join(store_root, save_rel)

    os.mkdir(os.path.join(floor_root, store.PUB))
    floor_root_fd = os.open(floor_root, os.O_RDONLY | os.O_DIRECTORY)
    floor_pub_fd = os.open(os.path.join(floor_root, store.PUB), os.O_RDONLY | os.O_DIRECTORY)
    # The store's first publish makes pub/; do it untimed so both sides start alike.
    store.publish(store_root, epoch, n, save_abs)
    os.close(os.open("warm", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444, dir_fd=floor_pub_fd))
    os.fsync(floor_pub_fd)
    os.fsync(floor_root_fd)

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL

    def floor_batch(lo: int, hi: int, out: list[int]) -> None:
        for i in range(lo, hi):
            t0 = time.perf_counter_ns()
            os.close(os.open(names[i], flags, 0o444, dir_fd=floor_pub_fd))
            os.fsync(floor_pub_fd)
            os.fsync(floor_root_fd)
            out.append(time.perf_counter_ns() - t0)

    def store_batch(lo: int, hi: int, out: list[int]) -> None:
        for i in range(lo, hi):
            t0 = time.perf_counter_ns()
            got = store.publish(store_root, epoch, i, save_abs)
            out.append(time.perf_counter_ns() - t0)
            if got != names[i]:
                raise AssertionError((got, names[i]))

    floor_ns: list[int] = []
    store_ns: list[int] = []
    round_ratios: list[float] = []
    bounds = [n * r // rounds for r in range(rounds + 1)]
    try:
        for r in range(rounds):
            lo, hi = bounds[r], bounds[r + 1]
            f_before, s_before = len(floor_ns), len(store_ns)
            batches = [(floor_batch, floor_ns), (store_batch, store_ns)]
            if r % 2:
                batches.reverse()
            for fn, out in batches:
                fn(lo, hi, out)
            f_med = statistics.median(floor_ns[f_before:])
            s_med = statistics.median(store_ns[s_before:])
            round_ratios.append(s_med / f_med)
    finally:
        os.close(floor_pub_fd)
        os.close(floor_root_fd)

    if args.profile:
        base = 2 * n + 1

        def many() -> None:
            for i in range(base, base + 500):
                store.publish(store_root, epoch, i, save_abs)

        profile(args, "500 x store.publish", many)

    results["publish"] = {
        "count": n,
        "rounds": rounds,
        "file_system": file_system_of(scratch),
        "ops": {"publish": summary(store_ns), "floor": summary(floor_ns)},
        "round_ratios": [round(x, 3) for x in round_ratios],
    }


# --------------------------------------------------------------------------- report


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    lat = results.get("latest")
    if lat:
        ops = lat["ops"]
        rows.append(
            _row("latest", ops["latest"], "listdir+split", ops["floor"], "<=", LATEST_FLOOR_TARGET)
        )
        if "get_last_checkpoint" in ops:
            rows.append(
                _row(
                    "latest",
                    ops["latest"],
                    "get_last_checkpoint",
                    ops["get_last_checkpoint"],
                    "<",
                    LATEST_HF_TARGET,
                )
            )
    pub = results.get("publish")
    if pub:
        ops = pub["ops"]
        rows.append(
            _row(
                "publish", ops["publish"], "open+close+2 fsync", ops["floor"], "<=", PUBLISH_TARGET
            )
        )
    return rows


def _row(
    op: str,
    mine: dict[str, float],
    base_label: str,
    base: dict[str, float],
    cmp: str,
    target: float,
) -> dict[str, Any]:
    ratio = mine["median_ns"] / base["median_ns"]
    ok = ratio <= target if cmp == "<=" else ratio < target
    return {
        "operation": op,
        "median_ns": mine["median_ns"],
        "min_ns": mine["min_ns"],
        "mean_ns": mine["mean_ns"],
        "baseline": base_label,
        "baseline_median_ns": base["median_ns"],
        "baseline_min_ns": base["min_ns"],
        "baseline_mean_ns": base["mean_ns"],
        "ratio": ratio,
        "min_ratio": mine["min_ns"] / base["min_ns"],
        "target": f"{cmp} {target:g}",
        "result": "PASS" if ok else "MISS",
    }


def print_table(results: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    env = results["environment"]
    print()
    print(
        f"python {env['python']}, {env['machine']}, {env['cpus']} cpus; "
        f"scratch {env['scratch']} on {env['file_system']['type']} "
        f"({env['file_system']['source']} at {env['file_system']['mount_point']})"
    )
    tf = results.get("transformers", {})
    print(f"transformers {tf.get('version') or 'not installed'}")
    lat = results.get("latest")
    if lat:
        print(
            f"latest: {lat['count']:,} names in one pub/, {lat['repeat']} timed repetitions "
            "each after one untimed warm-up call (page cache warm), order rotated; setup "
            f"{lat['setup_s']['publications']} s + {lat['setup_s']['hf_folders']} s"
        )
    pub = results.get("publish")
    if pub:
        print(
            f"publish: {pub['count']:,} ops each side in {pub['rounds']} interleaved rounds; "
            f"per-round median ratios {pub['round_ratios']}"
        )
        for key in ("publish", "floor"):
            s = pub["ops"][key]
            print(
                f"  {key:8s} per op: median {s['median_ns'] / 1e3:8.1f} us, "
                f"mean {s['mean_ns'] / 1e3:8.1f} us, min {s['min_ns'] / 1e3:8.1f} us, "
                f"max {s['max_ns'] / 1e3:8.1f} us"
            )
    header = (
        "operation",
        "median",
        "min",
        "baseline",
        "base median",
        "base min",
        "ratio",
        "min ratio",
        "target",
        "result",
    )
    table = [header]
    for r in rows:
        table.append(
            (
                r["operation"],
                fmt_time(r["median_ns"]),
                fmt_time(r["min_ns"]),
                r["baseline"],
                fmt_time(r["baseline_median_ns"]),
                fmt_time(r["baseline_min_ns"]),
                f"{r['ratio']:.2f}x",
                f"{r['min_ratio']:.2f}x",
                r["target"],
                r["result"],
            )
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    print()
    for i, row in enumerate(table):
        print(
            "  ".join(
                str(cell).rjust(w) if 1 <= j <= 2 or 4 <= j <= 6 else str(cell).ljust(w)
                for j, (cell, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(
        "ratio = median / baseline median (what the target is judged on); "
        "min ratio = min / baseline min"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--count",
        type=int,
        default=100_000,
        help="publications (and checkpoint-N folders) for the latest bench (default 100000)",
    )
    p.add_argument(
        "--publish-count",
        type=int,
        default=2_000,
        help="publish operations, and as many floor operations (default 2000)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=9,
        help="timed repetitions of each latest operation (default 9)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="interleaved rounds the publish operations are split into (default 10)",
    )
    p.add_argument(
        "--dir",
        default=None,
        help="parent of the scratch directory (default /var/tmp); a fresh "
        "directory is made inside it and removed afterwards",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--skip-latest", action="store_true", help="skip the latest bench")
    p.add_argument("--skip-publish", action="store_true", help="skip the publish bench")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile one latest call and 500 publish calls (untimed)",
    )
    p.add_argument("--profile-lines", type=int, default=15, help=argparse.SUPPRESS)
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    if args.count < 1 or args.publish_count < 1 or args.repeat < 1 or args.rounds < 1:
        p.error("counts, --repeat and --rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    parent = args.dir or "/var/tmp"
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="bench_store-", dir=parent)
    fs = file_system_of(scratch)
    results: dict[str, Any] = {
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "scratch": scratch,
            "file_system": fs,
        },
    }
    say(args, f"scratch {scratch} on {fs['type']} ({fs['source']} at {fs['mount_point']})")
    if fs["type"] in ("tmpfs", "ramfs"):
        say(
            args,
            "warning: scratch is on a RAM file system; fsync costs nothing there, "
            "so the publish figures say little about a disk (use --dir)",
        )
    try:
        # publish first, on a quiet disk: the 200,000 entries of the latest setup, and their
        # removal, leave the journal busy for a while.
        if not args.skip_publish:
            os.sync()
            bench_publish(args, scratch, results)
        if not args.skip_latest:
            bench_latest(args, scratch, results)
    finally:
        if args.keep:
            say(args, f"kept {scratch}")
        else:
            t0 = time.perf_counter()
            remove_scratch(scratch, args.count)
            results["cleanup_s"] = round(time.perf_counter() - t0, 2)
    rows = verdicts(results)
    results["verdicts"] = rows
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results, rows)
        print(
            f"elapsed {results['elapsed_s']} s end to end (setup and cleanup included; "
            f"cleanup {results.get('cleanup_s', 0)} s)"
        )
    missed = [r for r in rows if r["result"] != "PASS"]
    return 1 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
