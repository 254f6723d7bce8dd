"""A local copy left in an earlier execution's staging folder is a resume source only when it
is this user's own and holds what was uploaded, against a real SeaweedFS
server with the real Trainer on the CPU.

Execution A trains and uploads through its staging folder (``dispatch-stage-A`` beside B's);
then that folder is planted by another uid, altered in place at the same sizes, made writable
by the group, or reached through a symlink, and B resumes.  B's copy must be S3's save, fetched
afresh (the proxy sees its objects read), with the reason said on stderr; an intact copy of the
user's own is copied and nothing of it is read from S3.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores import transfer
from slurm_dispatch.execution import s3saves
from tests.s3server import SeaweedServer

from .faulty_proxy import FaultyProxy
from .test_integrations_s3 import E1, E2, A, B, dispatch_env, put_object

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

STRANGER = 65534  # nobody


def same_size_other_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last tensor's last byte: it still loads, with other weights
    path.write_bytes(bytes(data))


def chown_tree(top: Path, uid: int) -> None:
    os.chown(top, uid, uid)
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)


def plant(kind: str, stage_a: Path, tmp_path: Path) -> str:
    """Make A's staging folder what ``kind`` says; return what B's message must name."""
    save = stage_a / "checkpoint-4"
    if kind == "stranger":
        # Another local user made the folder before it was looked for: the same names and
        # sizes as S3's listing, other bytes.
        same_size_other_bytes(save / "model.safetensors")
        chown_tree(stage_a, STRANGER)
        return f"owned by uid {STRANGER}"
    if kind == "own-altered":
        same_size_other_bytes(save / "model.safetensors")
        return "differs from what was uploaded"
    if kind == "group-writable":
        os.chmod(save / "model.safetensors", 0o664)
        return "writable by group or others"
    if kind == "linked-folder":
        elsewhere = tmp_path / "elsewhere"
        shutil.move(str(stage_a), str(elsewhere))
        stage_a.symlink_to(elsewhere)
        return "symlink"
    if kind == "linked-file":
        kept = tmp_path / "kept.safetensors"
        shutil.move(str(save / "model.safetensors"), str(kept))
        (save / "model.safetensors").symlink_to(kept)
        return "symlink"
    if kind == "no-hashes":  # a save uploaded without them (dispatch watch, older releases)
        return "records no sha256"
    raise AssertionError(kind)


def weights_read_from_s3(proxy: FaultyProxy) -> int:
    wanted = "/checkpoint-4/model.safetensors"
    return sum(
        1
        for method, path, _status in proxy.seen
        if method == "GET" and path.split("?")[0].endswith(wanted)
    )


def first_execution(
    s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, Path]:
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import make_trainer

    _exec_a, stage_a = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    make_trainer(tmp_path / "o", 4, [DispatchCallback()]).train(
        resume_from_checkpoint=resume_from_checkpoint()
    )
    source = store.latest(s3_root)
    assert source is not None and source.step == 4
    assert (stage_a / "checkpoint-4" / "model.safetensors").is_file()  # the newest stays
    return source.path, stage_a


@pytest.mark.parametrize(
    "kind",
    ["stranger", "own-altered", "group-writable", "linked-folder", "linked-file", "no-hashes"],
)
def test_a_local_copy_not_the_users_own_or_not_what_was_uploaded_is_fetched_afresh(
    kind: str,
    s3_env: SeaweedServer,
    s3_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from slurm_dispatch.integrations.transformers import resume_from_checkpoint
    from tests.unit.test_integrations_transformers import saved_weights_hash

    source, stage_a = first_execution(s3_root, tmp_path, monkeypatch)
    reference = saved_weights_hash(transfer.fetch_save(source, str(tmp_path / "ref"), 10))
    if kind == "no-hashes":
        manifest = s3saves.read_json(f"{source}/dispatch-manifest.json")
        manifest.pop("sha256", None)
        put_object(s3_env, f"{source}/dispatch-manifest.json", json.dumps(manifest).encode())
    words = plant(kind, stage_a, tmp_path)
    capfd.readouterr()
    _exec_b, stage_b = dispatch_env(s3_root, tmp_path, B, E2, source, monkeypatch)
    with FaultyProxy(s3_env.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        chosen = resume_from_checkpoint()
        fetched = weights_read_from_s3(proxy)
    assert isinstance(chosen, str) and chosen.startswith(str(stage_b) + "/")
    assert saved_weights_hash(chosen) == reference
    assert fetched >= 1, "the copy was not fetched from S3"
    err = capfd.readouterr().err
    assert f"not using the local copy {stage_a}/checkpoint-4" in err and words in err, err


def test_an_intact_copy_of_the_users_own_is_copied_not_fetched(
    s3_env: SeaweedServer,
    s3_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from slurm_dispatch.integrations.transformers import resume_from_checkpoint
    from tests.unit.test_integrations_transformers import saved_weights_hash

    source, stage_a = first_execution(s3_root, tmp_path, monkeypatch)
    manifest = s3saves.read_json(f"{source}/dispatch-manifest.json")
    # The hashes recorded at upload are the content's, whatever the ETags of a multipart upload.
    assert manifest["sha256"] == {
        name: hashlib.sha256((stage_a / "checkpoint-4" / name).read_bytes()).hexdigest()
        for name in manifest["files"]
    }
    _exec_b, stage_b = dispatch_env(s3_root, tmp_path, B, E2, source, monkeypatch)
    capfd.readouterr()
    with FaultyProxy(s3_env.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        chosen = resume_from_checkpoint()
        assert weights_read_from_s3(proxy) == 0
    assert isinstance(chosen, str) and chosen.startswith(str(stage_b) + "/")
    assert saved_weights_hash(chosen) == saved_weights_hash(str(stage_a / "checkpoint-4"))
    assert "not using the local copy" not in capfd.readouterr().err
    assert s3saves.why_unloadable_remote(source, ("trainer_state.json",)) is None
