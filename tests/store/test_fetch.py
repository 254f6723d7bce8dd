"""`dispatch fetch` (docs/user-guide.md, checkpoints on S3) against a real SeaweedFS server and on a
folder root, run as a shell trainer runs it: the resume source (an s3:// URL) becomes a checked
local copy in the staging folder, asked twice it is the same copy, a fresh start prints nothing, a
copy that differs from what was uploaded is refused and removed, SAVE and DEST can be named; on a
folder root the save's own path is printed, or a checked copy made where DEST asks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.s3 import parse_root
from slurm_dispatch.execution import s3saves, saves
from slurm_dispatch.execution.watch_s3 import Uploader
from tests.s3server import SeaweedServer
from tests.store.test_integrations_s3 import E1, E2, A, B, dispatch_env

DISPATCH = shutil.which("dispatch") or "dispatch"


def fetch(*args: str, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, "fetch", *args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=120,
    )


def a_save(folder: Path, step: int) -> Path:
    save = folder / f"checkpoint-{step}"
    save.mkdir(parents=True)
    (save / "weights").write_bytes(os.urandom(3000) + str(step).encode())
    (save / "sub").mkdir()
    (save / "sub" / "state.json").write_text(f'{{"step": {step}}}')
    return save


def uploaded(root: str, stage: Path, exec_dir: str, step: int, hashes: bool = True) -> str:
    """A save of execution A uploaded and published: with its manifest's sha256 (as the
    integrations upload), or without (as `dispatch watch` does)."""
    save = a_save(stage, step)
    up = Uploader(root, str(stage), exec_dir, 30, lambda line: None)
    if hashes:
        execution = saves.Execution.current()
        assert execution is not None, "the environment names no execution"
        s3saves.publish_local_save(execution, up, step, str(save))
    else:
        up.put(E1, step, str(save), lambda: False)
    return up.url_of(str(save))


def same_files(a: Path, b: Path) -> bool:
    def files(p: Path) -> dict[str, bytes]:
        return {
            str(f.relative_to(p)): f.read_bytes()
            for f in p.rglob("*")
            if f.is_file() and f.name != "dispatch-manifest.json"
        }

    return files(a) == files(b)


@pytest.mark.parametrize("hashes", [True, False], ids=["manifest-sha256", "watch-upload"])
def test_the_resume_source_on_s3_becomes_a_checked_local_copy_once(
    s3_env: SeaweedServer,
    s3_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hashes: bool,
) -> None:
    exec_a, stage_a = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    url = uploaded(s3_root, stage_a, exec_a, 4, hashes)
    kept = tmp_path / "kept"
    shutil.move(str(stage_a / "checkpoint-4"), kept)  # another node: nothing of A's here
    exec_b, stage_b = dispatch_env(s3_root, tmp_path, B, E2, url, monkeypatch)
    first = fetch()
    assert first.returncode == 0, first.stderr
    local = Path(first.stdout.strip())
    assert local.parent.parent == stage_b and local.name == "checkpoint-4"
    assert same_files(local, kept)
    again = fetch()
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    record = s3saves.read_json(f"{exec_b}/{saves.RESUME_RECORD}")
    assert record["resume_from"] == url and record["local_copy"] == str(local)
    assert record["framework"] == "shell"


def test_a_fresh_start_prints_nothing(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatch_env(s3_root, tmp_path, B, E2, "", monkeypatch)
    done = fetch()
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


def test_a_copy_that_differs_from_what_was_uploaded_is_refused_and_removed(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exec_a, stage_a = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    url = uploaded(s3_root, stage_a, exec_a, 4)
    where = parse_root(f"{url}/weights")
    size = (stage_a / "checkpoint-4" / "weights").stat().st_size
    s3_env.client().put_object(Bucket=where.bucket, Key=where.prefix, Body=b"x" * size)
    dest = tmp_path / "here"
    done = fetch(url, str(dest))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'weights'" in done.stderr and "sha256" in done.stderr and url in done.stderr
    assert done.stderr.count("\n") == 1 and not dest.exists()


def test_a_named_save_goes_to_dest_and_dest_is_never_overwritten(
    s3_env: SeaweedServer, s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exec_a, stage_a = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    url = uploaded(s3_root, stage_a, exec_a, 4)
    for name in [n for n in os.environ if n.startswith("DISPATCH_")]:
        monkeypatch.delenv(name)  # outside any job, e.g. on a login node
    dest = tmp_path / "mine"
    done = fetch(url, str(dest))
    assert done.returncode == 0 and done.stdout.strip() == str(dest), done.stderr
    assert same_files(dest, stage_a / "checkpoint-4")
    again = fetch(url, str(dest))
    assert again.returncode == 2 and "exists" in again.stderr and str(dest) in again.stderr
    bare = fetch()
    assert bare.returncode == 2 and "not inside a dispatch execution" in bare.stderr


def test_on_a_folder_root_the_save_is_printed_or_copied_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    save = a_save(root / "exec" / "a", 4)
    saves.seal_save(str(save), single_writer=True)  # its manifest, as the integrations write
    store.publish(str(root), E1, 4, str(save))
    exec_b = root / "exec" / "b"
    exec_b.mkdir()
    for name, value in (
        ("DISPATCH_CHECKPOINT", str(root)),
        ("DISPATCH_EXEC_DIR", str(exec_b)),
        ("DISPATCH_EPOCH", str(E2)),
        ("DISPATCH_ATTEMPT", "b"),
        ("DISPATCH_RESUME_FROM", str(save)),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DISPATCH_STAGE_DIR", raising=False)
    printed = fetch()
    assert printed.returncode == 0 and printed.stdout.strip() == str(save), printed.stderr
    dest = tmp_path / "copy"
    copied = fetch("", str(dest))
    assert copied.returncode == 0 and copied.stdout.strip() == str(dest), copied.stderr
    assert same_files(dest, save)
    (save / "weights").write_bytes(b"")  # cut after it was published: not whole
    missing = fetch(str(save), str(tmp_path / "other"))
    assert missing.returncode == 2 and not (tmp_path / "other").exists()
    assert "truncated" in missing.stderr and "weights" in missing.stderr, missing.stderr
