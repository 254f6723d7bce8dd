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
   on each), after it ended: the hooks' facts on every node (counted in the report) prove it.

Target (issue 20): a pass costs no more RPCs than one ``squeue --me`` plus one ``sbatch`` per
resubmission it makes, whatever the number of jobs.  Every command runs as the sandbox user
(``dispatch-cease`` too, as the supervisor asks it), commands one at a time, so the user's
RPCs are the command's own.  Dispatch records go to ``DISPATCH_HOME`` in a scratch folder.
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
from slurm_dispatch.slurm.select import ENV_VAR as BACKEND_ENV  # noqa: E402
from slurm_dispatch.slurm.select import major_release  # noqa: E402
from tests import sdiag  # noqa: E402
from tests.real import pyslurm_build  # noqa: E402

DEFAULT_DIR = "/var/tmp/sb-bench-controller"
JOB_SCRIPT = "#!/bin/bash\necho hi\n"
FAILING = "#!/bin/bash\nexit 3\n"
WIDE = "#!/bin/bash\nsrun --ntasks-per-node=1 sleep 1\n"


class Cluster:
    """The bench's view of the sandbox: clients as root or as the user, in its environment."""

    def __init__(self, directory: str, user: str, scratch: str) -> None:
        self.dir, self.user, self.scratch = directory, user, scratch
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
        env.update(sandbox_clients.environment(directory, user=user))
        env["DISPATCH_HOME"] = os.path.join(scratch, "dispatch-home")
        self.env = env
        self.venv_bin = sandbox_layout.Layout(Path(directory)).venv_bin

    def run(self, argv: Sequence[str], as_user: bool = True, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        full = sandbox_clients.command(list(argv), Path(self.dir),
                                       user=self.user if as_user else None,
                                       cwd=Path(self.scratch))
        proc = subprocess.run(full, env=self.env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(full)} exited {proc.returncode}\n"
                               f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def root(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self.run(argv, as_user=False, check=False)

    def tool(self, name: str) -> str:
        return str(self.venv_bin / name)

    def cost(self, argv: Sequence[str], check: bool = True) -> tuple[sdiag.Cost, str]:
        """``argv`` run once as the user, and what it cost the controller."""
        out: dict[str, str] = {}

        def command() -> None:
            out["stdout"] = self.run(argv, check=check).stdout
        return sdiag.measure(self.root, self.user, command), out["stdout"]

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


def scratch_folder(layout: sandbox_layout.Layout, user: str,
                   files: list[tuple[str, str, int]]) -> str:
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


def wind_up(cl: Cluster, scratch: str, directory: str, keep: bool,
            results: dict[str, Any]) -> None:
    """After a bench on its own sandbox: cancel every job of the user (resubmissions too),
    note the load, and unless ``keep`` remove the scratch folder and stop the sandbox."""
    cl.run(["scancel", "-u", cl.user], as_user=False, check=False)
    results["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if not keep:
        shutil.rmtree(scratch, ignore_errors=True)
        sandbox.down(directory)


def emit(args: argparse.Namespace, results: dict[str, Any],
         report: Callable[[dict[str, Any]], None]) -> None:
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
    return pyslurm_build.install_into(Path(cl.dir) / "pyslurm" / f"{release[0]}.{release[1]}",
                                      wheel, python, run, staging=staging)


def row(label: str, cost: sdiag.Cost, **extra: Any) -> dict[str, Any]:
    return {"command": label, "rpcs": cost.rpcs, "total_us": cost.total_us,
            "by_type": cost.by_type, **extra}


def sweep(cl: Cluster, start: int, count: int) -> list[str]:
    out = cl.run([cl.tool("python"), "sweep.py", str(start), str(count)]).stdout
    return out.split()


def measure(args: argparse.Namespace, cl: Cluster, results: dict[str, Any]) -> None:
    jobs: list[str] = []
    rows: list[dict[str, Any]] = results["rows"]
    rows.append(row("squeue --me", cl.cost(["squeue", "--me"])[0]))
    cost, out = cl.cost(["sbatch", "--parsable", "--hold", "job.sh"])
    jobs.append(job_id(out))
    rows.append(row("sbatch --hold job.sh", cost))
    sbatch_rpcs = cost.rpcs
    cost, out = cl.cost([cl.tool("dispatch-sbatch"), "--parsable", "--hold",
                         "--checkpoint", "ck-one", "job.sh"])
    jobs.append(job_id(out))
    rows.append(row("dispatch-sbatch --hold --checkpoint ck-one job.sh", cost))
    squeue_rpcs = rows[0]["rpcs"]

    known = 1  # ck-one
    for size in (args.small, args.jobs):
        say(args, f"submitting {size - known} held dispatch jobs (api.submit, 8 threads)")
        jobs.extend(sweep(cl, known, size - known))
        known = size
        cost, _ = cl.cost([cl.tool("dispatch"), "supervise"])
        rows.append(row(f"dispatch supervise: one pass, {size} held jobs known", cost,
                        jobs=size, actions=0, target=squeue_rpcs))
    cost, _ = cl.cost([cl.tool("dispatch"), "status", jobs[-1]])
    rows.append(row(f"dispatch status JOB ({known} jobs known)", cost))

    say(args, f"{args.act} dispatch jobs with --resubmit 1 that fail at once")
    failing = [job_id(cl.run([cl.tool("dispatch-sbatch"), "--parsable", "--resubmit", "1",
                              "--checkpoint", f"ck-fail-{i}", "fail.sh"]).stdout)
               for i in range(args.act)]
    jobs.extend(failing)
    cl.wait(lambda: not set(failing) & set(cl.queue()), 180, "the failing jobs to end")
    cost, out = cl.cost([cl.tool("dispatch"), "supervise"])
    resubmitted = out.count("resubmitted as submission")
    rows.append(row(f"dispatch supervise: one pass, {known + args.act} jobs known, "
                    f"{resubmitted} resubmitted", cost, jobs=known + args.act,
                    actions=resubmitted, target=squeue_rpcs + resubmitted * sbatch_rpcs))

    say(args, f"a dispatch job over all {args.nodes} nodes")
    wide = job_id(cl.run([cl.tool("dispatch-sbatch"), "--parsable", "-N", str(args.nodes),
                          "--checkpoint", "ck-wide", "wide.sh"]).stdout)
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
    rows.append(row(f"dispatch-cease JOBID ({args.nodes} nodes)", cost))
    # The hooks' facts of the wide job, as the sandbox's StateDir (dispatch-state) holds them:
    # each node's Prolog writes start.<node>.*, its Epilog end.<node>.*.
    folder = (Path(cl.dir) / "dispatch-state" / "facts" / str(pwd.getpwnam(cl.user).pw_uid)
              / wide)
    names = [p.name.split(".") for p in folder.iterdir()] if folder.is_dir() else []
    results["cease"] = {
        "job": wide, "exit": proc.returncode, "ceased": verdict.get("ceased"),
        "reason": verdict.get("reason"), "nodes_in_verdict": len(verdict.get("nodes", [])),
        "prolog_nodes": len({n[1] for n in names if n[0] == "start"}),
        "epilog_nodes": len({n[1] for n in names if n[0] == "end"})}


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in results["rows"]:
        if "target" in r:
            out.append({"what": r["command"], "rpcs": r["rpcs"], "target": r["target"],
                        "result": "PASS" if r["rpcs"] <= r["target"] else "MISS"})
    return out


def say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


def print_report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print(f"\n{env['slurm']}, {env['nodes']} nodes, backend {env['backend']}, "
          f"load {env['loadavg_start']} -> {env['loadavg_end']}")
    width = max(len(r["command"]) for r in results["rows"])
    print(f"{'command':{width}s}  rpcs  total_us  by type")
    for r in results["rows"]:
        types = ", ".join(f"{k.removeprefix('REQUEST_')} {v}" for k, v in sorted(
            r["by_type"].items()))
        print(f"{r['command']:{width}s}  {r['rpcs']:4d}  {r['total_us']:8d}  {types}")
    c = results.get("cease", {})
    if c:
        print(f"job {c['job']} over {env['nodes']} nodes: Prolog facts on {c['prolog_nodes']} "
              f"nodes, Epilog facts on {c['epilog_nodes']}; dispatch-cease exit {c['exit']}, "
              f"{c['reason']}")
    for v in results["verdicts"]:
        print(f"{v['result']}: {v['what']}: {v['rpcs']} RPCs, target <= {v['target']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sandbox_options(p, DEFAULT_DIR, nodes=sandbox_layout.MAX_NODE_COUNT)
    p.add_argument("--jobs", type=int, default=1000,
                   help="held dispatch jobs known at the large pass (default 1000)")
    p.add_argument("--small", type=int, default=10,
                   help="held dispatch jobs known at the small pass (default 10)")
    p.add_argument("--act", type=int, default=5,
                   help="failing jobs the acting pass resubmits (default 5)")
    p.add_argument("--backend", choices=["auto", "cli", "pyslurm"], default="auto",
                   help="the Slurm adapter's backend (DISPATCH_SLURM_BACKEND; default auto); "
                        "pyslurm installs the wheel matching the sandbox's Slurm (built by "
                        "tests/real/pyslurm_build.py) on PYTHONPATH")
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 on a missed target")
    args = p.parse_args(argv)
    if not 2 <= args.small < args.jobs:
        p.error("need 2 <= --small < --jobs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench_controller.py must run as root: it starts the sandbox and resets "
              "slurmctld's counters", file=sys.stderr)
        return 2
    started = time.perf_counter()
    say(args, f"sandbox {args.dir}: up ({args.nodes} nodes)")
    report = sandbox.up(args.dir, nodes=args.nodes, user=args.user, source=REPO_ROOT)
    state = report.status
    layout = sandbox_layout.Layout(Path(state.dir))
    scratch = scratch_folder(layout, state.user, [
        ("job.sh", JOB_SCRIPT, 0o755), ("fail.sh", FAILING, 0o755), ("wide.sh", WIDE, 0o755),
        ("sweep.py", sdiag.HELD_SWEEP, 0o644)])
    cl = Cluster(state.dir, state.user, scratch)
    cl.env[BACKEND_ENV] = args.backend
    if args.backend == "pyslurm":
        cl.env["PYTHONPATH"] = str(pyslurm_overlay(cl))
    backend = cl.run([cl.tool("python"), "-c", "from slurm_dispatch.slurm.adapter import "
                      "Slurm; print(type(Slurm()._backend(None)).__name__)"], check=False)
    results: dict[str, Any] = {"rows": [], "environment": {
        "slurm": cl.run(["sbatch", "--version"], as_user=False).stdout.strip(),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()], "nodes": len(state.nodes),
        "user": state.user, "backend": backend.stdout.strip() or backend.stderr.strip()[-200:],
        "source": source_identity()}}
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
