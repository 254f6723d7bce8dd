"""The soak trainer's own record keeping, run as a job runs it (a subprocess with the
DISPATCH_* contract set): ``stamp`` turns each publication ``dispatch watch`` reports into a
history fact with the name the checker reads, and passes the output through unchanged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from soak import history
from tests.execution_env import dispatch_env

TRAINER = Path(__file__).resolve().parents[2] / "soak" / "trainer.py"


def test_stamp_records_each_publication_watch_reports(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    attempt = model.new_attempt()
    save = f"{root}/exec/{attempt}/checkpoint-10"
    lines = (
        "dispatch watch: scanning\n"
        f"dispatch watch: published step 10: {save}\n"
        "dispatch watch: removed save exec/x/checkpoint-5 (21 bytes)\n"
    )
    env = {
        "DISPATCH_CHECKPOINT": str(root),
        "DISPATCH_EPOCH": "1000002",
        "DISPATCH_ATTEMPT": attempt,
        "SOAK_HISTORY": str(tmp_path / "history"),
        "SLURMD_NODENAME": "n3",
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, str(TRAINER), "stamp"],
        input=lines,
        text=True,
        capture_output=True,
        env=env,
        check=True,
        timeout=60,
    )
    assert proc.stdout == lines
    facts = history.read(str(tmp_path / "history"))
    assert [(f["ev"], f["step"], f["path"], f["node"]) for f in facts] == [
        ("published", 10, f"exec/{attempt}/checkpoint-10", "n3")
    ]
    assert model.parse_name(facts[0]["name"]).epoch == 1000002
    assert model.parse_name(facts[0]["name"]).path == f"exec/{attempt}/checkpoint-10"


def test_a_torn_last_line_is_dropped_and_nothing_else(tmp_path: Path) -> None:
    folder = tmp_path / "h"
    h = history.History(str(folder), "a1")
    h.write("beat")
    h.write("beat")
    with open(next(folder.iterdir()), "a", encoding="utf-8") as f:
        f.write('{"ev": "be')  # killed mid-write
    assert [f["ev"] for f in history.read(str(folder))] == ["beat", "beat"]


def test_a_torn_launcher_choice_is_loaded_from_its_lineage_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher handed out A's step 10, whose save is gone: the trainer resumes through
    dispatch fetch, which falls back to A's step 5, and its start fact says both."""
    root = tmp_path / "ck"
    a = model.new_attempt()
    for step in (5, 10):
        save = root / "exec" / a / f"checkpoint-{step}"
        save.mkdir(parents=True)
        (save / "weights").write_text(str(step))
        store.publish(str(root), 1_000_000, step, str(save))
    (root / "exec" / a / ".dispatch").write_text('{"resume_from": null, "time": 1.0}')
    torn = root / "exec" / a / "checkpoint-10"
    shutil.rmtree(torn)
    b = model.new_attempt()
    dispatch_env(root, b, 1_000_001, str(torn), monkeypatch)
    monkeypatch.setenv("SOAK_HISTORY", str(tmp_path / "history"))
    monkeypatch.setenv("SOAK_STEPS", "0")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    subprocess.run(
        [sys.executable, str(TRAINER), "publish"], check=True, timeout=120, capture_output=True
    )
    facts = [f for f in history.read(str(tmp_path / "history")) if f["ev"] != "beat"]
    (start, end) = facts
    assert (start["resumed"], start["loaded"], start["step"]) == (
        str(torn),
        str(root / "exec" / a / "checkpoint-5"),
        5,
    )
    assert end["ev"] == "end"


def test_the_poisoned_jobs_first_execution_poisons_one_save_and_every_resume_from_it_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """soak/cases.py's poisoned-save job: the first execution to reach SOAK_POISON_STEP
    publishes that save poisoned and exits 3; an execution resuming from it exits 3 right
    after its start fact, before any save; one resuming from the save below goes past the
    step with a whole save.  The no-progress job's trainer (SOAK_CRASH_AT_START) exits 3
    after its start fact."""
    root = tmp_path / "ck"
    monkeypatch.setenv("SOAK_HISTORY", str(tmp_path / "history"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for name, value in (
        ("SOAK_STEPS", "15"),
        ("SOAK_INTERVAL", "0.01"),
        ("SOAK_POISON_STEP", "10"),
        ("SOAK_POISON_MARK", str(tmp_path / "m")),
    ):
        monkeypatch.setenv(name, value)

    def execution(epoch: int, resume: Optional[str]) -> tuple[int, list[dict[str, object]]]:
        attempt = model.new_attempt()
        dispatch_env(root, attempt, epoch, resume, monkeypatch)
        code = subprocess.run(
            [sys.executable, str(TRAINER), "publish"], timeout=120, capture_output=True
        ).returncode
        return code, [
            f
            for f in history.read(str(tmp_path / "history"))
            if f["attempt"] == attempt and f["ev"] != "beat"
        ]

    code, facts = execution(1_000_000, None)
    assert code == 3 and facts[-1]["reason"] == "poisoned its save"
    (poisoned,) = [f["path"] for f in facts if f["ev"] == "save" and f.get("poisoned")]
    assert str(poisoned).endswith("checkpoint-10")
    assert store.latest(str(root)).path == f"{root}/{poisoned}"
    code, facts = execution(1_000_001, f"{root}/{poisoned}")
    assert code == 3 and [f["ev"] for f in facts] == ["start", "end"]
    assert facts[1]["reason"] == "resumed from a poisoned save"
    below = str(poisoned).replace("checkpoint-10", "checkpoint-5")
    code, facts = execution(1_000_002, f"{root}/{below}")
    assert code == 0 and facts[-1]["reason"] == "done"
    assert [f["step"] for f in facts if f["ev"] == "published"] == [10, 15]
    assert not [f for f in facts if f.get("poisoned")]
    monkeypatch.setenv("SOAK_CRASH_AT_START", "1")
    code, facts = execution(1_000_003, None)
    assert code == 3 and [f["ev"] for f in facts] == ["start", "end"]
