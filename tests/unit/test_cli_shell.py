"""One shell for dispatch, dispatch-sbatch, dispatch-cease and dispatch-sandbox: how each ends.

Every command runs as a real process here: an error is one line ``<prog>: <message>`` on
stderr with its class's exit code and no traceback; a closed pipe is quiet; Ctrl-C is 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {
    "dispatch": [sys.executable, "-m", "slurm_dispatch.cli.dispatch"],
    "dispatch-sbatch": [sys.executable, "-m", "slurm_dispatch.cli.sbatch"],
    "dispatch-cease": [sys.executable, "-m", "slurm_dispatch.cli.cease"],
    "dispatch-sandbox": [sys.executable, str(REPO / "bin" / "dispatch-sandbox")],
}


def as_at_a_terminal() -> None:
    """In the child before exec: Ctrl-C's default disposition.  A command started in the
    background of a shell without job control inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt; a user at a terminal does not have it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def command(
    prog: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMANDS[prog], *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def one_error_line(
    proc: subprocess.CompletedProcess[str], prog: str, code: int, words: str
) -> None:
    assert (proc.returncode, proc.stdout) == (code, ""), (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: ") and words in lines[0], lines


def test_dispatch_errors_end_with_their_class_code(tmp_path: Path) -> None:
    one_error_line(
        command("dispatch", "latest", "--root", str(tmp_path / "missing")), "dispatch", 2, "missing"
    )
    save = tmp_path / "exec" / "a" / "c"
    save.mkdir(parents=True)
    refused = command(
        "dispatch", "publish", "--root", str(tmp_path), "--epoch", "1000000", "--step", "1", "/etc"
    )
    one_error_line(refused, "dispatch", 1, "'/etc'")


def test_dispatch_sbatch_errors_end_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    one_error_line(
        command("dispatch-sbatch", str(script), cwd=tmp_path),
        "dispatch-sbatch",
        2,
        "no checkpoint root",
    )
    one_error_line(
        command(
            "dispatch-sbatch",
            "--checkpoint",
            str(tmp_path),
            "--resubmit",
            "lots",
            str(script),
            cwd=tmp_path,
        ),
        "dispatch-sbatch",
        2,
        "'lots'",
    )


def test_dispatch_cease_errors_end_with_2(tmp_path: Path) -> None:
    conf = tmp_path / "dispatch.conf"
    conf.write_text("Colour=blue\n")
    one_error_line(
        command("dispatch-cease", "100", env={"SLURM_DISPATCH_CONF": str(conf)}),
        "dispatch-cease",
        2,
        "unknown key 'Colour'",
    )
    usage = command("dispatch-cease")
    assert usage.returncode == 2 and "Missing argument 'JOBID'" in usage.stderr
    assert "Traceback" not in usage.stderr


def test_dispatch_sandbox_errors_end_in_one_line(tmp_path: Path) -> None:
    one_error_line(
        command("dispatch-sandbox", "status", "--dir", str(tmp_path / "a b")),
        "dispatch-sandbox",
        2,
        "contains ' '",
    )
    one_error_line(
        command("dispatch-sandbox", "partition", "n1", "--dir", str(tmp_path / "none")),
        "dispatch-sandbox",
        2,
        "no sandbox in",
    )


@pytest.mark.parametrize("fast_exit", [False, True])
def test_the_shell_maps_each_ending(fast_exit: bool) -> None:
    """Both endings (dispatch-sbatch's skips the interpreter's teardown) give the same codes
    and lose no output, a megabyte still buffered at the end included."""
    program = """
import os, signal, sys
from slurm_dispatch.cli.shell import run
from slurm_dispatch.errors import RefusedError
case, fast = sys.argv[1], sys.argv[2] == "True"
def body():
    if case.startswith("refused"):
        raise RefusedError("no, 'x' is refused")
    if case == "interrupted":
        os.kill(os.getpid(), signal.SIGINT)
    if case == "code":
        print("out")
        return 3
    if case == "exit":  # sbatch's own refusal: its code
        sys.stderr.write("sbatch: error: no\\n")
        sys.exit(5)
    if case == "big":
        sys.stdout.write("x" * 1_000_000)
        sys.stderr.write("y" * 10_000)
run(body, "prog", 2 if case.endswith("-as-2") else None, fast_exit=fast)
"""

    def end(case: str) -> tuple[int, str, str]:
        proc = subprocess.run(
            [sys.executable, "-c", program, case, str(fast_exit)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=as_at_a_terminal,
        )
        return proc.returncode, proc.stdout, proc.stderr

    assert end("refused") == (1, "", "prog: no, 'x' is refused\n")
    assert end("refused-as-2") == (2, "", "prog: no, 'x' is refused\n")
    assert end("interrupted") == (130, "", "")
    assert end("code") == (3, "out\n", "")
    assert end("nothing") == (0, "", "")
    assert end("exit") == (5, "", "sbatch: error: no\n")
    assert end("big") == (0, "x" * 1_000_000, "y" * 10_000)


@pytest.mark.parametrize(
    "prog,code",
    [
        ("dispatch", 1),
        ("dispatch-sbatch", 1),
        ("dispatch-sandbox", 1),
        ("dispatch-cease", 2),  # its 1 would say "not proven"
    ],
)
def test_a_closed_pipe_is_quiet(prog: str, code: int) -> None:
    # The reader goes away before the command writes: every write then meets a closed pipe.
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [*COMMANDS[prog], "--help"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (code, "")


def test_ctrl_c_while_waiting_for_slurm_ends_130(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "scontrol-started"
    for client in ("scontrol", "squeue", "sinfo"):  # whichever it asks first hangs
        (bin_dir / client).write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
        (bin_dir / client).chmod(0o755)
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"StateDir={tmp_path / 'state'}\n")
    with subprocess.Popen(
        [*COMMANDS["dispatch-cease"], "100"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_at_a_terminal,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_DISPATCH_CONF": str(conf),
            "DISPATCH_SLURM_ATTEMPTS": "1",
        },
    ) as proc:
        try:
            deadline = time.monotonic() + 30
            while not started.exists():
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the fake scontrol never started"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:  # never left running for a later test's garbage collection to meet
            proc.kill()
    assert (proc.returncode, out) == (130, "") and "Traceback" not in err, err


def test_dispatch_sbatch_imports_nothing_it_can_do_without() -> None:
    """Its start-up is most of its cost over sbatch (bench/bench_sbatch.py): no click, no
    typing nor dataclasses (about 15 ms when the events were dataclasses), no shutil.  (Only
    what its import adds counts: a site's .pth files may load some at interpreter start.)"""
    program = (
        "import sys\nat_start = set(sys.modules)\nimport slurm_dispatch.cli.sbatch\n"
        "print(sorted({'click', 'typing', 'dataclasses', 'shutil', 'tenacity'}"
        " & (set(sys.modules) - at_start)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", program], capture_output=True, text=True, check=True
    ).stdout
    assert out == "[]\n"


def test_every_dispatch_command_is_its_own_body() -> None:
    """The shell (ClickShell.main, then run) is the one place a command's errors become exits,
    so a command needs no inner ``def body(): ...; body()`` of its own (16 of them were left
    from before the shell, when each command called the guard itself)."""
    import ast

    tree = ast.parse((REPO / "slurm_dispatch" / "cli" / "dispatch.py").read_text())
    commands = [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and any("command" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert len(commands) >= 16
    wrapped = []
    for func in commands:
        inner = {n.name for n in ast.walk(func) if isinstance(n, ast.FunctionDef) and n is not func}
        called = {
            n.value.func.id
            for n in ast.walk(func)
            if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name)
        }
        wrapped += [f"{func.name}: {name}()" for name in inner & called]
    assert not wrapped, f"commands wrapping their body in a closure: {wrapped}"
