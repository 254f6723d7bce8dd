"""Mutants: small deliberate breaks of the product, each put through a short soak.

``python -m soak.mutants [--minutes 3] [--seed S] [--only NAME ...] [--baseline]`` (as root;
``make mutants``): for each mutant, a scratch copy of this checkout's tracked files with the
one change applied, a soak of ``--minutes`` run from that copy (its sandbox's venv installs
the copy: the jobs, the launcher, the supervisor, ``dispatch-cease`` and the hooks are the
broken build), then the checker.  It prints a table of which invariant caught each mutant and
exits 1 when any was not caught: a soak that passes a broken build proves nothing.  Every
mutant's text must be found exactly once in the product (``tests/soak/test_mutants.py``
keeps them applying as the code moves).

The first four are builds an attack on the soak found it passing (seed 802312, 3 minutes); the
rest give each invariant at least one (the last two, docs/user-guide.md's "No progress, no more
restarts" and "A poisoned save is passed over": a job that never makes progress restarted for
its whole budget, a poisoned save never marked).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# $DISPATCH_MUTANTS_DIR and $DISPATCH_SANDBOX_DIR move them (a session of its own on a shared
# host; $DISPATCH_SANDBOX_USER names the job user, as for the soak).
WORK = Path(os.environ.get("DISPATCH_MUTANTS_DIR") or "/var/tmp/slurm-dispatch-mutants")
SANDBOX_DIR = os.environ.get("DISPATCH_SANDBOX_DIR") or str(WORK / "sandbox")


@dataclass(frozen=True)
class Edit:
    path: str  # relative to the checkout
    old: str  # found exactly once
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[Edit, ...]
    expected: tuple[str, ...]  # the invariants meant to catch it
    what: str


MUTANTS = (
    Mutant(
        "latest-ignores-epoch",
        (
            Edit(
                "slurm_dispatch/checkpoint/stores/posix.py",
                "    name = max(names)\n",
                "    name = max(names, key=lambda n: n[21:41])  # MUTANT: the step alone\n",
            ),
        ),
        ("resume",),
        "latest publication by step alone: an old execution's later step outranks "
        "its replacement's newer epoch",
    ),
    # Both of cleanup's guards of a resume choice: the plan's, and the second look after the
    # publications are gone (either alone keeps the save: the soak rightly saw nothing lost).
    Mutant(
        "gc-spares-no-resume-choice",
        (
            Edit(
                "slurm_dispatch/checkpoint/gc.py",
                "            for chosen in each.chosen:\n"
                '                needed.setdefault(chosen, f"execution {each.attempt} chose it")\n',
                "            for chosen in ():  # MUTANT: no resume choice is needed\n"
                '                needed.setdefault(chosen, f"execution {each.attempt} chose it")\n',
            ),
            Edit(
                "slurm_dispatch/checkpoint/gc.py",
                "            for chosen in f.chosen:\n"
                '                spared[chosen] = f"execution {attempt} chose it"\n',
                "            for chosen in ():  # MUTANT: nor spared after a second look\n"
                '                spared[chosen] = f"execution {attempt} chose it"\n',
            ),
        ),
        ("needed-missing",),
        "cleanup keeps the K latest but not what a live execution resumed from",
    ),
    Mutant(
        "launcher-skips-shared-claim",
        (
            Edit(
                "slurm_dispatch/execution/launch.py",
                "        claim_shared(job, submission, env)\n",
                "        pass  # MUTANT: no claim of the submission\n",
            ),
        ),
        ("shared-overlap", "lifted-while-writing"),
        "a shared job's second execution of one submission runs the script too",
    ),
    Mutant(
        "ended-counted-as-ceased",
        (
            Edit(
                "slurm_dispatch/node/cease.py",
                "    verdict.ceased = not unproven\n",
                "    verdict.ceased = True  # MUTANT: ended is ceased\n",
            ),
        ),
        ("lifted-while-writing", "shared-overlap"),
        "dispatch-cease answers ceased once Slurm says the job ended",
    ),
    # One for each of the other five invariants.
    Mutant(
        "fallback-skips-own-saves",
        (
            Edit(
                "slurm_dispatch/execution/saves.py",
                "            if folder is not None\n"
                "            and folder_of(root, f.path) == folder\n",
                "            if False  # MUTANT\n"
                "            and folder_of(root, f.path) == folder\n",
            ),
        ),
        ("fallback",),
        "a save that cannot be loaded is passed over for what its execution resumed from "
        "(or a fresh start), past that execution's own earlier saves",
    ),
    Mutant(
        "gc-leaves-publications",
        (
            Edit(
                "slurm_dispatch/checkpoint/gc.py",
                "    st.delete_publications(\n"
                "        sorted({n for r in found.removals"
                " for n in r.publications if n in present})\n"
                "    )\n",
                "    pass  # MUTANT: the saves go, their publications stay\n",
            ),
        ),
        ("pub-missing-save",),
        "cleanup removes a save below the K latest and leaves its publication naming it",
    ),
    Mutant(
        "supervisor-ignores-claim",
        (
            Edit(
                "slurm_dispatch/control/supervisor.py",
                "            return None  # another supervisor made this claim first: it submits\n",
                "            pass  # MUTANT: another supervisor claimed it; submitted anyway\n",
            ),
        ),
        ("double-submit",),
        "a pass whose claim of submission N+1 failed submits it anyway: two supervisors' "
        "passes both submit it",
    ),
    Mutant(
        "supersede-cancels-nothing",
        (
            Edit(
                "slurm_dispatch/control/submit.py",
                "        slurm.cancel(live, env)\n        # A controller that restarts",
                "        live = []  # MUTANT: the superseded job runs on\n"
                "        # A controller that restarts",
            ),
            Edit(
                "slurm_dispatch/control/supervisor.py",
                "        if not again:\n            return\n",
                "        if True:  # MUTANT: nor cancelled again\n            return\n",
            ),
        ),
        ("not-ended",),
        "--supersede leaves the old job running, and the supervisor never cancels it",
    ),
    # Both: the part's own last line exits 0 whatever its Python did (a Python change alone
    # went through a soak uncaught).
    Mutant(
        "epilog-fails-the-node",
        (
            Edit(
                "slurm_dispatch/hooks/__init__.py",
                "    _wait_child(pid, read_end, started, hint, job)\n    _exit()\n",
                "    _wait_child(pid, read_end, started, hint, job)\n"
                '    os._exit(1 if hint == "epilog" else 0)  # MUTANT: the Epilog fails\n',
            ),
            Edit(
                "contrib/epilog.d/05-dispatch",
                "fi\nexit 0\n",
                "fi\nexit $?  # MUTANT: the part passes its Python's status on\n",
            ),
        ),
        ("drained-by-us",),
        "the Epilog part exits with its Python's status, 1: Slurm drains the node",
    ),
    # The recovery rules' two (docs/user-guide.md): a job that never makes progress, and a
    # poisoned save.
    Mutant(
        "no-progress-never-stops",
        (
            Edit(
                "slurm_dispatch/control/noprogress.py",
                "    if not rules.stalled(went, limit):\n        return None\n",
                "    if True:  # MUTANT: no lineage ever stalls\n        return None\n",
            ),
        ),
        ("no-progress",),
        "the supervisor never finds executions in a row without progress: a job that "
        "crashes before its first save is restarted for its whole budget",
    ),
    Mutant(
        "quarantine-marks-nothing",
        (
            Edit(
                "slurm_dispatch/control/supervisor.py",
                "            quarantine.mark(root, found.resumed_from[0])\n",
                "            pass  # MUTANT: the poisoned save is recorded, never marked\n",
            ),
        ),
        ("quarantine",),
        "the supervisor records a poisoned save's quarantine but never marks it: every "
        "restart resumes from it again",
    ),
)


def apply(mutant: Mutant, tree: Path) -> None:
    """Make ``mutant``'s changes in the checkout at ``tree``; each text must be there once."""
    for edit in mutant.edits:
        path = tree / edit.path
        text = path.read_text(encoding="utf-8")
        found = text.count(edit.old)
        if found != 1:
            raise ValueError(
                f"mutant {mutant.name}: its text is in {edit.path} {found} times, "
                "not once: the product moved; update soak/mutants.py"
            )
        path.write_text(text.replace(edit.old, edit.new), encoding="utf-8")


def scratch_copy(dest: Path) -> None:
    """This checkout's tracked files (as they are on disk) at ``dest``, made anew."""
    shutil.rmtree(dest, ignore_errors=True)
    files = (
        subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True, capture_output=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source = REPO / name
        if not source.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def run_soak(tree: Path, minutes: float, seed: int, log: Path) -> Optional[str]:
    """A soak from the checkout at ``tree``; the run folder it made (None: it made none)."""
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        DISPATCH_SANDBOX_DIR=SANDBOX_DIR,
        SOAK_DRAIN=os.environ.get("SOAK_DRAIN", "90"),
    )
    with open(log, "w", encoding="utf-8") as out:
        subprocess.run(
            [sys.executable, "-m", "soak.run", "--minutes", str(minutes), "--seed", str(seed)],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    found = re.search(r"run folder (\S+)", log.read_text(encoding="utf-8", errors="replace"))
    return found.group(1) if found else None


def caught_by(run_dir: str) -> tuple[list[str], list[str]]:
    """(the invariants with a violation, the cases not made) of a finished run folder."""
    from . import cases, checker

    result = checker.check_folder(run_dir)
    with open(os.path.join(run_dir, "final.json"), encoding="utf-8") as f:
        made = json.load(f).get("cases") or {}
    return ([name for name, found in result.violations.items() if found], cases.missing(made))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m soak.mutants", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=802312)
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="this mutant only (repeatable); names: " + ", ".join(m.name for m in MUTANTS),
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="first a soak of the unbroken build, which must pass",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)}")
    if os.geteuid() != 0:
        print("the mutants' soaks need root: they run the sandbox and its faults", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    for each in chosen:  # each applies before any soak is run
        scratch_copy(WORK / "check")
        apply(each, WORK / "check")
    rows: list[list[str]] = []
    failed = False
    todo: list[Optional[Mutant]] = [None] if args.baseline else []
    for mutant in [*todo, *chosen]:
        name = mutant.name if mutant else "(none: the build as it is)"
        tree = WORK / (mutant.name if mutant else "baseline") / "src"
        scratch_copy(tree)
        if mutant:
            apply(mutant, tree)
        log = tree.parent / "soak.log"
        began = time.monotonic()
        print(
            f"mutants: {name}: a {args.minutes:g}-minute soak, seed {args.seed} ({log})", flush=True
        )
        run_dir = run_soak(tree, args.minutes, args.seed, log)
        took = f"{(time.monotonic() - began) / 60:.1f} min"
        if run_dir is None:
            rows.append([name, "-", "the soak made no run folder (see its log)", took])
            failed = True
            continue
        caught, not_made = caught_by(run_dir)
        if mutant is None:
            ok = not caught and not not_made
            verdict = "passes" if ok else "FAILS: " + ", ".join(caught + not_made)
        else:
            ok = bool(caught)
            verdict = ("caught by " + ", ".join(caught)) if ok else "NOT CAUGHT"
            if not_made:
                verdict += f" (cases not made: {', '.join(not_made)})"
        failed |= not ok
        rows.append([name, ", ".join(mutant.expected) if mutant else "-", verdict, took])
    from slurm_dispatch._table import render_table

    print(render_table(["MUTANT", "MEANT FOR", "RESULT", "TOOK"], rows), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
