"""``dispatch watch`` on an ``s3://`` root against a real SeaweedFS server: each complete local
save of the staging folder uploaded under the execution's prefix (multipart, by boto3's
transfer manager), then published, in step order, each once; the local copies removed once
published but the newest; a restarted watch carries on; a server that stops answering stops
watch within --timeout; the CLI's defaults ($DISPATCH_STAGE_DIR, $DISPATCH_EXEC_DIR)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores import transfer
from slurm_dispatch.checkpoint.stores.s3 import parse_root
from slurm_dispatch.errors import UsageError
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Published, Watcher, WatchLoop
from tests.s3server import SeaweedServer
from tests.unit.test_watch import poll

DISPATCH = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]

EPOCH = model.Epoch(0, 1, 0).value
ATTEMPT = "0" * 26
REPO = str(Path(__file__).resolve().parents[2])


def exec_prefix(root: str) -> str:
    return f"{root}/exec/{ATTEMPT}"


def hf_save(stage: Path, step: int, weights: bytes = b"w" * 1000, ready: bool = True) -> Path:
    save = stage / f"checkpoint-{step}"
    save.mkdir()
    (save / "model.safetensors").write_bytes(weights)
    (save / "sub").mkdir()
    (save / "sub" / "optimizer.pt").write_bytes(b"o" * 10)
    if ready:
        (save / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return save


def published(root: str) -> list[tuple[int, str]]:
    return [(f.step, f.path) for f in store.list_publications(root)]


def objects(server: SeaweedServer, url: str) -> dict[str, bytes]:
    where = parse_root(url)
    client = server.client()
    listed = client.list_objects_v2(Bucket=where.bucket, Prefix=where.prefix + "/")
    return {
        item["Key"][len(where.prefix) + 1 :]: client.get_object(
            Bucket=where.bucket, Key=item["Key"]
        )["Body"].read()
        for item in listed.get("Contents", ())
    }


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    folder = tmp_path / f"dispatch-stage-{ATTEMPT}"
    folder.mkdir()
    return folder


def watcher(root: str, stage: Path, lines: list[str] | None = None, timeout: float = 30) -> Watcher:
    sink = lines if lines is not None else []
    return Watcher(
        root,
        str(stage),
        EPOCH,
        SaveRule.make(),
        sink.append,
        upload_to=exec_prefix(root),
        timeout=timeout,
    )


def two_scans(w: Watcher) -> list[Published]:
    """A save is published at the second scan that finds it unchanged (watch.py): the first
    scan that sees the saves publishes none of them."""
    assert w.scan() == [], "published at the first scan that saw it"
    return w.scan()


# ---- upload, then publish ----------------------------------------------------------------


def test_complete_saves_are_uploaded_then_published_in_step_order(
    s3_env: SeaweedServer, s3_root: str, stage: Path
) -> None:
    lines: list[str] = []
    w = watcher(s3_root, stage, lines)
    hf_save(stage, 10)
    hf_save(stage, 5)
    hf_save(stage, 15, ready=False)  # still being written: its ready file comes last
    done = two_scans(w)
    prefix = exec_prefix(s3_root)
    assert [(p.step, p.path) for p in done] == [
        (5, str(stage / "checkpoint-5")),
        (10, str(stage / "checkpoint-10")),
    ]
    assert published(s3_root) == [(5, f"{prefix}/checkpoint-5"), (10, f"{prefix}/checkpoint-10")]
    assert objects(s3_env, f"{prefix}/checkpoint-10") == {
        "model.safetensors": b"w" * 1000,
        "sub/optimizer.pt": b"o" * 10,
        "trainer_state.json": b'{"global_step": 10}',
    }
    assert not any(k.startswith("checkpoint-15") for k in objects(s3_env, prefix))
    assert lines == [
        f"published step 5: {prefix}/checkpoint-5",
        f"published step 10: {prefix}/checkpoint-10",
        f"removed the local copy {stage / 'checkpoint-5'} (published as {prefix}/checkpoint-5)",
    ]
    # Published and older than the newest: removed; the newest and the unpublished stay.
    assert sorted(os.listdir(stage)) == ["checkpoint-10", "checkpoint-15"]
    (stage / "checkpoint-15" / "trainer_state.json").write_text("{}")
    assert [p.step for p in two_scans(w)] == [15]
    assert sorted(os.listdir(stage)) == ["checkpoint-15"]
    assert w.scan() == []  # each once
    assert [s for s, _ in published(s3_root)] == [5, 10, 15]


def test_a_large_save_is_uploaded_in_parts_by_the_transfer_manager(
    s3_env: SeaweedServer, s3_root: str, stage: Path
) -> None:
    weights = os.urandom(3 * transfer.PART_SIZE + 12345)
    hf_save(stage, 1, weights=weights)
    assert [p.step for p in two_scans(watcher(s3_root, stage))] == [1]
    where = parse_root(exec_prefix(s3_root))
    head = s3_env.client().head_object(
        Bucket=where.bucket, Key=f"{where.prefix}/checkpoint-1/model.safetensors"
    )
    # A multipart object's ETag is "<md5 of the parts' md5s>-<number of parts>".
    assert head["ETag"].strip('"').endswith("-4") and head["ContentLength"] == len(weights)
    body = objects(s3_env, f"{exec_prefix(s3_root)}/checkpoint-1")["model.safetensors"]
    assert hashlib.sha256(body).digest() == hashlib.sha256(weights).digest()


def test_a_file_save_is_one_object(s3_env: SeaweedServer, s3_root: str, stage: Path) -> None:
    (stage / "model_7.pt").write_bytes(b"m" * 99)
    w = Watcher(
        s3_root, str(stage), EPOCH, SaveRule.make("model_{step}.pt"), upload_to=exec_prefix(s3_root)
    )
    assert [p.step for p in two_scans(w)] == [7]
    url = f"{exec_prefix(s3_root)}/model_7.pt"
    assert published(s3_root) == [(7, url)]
    assert transfer.save_objects(url, 10) == (False, {"model_7.pt": 99})


def test_a_restarted_watch_neither_fails_nor_republishes(
    s3_env: SeaweedServer, s3_root: str, stage: Path
) -> None:
    hf_save(stage, 5)
    hf_save(stage, 10)
    assert [p.step for p in two_scans(watcher(s3_root, stage))] == [5, 10]
    hf_save(stage, 5)  # the local copy was removed: a trainer could write the step again
    hf_save(stage, 20)
    lines: list[str] = []
    again = watcher(s3_root, stage, lines)
    assert [p.step for p in two_scans(again)] == [20]
    assert [s for s, _ in published(s3_root)] == [5, 10, 20]
    # The old save at or below the mark is left alone (it was never uploaded by this watch).
    assert (stage / "checkpoint-5").is_dir()


def test_the_copies_dispatch_fetched_are_never_this_executions_saves(
    s3_env: SeaweedServer, s3_root: str, stage: Path
) -> None:
    # resume-<n>/ (the resume source, s3saves) and fetched/ (dispatch fetch SAVE) hold copies
    # of saves already published; the deep scan enters neither: publishing one as a save of
    # this execution would also remove it (and work a trainer wrote into it) as an older copy.
    for folder, step in (("resume-1", 10), ("fetched", 3), ("resume-2", 30)):
        (stage / folder).mkdir()
        hf_save(stage / folder, step)
    (stage / "out").mkdir()
    hf_save(stage / "out", 12)
    hf_save(stage, 15)
    lines: list[str] = []
    w = watcher(s3_root, stage, lines)
    assert [p.step for p in two_scans(w)] == [12, 15]
    assert [s for s, _ in published(s3_root)] == [12, 15]
    for folder, step in (("resume-1", 10), ("fetched", 3), ("resume-2", 30)):
        assert (stage / folder / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert not any("resume-" in line or "fetched" in line for line in lines), lines
    assert w.missed() == []


def test_a_watch_that_published_nothing_names_no_fetched_copy(
    s3_env: SeaweedServer, s3_root: str, stage: Path
) -> None:
    (stage / "resume-1").mkdir()
    hf_save(stage / "resume-1", 10)
    w = Watcher(
        s3_root,
        str(stage),
        EPOCH,
        SaveRule.make(),
        upload_to=exec_prefix(s3_root),
        timeout=30,
        exec_dir=str(stage),
    )
    assert two_scans(w) == [] and w.missed() == []


def test_the_mark_is_this_prefix_own(s3_env: SeaweedServer, s3_root: str, stage: Path) -> None:
    store.publish(s3_root, EPOCH, 50, f"{s3_root}/exec/{'1' * 26}/checkpoint-50")
    hf_save(stage, 5)
    assert [p.step for p in two_scans(watcher(s3_root, stage))] == [5]


def test_wrong_values_are_named(
    s3_env: SeaweedServer, s3_root: str, stage: Path, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match="--to 's3://other/x' is not under the checkpoint root"):
        Watcher(s3_root, str(stage), EPOCH, SaveRule.make(), upload_to="s3://other/x")
    with pytest.raises(UsageError, match="staging folder '.*nope' is not a directory"):
        Watcher(
            s3_root, str(tmp_path / "nope"), EPOCH, SaveRule.make(), upload_to=exec_prefix(s3_root)
        )


# ---- the process: the CLI's defaults, a server that stops answering ----------------------


def watch_env(root: str, stage: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DISPATCH_CHECKPOINT": root,
        "DISPATCH_EXEC_DIR": exec_prefix(root),
        "DISPATCH_STAGE_DIR": str(stage),
        "DISPATCH_EPOCH": str(EPOCH),
    }


def start_watch(root: str, stage: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(
            [*DISPATCH, "watch", *args],
            env=watch_env(root, stage),
            stderr=err,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )


def test_the_cli_stages_from_the_stage_dir_to_the_exec_prefix(
    s3_env: SeaweedServer, s3_root: str, stage: Path, tmp_path: Path
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        'set -e\nfor s in 3 6; do d="$DISPATCH_STAGE_DIR/checkpoint-$s"; '
        'mkdir "$d"; echo $s > "$d/w"; echo {} > "$d/trainer_state.json"; done\n'
    )
    proc = subprocess.run(
        [*DISPATCH, "watch", "--interval", "0.1", "--", "bash", str(script)],
        env=watch_env(s3_root, stage),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    prefix = exec_prefix(s3_root)
    assert published(s3_root) == [(3, f"{prefix}/checkpoint-3"), (6, f"{prefix}/checkpoint-6")]
    assert f"dispatch watch: published step 6: {prefix}/checkpoint-6" in proc.stderr
    # The command ended with 0 and every save is on S3: the staging folder is removed
    # (before, the newest copy stayed there for good).
    assert not stage.exists(), proc.stderr
    assert f"dispatch watch: removed the staging folder {stage}" in proc.stderr


def test_a_stage_dir_outside_this_executions_is_refused(
    s3_env: SeaweedServer, s3_root: str, stage: Path, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [*DISPATCH, "watch", "--dir", str(tmp_path)],
        env=watch_env(s3_root, stage),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert f"--dir {str(tmp_path)!r} is outside this execution's folder" in proc.stderr


def test_a_server_that_stops_answering_stops_watch_within_its_timeout(
    s3_env: SeaweedServer, s3_root: str, stage: Path, tmp_path: Path
) -> None:
    log = tmp_path / "err"
    hf_save(stage, 1)
    proc = start_watch(s3_root, stage, "--interval", "0.1", "--timeout", "2", log=log)
    try:
        poll(lambda: published(s3_root), "the first save published")
        with s3_env.frozen():
            hf_save(stage, 2, weights=b"x" * 100_000)
            started = time.monotonic()
            code = proc.wait(timeout=30)
            took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert code == 2, text
    assert took < 2 + 0.1 + 1 + 1, (took, text)  # --timeout, the interval, a second, a margin
    assert "stopped publishing: " in text and "within 2 s" in text, text
    assert [s for s, _ in published(s3_root)] == [1], "nothing is published after the error"


def test_an_upload_that_overruns_is_an_error_naming_it(
    s3_env: SeaweedServer, s3_root: str, stage: Path
) -> None:
    lines: list[str] = []
    w = watcher(s3_root, stage, lines, timeout=1.5)
    assert w.scan() == []  # the mark is read while the server answers
    hf_save(stage, 4, weights=os.urandom(2 * transfer.PART_SIZE))
    with s3_env.frozen():
        started = time.monotonic()
        assert WatchLoop(w, None, 0.05, 1.5, lines.append).run() == 2
        assert time.monotonic() - started < 1.5 + 1
    assert lines[-1] == (
        f"stopped publishing: uploading {stage / 'checkpoint-4'} to "
        f"{exec_prefix(s3_root)}/checkpoint-4 did not finish within 1.5 s "
        "(--timeout)"
    )
    poll(
        lambda: not w.phase or "uploading" not in w.phase[1],
        "the stuck upload to give up",
        timeout=120,
    )
    assert published(s3_root) == []
    assert (stage / "checkpoint-4").is_dir(), "an unpublished save is never removed"
