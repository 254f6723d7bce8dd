"""The integrations' shared part without a training library: durable publication with a
manifest, the resume fallback along a lineage, and a core that never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.execution import saves

E1, E2, E3 = 1_000_000, 1_000_001, 1_000_002


def _execution(root: Path, attempt: str, epoch: int, resume_from: str | None) -> saves.Execution:
    exec_dir = root / "exec" / attempt
    exec_dir.mkdir(parents=True, exist_ok=True)
    return saves.Execution(
        root=str(root),
        exec_dir=str(exec_dir),
        epoch=epoch,
        attempt=attempt,
        job="",
        resume_from=resume_from,
    )


def _save(execution: saves.Execution, step: int, publish: bool = True) -> str:
    folder = Path(execution.exec_dir) / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"w" * (100 + step))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if publish:
        saves.seal_save(str(folder), single_writer=True)
        saves.publish_save(execution, step, str(folder))
    return str(folder)


def _truncate(save: str) -> None:
    with open(os.path.join(save, "model.bin"), "r+b") as handle:
        handle.truncate(10)


def test_publication_comes_with_a_manifest_of_the_save(tmp_path: Path) -> None:
    a = _execution(tmp_path, "a", E1, "")
    save = _save(a, 2)
    manifest = json.loads(Path(save, "dispatch-manifest.json").read_text())
    assert manifest == {"format": 1, "files": {"model.bin": 102, "trainer_state.json": 18}}
    assert saves.why_unloadable(save) is None
    assert [f.path for f in store.list_publications(str(tmp_path))] == [save]


def test_a_truncated_or_deleted_save_is_unloadable_and_says_why(tmp_path: Path) -> None:
    a = _execution(tmp_path, "a", E1, "")
    truncated, deleted = _save(a, 2), _save(a, 4)
    _truncate(truncated)
    os.rename(deleted, deleted + ".gone")
    assert "is 10 bytes; its manifest says 102" in (saves.why_unloadable(truncated) or "")
    assert "does not exist" in (saves.why_unloadable(deleted) or "")
    # Without a manifest (published by hand), the required file decides.
    bare = Path(a.exec_dir) / "checkpoint-9"
    bare.mkdir()
    assert "has no 'trainer_state.json'" in (
        saves.why_unloadable(str(bare), ("trainer_state.json",)) or ""
    )


def test_resume_falls_back_to_the_previous_save_and_records_why(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    a = _execution(tmp_path, "a", E1, "")
    first, second = _save(a, 2), _save(a, 4)
    _truncate(second)
    b = _execution(tmp_path, "b", E2, second)
    resume = saves.choose_resume(b, ("trainer_state.json",), "test")
    assert resume.path == first
    err = capfd.readouterr().err
    assert f"not resuming from {second}" in err and "truncated" in err
    assert f"resuming from {first}" in err
    recorded = json.loads(Path(b.exec_dir, saves.RESUME_RECORD).read_text())
    assert recorded["resume_from"] == first
    assert recorded["launcher_resume_from"] == second
    assert [p["path"] for p in recorded["passed_over"]] == [second]
    # A second call in the same execution gives the same answer and says nothing again.
    assert saves.choose_resume(b, ("trainer_state.json",)).path == first
    assert capfd.readouterr().err == ""


def test_fallback_follows_the_lineage_not_an_old_executions_late_save(tmp_path: Path) -> None:
    old = _execution(tmp_path, "old", E1, "")
    _save(old, 2)
    source = _save(old, 4)
    # The replacement resumed from old/4 (its record says so) and saved 6, which got truncated;
    # meanwhile the old execution, still running on a partitioned node, published 8 late.
    new = _execution(tmp_path, "new", E2, source)
    saves.choose_resume(new, ("trainer_state.json",))
    bad = _save(new, 6)
    _truncate(bad)
    late = _save(old, 8)
    third = _execution(tmp_path, "third", E3, bad)
    resume = saves.choose_resume(third, ("trainer_state.json",))
    assert resume.path == source, f"resumed from {resume.path}, not {source} (late: {late})"


def test_without_records_the_previous_publication_in_order_is_taken(tmp_path: Path) -> None:
    a = _execution(tmp_path, "a", E1, "")
    earlier = _save(a, 2)
    b = _execution(tmp_path, "b", E2, "")
    bad = _save(b, 6)  # b never recorded what it resumed from
    _truncate(bad)
    c = _execution(tmp_path, "c", E3, bad)
    assert saves.choose_resume(c).path == earlier


def test_nothing_loadable_means_a_fresh_start(tmp_path: Path) -> None:
    a = _execution(tmp_path, "a", E1, "")
    only = _save(a, 2)
    _truncate(only)
    b = _execution(tmp_path, "b", E2, only)
    assert saves.choose_resume(b).path is None


def test_absent_resume_variable_asks_the_store(tmp_path: Path) -> None:
    a = _execution(tmp_path, "a", E1, "")
    latest = _save(a, 4)
    b = _execution(tmp_path, "b", E2, None)
    assert saves.choose_resume(b).path == latest
    empty = _execution(tmp_path, "c", E3, "")  # the launcher saw nothing: a fresh start
    assert saves.choose_resume(empty).path is None


def test_execution_from_the_environment(tmp_path: Path) -> None:
    assert saves.Execution.current({}) is None
    env = {
        "DISPATCH_EXEC_DIR": str(tmp_path / "exec" / "x"),
        "DISPATCH_CHECKPOINT": str(tmp_path),
        "DISPATCH_EPOCH": str(E2),
        "DISPATCH_RESUME_FROM": "",
    }
    execution = saves.Execution.current(env)
    assert execution is not None and execution.epoch == E2 and execution.resume_from == ""
    on_s3 = saves.Execution.current(
        {
            **env,
            "DISPATCH_CHECKPOINT": "s3://bucket/run",
            "DISPATCH_STAGE_DIR": str(tmp_path / "stage"),
        }
    )
    assert on_s3 is not None and on_s3.remote and on_s3.stage_dir == str(tmp_path / "stage")
    assert not execution.remote and execution.stage_dir is None
    with pytest.raises(Exception, match="'gs://bucket/run'"):
        saves.Execution.current({**env, "DISPATCH_CHECKPOINT": "gs://bucket/run"})
    with pytest.raises(Exception, match="'soon'"):
        saves.Execution.current({**env, "DISPATCH_EPOCH": "soon"})


def test_the_core_never_imports_a_training_library(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "import slurm_dispatch, slurm_dispatch.cli.dispatch, slurm_dispatch.integrations\n"
        "import slurm_dispatch.execution.saves\n"
        "from slurm_dispatch.cli import dispatch as cli\n"
        "sys.argv = ['dispatch', 'list', '--root', sys.argv[1]]\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'lightning', 'pytorch_lightning', 'accelerate'))\n"
        "print('imported:' + ','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "imported:", out


def test_the_launchers_record_of_a_fresh_start_ends_the_lineage(tmp_path: Path) -> None:
    """An execution whose launcher record says it started fresh has no earlier save to fall
    back to: another job generation's older publication is not its lineage."""
    other = _execution(tmp_path, "other", E1, "")
    _save(other, 8)
    fresh = _execution(tmp_path, "fresh", E2, None)
    Path(fresh.exec_dir, saves.LAUNCH_RECORD).write_text(json.dumps({"resume_from": None}))
    bad = _save(fresh, 2)
    _truncate(bad)
    after = _execution(tmp_path, "after", E3, bad)
    resume = saves.choose_resume(after)
    assert resume.path is None and [p["path"] for p in resume.passed_over] == [bad]


def test_the_name_of_0_1_0_for_a_remote_root_is_kept_with_a_warning(tmp_path: Path) -> None:
    # Execution.on_s3 (0.1.0, reached through the public slurm_dispatch.integrations.saves) is
    # Execution.remote since the table of stores; it is kept for 0.2.0 as the changelog says.
    import dataclasses

    folder = _execution(tmp_path, "a1", E1, None)
    remote = dataclasses.replace(folder, root="s3://bucket/ck")
    for execution, expected in ((folder, False), (remote, True)):
        with pytest.warns(DeprecationWarning, match="Execution.remote"):
            assert execution.on_s3 is expected
        assert execution.remote is expected
