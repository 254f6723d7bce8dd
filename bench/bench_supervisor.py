#!/usr/bin/env python3
"""One supervisor pass over many dispatch jobs, against a fake controller.

Prints, side by side: the pass's wall time, the controller calls it made, and a baseline
floor (reading every job's record with no decision made: the I/O a pass cannot avoid).
Target: a pass over 1,000 jobs under 2 s, with a constant number of controller calls
(1 when nothing needs doing), whatever the job count.

Usage: python bench/bench_supervisor.py [--jobs 1000] [--repeat 5] [--json]
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

from slurm_dispatch import record, submit  # noqa: E402
from slurm_dispatch.slurm import Result, Slurm  # noqa: E402
from slurm_dispatch.supervisor import Settings, Supervisor  # noqa: E402


class Controller:
    """Answers sbatch and `scontrol -o show job` from memory and counts every call."""

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}
        self.ids = itertools.count(1000)
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str], env: Optional[Mapping[str, str]],
                 cwd: Optional[str], timeout: float) -> Result:
        argv = list(argv)
        self.calls.append(argv[0])
        if argv[0] == "sbatch":
            jobid = str(next(self.ids))
            self.jobs[jobid] = "RUNNING"
            return Result(argv, 0, f"Submitted batch job {jobid}\n", "")
        if argv[:4] == ["scontrol", "-o", "show", "job"]:
            out = "".join(f"JobId={j} JobName=job.sh JobState={s} Reason=None Restarts=0 "
                          f"Comment=dispatch:x/1\n" for j, s in self.jobs.items())
            return Result(argv, 0, out, "")
        raise AssertionError(f"unexpected call {argv}")


def make_jobs(count: int, controller: Controller, workdir: Path) -> list[record.JobRecord]:
    (workdir / "job.sh").write_text("#!/bin/bash\necho hi\n")
    request = submit.read_request(["--checkpoint", "ck", "--resubmit", "3", "job.sh"],
                                  cwd=str(workdir))
    slurm = Slurm(controller, wait=0)
    return [submit.submit_new(request, slurm).job for _ in range(count)]


def floor(jobs_home: str) -> float:
    started = time.perf_counter()
    for job in record.all_jobs(jobs_home):
        job.events()
        _ = job.spec
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench_supervisor-", dir="/var/tmp"))
    try:
        os.environ["DISPATCH_HOME"] = str(scratch / "home")
        controller = Controller()
        t0 = time.perf_counter()
        make_jobs(args.jobs, controller, scratch)
        setup = time.perf_counter() - t0
        supervisor = Supervisor(Slurm(controller, wait=0), Settings(signal=None))

        idle_times, idle_calls = [], []
        for _ in range(args.repeat):
            controller.calls.clear()
            started = time.perf_counter()
            report = supervisor.run_pass()
            idle_times.append(time.perf_counter() - started)
            idle_calls.append(len(controller.calls))
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
        }
        ratio = figures["idle_pass_median_s"] / figures["floor_median_s"]
        figures["ratio_to_floor"] = round(ratio, 2)
        constant = idle_calls == [1] * len(idle_calls)
        figures["result"] = ("PASS" if figures["idle_pass_median_s"] < 2.0
                             and figures["busy_pass_s"] < 2.0 and constant else "MISS")
        if args.json:
            print(json.dumps(figures, indent=2))
            return
        print(f"supervisor pass over {args.jobs} dispatch jobs (fake controller; records on "
              f"{scratch}; setup {setup:.1f} s)")
        print(f"{'operation':<28} {'median':>9} {'min':>9} {'controller calls':>17} "
              f"{'baseline (read records)':>24} {'ratio':>6} {'target':>7} result")
        print(f"{'pass, nothing to do':<28} {figures['idle_pass_median_s']:>8.3f}s "
              f"{figures['idle_pass_min_s']:>8.3f}s "
              f"{str(figures['idle_pass_controller_calls']):>17} "
              f"{figures['floor_median_s']:>23.3f}s {ratio:>5.2f}x {'< 2 s':>7} "
              f"{figures['result']}")
        print(f"{'pass, 10% resubmitted':<28} {busy_time:>8.3f}s {'':>9} {busy_calls:>17} "
              f"{'':>24} {'':>6} {'< 2 s':>7} "
              f"{'PASS' if busy_time < 2 else 'MISS'}  ({len(busy.actions)} resubmissions: "
              "1 scontrol for the pass + 1 sbatch per resubmission)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
