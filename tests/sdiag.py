"""What one command costs slurmctld, and slurmdbd, read from their own counters.

``sdiag --reset`` (SlurmUser or root) zeroes the controller's RPC statistics; the command runs;
``sdiag`` then prints, per message type and per user, how many RPCs the controller served and
their total time in microseconds.  Only the RPCs of ``user`` (the command's own) are counted:
the reading ``sdiag`` itself is root's ``REQUEST_STATS_INFO``, and slurmd's messages are root's
too.  slurmdbd keeps the same two tables (``sacctmgr show stats``, zeroed by ``sacctmgr clear
stats``): the user's are its ``sacct`` calls, root's are slurmctld's (its jobs' starts and ends,
node states) and the readings'.  Used by the real tier (tests/real/test_controller_bill.py) and
bench/bench_controller.py.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Sequence

# "	REQUEST_JOB_USER_INFO   ( 2039) count:1      ave_time:168    total_time:168"
# "	dsu-bill        (    1002) count:3      ave_time:229    total_time:689"
# "	dispatchuser-gw1(    1013) count:3      ave_time:229    total_time:689"
# A name is printed in a column (sdiag ``%-16s``, sacctmgr ``%-20s``) that a name as long
# touches the parenthesis in, and a longer one runs past: no space is promised before it.
_LINE = re.compile(
    r"^\s*([^\s(]+)\s*\(\s*(\d+)\)\s+count:(\d+)\s+ave_time:(\d+)\s+"
    r"total_time:(\d+)"
)
BY_TYPE = "Remote Procedure Call statistics by message type"
BY_USER = "Remote Procedure Call statistics by user"
# Run as the job user with the sandbox venv's python, in a folder holding job.sh: submits COUNT
# held dispatch jobs (roots ck-START ...) from one process, 8 at a time; prints their job ids.
HELD_SWEEP = """\
import sys
from concurrent.futures import ThreadPoolExecutor
from slurm_dispatch import api
start, count = int(sys.argv[1]), int(sys.argv[2])
def one(i):
    return api.submit("job.sh", "--hold", checkpoint=f"ck-{i}").slurm_job_id
with ThreadPoolExecutor(8) as pool:
    print("\\n".join(pool.map(one, range(start, start + count))))
"""


# How each daemon's counters are zeroed and read (root's, in the cluster's environment).
SLURMCTLD = (("sdiag", "--reset"), ("sdiag",))
SLURMDBD = (("sacctmgr", "-i", "clear", "stats"), ("sacctmgr", "show", "stats"))
# What a reading costs the daemon it reads, left out of by_type (root's alone).
_READINGS = {
    "REQUEST_STATS_INFO",
    "DBD_GET_STATS",
    "DBD_CLEAR_STATS",
    "SLURM_PERSIST_INIT",
    "DBD_FINI",
}


@dataclass
class Counters:
    """One ``sdiag`` reading: {name: (count, total µs)} by message type and by user."""

    by_type: dict[str, tuple[int, int]] = field(default_factory=dict)
    by_user: dict[str, tuple[int, int]] = field(default_factory=dict)


def parse(text: str) -> Counters:
    """The two RPC tables of ``sdiag``'s output (22.05 and 24.11 print them alike), or of
    ``sacctmgr show stats`` (the same lines)."""
    found = Counters()
    table: dict[str, tuple[int, int]] | None = None
    for line in text.splitlines():
        if line.startswith(BY_TYPE):
            table = found.by_type
        elif line.startswith(BY_USER):
            table = found.by_user
        elif table is not None:
            match = _LINE.match(line)
            if match:
                table[match.group(1)] = (int(match.group(3)), int(match.group(5)))
            elif line.strip():
                table = None  # the next section (Pending RPC statistics)
    return found


@dataclass
class Cost:
    """What one command cost the controller: ``user``'s RPCs, by type, and their total time."""

    rpcs: int
    total_us: int
    by_type: dict[str, int]

    def types(self) -> str:
        return (
            ", ".join(
                f"{name.removeprefix('REQUEST_')} {count}"
                for name, count in sorted(self.by_type.items())
            )
            or "none"
        )


def measure(
    as_root: Callable[[Sequence[str]], subprocess.CompletedProcess[str]],
    user: str,
    command: Callable[[], object],
    daemon: tuple[tuple[str, ...], tuple[str, ...]] = SLURMCTLD,
) -> Cost:
    """Reset the counters, run ``command``, read them: ``user``'s RPCs.  ``as_root`` runs a
    Slurm client as root (SlurmUser) in the cluster's environment; ``daemon`` says whose
    counters (:data:`SLURMCTLD`, :data:`SLURMDBD`).  The types are the ones the reading shows
    beside the user's RPCs (what a reading itself costs left out), so they are the user's
    only while nothing else talks to the daemon meanwhile."""
    return measure_all(as_root, user, command, (daemon,))[0]


def measure_all(
    as_root: Callable[[Sequence[str]], subprocess.CompletedProcess[str]],
    user: str,
    command: Callable[[], object],
    daemons: Sequence[tuple[tuple[str, ...], tuple[str, ...]]],
) -> list[Cost]:
    """:func:`measure` of one run of ``command`` on each of ``daemons``' counters."""
    for reset_argv, _ in daemons:
        reset = as_root(list(reset_argv))
        if reset.returncode != 0:
            raise RuntimeError(
                f"{' '.join(reset_argv)} exited {reset.returncode}: {reset.stderr.strip()}"
            )
    command()
    costs = []
    for _, read_argv in daemons:
        read = as_root(list(read_argv))
        if read.returncode != 0:
            raise RuntimeError(
                f"{' '.join(read_argv)} exited {read.returncode}: {read.stderr.strip()}"
            )
        counters = parse(read.stdout)
        count, total = counters.by_user.get(user, (0, 0))
        by_type = {name: n for name, (n, _) in counters.by_type.items() if name not in _READINGS}
        costs.append(Cost(rpcs=count, total_us=total, by_type=by_type))
    return costs
