"""The framework integrations on an ``s3://`` root against a real SeaweedFS server, with the real
libraries on the CPU: Hugging Face's Trainer saving through the staging folder (each save
uploaded with its manifest, then published; the older local copies removed) and resuming from
a local copy (fetched from S3, or copied from an earlier execution's on this node), past a
truncated save; Lightning writing ``s3://`` itself (s3fs) and resuming from the URL.  The
Trainer's first two cases and Lightning's first run on every remote store of the table (Azure
Blob on Azurite too, Lightning writing ``az://`` through adlfs)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores import remote, transfer
from slurm_dispatch.checkpoint.stores.s3 import parse_root
from slurm_dispatch.execution import s3saves, saves
from tests.s3server import SeaweedServer

from .worlds import Raw

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

E1, E2 = 1_000_000, 1_000_001
A, B = "a" * 26, "b" * 26


def dispatch_env(
    root: str,
    stage_base: Path,
    attempt: str,
    epoch: int,
    resume: str,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, Path]:
    """The launcher's contract on an S3 root: the prefix, and a fresh local staging folder."""
    exec_dir = f"{root}/exec/{attempt}"
    stage = stage_base / f"dispatch-stage-{attempt}"
    stage.mkdir(parents=True)
    for name, value in (
        ("DISPATCH_CHECKPOINT", root),
        ("DISPATCH_EXEC_DIR", exec_dir),
        ("DISPATCH_STAGE_DIR", str(stage)),
        ("DISPATCH_EPOCH", str(epoch)),
        ("DISPATCH_ATTEMPT", attempt),
        ("DISPATCH_RESUME_FROM", resume),
    ):
        monkeypatch.setenv(name, value)
    return exec_dir, stage


def published(root: str) -> list[tuple[int, int, str]]:
    return [(f.epoch, f.step, f.path) for f in store.list_publications(root)]


def put_object(server: SeaweedServer, url: str, body: bytes) -> None:
    where = parse_root(url)
    server.client().put_object(Bucket=where.bucket, Key=where.prefix, Body=body)


# ---- Hugging Face: the staging folder, upload, publish; resume from a local copy ---------


def test_hf_saves_are_uploaded_with_their_manifest_then_published(
    remote_raw: Raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import make_trainer

    s3_root = remote_raw.root  # and every other remote store's

    exec_dir, stage = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    callback = DispatchCallback()
    trainer = make_trainer(tmp_path / "user-out", 6, [callback], save_total_limit=1)
    assert trainer.args.output_dir == str(stage) and trainer.args.save_total_limit is None
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    urls = [f"{exec_dir}/checkpoint-{s}" for s in (2, 4, 6)]
    assert published(s3_root) == [(E1, s, u) for s, u in zip((2, 4, 6), urls)]
    assert len(callback.publications) == 3
    for url in urls:
        folder, objects = remote.save_objects(url, 10)
        assert folder and "trainer_state.json" in objects and "model.safetensors" in objects
        manifest = s3saves.read_json(f"{url}/dispatch-manifest.json")
        assert manifest["files"] == {
            k: v for k, v in objects.items() if k != "dispatch-manifest.json"
        }
        assert s3saves.why_unloadable_remote(url, ("trainer_state.json",)) is None
    # Uploaded and published: the older local copies are gone, the newest kept.
    assert sorted(p.name for p in stage.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-6"
    ]
    assert s3saves.read_json(f"{exec_dir}/{saves.KEEP_RECORD}") == {
        "framework": "transformers",
        "setting": "save_total_limit",
        "keep": 1,
    }


@pytest.mark.parametrize("local_copy_left", [False, True])
def test_hf_resumes_from_a_local_copy_of_the_remote_save(
    remote_raw: Raw,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    local_copy_left: bool,
) -> None:
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import (
        StartProbe,
        make_trainer,
        saved_weights_hash,
    )

    s3_root = remote_raw.root  # and every other remote store's
    _exec_a, stage_a = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    make_trainer(tmp_path / "o", 4, [DispatchCallback()]).train(
        resume_from_checkpoint=resume_from_checkpoint()
    )
    source = store.latest(s3_root)
    assert source is not None and source.step == 4
    if not local_copy_left:  # another node: nothing of A's on this disk
        shutil.rmtree(stage_a)
    exec_b, stage_b = dispatch_env(s3_root, tmp_path, B, E2, source.path, monkeypatch)
    chosen = resume_from_checkpoint()
    assert isinstance(chosen, str) and chosen.startswith(str(stage_b) + "/")
    assert saved_weights_hash(chosen) == saved_weights_hash(
        remote.fetch_save(source.path, str(tmp_path / "reference"), 10)
    )
    probe = StartProbe()
    trainer = make_trainer(tmp_path / "o", 8, [DispatchCallback(), probe])
    trainer.train(resume_from_checkpoint=chosen)
    assert probe.step == 4 and trainer.state.global_step == 8
    assert [(s, p) for e, s, p in published(s3_root) if e == E2] == [
        (6, f"{exec_b}/checkpoint-6"),
        (8, f"{exec_b}/checkpoint-8"),
    ]
    record = s3saves.read_json(f"{exec_b}/{saves.RESUME_RECORD}")
    assert record["resume_from"] == source.path and record["passed_over"] == []


def resume_past_a_harmed_save(
    s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, harm: Callable[[str], None]
) -> tuple[str, str, Path, object]:
    """Execution A saves steps 2 and 4 (its local copies gone: another node), ``harm`` is
    given A's checkpoint-4 URL, and B, told to resume from it, chooses: (A's prefix, B's,
    B's staging folder, B's choice)."""
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import make_trainer

    exec_a, stage_a = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    make_trainer(tmp_path / "o", 4, [DispatchCallback()]).train(
        resume_from_checkpoint=resume_from_checkpoint()
    )
    shutil.rmtree(stage_a)
    harm(f"{exec_a}/checkpoint-4")
    exec_b, stage_b = dispatch_env(s3_root, tmp_path, B, E2, f"{exec_a}/checkpoint-4", monkeypatch)
    return exec_a, exec_b, stage_b, resume_from_checkpoint()


def test_hf_passes_over_a_truncated_save_to_the_previous_one_of_its_lineage(
    s3_env: SeaweedServer,
    s3_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    exec_a, exec_b, stage_b, chosen = resume_past_a_harmed_save(
        s3_root,
        tmp_path,
        monkeypatch,
        lambda url: put_object(s3_env, f"{url}/model.safetensors", b"cut"),
    )
    assert chosen == str(stage_b / "resume-2" / "checkpoint-2")
    record = s3saves.read_json(f"{exec_b}/{saves.RESUME_RECORD}")
    assert record["resume_from"] == f"{exec_a}/checkpoint-2"
    assert [p["path"] for p in record["passed_over"]] == [f"{exec_a}/checkpoint-4"]
    assert "is 3 bytes; its manifest says" in record["passed_over"][0]["why"]
    assert f"not resuming from {exec_a}/checkpoint-4" in capfd.readouterr().err


def test_hf_passes_over_a_save_whose_bytes_on_s3_were_replaced_at_the_same_size(
    s3_env: SeaweedServer,
    s3_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    def zero_the_weights(url: str) -> None:
        _folder, objects = transfer.save_objects(url, 10)
        put_object(
            s3_env, f"{url}/model.safetensors", b"\0" * objects["model.safetensors"]
        )  # sizes cannot tell

    exec_a, exec_b, stage_b, chosen = resume_past_a_harmed_save(
        s3_root, tmp_path, monkeypatch, zero_the_weights
    )
    assert chosen == str(stage_b / "resume-2" / "checkpoint-2")
    assert not (stage_b / "resume-1" / "checkpoint-4").exists()  # the bad copy is not kept
    record = s3saves.read_json(f"{exec_b}/{saves.RESUME_RECORD}")
    assert record["resume_from"] == f"{exec_a}/checkpoint-2"
    assert [p["path"] for p in record["passed_over"]] == [f"{exec_a}/checkpoint-4"]
    why = record["passed_over"][0]["why"]
    assert "'model.safetensors' has sha256" in why and "its manifest records" in why
    err = capfd.readouterr().err
    assert f"not resuming from {exec_a}/checkpoint-4: " in err and "model.safetensors" in err


# ---- Lightning: s3:// written by Lightning itself ----------------------------------------


def test_lightning_writes_s3_itself_publishes_each_save_and_resumes_from_the_url(
    remote_raw: Raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    s3_root = remote_raw.root  # and every other remote store's

    from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_lightning import Tiny, fit, weights_hash

    exec_a, _stage = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    checkpoint = ModelCheckpoint(every_n_train_steps=2, save_top_k=1, save_last=True)
    fit(tmp_path, 6, [checkpoint, DispatchCallback()], ckpt_path=resume_from_checkpoint())
    urls = [f"{exec_a}/checkpoints/epoch=0-step={s}.ckpt" for s in (2, 4, 6)]
    assert published(s3_root) == [(E1, s, u) for s, u in zip((2, 4, 6), urls)]
    assert all(s3saves.why_unloadable_remote(u) is None for u in urls)
    folder, objects = remote.save_objects(f"{exec_a}/checkpoints/last.ckpt", 10)
    assert not folder and objects, "last.ckpt is written to S3 too, and never published"
    assert s3saves.read_json(f"{exec_a}/{saves.KEEP_RECORD}")["keep"] == 1

    source = store.latest(s3_root)
    assert source is not None and source.path == urls[-1]
    dispatch_env(s3_root, tmp_path, B, E2, source.path, monkeypatch)
    chosen = resume_from_checkpoint()
    assert chosen == source.path  # Lightning reads the URL itself
    model = Tiny()
    trainer, model = fit(
        tmp_path,
        8,
        [ModelCheckpoint(every_n_train_steps=2), DispatchCallback()],
        model=model,
        ckpt_path=chosen,
    )
    assert model.start_step == 6 and trainer.global_step == 8
    local = remote.fetch_save(source.path, str(tmp_path / "ref.ckpt"), 10)
    import torch

    assert model.start_weights == weights_hash(torch.load(local, weights_only=False)["state_dict"])
    assert [s for e, s, _ in published(s3_root) if e == E2] == [8]
    assert s3saves.read_json(f"{exec_a}/{saves.RESUME_RECORD}")["resume_from"] == ""


def test_lightning_passes_over_a_save_replaced_on_s3_at_the_same_size(
    s3_env: SeaweedServer,
    s3_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_lightning import fit

    exec_a, _stage = dispatch_env(s3_root, tmp_path, A, E1, "", monkeypatch)
    fit(
        tmp_path,
        4,
        [ModelCheckpoint(every_n_train_steps=2, save_top_k=-1), DispatchCallback()],
        ckpt_path=resume_from_checkpoint(),
    )
    good, bad = (f"{exec_a}/checkpoints/epoch=0-step={s}.ckpt" for s in (2, 4))
    _folder, objects = transfer.save_objects(bad, 10)
    put_object(s3_env, bad, b"\0" * objects["epoch=0-step=4.ckpt"])  # sizes cannot tell
    exec_b, _stage = dispatch_env(s3_root, tmp_path, B, E2, bad, monkeypatch)
    assert resume_from_checkpoint() == good  # Lightning would read the URL given
    record = s3saves.read_json(f"{exec_b}/{saves.RESUME_RECORD}")
    assert [p["path"] for p in record["passed_over"]] == [bad]
    assert "'epoch=0-step=4.ckpt'" in record["passed_over"][0]["why"]
    assert "replaced on S3" in record["passed_over"][0]["why"]
    assert f"not resuming from {bad}: " in capfd.readouterr().err


def test_a_multi_node_hf_run_on_a_remote_root_is_refused_with_why(
    remote_raw: Raw, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.checkpoint.stores.schemes import scheme_of
    from slurm_dispatch.errors import UsageError
    from slurm_dispatch.integrations.transformers import DispatchCallback

    row = scheme_of(remote_raw.root)
    assert row is not None
    dispatch_env(remote_raw.root, tmp_path, A, E1, "", monkeypatch)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")

    class Args:
        output_dir = "x"
        save_total_limit = None
        world_size = 2

    with pytest.raises(UsageError, match=f"a root on {row.label} with 2 ranks over several nodes"):
        DispatchCallback().on_init_end(Args(), None, None)
