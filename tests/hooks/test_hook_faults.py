"""The fault matrix: every hook, every fault of ours, exits 0 within its bound and changes
nothing outside the intended folders.

Each hook runs as Slurm runs it: a fresh system interpreter with ``-I``, no PATH, only Slurm's
variables.  Needs root (it mounts small tmpfs and ext4 file systems to make a store full,
read-only or hung, and runs hooks as another user).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
TIMEOUT = 1.0  # HookTimeout in these tests
BOUND = TIMEOUT + 1.5  # what a hook may take at most, interpreter start included
UID, GID = 4321, 4322

CONTEXT = {
    "prolog": "prolog_slurmd",
    "epilog": "epilog_slurmd",
    "prolog-slurmctld": "prolog_slurmctld",
    "epilog-slurmctld": "epilog_slurmctld",
    "recheck": None,
}
HOOKS = list(CONTEXT)


@pytest.fixture(scope="module", autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the hook fault matrix needs root (mounts, other users)")


@pytest.fixture(scope="module")
def code_dir() -> Iterator[Path]:
    """A world-readable copy of the package, so hooks can run as an unprivileged user."""
    top = Path(tempfile.mkdtemp(prefix="dispatch-hooks-code-"))
    os.chmod(top, 0o755)
    shutil.copytree(
        REPO / "slurm_dispatch",
        top / "slurm_dispatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for folder, _, files in os.walk(top):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    yield top
    shutil.rmtree(top)


@dataclass
class Outcome:
    rc: int
    seconds: float
    log: str


@dataclass
class World:
    """A scratch folder with a root-owned StateDir, a dispatch.conf and an 'outside' folder."""

    root: Path
    state: Path
    conf: Path
    outside: Path
    code: Path

    def write_conf(self, text: str | None = None) -> None:
        self.conf.write_text(
            text if text is not None else f"StateDir={self.state}\nHookTimeout={TIMEOUT}\n"
        )

    def env(self, hook: str, **extra: str) -> dict[str, str]:
        env = {"SLURM_DISPATCH_CONF": str(self.conf)}
        if hook != "recheck":
            env.update(
                {
                    "SLURM_JOB_ID": "500",
                    "SLURM_JOB_UID": str(UID),
                    "SLURM_JOB_GID": str(GID),
                    "SLURM_JOB_USER": "someone",
                    "SLURM_JOB_RESTART_COUNT": "0",
                    "SLURM_JOB_NODELIST": "n[1-2]",
                }
            )
            if hook in ("prolog", "epilog"):
                env["SLURMD_NODENAME"] = "n1"
        context = CONTEXT[hook]
        if context:
            env["SLURM_SCRIPT_CONTEXT"] = context
        env.update(extra)
        return {k: v for k, v in env.items() if v != "<unset>"}

    def run(
        self,
        hook: str,
        env: dict[str, str] | None = None,
        user: str | None = None,
        hint: str | None = None,
        wrap: list[str] | None = None,
    ) -> Outcome:
        program = (
            f"import sys; sys.path.insert(0, {str(self.code)!r}); "
            f"from slurm_dispatch.hooks import run; run({(hint or hook.split('-')[0])!r})"
        )
        log_path = self.root / f"hook-{time.monotonic_ns()}.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            # stderr to a file, not a pipe: a child stuck on a hung file system keeps it open.
            proc = subprocess.run(
                [*(wrap or []), PYTHON, "-I", "-c", program],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env or self.env(hook),
                cwd="/",
                timeout=BOUND + 10,
                user=user,
            )
        seconds = time.monotonic() - started
        return Outcome(proc.returncode, seconds, log_path.read_text(errors="replace"))

    def files(self, folder: Path) -> list[str]:
        return (
            sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
        )


@pytest.fixture()
def world(code_dir: Path) -> Iterator[World]:
    root = Path(tempfile.mkdtemp(prefix="dispatch-hooks-"))
    os.chmod(root, 0o755)
    state = root / "state"
    state.mkdir(mode=0o755)
    outside = root / "outside"
    outside.mkdir(mode=0o777)
    os.chmod(outside, 0o777)
    w = World(root, state, root / "dispatch.conf", outside, code_dir)
    w.write_conf()
    yield w
    subprocess.run(["umount", "-l", str(state)], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def settled(outcome: Outcome) -> None:
    assert outcome.rc == 0, outcome.log
    assert outcome.seconds < BOUND, f"took {outcome.seconds:.2f} s\n{outcome.log}"


def fact_files(w: World) -> list[str]:
    return [f for f in w.files(w.state / "facts") if f.count("/") == 2]


# --------------------------------------------------------------------------------------------


def test_baseline_every_hook_records(world: World) -> None:
    for hook in HOOKS:
        settled(world.run(hook))
    names = [f.split("/")[-1].split(".")[0] for f in fact_files(world)]
    assert sorted(names) == ["ctld-end", "ctld-start", "end", "start"]
    assert world.files(world.outside) == []


@pytest.mark.parametrize("hook", HOOKS)
def test_missing_config_file(world: World, hook: str) -> None:
    world.conf.unlink()
    default = Path("/var/lib/slurm-dispatch")
    existed = default.exists()
    outcome = world.run(hook)
    settled(outcome)
    assert "no such file" in outcome.log
    # The defaults apply, and a hook never creates a StateDir.
    assert default.exists() == existed
    assert fact_files(world) == []


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize(
    "text", ["\xff\xfe garbage \x00", "StateDir=relative\nHookTimeout=x\n", "Nonsense=1\n=\n"]
)
def test_garbled_config(world: World, hook: str, text: str) -> None:
    world.conf.write_bytes(text.encode("latin-1"))
    outcome = world.run(hook)
    settled(outcome)
    assert "dispatch.conf" in outcome.log
    assert fact_files(world) == []


@pytest.mark.parametrize("hook", HOOKS)
def test_state_dir_missing(world: World, hook: str) -> None:
    world.state.rmdir()
    outcome = world.run(hook)
    settled(outcome)
    if hook != "recheck":
        assert "cannot open StateDir" in outcome.log
    assert not world.state.exists()


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("how", ["world-writable", "owned-by-a-user"])
def test_state_dir_a_user_could_write_is_refused(world: World, hook: str, how: str) -> None:
    if how == "world-writable":
        os.chmod(world.state, 0o777)
    else:
        os.chown(world.state, UID, GID)
    outcome = world.run(hook)
    settled(outcome)
    if hook != "recheck":
        assert "refusing to use it" in outcome.log
    assert fact_files(world) == []


@pytest.mark.parametrize("hook", HOOKS)
def test_read_only_store(world: World, hook: str) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(world.state)], check=True
    )
    subprocess.run(["mount", "-o", "remount,ro", str(world.state)], check=True)
    outcome = world.run(hook)
    settled(outcome)
    if hook != "recheck":
        assert "Read-only file system" in outcome.log


@pytest.mark.parametrize("hook", ["prolog", "epilog", "prolog-slurmctld", "epilog-slurmctld"])
def test_full_store_leaves_no_partial_fact(world: World, hook: str) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=0755", "tmpfs", str(world.state)], check=True
    )
    fd = os.open(world.state / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    outcome = world.run(hook)
    settled(outcome)
    assert "No space left on device" in outcome.log
    assert fact_files(world) == []


@pytest.mark.parametrize("hook", ["prolog", "epilog", "prolog-slurmctld", "epilog-slurmctld"])
@pytest.mark.parametrize(
    "variable,value,words",
    [
        ("SLURM_JOB_ID", "<unset>", "$SLURM_JOB_ID is not set"),
        ("SLURM_JOB_UID", "<unset>", "$SLURM_JOB_UID is not set"),
        ("SLURM_JOB_GID", "abc", "is not a number"),
        ("SLURM_JOB_ID", "../../outside/x", "is not a plain name"),
        ("SLURM_JOB_RESTART_COUNT", "-1", "is not a number"),
        # Digits of another script: str.isdigit() says yes and int() reads them (4321, 1).
        ("SLURM_JOB_UID", "\u0664\u0663\u0662\u0661", "is not a number"),
        ("SLURM_JOB_RESTART_COUNT", "\u0661", "is not a number"),
    ],
)
def test_missing_or_bad_variables(
    world: World, hook: str, variable: str, value: str, words: str
) -> None:
    outcome = world.run(hook, world.env(hook, **{variable: value}))
    settled(outcome)
    assert words in outcome.log
    assert fact_files(world) == [] and world.files(world.outside) == []


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_missing_node_name(world: World, hook: str) -> None:
    outcome = world.run(hook, world.env(hook, SLURMD_NODENAME="<unset>"))
    settled(outcome)
    assert "$SLURMD_NODENAME is not set" in outcome.log


def start_fact(w: World) -> dict:
    import json

    (name,) = [f for f in fact_files(w) if f.split("/")[-1].split(".")[0].endswith("start")]
    return json.loads((w.state / "facts" / name).read_text())


@pytest.mark.parametrize("hook", ["prolog", "prolog-slurmctld"])
@pytest.mark.parametrize(
    "array,task,recorded",
    [
        ("97", "1", {"array_job_id": "97", "array_task_id": "1"}),
        ("<unset>", "<unset>", {}),  # not an array's task: nothing said
        ("9 7", "1", {"array_task_id": "1"}),
        ("97", "-1", {"array_job_id": "97"}),
        ("\u0669\u0667", "1/..", {}),  # Arabic-Indic digits are digits to str.isdigit
        ("12345678901", "", {}),  # longer than any uint32 job id; an empty task id
    ],
)
def test_an_array_tasks_start_names_its_array_and_a_bad_value_is_absent(
    world: World, hook: str, array: str, task: str, recorded: dict[str, str]
) -> None:
    # Facts are filed under the task's own SLURM_JOB_ID (500 here); the records name the
    # array and A_T, which these two fields tie the folder to (node/prune.py).
    outcome = world.run(hook, world.env(hook, SLURM_ARRAY_JOB_ID=array, SLURM_ARRAY_TASK_ID=task))
    settled(outcome)
    fact = start_fact(world)
    assert fact["job_id"] == "500"
    assert {k: v for k, v in fact.items() if k.startswith("array_")} == recorded
    assert "Traceback" not in outcome.log


def test_an_unexpected_exception_is_logged(world: World) -> None:
    outcome = world.run("recheck", {"SLURM_DISPATCH_CONF": str(world.conf)}, hint="bogus")
    settled(outcome)
    assert "ValueError" in outcome.log and "cannot tell which hook" in outcome.log


@pytest.mark.parametrize("hook", HOOKS)
def test_run_as_the_jobs_user(world: World, hook: str) -> None:
    # Even with the facts folder already there, a user cannot add to it.
    settled(world.run("prolog"))
    before = world.files(world.state)
    outcome = world.run(hook, user="nobody")
    settled(outcome)
    assert world.files(world.state) == before
    if hook != "recheck":
        assert "refusing" in outcome.log or "Permission denied" in outcome.log


@pytest.mark.parametrize("hook", ["prolog", "epilog", "epilog-slurmctld"])
@pytest.mark.parametrize(
    "where", ["facts", f"facts/{UID}", f"facts/{UID}/500", "watch", "state-itself"]
)
def test_planted_symlinks_are_not_followed(world: World, hook: str, where: str) -> None:
    if where == "state-itself":
        world.state.rmdir()
        world.state.symlink_to(world.outside)
        os.chown(world.outside, UID, GID)
    else:
        link = world.state / where
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(world.outside)
    outcome = world.run(hook)
    settled(outcome)
    assert world.files(world.outside) == []


def test_planted_fifo_in_the_job_folder_does_not_hang_the_epilog(world: World) -> None:
    settled(world.run("prolog"))
    job = world.state / f"facts/{UID}/500"
    os.mkfifo(job / "start.n1.0.0000000000000000deadbeef")
    os.chmod(job / "start.n1.0.0000000000000000deadbeef", 0o640)
    outcome = world.run("epilog")
    settled(outcome)
    assert any(f.split("/")[-1].startswith("end.n1.") for f in fact_files(world))
    # Readers open facts with O_NONBLOCK and name what is not a regular file.
    sys.path.insert(0, str(world.code))
    from slurm_dispatch.node import facts

    _, problems = facts.read_job_facts(str(world.state), UID, "500")
    assert any("not a regular file" in p for p in problems)


@pytest.fixture()
def frozen(world: World) -> Iterator[World]:
    """StateDir on an ext4 file system that is frozen: every write blocks, uninterruptibly."""
    image = world.root / "fs.img"
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(world.state)], check=True)
    os.chmod(world.state, 0o755)
    (world.state / "lost+found").rmdir()
    subprocess.run(["fsfreeze", "-f", str(world.state)], check=True)
    try:
        yield world
    finally:
        subprocess.run(["fsfreeze", "-u", str(world.state)], capture_output=True)
        # The children the hooks left behind die once the file system thaws.
        time.sleep(0.2)
        subprocess.run(["umount", "-l", str(world.state)], capture_output=True)


@pytest.mark.parametrize("hook", ["prolog", "epilog", "prolog-slurmctld", "epilog-slurmctld"])
def test_hung_file_system(frozen: World, hook: str) -> None:
    outcome = frozen.run(hook)
    settled(outcome)
    assert "gave up" in outcome.log
    assert outcome.seconds >= TIMEOUT * 0.9


@pytest.fixture()
def full_syslog(world: World) -> Iterator[list[str]]:
    """A /dev/log whose queue is full, so that every syslog call blocks: the hook runs in a
    mount namespace of its own where /dev/log is this test's datagram socket, never read."""
    import socket

    path = world.root / "log.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client.setblocking(False)
    try:
        while True:
            client.sendto(b"<3>filler", str(path))
    except BlockingIOError:
        pass
    script = (
        "mount --make-rprivate / && mount -t tmpfs -o size=64k tmpfs /dev && "
        "mknod -m 666 /dev/null c 1 3 && : > /dev/log && "
        f'mount --bind {path} /dev/log && exec "$@"'
    )
    try:
        yield ["unshare", "-m", "sh", "-c", script, "hook"]
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("hook", ["prolog", "epilog-slurmctld"])
def test_a_blocking_syslog_does_not_hold_the_hook(
    frozen: World, full_syslog: list[str], hook: str
) -> None:
    # The child hangs on the frozen store; at the deadline the parent logs "gave up", and
    # syslog blocks on the full /dev/log: the parent must still exit 0 in time.
    outcome = frozen.run(hook, wrap=full_syslog)
    settled(outcome)
    assert "gave up" in outcome.log


@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_an_epilog_records_its_end_whatever_watch_is(world: World, planted: str) -> None:
    # watch/ holds only survivors to re-check; one that cannot be opened (a symlink, a file:
    # refused, never followed) cost every Epilog of the machine its end, the scan included,
    # so no execution there was ever proven (3eb23af noticed it).  The end needs no watch/.
    settled(world.run("prolog"))
    watch = world.state / "watch"
    if planted == "symlink":
        watch.symlink_to(world.outside)
    else:
        watch.write_text("")
    outcome = world.run("epilog")
    settled(outcome)
    assert any(f.split("/")[-1].startswith("end.n1.") for f in fact_files(world)), outcome.log
    assert world.files(world.outside) == []


@pytest.mark.parametrize("hook", ["prolog-slurmctld", "epilog-slurmctld", "recheck"])
def test_a_hook_that_finds_no_configuration_says_so_and_is_counted(world: World, hook: str) -> None:
    """slurmctld gives PrologSlurmctld and EpilogSlurmctld no SLURM_CONF and
    slurmd gives HealthCheckProgram none, so a part with DISPATCH_CONF empty on a site whose
    slurm.conf is not /etc/slurm/slurm.conf found no dispatch.conf, took the defaults, failed on
    the missing StateDir, and was counted nowhere (MetricsDir is unset in the defaults).  It now
    says where it looked and what to set, and counts the run where no configuration is needed.
    Run in a mount namespace of its own where /etc/slurm and /var/lib are empty (the host's
    default StateDir, if any, is out of sight) and /run is this test's folder."""
    run = world.root / "run"
    run.mkdir(mode=0o755)
    script = (
        "mount --make-rprivate / && mount -t tmpfs tmpfs /var/lib && "
        "{ [ ! -d /etc/slurm ] || mount -t tmpfs tmpfs /etc/slurm; } && "
        f'mount --bind {run} /run && exec "$@"'
    )
    wrap = ["unshare", "-m", "sh", "-c", script, "hook"]
    env = world.env(hook, SLURM_DISPATCH_CONF="<unset>")
    if hook == "recheck":
        env["SLURMD_NODENAME"] = "n1"  # all slurmd gives HealthCheckProgram
    assert "SLURM_CONF" not in env and "SLURM_DISPATCH_CONF" not in env
    for count in (1, 2):
        outcome = world.run(hook, env=env, wrap=wrap)
        settled(outcome)
        assert (
            f"{hook} job {'500' if hook != 'recheck' else '?'}: found no dispatch.conf "
            f"(looked for /etc/slurm/dispatch.conf: Slurm gives {hook} no SLURM_CONF, so "
            "beside /etc/slurm/slurm.conf) and the default StateDir /var/lib/slurm-dispatch "
            "does not exist: recording nothing; set DISPATCH_CONF= at the top of this hook "
            "part to the site's dispatch.conf"
        ) in outcome.log, outcome.log
        counted = (run / "slurm-dispatch/slurm-dispatch-unconfigured.prom").read_text()
        assert (
            f'slurm_dispatch_hook_runs_unconfigured_total{{hook="{hook}"}} {count}\n' in counted
        ), counted
    assert fact_files(world) == []


@pytest.mark.parametrize("hook", ["prolog-slurmctld", "recheck"])
def test_a_hook_whose_dispatch_conf_knob_names_a_missing_file_says_that(
    world: World, hook: str
) -> None:
    """Attack on a slurm.conf outside /etc/slurm: the part's DISPATCH_CONF set, with a typo
    (/etc/slrum/...): the hook said it found no dispatch.conf because 'Slurm gives <hook> no
    SLURM_CONF' and told the admin to set DISPATCH_CONF=, which they had.  It names the file the
    knob gave."""
    run = world.root / "run"
    run.mkdir(mode=0o755)
    script = (
        "mount --make-rprivate / && mount -t tmpfs tmpfs /var/lib && "
        f'mount --bind {run} /run && exec "$@"'
    )
    wrap = ["unshare", "-m", "sh", "-c", script, "hook"]
    typo = str(world.root / "etc" / "slrum" / "dispatch.conf")
    env = world.env(hook, SLURM_DISPATCH_CONF=typo)
    if hook == "recheck":
        env["SLURMD_NODENAME"] = "n1"
    outcome = world.run(hook, env=env, wrap=wrap)
    settled(outcome)
    assert "no SLURM_CONF" not in outcome.log and "set DISPATCH_CONF= at" not in outcome.log, (
        outcome.log
    )
    assert (
        f"DISPATCH_CONF (SLURM_DISPATCH_CONF) names {typo}, which cannot be read (no such file)"
    ) in outcome.log, outcome.log
    counted = (run / "slurm-dispatch/slurm-dispatch-unconfigured.prom").read_text()
    assert f'slurm_dispatch_hook_runs_unconfigured_total{{hook="{hook}"}} 1\n' in counted
    assert fact_files(world) == []
