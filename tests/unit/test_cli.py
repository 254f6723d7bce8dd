"""The `dispatch` command line: forms, environment fallbacks, output, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli.dispatch import main

E = 1_000_001  # G=0, N=1, R=1


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_epoch_prints_integer_and_reads_environment() -> None:
    assert (
        run("epoch", "--generation", "2", "--submission", "3", "--restart", "4")[1]
        == "2000003000004\n"
    )
    env = {"DISPATCH_GENERATION": "0", "DISPATCH_SUBMISSION": "5"}
    assert run("epoch", env=env)[1] == "5000000\n"  # unset restart count means 0
    assert run("epoch", env={**env, "SLURM_RESTART_COUNT": "2"})[1] == "5000002\n"


@pytest.mark.parametrize(
    "args,code,word",
    [
        (["--generation", "0", "--submission", "0"], 1, "submission 0"),
        (["--generation", "0", "--submission", "1", "--restart", "1000000"], 1, "restart 1000000"),
        (["--generation", "x", "--submission", "1"], 2, "--generation 'x'"),
        (["--submission", "1"], 2, "--generation is required"),
    ],
)
def test_epoch_errors(args: list[str], code: int, word: str) -> None:
    rc, out, err = run("epoch", *args)
    assert (rc, out) == (code, "")
    assert err.startswith("dispatch: ") and word in err


def test_publish_latest_list_round_trip(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a" / "checkpoint-10"
    save.mkdir(parents=True)
    env = {"DISPATCH_CHECKPOINT": str(tmp_path), "DISPATCH_EPOCH": str(E)}
    rc, out, _ = run("publish", "--step", "10", str(save), env=env)
    assert rc == 0 and out.strip() == f"{E:020d}-{10:020d}-" + out.strip().split("-")[2]
    assert run("latest", env=env)[1] == f"{save}\n"
    data = json.loads(run("latest", "--json", env=env)[1])
    assert data == {"epoch": E, "step": 10, "path": str(save), "name": out.strip()}
    rc, out, _ = run("list", "--root", str(tmp_path))
    assert out.splitlines() == ["EPOCH   STEP PATH", f"{E} 10   {save}"]
    assert json.loads(run("list", "--json", env=env)[1])[0]["step"] == 10


def test_latest_prints_nothing_when_empty(tmp_path: Path) -> None:
    assert run("latest", "--root", str(tmp_path)) == (0, "", "")
    assert run("latest", "--root", str(tmp_path), "--json")[1] == "null\n"


def test_publish_errors_name_the_value(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a" / "c"
    save.mkdir(parents=True)
    base = ["publish", "--root", str(tmp_path), "--epoch", str(E)]
    assert run(*base, "--step", "1", str(save))[0] == 0
    rc, out, err = run(*base, "--step", "1", str(save))  # the same save's: nothing to do
    assert rc == 0 and out.strip() and "already published" in err and "already exists" in err
    rc, _, err = run(*base, "--step", "1", "/etc")
    assert rc == 1 and "'/etc'" in err
    rc, _, err = run(*base, "--step", "-3", str(save))
    assert rc == 1 and "step -3" in err
    rc, _, err = run(
        "publish", "--root", str(tmp_path), "--epoch", "999999", "--step", "1", str(save)
    )
    assert rc == 1 and "epoch 999999" in err
    rc, _, err = run("publish", "--step", "1", str(save), env={"DISPATCH_EPOCH": str(E)})
    assert rc == 2 and "DISPATCH_CHECKPOINT" in err


def test_unreadable_store_exits_2(tmp_path: Path) -> None:
    (tmp_path / "pub").mkdir()
    (tmp_path / "pub" / "junk").touch()
    rc, out, err = run("latest", "--root", str(tmp_path))
    assert (rc, out) == (2, "") and "'junk'" in err


def test_real_process_exit_codes_and_broken_pipe(tmp_path: Path) -> None:
    save = tmp_path / "exec" / "a" / "c"
    save.mkdir(parents=True)
    env = {**os.environ, "DISPATCH_CHECKPOINT": str(tmp_path), "DISPATCH_EPOCH": str(E)}
    for step in range(3000):
        (tmp_path / "pub").mkdir(exist_ok=True)
        (tmp_path / "pub" / f"{E:020d}-{step:020d}-MVSXQZLDF5QS6YY").touch()
    cmd = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]
    proc = subprocess.run(cmd + ["list"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 3001
    pipe = subprocess.run(
        f"{' '.join(cmd)} list | head -1", shell=True, env=env, capture_output=True, text=True
    )
    assert pipe.stdout == "EPOCH   STEP PATH\n" and "Traceback" not in pipe.stderr
    bad = subprocess.run(
        cmd + ["latest", "--root", str(tmp_path / "missing")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "missing" in bad.stderr


def test_every_table_command_takes_one_set_of_table_options() -> None:
    """`dispatch-admin holds -H` was refused ("No such option: -H") while `dispatch jobs -H`
    worked: each table command declared its own.  One set, shared: the
    same names, short forms and words in every command that prints a table."""
    import click

    from slurm_dispatch.cli import admin, dispatch

    def declared(command: click.Command) -> dict[str, tuple[list[str], list[str]]]:
        return {
            p.name: (sorted(p.opts), sorted(p.secondary_opts))
            for p in command.params
            if p.name in ("as_json", "noheader")
        }

    tables = {
        ("dispatch", "list"),
        ("dispatch", "jobs"),
        ("dispatch-admin", "holds"),
        ("dispatch-admin", "doctor"),
    }
    seen = {}
    for prog, group in (("dispatch", dispatch.main), ("dispatch-admin", admin.main)):
        for name, command in group.commands.items():  # type: ignore[attr-defined]
            if "noheader" in declared(command) or (prog, name) in tables:
                seen[(prog, name)] = declared(command)
    assert tables <= set(seen), seen
    assert all(
        d == {"as_json": (["--json"], []), "noheader": (["--noheader", "-H"], [])}
        for d in seen.values()
    ), seen
    helps = {
        (prog, name): [p.help for p in command.params if p.name == "noheader"]
        for (prog, name), command in (
            ((p, n), (dispatch.main if p == "dispatch" else admin.main).commands[n])
            for p, n in seen
        )
    }
    assert len({tuple(h) for h in helps.values()}) == 1, helps
