"""The POSIX store on real file systems: durability, concurrency, refusals."""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import (
    AlreadyPublished,
    BadPublicationName,
    OutsideRoot,
    StoreError,
    StoreFull,
)

E1 = model.Epoch(0, 1, 0).value
E2 = model.Epoch(0, 1, 1).value


def save(root: Path, rel: str) -> Path:
    path = root / rel
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_empty_store_has_no_latest(tmp_path: Path) -> None:
    assert store.latest(str(tmp_path)) is None
    assert store.list_publications(str(tmp_path)) == []


def test_latest_prefers_epoch_over_step(tmp_path: Path) -> None:
    old = save(tmp_path, "exec/old/checkpoint-900")
    new = save(tmp_path, "exec/new/checkpoint-100")
    store.publish(str(tmp_path), E2, 100, str(new))
    store.publish(str(tmp_path), E1, 900, str(old))  # the old run's late save
    found = store.latest(str(tmp_path))
    assert found is not None
    assert (found.epoch, found.step, found.path) == (E2, 100, str(new))
    assert [f.step for f in store.list_publications(str(tmp_path))] == [900, 100]


def test_publication_is_empty_read_only_file(tmp_path: Path) -> None:
    name = store.publish(str(tmp_path), E1, 1, str(save(tmp_path, "exec/a/c1")))
    st = os.stat(tmp_path / "pub" / name)
    assert st.st_size == 0 and st.st_mode & 0o777 == 0o444


def test_publish_twice_is_refused(tmp_path: Path) -> None:
    path = str(save(tmp_path, "exec/a/c1"))
    name = store.publish(str(tmp_path), E1, 1, path)
    with pytest.raises(AlreadyPublished, match=name) as info:
        store.publish(str(tmp_path), E1, 1, path)
    assert isinstance(info.value, FileExistsError)


def test_publish_refuses_missing_and_outside_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(OutsideRoot, match="does not exist"):
        store.publish(str(root), E1, 1, str(root / "nope"))
    outside = save(tmp_path, "elsewhere")
    with pytest.raises(OutsideRoot, match="elsewhere"):
        store.publish(str(root), E1, 1, str(outside))
    (root / "link").symlink_to(outside)
    with pytest.raises(OutsideRoot, match="resolves to"):
        store.publish(str(root), E1, 1, str(root / "link"))
    assert not (root / "pub").exists() or os.listdir(root / "pub") == []


def test_symlink_inside_root_is_accepted(tmp_path: Path) -> None:
    target = save(tmp_path, "exec/a/c1")
    (tmp_path / "exec/a/current").symlink_to(target)
    store.publish(str(tmp_path), E1, 1, str(tmp_path / "exec/a/current"))
    assert store.latest(str(tmp_path)).path == str(tmp_path / "exec/a/current")  # type: ignore[union-attr]


def test_pub_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "pub").symlink_to(elsewhere)
    path = save(root, "exec/a/c1")
    with pytest.raises(StoreError, match="symlink"):
        store.publish(str(root), E1, 1, str(path))
    with pytest.raises(StoreError, match="symlink"):
        store.latest(str(root))
    assert os.listdir(elsewhere) == []


def test_garbage_name_is_an_error_naming_it(tmp_path: Path) -> None:
    store.publish(str(tmp_path), E1, 1, str(save(tmp_path, "exec/a/c1")))
    (tmp_path / "pub" / "checkpoint-99").touch()
    for read in (store.latest, store.list_publications):
        with pytest.raises(BadPublicationName, match="'checkpoint-99'"):
            read(str(tmp_path))


def test_climbing_path_in_pub_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "pub").mkdir()
    bad = f"{E2:020d}-{1:020d}-{model.encode_path_bytes(b'../../etc/passwd')}"
    (tmp_path / "pub" / bad).touch()
    for read in (store.latest, store.list_publications):
        with pytest.raises(BadPublicationName, match="climbs"):
            read(str(tmp_path))


def test_root_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a directory"):
        store.latest(str(tmp_path / "missing"))


@pytest.mark.parametrize("reader", ["latest", "list_publications"])
def test_a_root_that_is_a_file_is_named_so(tmp_path: Path, reader: str) -> None:
    """Not "pub/ '.../afile/pub' is not a directory": the root itself is the problem."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match="checkpoint root '.*afile' is a file, not a folder"):
        getattr(store, reader)(str(tmp_path / "afile"))


@pytest.mark.parametrize("reader", ["latest", "list_publications"])
def test_a_root_that_is_a_dangling_symlink_is_named_so(tmp_path: Path, reader: str) -> None:
    """A root linked to a folder that is not there (a file system not mounted) is no file."""
    (tmp_path / "ck").symlink_to(tmp_path / "scratch" / "u")
    with pytest.raises(StoreError) as info:
        getattr(store, reader)(str(tmp_path / "ck"))
    assert "is a file" not in str(info.value)
    assert "is a symlink to" in str(info.value) and "scratch/u" in str(info.value)


def _as_nobody(target, *args) -> int:  # type: ignore[no-untyped-def]
    """Run target(*args) in a forked child as nobody; return 0/1/2 for ok/StoreError/other."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            target(*args)
            code = 0
        except StoreError:
            code = 1
        except BaseException:
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to nobody")
def test_permission_denied_is_a_store_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    path = save(tmp_path, "exec/a/c1")
    (tmp_path / "pub").mkdir(mode=0o755)
    assert _as_nobody(store.publish, str(tmp_path), E1, 1, str(path)) == 1
    (tmp_path / "pub").chmod(0o700)
    assert _as_nobody(store.latest, str(tmp_path)) == 1
    assert os.listdir(tmp_path / "pub") == []
    # And the message names the path.
    with pytest.raises(StoreError, match="pub"):
        store.latest(str(tmp_path / "pub" / "x"))


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0:
        pytest.fail("the full-file-system test mounts a tmpfs and must run as root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=12", "tmpfs", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_full_file_system_gives_clear_error_and_no_partial_name(tiny_tmpfs: Path) -> None:
    root = tiny_tmpfs
    path = save(root, "exec/a/c1")
    store.publish(str(root), E1, 0, str(path))
    published = []
    with pytest.raises(StoreFull, match="no space left") as info:
        for step in range(1, 100):
            published.append(store.publish(str(root), E1, step, str(path)))
    assert isinstance(info.value, OSError)
    names = sorted(os.listdir(root / "pub"))
    assert len(names) == len(published) + 1
    assert [f.name for f in store.list_publications(str(root))] == names


def _publisher(root: str, worker: int, count: int, queue) -> None:  # type: ignore[no-untyped-def]
    won = []
    for i in range(count):
        # Every worker tries the same shared names as well as its own: exactly one may win.
        step = i // 2 if i % 2 == 0 else 10_000 + worker * count + i
        try:
            won.append(store.publish(root, E1, step, os.path.join(root, "exec/a/c")))
        except AlreadyPublished:
            pass
    queue.put(won)


def test_concurrent_publishers_lose_nothing_and_never_collide(tmp_path: Path) -> None:
    save(tmp_path, "exec/a/c")
    workers, count = 8, 500
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_publisher, args=(str(tmp_path), w, count, queue))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    won = [name for result in results for name in result]
    assert len(won) == len(set(won)), "two publishers both created one name"
    on_disk = set(os.listdir(tmp_path / "pub"))
    assert on_disk == set(won)
    shared = count // 2
    assert len(on_disk) == shared + workers * (count - shared)
    assert store.latest(str(tmp_path)).step == max(  # type: ignore[union-attr]
        model.parse_name(n).step for n in won
    )


KILL_SCRIPT = r"""
import os, sys
from slurm_dispatch.checkpoint import publish as store
root, start = sys.argv[1], int(sys.argv[2])
path = os.path.join(root, "exec/a/c")
step = start
while True:
    name = store.publish(root, 1000000, step, path)
    os.write(1, (name + "\n").encode())
    step += 1
"""


def test_sigkill_leaves_only_whole_publications(tmp_path: Path) -> None:
    save(tmp_path, "exec/a/c")
    rng = random.Random(1234)
    reported: list[str] = []
    for round_ in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_SCRIPT, str(tmp_path), str(round_ * 1_000_000)],
            stdout=subprocess.PIPE,
        )
        # Its first publication says it runs (its start alone can take longer than the window
        # on a loaded machine, which left nothing published); then a random moment to kill at.
        first = proc.stdout.readline() if proc.stdout is not None else b""
        time.sleep(rng.random() * 0.3)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        reported += (first + out).decode().split()
    names = os.listdir(tmp_path / "pub")
    assert len(reported) > 0
    assert set(reported) <= set(names), "a publication reported as made is missing"
    assert len(names) - len(reported) <= 12  # at most one unreported per kill
    for name in names:
        model.parse_name(name)
        assert os.stat(tmp_path / "pub" / name).st_size == 0
    assert len(store.list_publications(str(tmp_path))) == len(names)


@pytest.mark.parametrize(
    "bad",
    [
        # Two valid names joined by a newline: one file whose name is not a publication.
        model.format_name(E1, 1, "a") + "\n" + model.format_name(E1, 2, "a"),
        f"{999_999:020d}-{1:020d}-ME",  # an epoch no (G, N, R) makes, not the greatest name
        f"{E1:020d}-{1:020d}-MEA",  # a base32 length no path has
    ],
)
def test_latest_refuses_every_bad_name_not_only_the_winner(tmp_path: Path, bad: str) -> None:
    store.publish(str(tmp_path), E2, 5, str(save(tmp_path, "exec/a/c1")))
    (tmp_path / "pub" / bad).touch()
    with pytest.raises(BadPublicationName, match=re.escape(repr(bad))):
        store.latest(str(tmp_path))


def test_root_may_be_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "lustre" / "me"
    real.mkdir(parents=True)
    (tmp_path / "scratch").symlink_to(real)
    root = tmp_path / "scratch"
    store.publish(str(root), E1, 1, str(save(root, "exec/a/c1")))
    assert store.latest(str(root)).path == str(root / "exec/a/c1")  # type: ignore[union-attr]
    # Below a linked root, the read-time check still applies.
    _swap_for_link(real / "exec" / "a", save(tmp_path, "elsewhere"))
    with pytest.raises(OutsideRoot, match="elsewhere"):
        store.latest(str(root))


def test_dangling_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "exec").mkdir()
    (tmp_path / "exec" / "gone").symlink_to(tmp_path / "exec" / "nothing")
    with pytest.raises(OutsideRoot, match="dangling"):
        store.publish(str(tmp_path), E1, 1, str(tmp_path / "exec" / "gone"))


def _swap_for_link(folder: Path, target: Path) -> None:
    """Replace ``folder`` (after publishing) by a symlink to ``target``, as a later writer might."""
    folder.rename(folder.with_name(folder.name + ".gone"))
    folder.symlink_to(target)


def test_latest_refuses_a_folder_swapped_for_a_link_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store.publish(str(root), E1, 1, str(save(root, "exec/a/c1")))
    outside = save(tmp_path, "elsewhere/c1")
    _swap_for_link(root / "exec" / "a", outside.parent)
    for read in (store.latest, store.list_publications):
        with pytest.raises(OutsideRoot, match=re.escape(str(outside))):
            read(str(root))


def test_latest_refuses_exec_itself_swapped_for_a_link_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store.publish(str(root), E1, 1, str(save(root, "exec/a/c1")))
    save(tmp_path, "elsewhere/a/c1")
    _swap_for_link(root / "exec", tmp_path / "elsewhere")
    with pytest.raises(OutsideRoot, match="outside the checkpoint root"):
        store.latest(str(root))


def test_latest_accepts_a_link_that_stays_inside_and_a_pruned_save(tmp_path: Path) -> None:
    # The rule at read time is publish's: a symlink below the root may point inside it.
    root = tmp_path / "root"
    store.publish(str(root), E1, 1, str(save(root, "exec/a/c1")))
    save(root, "exec/b/c1")
    _swap_for_link(root / "exec" / "a", root / "exec" / "b")
    assert store.latest(str(root)).path == str(root / "exec/a/c1")  # type: ignore[union-attr]
    # A save the user pruned is returned as recorded: nothing on its way leads out.
    store.publish(str(root), E2, 1, str(save(root, "exec/c/c1")))
    (root / "exec/c/c1").rmdir()
    assert store.latest(str(root)).path == str(root / "exec/c/c1")  # type: ignore[union-attr]
