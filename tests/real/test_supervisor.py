"""The supervisor on the real sandbox: resubmit budgets, shared-checkpoint holds that only
dispatch-cease (or a person) lifts, and holds that expire."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.sandbox import clients as sandbox_clients
from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import layout as sandbox_layout

pytestmark = pytest.mark.real

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "toy-trainer.sh"
FAILING = "#!/bin/bash\n#SBATCH --time=5\necho failing on purpose; exit 3\n"


class User:
    """Runs dispatch commands as the sandbox user in one folder, with a site config of its own."""

    def __init__(self, sandbox: Any, path: Path, conf: Path) -> None:
        self.sandbox, self.path, self.conf = sandbox, path, conf

    def run(self, *argv: str, check: bool = True, env: dict[str, str] | None = None) -> Any:
        words = list(argv)
        if words[0].startswith("dispatch"):
            words[0] = str(Path(self.sandbox.venv_bin) / words[0])
        extra = [f"SLURM_DISPATCH_CONF={self.conf}", *(f"{k}={v}" for k, v in (env or {}).items())]
        return self.sandbox.run(
            ["env", "-C", str(self.path), *extra, *words],
            user=self.sandbox.user,
            check=check,
            timeout=180,
        )

    def submit(self, *argv: str, env: dict[str, str] | None = None) -> tuple[str, str]:
        proc = self.run("dispatch-sbatch", "--parsable", *argv, env=env)
        return proc.stderr.split("Dispatch job ")[1].split()[0], proc.stdout.strip()

    def status(self, job: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.run("dispatch", "status", "--json", job).stdout)
        return data

    def supervise(self) -> str:
        return str(self.run("dispatch", "supervise", check=False).stdout)

    def events(self, job: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.status(job)["events"] if e["event"] == kind]


def site_conf(sandbox: Any, path: Path, **overrides: str) -> Path:
    """A copy of the sandbox's dispatch.conf with some keys changed (same StateDir)."""
    text = (Path(sandbox.dir) / "etc" / "dispatch.conf").read_text()
    for key, value in overrides.items():
        text, count = re.subn(rf"(?m)^{key}=.*$", f"{key}={value}", text)
        if not count:
            text += f"{key}={value}\n"
    conf = path / "dispatch.conf"
    conf.write_text(text)
    conf.chmod(0o644)
    return conf


@pytest.fixture
def user(sandbox: Any) -> User:
    path = Path(os.path.expanduser(f"~{sandbox.user}")) / "sup" / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    for folder in (path, path.parent):
        shutil.chown(folder, sandbox.user)
    for name, text in (("trainer.sh", TRAINER.read_text()), ("failing.sh", FAILING)):
        (path / name).write_text(text)
        (path / name).chmod(0o755)
        shutil.chown(path / name, sandbox.user)
    return User(sandbox, path, site_conf(sandbox, path, CessationInterval="1"))


def state_of(sandbox: Any, jobid: str) -> tuple[str, str]:
    info = sandbox.job_state(jobid)
    return info.get("JobState", ""), info.get("Reason", "")


def submissions(user: User, job: str) -> list[dict[str, Any]]:
    return list(user.status(job)["submissions"])


def test_failing_isolated_job_is_resubmitted_until_budget_is_spent(user: User) -> None:
    job, _ = user.submit("--checkpoint", "ck", "--resubmit", "2", "failing.sh")

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    user.sandbox.wait_for(finished, 120, f"{job} to stop after its budget", interval=1)
    subs = submissions(user, job)
    assert [s["submission"] for s in subs] == [1, 2, 3]
    assert all(s["state"] == "FAILED" for s in subs)
    assert [s["reason"] for s in subs[1:]] == ["failed (budget 2)", "failed (budget 1)"]
    assert user.supervise() == ""  # nothing more to do
    assert len(submissions(user, job)) == 3


def held_after_a_failure(user: User) -> tuple[str, str]:
    """A shared-checkpoint job whose first submission failed, its next one held by the pass
    with no CessationSignal (the hold waits for a person): (dispatch job, held Slurm job)."""
    user.conf = site_conf(user.sandbox, user.path, CessationSignal="")
    job, first = user.submit(
        "--checkpoint", "ck", "--shared-checkpoint", "--resubmit", "1", "failing.sh"
    )
    user.sandbox.wait_for(
        lambda: state_of(user.sandbox, first)[0] == "FAILED", 60, "the first submission to fail"
    )
    assert "held" in user.supervise()
    (hold,) = user.events(job, "hold")
    return job, str(hold["slurm_job_id"])


def test_hold_without_signal_waits_for_scontrol_release(user: User) -> None:
    job, held = held_after_a_failure(user)
    assert state_of(user.sandbox, held) == ("PENDING", "JobHeldUser")
    squeue = user.run("squeue", "-h", "-j", held, "-o", "%i %r %k").stdout
    assert "JobHeldUser" in squeue and "held: shared checkpoint" in squeue
    for _ in range(3):
        user.supervise()
    assert user.events(job, "cessation") == [] and state_of(user.sandbox, held)[1] == "JobHeldUser"
    # Released, it must stay pending until the pass has seen it: failing.sh could otherwise
    # start, fail and end first on a fast machine, and the pass would rightly say FAILED.
    user.run("scontrol", "update", f"jobid={held}", "StartTime=now+3600")
    user.run("scontrol", "release", held)
    user.supervise()
    (released,) = user.events(job, "released")
    assert released["by"] == "a person (scontrol release)"
    user.run("scancel", held)


def test_hold_expires_and_nothing_more_starts(user: User) -> None:
    user.conf = site_conf(user.sandbox, user.path, SharedHoldFor="3", CessationSignal="")
    job, first = user.submit(
        "--checkpoint", "ck", "--shared-checkpoint", "--resubmit", "3", "failing.sh"
    )
    user.sandbox.wait_for(
        lambda: state_of(user.sandbox, first)[0] == "FAILED", 60, "the first submission to fail"
    )
    user.supervise()
    (hold,) = user.events(job, "hold")

    def expired() -> bool:
        user.supervise()
        return bool(user.events(job, "expired"))

    user.sandbox.wait_for(expired, 30, "the hold to expire", interval=1)
    assert state_of(user.sandbox, str(hold["slurm_job_id"]))[0] == "CANCELLED"
    user.supervise()
    assert len(submissions(user, job)) == 2
    assert user.events(job, "finished")[0]["end_state"] == "hold expired"


def test_shared_job_on_partitioned_node_is_held_until_dispatch_cease_proves_it_gone(
    user: User,
) -> None:
    sandbox = user.sandbox
    run_env = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.1", "TOY_SAVE_EVERY": "5"}
    job, first = user.submit(
        "--checkpoint",
        "ck",
        "--shared-checkpoint",
        "--resubmit",
        "2",
        "-o",
        "out-%j.txt",
        "trainer.sh",
        env=run_env,
    )
    sandbox.wait_for(lambda: user.status(job)["executions"], 60, "the first execution")
    old = user.status(job)["executions"][0]
    node = old["node"]
    root = str(user.path / "ck")
    sandbox.wait_for(lambda: store.latest(root), 60, "a first publication")
    sandbox_lib.partition(node, sandbox.dir)
    try:
        # Slurm must not requeue it (no automatic requeue for a shared checkpoint).
        sandbox.wait_for(
            lambda: state_of(sandbox, first)[0] == "NODE_FAIL",
            120,
            f"job {first} to end with NODE_FAIL",
        )
        assert sandbox.job_state(first).get("Restarts") == "0"
        assert "held" in user.supervise()
        (hold,) = user.events(job, "hold")
        held = str(hold["slurm_job_id"])
        assert state_of(sandbox, held) == ("PENDING", "JobHeldUser")
        user.supervise()
        facts = user.events(job, "cessation")
        assert facts and facts[-1]["verdict"] == "not ceased" and facts[-1]["code"] == 1
        assert state_of(sandbox, held)[1] == "JobHeldUser", "released without proof"
        status_text = user.run("dispatch", "status", job).stdout
        assert f"HOLD submission 2 (Slurm job {held})" in status_text
        assert "CESSATION of job" in status_text and "not ceased" in status_text
    finally:
        sandbox_lib.heal(node, sandbox.dir)

    def lifted() -> bool:
        user.supervise()
        return bool(user.events(job, "released"))

    sandbox.wait_for(lifted, 120, "dispatch-cease to prove cessation and lift the hold", interval=1)
    verdicts = [f["verdict"] for f in user.events(job, "cessation")]
    assert verdicts[-1] == "ceased" and "not ceased" in verdicts
    assert user.events(job, "released")[0]["by"] == "cessation signal"
    executions = sandbox.wait_for(
        lambda: [e for e in user.status(job)["executions"] if e["submission"] == 2],
        60,
        "submission 2 to start",
    )
    latest_before = executions[0]["resume_from"]
    assert executions[0]["epoch"] == 2_000_000
    assert latest_before.startswith(old["exec_dir"] + "/checkpoint-")
    sandbox.run(["scancel", held], check=False)


AGAIN = (
    "#!/bin/bash\n#SBATCH --time=5\n"
    "if [ -e first.done ]; then touch ran.$SLURM_JOB_ID; exit 0; fi\n"
    "touch first.done; exit 3\n"
)


def test_where_facts_are_private_the_site_release_service_lifts_the_hold(user: User) -> None:
    """On the real cluster: with facts/ 0700 (the admin guide's privacy
    option) the user's own supervisor asks dispatch-cease and gets only errors; root's
    dispatch-admin release-service asks it on the user's behalf, records ceased, releases
    the held job as its owner, and the job runs again."""
    sandbox = user.sandbox
    (user.path / "again.sh").write_text(AGAIN)
    (user.path / "again.sh").chmod(0o755)
    shutil.chown(user.path / "again.sh", sandbox.user)
    cease = f"{sandbox.venv_bin}/dispatch-cease"
    user.conf = site_conf(sandbox, user.path, CessationSignal=cease, CessationInterval="1")
    facts = sandbox.dir / "dispatch-state" / "facts"
    mode = facts.stat().st_mode & 0o7777
    facts.chmod(0o700)
    try:
        job, first = user.submit(
            "--checkpoint", "ck", "--shared-checkpoint", "--resubmit", "1", "again.sh"
        )
        sandbox.wait_for(
            lambda: state_of(sandbox, first)[0] == "FAILED", 60, "the first execution to fail"
        )
        assert "held" in user.supervise()
        (hold,) = user.events(job, "hold")
        held = str(hold["slurm_job_id"])
        assert state_of(sandbox, held) == ("PENDING", "JobHeldUser")

        def users_answer() -> list[dict[str, Any]]:
            user.supervise()
            return user.events(job, "cessation")

        answers = sandbox.wait_for(users_answer, 60, "the user's supervisor to ask", interval=1)
        assert {a["verdict"] for a in answers} == {"error"}, answers
        assert "Permission denied" in json.dumps(answers), answers
        assert state_of(sandbox, held) == ("PENDING", "JobHeldUser"), "released unproven"

        admin = [
            str(Path(sandbox.venv_bin) / "dispatch-admin"),
            "release-service",
            "--user",
            sandbox.user,
        ]
        said: list[str] = []

        def lifted() -> bool:
            proc = sandbox.run(["env", f"SLURM_DISPATCH_CONF={user.conf}", *admin])
            said.append(proc.stdout + proc.stderr)
            return "lifted: ceased" in proc.stdout

        sandbox.wait_for(lifted, 90, "root's release service to lift the hold", interval=1)
        assert said[-1] == f"{sandbox.user}: {job}: hold on Slurm job {held} lifted: ceased\n"
        ceased = user.events(job, "cessation")[-1]
        assert (ceased["verdict"], ceased["ended_slurm_job_id"]) == ("ceased", first), ceased
        assert user.events(job, "released")[-1]["by"] == "the site's release service (ceased)"
        sandbox.wait_for(
            lambda: (user.path / f"ran.{held}").exists(),
            60,
            f"the released job {held} to run again",
        )
        owner = (user.path / f"ran.{held}").stat().st_uid
        assert owner == sandbox.uid
        records = Path(sandbox.home) / ".local" / "state" / "slurm-dispatch"
        assert all(p.lstat().st_uid == sandbox.uid for p in records.rglob("*")), (
            "root wrote into the user's records"
        )
    finally:
        facts.chmod(mode)


def test_where_slurm_does_not_requeue_a_node_failure_is_resubmitted(user: User) -> None:
    """Sites with JobRequeue=0 (or --no-requeue, PreemptMode=CANCEL): a node failure
    ends an isolated job; the supervisor resubmits it while budget lasts, resuming from its
    latest publication."""
    sandbox = user.sandbox
    sandbox_lib.set_job_requeue(False, sandbox.dir)
    node = ""
    try:
        run_env = {"TOY_STEPS": "100000", "TOY_INTERVAL": "0.1", "TOY_SAVE_EVERY": "5"}
        job, first = user.submit(
            "--checkpoint", "ck", "--resubmit", "1", "-o", "out-%j.txt", "trainer.sh", env=run_env
        )
        sandbox.wait_for(lambda: user.status(job)["executions"], 60, "the first execution")
        old = user.status(job)["executions"][0]
        node = old["node"]
        sandbox.wait_for(lambda: store.latest(str(user.path / "ck")), 60, "a first save")
        sandbox_lib.partition(node, sandbox.dir)
        sandbox.wait_for(
            lambda: state_of(sandbox, first)[0] == "NODE_FAIL",
            120,
            f"job {first} to end with NODE_FAIL",
        )
        assert sandbox.job_state(first).get("Restarts") == "0", "Slurm requeued it"
        assert "resubmitted as submission 2" in user.supervise()
        second = sandbox.wait_for(
            lambda: [e for e in user.status(job)["executions"] if e["submission"] == 2],
            90,
            "submission 2 to start",
        )[0]
        assert second["epoch"] == 2_000_000
        assert second["resume_from"].startswith(old["exec_dir"] + "/checkpoint-")
    finally:
        if node:
            sandbox_lib.heal(node, sandbox.dir)
        sandbox_lib.set_job_requeue(True, sandbox.dir)


def test_the_loop_rides_out_a_controller_outage_and_resubmits_after(user: User) -> None:
    """`dispatch supervise --loop` went away for good once slurmctld was
    silent for about 90 s.  Here slurmctld is stopped for several passes (each squeue bounded
    at 3 s and tried once, so a pass fails fast, as a long outage would after its retries);
    the loop says each failed pass, records it, and resubmits the job that failed meanwhile
    once slurmctld is back."""
    sandbox = user.sandbox
    home = user.path / "home"
    env = {
        "DISPATCH_HOME": str(home),
        "DISPATCH_SLURM_TIMEOUT": "3",
        "DISPATCH_SLURM_ATTEMPTS": "1",
    }
    job, first = user.submit("--checkpoint", "ck", "--resubmit", "1", "failing.sh", env=env)
    sandbox.wait_for(
        lambda: state_of(sandbox, first)[0] == "FAILED", 60, "the first submission to fail"
    )

    def subs() -> list[dict[str, Any]]:
        return list(
            json.loads(user.run("dispatch", "status", "--json", job, env=env).stdout)["submissions"]
        )

    def seen() -> dict[str, Any]:
        beats = list(home.glob("supervisor-pass*.json"))  # @<cluster> where one is known
        try:
            found: dict[str, Any] = json.loads(beats[0].read_text()) if beats else {}
        except (OSError, ValueError):
            return {}
        return found

    sandbox_lib.stop_controller(sandbox.dir)
    loop = subprocess.Popen(
        sandbox_clients.command(
            [
                "env",
                f"SLURM_DISPATCH_CONF={user.conf}",
                *(f"{k}={v}" for k, v in env.items()),
                str(Path(sandbox.venv_bin) / "dispatch"),
                "supervise",
                "--loop",
                "--interval",
                "2",
            ],
            sandbox.dir,
            user=sandbox.user,
            cwd=user.path,
        ),
        env=sandbox.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        try:
            sandbox.wait_for(
                lambda: loop.poll() is not None or seen().get("failures", 0) >= 4,
                120,
                "four failed passes",
            )
            assert loop.poll() is None, f"the loop ended: {loop.communicate()}"
            down = seen()
            assert down["time"] is None and down["error"], down
        finally:
            sandbox_lib.start_controller(sandbox.dir)

        def resubmitted() -> bool:
            assert loop.poll() is None, f"the loop ended: {loop.communicate()}"
            return len(subs()) == 2 and not seen().get("failing_since")

        sandbox.wait_for(resubmitted, 120, "the resubmission after slurmctld came back", interval=1)
    finally:
        if loop.poll() is None:
            loop.terminate()
        out, err = loop.communicate(timeout=30)
    failed = [line for line in err.splitlines() if "pass failed" in line]
    assert len(failed) >= 4, err
    assert all(line.startswith("dispatch: ") and "squeue" in line for line in failed), err
    assert "the controller answers again, after" in out and "resubmitted as submission 2" in out
    assert subs()[1]["reason"] == "failed (budget 1)"
    text = user.run("dispatch", "status", job, env=env).stdout
    line = next(x for x in text.splitlines() if x.startswith("Supervisor"))
    assert "last good pass" in line and "failing" not in line, line


def test_submitting_without_a_supervisor_warns_and_a_pass_silences_it(user: User) -> None:
    """--resubmit does nothing without a supervisor; dispatch-sbatch says so
    (the job is submitted), until one has passed."""
    env = {"DISPATCH_HOME": str(user.path / "home")}
    proc = user.run(
        "dispatch-sbatch",
        "--checkpoint",
        "ck",
        "--resubmit",
        "1",
        "--begin",
        "now+1hour",
        "trainer.sh",
        env=env,
    )
    (line,) = [x for x in proc.stderr.splitlines() if "warning" in x]
    assert "--resubmit 1 acts only while `dispatch supervise` runs" in line
    assert "none has passed yet" in line and "dispatch-supervise.timer" in line
    first = proc.stdout.split("Submitted batch job ")[1].split()[0]
    assert state_of(user.sandbox, first)[0] == "PENDING"
    assert user.run("dispatch", "supervise", env=env).returncode == 0
    proc = user.run(
        "dispatch-sbatch",
        "--checkpoint",
        "ck2",
        "--shared-checkpoint",
        "--begin",
        "now+1hour",
        "trainer.sh",
        env=env,
    )
    assert "warning" not in proc.stderr, proc.stderr
    text = user.run("dispatch", "status", first, env=env).stdout
    assert "Supervisor  last good pass " in text, text


def test_dispatch_jobs_gives_up_near_slurms_timeout_when_the_controller_hangs(user: User) -> None:
    """On real Slurm: a slurmctld that is there but does not answer (stopped
    with SIGSTOP, as a hung or overloaded controller is) made `dispatch jobs` wait 84 s in
    silence.  It says what it waits for and gives up after one try and one retry, each bounded
    near MessageTimeout (the sandbox's 10 s: 1.2 x 10 + 2 s), with one line naming the
    controller; once the controller answers again, so does `dispatch jobs`."""
    job, slurm_id = user.submit("--checkpoint", "ck-hang", "--hold", "failing.sh")
    pid_file = sandbox_layout.Layout(Path(user.sandbox.dir)).slurmctld_pid_file
    pid = int(pid_file.read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        proc = user.run("dispatch", "jobs", check=False)
        took = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert [line for line in lines[:-1] if "waiting for slurmctld" in line], lines
    assert "did not answer squeue" in lines[-1] and "slurmctld" in lines[-1], lines
    assert took < 2 * 14 + 20, f"dispatch jobs took {took:.0f} s against a hung controller"
    listed = user.sandbox.wait_for(
        lambda: (out := user.run("dispatch", "jobs", check=False)).returncode == 0 and out,
        60,
        "dispatch jobs once slurmctld answers again",
        interval=1,
    )
    assert job in listed.stdout, listed.stdout
    user.sandbox.run(["scancel", slurm_id.split(";")[0]])


def test_a_pass_with_the_units_path_finds_dispatch_cease_and_lifts_the_hold(user: User) -> None:
    """The shipped user unit sets PATH without the venv's bin/, so with the
    default CessationSignal=dispatch-cease every pass said "dispatch-cease N: error" ('not
    found') and the hold waited 24 h.  A pass run as the unit runs it (its PATH, %h a home with
    no venv in it) finds dispatch-cease beside its own Python and lifts the hold."""
    job, held = held_after_a_failure(user)
    user.conf = site_conf(
        user.sandbox, user.path, CessationSignal="dispatch-cease", CessationInterval="1"
    )
    unit = Path(__file__).resolve().parents[2] / "contrib/systemd/dispatch-supervise.service"
    (path,) = re.findall(r"(?m)^Environment=PATH=(\S+)$", unit.read_text())
    path = path.replace("%h", str(user.path / "no-home"))
    said: list[str] = []

    def lifted() -> bool:
        said.append(user.run("dispatch", "supervise", check=False, env={"PATH": path}).stdout)
        return f"hold on Slurm job {held} lifted: ceased" in said[-1]

    user.sandbox.wait_for(lifted, 90, "the hold lifted by a pass with the unit's PATH", interval=1)
    assert not any(": error" in line for out in said for line in out.splitlines()), said
    assert user.events(job, "released")[-1]["by"] == "cessation signal"


def test_a_job_that_crashes_before_its_first_save_stops_after_max_no_progress(user: User) -> None:
    """No progress (docs/user-guide.md): a job that crashes before publishing anything is
    resubmitted until --max-no-progress executions in a row made no progress, not for its whole
    budget; status names those executions and the save they started from (none), and a person's
    resubmit goes on."""
    job, _ = user.submit(
        "--checkpoint", "ck", "--resubmit", "5", "--max-no-progress", "2", "failing.sh"
    )

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    user.sandbox.wait_for(finished, 120, f"{job} to stop for want of progress", interval=1)
    assert [s["submission"] for s in submissions(user, job)] == [1, 2]
    (stop,) = user.events(job, "no-progress")
    assert stop["action"] == "not resubmitted" and stop["resumed_from"] == [""]
    assert [e[:2] for e in stop["executions"]] == [[1, 0], [2, 0]]
    text = user.run("dispatch", "status", job).stdout
    assert (
        "NO-PROGRESS 2 execution(s) in a row (S1 R0, S2 R0) published nothing past the "
        "save they resumed from, nothing (a fresh start)" in text
    ), text
    assert user.supervise() == ""
    assert "submission 3" in user.run("dispatch", "resubmit", job).stdout


REQUEUES_ITSELF = (
    "#!/bin/bash\n#SBATCH --time=5\n"
    '[ "${SLURM_RESTART_COUNT:-0}" = 0 ] || { echo ran again; exit 0; }\n'
    'scontrol requeue "$SLURM_JOB_ID"; sleep 60\n'
)


def requeued_once(user: User, *options: str) -> tuple[str, str]:
    """A job that requeues itself once, submitted with ``options``, pending again after its
    requeue: (dispatch job, Slurm job)."""
    (user.path / "requeue.sh").write_text(REQUEUES_ITSELF)
    (user.path / "requeue.sh").chmod(0o755)
    shutil.chown(user.path / "requeue.sh", user.sandbox.user)
    job, slurm_id = user.submit("--checkpoint", "ck", *options, "requeue.sh")

    def requeued() -> bool:
        state = user.sandbox.job_state(slurm_id)
        return state.get("JobState") == "PENDING" and state.get("Restarts") == "1"

    user.sandbox.wait_for(requeued, 90, f"Slurm job {slurm_id} to be requeued")
    return job, slurm_id


def test_slurms_requeued_job_without_progress_is_held_until_dispatch_release(user: User) -> None:
    """No progress: Slurm's requeue (here the job's own) of a job whose last execution
    made no progress: the pass holds the pending job (JobHeldUser); `dispatch release` lets it
    run again, and the next pass does not hold it again."""
    job, slurm_id = requeued_once(user, "--max-no-progress", "1")
    sandbox = user.sandbox
    said = user.supervise()
    assert f"Slurm job {slurm_id} is held" in said, said
    assert state_of(sandbox, slurm_id) == ("PENDING", "JobHeldUser")
    assert (
        "No progress 1 execution(s) in a row (S1 R0)" in user.run("dispatch", "status", job).stdout
    )
    assert "released Slurm job" in user.run("dispatch", "release", job).stdout
    assert state_of(sandbox, slurm_id)[1] != "JobHeldUser"
    assert f"Slurm job {slurm_id} is held" not in user.supervise()
    assert state_of(sandbox, slurm_id)[1] != "JobHeldUser"
    (stop,) = user.events(job, "no-progress")
    assert stop["action"] == "held"


POISONED = """#!/bin/bash
#SBATCH --time=5
case "$DISPATCH_RESUME_FROM" in
  */checkpoint-20) echo "cannot load $DISPATCH_RESUME_FROM"; exit 3;;
  */checkpoint-10) echo "resumed from $DISPATCH_RESUME_FROM"; exit 0;;
esac
for s in 10 20; do
  mkdir "$DISPATCH_EXEC_DIR/checkpoint-$s" &&
    dispatch publish --step "$s" "$DISPATCH_EXEC_DIR/checkpoint-$s" || exit 9
done
exit 3
"""


def test_a_save_that_makes_every_resume_crash_is_quarantined_and_passed_over(user: User) -> None:
    """A poisoned save (docs/user-guide.md): two executions resume from checkpoint-20 and crash
    before publishing; the pass quarantines it (a mark in the root) and resubmits; the next
    execution resumes from checkpoint-10, says it passed over checkpoint-20, and completes.  Status
    and list show the mark, cleanup keeps the quarantined latest, and unquarantine lifts it."""
    (user.path / "poisoned.sh").write_text(POISONED)
    (user.path / "poisoned.sh").chmod(0o755)
    shutil.chown(user.path / "poisoned.sh", user.sandbox.user)
    job, _ = user.submit("--checkpoint", "ck", "--resubmit", "5", "-o", "out-%j.txt", "poisoned.sh")

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    user.sandbox.wait_for(finished, 240, f"{job} to finish", interval=1)
    subs = submissions(user, job)
    assert [s["state"] for s in subs] == ["FAILED", "FAILED", "FAILED", "COMPLETED"], subs
    (event,) = user.events(job, "quarantined")
    poisoned = event["save"]
    assert poisoned.endswith("/checkpoint-20") and [e[:2] for e in event["executions"]] == [
        [2, 0],
        [3, 0],
    ]
    last = user.status(job)["executions"][-1]
    assert last["resume_from"].endswith("/checkpoint-10")
    out = (user.path / f"out-{subs[-1]['slurm_job_id']}.txt").read_text()
    assert f"passed over quarantined save(s) {poisoned}" in out, out
    root = str(user.path / "ck")
    assert f"Quarantined {poisoned}: passed over" in user.run("dispatch", "status", job).stdout
    listed = user.run("dispatch", "list", "--root", root).stdout.splitlines()
    assert listed[-1].split()[-2:] == [poisoned, "quarantined"], listed
    kept = user.run("dispatch", "gc", "--root", root, "--keep", "1", "--dry-run").stdout
    assert "quarantined, the latest" in kept, kept
    user.run("dispatch", "unquarantine", "--root", root, poisoned)
    assert user.run("dispatch", "latest", "--root", root).stdout.strip() == poisoned


def test_an_exit_code_that_means_stop_is_never_restarted(user: User) -> None:
    """Recovery by exit code (docs/user-guide.md): failing.sh exits 3; with --stop-on-exit 3 the job
    stops after its first submission whatever its budget, the rule recorded with the decision; with
    --restart-on-exit 3 it is restarted without spending its budget of 0, until
    --max-no-progress 2 stops it."""
    job, _ = user.submit(
        "--checkpoint", "ck", "--resubmit", "3", "--stop-on-exit", "3", "failing.sh"
    )

    def finished(one: str) -> bool:
        user.supervise()
        return bool(user.events(one, "finished"))

    user.sandbox.wait_for(lambda: finished(job), 120, f"{job} to stop", interval=1)
    assert len(submissions(user, job)) == 1
    (done,) = user.events(job, "finished")
    assert done["rule"] == "stop (exit code 3: --stop-on-exit)"
    again, _ = user.submit(
        "--checkpoint", "ck2", "--restart-on-exit", "3", "--max-no-progress", "2", "failing.sh"
    )
    user.sandbox.wait_for(lambda: finished(again), 180, f"{again} to stop", interval=1)
    assert [s["reason"] for s in submissions(user, again)][1:] == [
        "failed (exit 3, budget not spent)"
    ]
    assert user.events(again, "no-progress")


def test_requeues_past_the_max_requeues_are_held_until_dispatch_release(user: User) -> None:
    """Slurm's requeues on a budget (docs/user-guide.md): a job Slurm requeues (here its own
    requeue, publishing nothing) with --max-requeues 0 and no --max-no-progress: its first requeue
    is past the budget, so the pass holds the pending job; `dispatch release` lets it run, and it is
    not held again."""
    job, slurm_id = requeued_once(user, "--max-requeues", "0", "--max-no-progress", "0")
    sandbox = user.sandbox
    said = user.supervise()
    assert f"past its --max-requeues 0: Slurm job {slurm_id} is held" in said, said
    assert state_of(sandbox, slurm_id) == ("PENDING", "JobHeldUser")
    assert "Requeues    Slurm requeued it 1 time(s)" in user.run("dispatch", "status", job).stdout
    assert "released Slurm job" in user.run("dispatch", "release", job).stdout
    assert state_of(sandbox, slurm_id)[1] != "JobHeldUser"
    assert "is held" not in user.supervise()
    (spent,) = user.events(job, "requeues-spent")
    assert (spent["used"], spent["budget"]) == (1, 0)


FAILS_ON_N1 = (
    '#!/bin/bash\n#SBATCH --time=5\necho "on $SLURMD_NODENAME"\n'
    '[ "$SLURMD_NODENAME" != n1 ] || { echo failing on n1; exit 3; }\n'
)


def blockers(user: User, *nodes: str) -> dict[str, str]:
    """A plain job of the user's holding each of ``nodes`` whole (no dispatch marker: the
    supervisor leaves it alone), running: {node: Slurm job}."""
    held = {
        node: user.sandbox.submit(
            "#!/bin/sh\nsleep 600\n", "-w", node, "--exclusive", "-o", "/dev/null"
        )
        for node in nodes
    }
    for node, slurm_id in held.items():
        user.sandbox.wait_for(
            lambda s=slurm_id: state_of(user.sandbox, s)[0] == "RUNNING",
            60,
            f"the blocker on {node} running",
        )
    return held


def test_a_node_that_fails_a_job_twice_is_excluded_from_its_next_submission(user: User) -> None:
    """Bad nodes avoided (docs/user-guide.md): with --avoid-bad-nodes 2, a job failing twice on n1
    (the only node free) is resubmitted with --exclude=n1: it waits while n2 and n3 are busy, then
    runs on one of them and completes, and dispatch status names n1 and why."""
    sandbox = user.sandbox
    (user.path / "fails.sh").write_text(FAILS_ON_N1)
    shutil.chown(user.path / "fails.sh", sandbox.user)
    held = blockers(user, "n2", "n3")
    job, _ = user.submit(
        "--checkpoint",
        "ck",
        "--resubmit",
        "3",
        "--avoid-bad-nodes",
        "2",
        "--max-no-progress",
        "0",
        "--quarantine-after",
        "0",
        "fails.sh",
    )
    try:

        def third() -> list[dict[str, Any]]:
            user.supervise()
            subs = submissions(user, job)
            return subs if len(subs) >= 3 else []

        subs = sandbox.wait_for(third, 120, f"{job}'s third submission", interval=1)
        assert [s["state"] for s in subs[:2]] == ["FAILED", "FAILED"]
        assert [e["node"] for e in user.status(job)["executions"]] == ["n1", "n1"]
        slurm_id = str(subs[2]["slurm_job_id"])
        assert sandbox.job_state(slurm_id).get("ExcNodeList") == "n1"
        assert state_of(sandbox, slurm_id)[0] == "PENDING"  # n1 excluded, n2 and n3 busy
    finally:
        sandbox.run(["scancel", *held.values()])

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    sandbox.wait_for(finished, 120, f"{job} to finish on another node", interval=1)
    assert [s["state"] for s in submissions(user, job)] == ["FAILED", "FAILED", "COMPLETED"]
    assert user.status(job)["executions"][-1]["node"] in ("n2", "n3")
    (avoided,) = user.events(job, "node-avoided")
    assert (avoided["node"], avoided["why"]) == ("n1", "failed")
    text = user.run("dispatch", "status", job).stdout
    assert "Bad nodes   avoids n1 (2 failed executions: " in text, text
    assert f"Bad nodes   n1 kept off submission 3 (Slurm job {slurm_id})" in text, text


def test_a_node_failure_excludes_the_node_from_the_requeued_job(user: User) -> None:
    """Bad nodes avoided: a job Slurm requeues off a node cut from the network (NODE_FAIL)
    gets that node in its pending job's ExcNodeList from the next pass: once the node is back
    and another frees, the job runs on the other, not on the node that failed it."""
    sandbox = user.sandbox
    (user.path / "long.sh").write_text(
        '#!/bin/bash\n#SBATCH --time=5\necho "on $SLURMD_NODENAME"; sleep 600\n'
    )
    shutil.chown(user.path / "long.sh", sandbox.user)
    held = blockers(user, "n2", "n3")
    healed = False
    try:
        job, slurm_id = user.submit(
            "--checkpoint", "ck", "--avoid-bad-nodes", "2", "--max-no-progress", "0", "long.sh"
        )
        sandbox.wait_for(lambda: user.status(job)["executions"], 60, "the first execution")
        assert user.status(job)["executions"][0]["node"] == "n1"
        sandbox_lib.partition("n1", sandbox.dir)
        try:

            def requeued() -> bool:
                state = sandbox.job_state(slurm_id)
                return state.get("JobState") == "PENDING" and state.get("Restarts") == "1"

            sandbox.wait_for(requeued, 120, f"Slurm job {slurm_id} requeued off n1")
            said = user.supervise()
            assert f"avoids node n1 (node failure under Slurm job {slurm_id} restart 0)" in said, (
                said
            )
            assert f"n1 kept off requeued Slurm job {slurm_id} (restart 1)" in said, said
            assert sandbox.job_state(slurm_id).get("ExcNodeList") == "n1"
        finally:
            sandbox_lib.heal("n1", sandbox.dir)
            healed = True
        # n1 idle again, n2 freed: Slurm would take n1 first; the job runs on n2.
        sandbox.run(["scancel", held.pop("n2")])
        sandbox.wait_for(
            lambda: state_of(sandbox, slurm_id)[0] == "RUNNING",
            90,
            f"Slurm job {slurm_id} running again",
        )
        assert sandbox.job_state(slurm_id).get("NodeList") == "n2"
        text = user.run("dispatch", "status", job).stdout
        assert "Bad nodes   avoids n1 (node failure under" in text, text
        sandbox.run(["scancel", slurm_id])
    finally:
        if not healed:
            sandbox_lib.heal("n1", sandbox.dir)
        if held:
            sandbox.run(["scancel", *held.values()])


def test_a_bad_node_the_job_asks_for_stays_in_and_the_job_runs_again(user: User) -> None:
    """A job asking for n1 (#SBATCH -w n1) that fails there with --avoid-bad-nodes 1: sbatch
    refuses --exclude=n1 beside it ('Invalid node name specified'), so each pass's
    resubmission failed and the job never ran again.  n1 stays in, said, and the job runs
    there again until its budget is spent."""
    sandbox = user.sandbox
    (user.path / "asks.sh").write_text(
        FAILS_ON_N1.replace("#SBATCH --time=5\n", "#SBATCH --time=5\n#SBATCH -w n1\n")
    )
    shutil.chown(user.path / "asks.sh", sandbox.user)
    job, _ = user.submit(
        "--checkpoint",
        "ck",
        "--resubmit",
        "1",
        "--avoid-bad-nodes",
        "1",
        "--max-no-progress",
        "0",
        "--quarantine-after",
        "0",
        "asks.sh",
    )
    errors: list[str] = []

    def finished() -> bool:
        said = user.supervise()
        errors.extend(
            line
            for line in said.splitlines()
            if "failed" in line and "submission 2" in line and "Invalid node" in line
        )
        assert not errors, said
        return bool(user.events(job, "finished"))

    sandbox.wait_for(finished, 150, f"{job} to run twice and stop", interval=1)
    assert [s["state"] for s in submissions(user, job)] == ["FAILED", "FAILED"]
    assert [e["node"] for e in user.status(job)["executions"]] == ["n1", "n1"]
    (excluded,) = user.events(job, "nodes-excluded")
    assert (excluded["nodes"], excluded["asked"]) == ([], ["n1"])
    text = user.run("dispatch", "status", job).stdout
    assert "n1 left in: the job asks for it (--nodelist)" in text, text


def test_a_persons_resubmission_keeps_the_bad_node_off(user: User) -> None:
    """`dispatch resubmit` after the budget is spent: the lineage's bad node stays off the
    new Slurm job (before, it was submitted without it, status still saying 'avoids n1')."""
    sandbox = user.sandbox
    (user.path / "fails.sh").write_text(
        '#!/bin/bash\n#SBATCH --time=5\necho "on $SLURMD_NODENAME"; exit 3\n'
    )
    shutil.chown(user.path / "fails.sh", sandbox.user)
    held = blockers(user, "n2", "n3")
    try:
        job, _ = user.submit(
            "--checkpoint",
            "ck",
            "--resubmit",
            "1",
            "--avoid-bad-nodes",
            "1",
            "--max-no-progress",
            "0",
            "--quarantine-after",
            "0",
            "fails.sh",
        )

        def second() -> list[dict[str, Any]]:
            user.supervise()
            subs = submissions(user, job)
            return subs if len(subs) >= 2 else []

        subs = sandbox.wait_for(second, 120, f"{job}'s second submission", interval=1)
        assert sandbox.job_state(str(subs[1]["slurm_job_id"])).get("ExcNodeList") == "n1"
    finally:
        sandbox.run(["scancel", *held.values()])

    def finished() -> bool:
        user.supervise()
        return bool(user.events(job, "finished"))

    sandbox.wait_for(finished, 120, f"{job} to stop, its budget spent", interval=1)
    out = user.run("dispatch", "resubmit", job).stdout
    slurm_id = str(submissions(user, job)[-1]["slurm_job_id"])
    assert f"Bad nodes: n1 kept off submission 3 (Slurm job {slurm_id})" in out, out
    assert sandbox.job_state(slurm_id).get("ExcNodeList") == "n1"
    sandbox.run(["scancel", slurm_id])
