"""Two clusters over one home, on two real sandboxes.

The session's sandbox is one cluster (ClusterName dispatch-sandbox); a second sandbox in the
folder beside it (``<dir>2``, or ``$DISPATCH_OTHER_SANDBOX_DIR``: its ports are derived from its
path and must not be another sandbox's; one node, ClusterName dispatch-other, MinJobAge 2 s, no
accounting) is the other.  One user submits to both with one DISPATCH_HOME, as over a shared
$HOME: each cluster's commands act on its own jobs only.  On the other cluster a failed job then
ages out of slurmctld (no accounting there) and is shown with its recorded end.

The second sandbox is left running, like the session's; `dispatch-sandbox down` with its
folder stops it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Sandbox, sandbox_of  # tests/real is no package: pytest puts it on sys.path

from slurm_dispatch.sandbox import accounting as sandbox_accounting
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import slurm_conf as sandbox_slurm_conf

pytestmark = pytest.mark.real

REPO_ROOT = Path(__file__).resolve().parents[2]
OTHER = "dispatch-other"
LONG = "#!/bin/bash\n#SBATCH --time=5\nsleep 300\n"
FAILING = "#!/bin/bash\n#SBATCH --time=5\necho failing on purpose; exit 3\n"


@pytest.fixture(scope="module")
def other(sandbox: Sandbox) -> Iterator[Sandbox]:
    """The second cluster: its own sandbox, the same job user (so the same home)."""
    saved = {
        k: os.environ.get(k)
        for k in (
            sandbox_slurm_conf.CLUSTER_ENV,
            sandbox_slurm_conf.MIN_JOB_AGE_ENV,
            sandbox_accounting.ACCOUNTING_ENV,
        )
    }
    os.environ[sandbox_slurm_conf.CLUSTER_ENV] = OTHER
    os.environ[sandbox_slurm_conf.MIN_JOB_AGE_ENV] = "2"
    # A cluster without accounting beside one with it: its forgotten job's end is the record's.
    os.environ[sandbox_accounting.ACCOUNTING_ENV] = sandbox_accounting.NONE
    try:
        report = sandbox_lib.up(
            os.environ.get("DISPATCH_OTHER_SANDBOX_DIR") or f"{sandbox.dir}2",
            nodes=1,
            source=REPO_ROOT,
            slurm=sandbox.slurm,
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    second = sandbox_of(report)
    assert second.user == sandbox.user
    second.settle()
    yield second
    second.settle()


class On:
    """Dispatch commands as the job user on one cluster, with the shared DISPATCH_HOME."""

    def __init__(self, cluster: Sandbox, folder: Path, home: Path) -> None:
        self.cluster, self.folder, self.home = cluster, folder, home

    def run(self, *argv: str, check: bool = True) -> Any:
        words = list(argv)
        words[0] = str(self.cluster.venv_bin / words[0])
        return self.cluster.run(
            ["env", "-C", str(self.folder), f"DISPATCH_HOME={self.home}", *words],
            user=self.cluster.user,
            check=check,
            timeout=120,
        )

    def submit(self, *argv: str) -> tuple[str, str]:
        proc = self.run("dispatch-sbatch", "--parsable", *argv)
        return proc.stderr.split("Dispatch job ")[1].split()[0], proc.stdout.strip()


@pytest.fixture
def both(sandbox: Sandbox, other: Sandbox) -> tuple[On, On]:
    folder = Path(os.path.expanduser(f"~{sandbox.user}")) / "clusters" / uuid.uuid4().hex[:8]
    folder.mkdir(parents=True)
    for path in (folder, folder.parent):
        shutil.chown(path, sandbox.user)
    for name, text in (("long.sh", LONG), ("failing.sh", FAILING)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
        shutil.chown(folder / name, sandbox.user)
    home = folder / "state"
    return On(sandbox, folder, home), On(other, folder, home)


def test_each_clusters_commands_act_on_its_own_jobs_over_one_home(both: tuple[On, On]) -> None:
    here, there = both
    ours, our_slurm = here.submit("--checkpoint", "ck-a", "long.sh")
    theirs, their_slurm = there.submit("--checkpoint", "ck-b", "failing.sh")
    assert (
        json.loads(here.run("dispatch", "status", "--json", ours).stdout)["cluster"]
        == sandbox_slurm_conf.CLUSTER_NAME
    )

    def failed() -> bool:
        found = there.cluster.job_state(their_slurm)
        return found.get("JobState") == "FAILED"

    there.cluster.wait_for(failed, 60, f"Slurm job {their_slurm} to fail on {OTHER}")
    # Each supervisor: its own job only, and not a word about the other cluster's.
    mine = here.run("dispatch", "supervise")
    assert mine.stdout == "" and mine.stderr == "", mine
    done = there.run("dispatch", "supervise")
    assert done.stderr == "" and theirs in done.stdout and ours not in done.stdout, done
    assert "FAILED" not in here.run("dispatch", "jobs").stdout
    # jobs: this cluster's, with a CLUSTER column; -M all: both.
    lines = here.run("dispatch", "jobs").stdout.splitlines()
    assert lines[0].split()[:2] == ["DISPATCH_JOB", "CLUSTER"]
    assert [line.split()[:2] for line in lines[1:]] == [[ours, sandbox_slurm_conf.CLUSTER_NAME]]
    every = here.run("dispatch", "jobs", "-M", "all").stdout
    assert theirs in every and OTHER in every
    # The other cluster's job, by either id: one line naming its cluster.
    for ident in (theirs, their_slurm if their_slurm != our_slurm else theirs):
        refused = here.run("dispatch", "status", ident, check=False)
        assert refused.returncode == 2 and OTHER in refused.stderr, refused
        assert len(refused.stderr.strip().splitlines()) == 1
    assert here.run("dispatch", "cancel", theirs, check=False).returncode == 2

    # The other cluster forgets the failed job (MinJobAge 2 s, no accounting); its
    # recorded end is shown as sacct would, not UNKNOWN.
    def forgotten() -> bool:
        proc = there.cluster.run(["squeue", "-h", "--states=all", "-j", their_slurm], check=False)
        return proc.returncode != 0 or not proc.stdout.strip()

    there.cluster.wait_for(forgotten, 240, f"{OTHER} to forget Slurm job {their_slurm}", interval=2)
    shown = json.loads(there.run("dispatch", "status", "--json", theirs).stdout)
    assert shown["submissions"][0]["state"] == "FAILED (recorded)", shown["submissions"]
    listed = there.run("dispatch", "jobs").stdout
    assert "FAILED (recorded)" in listed and "UNKNOWN" not in listed, listed
    text = there.run("dispatch", "status", theirs).stdout
    assert "FAILED (recorded" in text and "UNKNOWN" not in text, text
    # And its supervisor, passing again, neither warns nor acts.
    again = there.run("dispatch", "supervise")
    assert again.stdout == "" and again.stderr == "", again
