"""Messages on a remote root name the root's own store, by its row's label in the table of
stores (checkpoint/stores/schemes.py), never S3 on an az:// root; the commands' help names no
one store where every remote store is meant.  Reached without a server: the refusals, and the
checks with the store's answers stubbed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_dispatch.checkpoint import execdir
from slurm_dispatch.checkpoint.stores import remote, schemes
from slurm_dispatch.cli import sbatch
from slurm_dispatch.cli.dispatch import main
from slurm_dispatch.errors import StoreError, UsageError
from slurm_dispatch.execution import s3saves, stage
from slurm_dispatch.execution.watch import SaveRule, Watcher

REMOTE = [pytest.param(row, id=row.name) for row in schemes.SCHEMES if row.remote]


def _names_only(message: str, row: schemes.Scheme) -> None:
    """``message`` names ``row``'s store and no other remote store."""
    assert row.label in message, message
    for other in schemes.SCHEMES:
        if other.label not in row.label:
            assert other.label not in message, message


def test_a_root_is_named_by_its_row_and_a_folder_by_no_store() -> None:
    assert schemes.label_of("az://c/p/exec/x") == "Azure Blob"
    assert schemes.label_of("S3://b/p") == "S3"
    assert schemes.label_of("/scratch/ckpt") == "the remote store"


@pytest.mark.parametrize("row", REMOTE)
def test_watch_without_a_prefix_names_the_roots_store(row: schemes.Scheme, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="watch needs the execution's prefix") as info:
        Watcher(row.example, str(tmp_path), 0, SaveRule.make())
    _names_only(str(info.value), row)


@pytest.mark.parametrize("row", REMOTE)
def test_a_save_gone_or_replaced_names_the_roots_store(
    row: schemes.Scheme, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{row.example}/exec/a1/checkpoint-10"
    listed: dict[str, tuple[int, str]] = {}
    monkeypatch.setattr(remote, "save_listing", lambda url, timeout: (True, listed))
    manifest = {"format": 1, "files": {"model.bin": 4}, s3saves.ETAG_KEY: {"model.bin": "old"}}
    monkeypatch.setattr(s3saves, "read_json", lambda url: manifest)
    with pytest.raises(StoreError, match="after it was written") as info:
        s3saves.seal_remote_save(url)
    whys = [str(info.value), s3saves.why_unloadable_remote(url)]
    listed["model.bin"] = (4, "new")  # the same size, other bytes
    whys.append(s3saves.why_unloadable_remote(url))
    assert [" does not exist on " in str(why) for why in whys] == [False, True, False]
    assert "was replaced on " in str(whys[2])
    for why in whys:
        _names_only(str(why), row)


class _Store:
    """What stage's checks read of a store: the launcher's record, as the store holds it."""

    def read_exec_file(self, attempt: str, name: str) -> bytes:
        return b"theirs"


@pytest.mark.parametrize("row", REMOTE)
def test_the_staging_folders_kept_entries_name_the_roots_store(
    row: schemes.Scheme, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"{row.example}/exec/a1"
    (tmp_path / execdir.RECORD).write_bytes(b"mine")
    (tmp_path / "resume-1" / "results.csv").parent.mkdir()
    (tmp_path / "resume-1" / "results.csv").write_text("x")
    (tmp_path / "checkpoint-10").mkdir()
    (tmp_path / "checkpoint-10" / "model.bin").write_text("abcd")
    monkeypatch.setattr(remote, "save_objects", lambda url, timeout: (True, {}))
    whys = []
    for name in (execdir.RECORD, "resume-1", "checkpoint-10"):
        url = f"{prefix}/{name}"
        st: Any = _Store()
        path = os.path.join(tmp_path, name)
        why = stage._why_kept(st, "a1", name, path, url, {url}, [url, f"{row.example}/x/y"], 1.0)
        assert why is not None
        whys.append(why)
    assert [why.split(" on ")[0] for why in whys] == [
        "not",
        "results.csv is not a save of this root",
        "model.bin is not",
    ]
    for why in whys:
        _names_only(why, row)


def test_the_help_names_no_one_store_for_all() -> None:
    """Every command's help says "a remote root" or names each store's root; the --timeout
    bounds every remote store's calls, not S3's alone."""
    runner = CliRunner()
    for name in sorted(main.commands):
        result = runner.invoke(main, [name, "--help"], catch_exceptions=False)
        assert result.exit_code == 0, name
        assert "S3" not in result.output, (name, result.output)
    for row in schemes.SCHEMES:
        assert row.example in sbatch.HELP and f"'{row.extra}'" in sbatch.HELP


@pytest.mark.parametrize("row", REMOTE)
def test_no_staging_folder_names_the_roots_store(
    row: schemes.Scheme, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.execution import fetch
    from slurm_dispatch.execution.saves import Execution

    execution = Execution(row.example, f"{row.example}/exec/a1", 0, "a1", "7", None)
    monkeypatch.setattr(s3saves, "read_json", lambda url: None)  # no resume record yet
    with pytest.raises(StoreError, match="for a framework that writes only") as up:
        s3saves.uploader(execution)
    with pytest.raises(UsageError, match="to fetch into; or give DEST") as into:
        fetch._resume_source(execution, copy_here=True)
    for message in (str(up.value), str(into.value)):
        _names_only(message, row)
    with pytest.raises(UsageError, match="not inside a dispatch execution") as outside:
        fetch.fetch(None, None)
    assert not any(other.prefix in str(outside.value) for other in schemes.SCHEMES)
