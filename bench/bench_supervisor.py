#!/usr/bin/env python3
"""One supervisor pass over many dispatch jobs, against a fake controller.

Prints, side by side: the pass's wall time, the controller calls it made, and a baseline
floor (reading every job's record with no decision made: the I/O a pass cannot avoid).
Target: a pass over 1,000 jobs under 2 s, with a constant number of controller calls
(1 when nothing needs doing), whatever the job count.

The controller's queue also holds ``--others`` (50,000) jobs of other users.  The bytes the
pass reads from the controller must follow the user's own jobs, not the queue: they are shown
beside what the previous read (``scontrol -o show job``: every job on the cluster, about
1.3 KB a job as 22.05 prints it) would have cost for the same queue.

Usage: python bench/bench_supervisor.py [--jobs 1000] [--others 50000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_dispatch.control import record, submit  # noqa: E402
from slurm_dispatch.control.supervisor import Settings, Supervisor  # noqa: E402
from slurm_dispatch.slurm.adapter import Slurm  # noqa: E402
from slurm_dispatch.slurm.result import Result  # noqa: E402
from tests.fakes import squeue  # noqa: E402

# A real 22.05 `scontrol -o show job` line of a plain batch job is about 1,300 bytes.
SCONTROL_LINE_BYTES = 1300


class Controller:
    """Answers sbatch and squeue from memory (squeue filtered by --me as slurmctld filters it),
    counts every call, and holds ``others`` jobs of another user in its queue."""

    def __init__(self, others: int) -> None:
        self.jobs: dict[str, str] = {}
        self.ids = itertools.count(1000)
        self.calls: list[str] = []
        self.others = [
            {
                "JobId": str(10_000_000 + i),
                "JobState": "RUNNING",
                "UserId": "other(4242)",
                "NodeList": f"n{i % 512}",
                "Comment": "someone else's",
            }
            for i in range(others)
        ]

    def queue(self) -> list[dict[str, str]]:
        mine = [
            {"JobId": j, "JobState": s, "Comment": "dispatch:x/1"} for j, s in self.jobs.items()
        ]
        return mine + self.others

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        argv = list(argv)
        self.calls.append(argv[0])
        if argv[0] == "sbatch":
            jobid = str(next(self.ids))
            self.jobs[jobid] = "RUNNING"
            return Result(argv, 0, f"Submitted batch job {jobid}\n", "")
        if argv[0] == "squeue":
            shown = squeue.selected(argv, self.queue(), os.getuid())
            return Result(argv, 0, squeue.render(argv, shown), "")
        raise AssertionError(f"unexpected call {argv}")


def make_jobs(count: int, controller: Controller, workdir: Path) -> list[record.JobRecord]:
    (workdir / "job.sh").write_text("#!/bin/bash\necho hi\n")
    slurm = Slurm(controller, wait=0)
    # A root of its own per job: one live dispatch job per root.
    return [
        submit.submit_new(
            submit.read_request(
                ["--checkpoint", f"ck-{i}", "--resubmit", "3", "job.sh"], cwd=str(workdir)
            ),
            slurm,
        ).job
        for i in range(count)
    ]


def floor(jobs_home: str) -> float:
    started = time.perf_counter()
    for job in record.all_jobs(jobs_home):
        job.events()
        _ = job.spec
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--others", type=int, default=50_000, help="other users' jobs in the controller's queue"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench_supervisor-", dir="/var/tmp"))
    try:
        os.environ["DISPATCH_HOME"] = str(scratch / "home")
        controller = Controller(args.others)
        t0 = time.perf_counter()
        make_jobs(args.jobs, controller, scratch)
        setup = time.perf_counter() - t0
        adapter = Slurm(controller, wait=0)
        supervisor = Supervisor(adapter, Settings(signal=None))

        idle_times, idle_calls, idle_bytes = [], [], []
        for _ in range(args.repeat):
            controller.calls.clear()
            adapter.bytes_read = 0
            started = time.perf_counter()
            report = supervisor.run_pass()
            idle_times.append(time.perf_counter() - started)
            idle_calls.append(len(controller.calls))
            idle_bytes.append(adapter.bytes_read)
            assert not report.actions and not report.errors, report
        floors = [floor(os.environ["DISPATCH_HOME"]) for _ in range(args.repeat)]

        # A pass that has work: a tenth of the jobs failed and is resubmitted.
        for jobid in list(controller.jobs)[: args.jobs // 10]:
            controller.jobs[jobid] = "FAILED"
        controller.calls.clear()
        started = time.perf_counter()
        busy = supervisor.run_pass()
        busy_time = time.perf_counter() - started
        busy_calls = len(controller.calls)

        figures = {
            "jobs": args.jobs,
            "setup_s": round(setup, 2),
            "idle_pass_median_s": round(statistics.median(idle_times), 4),
            "idle_pass_min_s": round(min(idle_times), 4),
            "idle_pass_controller_calls": sorted(set(idle_calls)),
            "floor_median_s": round(statistics.median(floors), 4),
            "busy_pass_s": round(busy_time, 4),
            "busy_pass_actions": len(busy.actions),
            "busy_pass_controller_calls": busy_calls,
            "target_s": 2.0,
            "others_in_queue": args.others,
            "idle_pass_bytes_read": max(idle_bytes),
            "bytes_per_own_job": round(max(idle_bytes) / args.jobs, 1),
            "whole_queue_baseline_bytes": (args.jobs + args.others) * SCONTROL_LINE_BYTES,
        }
        figures["bytes_ratio_to_baseline"] = round(
            figures["idle_pass_bytes_read"] / figures["whole_queue_baseline_bytes"], 4
        )
        ratio = figures["idle_pass_median_s"] / figures["floor_median_s"]
        figures["ratio_to_floor"] = round(ratio, 2)
        constant = idle_calls == [1] * len(idle_calls)
        figures["result"] = (
            "PASS"
            if figures["idle_pass_median_s"] < 2.0 and figures["busy_pass_s"] < 2.0 and constant
            else "MISS"
        )
        if args.json:
            print(json.dumps(figures, indent=2))
            return
        print(
            f"supervisor pass over {args.jobs} dispatch jobs (fake controller; records on "
            f"{scratch}; setup {setup:.1f} s)"
        )
        print(
            f"{'operation':<28} {'median':>9} {'min':>9} {'controller calls':>17} "
            f"{'baseline (read records)':>24} {'ratio':>6} {'target':>7} result"
        )
        print(
            f"{'pass, nothing to do':<28} {figures['idle_pass_median_s']:>8.3f}s "
            f"{figures['idle_pass_min_s']:>8.3f}s "
            f"{str(figures['idle_pass_controller_calls']):>17} "
            f"{figures['floor_median_s']:>23.3f}s {ratio:>5.2f}x {'< 2 s':>7} "
            f"{figures['result']}"
        )
        print(
            f"{'bytes read, idle pass':<28} {figures['idle_pass_bytes_read']:>9,} "
            f"({figures['bytes_per_own_job']} per own job) vs whole-queue read "
            f"{figures['whole_queue_baseline_bytes']:,} ({args.jobs:,} own + "
            f"{args.others:,} others' jobs): {figures['bytes_ratio_to_baseline']:.4f}x"
        )
        print(
            f"{'pass, 10% resubmitted':<28} {busy_time:>8.3f}s {'':>9} {busy_calls:>17} "
            f"{'':>24} {'':>6} {'< 2 s':>7} "
            f"{'PASS' if busy_time < 2 else 'MISS'}  ({len(busy.actions)} resubmissions: "
            "1 squeue for the pass + 1 sbatch per resubmission)"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
