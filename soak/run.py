"""The soak: a workload of dispatch jobs on the real sandbox, a seeded nemesis, then the checker.

``python -m soak.run --minutes M --seed S [--nodes 8]`` (as root; ``make soak``).  It brings a
sandbox of its own up (``$DISPATCH_SANDBOX_DIR``, default /var/tmp/slurm-dispatch-soak, with the
job user ``$DISPATCH_SANDBOX_USER``, default dispatchsoak), makes a run folder in the
job user's home, and for M minutes keeps a workload of dispatch jobs of every kind going, all
through the product's own commands run as the user: isolated trainers publishing with
``dispatch publish`` (some with a resubmit budget that fail on purpose now and then),
``dispatch watch --keep`` trainers, an array with a root per task, a ``--shared-checkpoint``
job, a ``dispatch watch`` trainer on an ``s3://`` root (SeaweedFS, tests/s3server.py), a job
depending on another, a job superseded mid-run; two ``dispatch supervise --loop`` beside
them (a site's unit and a person's own run: each submission's claim must keep them from
submitting it twice, which the queue's markers show, polled all the run), ``dispatch gc`` now
and then.  Meanwhile the nemesis, at moments drawn from the
seed (printed first, so a run can be replayed), partitions a node and heals it, kills a slurmd
and starts it again, SIGKILLs slurmctld and starts it again, requeues and cancels running
executions, preempts one (a short job of the sandbox's urgent partition on its node),
SIGKILLs the supervisor mid-pass and gc mid-run, SIGSTOPs the S3 server for longer than the
S3 watch's timeout.  Besides, whatever the seed, every run makes the cases each invariant
needs (:mod:`soak.cases`: a shared job's launch run again by a controller, a running shared
and a running isolated execution cut off, a cleanup beside a live resumed execution, a torn
save), and fails when it could not make one.  Then every fault is healed, the jobs are given
time to end, and :mod:`soak.checker` prints its table; exit 1 on a violation.  The targets of
a fault (which job, which node) are drawn from the seed among what is running then, so a
replay repeats the schedule, not every pick.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from slurm_dispatch.control import record
from slurm_dispatch.sandbox import clients, cluster, daemons, network, slurm_conf
from slurm_dispatch.sandbox.layout import Layout, state_dir
from slurm_dispatch.slurm import hostlist

from . import cases as cases_module
from . import checker, history

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SANDBOX_DIR = "/var/tmp/slurm-dispatch-soak"
SANDBOX_USER = "dispatchsoak"
FAULTS = (
    "partition",
    "slurmd-kill",
    "slurmctld-kill",
    "requeue",
    "scancel",
    "preempt",
    "supervisor-kill",
    "gc-kill",
    "s3-stop",
    "tear",
)
BUCKET = "soak"
S3_TIMEOUT = 10  # the S3 watch's --timeout; the nemesis stops the server longer than that
CESSATION_INTERVAL = 5  # the soak's dispatch.conf: how often a standing hold's signal is asked
SHARED = cases_module.SHARED


log = cases_module.log


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        # A sandbox and a job user of the soak's own by default: 8 nodes, and records that
        # the real tier's sessions never see.
        self.directory = os.environ.get("DISPATCH_SANDBOX_DIR") or SANDBOX_DIR
        self.user = os.environ.get("DISPATCH_SANDBOX_USER") or SANDBOX_USER
        self.faults: list[dict[str, Any]] = []
        self.jobs: dict[str, dict[str, Any]] = {}  # dispatch job id -> kind, root, shared
        self.drains: dict[tuple[str, str], bool] = {}
        self.supervisor: Optional[subprocess.Popen[bytes]] = None
        self.second: Optional[subprocess.Popen[bytes]] = None  # another supervisor, beside it
        self.marked: dict[str, set[str]] = {}  # marker -> the Slurm jobs seen carrying it
        self.pending_heals: list[tuple[float, str, str]] = []  # (when, kind, target)
        self.urgent: dict[str, str] = {}  # node -> the urgent job preempting there
        self.counter = 0
        self.keeps: dict[str, int] = {}  # root -> the least K of the cleanups run on it
        self.pins: dict[str, list[str]] = {}  # root -> saves pinned (relative to it)
        self.torn: list[dict[str, Any]] = []  # saves the nemesis removed: root, path, t
        self.watch_roots: set[str] = set()  # roots a dispatch watch --keep cleans up
        self.cases = cases_module.Cases(self)
        # Heals run on their own thread: a dispatch-sbatch retrying while slurmctld is down
        # must not keep the controller down longer than the nemesis chose.
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # -- the sandbox and the user ------------------------------------------------------------

    def up(self) -> None:
        report = cluster.up(self.directory, nodes=self.args.nodes, user=self.user, source=REPO)
        self.layout = Layout(state_dir(self.directory))
        self.nodes = [n.name for n in report.status.nodes]
        entry = pwd.getpwnam(self.user)
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, entry.pw_dir
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DISPATCH_"))
        }
        self.env.update(clients.environment(self.directory, user=self.user))
        self.user_env = dict(
            self.env, HOME=self.home, USER=self.user, LOGNAME=self.user, DISPATCH_LISTING_LAG="0.5"
        )
        self.python = str(self.layout.venv_bin / "python3")
        # The S3 root: SeaweedFS on loopback (tests/s3server.py), boto3 in the sandbox's venv.
        if subprocess.run([self.python, "-c", "import boto3"], capture_output=True).returncode:
            subprocess.run(
                [
                    self.python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "-c",
                    str(REPO / "tests" / "constraints.txt"),
                    "boto3>=1.35",
                ],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        # On the sandbox's bridge address: each node has its own network namespace, whose
        # loopback is its own (slurm_dispatch/sandbox/network.py).
        from tests.s3server import SeaweedServer

        self.s3 = SeaweedServer(address=network.net_of(self.layout).host_address).start()
        self.s3.make_bucket(BUCKET)
        aws = dict(
            self.s3.env(),
            AWS_CONFIG_FILE="/nonexistent/aws-config",
            AWS_SHARED_CREDENTIALS_FILE="/nonexistent/aws-credentials",
        )
        self.user_env.update(aws)
        os.environ.update(aws)  # the runner's own reads of the root at the end

    def as_user(
        self, argv: list[str], timeout: float = 60, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd=self.run_dir,
            env=self.user_env,
            text=True,
            capture_output=True,
            timeout=timeout,
            **kw,
        )

    def spawn_user(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd=self.run_dir,
            env=self.user_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def slurm(self, argv: list[str], timeout: float = 20) -> str:
        try:
            proc = subprocess.run(
                argv, env=self.env, text=True, capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return ""
        return proc.stdout if proc.returncode == 0 else ""

    def make_run_dir(self) -> None:
        self.run_dir = os.path.join(self.home, f"soak-{self.args.seed}-{int(time.time())}")
        os.mkdir(self.run_dir, 0o755)
        for sub in ("history", "out"):
            os.mkdir(os.path.join(self.run_dir, sub), 0o755)
        for name in ("trainer.py", "history.py"):
            shutil.copy(HERE / name, os.path.join(self.run_dir, name))
        for path in [self.run_dir, *glob.glob(os.path.join(self.run_dir, "*"))]:
            os.chown(path, self.uid, self.gid)
        self.history = os.path.join(self.run_dir, "history")
        self.user_env["SOAK_HISTORY"] = self.history
        # This run's records of its own (DISPATCH_HOME in the run folder): the supervisor acts
        # on them only, never on an earlier run's, and they stay with the run's histories.
        self.records = os.path.join(self.run_dir, "records")
        os.mkdir(self.records, 0o700)
        os.chown(self.records, self.uid, self.gid)
        self.user_env["DISPATCH_HOME"] = self.records
        # The site's settings as the sandbox installs them, the supervisor asking its
        # CessationSignal (dispatch-cease) every CESSATION_INTERVAL while a hold stands, so
        # that holds are lifted by a ceased answer within the run.
        conf = os.path.join(self.run_dir, "dispatch.conf")
        with open(os.path.join(self.layout.etc, "dispatch.conf"), encoding="utf-8") as f:
            site = [
                line
                for line in f.read().splitlines()
                if not line.lower().startswith(("cessationsignal=", "cessationinterval="))
            ]
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                "\n".join(
                    [
                        *site,
                        "CessationSignal=dispatch-cease",
                        f"CessationInterval={CESSATION_INTERVAL}",
                    ]
                )
                + "\n"
            )
        self.user_env["SLURM_DISPATCH_CONF"] = conf

    def cancel_leftovers(self) -> None:
        """Cancel the user's Slurm jobs an earlier run left in this sandbox (a run killed before
        its end): they would hold nodes and count as this run's.  Their records stay in that
        run's folder."""
        left = [line.split()[0] for line in self.active() if line.strip()]
        if left:
            log(f"cancelling {len(left)} Slurm job(s) an earlier run left: {' '.join(left)}")
            self.slurm(["scancel", *left])

    # -- the workload --------------------------------------------------------------------------

    def script(self, mode: str, keep: int = 2) -> str:
        trainer = f"{self.python} {self.run_dir}/trainer.py"
        body = {
            "publish": f"exec {trainer} publish",
            "shared": f"exec {trainer} shared",
            "watch": (
                f"dispatch watch --interval 0.5 --keep {keep} -- {trainer} watch "
                f"2>&1 | {trainer} stamp"
            ),
            "s3watch": (
                f"dispatch watch --interval 0.5 --timeout {S3_TIMEOUT} --keep "
                f"{keep} -- {trainer} watch 2>&1 | {trainer} stamp"
            ),
        }[mode]
        return f"#!/bin/bash\nset -o pipefail\n{body}\n"

    def submit(
        self,
        kind: str,
        *extra: str,
        root: Optional[str] = None,
        env: Optional[dict[str, str]] = None,
    ) -> Optional[str]:
        self.counter += 1
        mode = {
            "watch": "watch",
            "shared": "shared",
            "shared-failing": "shared",
            "shared-relaunch": "shared",
            "s3": "s3watch",
        }.get(kind, "publish")
        name = f"{kind}-{self.counter}"
        path = os.path.join(self.run_dir, f"{name}.sh")
        root = root or os.path.join(self.run_dir, f"ck-{name}")
        keep = self.rng.randint(1, 3)  # each watch job's own --keep
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.script(mode, keep))
        os.chown(path, self.uid, self.gid)
        if mode in ("watch", "s3watch"):
            self.cleaned(root, keep)
            self.watch_roots.add(root)
        argv = [
            "dispatch-sbatch",
            "--checkpoint",
            root,
            *extra,
            "-J",
            name,
            "-o",
            os.path.join(self.run_dir, "out", "%x-%j.out"),
            path,
        ]
        saved = dict(self.user_env)
        self.user_env.update({"SOAK_STEPS": str(self.rng.randint(30, 70)), **(env or {})})
        try:
            proc = self.as_user(argv)
        except subprocess.TimeoutExpired:
            log(f"submit {name}: dispatch-sbatch timed out")
            return None
        finally:
            self.user_env = saved
        if proc.returncode != 0:
            log(f"submit {name}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            return None
        found = re.search(r"^Dispatch job (\S+) ", proc.stdout, re.M)
        if found is None:
            log(f"submit {name}: no dispatch job id in {proc.stdout!r}")
            return None
        job = found.group(1)
        self.jobs[job] = {"kind": kind, "root": root, "shared": mode == "shared", "name": name}
        log(f"submitted {name} as {job}{' ' + ' '.join(extra) if extra else ''}")
        return job

    def submit_some(self) -> None:
        # A shared job all the run long, not only the first wave's (over 5 minutes into seed
        # 239998's 30-minute run, which then checked 1 hold lifted and 1 pair of shared
        # executions): its holds, and the partitions of its node, come all the run.
        if not self.shared_active():
            self.submit(
                "shared-failing",
                *SHARED,
                "--resubmit",
                "3",
                env={"SOAK_STEPS": "60", "SOAK_FAIL": "0.15"},
            )
            return
        kind = self.rng.choice(["publish", "publish", "publish", "failing", "watch"])
        if kind == "failing":
            self.submit(kind, "--resubmit", "3", env={"SOAK_FAIL": "0.08"})
        elif kind == "watch":
            self.submit(kind, "--resubmit", "1")
        else:
            self.submit(kind, "--resubmit", "2")

    def first_wave(self) -> None:
        for _ in range(5):
            self.submit("publish", "--resubmit", "2")
        self.submit("failing", "--resubmit", "3", env={"SOAK_FAIL": "0.08"})
        self.submit("failing", "--resubmit", "3", env={"SOAK_FAIL": "0.08"})
        self.submit("watch", "--resubmit", "1")
        self.submit("watch", "--resubmit", "1")
        self.submit(
            "array",
            "--array",
            "0-2",
            "--resubmit",
            "2",
            root=os.path.join(self.run_dir, "ck-array-%a"),
        )
        # Long enough for the nemesis to hit it (its restarts become holds), short enough to
        # end within the run when nothing does.
        steps = int(min(300, max(30, self.args.minutes * 30)))
        self.submit("shared", *SHARED, "--resubmit", "1", env={"SOAK_STEPS": str(steps)})
        # Fails on purpose now and then: each failure is a hold (a shared checkpoint), which
        # dispatch-cease proves ceased a moment later, so holds are made and lifted in the run.
        self.submit(
            "shared-failing",
            *SHARED,
            "--resubmit",
            "3",
            env={"SOAK_STEPS": "60", "SOAK_FAIL": "0.15"},
        )
        self.submit(
            "s3", "--resubmit", "3", root=f"s3://{BUCKET}/{os.path.basename(self.run_dir)}/s3-1"
        )
        first = self.submit("before", "--resubmit", "1", env={"SOAK_STEPS": "20"})
        if first:
            self.submit("dependent", f"--dependency=afterany:{first}", "--resubmit", "1")
        self.superseded = self.submit("superseded", "--resubmit", "1", env={"SOAK_STEPS": "400"})

    def supersede(self) -> None:
        old = getattr(self, "superseded", None)
        if old:
            self.submit(
                "superseding", "--supersede", old, "--resubmit", "1", root=self.jobs[old]["root"]
            )
            self.superseded = None

    def ensure_supervisor(self) -> None:
        if self.supervisor is None or self.supervisor.poll() is not None:
            self.supervisor = self.spawn_user(
                ["dispatch", "supervise", "--loop", "--interval", "5"]
            )
        if self.second is None or self.second.poll() is not None:
            # A second one (a person's beside the site's), its passes at their own moments:
            # only the claims keep the two from submitting one submission twice.
            self.second = self.spawn_user(["dispatch", "supervise", "--loop", "--interval", "3"])

    def watch_markers(self) -> None:
        """Note which Slurm jobs (an array's by its array job id) carry each submission's
        marker now: a submission made twice shows here, not in its record."""
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "PD,R,CG,S", "-o", "%F|%k"])
        for line in out.splitlines():
            slurm_id, _, comment = line.partition("|")
            for word in comment.split():
                if word.startswith("dispatch:") and slurm_id.strip():
                    self.marked.setdefault(word, set()).add(slurm_id.strip())

    def gc(self, kill_after: Optional[float] = None) -> None:
        roots = sorted(
            {
                ex["root"]
                for ex in self.jobs.values()
                if not ex["shared"]
                and "%a" not in ex["root"]
                and not ex["root"].startswith("s3://")
            }
        )
        if not roots:
            return
        root = self.rng.choice(roots)
        if not os.path.isdir(os.path.join(root, "pub")):
            return
        keep = self.rng.randint(1, 3)
        names = self.pub_names(root)
        if len(names) > keep and self.rng.random() < 0.3:
            # Pin a save cleanup would take otherwise: gc and watch --keep must keep it.
            save = checker.model.parse_name(names[0]).path
            if (
                self.as_user(
                    ["dispatch", "pin", "--root", root, os.path.join(root, save)]
                ).returncode
                == 0
            ):
                self.pins.setdefault(root, []).append(save)
                log(f"pinned {save} of {root}")
        self.cleanup(root, keep, kill_after)

    def cleanup(self, root: str, keep: int, kill_after: Optional[float] = None) -> dict[str, Any]:
        """``dispatch gc --keep KEEP`` on ``root`` as the user (SIGKILLed ``kill_after`` seconds
        in, when given); then what it left of the live executions' resume sources."""
        self.cleaned(root, keep)
        started = time.time()
        proc = self.spawn_user(["dispatch", "gc", "--root", root, "--keep", str(keep)])
        if kill_after is None:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        else:
            time.sleep(kill_after)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return self.cases.after_cleanup(root, keep, started)

    def cleaned(self, root: str, keep: int) -> None:
        self.keeps[root] = min(self.keeps.get(root, keep), keep)

    def tear(self) -> str:
        """Remove the save of a running publishing job's latest publication (a lost disk, a
        person's rm) and requeue the job: its next execution is handed that save and must fall
        back along its lineage.  The target, or "" when no job fits."""
        by_name = {
            info["name"]: info["root"]
            for info in self.jobs.values()
            if info["kind"] in ("publish", "failing")
        }
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "R", "-o", "%j %i"])
        running = dict(line.split()[:2] for line in out.splitlines() if len(line.split()) == 2)
        fit = sorted(n for n in by_name if n in running and self.pub_names(by_name[n]))
        if not fit:
            return ""
        name = self.rng.choice(fit)
        root = by_name[name]
        save = checker.model.parse_name(self.pub_names(root)[-1]).path
        shutil.rmtree(os.path.join(root, save), ignore_errors=True)
        self.torn.append({"root": root, "path": save, "t": time.time()})
        self.slurm(["scontrol", "requeue", running[name]])
        return f"{root}/{save} ({running[name]} requeued)"

    def active(self) -> list[str]:
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "PD,R,CG,S", "-o", "%i %t"])
        return out.split("\n") if out else []

    def shared_active(self) -> bool:
        """Whether one of our shared jobs is pending (held too) or running."""
        names = {info["name"] for info in self.jobs.values() if info["shared"]}
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "PD,R,CG,S", "-o", "%j"])
        return bool(names & set(out.split()))

    def shared_nodes(self) -> list[str]:
        names = {info["name"] for info in self.jobs.values() if info["shared"]}
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "R", "-o", "%j %N"])
        return sorted(
            {
                line.split()[1]
                for line in out.splitlines()
                if len(line.split()) == 2 and line.split()[0] in names
            }
        )

    def running(self) -> list[str]:
        """Our running Slurm jobs, but those the cases follow (the no-progress, poisoned-save
        and isolated-overlap cases': a cancel or requeue would spoil them before they are
        made)."""
        spared = {
            info["name"] for info in self.jobs.values() if info["kind"] in cases_module.SPARED_KINDS
        }
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "R", "-o", "%i %j"])
        return [
            line.split()[0]
            for line in out.splitlines()
            if len(line.split()) == 2 and line.split()[1] not in spared
        ]

    def nodes_of(self, name: str) -> list[str]:
        """The nodes where our running job named ``name`` runs now."""
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "R", "-n", name, "-o", "%N"])
        return sorted({node for line in out.split() for node in hostlist.expand_hostlist(line)})

    def batch_hosts(self) -> list[str]:
        """The nodes where one of our executions' batch scripts runs now."""
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "R", "-o", "%B"])
        return sorted(set(out.split()) & set(self.nodes))

    def watch_drains(self) -> None:
        out = self.slurm(["sinfo", "-R", "-h", "-o", "%N|%E"])
        for line in out.splitlines():
            node, _, reason = line.partition("|")
            ours = any(w in reason.lower() for w in ("prolog", "epilog", "dispatch"))
            self.drains[(node, reason)] = ours

    # -- the nemesis ----------------------------------------------------------------------------

    def fault(self, kind: str) -> None:
        target = ""
        busy = {t for _, k, t in self.pending_heals}
        if kind in ("partition", "slurmd-kill"):
            free = [n for n in self.nodes if n not in busy]
            if not free or len(busy) >= 2:
                return
            target = self.rng.choice(free)
            if kind == "partition":
                # Half the time the node of a running shared job: its hold must wait until
                # the cut-off execution is proven gone, though that one still writes.
                shared = [n for n in self.shared_nodes() if n in free]
                if shared and self.rng.random() < 0.5:
                    target = self.rng.choice(shared)
                cluster.partition(target, self.directory)
                heal_in = self.rng.uniform(30, 75)
            else:
                pid = daemons.live_pid(daemons.slurmd(self.layout, target))
                if pid is None:
                    return
                os.kill(pid, signal.SIGKILL)
                heal_in = self.rng.uniform(5, 25)
            self.pending_heals.append((time.monotonic() + heal_in, kind, target))
        elif kind == "slurmctld-kill":
            if "slurmctld" in busy:
                return
            pid = daemons.live_pid(daemons.slurmctld(self.layout))
            if pid is None:
                return
            os.kill(pid, signal.SIGKILL)
            target = "slurmctld"
            self.pending_heals.append((time.monotonic() + self.rng.uniform(3, 12), kind, target))
        elif kind in ("requeue", "scancel"):
            running = self.running()
            if not running:
                return
            target = self.rng.choice(sorted(running))
            argv = ["scontrol", "requeue", target] if kind == "requeue" else ["scancel", target]
            self.slurm(argv)
        elif kind == "preempt":
            # A short job of the urgent partition (a higher PriorityTier over the same nodes)
            # wanting the whole of a node where one of our executions runs: Slurm preempts
            # what holds the node (SIGTERM, SIGKILL KillWait later, requeued; a --no-requeue
            # job, as every shared one is, is killed and ends PREEMPTED).  Root's job, so the
            # workload's own counts never see it; scancelled when healed, if it did not end
            # first.
            hosts = [n for n in self.batch_hosts() if n not in busy]
            if not hosts:
                return
            target = self.rng.choice(hosts)
            hold = self.rng.uniform(10, 40)
            out = self.slurm(
                [
                    "sbatch",
                    "--parsable",
                    "-p",
                    slurm_conf.URGENT_PARTITION,
                    "--exclusive",
                    "-w",
                    target,
                    "-t",
                    "2",
                    "-J",
                    "soak-urgent",
                    "-o",
                    "/dev/null",
                    "-D",
                    "/tmp",
                    "--wrap",
                    f"sleep {hold:.0f}",
                ]
            )
            urgent = out.strip().split(";")[0]
            if not urgent:
                return
            self.urgent[target] = urgent
            self.pending_heals.append((time.monotonic() + hold + 15, kind, target))
            target = f"{target} (urgent job {urgent})"
        elif kind == "supervisor-kill":
            if self.supervisor is None or self.supervisor.poll() is not None:
                return
            time.sleep(self.rng.uniform(0, 5))  # somewhere in a pass or between two
            os.killpg(self.supervisor.pid, signal.SIGKILL)
            self.supervisor.wait()
            target = "dispatch supervise"
        elif kind == "s3-stop":
            if "s3" in busy:
                return
            os.kill(self.s3.pid, signal.SIGSTOP)
            target = "s3"
            self.pending_heals.append(
                (time.monotonic() + S3_TIMEOUT + self.rng.uniform(3, 10), kind, target)
            )
        elif kind == "tear":
            target = self.tear()
            if not target:
                return
        elif kind == "gc-kill":
            self.gc(kill_after=self.rng.uniform(0.2, 3.0))
            target = "dispatch gc"
        self.faults.append({"kind": kind, "t": time.time(), "target": target})
        log(f"nemesis: {kind} {target}")

    def healer(self) -> None:
        while not self.stopping.wait(0.5):
            self.heal_due()

    def heal_due(self, everything: bool = False) -> None:
        with self.lock:
            self._heal_due(everything)

    def _heal_due(self, everything: bool) -> None:
        now = time.monotonic()
        for item in list(self.pending_heals):
            when, kind, target = item
            if not everything and when > now:
                continue
            try:
                if kind == "slurmctld-kill":
                    cluster.start_controller(self.directory)
                elif kind == "s3-stop":
                    os.kill(self.s3.pid, signal.SIGCONT)
                elif kind == "preempt":
                    urgent = self.urgent[target]
                    self.slurm(["scancel", urgent])
                    # Healed once the controller says it is over (or forgot it), not when
                    # the controller did not answer.
                    left = subprocess.run(
                        ["squeue", "-h", "-j", urgent, "-t", "PD,R,CG,S", "-o", "%i"],
                        env=self.env,
                        text=True,
                        capture_output=True,
                        timeout=20,
                    )
                    if left.returncode or left.stdout.strip():
                        if "invalid job id" not in left.stderr.lower():
                            raise RuntimeError(
                                f"urgent job {urgent} not over yet: "
                                f"{(left.stdout + left.stderr).strip()}"
                            )
                    del self.urgent[target]
                else:
                    cluster.heal(target, self.directory, wait=False)
                log(f"healed {kind} {target}")
                self.pending_heals.remove(item)
            except Exception as exc:  # healing again next tick
                log(f"heal {kind} {target} failed, again later: {exc}")

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> int:
        log(
            f"seed {self.args.seed}, {self.args.minutes} minutes, {self.args.nodes} nodes "
            f"(replay: SOAK_SEED={self.args.seed})"
        )
        self.up()
        self.make_run_dir()
        log(f"run folder {self.run_dir}")
        self.cancel_leftovers()
        self.ensure_supervisor()
        self.cases.relaunch_shared()
        self.cases.submit_overlap()
        self.cases.submit_broken()
        self.first_wave()
        threading.Thread(target=self.healer, daemon=True).start()
        start = time.monotonic()
        end = start + self.args.minutes * 60
        next_fault = start + self.rng.uniform(10, 25)
        next_gc = start + self.rng.uniform(30, 60)
        supersede_at = start + (end - start) / 3
        while time.monotonic() < end:
            now = time.monotonic()
            self.ensure_supervisor()
            self.watch_drains()
            self.watch_markers()
            if now >= next_fault:
                try:
                    with self.lock:
                        self.fault(self.rng.choice(FAULTS))
                except Exception as exc:
                    log(f"nemesis fault failed: {exc}")
                next_fault = now + self.rng.uniform(8, 25)
            if now < end - 60:  # the cases every run makes, as soon as each can be
                try:
                    with self.lock:
                        self.cases.step()
                except Exception as exc:
                    log(f"case failed, again later: {exc}")
            if now >= next_gc:
                self.gc()
                next_gc = now + self.rng.uniform(30, 60)
            if supersede_at and now >= supersede_at:
                self.supersede()
                supersede_at = 0
            # No new job in the last minute: what runs then can end within the drain.
            if now < end - 60 and len(self.active()) < self.args.jobs:
                self.submit_some()
            time.sleep(2)
        log("nemesis done: healing every fault")
        self.stopping.set()
        while self.pending_heals:
            self.heal_due(everything=True)
            time.sleep(1)
        self.drain()
        return self.finish()

    def drain(self) -> None:
        deadline = time.monotonic() + self.args.drain
        log(f"waiting up to {self.args.drain:.0f} s for every job to end")
        while time.monotonic() < deadline:
            self.ensure_supervisor()
            self.watch_drains()
            self.watch_markers()
            if not self.unheld():
                break
            time.sleep(5)
        # What ended last is acted on by the supervisors' next passes (a stop for want of
        # progress is recorded then): two of the slower one's intervals.
        time.sleep(10)

    def unheld(self) -> list[str]:
        """Our jobs pending or running, but for those held (a shared job's hold waits for a
        person or the site's proof: the checker asks dispatch status why)."""
        out = self.slurm(["squeue", "-h", "-u", self.user, "-t", "PD,R,CG,S", "-o", "%i %r"])
        return [line for line in out.splitlines() if line.strip() and "JobHeld" not in line]

    def finish(self) -> int:
        final = self.gather()
        for each in (self.supervisor, self.second):
            if each is not None and each.poll() is None:
                os.killpg(each.pid, signal.SIGKILL)
        with open(os.path.join(self.run_dir, "final.json"), "w", encoding="utf-8") as f:
            json.dump(final, f, indent=1, sort_keys=True)
        result = checker.check(final, history.read(self.history))
        text = checker.table(result)
        not_made = cases_module.missing(final["cases"])
        self.s3.stop()
        with open(os.path.join(self.run_dir, "table.txt"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(text, flush=True)
        # Hand the sandbox back settled: what is left (a shared job's hold) is cancelled.
        left = [line.split()[0] for line in self.active() if line.strip()]
        if left:
            self.slurm(["scancel", *left])
        if not_made:
            print(
                f"the run did not make the case(s) {', '.join(not_made)}: the invariants "
                "they feed were not all examined",
                flush=True,
            )
        return 0 if result.ok and not not_made else 1

    def pub_names(self, root: str) -> list[str]:
        if not root.startswith("s3://"):
            pub = os.path.join(root, "pub")
            return sorted(os.listdir(pub)) if os.path.isdir(pub) else []
        bucket, _, prefix = root[len("s3://") :].partition("/")
        pages = (
            self.s3.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=bucket, Prefix=f"{prefix}/pub/")
        )
        return sorted(
            o["Key"].rsplit("/", 1)[1] for page in pages for o in page.get("Contents", [])
        )

    def present(self, root: str, path: str) -> bool:
        if not root.startswith("s3://"):
            return os.path.exists(os.path.join(root, path))
        bucket, _, prefix = root[len("s3://") :].partition("/")
        found = self.s3.client().list_objects_v2(
            Bucket=bucket, Prefix=f"{prefix}/{path}/", MaxKeys=1
        )
        return bool(found.get("Contents"))

    def gather(self) -> dict[str, Any]:
        facts = history.read(self.history)
        self.cases.settle(facts)
        jobs_dir = os.path.join(self.records, "jobs")
        submissions: list[dict[str, Any]] = []
        holds: list[dict[str, Any]] = []
        lifts: list[dict[str, Any]] = []
        jobs = []
        active_ids = {line.split()[0].split("_")[0] for line in self.active() if line.strip()}
        for job, info in self.jobs.items():
            path = os.path.join(jobs_dir, job)
            kept = record.JobRecord(path) if os.path.isdir(path) else None
            found = record_facts(job, kept.events() if kept is not None else [])
            submissions += found["submissions"]
            holds += found["holds"]
            lifts += found["lifts"]
            ids = {str(s["slurm_job_id"]).split("_")[0] for s in found["submissions"]}
            ended = not (ids & active_ids)
            stuck = None
            if not ended:
                proc = self.as_user(["dispatch", "status", job])
                words = proc.stdout.lower()
                if any(w in words for w in ("held", "hold", "stuck", "waiting")):
                    stuck = proc.stdout.strip().splitlines()[-1] if proc.stdout else None
            spec = kept.spec if kept is not None else {}
            jobs.append(
                {
                    "job": job,
                    "shared": info["shared"],
                    "ended": ended,
                    "stuck": stuck,
                    "kind": info["kind"],
                    "root": info["root"],
                    "max_no_progress": spec.get("max_no_progress", 0),
                    "quarantine_after": spec.get("quarantine_after", 0),
                    "started": found["started"],
                    "stops": found["stops"],
                    "quarantines": found["quarantines"],
                }
            )
        roots: dict[str, Any] = {}
        paths: dict[str, set[str]] = {}
        root_of: dict[str, str] = {}
        for fact in facts:
            if fact["ev"] == "start" and not fact.get("shared"):
                root_of[fact["attempt"]] = fact["root"]
                paths.setdefault(fact["root"], set())
                for source in (fact.get("resumed"), fact.get("loaded")):
                    if source:
                        paths[fact["root"]].add(checker._relative(fact["root"], source))
        for fact in facts:  # every save published: the fallbacks of a lineage
            if fact["ev"] == "published" and fact["attempt"] in root_of:
                paths[root_of[fact["attempt"]]].add(fact["path"])
        for root, wanted in paths.items():
            names = self.pub_names(root)
            for name in names:
                wanted.add(checker.model.parse_name(name).path)
            wanted |= set(self.pins.get(root, []))
            roots[root] = {
                "pubs": names,
                "keep": self.keeps.get(root, 0),
                "watch": root in self.watch_roots,
                "present": {p: self.present(root, p) for p in wanted},
            }
        return {
            "seed": self.args.seed,
            "minutes": self.args.minutes,
            "faults": self.faults,
            "roots": roots,
            "pins": self.pins,
            "torn": self.torn,
            "submissions": submissions,
            "jobs": jobs,
            "holds": holds,
            "lifts": lifts,
            "cases": self.cases.made,
            "cleanups": self.cases.cleanups,
            "marked": {m: sorted(ids) for m, ids in sorted(self.marked.items())},
            "drains": [
                {"node": n, "reason": r, "ours": o} for (n, r), o in sorted(self.drains.items())
            ],
            "run_dir": self.run_dir,
        }


def record_facts(job: str, events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What the checker reads of one dispatch job's record (its events as stored, oldest
    first): every submission, every hold made, every hold lifted (released by the cessation
    signal, a person or Slurm, or expired), with when; every execution the launcher started,
    every stop for want of progress and every save quarantined (docs/user-guide.md)."""
    found: dict[str, list[dict[str, Any]]] = {
        "submissions": [],
        "holds": [],
        "lifts": [],
        "started": [],
        "stops": [],
        "quarantines": [],
    }
    for event in events:
        kind = event.get("event") or ""  # the kind, as record.JobRecord.append stores it
        if kind == "submitted":
            found["submissions"].append(
                {
                    "job": job,
                    "submission": event["submission"],
                    "task": event.get("task"),
                    "slurm_job_id": str(event["slurm_job_id"]),
                }
            )
        elif kind == "hold":
            found["holds"].append(
                {
                    "job": job,
                    "t": event["time"],
                    "slurm_job_id": str(event["slurm_job_id"]),
                    "ended_slurm_job_id": str(event["ended_slurm_job_id"]),
                }
            )
        elif kind in ("released", "expired"):
            found["lifts"].append(
                {
                    "job": job,
                    "t": event["time"],
                    "kind": kind,
                    "by": event.get("by", ""),
                    "slurm_job_id": str(event["slurm_job_id"]),
                }
            )
        elif kind == "started":
            found["started"].append(
                {
                    "t": event["time"],
                    "attempt": event.get("attempt", ""),
                    "submission": event.get("submission"),
                    "restart": event.get("restart", 0),
                    "resume_from": event.get("resume_from", ""),
                }
            )
        elif kind == "no-progress":
            found["stops"].append(
                {
                    "t": event["time"],
                    "action": event.get("action", ""),
                    "limit": event.get("limit", 0),
                    "executions": event.get("executions", []),
                }
            )
        elif kind == "quarantined":
            found["quarantines"].append(
                {
                    "t": event["time"],
                    "save": event.get("save", ""),
                    "root": event.get("root", ""),
                    "executions": event.get("executions", []),
                }
            )
    return found


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m soak.run", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "30"))
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(10**6)),
    )
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("SOAK_NODES", "8")))
    parser.add_argument(
        "--jobs", type=int, default=14, help="keep at least this many Slurm jobs pending or running"
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=float(os.environ.get("SOAK_DRAIN", "240")),
        help="seconds to wait at the end for every job to end",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the soak needs root: it runs the sandbox and its faults", file=sys.stderr)
        return 2
    if args.nodes < 8:
        print(f"--nodes {args.nodes}: the soak runs on at least 8 nodes", file=sys.stderr)
        return 2
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
