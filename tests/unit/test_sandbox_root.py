"""The Debian root of another Slurm release: release names, the marker, how a command enters it.

Entering the root for real is the real tier's (tests/real/test_release.py); here, the pure parts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import clients as sandbox_clients
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import root as sandbox_root

ROOT = Path("/var/cache/slurm-dispatch/debian-trixie-slurm-24.11")


def test_release_names() -> None:
    assert sandbox_root.normalize(None) == sandbox_root.normalize("") == "host"
    assert sandbox_root.normalize(" 24.11 ") == "24.11"
    with pytest.raises(SandboxError, match="'9.99'.*host, 24.11"):
        sandbox_root.normalize("9.99")
    assert sandbox_root._major("slurm-wlm 24.11.5") == "24.11"
    assert sandbox_root._major("slurm 22.05.8") == "22.05"
    assert sandbox_root._major("") == ""


def test_default_folder_follows_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sandbox_layout.DIR_ENV, raising=False)
    monkeypatch.delenv(sandbox_layout.RELEASE_ENV, raising=False)
    assert sandbox_layout.state_dir() == sandbox_layout.DEFAULT_DIR
    monkeypatch.setenv(sandbox_layout.RELEASE_ENV, "24.11")
    assert sandbox_layout.state_dir() == Path(f"{sandbox_layout.DEFAULT_DIR}-24.11")
    # An empty DISPATCH_SANDBOX_DIR (as a Makefile passes it) is the default, never ".".
    monkeypatch.setenv(sandbox_layout.DIR_ENV, "")
    assert sandbox_layout.state_dir("") == Path(f"{sandbox_layout.DEFAULT_DIR}-24.11")


def test_a_root_is_complete_only_with_its_own_marker(tmp_path: Path) -> None:
    release = sandbox_root.RELEASES["24.11"]
    assert not sandbox_root.root_complete(tmp_path, release)
    marker = tmp_path / sandbox_root.MARKER
    marker.write_text(json.dumps({"release": "24.11", "packages": ["slurmd"]}))
    assert not sandbox_root.root_complete(tmp_path, release)  # another package set
    marker.write_text(json.dumps({"release": "24.11", "packages": list(release.packages)}))
    assert sandbox_root.root_complete(tmp_path, release)
    marker.write_text("{not json")
    assert not sandbox_root.root_complete(tmp_path, release)


def test_a_root_without_its_extras_keeps_its_build_and_gets_them_added(tmp_path: Path) -> None:
    """A root built before its row listed slurmdbd stays complete (no rebuild under running
    sandboxes); the extras its marker does not name are what ensure_root installs into it."""
    release = sandbox_root.RELEASES["24.11"]
    assert release.extras == ("slurmdbd",)
    marker = tmp_path / sandbox_root.MARKER
    marker.write_text(json.dumps({"release": "24.11", "packages": list(release.packages)}))
    assert sandbox_root.root_complete(tmp_path, release)
    assert sandbox_root.missing_extras(tmp_path, release) == ["slurmdbd"]
    marker.write_text(
        json.dumps({"release": "24.11", "packages": list(release.packages), "extras": ["slurmdbd"]})
    )
    assert sandbox_root.missing_extras(tmp_path, release) == []


def test_a_state_folder_under_a_bound_folder_needs_no_mount_point() -> None:
    assert sandbox_root.mount_point(ROOT, Path("/var/tmp/sb")) is None
    assert sandbox_root.mount_point(ROOT, Path("/home/me/sb")) is None
    assert sandbox_root.mount_point(ROOT, Path("/srv/sb")) == ROOT / "srv/sb"
    assert sandbox_root.mount_point(ROOT, Path("/var/tmpx")) == ROOT / "var/tmpx"


def test_enter_argv_mounts_in_a_namespace_of_its_own_then_chroots() -> None:
    argv = sandbox_root.enter_argv(
        ROOT, Path("/srv/sb"), ["sbatch", "--wrap", "a b"], user="u", cwd="/home/u"
    )
    assert argv[1:5] == ["--mount", "--propagation", "private", "--"]
    script = argv[argv.index("-c") + 1]
    assert argv[-3:] == ["sbatch", "--wrap", "a b"]
    lines = script.splitlines()
    assert lines[0] == "set -e"
    assert f"mount --bind /srv/sb {ROOT}/srv/sb" in lines
    assert any(f"mount --rbind /proc {ROOT}/proc" in line for line in lines)
    assert lines[-1] == f'exec chroot {ROOT} runuser -u u -- env -C /home/u "$@"'
    # No user, no folder: the command alone, as root, in the root's /.
    plain = sandbox_root.enter_argv(ROOT, Path("/var/tmp/sb"), ["sinfo"])
    last = plain[plain.index("-c") + 1].splitlines()[-1]
    assert last == f'exec chroot {ROOT} "$@"'
    assert "mount --bind /var/tmp/sb" not in plain[plain.index("-c") + 1]


def test_command_on_the_hosts_slurm_is_runuser_and_env(tmp_path: Path) -> None:
    folder = tmp_path / "sb"
    folder.mkdir()
    assert sandbox_clients.command(["sinfo"], folder) == ["sinfo"]
    assert sandbox_clients.command(["sinfo"], folder, user="u", cwd="/w") == [
        "runuser",
        "-u",
        "u",
        "--",
        "env",
        "-C",
        "/w",
        "sinfo",
    ]


def test_the_newest_row_is_named_by_what_it_expects_and_by_what_its_root_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newest = sandbox_root.RELEASES[sandbox_root.NEWEST]
    assert newest.moving and newest.expected == "26.05"
    assert not sandbox_root.RELEASES["24.11"].moving
    monkeypatch.setenv(sandbox_root.CACHE_ENV, str(tmp_path))
    assert sandbox_root.normalize("newest") == sandbox_root.normalize("26.05") == "newest"
    with pytest.raises(SandboxError, match="'26.11'.*host, 24.11, newest, 26.05"):
        sandbox_root.normalize("26.11")
    # Once the suite moved on and a root was built from it, that root's release names it too.
    root = tmp_path / newest.folder
    root.mkdir()
    assert sandbox_root.held(root) == ""
    (root / sandbox_root.MARKER).write_text(
        json.dumps({"release": "newest", "slurm": "slurm 26.11.1"})
    )
    assert sandbox_root.held(root) == "26.11"
    assert sandbox_root.normalize("26.11") == sandbox_root.normalize("26.05") == "newest"


def test_a_fixed_row_must_hold_its_release_and_the_newest_any() -> None:
    fixed, newest = sandbox_root.RELEASES["24.11"], sandbox_root.RELEASES["newest"]
    sandbox_root.check_holds(fixed, "slurm 24.11.5", ROOT)
    with pytest.raises(SandboxError, match="'slurm 26.05.5', not Slurm 24.11"):
        sandbox_root.check_holds(fixed, "slurm 26.05.5", ROOT)
    sandbox_root.check_holds(newest, "slurm 26.05.5", ROOT)
    sandbox_root.check_holds(newest, "slurm 26.11.0", ROOT)
    with pytest.raises(SandboxError, match="'', not Slurm 26.05"):
        sandbox_root.check_holds(newest, "", ROOT)
