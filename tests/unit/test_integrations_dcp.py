"""torch.distributed.checkpoint inside a dispatch execution (slurm_dispatch.integrations.dcp):
one process, no process group (DCP's no_dist path), in this test's own process."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import UsageError
from slurm_dispatch.integrations import dcp
from tests.execution_env import dispatch_env

E1, E2 = 1_000_000, 1_000_001

# DCP warns on every save and load without a process group that it assumes one process.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(6, 3, generator=g), "b": torch.randn(4, generator=g)},
        "step": step,
    }


def empty() -> dict[str, object]:
    return {"model": {"w": torch.zeros(6, 3), "b": torch.zeros(4)}, "step": -1}


def hashes(sd: dict[str, object]) -> dict[str, str]:
    model = sd["model"]
    assert isinstance(model, dict)
    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in model.items()} | {
        "step": str(sd["step"])
    }


def steps(root: Path) -> list[int]:
    return [f.step for f in store.list_publications(str(root))]


def test_sync_and_async_saves_are_published_once_each_and_load_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    fresh = empty()
    assert dcp.load(fresh) is None and fresh["step"] == -1  # a fresh start loads nothing
    dcp.save(state(1), step=1)
    future = dcp.async_save(state(2), step=2)
    future.result()
    assert steps(root) == [1, 2]
    folder = exec_dir / "step-2"
    assert sorted(os.listdir(folder)) == [".metadata", "__0_0.distcp", "dispatch-manifest.json"]
    manifest = json.loads((folder / "dispatch-manifest.json").read_text())
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp"}
    monkeypatch.undo()
    latest = store.latest(str(root))
    assert latest is not None
    dispatch_env(root, "b", E2, latest.path, monkeypatch)
    loaded = empty()
    assert dcp.load(loaded) == str(folder)
    assert hashes(loaded) == hashes(state(2))


def two_saves_then_resume(
    root: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[Path], None]
) -> tuple[Path, dict[str, object]]:
    """Execution a saves steps 1 and 2, ``spoil`` harms step 2, and execution b, told to
    resume from step 2, loads: its folder and the state it loaded."""
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    dcp.save(state(1), step=1)
    dcp.save(state(2), step=2)
    spoil(exec_dir / "step-2")
    monkeypatch.undo()
    dispatch_env(root, "b", E2, str(exec_dir / "step-2"), monkeypatch)
    loaded = empty()
    assert dcp.load(loaded) == str(exec_dir / "step-1")
    return exec_dir, loaded


def test_a_save_dcp_cannot_load_is_passed_over_for_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def zero_the_shard(save: Path) -> None:
        shard = save / "__0_0.distcp"
        shard.write_bytes(b"\0" * shard.stat().st_size)  # same size: the manifest cannot tell

    exec_dir, loaded = two_saves_then_resume(tmp_path / "ck", monkeypatch, zero_the_shard)
    assert hashes(loaded) == hashes(state(1))
    err = capfd.readouterr().err
    assert f"not resuming from {exec_dir / 'step-2'}: DCP could not load it" in err


def test_a_checkpoint_id_outside_the_execution_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    with pytest.raises(UsageError, match="checkpoint_id '/elsewhere/step-1' is outside"):
        dcp.save(state(1), step=1, checkpoint_id="/elsewhere/step-1")
    with pytest.raises(UsageError, match="step None"):
        dcp.save(state(1))
    assert not (tmp_path / "ck" / "pub").exists() or steps(tmp_path / "ck") == []


@pytest.mark.parametrize("root", ["s3://bucket/run", "az://container/run"])
def test_a_remote_root_is_refused_naming_it_whatever_its_store(
    root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (
        ("DISPATCH_CHECKPOINT", root),
        ("DISPATCH_EXEC_DIR", f"{root}/exec/a"),
        ("DISPATCH_STAGE_DIR", str(tmp_path)),
        ("DISPATCH_EPOCH", str(E1)),
        ("DISPATCH_ATTEMPT", "a"),
    ):
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError) as refused:
        dcp.save(state(1), step=1)
    assert str(refused.value) == (
        f"checkpoint root {root!r}: the DCP integration publishes under a folder root "
        "only (not a remote one such as s3:// or az:// yet)"
    )


def test_a_torn_save_without_a_manifest_is_passed_over_before_dcp_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def tear_as_watch_published(save: Path) -> None:
        (save / "dispatch-manifest.json").unlink()  # as dispatch watch publishes a DCP folder
        with open(save / "__0_0.distcp", "r+b") as handle:
            handle.truncate(8)

    exec_dir, loaded = two_saves_then_resume(tmp_path / "ck", monkeypatch, tear_as_watch_published)
    assert hashes(loaded) == hashes(state(1))
    err = capfd.readouterr().err
    assert f"not resuming from {exec_dir / 'step-2'}: " in err
    assert "DCP could not load it" not in err


def test_a_second_save_into_a_published_folder_is_refused_and_the_first_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    dcp.save(state(1), step=1)
    before = {p.name: p.read_bytes() for p in (exec_dir / "step-1").iterdir()}
    for again in (
        lambda: dcp.save(state(2), step=1),
        lambda: dcp.async_save(state(2), step=2, checkpoint_id="step-1"),
    ):
        with pytest.raises(UsageError, match="step-1' holds a save already"):
            again()
    assert {p.name: p.read_bytes() for p in (exec_dir / "step-1").iterdir()} == before
    assert steps(root) == [1]


def test_a_step_folder_that_is_a_symlink_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    outside = tmp_path / "outside"
    outside.mkdir()
    (exec_dir / "step-7").symlink_to(outside)  # planted where the save of step 7 goes
    with pytest.raises(UsageError, match="step-7' is a symlink"):
        dcp.save(state(7), step=7)
    assert list(outside.iterdir()) == []  # nothing written outside the execution's folder
    assert steps(tmp_path / "ck") == []


def test_a_storage_writer_aimed_outside_the_execution_is_refused_by_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    for call in (dcp.save, dcp.async_save):
        writer = torch_dcp.FileSystemWriter(str(elsewhere))
        with pytest.raises(
            UsageError,
            match=re.escape(
                f"storage_writer's folder '{elsewhere}' is outside the execution's folder"
            ),
        ):
            call(state(1), step=1, storage_writer=writer)
    assert not elsewhere.exists() and not (exec_dir / "step-1").exists()
    assert steps(tmp_path / "ck") == []
    # One aimed inside is the save's folder, as a checkpoint_id would be.
    inside = torch_dcp.FileSystemWriter(str(exec_dir / "mine"))
    dcp.save(state(3), step=3, storage_writer=inside)
    assert (exec_dir / "mine" / ".metadata").exists() and steps(tmp_path / "ck") == [3]
    with pytest.raises(UsageError, match="aimed at .*mine2.* but checkpoint_id"):
        dcp.save(
            state(4),
            step=4,
            checkpoint_id="step-4",
            storage_writer=torch_dcp.FileSystemWriter(str(exec_dir / "mine2")),
        )


def test_env_names_the_execution_a_save_goes_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = dispatch_env(tmp_path / "other", "x", E1, "", monkeypatch)  # os.environ's
    root = tmp_path / "ck"
    exec_dir = root / "exec" / "a"
    exec_dir.mkdir(parents=True)
    env = {
        "DISPATCH_CHECKPOINT": str(root),
        "DISPATCH_EXEC_DIR": str(exec_dir),
        "DISPATCH_EPOCH": str(E2),
        "DISPATCH_ATTEMPT": "a",
    }
    dcp.save(state(1), step=1, env=env)
    dcp.async_save(state(2), step=2, env=env).result()
    assert sorted(os.listdir(exec_dir)) == ["step-1", "step-2"] and os.listdir(other) == []
    assert steps(root) == [1, 2] and steps(tmp_path / "other") == []
    assert dcp.save_folder(5, env=env) == str(exec_dir / "step-5")


def spoil_item(save: Path, fqn: str) -> None:
    """Zero the bytes of the one stored item ``fqn`` of ``save`` (the file keeps its size)."""
    metadata = torch_dcp.FileSystemReader(str(save)).read_metadata()
    for index, where in metadata.storage_data.items():
        if index.fqn == fqn:
            with open(save / where.relative_path, "r+b") as handle:
                handle.seek(where.offset)
                handle.write(b"\0" * where.length)


def test_a_save_that_fails_part_way_leaves_the_callers_values_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whichever item is the damaged one, DCP reads some before it in one of the cases.
    for n, fqn in enumerate(("model.w", "model.b", "step")):
        root = tmp_path / f"ck{n}"
        exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
        dcp.save(state(1), step=1)
        spoil_item(exec_dir / "step-1", fqn)
        monkeypatch.undo()
        dispatch_env(root, "b", E2, str(exec_dir / "step-1"), monkeypatch)
        loaded = empty()
        assert dcp.load(loaded) is None, fqn  # a fresh start...
        assert hashes(loaded) == hashes(empty()), fqn  # ...with nothing of the broken save
        monkeypatch.undo()


def test_a_fallback_without_a_key_leaves_no_value_of_the_broken_save_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partial = DefaultLoadPlanner(allow_partial_load=True)
    for n, fqn in enumerate(("model.w", "model.b", "extra")):
        root = tmp_path / f"ck{n}"
        exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
        dcp.save(state(1), step=1)
        dcp.save(state(2) | {"extra": torch.ones(5)}, step=2)  # a key step 1 lacks
        spoil_item(exec_dir / "step-2", fqn)
        monkeypatch.undo()
        dispatch_env(root, "b", E2, str(exec_dir / "step-2"), monkeypatch)
        loaded = empty() | {"extra": torch.zeros(5)}
        assert dcp.load(loaded, planner=partial) == str(exec_dir / "step-1"), fqn
        assert hashes(loaded) == hashes(state(1)), fqn
        assert torch.equal(loaded["extra"], torch.zeros(5)), fqn  # the caller's, as it was
        monkeypatch.undo()


class Net:
    """A Stateful entry, as torchtitan's model and optimizer wrappers are: DCP reads through
    its state_dict() (views of its parameters) and gives the result to load_state_dict."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(3, 2)
        self.loads = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.layer.state_dict()

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.loads += 1
        self.layer.load_state_dict(sd)

    def values(self) -> list[list[float]]:
        return [p.detach().flatten().tolist() for p in self.layer.parameters()]


def test_a_stateful_entry_is_given_a_save_only_once_it_was_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n, fqn in enumerate(("net.weight", "net.bias", "")):
        root = tmp_path / f"ck{n}"
        exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
        dcp.save({"net": Net(1), "step": 1}, step=1)
        if fqn:
            spoil_item(exec_dir / "step-1", fqn)
        monkeypatch.undo()
        dispatch_env(root, "b", E2, str(exec_dir / "step-1"), monkeypatch)
        net = Net(0)
        before = net.values()
        loaded: dict[str, object] = {"net": net, "step": -1}
        if fqn:  # broken: a fresh start, the parameters as they were, never given a save
            assert dcp.load(loaded) is None, fqn
            assert (net.values(), net.loads, loaded["step"]) == (before, 0, -1), fqn
        else:
            assert dcp.load(loaded) == str(exec_dir / "step-1")
            assert (net.values(), net.loads, loaded["step"]) == (Net(1).values(), 1, 1)
            assert loaded["net"] is net
        monkeypatch.undo()


class Loader:
    """A Stateful that refuses a save of another data-parallel degree, as torchtitan's
    dataloader does (an assert in its load_state_dict)."""

    def __init__(self, world: int) -> None:
        self.world = world

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"world_size": torch.tensor(self.world)}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        assert int(sd["world_size"]) == self.world, "dp degree changed: no resharding"


def test_a_save_the_state_refuses_after_part_of_it_took_its_values_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved on 4 data-parallel ranks, resumed on 2: the net (a Stateful before the loader)
    took the save's weights, then the loader refused it.  load returned None, a fresh start,
    with the net holding the save's weights (and the step as it was): a mixture no caller can
    tell.  It raises now, naming the save and what refused it."""
    root = tmp_path / "ck"
    exec_dir = dispatch_env(root, "a", E1, "", monkeypatch)
    dcp.save({"net": Net(1), "loader": Loader(4), "step": 1}, step=1)
    monkeypatch.undo()
    dispatch_env(root, "b", E2, str(exec_dir / "step-1"), monkeypatch)
    loaded: dict[str, object] = {"net": Net(0), "loader": Loader(2), "step": -1}
    with pytest.raises(
        dcp.PartlyLoaded,
        match=r"step-1 was read whole and given to net "
        r"before AssertionError: dp degree changed",
    ):
        dcp.load(loaded)


def test_each_save_is_marked_in_the_progress_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled job (docs/user-guide.md): a save's time is no stall; its end is progress at its
    step."""
    from slurm_dispatch.execution import steps as progress

    exec_dir = dispatch_env(tmp_path / "ck", "a", E1, "", monkeypatch)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(exec_dir))
    monkeypatch.setattr(progress, "_current", progress._UNSET)
    inside: list[object] = []
    real_save = torch_dcp.save

    def looking(*args: object, **kwargs: object) -> object:
        inside.append(progress.read(str(exec_dir)))
        return real_save(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch_dcp, "save", looking)
    dcp.save(state(3), step=3)
    assert [(r["step"], r["saving"]) for r in inside] == [(3, True)]  # type: ignore[index]
    after = progress.read(str(exec_dir))
    assert after is not None and (after["step"], after["saving"], after["saves"]) == (3, False, 1)
    dcp.async_save(state(4), step=4).result()
    after = progress.read(str(exec_dir))
    assert after is not None and (after["step"], after["saving"], after["saves"]) == (4, False, 2)
    monkeypatch.setattr(progress, "_current", progress._UNSET)
