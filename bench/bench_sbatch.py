#!/usr/bin/env python3
"""Benchmark ``dispatch-sbatch`` against plain ``sbatch`` on the real sandbox Slurm cluster.

Run as root: ``python bench/bench_sbatch.py`` (about half a minute once the sandbox is up).
One run measures:

1. The wall time of one submission, end to end, side by side in one run: as the sandbox user
   (``runuser -u dispatchuser -- ...`` with the sandbox's environment, in a folder the user
   owns) ``<venv>/bin/dispatch-sbatch --parsable --checkpoint ck-<n> --hold job.sh`` (a new
   root each time: the root-in-use check refuses a second live job on one root), ``sbatch
   --parsable --hold job.sh``, and submitit (from PyPI, installed into the sandbox's venv; its
   command-function form submitting the same job.sh, held, from process start to the job id);
   and the bare start of the interpreter dispatch-sbatch's entry point runs on (its ``#!``
   line: ``<that python> -I -c pass``, named in the report, without runuser, which cancels out
   of the difference below).  ``--hold`` keeps every job pending (never run); all are cancelled
   at the end.  One untimed warm-up each, then ``--count`` rounds, the order rotated per round
   so that drift hits all alike.  Targets: (dispatch-sbatch median - sbatch median) <= 1.5x
   the bare interpreter start's median, and dispatch-sbatch's median below submitit's.
2. Where dispatch-sbatch's time goes, over ``--split-count`` fresh processes of each kind
   (order rotated per round): ``runuser -- true`` (the runuser floor both sides pay), the
   venv's ``python -c pass`` (interpreter start-up), ``python -c 'import
   slurm_dispatch.cli.sbatch'`` and ``dispatch-sbatch --help`` (start-up + imports), and a
   driver that imports ``slurm_dispatch.cli.sbatch`` and runs its ``main`` in-process on the
   same arguments with every phase timed (read the request, checkpoint root, job record,
   claim, batch script, the sbatch subprocess, the Slurm adapter around it, the
   ``submitted`` event).  Import probes split the import: the standard library modules it
   loads (json, subprocess and what they pull in), imported alone, against the whole, so
   what the package's own modules cost shows apart from what any Python front end that
   writes JSON records and runs sbatch pays.  ``python -X importtime`` shows the import tree;
   ``--profile`` adds a cProfile of one in-process ``main``.

With ``--baseline-src PATH`` (another commit's source tree, e.g. ``git archive b39dcc8 | tar -x
-C PATH``) part 1 also submits with that tree's ``dispatch-sbatch``: its own entry point (from
its pyproject.toml) in a console script as pip writes it, on the same venv interpreter, the tree
copied into the scratch folder first on ``sys.path``; interleaved with the others, and judged
against this checkout's: no slower than before (<= 1.0x, within the noise of a loaded machine).

The sandbox lives in its own state folder (``--dir``, default ``/var/tmp/sb-bench``; its ports
derive from the folder, so it runs beside the test sandboxes), started with
``slurm_dispatch.sandbox.cluster.up`` (idempotent; this checkout is installed into its venv when it
changed) and stopped at the end with ``sandbox.cluster.down`` unless ``--keep``.  Dispatch records
go to ``DISPATCH_HOME`` in a scratch folder under the state folder (not the user's
``~/.local/state``, which the real tests inspect), removed at the end unless ``--keep``.
Timings are wall-clock ``time.perf_counter_ns`` around ``subprocess.run``.  Exit status is 0
unless ``--fail-on-miss`` is given and the target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from slurm_dispatch.sandbox import clients as sandbox_clients
from slurm_dispatch.sandbox import cluster as sandbox
from slurm_dispatch.sandbox import layout as sandbox_layout

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(REPO_ROOT / "bench"))

import baseline as baseline_src  # noqa: E402 - bench/ beside this script

BASELINE = "dispatch-sbatch (baseline)"
DEFAULT_DIR = "/var/tmp/sb-bench"
# (dispatch-sbatch median - sbatch median) must be <= this many times the bare start of the
# interpreter dispatch-sbatch's entry point runs on (`<that python> -I -c pass`), measured
# side by side; and dispatch-sbatch must be faster than submitit submitting the same script.
TARGET = 1.5

# submitit (from PyPI, installed into the sandbox's venv), its command-function form: the same
# job.sh, held, from process start to the job id on stdout.
SUBMITIT = """\
import sys
import submitit
from submitit.helpers import CommandFunction
executor = submitit.SlurmExecutor(folder=sys.argv[1])
executor.update_parameters(time=1, additional_parameters={"hold": True})
job = executor.submit(CommandFunction(["bash", "job.sh"]))
print(job.job_id)
"""

JOB_SCRIPT = """#!/bin/bash
#SBATCH --time=1
# bench_sbatch.py submits this with --hold: it never runs.
echo "held jobs do not run"
"""

# Runs as the sandbox user with the sandbox venv's python (written into the scratch folder).
#   driver.py import MODULE...          time importing the MODULEs, in order
#   driver.py loaded                    the modules outside slurm_dispatch its import loads
#   driver.py submit PROFILE -- ARGS    import, then cli_sbatch.main(ARGS) with phases timed
#                                       (and cProfiled when PROFILE > 0)
# It prints one JSON object on stdout.
DRIVER = r'''
import sys
import time


def probe(names):
    t0 = time.perf_counter_ns()
    for name in names:
        __import__(name)
    import_ns = time.perf_counter_ns() - t0
    import json
    print(json.dumps({"import_ns": import_ns, "modules": len(sys.modules)}))


def loaded():
    """The modules outside slurm_dispatch that its import loads (not there at start-up)."""
    before = set(sys.modules)
    import slurm_dispatch.cli.sbatch  # noqa: F401
    import json
    print(json.dumps(sorted(name for name in set(sys.modules) - before
                            if not name.startswith("slurm_dispatch"))))


def submit(profile_lines, args):
    t0 = time.perf_counter_ns()
    from slurm_dispatch.cli import sbatch as cli_sbatch
    import_ns = time.perf_counter_ns() - t0
    modules = len(sys.modules)
    import io
    import json
    import subprocess
    from slurm_dispatch.control import record
    from slurm_dispatch.control import submit as submit_mod
    from slurm_dispatch.slurm import adapter as slurm_mod

    spans = {}

    def wrap(owner, attr, label):
        original = getattr(owner, attr)

        def timed(*a, **k):
            t = time.perf_counter_ns()
            try:
                return original(*a, **k)
            finally:
                spans[label] = spans.get(label, 0) + time.perf_counter_ns() - t

        setattr(owner, attr, timed)

    wrap(submit_mod, "read_request", "read_request")
    wrap(submit_mod, "prepare_root", "prepare_root")
    wrap(record, "create_job", "create_job")
    wrap(record.JobRecord, "claim", "claim")
    wrap(submit_mod, "_write_batch", "write_batch")
    wrap(slurm_mod.Slurm, "sbatch", "slurm_sbatch")
    wrap(subprocess, "run", "subprocess")
    wrap(record.JobRecord, "append", "append")
    # What the newcomer issue added to the submission path: the environment snapshot, the
    # root-in-use check (each its own phase), and (nested in others) the typo checks of the
    # command line and the dependency lookups.
    wrap(submit_mod, "refuse_shared_root", "root_in_use")
    wrap(submit_mod, "save_environment", "env_snapshot")
    from slurm_dispatch.control import dependency, sbatch_args
    wrap(sbatch_args, "parse_command_line", "typo_checks")
    wrap(dependency, "dependency_value", "dependency")

    prof = None
    if profile_lines:
        import cProfile
        prof = cProfile.Profile()
    out, err = io.StringIO(), io.StringIO()
    real_out, real_err = sys.stdout, sys.stderr
    code = 0
    sys.stdout, sys.stderr = out, err
    t0 = time.perf_counter_ns()
    try:
        if prof is not None:
            prof.enable()
        cli_sbatch.main(args)
    except SystemExit as exc:
        code = exc.code
    finally:
        if prof is not None:
            prof.disable()
        main_ns = time.perf_counter_ns() - t0
        sys.stdout, sys.stderr = real_out, real_err
    text = ""
    if prof is not None:
        import pstats
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(profile_lines)
        text = buf.getvalue()
    print(json.dumps({"import_ns": import_ns, "modules": modules, "main_ns": main_ns,
                      "spans": spans, "code": code, "stdout": out.getvalue(),
                      "stderr": err.getvalue(), "profile": text}))


if sys.argv[1] == "import":
    probe(sys.argv[2:])
elif sys.argv[1] == "loaded":
    loaded()
else:
    submit(int(sys.argv[2]), sys.argv[sys.argv.index("--") + 1:])
'''

# Import probes: (label, what is imported).  STDLIB stands for the modules outside
# slurm_dispatch that its import loads (asked of the driver once): what the package's own code
# costs beyond the standard library it needs.
STDLIB = "<stdlib>"
PROBES = [
    ("as is", ["slurm_dispatch.cli.sbatch"]),
    ("the standard library it loads, alone", [STDLIB]),
    ("json and subprocess alone", ["json", "subprocess"]),
]

# In-process phases of main(), exclusive, in the order they happen.
PHASES = [
    ("read_request", "read the request (argv, script, header)"),
    ("root_in_use", "root-in-use check (the caller's job records)"),
    ("prepare_root", "checkpoint root (makedirs, access)"),
    ("create_job", "job record (3 mkdir, script + job.json, 2 fsync)"),
    ("claim", "claim submission-1 (1 fsync)"),
    ("write_batch", "batch-1.sh"),
    ("adapter", "Slurm.sbatch around the subprocess"),
    ("subprocess", "the sbatch subprocess itself"),
    ("env_snapshot", "environment snapshot (1 fsync)"),
    ("append", "'submitted' event (1 fsync, link, unlink)"),
    ("rest", "rest of main (spec, argv, chdir, output)"),
]


# --------------------------------------------------------------------------- helpers


def summary(samples_ns: list[int]) -> dict[str, Any]:
    return {
        "n": len(samples_ns),
        "samples_ms": [round(x / 1e6, 3) for x in samples_ns],
        "median_ns": float(statistics.median(samples_ns)),
        "min_ns": float(min(samples_ns)),
        "mean_ns": float(statistics.fmean(samples_ns)),
        "max_ns": float(max(samples_ns)),
    }


def ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def say(args: argparse.Namespace, text: str) -> None:
    """Progress goes to stderr with --json, so stdout stays one JSON document."""
    print(text, file=sys.stderr if args.json else sys.stdout, flush=True)


class Cluster:
    """The bench's view of the sandbox: run commands as its user, in the scratch folder."""

    def __init__(self, directory: str, user: str, scratch: str) -> None:
        self.dir = directory
        self.user = user
        self.scratch = scratch
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))}
        env.update(sandbox_clients.environment(directory, user=user))
        env["DISPATCH_HOME"] = os.path.join(scratch, "dispatch-home")
        self.env = env
        self.venv_bin = str(sandbox_layout.Layout(Path(directory)).venv_bin)

    def run(
        self, argv: list[str], as_user: bool = True, check: bool = True
    ) -> tuple[int, subprocess.CompletedProcess[str]]:
        """Run ``argv`` (as the user via runuser); return (wall ns, the finished process)."""
        full = ["runuser", "-u", self.user, "--", *argv] if as_user else argv
        t0 = time.perf_counter_ns()
        proc = subprocess.run(
            full,
            env=self.env,
            cwd=self.scratch,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        elapsed = time.perf_counter_ns() - t0
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(full)} exited {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return elapsed, proc


def job_id(stdout: str) -> str:
    """The job id from sbatch's --parsable line (``123`` or ``123;cluster``)."""
    word = stdout.strip().splitlines()[0].split(";")[0] if stdout.strip() else ""
    if not word.isdigit():
        raise RuntimeError(f"no job id in {stdout!r}")
    return word


def source_identity() -> dict[str, Any]:
    def git(*argv: str) -> str:
        proc = subprocess.run(["git", "-C", str(REPO_ROOT), *argv], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else "?"

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "package_changes": bool(git("status", "--porcelain", "--", "slurm_dispatch")),
    }


# --------------------------------------------------------------------------- part 1


def bench_submit(
    args: argparse.Namespace, cl: Cluster, jobs: list[str], results: dict[str, Any]
) -> None:
    dispatch = os.path.join(cl.venv_bin, "dispatch-sbatch")
    entry_python = entry_point_python(dispatch)
    commands = {
        # A new root each time: one root per live job (the root-in-use check refuses a second).
        "dispatch-sbatch": [dispatch, "--parsable", "--checkpoint", "ck-{n}", "--hold", "job.sh"],
        "sbatch": ["sbatch", "--parsable", "--hold", "job.sh"],
        "python -I -c pass": [entry_python, "-I", "-c", "pass"],
        "submitit": [os.path.join(cl.venv_bin, "python"), "submitit_submit.py", "submitit-{n}"],
    }
    if args.baseline_src:
        src = baseline_src.copy_package(
            baseline_src.checked(args.baseline_src), Path(cl.scratch) / "baseline-src"
        )
        baseline_src.compile_tree(entry_python, src)
        script = Path(cl.scratch) / "dispatch-sbatch-baseline"
        script.write_text(baseline_src.console_script(entry_python, src, "dispatch-sbatch"))
        script.chmod(0o755)
        owner = pwd.getpwnam(cl.user)
        for path in [src, *src.rglob("*"), script]:  # the user's own, as a venv is root's
            os.chown(path, owner.pw_uid, owner.pw_gid)
        commands[BASELINE] = [str(script), *commands["dispatch-sbatch"][1:]]
        results["baseline_src"] = {
            "src": os.path.realpath(args.baseline_src),
            "entry_point": ":".join(baseline_src.entry_point(src, "dispatch-sbatch")),
        }
    samples: dict[str, list[int]] = {key: [] for key in commands}
    counter = iter(range(1_000_000))

    def once(key: str) -> int:
        argv = [w.replace("{n}", str(next(counter))) for w in commands[key]]
        # The bare start without runuser: runuser's cost cancels out of dispatch-sbatch - sbatch
        # (both pay it), so the allowance must not include it.
        elapsed, proc = cl.run(argv, as_user=key != "python -I -c pass")
        if key != "python -I -c pass":
            jobs.append(job_id(proc.stdout))
        return elapsed

    for key in commands:  # warm-up, untimed
        once(key)
    keys = list(commands)
    for rnd in range(args.count):
        shift = rnd % len(keys)
        for key in keys[shift:] + keys[:shift]:  # A B C D, then B C D A, ...
            samples[key].append(once(key))
    results["submit"] = {
        "count": args.count,
        "order": f"{len(keys)} commands, order rotated per round, one warm-up each",
        "entry_python": entry_python,
        "entry_python_real": os.path.realpath(entry_python),
        "commands": {
            k: " ".join(v if k == "python -I -c pass" else ["runuser", "-u", cl.user, "--", *v])
            for k, v in commands.items()
        },
        "ops": {k: summary(v) for k, v in samples.items()},
    }


def entry_point_python(script: str) -> str:
    """The interpreter a console script's ``#!`` line names."""
    with open(script, encoding="utf-8") as handle:
        first = handle.readline()
    if not first.startswith("#!"):
        raise RuntimeError(f"{script} has no #! line")
    return first[2:].split()[0]


# --------------------------------------------------------------------------- part 2


def bench_split(
    args: argparse.Namespace, cl: Cluster, jobs: list[str], results: dict[str, Any]
) -> None:
    python = os.path.join(cl.venv_bin, "python")
    dispatch = os.path.join(cl.venv_bin, "dispatch-sbatch")
    driver = os.path.join(cl.scratch, "driver.py")
    counter = iter(range(1_000_000))

    def submit_args() -> list[str]:
        return ["--parsable", "--checkpoint", f"split-{next(counter)}", "--hold", "job.sh"]

    external = {
        "runuser true": ["true"],
        "python -c pass": [python, "-c", "pass"],
        "python -c import": [python, "-c", "import slurm_dispatch.cli.sbatch"],
        "dispatch-sbatch --help": [dispatch, "--help"],
    }
    wall: dict[str, list[int]] = {key: [] for key in external}
    driver_runs: list[dict[str, Any]] = []
    probes: dict[str, list[int]] = {label: [] for label, _ in PROBES}
    probe_modules: dict[str, int] = {}

    def run_external(key: str, timed: bool) -> None:
        elapsed, _ = cl.run(external[key])
        if timed:
            wall[key].append(elapsed)

    def run_driver(timed: bool) -> None:
        _, proc = cl.run([python, driver, "submit", "0", "--", *submit_args()])
        data = json.loads(proc.stdout)
        if data["code"]:
            raise RuntimeError(f"in-process main exited {data['code']}: {data['stderr']}")
        jobs.append(job_id(data["stdout"]))
        if timed:
            driver_runs.append(data)

    _, proc = cl.run([python, driver, "loaded"])
    stdlib = json.loads(proc.stdout)

    def run_probe(label: str, names: list[str], timed: bool) -> None:
        names = [n for name in names for n in (stdlib if name == STDLIB else [name])]
        _, proc = cl.run([python, driver, "import", *names])
        data = json.loads(proc.stdout)
        if timed:
            probes[label].append(data["import_ns"])
            probe_modules[label] = data["modules"]

    steps: list[Callable[[bool], None]] = [
        *(lambda timed, k=key: run_external(k, timed) for key in external),
        run_driver,
        *(lambda timed, lb=label, st=mods: run_probe(lb, st, timed) for label, mods in PROBES),
    ]
    for step in steps:  # warm-up, untimed
        step(False)
    for rnd in range(args.split_count):
        shift = rnd % len(steps)
        for step in steps[shift:] + steps[:shift]:
            step(True)

    phase_ns: dict[str, list[int]] = {key: [] for key, _ in PHASES}
    for data in driver_runs:
        s = data["spans"]
        phase_ns["read_request"].append(s.get("read_request", 0))
        phase_ns["root_in_use"].append(s.get("root_in_use", 0))
        phase_ns["env_snapshot"].append(s.get("env_snapshot", 0))
        phase_ns["prepare_root"].append(s.get("prepare_root", 0))
        phase_ns["create_job"].append(s.get("create_job", 0))
        phase_ns["claim"].append(s.get("claim", 0))
        phase_ns["write_batch"].append(s.get("write_batch", 0))
        phase_ns["adapter"].append(s.get("slurm_sbatch", 0) - s.get("subprocess", 0))
        phase_ns["subprocess"].append(s.get("subprocess", 0))
        phase_ns["append"].append(s.get("append", 0))
        inside = sum(
            s.get(k, 0)
            for k in (
                "read_request",
                "root_in_use",
                "prepare_root",
                "create_job",
                "claim",
                "write_batch",
                "env_snapshot",
                "slurm_sbatch",
                "append",
            )
        )
        phase_ns["rest"].append(data["main_ns"] - inside)

    results["split"] = {
        "count": args.split_count,
        "external": {k: summary(v) for k, v in wall.items()},
        "in_process": {
            "import": summary([d["import_ns"] for d in driver_runs]),
            "modules_after_import": driver_runs[0]["modules"],
            "main": summary([d["main_ns"] for d in driver_runs]),
            "phases": {k: summary(v) for k, v in phase_ns.items()},
            "nested": {
                k: summary([d["spans"].get(k, 0) for d in driver_runs])
                for k in ("typo_checks", "dependency")
            },
        },
        "probes": {
            label: {**summary(v), "modules": probe_modules.get(label)}
            for label, v in probes.items()
        },
        "stdlib": stdlib,
    }

    if args.profile:
        _, proc = cl.run([python, driver, "submit", str(args.profile_lines), "--", *submit_args()])
        data = json.loads(proc.stdout)
        jobs.append(job_id(data["stdout"]))
        results["split"]["profile"] = data["profile"]


def bench_importtime(args: argparse.Namespace, cl: Cluster, results: dict[str, Any]) -> None:
    """``python -X importtime`` three times; keep the run whose total is the median."""
    python = os.path.join(cl.venv_bin, "python")
    runs = []
    for _ in range(3):
        _, proc = cl.run([python, "-X", "importtime", "-c", "import slurm_dispatch.cli.sbatch"])
        rows: list[dict[str, Any]] = []
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, cum_us, name = line[len("import time:") :].split("|")
            depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
            rows.append(
                {
                    "self_us": int(self_us),
                    "cum_us": int(cum_us),
                    "depth": depth,
                    "module": name.strip(),
                }
            )
        total = sum(r["cum_us"] for r in rows if r["depth"] == 0)
        runs.append((total, rows))
    runs.sort(key=lambda r: r[0])
    total, rows = runs[len(runs) // 2]
    results["importtime"] = {"total_us": total, "modules": len(rows), "rows": rows}


# --------------------------------------------------------------------------- report


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    ops = results["submit"]["ops"]
    mine, base = ops["dispatch-sbatch"], ops["sbatch"]
    bare, peer = ops["python -I -c pass"], ops["submitit"]
    over = mine["median_ns"] - base["median_ns"]
    over_min = mine["min_ns"] - base["min_ns"]
    ratio = over / bare["median_ns"]
    rows = [
        {
            "operation": "dispatch-sbatch - sbatch",
            "median_ns": over,
            "min_ns": over_min,
            "baseline": f"{results['submit']['entry_python']} -I -c pass",
            "baseline_median_ns": bare["median_ns"],
            "baseline_min_ns": bare["min_ns"],
            "ratio": ratio,
            "min_ratio": over_min / bare["min_ns"],
            "target": f"<= {TARGET:g}",
            "result": "PASS" if ratio <= TARGET else "MISS",
        },
        {
            "operation": "dispatch-sbatch --hold",
            "median_ns": mine["median_ns"],
            "min_ns": mine["min_ns"],
            "baseline": "submitit (CommandFunction), held",
            "baseline_median_ns": peer["median_ns"],
            "baseline_min_ns": peer["min_ns"],
            "ratio": mine["median_ns"] / peer["median_ns"],
            "min_ratio": mine["min_ns"] / peer["min_ns"],
            "target": "< 1",
            "result": "PASS" if mine["median_ns"] < peer["median_ns"] else "MISS",
        },
        {
            "operation": "dispatch-sbatch --hold",
            "median_ns": mine["median_ns"],
            "min_ns": mine["min_ns"],
            "baseline": "sbatch --hold (for reference)",
            "baseline_median_ns": base["median_ns"],
            "baseline_min_ns": base["min_ns"],
            "ratio": mine["median_ns"] / base["median_ns"],
            "min_ratio": mine["min_ns"] / base["min_ns"],
            "target": "-",
            "result": "-",
        },
    ]
    if BASELINE in ops:
        before = ops[BASELINE]
        ratio = mine["median_ns"] / before["median_ns"]
        rows.append(
            {
                "operation": "dispatch-sbatch --hold",
                "median_ns": mine["median_ns"],
                "min_ns": mine["min_ns"],
                "baseline": f"--baseline-src {results['baseline_src']['src']}",
                "baseline_median_ns": before["median_ns"],
                "baseline_min_ns": before["min_ns"],
                "ratio": ratio,
                "min_ratio": mine["min_ns"] / before["min_ns"],
                "target": "<= 1",
                "result": "PASS" if ratio <= 1 else "MISS",
            }
        )
    return rows


def split_rows(results: dict[str, Any]) -> list[tuple[str, float]]:
    """The dispatch-sbatch median taken apart: (label, ms), summing to its median."""
    ext = {k: v["median_ns"] for k, v in results["split"]["external"].items()}
    inp = results["split"]["in_process"]
    total = results["submit"]["ops"]["dispatch-sbatch"]["median_ns"]
    rows = [
        ("runuser (runuser -u USER -- true)", ext["runuser true"]),
        ("python start-up (python -c pass - runuser)", ext["python -c pass"] - ext["runuser true"]),
        ("imports of slurm_dispatch.cli.sbatch (in-process)", inp["import"]["median_ns"]),
    ]
    for key, label in PHASES:
        rows.append((f"main: {label}", inp["phases"][key]["median_ns"]))
    rows.append(
        ("exit, entry-point script, noise (the remainder)", total - sum(v for _, v in rows))
    )
    return [(label, value / 1e6) for label, value in rows]


def print_report(
    args: argparse.Namespace, results: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    env = results["environment"]
    sub = results["submit"]
    split = results["split"]
    ext = split["external"]
    inp = split["in_process"]
    print()
    print(
        f"python {env['python']} (venv {env['venv_python']}), {env['slurm']}, "
        f"{env['machine']}, {env['cpus']} cpus, load average {env['loadavg_start']} at the "
        f"start, {env['loadavg_end']} at the end"
    )
    print(
        f"sandbox {env['sandbox_dir']} (controller port {env['controller_port']}, "
        f"{env['nodes']} node(s)), user {env['user']}; checkout {env['source']['commit']}"
        + (
            " with uncommitted changes in slurm_dispatch/"
            if env["source"]["package_changes"]
            else ""
        )
        + f"; up took {results['sandbox']['up_seconds']} s"
        + (
            f" ({'; '.join(results['sandbox']['up_actions'])})"
            if results["sandbox"]["up_actions"]
            else " (already up)"
        )
    )
    print(f"submissions: {sub['count']} rounds of {sub['order']}")
    for key, cmd in sub["commands"].items():
        s = sub["ops"][key]
        print(
            f"  {key:26s} median {ms(s['median_ns']):>9s}  mean {ms(s['mean_ns']):>9s}  "
            f"min {ms(s['min_ns']):>9s}  max {ms(s['max_ns']):>9s}   {cmd}"
        )

    print()
    print(
        f"where one dispatch-sbatch submission goes (medians of {split['count']} fresh "
        "processes each, order rotated; phases timed in-process around main()):"
    )
    parts = split_rows(results)
    total_ms = sub["ops"]["dispatch-sbatch"]["median_ns"] / 1e6
    width = max(len(label) for label, _ in parts)
    for label, value in parts:
        print(f"  {label:{width}s} {value:7.1f} ms  {100 * value / total_ms:5.1f} %")
    print(f"  {'= dispatch-sbatch end to end (median)':{width}s} {total_ms:7.1f} ms")
    base_ms = sub["ops"]["sbatch"]["median_ns"] / 1e6
    print(f"  {'  plain sbatch end to end (median), runuser included':{width}s} {base_ms:7.1f} ms")
    phases, nested = inp["phases"], inp["nested"]
    added = sum(phases[k]["median_ns"] for k in ("root_in_use", "env_snapshot"))
    print(
        f"the newcomer features on this path: root-in-use check "
        f"{ms(phases['root_in_use']['median_ns'])}, environment snapshot "
        f"{ms(phases['env_snapshot']['median_ns'])} (together {ms(added)}); typo checks "
        f"(the command line's parse, nested in the request) "
        f"{ms(nested['typo_checks']['median_ns'])}; dependency lookups "
        f"{ms(nested['dependency']['median_ns'])}"
    )
    print(
        f"the interpreter dispatch-sbatch's entry point runs on: {sub['entry_python']} "
        f"(-> {sub['entry_python_real']}); its bare start (-I -c pass, no runuser) "
        f"{ms(sub['ops']['python -I -c pass']['median_ns'])}"
    )
    imp, bare = ext["python -c import"]["median_ns"], ext["python -c pass"]["median_ns"]
    print(
        f"cross-checks: python -c 'import slurm_dispatch.cli.sbatch' {ms(imp)} - "
        f"python -c pass {ms(bare)} = {ms(imp - bare)} "
        f"for the imports (interpreter teardown included); dispatch-sbatch --help "
        f"{ms(ext['dispatch-sbatch --help']['median_ns'])}; in-process main() "
        f"{ms(inp['main']['median_ns'])}; {inp['modules_after_import']} modules loaded "
        "after the import"
    )
    floor = (
        ext["python -c pass"]["median_ns"]
        + inp["phases"]["subprocess"]["median_ns"]
        + sum(inp["phases"][k]["median_ns"] for k in ("create_job", "claim", "append"))
    )
    base_ns = sub["ops"]["sbatch"]["median_ns"]
    print(
        f"floor of any Python dispatch-sbatch with zero import cost (runuser + python "
        f"start-up + sbatch subprocess + the record writes: create_job, claim, event): "
        f"{ms(floor)} = {floor / base_ns:.2f}x plain sbatch; the bare interpreter start-up "
        f"alone takes {ms(bare - ext['runuser true']['median_ns'])}"
    )

    print()
    print(
        f"import probes (in-process imports, medians of {split['count']} fresh processes; "
        f"the standard library slurm_dispatch.cli.sbatch loads: "
        f"{', '.join(split.get('stdlib', []))}):"
    )
    full = split["probes"][PROBES[0][0]]["median_ns"]
    for label, _ in PROBES:
        p = split["probes"][label]
        print(
            f"  {label:46s} {ms(p['median_ns']):>9s}  (min {ms(p['min_ns'])}, "
            f"{p['modules']} modules)  {p['median_ns'] / full:.0%} of the import"
        )

    it = results.get("importtime")
    if it:
        print()
        print(
            f"python -X importtime (median of 3 runs; it inflates each import by its own "
            f"bookkeeping): {it['total_us'] / 1000:.1f} ms over {it['modules']} modules; "
            f"modules of cumulative >= {args.importtime_min_ms:g} ms, in import order:"
        )
        print(f"  {'self ms':>8s} {'cum ms':>8s}  module")
        for r in it["rows"]:
            if r["cum_us"] >= args.importtime_min_ms * 1000:
                print(
                    f"  {r['self_us'] / 1000:8.1f} {r['cum_us'] / 1000:8.1f}  "
                    f"{'  ' * r['depth']}{r['module']}"
                )

    if split.get("profile"):
        print()
        print(
            "--- profile: one in-process cli_sbatch.main (cProfile, by cumulative time; "
            "cProfile inflates small calls)"
        )
        print(split["profile"].strip())

    print_verdicts(rows)
    print(
        "ratio = median / baseline median (what the target is judged on); "
        "min ratio = min / baseline min; dispatch-sbatch, sbatch and submitit run through "
        "runuser, the bare interpreter start does not (runuser cancels out of the "
        "difference)"
    )


def print_verdicts(rows: list[dict[str, Any]]) -> None:
    """The verdict table (:func:`verdicts`' rows), after a blank line (also bench_submit_api)."""
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
                ms(r["median_ns"]),
                ms(r["min_ns"]),
                r["baseline"],
                ms(r["baseline_median_ns"]),
                ms(r["baseline_min_ns"]),
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


def bench_folder(
    layout: sandbox_layout.Layout, user: str, prefix: str, files: list[tuple[str, str, int]]
) -> str:
    """A scratch folder ``user`` owns under the sandbox's ``bench/``, holding ``files`` (name,
    text, mode), with submitit in the sandbox venv (also bench_submit_api)."""
    parent = layout.root / "bench"
    parent.mkdir(mode=0o755, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=prefix, dir=parent)
    entry = pwd.getpwnam(user)
    os.chown(scratch, entry.pw_uid, entry.pw_gid)
    os.chmod(scratch, 0o755)
    has = subprocess.run(
        [str(layout.venv_bin / "python"), "-c", "import submitit"], capture_output=True
    )
    if has.returncode != 0:  # the peer a user would pick instead, from PyPI
        subprocess.run(
            [str(layout.venv_bin / "python"), "-m", "pip", "install", "-q", "submitit"], check=True
        )
    for name, text, mode in files:
        path = os.path.join(scratch, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, mode)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return scratch


def sandbox_options(p: argparse.ArgumentParser, default_dir: str, nodes: int = 1) -> None:
    """The options of a bench on its own sandbox (also bench_submit_api, bench_controller)."""
    p.add_argument(
        "--dir",
        default=default_dir,
        help=f"the bench's own sandbox state folder (default {default_dir})",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=nodes,
        help=f"nodes of the bench sandbox (default {nodes}"
        + (": held jobs never run)" if nodes == 1 else ")"),
    )
    p.add_argument(
        "--user",
        default=sandbox_layout.DEFAULT_USER,
        help=f"the sandbox user (default {sandbox_layout.DEFAULT_USER})",
    )
    p.add_argument(
        "--keep", action="store_true", help="leave the sandbox running and keep the scratch folder"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sandbox_options(p, DEFAULT_DIR)
    p.add_argument(
        "--count",
        type=int,
        default=30,
        help="timed submissions of each command, interleaved (default 30)",
    )
    p.add_argument(
        "--split-count",
        type=int,
        default=10,
        help="fresh processes of each kind for the time split (default 10)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile one in-process cli_sbatch.main (untimed)",
    )
    p.add_argument("--profile-lines", type=int, default=25, help=argparse.SUPPRESS)
    p.add_argument(
        "--importtime-min-ms",
        type=float,
        default=1.5,
        help="show importtime modules of at least this cumulative time (default 1.5)",
    )
    p.add_argument("--fail-on-miss", action="store_true", help="exit 1 when the target is missed")
    p.add_argument(
        "--baseline-src",
        metavar="PATH",
        help="another commit's source tree whose dispatch-sbatch is timed side by "
        "side (e.g. git archive COMMIT | tar -x -C PATH)",
    )
    args = p.parse_args(argv)
    if args.count < 1 or args.split_count < 1:
        p.error("--count and --split-count must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "bench_sbatch.py must run as root: it starts the sandbox's daemons and runs "
            "commands as the sandbox user through runuser",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    say(
        args,
        f"sandbox {args.dir}: up ({args.nodes} node(s), installing {REPO_ROOT} into its "
        "venv if it changed)",
    )
    report = sandbox.up(args.dir, nodes=args.nodes, user=args.user, source=REPO_ROOT)
    state = report.status
    layout = sandbox_layout.Layout(Path(state.dir))
    results: dict[str, Any] = {
        "sandbox": {"up_seconds": report.seconds, "up_actions": report.actions},
    }
    scratch = bench_folder(
        layout,
        state.user,
        "run-",
        [
            ("job.sh", JOB_SCRIPT, 0o755),
            ("driver.py", DRIVER, 0o644),
            ("submitit_submit.py", SUBMITIT, 0o644),
        ],
    )
    cl = Cluster(state.dir, state.user, scratch)
    _, version = cl.run(["sbatch", "--version"], as_user=False)
    _, venv_python = cl.run(
        [
            os.path.join(cl.venv_bin, "python"),
            "-c",
            "import platform; print(platform.python_version())",
        ],
        as_user=False,
    )
    results["environment"] = {
        "python": platform.python_version(),
        "venv_python": venv_python.stdout.strip(),
        "slurm": version.stdout.strip(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "sandbox_dir": state.dir,
        "controller_port": layout.controller_port,
        "nodes": len(state.nodes),
        "user": state.user,
        "scratch": scratch,
        "dispatch_home": cl.env["DISPATCH_HOME"],
        "source": source_identity(),
    }
    jobs: list[str] = []
    try:
        say(args, f"submitting: 1 warm-up + {args.count} timed of each, interleaved")
        bench_submit(args, cl, jobs, results)
        say(args, f"time split: {args.split_count} rounds of {4 + 1 + len(PROBES)} fresh processes")
        bench_split(args, cl, jobs, results)
        bench_importtime(args, cl, results)
    finally:
        for i in range(0, len(jobs), 200):
            cl.run(["scancel", *jobs[i : i + 200]], as_user=False, check=False)
        _, queue = cl.run(["squeue", "-h", "-o", "%i"], as_user=False, check=False)
        left = sorted(set(queue.stdout.split()) & set(jobs))
        results["jobs"] = {"submitted": len(jobs), "still_queued_after_scancel": len(left)}
        say(
            args,
            f"cancelled {len(jobs)} held jobs"
            + (f" ({len(left)} still listed: {' '.join(left[:10])})" if left else ""),
        )
        results["environment"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.keep:
            say(args, f"kept {scratch} and the sandbox in {state.dir} (running)")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
            results["sandbox"]["down"] = sandbox.down(state.dir)
            say(
                args,
                f"removed {scratch}; sandbox stopped: " + "; ".join(results["sandbox"]["down"]),
            )
    rows = verdicts(results)
    results["verdicts"] = rows
    results["split"]["summary_ms"] = [
        {"part": label, "ms": round(value, 2)} for label, value in split_rows(results)
    ]
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_report(args, results, rows)
        print(
            f"elapsed {results['elapsed_s']} s end to end (sandbox up/down, "
            "cancellation and cleanup included)"
        )
    missed = [r for r in rows if r["result"] != "PASS"]
    return 1 if missed and args.fail_on_miss else 0


if __name__ == "__main__":
    sys.exit(main())
