"""One contract for every store (fsspec's tests/abstract habit): the POSIX store on a real
folder and every store of the table of stores (the S3 store on a real SeaweedFS server) pass
the same tests; a store's root comes from its one fixture (worlds.py, conftest.py).

What a store promises: round trips, the order of ``latest`` (epoch, then step, then the
encoded path for exact ties), create-once publication, refusal of bad names in ``pub/`` and
of paths that climb out of the root; and between processes racing for one name, exactly one
wins and every other is told.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores.open import open_store
from slurm_dispatch.checkpoint.stores.schemes import SCHEMES
from slurm_dispatch.errors import (
    AlreadyPublished,
    BadPublicationName,
    OutOfBounds,
    OutsideRoot,
)

from .worlds import KINDS, Raw

E1 = model.Epoch(0, 1, 0).value
E2 = model.Epoch(0, 1, 1).value
ATTEMPT = "0" * 26
REPO = str(Path(__file__).resolve().parents[2])


class Layout:
    """A root of one kind, with the two raw operations the contract needs from outside the
    store: making a save exist, and planting an entry in pub/ by hand."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        self.root = raw.root

    def save(self, relative: str) -> str:
        self.raw.put(f"{relative}/model.bin", b"w")
        return f"{self.root}/{relative}"

    def plant(self, name: str) -> None:
        self.raw.put(f"pub/{name}", b"")


@pytest.fixture
def layout(raw: Raw) -> Layout:
    """A fresh root of every store (the folder and each row of the table of stores)."""
    return Layout(raw)


def test_every_store_of_the_table_joins_the_contract() -> None:
    from . import conftest

    for row in SCHEMES:
        assert row.name in KINDS and callable(getattr(conftest, f"{row.name}_raw", None)), (
            f"the store {row.prefix} has no fixture {row.name}_raw in tests/store/conftest.py"
        )


def test_empty_store_has_no_latest(layout: Layout) -> None:
    assert store.latest(layout.root) is None
    assert store.list_publications(layout.root) == []


def test_round_trip(layout: Layout) -> None:
    path = layout.save("exec/a/checkpoint-500")
    name = store.publish(layout.root, E1, 500, path)
    assert name == model.format_name(E1, 500, "exec/a/checkpoint-500")
    found = store.latest(layout.root)
    assert found is not None
    assert (found.epoch, found.step, found.path, found.name) == (E1, 500, path, name)
    assert store.list_publications(layout.root) == [found]
    assert found.as_json() == {"epoch": E1, "step": 500, "path": path, "name": name}


def test_latest_prefers_epoch_over_step(layout: Layout) -> None:
    old = layout.save("exec/old/checkpoint-900")
    new = layout.save("exec/new/checkpoint-100")
    store.publish(layout.root, E2, 100, new)
    store.publish(layout.root, E1, 900, old)  # the old run's late save
    found = store.latest(layout.root)
    assert found is not None and (found.epoch, found.step, found.path) == (E2, 100, new)
    assert [(f.epoch, f.step) for f in store.list_publications(layout.root)] == [
        (E1, 900),
        (E2, 100),
    ]


def test_latest_prefers_step_within_an_epoch(layout: Layout) -> None:
    for step in (3, 20, 100, 9):
        store.publish(layout.root, E1, step, layout.save(f"exec/a/checkpoint-{step}"))
    assert store.latest(layout.root).step == 100  # type: ignore[union-attr]
    assert [f.step for f in store.list_publications(layout.root)] == [3, 9, 20, 100]


def test_tie_goes_to_the_greatest_encoded_path(layout: Layout) -> None:
    paths = ["exec/a/x", "exec/b/x", "exec/a/y"]
    for relative in paths:
        store.publish(layout.root, E1, 7, layout.save(relative))
    winner = max(paths, key=model.encode_path)
    found = store.latest(layout.root)
    assert found is not None and found.path.endswith("/" + winner)
    assert found.name == max(model.format_name(E1, 7, p) for p in paths)


def test_publish_twice_is_refused_with_exit_1(layout: Layout) -> None:
    path = layout.save("exec/a/c1")
    name = store.publish(layout.root, E1, 1, path)
    with pytest.raises(AlreadyPublished, match=re.escape(name)) as info:
        store.publish(layout.root, E1, 1, path)
    assert isinstance(info.value, FileExistsError) and info.value.exit_code == 1
    assert len(store.list_publications(layout.root)) == 1


def test_publish_refuses_paths_outside_the_root(layout: Layout) -> None:
    layout.save("exec/a/c1")
    for outside in (layout.root + "/../elsewhere", layout.root + "-sibling/exec/a/c1", layout.root):
        with pytest.raises(OutsideRoot):
            store.publish(layout.root, E1, 1, outside)
    assert store.list_publications(layout.root) == []


def test_publish_refuses_out_of_bounds_values(layout: Layout) -> None:
    path = layout.save("exec/a/c1")
    with pytest.raises(OutOfBounds, match="999999"):
        store.publish(layout.root, 999_999, 1, path)  # N = 0: no execution has it
    with pytest.raises(OutOfBounds, match="step -1"):
        store.publish(layout.root, E1, -1, path)
    assert store.list_publications(layout.root) == []


@pytest.mark.parametrize(
    "bad",
    [
        "checkpoint-99",
        f"{999_999:020d}-{1:020d}-ME",  # an epoch no (G, N, R) makes, not the greatest name
        f"{E1:020d}-{1:020d}-MEA",  # a base32 length no path has
        f"{E1:020d}-{1:020d}-me",  # lower case: a case-folding store could merge two names
    ],
)
def test_a_bad_name_in_pub_is_an_error_naming_it(layout: Layout, bad: str) -> None:
    store.publish(layout.root, E2, 5, layout.save("exec/a/c1"))
    layout.plant(bad)
    for read in (store.latest, store.list_publications):
        with pytest.raises(BadPublicationName, match=re.escape(repr(bad))):
            read(layout.root)


def test_a_climbing_path_in_pub_is_an_error(layout: Layout) -> None:
    layout.plant(f"{E2:020d}-{1:020d}-{model.encode_path_bytes(b'../../etc/passwd')}")
    for read in (store.latest, store.list_publications):
        with pytest.raises(BadPublicationName, match="climbs"):
            read(layout.root)


def test_exec_dir_is_the_attempts_own_place_under_the_root(layout: Layout) -> None:
    exec_dir = open_store(layout.root).exec_dir(ATTEMPT)
    assert exec_dir == f"{layout.root}/exec/{ATTEMPT}"
    with pytest.raises(OutOfBounds):
        open_store(layout.root).exec_dir("../x")


def test_a_quarantined_save_is_passed_over_until_the_mark_is_lifted(layout: Layout) -> None:
    """A quarantine mark (create-once, like a pin) makes the choice of the
    save to resume from fall back past that save, on every store; lifting it undoes that."""
    from slurm_dispatch.checkpoint import quarantine

    for step in (10, 20):
        store.publish(layout.root, E1, step, layout.save(f"exec/a/checkpoint-{step}"))
    st = open_store(layout.root)
    twenty = layout.root.rstrip("/") + "/exec/a/checkpoint-20"
    assert quarantine.choose(st)[0].step == 20  # type: ignore[union-attr]
    assert quarantine.mark(layout.root, twenty) is True
    assert quarantine.mark(layout.root, twenty) is False  # created once
    found, passed = quarantine.choose(st)
    assert found is not None and found.step == 10 and [p.step for p in passed] == [20]
    assert quarantine.located(st) == {twenty}
    with pytest.raises(Exception, match="not a published save"):
        quarantine.mark(layout.root, layout.save("exec/a/unpublished"))
    assert quarantine.lift(layout.root, twenty) is True
    assert quarantine.lift(layout.root, twenty) is False
    assert quarantine.choose(st) == (store.latest(layout.root), [])


# --- races: create-once between processes, on every store -----------------------------------

RACER = r"""
import sys
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import AlreadyPublished
root, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store.latest(root)  # a warm client, so the start line is a real starting gun
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
won = []
for i in range(count):
    # Every worker tries the same shared names as well as its own: exactly one may win each.
    step = i // 2 if i % 2 == 0 else 10_000 + worker * count + i
    try:
        won.append(store.publish(root, 1000000, step, root + "/exec/a/c"))
    except AlreadyPublished:
        pass
print("\n".join(won))
"""


def test_eight_processes_racing_on_shared_names_have_exactly_one_winner_each(
    layout: Layout,
) -> None:
    root = layout.root
    layout.save("exec/a/c")
    workers, count = 8, 200
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, root, str(w), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for w in range(workers)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:  # all waiting: let them go together
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * workers
    won = [name for out in outputs for name in out.split()]
    assert len(won) == len(set(won)), "two publishers both created one name"
    shared = count // 2
    listed = [f.name for f in store.list_publications(root)]
    assert set(listed) == set(won), "a publication was lost or appeared unreported"
    assert len(listed) == shared + workers * (count - shared)
    shared_names = {model.format_name(E1, step, "exec/a/c") for step in range(shared)}
    assert shared_names <= set(won)
    assert store.latest(root).step == max(  # type: ignore[union-attr]
        model.parse_name(n).step for n in won
    )
