"""The sandbox's state folder as root sees it: nobody else's folder is trusted, no link followed.

Another local user may pre-create the predictable ``/var/tmp/slurm-dispatch-sandbox`` (or any
folder on the way to it) with planted symlinks, hoping that root's ``dispatch-sandbox up``
overwrites or chmods a file of their choice, or runs their ``prolog.d``.  These tests plant as
``nobody`` in a sticky, world-writable folder like ``/var/tmp`` and run the sandbox as root.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import cluster as sandbox
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import state_folder as sandbox_state_folder

NOBODY = 65534


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder like /var/tmp: root's, world-writable, sticky (on the real /var/tmp)."""
    if os.geteuid() != 0:
        pytest.fail("the state-folder tests run the sandbox's checks as root")
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="sb-plant-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder of root's that nobody can reach, with a file root cares about."""
    folder = tmp_path / "victim"
    folder.mkdir(mode=0o700)
    (folder / "secret").write_text("root's own\n")
    (folder / "secret").chmod(0o600)
    return folder


def as_nobody(plant: Callable[[], None]) -> None:
    """Run ``plant`` in a child that is the user nobody (no group, no capability left)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.umask(0o022)
            plant()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "planting as nobody failed"


def untouched(victim: Path) -> None:
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    secret = victim / "secret"
    assert (secret.read_text(), stat.S_IMODE(secret.stat().st_mode)) == ("root's own\n", 0o600)


def no_checkout(tmp_path: Path) -> Path:
    # `up` would stop at installing the venv from it: nothing gets started by these tests.
    return tmp_path / "not-a-checkout"


def test_up_refuses_a_folder_another_user_created(
    shared: Path, victim: Path, tmp_path: Path
) -> None:
    folder = shared / "sandbox"

    def plant() -> None:
        folder.mkdir()
        (folder / "etc").symlink_to(victim)
        (folder / "sandbox.json").symlink_to(victim / "secret")

    as_nobody(plant)
    with pytest.raises(SandboxError) as info:
        sandbox.up(folder, source=no_checkout(tmp_path), timeout=5)
    message = str(info.value)
    assert str(folder) in message and "nobody" in message, message
    untouched(victim)


def test_up_refuses_a_folder_planted_as_a_symlink(
    shared: Path, victim: Path, tmp_path: Path
) -> None:
    folder = shared / "sandbox"
    as_nobody(lambda: folder.symlink_to(victim))
    with pytest.raises(SandboxError, match=r"nobody") as info:
        sandbox.up(folder, source=no_checkout(tmp_path), timeout=5)
    assert str(folder) in str(info.value)
    untouched(victim)


def test_up_refuses_a_folder_whose_parent_another_user_can_swap(
    shared: Path, victim: Path, tmp_path: Path
) -> None:
    parent = shared / "alice"
    as_nobody(lambda: parent.mkdir(mode=0o755))
    with pytest.raises(SandboxError) as info:
        sandbox.up(parent / "sandbox", source=no_checkout(tmp_path), timeout=5)
    message = str(info.value)
    assert str(parent) in message and "nobody" in message, message
    assert not (parent / "sandbox").exists()


def test_up_refuses_a_subfolder_of_another_user(shared: Path, victim: Path, tmp_path: Path) -> None:
    folder = shared / "sandbox"
    folder.mkdir(mode=0o755)
    etc = folder / "etc"

    def plant() -> None:
        etc.mkdir()
        etc.chmod(0o777)
        (etc / "slurm.conf.tmp").symlink_to(victim / "secret")

    os.chmod(folder, 0o777)  # a moment's slip lets nobody in ...
    as_nobody(plant)
    os.chmod(folder, 0o755)  # ... and is undone: the folder is root's and closed again
    with pytest.raises(SandboxError) as info:
        sandbox.up(folder, source=no_checkout(tmp_path), timeout=5)
    message = str(info.value)
    assert str(etc) in message and "nobody" in message, message
    assert stat.S_IMODE(etc.stat().st_mode) == 0o777
    untouched(victim)


def test_a_fresh_folder_is_made_by_root_and_accepted_again(shared: Path) -> None:
    folder = shared / "a" / "sandbox"
    assert sandbox_state_folder.claim(folder, create=True)
    for made in (folder, folder.parent):
        st = made.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert sandbox_state_folder.claim(folder, create=True)


def test_a_folder_others_may_write_to_is_refused(shared: Path) -> None:
    folder = shared / "sandbox"
    folder.mkdir()
    folder.chmod(0o1777)  # root's, but anyone may add a name (sticky or not)
    with pytest.raises(SandboxError, match="writable by others") as info:
        sandbox_state_folder.claim(folder, create=True)
    assert f"choose another with --dir or ${sandbox_layout.DIR_ENV})" in str(info.value)


def test_a_missing_folder_is_not_made_by_down(shared: Path) -> None:
    assert sandbox.down(shared / "never") == []
    assert not (shared / "never").exists()


def test_writes_never_follow_a_link(tmp_path: Path, victim: Path) -> None:
    # Defence in depth: even in a folder of root's, a link in place of the temporary file or
    # of the file itself is replaced, never written through.
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf.tmp").symlink_to(victim / "secret")
    (etc / "site.conf").symlink_to(victim / "secret")
    for name in ("slurm.conf", "site.conf"):
        sandbox_state_folder.write_text(etc / name, "ClusterName=x\n", 0o644)
        assert (etc / name).read_text() == "ClusterName=x\n"
        assert not (etc / name).is_symlink()
        assert stat.S_IMODE((etc / name).stat().st_mode) == 0o644
    untouched(victim)


def test_a_link_on_the_way_is_followed_only_when_roots_and_its_target_checked(shared: Path) -> None:
    real = shared / "real"
    real.mkdir(mode=0o755)
    (shared / "link").symlink_to("real")  # root's, relative
    linked = shared / "link" / "sandbox"
    assert sandbox_state_folder.claim(linked, create=True)
    assert (real / "sandbox").stat().st_uid == 0
    theirs = shared / "theirs"
    as_nobody(lambda: theirs.mkdir(mode=0o755))
    (shared / "to-theirs").symlink_to(theirs)  # root's link, but into nobody's folder
    with pytest.raises(SandboxError, match=f"{theirs}.*nobody"):
        sandbox_state_folder.claim(shared / "to-theirs" / "sandbox", create=True)
    assert not (theirs / "sandbox").exists()


# --- dispatch-sandbox remove: only a sandbox's folder, never through a link ---------------------


def a_sandbox_folder(folder: Path) -> Path:
    """What `up` leaves in a folder, less the daemons: the manifest, a log, a venv file."""
    folder.mkdir(mode=0o755)
    (folder / "sandbox.json").write_text('{"nodes": ["n1"], "user": "dispatchuser"}\n')
    (folder / "log").mkdir()
    (folder / "log" / "slurmctld.log").write_text("started\n")
    return folder


@pytest.fixture
def no_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A port-slot claims folder that names no folder (this machine's is left alone)."""
    claims = tmp_path / "claims"
    monkeypatch.setenv("DISPATCH_SANDBOX_SLOTS", str(claims))
    return claims


def test_remove_refuses_a_folder_that_is_not_a_sandbox(shared: Path, no_claims: Path) -> None:
    folder = shared / "data"
    folder.mkdir(mode=0o755)
    (folder / "results.csv").write_text("1,2\n")
    (folder / "port-slot").write_text("7\n")  # a slot no claim of this machine gives it
    with pytest.raises(
        SandboxError,
        match=rf"{folder} is not a sandbox folder \(no "
        r"sandbox.json.*nothing was removed",
    ):
        sandbox.remove_sandbox(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["port-slot", "results.csv"]


def test_remove_refuses_a_manifest_that_is_a_link(shared: Path, no_claims: Path) -> None:
    elsewhere = a_sandbox_folder(shared / "elsewhere")
    folder = shared / "data"
    folder.mkdir(mode=0o755)
    (folder / "sandbox.json").symlink_to(elsewhere / "sandbox.json")
    with pytest.raises(SandboxError, match="is not a sandbox folder"):
        sandbox.remove_sandbox(folder)
    assert (folder / "sandbox.json").is_symlink() and (elsewhere / "sandbox.json").is_file()


def test_remove_refuses_a_symlink_to_a_sandbox_and_names_its_target(
    shared: Path, no_claims: Path
) -> None:
    target = a_sandbox_folder(shared / "real")
    link = shared / "link"
    link.symlink_to(target)  # root's own link: still not followed
    with pytest.raises(
        SandboxError,
        match=rf"{link} is a symlink \(to {target}\).*nothing was "
        "removed",
    ):
        sandbox.remove_sandbox(link)
    assert link.is_symlink() and (target / "log" / "slurmctld.log").is_file()


def test_remove_refuses_a_sandbox_folder_another_user_made(
    shared: Path, victim: Path, no_claims: Path
) -> None:
    folder = shared / "sandbox"

    def plant() -> None:
        folder.mkdir()
        (folder / "sandbox.json").write_text('{"nodes": ["n1"]}\n')
        (folder / "victim").symlink_to(victim)

    as_nobody(plant)
    with pytest.raises(SandboxError, match="nobody"):
        sandbox.remove_sandbox(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["sandbox.json", "victim"]
    untouched(victim)


def test_remove_of_a_missing_folder_removes_nothing(shared: Path) -> None:
    assert sandbox.remove_sandbox(shared / "never") == ([], None)


def test_a_removed_folder_takes_its_links_never_their_targets(shared: Path, victim: Path) -> None:
    folder = a_sandbox_folder(shared / "sandbox")
    (folder / "log" / "to-victim").symlink_to(victim)
    (folder / "secret").symlink_to(victim / "secret")
    said = sandbox_state_folder.delete_folder(folder)
    assert said.startswith(f"removed {folder} (5 files and folders"), said
    assert not os.path.lexists(folder)
    untouched(victim)


def test_a_folder_with_a_mount_in_it_is_not_removed(shared: Path) -> None:
    folder = a_sandbox_folder(shared / "sandbox")
    point = folder / "spool"
    point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "dispatch-test", str(point)], check=True
    )
    try:
        (point / "job-file").write_text("another file system's\n")
        with pytest.raises(
            SandboxError,
            match=rf"{point} is mounted in {folder}: unmount it "
            "first; nothing was removed",
        ):
            sandbox_state_folder.delete_folder(folder)
        assert (point / "job-file").is_file() and (folder / "sandbox.json").is_file()
    finally:
        subprocess.run(["umount", str(point)], check=True)
