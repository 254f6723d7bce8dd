#!/usr/bin/env python3
"""What the product costs slurmctld at cluster scale, from the controller's own counters.

Run as root: ``python bench/bench_controller.py`` (about three minutes under load once the
sandbox is up; ``--nodes``, ``--jobs``, ``--small``, ``--dir``, ``--user``, ``--keep``,
``--json``, ``--fail-on-miss``).  On its own sandbox (``--nodes``, default 32, the most the
sandbox accepts) it measures, with ``sdiag --reset`` before and ``sdiag`` after each command
(tests/sdiag.py: the job user's RPCs by type, and their total time as slurmctld counts it):

1. ``squeue --me`` and ``sbatch --hold job.sh``, the plain tools, for reference;
2. ``dispatch-sbatch --hold --checkpoint ck-N job.sh``;
3. one supervisor pass (``dispatch supervise``) with ``--small`` (10) and then ``--jobs``
   (1,000) of the user's dispatch jobs known to the controller (held: pending, they cost
   nothing to run; submitted from one process through ``api.submit`` in 8 threads);
4. ``dispatch status JOB`` of one of them, with all of them known;
5. a pass that takes actions: ``--act`` (5) dispatch jobs with ``--resubmit 1`` that fail at
   once are let end, and the next pass resubmits each;
6. ``dispatch-cease JOBID`` of a dispatch job spread over every node (``-N NODES``, ``srun``
   on each), after it ended: the hooks' facts on every node (counted in the report) prove it;
7. where the sandbox keeps accounting (slurmdbd, its default): ``--act`` dispatch jobs with
   ``--resubmit 1`` that fail while no supervisor runs and that slurmctld then forgets
   (``MinJobAge`` 5 s for this step, so the earlier steps' jobs that ended are forgotten
   too), the pass that finds their ends in ``sacct``, and the pass after it.

Where the sandbox keeps accounting, each command's bill at slurmdbd is read too (``sacctmgr
clear stats`` before, ``sacctmgr show stats`` after): the user's RPCs there (its ``sacct``
calls), and the types of every user's (slurmctld's own messages about its jobs included).

Target (bench/README.md, what we cost the controller): a pass costs no more RPCs than one
``squeue --me`` plus one ``sbatch`` per resubmission it makes, whatever the number of jobs; at
slurmdbd, no more than one
``sacct -j`` per submission slurmctld forgot, and nothing for the others.  Every command runs
as the sandbox user (``dispatch-cease`` too, as the supervisor asks it), commands one at a
time, so the user's RPCs are the command's own.  Dispatch records go to ``DISPATCH_HOME`` in
a scratch folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_sbatch import job_id, sandbox_options, source_identity  # noqa: E402

from slurm_dispatch.sandbox import clients as sandbox_clients  # noqa: E402
from slurm_dispatch.sandbox import cluster as sandbox  # noqa: E402
from slurm_dispatch.sandbox import layout as sandbox_layout  # noqa: E402
from slurm_dispatch.slurm.release import major_release  # noqa: E402
from slurm_dispatch.slurm.select import ENV_VAR as BACKEND_ENV  # noqa: E402
from tests import sdiag  # noqa: E402
from tests.real import pyslurm_build  # noqa: E402

DEFAULT_DIR = "/var/tmp/sb-bench-controller"
JOB_SCRIPT = "#!/bin/bash\necho hi\n"
FAILING = "#!/bin/bash\nexit 3\n"
WIDE = "#!/bin/bash\nsrun --ntasks-per-node=1 sleep 1\n"
# How a pass says it read an end in Slurm's accounting (one sacct each).
FROM_SACCT = "known from Slurm's accounting (sacct)"


class Cluster:
    """The bench's view of the sandbox: clients as root or as the user, in its environment."""

    def __init__(self, directory: str, user: str, scratch: str) -> None:
        self.dir, self.user, self.scratch = directory, user, scratch
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
        env.update(sandbox_clients.environment(directory, user=user))
        env["DISPATCH_HOME"] = os.path.join(scratch, "dispatch-home")
        self.env = env
        self.venv_bin = sandbox_layout.Layout(Path(directory)).venv_bin
        self.accounting = sandbox.status(directory).accounting == "slurmdbd"
        # What the last cost() cost slurmdbd (None without accounting).
        self.dbd_cost: sdiag.Cost | None = None

    def run(
        self, argv: Sequence[str], as_user: bool = True, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        full = sandbox_clients.command(
            list(argv), Path(self.dir), user=self.user if as_user else None, cwd=Path(self.scratch)
        )
        proc = subprocess.run(
            full,
            env=self.env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(full)} exited {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def root(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self.run(argv, as_user=False, check=False)

    def tool(self, name: str) -> str:
        return str(self.venv_bin / name)

    def cost(self, argv: Sequence[str], check: bool = True) -> tuple[sdiag.Cost, str]:
        """``argv`` run once as the user, and what it cost the controller (with its cost at
        slurmdbd in :attr:`dbd_costs`, where the sandbox keeps accounting)."""
        out: dict[str, str] = {}

        def command() -> None:
            out["stdout"] = self.run(argv, check=check).stdout

        daemons = (sdiag.SLURMCTLD, sdiag.SLURMDBD) if self.accounting else (sdiag.SLURMCTLD,)
        costs = sdiag.measure_all(self.root, self.user, command, daemons)
        self.dbd_cost = costs[1] if self.accounting else None
        return costs[0], out["stdout"]

    def queue(self) -> dict[str, str]:
        """The user's jobs as squeue shows them: {job id: state}."""
        lines = self.run(["squeue", "--me", "-h", "-o", "%i %T"]).stdout.split("\n")
        return dict(line.split() for line in lines if line.strip())

    def wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.5)


def scratch_folder(
    layout: sandbox_layout.Layout, user: str, files: list[tuple[str, str, int]]
) -> str:
    """A scratch folder ``user`` owns under the sandbox's ``bench/``, holding ``files``."""
    parent = layout.root / "bench"
    parent.mkdir(mode=0o755, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="controller-", dir=parent)
    entry = pwd.getpwnam(user)
    os.chmod(scratch, 0o755)
    for name, text, mode in files:
        path = os.path.join(scratch, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, mode)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chown(scratch, entry.pw_uid, entry.pw_gid)
    return scratch


def wind_up(cl: Cluster, scratch: str, directory: str, keep: bool, results: dict[str, Any]) -> None:
    """After a bench on its own sandbox: cancel every job of the user (resubmissions too),
    note the load, and unless ``keep`` remove the scratch folder and stop the sandbox."""
    cl.run(["scancel", "-u", cl.user], as_user=False, check=False)
    results["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if not keep:
        shutil.rmtree(scratch, ignore_errors=True)
        sandbox.down(directory)


def emit(
    args: argparse.Namespace, results: dict[str, Any], report: Callable[[dict[str, Any]], None]
) -> None:
    """One JSON document on stdout with ``--json``, else the report and the elapsed time."""
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        report(results)
        print(f"elapsed {results['elapsed_s']} s")


def pyslurm_overlay(cl: Cluster) -> Path:
    """A folder holding the pyslurm that matches the sandbox's Slurm (as the adapter's
    contract test installs it), for PYTHONPATH."""
    said = cl.run(["scontrol", "--version"], as_user=False).stdout.split()[-1]
    release = major_release(said)
    if release is None:
        raise RuntimeError(f"scontrol --version said {said!r}")
    python = cl.tool("python")
    layout = sandbox_layout.Layout(Path(cl.dir))
    staging = None if sandbox_clients.root_of(layout) is None else layout.root / "wheels"

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return cl.run(argv, as_user=False, check=False, timeout=1800)

    wheel = pyslurm_build.wheel_for(release, python, run, staging=staging)
    return pyslurm_build.install_into(
        Path(cl.dir) / "pyslurm" / f"{release[0]}.{release[1]}", wheel, python, run, staging=staging
    )


def row(
    label: str, cost: sdiag.Cost, dbd: sdiag.Cost | None = None, **extra: Any
) -> dict[str, Any]:
    found = {
        "command": label,
        "rpcs": cost.rpcs,
        "total_us": cost.total_us,
        "by_type": cost.by_type,
        **extra,
    }
    if dbd is not None:
        found.update(dbd_rpcs=dbd.rpcs, dbd_total_us=dbd.total_us, dbd_by_type=dbd.by_type)
    return found


def sweep(cl: Cluster, start: int, count: int) -> list[str]:
    out = cl.run([cl.tool("python"), "sweep.py", str(start), str(count)]).stdout
    return out.split()


def measure(args: argparse.Namespace, cl: Cluster, results: dict[str, Any]) -> None:
    jobs: list[str] = []
    rows: list[dict[str, Any]] = results["rows"]
    rows.append(row("squeue --me", cl.cost(["squeue", "--me"])[0], cl.dbd_cost))
    cost, out = cl.cost(["sbatch", "--parsable", "--hold", "job.sh"])
    jobs.append(job_id(out))
    rows.append(row("sbatch --hold job.sh", cost, cl.dbd_cost))
    sbatch_rpcs = cost.rpcs
    cost, out = cl.cost(
        [cl.tool("dispatch-sbatch"), "--parsable", "--hold", "--checkpoint", "ck-one", "job.sh"]
    )
    jobs.append(job_id(out))
    rows.append(row("dispatch-sbatch --hold --checkpoint ck-one job.sh", cost, cl.dbd_cost))
    squeue_rpcs = rows[0]["rpcs"]

    known = 1  # ck-one
    for size in (args.small, args.jobs):
        say(args, f"submitting {size - known} held dispatch jobs (api.submit, 8 threads)")
        jobs.extend(sweep(cl, known, size - known))
        known = size
        cost, _ = cl.cost([cl.tool("dispatch"), "supervise"])
        rows.append(
            row(
                f"dispatch supervise: one pass, {size} held jobs known",
                cost,
                cl.dbd_cost,
                jobs=size,
                actions=0,
                target=squeue_rpcs,
                dbd_target=0,
            )
        )
    cost, _ = cl.cost([cl.tool("dispatch"), "status", jobs[-1]])
    rows.append(row(f"dispatch status JOB ({known} jobs known)", cost, cl.dbd_cost))

    say(args, f"{args.act} dispatch jobs with --resubmit 1 that fail at once")
    failing = [
        job_id(
            cl.run(
                [
                    cl.tool("dispatch-sbatch"),
                    "--parsable",
                    "--resubmit",
                    "1",
                    "--checkpoint",
                    f"ck-fail-{i}",
                    "fail.sh",
                ]
            ).stdout
        )
        for i in range(args.act)
    ]
    jobs.extend(failing)
    cl.wait(lambda: not set(failing) & set(cl.queue()), 180, "the failing jobs to end")
    cost, out = cl.cost([cl.tool("dispatch"), "supervise"])
    resubmitted = out.count("resubmitted as submission")
    rows.append(
        row(
            f"dispatch supervise: one pass, {known + args.act} jobs known, "
            f"{resubmitted} resubmitted",
            cost,
            cl.dbd_cost,
            jobs=known + args.act,
            actions=resubmitted,
            target=squeue_rpcs + resubmitted * sbatch_rpcs,
            dbd_target=0,
        )
    )

    say(args, f"a dispatch job over all {args.nodes} nodes")
    wide = job_id(
        cl.run(
            [
                cl.tool("dispatch-sbatch"),
                "--parsable",
                "-N",
                str(args.nodes),
                "--checkpoint",
                "ck-wide",
                "wide.sh",
            ]
        ).stdout
    )
    jobs.append(wide)
    cl.wait(lambda: wide not in cl.queue(), 300, f"job {wide} over {args.nodes} nodes to end")
    deadline = time.monotonic() + 120
    while True:
        proc = cl.run([cl.tool("dispatch-cease"), wide, "--json"], check=False)
        if proc.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    verdict = json.loads(proc.stdout) if proc.stdout.strip() else {}
    cost, out = cl.cost([cl.tool("dispatch-cease"), wide, "--json"], check=False)
    rows.append(row(f"dispatch-cease JOBID ({args.nodes} nodes)", cost, cl.dbd_cost))
    # The hooks' facts of the wide job, as the sandbox's StateDir (dispatch-state) holds them:
    # each node's Prolog writes start.<node>.*, its Epilog end.<node>.*.
    folder = Path(cl.dir) / "dispatch-state" / "facts" / str(pwd.getpwnam(cl.user).pw_uid) / wide
    names = [p.name.split(".") for p in folder.iterdir()] if folder.is_dir() else []
    results["cease"] = {
        "job": wide,
        "exit": proc.returncode,
        "ceased": verdict.get("ceased"),
        "reason": verdict.get("reason"),
        "nodes_in_verdict": len(verdict.get("nodes", [])),
        "prolog_nodes": len({n[1] for n in names if n[0] == "start"}),
        "epilog_nodes": len({n[1] for n in names if n[0] == "end"}),
    }
    if cl.accounting:
        forgotten(args, cl, rows, known + args.act + 1, squeue_rpcs, sbatch_rpcs)


def forgotten(
    args: argparse.Namespace,
    cl: Cluster,
    rows: list[dict[str, Any]],
    known: int,
    squeue_rpcs: int,
    sbatch_rpcs: int,
) -> None:
    """``--act`` dispatch jobs fail while no supervisor runs and slurmctld forgets them
    (MinJobAge 5 s, a line in site.conf for this step); the pass that reads their ends in
    sacct and resubmits them, and what one ``sacct -j`` costs alone."""
    site = Path(cl.dir) / "etc" / "site.conf"
    kept = site.read_text()
    site.write_text(kept + "MinJobAge=5\n")
    try:
        cl.root(["scontrol", "reconfigure"])
        say(args, f"{args.act} dispatch jobs that fail and that slurmctld forgets (MinJobAge 5)")
        failing = [
            job_id(
                cl.run(
                    [
                        cl.tool("dispatch-sbatch"),
                        "--parsable",
                        "--resubmit",
                        "1",
                        "--checkpoint",
                        f"ck-forgotten-{i}",
                        "fail.sh",
                    ]
                ).stdout
            )
            for i in range(args.act)
        ]

        def all_forgotten() -> bool:
            shown = cl.run(
                ["squeue", "-h", "--states=all", "-j", ",".join(failing), "-o", "%i"], check=False
            ).stdout.split()
            return not set(failing) & set(shown)

        cl.wait(all_forgotten, 400, "slurmctld to forget the failing jobs")
        cost, _ = cl.cost(["sacct", "-X", "-n", "-P", "-j", failing[0], "-o", "JobID,State"])
        rows.append(row("sacct -j JOB (a job slurmctld forgot)", cost, cl.dbd_cost))
        sacct = cl.dbd_cost.rpcs if cl.dbd_cost is not None else 0
        # Every submission slurmctld forgot before its end was recorded is read once: these,
        # and the earlier step's resubmissions and the wide job, which ended since.
        cost, out = cl.cost([cl.tool("dispatch"), "supervise"])
        resubmitted = out.count("resubmitted as submission")
        read = out.count(FROM_SACCT)
        rows.append(
            row(
                f"dispatch supervise: one pass, {known + args.act} jobs known, "
                f"{read} ends of submissions slurmctld forgot read in sacct, "
                f"{resubmitted} resubmitted",
                cost,
                cl.dbd_cost,
                jobs=known + args.act,
                actions=resubmitted,
                forgotten=read,
                target=squeue_rpcs + resubmitted * sbatch_rpcs,
                dbd_target=read * sacct,
            )
        )
        # Only submissions not read before: those the last pass made, if they ended and were
        # forgotten since (fail.sh fails at once; MinJobAge is 5 s).
        cost, out = cl.cost([cl.tool("dispatch"), "supervise"])
        again = out.count(FROM_SACCT)
        rows.append(
            row(
                f"dispatch supervise: the next pass ({again} ends of newer submissions "
                "read in sacct)",
                cost,
                cl.dbd_cost,
                forgotten=again,
                target=squeue_rpcs,
                dbd_target=again * sacct,
            )
        )
    finally:
        site.write_text(kept)
        cl.root(["scontrol", "reconfigure"])


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in results["rows"]:
        if "target" in r:
            out.append(
                {
                    "what": r["command"],
                    "rpcs": r["rpcs"],
                    "target": r["target"],
                    "result": "PASS" if r["rpcs"] <= r["target"] else "MISS",
                }
            )
        if "dbd_target" in r and "dbd_rpcs" in r:
            out.append(
                {
                    "what": f"{r['command']} (slurmdbd)",
                    "rpcs": r["dbd_rpcs"],
                    "target": r["dbd_target"],
                    "result": "PASS" if r["dbd_rpcs"] <= r["dbd_target"] else "MISS",
                }
            )
    return out


def say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def print_report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print(
        f"\n{env['slurm']}, {env['nodes']} nodes, backend {env['backend']}, "
        f"accounting {env.get('accounting', 'none')}, "
        f"load {env['loadavg_start']} -> {env['loadavg_end']}"
    )
    width = max(len(r["command"]) for r in results["rows"])
    print(f"{'command':{width}s}  rpcs  total_us  by type")
    for r in results["rows"]:
        types = ", ".join(
            f"{k.removeprefix('REQUEST_')} {v}" for k, v in sorted(r["by_type"].items())
        )
        print(f"{r['command']:{width}s}  {r['rpcs']:4d}  {r['total_us']:8d}  {types}")
    if any("dbd_rpcs" in r for r in results["rows"]):
        print(
            f"\nat slurmdbd: {'command':{width - 12}s}  rpcs  total_us  by type (every "
            "user's, slurmctld's own included)"
        )
        for r in results["rows"]:
            if "dbd_rpcs" in r:
                types = ", ".join(
                    f"{k.removeprefix('DBD_')} {v}" for k, v in sorted(r["dbd_by_type"].items())
                )
                print(
                    f"{r['command']:{width}s}  {r['dbd_rpcs']:4d}  {r['dbd_total_us']:8d}  {types}"
                )
    c = results.get("cease", {})
    if c:
        print(
            f"job {c['job']} over {env['nodes']} nodes: Prolog facts on {c['prolog_nodes']} "
            f"nodes, Epilog facts on {c['epilog_nodes']}; dispatch-cease exit {c['exit']}, "
            f"{c['reason']}"
        )
    for v in results["verdicts"]:
        print(f"{v['result']}: {v['what']}: {v['rpcs']} RPCs, target <= {v['target']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sandbox_options(p, DEFAULT_DIR, nodes=sandbox_layout.MAX_NODE_COUNT)
    p.add_argument(
        "--jobs",
        type=int,
        default=1000,
        help="held dispatch jobs known at the large pass (default 1000)",
    )
    p.add_argument(
        "--small",
        type=int,
        default=10,
        help="held dispatch jobs known at the small pass (default 10)",
    )
    p.add_argument(
        "--act", type=int, default=5, help="failing jobs the acting pass resubmits (default 5)"
    )
    p.add_argument(
        "--backend",
        choices=["auto", "cli", "pyslurm"],
        default="auto",
        help="the Slurm adapter's backend (DISPATCH_SLURM_BACKEND; default auto); "
        "pyslurm installs the wheel matching the sandbox's Slurm (built by "
        "tests/real/pyslurm_build.py) on PYTHONPATH",
    )
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 on a missed target")
    args = p.parse_args(argv)
    if not 2 <= args.small < args.jobs:
        p.error("need 2 <= --small < --jobs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench_controller.py must run as root: it starts the sandbox and resets "
            "slurmctld's counters",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    say(args, f"sandbox {args.dir}: up ({args.nodes} nodes)")
    report = sandbox.up(args.dir, nodes=args.nodes, user=args.user, source=REPO_ROOT)
    state = report.status
    layout = sandbox_layout.Layout(Path(state.dir))
    scratch = scratch_folder(
        layout,
        state.user,
        [
            ("job.sh", JOB_SCRIPT, 0o755),
            ("fail.sh", FAILING, 0o755),
            ("wide.sh", WIDE, 0o755),
            ("sweep.py", sdiag.HELD_SWEEP, 0o644),
        ],
    )
    cl = Cluster(state.dir, state.user, scratch)
    cl.env[BACKEND_ENV] = args.backend
    if args.backend == "pyslurm":
        cl.env["PYTHONPATH"] = str(pyslurm_overlay(cl))
    backend = cl.run(
        [
            cl.tool("python"),
            "-c",
            "from slurm_dispatch.slurm.adapter import "
            "Slurm; print(type(Slurm()._backend(None)).__name__)",
        ],
        check=False,
    )
    results: dict[str, Any] = {
        "rows": [],
        "environment": {
            "slurm": cl.run(["sbatch", "--version"], as_user=False).stdout.strip(),
            "accounting": state.accounting,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "nodes": len(state.nodes),
            "user": state.user,
            "backend": backend.stdout.strip() or backend.stderr.strip()[-200:],
            "source": source_identity(),
        },
    }
    try:
        measure(args, cl, results)
    finally:
        wind_up(cl, scratch, state.dir, args.keep, results)
    results["verdicts"] = verdicts(results)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    emit(args, results, print_report)
    missed = [v for v in results["verdicts"] if v["result"] != "PASS"]
    return 1 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
