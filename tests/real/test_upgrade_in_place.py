"""A site upgrading in place across the layout move (docs/architecture.md): the sandbox's venv gets
the wheel of the last commit before the move, the old ``dispatch-sbatch`` submits two dispatch jobs,
then the new wheel (this checkout) is installed over it while one of them is pending (held) and the
other running.  What the old version wrote keeps working under the new one: its batch scripts
exec ``python -m slurm_dispatch.launch`` and start the new launcher (the requeued job, the held
one once released), the new hooks record their facts beside the old hooks' ones, ``dispatch
publish`` and ``dispatch latest`` work on the old roots, ``dispatch status`` reads the old
records, the supervisor resubmits the old record's failed job, and ``dispatch-cease`` answers.

The sandbox's venv is shared by the session's other real tests: it is put back to this checkout
at the end, and its source mark is removed while the old wheel is in, so that a test session
cut short reinstalls the checkout at its next start.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from slurm_dispatch.node.executions import execution_facts
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import install as sandbox_install
from slurm_dispatch.sandbox.layout import Layout

if TYPE_CHECKING:
    from tests.real.conftest import Sandbox

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]
# The last commit before the layout move (832e8e4): what a site runs before upgrading.
OLD_COMMIT = "b39dcc8"
# What the wheel is built from (pyproject.toml's packages and data files).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "slurm_dispatch", "docs/man", "contrib/completion")

# Publishes one save, then fails unless it resumed from one: the first submission fails, the
# supervisor's resubmission resumes from the first one's save and succeeds.
FAIL_ONCE = """#!/bin/bash
#SBATCH --time=5
set -euo pipefail
save="$DISPATCH_EXEC_DIR/checkpoint-1"
mkdir -p "$save"
echo 1 > "$save/step"
dispatch publish --step 1 "$save" >/dev/null
if [ -n "${DISPATCH_RESUME_FROM:-}" ]; then echo "resumed from $DISPATCH_RESUME_FROM"; exit 0; fi
echo "failing on purpose"
exit 3
"""

# One save per execution, then waits for the test's word (stop.<restart count>).
PER_RESTART = """#!/bin/bash
#SBATCH --time=5
set -euo pipefail
n=${SLURM_RESTART_COUNT:-0}
save="$DISPATCH_EXEC_DIR/checkpoint-$((n + 1))"
mkdir -p "$save"
echo "$n" > "$save/step"
dispatch publish --step "$((n + 1))" "$save" >/dev/null
touch "ready.$n"
while [ ! -e "stop.$n" ]; do sleep 0.2; done
"""


def build_wheel(source: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("slurm_dispatch-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The old commit's wheel and this checkout's, built once per session from copies (a
    build in the checkout would leave build/ there)."""
    base = tmp_path_factory.mktemp("upgrade-wheels")
    old = base / "old-src"
    old.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_COMMIT, *WHEEL_SOURCES],
        capture_output=True,
        timeout=120,
    )
    assert archive.returncode == 0, (
        f"the upgrade test needs the commit {OLD_COMMIT} in "
        f"{REPO}'s history: {archive.stderr.decode()}"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(old)  # noqa: S202 - our own repository's tree
    new = base / "new-src"
    digest = sandbox_install.source_digest(REPO)
    for name in WHEEL_SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source,
                new / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
            )
        else:
            (new / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, new / name)
    return {
        "old": build_wheel(old, base / "old"),
        "new": build_wheel(new, base / "new"),
        "new_digest": digest,
    }


class Site:
    """The sandbox's venv as an admin upgrades it, and its user's dispatch commands."""

    def __init__(self, sandbox: Sandbox, path: Path, wheel_dir: Path) -> None:
        self.sandbox, self.path, self.wheel_dir = sandbox, path, wheel_dir
        self.layout = Layout(Path(sandbox.dir))

    def install(self, wheel: Path) -> None:
        # Where the sandbox's venv runs (a Debian root for 24.11) sees the sandbox's folder.
        folder = self.wheel_dir / wheel.parent.name  # pip reads the wheel's own file name
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / wheel.name
        shutil.copy2(wheel, target)
        target.chmod(0o644)
        self.sandbox.run(
            [
                self.sandbox.venv_bin / "python",
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-input",
                "--no-deps",
                "--force-reinstall",
                str(target),
            ],
            timeout=300,
        )

    def has_layout(self) -> bool:
        """Whether the venv's slurm_dispatch is the new layout (it has the checkpoint side)."""
        proc = self.sandbox.run(
            [
                self.sandbox.venv_bin / "python",
                "-I",
                "-c",
                "import importlib.util as u; "
                "print(u.find_spec('slurm_dispatch.checkpoint') is not None)",
            ],
            cwd=Path("/"),
        )
        return proc.stdout.strip() == "True"

    def write(self, name: str, text: str) -> None:
        target = self.path / name
        target.write_text(text)
        target.chmod(0o755)
        shutil.chown(target, self.sandbox.user)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        words = list(argv)
        if words[0].startswith("dispatch"):
            words[0] = str(self.sandbox.venv_bin / words[0])
        return self.sandbox.run(
            ["env", "-C", str(self.path), *words], user=self.sandbox.user, check=check, timeout=180
        )

    def submit(self, *argv: str) -> tuple[str, str]:
        proc = self.run("dispatch-sbatch", "--parsable", *argv)
        return proc.stderr.split("Dispatch job ")[1].split()[0], proc.stdout.strip()

    def status(self, job: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.run("dispatch", "status", "--json", job).stdout)
        return data

    def latest(self, job: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.run("dispatch", "latest", "--json", job).stdout)
        return found

    def slurm_state(self, slurm_id: str) -> str:
        return self.sandbox.job_state(slurm_id).get("JobState", "")

    def executions(self, job: str, count: int, timeout: float = 120) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            found[:] = self.status(job)["executions"]
            return len(found) >= count

        self.sandbox.wait_for(enough, timeout, f"{count} execution(s) of {job}", interval=0.5)
        return found


def test_jobs_written_by_the_old_version_keep_working_after_an_in_place_upgrade(
    sandbox: Sandbox, wheels: dict[str, Any]
) -> None:
    site = Site(sandbox, sandbox.workdir("upgrade"), Path(sandbox.dir) / "upgrade-wheels")
    restored = False
    try:
        site.layout.source_hash_file.unlink(missing_ok=True)
        site.install(wheels["old"])
        assert not site.has_layout(), "the old wheel did not replace the new one"
        site.write("fail-once.sh", FAIL_ONCE)
        site.write("per-restart.sh", PER_RESTART)

        # Written by the old version: one held (pending), one running.
        held_job, held_first = site.submit(
            "--checkpoint",
            "ck-held",
            "--resubmit",
            "1",
            "--hold",
            "-o",
            "held-%j.txt",
            "fail-once.sh",
        )
        run_job, run_slurm = site.submit(
            "--checkpoint", "ck-run", "-o", "run-%j.txt", "per-restart.sh"
        )
        sandbox.wait_for(
            lambda: (site.path / "ready.0").exists(),
            90,
            "the old version's launcher to start the running job",
        )
        assert site.slurm_state(held_first) == "PENDING"
        old_latest = site.latest(run_job)
        assert old_latest["step"] == 1, old_latest

        # The upgrade, with both jobs in flight.
        site.install(wheels["new"])
        assert site.has_layout(), "the new wheel is not in the venv"

        # The new status reads the old version's records.
        status = site.status(run_job)
        assert [e["restart"] for e in status["executions"]] == [0], status["executions"]
        assert site.status(held_job)["submissions"][0]["state"] == "PENDING"

        # Requeued: the old batch script execs `python -m slurm_dispatch.launch`, which is the
        # new launcher now; it resumes from the save the old version published.
        sandbox.run(["scontrol", "requeue", run_slurm])
        first, second = site.executions(run_job, 2)[:2]
        sandbox.wait_for(
            lambda: (site.path / "ready.1").exists(),
            120,
            "the new launcher to start the requeued job",
        )
        assert (first["restart"], second["restart"]) == (0, 1)
        assert (first["epoch"], second["epoch"]) == (1_000_000, 1_000_001)
        assert second["resume_from"] == old_latest["path"]
        assert second["exec_dir"].startswith(str(site.path / "ck-run" / "exec") + "/")
        new_latest = site.latest(run_job)
        assert (new_latest["epoch"], new_latest["step"]) == (1_000_001, 2), new_latest
        assert new_latest["path"].startswith(second["exec_dir"] + "/")
        (site.path / "stop.1").touch()
        sandbox.wait_for(
            lambda: site.slurm_state(run_slurm) == "COMPLETED", 90, f"job {run_slurm} to complete"
        )

        # The old prolog's start record and the new hooks' records read as one history.
        state_dir = str(Path(sandbox.dir) / "dispatch-state")
        recorded = sandbox.wait_for(
            lambda: (lambda ex: ex if len(ex) == 2 and all(e.get("end") for e in ex) else None)(
                execution_facts(run_slurm, state_dir, sandbox.uid)
            ),
            60,
            "both executions' start and end facts",
        )
        assert recorded[0]["end"]["requeued"] is True
        assert [e["restart"] for e in recorded] == [0, 1]
        assert all(node["start"] for e in recorded for node in e["nodes"].values()), recorded

        # dispatch-cease answers for the old version's job.
        def ceased() -> dict[str, Any] | None:
            proc = sandbox.run(
                [sandbox.venv_bin / "dispatch-cease", run_slurm, "--json"],
                user=sandbox.user,
                check=False,
            )
            assert proc.returncode in (0, 1), proc.stderr
            verdict: dict[str, Any] = json.loads(proc.stdout)
            return verdict if proc.returncode == 0 else None

        verdict = sandbox.wait_for(
            ceased, 60, f"dispatch-cease {run_slurm} to prove cessation", interval=0.5
        )
        assert verdict["ceased"] and verdict["job_state"] == "COMPLETED", verdict

        # The held job, released: the new launcher and hooks run it; it fails, and the new
        # supervisor resubmits the old record's job, which resumes from its save.
        sandbox.run(["scontrol", "release", held_first])
        sandbox.wait_for(
            lambda: site.slurm_state(held_first) == "FAILED", 90, f"job {held_first} to fail"
        )
        assert execution_facts(held_first, state_dir, sandbox.uid), (
            "the new hooks recorded nothing for the released job"
        )
        passed = site.run("dispatch", "supervise", check=False)
        assert "resubmitted as submission 2" in passed.stdout, passed.stdout + passed.stderr
        # The old record's sbatch arguments hold --hold, and a resubmission takes them as
        # they are (before the upgrade as after): released as the first one was.
        resubmitted = site.status(held_job)["submissions"][1]["slurm_job_id"]
        assert sandbox.job_state(resubmitted).get("Reason") == "JobHeldUser"
        sandbox.run(["scontrol", "release", resubmitted])

        def finished() -> list[dict[str, Any]]:
            subs: list[dict[str, Any]] = site.status(held_job)["submissions"]
            return subs if len(subs) == 2 and subs[1]["state"] == "COMPLETED" else []

        subs = sandbox.wait_for(finished, 90, "the resubmission to complete", interval=1)
        assert subs[0]["state"] == "FAILED" and subs[1]["reason"] == "failed (budget 1)"
        executions = site.status(held_job)["executions"]
        assert [e["submission"] for e in executions] == [1, 2]
        assert executions[1]["epoch"] == 2_000_000
        assert executions[1]["resume_from"].startswith(executions[0]["exec_dir"] + "/")
        for job in (held_job, run_job):
            text = site.run("dispatch", "status", job).stdout
            assert job in text, text

        # The venv holds this checkout again: marked so, the next `up` keeps it.
        site.layout.source_hash_file.write_text(wheels["new_digest"] + "\n")
        restored = True
    finally:
        if not restored:
            site.layout.source_hash_file.unlink(missing_ok=True)
            sandbox_lib.up(sandbox.dir, user=sandbox.user, source=REPO)
    assert site.has_layout()
    assert os.path.isdir(site.path)
