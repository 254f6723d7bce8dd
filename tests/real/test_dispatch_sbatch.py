"""dispatch-sbatch on the real sandbox cluster: identity through requeues, partitions,
resubmissions, supersessions, multi-node and array jobs, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.sandbox import cluster as sandbox_lib

pytestmark = pytest.mark.real

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "toy-trainer.sh"

TASKS_SCRIPT = """#!/bin/bash
#SBATCH --time=5
srun /bin/bash -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME attempt=$DISPATCH_ATTEMPT \
epoch=$DISPATCH_EPOCH exec=$DISPATCH_EXEC_DIR"'
"""

PYTHON_SCRIPT = """#!/usr/bin/env python3
#SBATCH --time=5
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], **{k: v for k, v in os.environ.items()
                                          if k.startswith("DISPATCH_")}}))
"""


class Workdir:
    """A folder owned by the sandbox user, with helpers to run dispatch commands as that user."""

    def __init__(self, sandbox: Any, path: Path) -> None:
        self.sandbox = sandbox
        self.path = path

    def write(self, name: str, text: str, mode: int = 0o755) -> Path:
        target = self.path / name
        target.write_text(text)
        target.chmod(mode)
        shutil.chown(target, self.sandbox.user)
        return target

    def run(
        self, *argv: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        words = list(argv)
        if words[0].startswith("dispatch"):
            words[0] = str(Path(self.sandbox.venv_bin) / words[0])
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        cmd = (
            ["env", "-C", str(self.path), *extra, *words]
            if extra
            else ["env", "-C", str(self.path), *words]
        )
        return self.sandbox.run(cmd, user=self.sandbox.user, check=check)

    def submit(self, *argv: str, env: dict[str, str] | None = None) -> tuple[str, str]:
        """dispatch-sbatch; returns (dispatch job id, Slurm job id)."""
        proc = self.run("dispatch-sbatch", "--parsable", *argv, env=env)
        slurm_id = proc.stdout.strip().split(";")[0]
        dispatch_id = proc.stderr.split("Dispatch job ")[1].split()[0]
        return dispatch_id, slurm_id

    def status(self, job: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.run("dispatch", "status", "--json", job).stdout)
        return data


@pytest.fixture
def work(sandbox: Any) -> Workdir:
    home = Path(os.path.expanduser(f"~{sandbox.user}"))
    path = home / "tests" / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    shutil.chown(path, sandbox.user)
    shutil.chown(path.parent, sandbox.user)
    shutil.copy(TRAINER, path / "trainer.sh")
    shutil.chown(path / "trainer.sh", sandbox.user)
    return Workdir(sandbox, path)


def executions(work: Workdir, job: str) -> list[dict[str, Any]]:
    return list(work.status(job)["executions"])


def wait_executions(work: Workdir, job: str, count: int, timeout: float = 90) -> list[Any]:
    found: list[Any] = []

    def enough() -> bool:
        found[:] = executions(work, job)
        return len(found) >= count

    work.sandbox.wait_for(enough, timeout, f"{count} execution(s) of {job}")
    return found


def wait_state(work: Workdir, slurm_id: str, states: set[str], timeout: float = 90) -> str:
    seen: list[str] = []

    def reached() -> bool:
        seen[:] = [work.sandbox.job_state(slurm_id).get("JobState", "")]
        return seen[0] in states

    work.sandbox.wait_for(reached, timeout, f"job {slurm_id} in {sorted(states)}")
    return seen[0]


def printed(out: Path) -> str:
    """What the job's script printed: its output without the launcher's header lines."""
    lines = out.read_text().splitlines(keepends=True)
    assert lines and lines[0].startswith("==> slurm-dispatch: "), lines[:2]
    return "".join(line for line in lines if not line.startswith("==> slurm-dispatch: "))


def published_steps(exec_dir: str) -> list[int]:
    """Steps of the saves under ``exec_dir`` that are published (not merely written)."""
    root = os.path.dirname(os.path.dirname(exec_dir))
    return sorted(
        f.step for f in store.list_publications(root) if f.path.startswith(exec_dir + "/")
    )


def test_requeue_gives_new_attempt_and_epoch(work: Workdir) -> None:
    long_run = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.1", "TOY_SAVE_EVERY": "5"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "-o", "out-%j-%s.txt", "trainer.sh", env=long_run
    )
    first = wait_executions(work, job, 1)[0]
    work.sandbox.wait_for(lambda: published_steps(first["exec_dir"]), 60, "a first save")
    work.sandbox.run(["scontrol", "requeue", slurm_id])
    second = wait_executions(work, job, 2)[1]
    try:
        assert (first["restart"], second["restart"]) == (0, 1)
        assert (first["epoch"], second["epoch"]) == (1_000_000, 1_000_001)
        assert first["attempt"] != second["attempt"]
        assert second["exec_dir"] == str(work.path / "ck" / "exec" / second["attempt"])
        assert os.path.isdir(second["exec_dir"])
        assert Path(second["exec_dir"]).owner() == work.sandbox.user
        assert second["resume_from"].startswith(first["exec_dir"] + "/checkpoint-")
        status = work.status(job)
        assert status["submissions"][0]["restarts"] == 1
        assert [e["state"] for e in status["executions"]] == ["REQUEUED", "RUNNING"]
    finally:
        work.sandbox.run(["scancel", slurm_id], check=False)


def test_partitioned_node_overlap_is_harmless(work: Workdir) -> None:
    sandbox = work.sandbox
    long_run = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.1", "TOY_SAVE_EVERY": "5"}
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "-o", "out-%j.txt", "trainer.sh", env=long_run
    )
    old = wait_executions(work, job, 1)[0]
    node = old["node"]
    sandbox.wait_for(lambda: published_steps(old["exec_dir"]), 60, f"a first save on {node}")
    sandbox_lib.partition(node, sandbox.dir)
    try:
        new = wait_executions(work, job, 2, timeout=150)[1]
        assert new["node"] != node and new["restart"] == 1
        assert new["attempt"] != old["attempt"]
        # The old execution is still writing its own folder while the replacement runs.
        before = published_steps(old["exec_dir"])
        sandbox.wait_for(
            lambda: published_steps(old["exec_dir"])[-1:] > before[-1:],
            60,
            "the partitioned execution saving again",
        )
        sandbox.wait_for(lambda: published_steps(new["exec_dir"]), 60, "a replacement save")
        latest = json.loads(work.run("dispatch", "latest", "--json", "--root", "ck").stdout)
        assert latest["epoch"] == 1_000_001, "an old run's late save outranked the replacement"
        assert latest["path"].startswith(new["exec_dir"])
        saves = [p for p in os.listdir(new["exec_dir"]) if not p.startswith(".")]
        assert saves and all(p.startswith("checkpoint-") for p in saves)
        assert os.path.isfile(os.path.join(new["exec_dir"], ".dispatch"))  # its record
    finally:
        sandbox_lib.heal(node, sandbox.dir)
        sandbox.run(["scancel", slurm_id], check=False)


def test_resubmit_is_submission_two_and_resumes(work: Workdir) -> None:
    env = {"TOY_STEPS": "10", "TOY_INTERVAL": "0.05", "TOY_SAVE_EVERY": "5"}
    job, slurm_id = work.submit("--checkpoint", "ck", "trainer.sh", env=env)
    wait_state(work, slurm_id, {"COMPLETED"})
    proc = work.run("dispatch", "resubmit", job, env={**env, "TOY_STEPS": "20"})
    # The snapshot's sbatch options come along, --parsable included: sbatch's line is an id.
    assert proc.stdout.split("\n")[0].isdigit() and "submission 2" in proc.stdout
    runs = wait_executions(work, job, 2)
    assert runs[1]["submission"] == 2 and runs[1]["epoch"] == 2_000_000
    assert runs[1]["resume_from"] == runs[0]["exec_dir"] + "/checkpoint-10"


def test_supersede_raises_generation_and_resumes_from_old_saves(work: Workdir) -> None:
    long_run = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.1", "TOY_SAVE_EVERY": "5"}
    old_job, old_slurm = work.submit("--checkpoint", "ck", "trainer.sh", env=long_run)
    old = wait_executions(work, old_job, 1)[0]
    work.sandbox.wait_for(lambda: published_steps(old["exec_dir"]), 60, "an old save")
    work.write("trainer2.sh", TRAINER.read_text())
    new_job, _ = work.submit(
        "--supersede", old_job, "trainer2.sh", env={**long_run, "TOY_STEPS": "10000"}
    )
    new = wait_executions(work, new_job, 1)[0]
    try:
        assert new["epoch"] == 1_000_000_000_000 + 1_000_000  # G=1, N=1, R=0
        assert new["resume_from"].startswith(old["exec_dir"] + "/checkpoint-")
        assert wait_state(work, old_slurm, {"CANCELLED"}) == "CANCELLED"
        assert work.status(new_job)["supersedes"] == old_job
    finally:
        work.run("scancel", "--me", check=False)


@pytest.mark.parametrize("export", [[], ["--export=NONE"]], ids=["export-all", "export-none"])
def test_two_node_job_every_task_sees_one_attempt(work: Workdir, export: list[str]) -> None:
    """srun steps on every node carry the identity, also when the job exports nothing."""
    work.write("tasks.sh", TASKS_SCRIPT)
    job, slurm_id = work.submit(
        "--checkpoint",
        "ck",
        "-N",
        "2",
        "--ntasks-per-node=2",
        *export,
        "-o",
        "tasks.out",
        "tasks.sh",
    )
    wait_state(work, slurm_id, {"COMPLETED"})
    lines = (work.path / "tasks.out").read_text().split("\n")
    tasks = [line for line in lines if line.startswith("task ")]
    assert len(tasks) == 4
    assert len({line.split()[3] for line in tasks}) == 2, "tasks did not span two nodes"
    attempts = {line.split("attempt=")[1].split()[0] for line in tasks}
    (execution,) = executions(work, job)
    assert attempts == {execution["attempt"]}
    assert all(f"exec={execution['exec_dir']}" in line for line in tasks)


def test_array_job_each_task_has_its_own_identity_and_root(work: Workdir) -> None:
    work.write("py.py", PYTHON_SCRIPT)
    job, slurm_id = work.submit(
        "--checkpoint", "ck/%a", "--array=0-2", "-o", "arr-%a.out", "py.py", "x"
    )
    runs = wait_executions(work, job, 3)
    for task in range(3):
        wait_state(work, f"{slurm_id}_{task}", {"COMPLETED"})
    seen = [json.loads(printed(work.path / f"arr-{t}.out")) for t in range(3)]
    assert len({s["DISPATCH_ATTEMPT"] for s in seen}) == 3
    assert [s["DISPATCH_CHECKPOINT"] for s in seen] == [
        str(work.path / "ck" / str(t)) for t in range(3)
    ]
    assert {r["array_task_id"] for r in runs} == {"0", "1", "2"}


def test_python_script_with_export_none_and_arguments(work: Workdir) -> None:
    work.write("py.py", PYTHON_SCRIPT)
    job, slurm_id = work.submit(
        "--checkpoint", "ck", "--export=NONE", "-o", "py.out", "py.py", "a b", "--flag"
    )
    wait_state(work, slurm_id, {"COMPLETED"})
    seen = json.loads(printed(work.path / "py.out"))
    assert seen["argv"] == ["a b", "--flag"]
    assert seen["DISPATCH_JOB"] == job and seen["DISPATCH_EPOCH"] == "1000000"
    assert seen["DISPATCH_EXEC_DIR"].startswith(str(work.path / "ck" / "exec") + "/")
    name = work.sandbox.job_state(slurm_id).get("JobName")
    assert name == "py.py", "the job name must default to the script's name"


def test_parsable_output_is_exactly_sbatchs(work: Workdir) -> None:
    proc = work.run("dispatch-sbatch", "--parsable", "--checkpoint", "ck", "--hold", "trainer.sh")
    assert proc.stdout.strip().isdigit() and proc.stdout.count("\n") == 1
    plain = work.run("sbatch", "--parsable", "--hold", "trainer.sh")
    assert plain.stdout.strip().isdigit()
    work.run("scancel", proc.stdout.strip(), plain.stdout.strip())


def test_sbatch_refusal_comes_through_and_leaves_no_job(work: Workdir) -> None:
    home = Path(os.path.expanduser(f"~{work.sandbox.user}")) / ".local/state/slurm-dispatch/jobs"
    before = set(os.listdir(home)) if home.exists() else set()
    ours = work.run(
        "dispatch-sbatch", "--checkpoint", "ck", "-p", "nosuchpartition", "trainer.sh", check=False
    )
    theirs = work.run("sbatch", "-p", "nosuchpartition", "trainer.sh", check=False)
    assert ours.returncode == theirs.returncode != 0
    assert ours.stderr.strip() == theirs.stderr.strip()
    assert ours.stdout == ""
    assert (set(os.listdir(home)) if home.exists() else set()) == before


def test_bad_input_errors(work: Workdir) -> None:
    work.write("crlf.sh", "#!/bin/bash\r\necho hi\r\n")
    cases = [
        (["trainer.sh"], "no checkpoint root"),
        (["--checkpoint", "ck"], "no batch script"),
        (["--checkpoint", "ck", "crlf.sh"], "DOS line breaks"),
        (["--checkpoint", "/root/forbidden", "trainer.sh"], "/root"),
    ]
    for argv, word in cases:
        proc = work.run("dispatch-sbatch", *argv, check=False)
        assert proc.returncode == 2 and word in proc.stderr, (argv, proc.stderr)
        assert proc.stderr.startswith("dispatch-sbatch: ")


def test_controller_down_is_a_clear_error(work: Workdir, tmp_path: Path) -> None:
    conf = re.sub(
        r"(?m)^SlurmctldPort=\d+",
        "SlurmctldPort=1",  # nothing listens there
        Path(work.sandbox.env["SLURM_CONF"]).read_text(),
    )
    down_conf = work.path / "down.conf"
    down_conf.write_text(conf)
    down_conf.chmod(0o644)
    started = time.monotonic()
    proc = work.run(
        "dispatch-sbatch",
        "--checkpoint",
        "ck",
        "trainer.sh",
        check=False,
        env={"SLURM_CONF": str(down_conf), "DISPATCH_SLURM_ATTEMPTS": "1"},
    )
    assert proc.returncode != 0
    assert "Unable to contact slurm controller" in proc.stderr
    assert time.monotonic() - started < 120
    assert not any(f"checkpoint {work.path}/ck" in line for line in proc.stdout.splitlines())
    assert not (work.path / "ck" / "exec").exists()


def test_every_executions_output_is_kept_with_a_header(work: Workdir) -> None:
    """Slurm truncates `-o slurm-%j.out` when it requeues a job, so only the
    last execution's output survived.  Appended by default, each execution headed."""
    script = work.write(
        "talk.sh",
        "#!/bin/bash\n#SBATCH --time=5\n"
        'echo "said by restart ${SLURM_RESTART_COUNT:-0}"\n'
        f"while [ ! -e {work.path}/stop.${{SLURM_RESTART_COUNT:-0}} ]; do "
        "sleep 0.2; done\n",
    )
    job, slurm_id = work.submit("--checkpoint", "ck", "-o", "out-%j.txt", script.name)
    out = work.path / f"out-{slurm_id}.txt"
    work.sandbox.wait_for(
        lambda: out.exists() and "said by restart 0" in out.read_text(),
        60,
        "the first execution's output",
    )
    work.sandbox.run(["scontrol", "requeue", slurm_id])
    work.sandbox.wait_for(
        lambda: "said by restart 1" in out.read_text(), 90, "the second execution's output"
    )
    (work.path / "stop.1").touch()
    wait_state(work, slurm_id, {"COMPLETED"})
    text = out.read_text()
    headers = [line for line in text.splitlines() if line.startswith("==> slurm-dispatch: ")]
    assert len(headers) == 2, text
    assert "restart 0" in headers[0] and "restart 1" in headers[1]
    assert f"dispatch job {job}" in headers[0]
    assert (
        text.index("said by restart 0") < text.index(headers[1]) < text.index("said by restart 1")
    )


def test_warn_before_reaches_the_job_script_ahead_of_its_time_limit(work: Workdir) -> None:
    """`--warn-before`: the job script itself gets the signal (a plain `--signal` reaches only
    srun steps), so a trainer run by the script can save before the time limit."""
    script = work.write(
        "warned.sh",
        "#!/bin/bash\n#SBATCH --time=2\n"
        f"trap 'date +%s > {work.path}/warned; exit 0' USR1\n"
        "while true; do sleep 0.2; done\n",
    )
    started = time.time()
    job, slurm_id = work.submit("--checkpoint", "ck", "--warn-before", "100", script.name)
    warned = work.path / "warned"
    # The shell makes the file before date writes into it: wait for its line, not its name.
    work.sandbox.wait_for(
        lambda: warned.exists() and warned.read_text().endswith("\n"),
        110,
        "the warning signal in the job script",
    )
    assert int(warned.read_text()) < started + 100  # well before the limit
    wait_state(work, slurm_id, {"COMPLETED"})


def test_a_root_that_would_change_per_submission_is_refused(work: Workdir) -> None:
    """`--checkpoint 'ck/%j'` gave the resubmission a fresh root, which then
    started from scratch; refused with why and what to write instead, nothing made."""
    for root in ("ck/%j", "ck-%A"):
        proc = work.run("dispatch-sbatch", "--checkpoint", root, "trainer.sh", check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "every submission" in proc.stderr and "%a" in proc.stderr
    assert sorted(p.name for p in work.path.iterdir()) == ["trainer.sh"]
    work.submit(
        "--checkpoint",
        "ck-%a",
        "--array=0-1",
        "trainer.sh",
        env={"TOY_STEPS": "3", "TOY_INTERVAL": "0.05"},
    )
    work.sandbox.wait_for(
        lambda: (work.path / "ck-0").is_dir() and (work.path / "ck-1").is_dir(),
        60,
        "a root per task",
    )
