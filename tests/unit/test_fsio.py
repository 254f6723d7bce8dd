"""slurm_dispatch/_fsio.py is the one home of the safety open flags, and does what it says."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import slurm_dispatch
from slurm_dispatch import _fsio

PACKAGE = Path(slurm_dispatch.__file__).parent
# The flags that carry a safety rule (create once, never through a symlink, a folder): spelled
# only in _fsio.py (the sandbox's state folder included: sandbox/state_folder.py opens through it).
FLAGS = {"O_EXCL", "O_NOFOLLOW", "O_DIRECTORY"}
EXCEPT = {"_fsio.py"}
EXCEPT_FOLDERS: set[str] = set()


def _sources() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if str(p.relative_to(PACKAGE)) not in EXCEPT
        and p.relative_to(PACKAGE).parts[0] not in EXCEPT_FOLDERS
    ]


def test_the_safety_flags_are_spelled_only_in_fsio() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in FLAGS:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                found += [
                    f"{path.relative_to(PACKAGE)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name in FLAGS
                ]
    assert not found, f"use slurm_dispatch._fsio instead: {found}"


def test_write_new_creates_once_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    _fsio.write_new(str(target), b"data", 0o444)
    assert target.read_bytes() == b"data" and (target.stat().st_mode & 0o777) == 0o444
    with pytest.raises(FileExistsError):
        _fsio.write_new(str(target), b"other")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(FileExistsError):  # a symlink in its place is never written through
        _fsio.write_new(str(tmp_path / "link"), b"x")
    assert not (tmp_path / "elsewhere").exists()

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        _fsio.write_new(str(tmp_path / "g"), b"data")
    assert not (tmp_path / "g").exists()
    with pytest.raises(OSError, match="No space"):
        _fsio.write_new(str(tmp_path / "h"), b"data", discard_partial=False)
    assert (tmp_path / "h").exists()


def test_open_dir_refuses_a_symlink_unless_told(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(OSError):
        _fsio.open_dir(str(tmp_path / "link"))
    os.close(_fsio.open_dir(str(tmp_path / "link"), follow=True))
    parent = _fsio.open_dir(str(tmp_path))
    try:
        os.close(_fsio.open_dir("real", parent, path_only=True))
        with pytest.raises(OSError):
            _fsio.open_dir("link", parent)
    finally:
        os.close(parent)
    _fsio.fsync_dir(str(tmp_path / "link"))
    with pytest.raises(OSError):
        _fsio.fsync_path(str(tmp_path / "link"), directory=True)
    os.mkfifo(tmp_path / "fifo")
    os.close(_fsio.open_file(str(tmp_path / "fifo"), nonblock=True))  # answers at once
