"""A fake Slurm controller at the process boundary, for fast tests of the supervisor.

It answers the few commands slurm-dispatch uses (sbatch, with --array too, squeue, scontrol
release, hold and requeuehold, scontrol update of a comment, a dependency or the excluded
nodes, scancel, sacct as a site without accounting does, a job's placement, a partition's
nodes and the nodes' states) from an in-memory job table, and fails loudly on anything else.
The real behaviour is proven by the real tier; this only makes pass logic cheap to exercise.
"""

from __future__ import annotations

import itertools
import os
from typing import Iterator, Mapping, Optional, Sequence

from slurm_dispatch.slurm.result import Result

from . import squeue


class FakeCluster:
    def __init__(self, first_id: int = 100, version: str = "24.11.5") -> None:
        self.version = version  # from 26.05 every job has a SLUID, squeue -O prints it
        self.sluids = itertools.count(1)
        self.jobs: dict[str, dict[str, str]] = {}
        self.first_id = first_id
        self.ids: Iterator[int] = itertools.count(first_id)
        self.calls: list[list[str]] = []
        self.partitions = {"debug": ["n1", "n2", "n3"]}
        self.node_states = {"n1": "IDLE", "n2": "IDLE", "n3": "IDLE"}

    def lose_state(self) -> None:
        """A controller that lost its state (StateSaveLocation gone): it knows no job, and
        numbers new ones from its FirstJobId again."""
        self.jobs.clear()
        self.ids = itertools.count(self.first_id)

    def add(self, state: str = "RUNNING", comment: str = "", **fields: str) -> str:
        jobid = str(next(self.ids))
        self.jobs[jobid] = {
            "JobId": jobid,
            "JobState": state,
            "Reason": "None",
            "Restarts": "0",
            "Comment": comment,
            "SLUID": f"s8V5M96Z{next(self.sluids):06d}",
            **fields,
        }
        return jobid

    def set(self, jobid: str, **fields: str) -> None:
        self.jobs[jobid].update(fields)

    def tasks_of(self, jobids: Sequence[str]) -> list[str]:
        """The jobs ``jobids`` name: a job, every task of an array by the array's id, or one
        task as ``A_T``."""
        named = set(jobids)
        return [
            j
            for j, f in self.jobs.items()
            if j in named
            or f.get("ArrayJobId") in named
            or f"{f.get('ArrayJobId')}_{f.get('ArrayTaskId')}" in named
        ]

    def sbatch_calls(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "sbatch"]

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "sbatch":
            comment = next((a.split("=", 1)[1] for a in argv if a.startswith("--comment=")), "")
            held = "--hold" in argv or "-H" in argv
            state, reason = ("PENDING", "JobHeldUser") if held else ("RUNNING", "None")
            array = [a.split("=", 1)[1] for a in argv if a.startswith("--array=")]
            excluded = [a.split("=", 1)[1] for a in argv if a.startswith("--exclude=")]
            asked = [a.split("=", 1)[1] for a in argv if a.startswith("--nodelist=")] + [
                b for a, b in zip(argv, argv[1:]) if a == "-w"
            ]
            if not array:
                jobid = self.add(
                    state,
                    comment,
                    Reason=reason,
                    ExcNodeList=excluded[-1] if excluded else "",
                    ReqNodeList=asked[-1] if asked else "",
                )
                return Result(argv, 0, f"Submitted batch job {jobid}\n", "")
            # An array: every task a job of its own; the first task's id is the array's.
            from slurm_dispatch.control.sbatch_words import parse_array

            jobid = ""
            for task in parse_array(array[-1]):
                taskid = self.add(state, comment, Reason=reason, ArrayTaskId=str(task))
                jobid = jobid or taskid
                self.set(taskid, ArrayJobId=jobid)
            return Result(argv, 0, f"Submitted batch job {jobid}\n", "")
        if argv[:2] == ["scontrol", "release"]:
            for jobid in self.tasks_of(argv[2].split(",")):
                self.set(jobid, JobState="RUNNING", Reason="None")
            return Result(argv, 0, "", "")
        if argv[:2] == ["scontrol", "requeuehold"]:  # a running job back to pending, held
            for jobid in self.tasks_of(argv[2].split(",")):
                restarts = int(self.jobs[jobid].get("Restarts", "0")) + 1
                self.set(jobid, JobState="PENDING", Reason="JobHeldUser", Restarts=str(restarts))
            return Result(argv, 0, "", "")
        if argv[:2] == ["scontrol", "hold"]:  # a user's hold of pending jobs
            for jobid in self.tasks_of(argv[2].split(",")):
                self.set(jobid, Reason="JobHeldUser")
            return Result(argv, 0, "", "")
        if argv[:2] == ["scontrol", "update"] and argv[3].startswith("comment="):
            self.set(argv[2].split("=", 1)[1], Comment=argv[3].split("=", 1)[1])
            return Result(argv, 0, "", "")
        if argv[:2] == ["scontrol", "update"] and argv[3].startswith("dependency="):
            self.set(argv[2].split("=", 1)[1], Dependency=argv[3].split("=", 1)[1])
            return Result(argv, 0, "", "")
        if argv[:2] == ["scontrol", "update"] and argv[3].startswith("excnodelist="):
            self.set(argv[2].split("=", 1)[1], ExcNodeList=argv[3].split("=", 1)[1])
            return Result(argv, 0, "", "")
        if argv[:4] == ["scontrol", "-o", "show", "node"]:
            return Result(
                argv,
                0,
                "".join(
                    f"NodeName={name} State={self.node_states[name]}\n"
                    for name in argv[4].split(",")
                ),
                "",
            )
        if argv[0] == "sinfo":
            named = argv[2].split("=", 1)[1].split(",")
            return Result(
                argv,
                0,
                "".join(
                    f"{p}|{','.join(self.partitions[p])}\n" for p in named if p in self.partitions
                ),
                "",
            )
        if argv[0] == "squeue" and argv[-1] == "--format=%P|%D|%x|%n":
            placed = [f for j, f in self.jobs.items() if j in self.tasks_of([argv[2]])]
            return Result(
                argv,
                0,
                "".join(
                    f"{f.get('Partition', 'debug')}|"
                    f"{f.get('NumNodes', '1')}|"
                    f"{f.get('ExcNodeList', '')}|"
                    f"{f.get('ReqNodeList', '')}\n"
                    for f in placed
                ),
                "",
            )
        if argv[0] == "scancel":
            for jobid in self.tasks_of(argv[1:]):
                self.set(jobid, JobState="CANCELLED", Reason="None")
            return Result(argv, 0, "", "")
        if argv[0] == "sacct":  # like the sandbox's controller: no accounting
            return Result(argv, 1, "", "Slurm accounting storage is disabled\n")
        if argv == ["squeue", "--version"]:
            return Result(argv, 0, f"slurm {self.version}\n", "")
        if argv[0] == "squeue":
            if "SLUID" in argv[-1] and self.version < "26.05":
                return Result(
                    argv, 1, "", "squeue: error: Invalid job format specification: SLUID\n"
                )
            shown = squeue.selected(argv, self.jobs.values(), os.getuid())
            return Result(argv, 0, squeue.render(argv, shown), "")
        raise AssertionError(f"unexpected Slurm call {argv}")
