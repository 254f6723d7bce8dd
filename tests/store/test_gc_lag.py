"""Cleanup's handshake with a starting execution when listings lag (docs/invariants.md, 9): each
side's view of ``exec/`` and ``pub/`` may be up to ``ListingLag`` old (NFS caches directory
contents and lookups; some S3 implementations list late).  The views here are served from a
cache that old (a fake at the store's boundary, on a folder and on SeaweedFS), on a clock the
cleanup's wait moves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from slurm_dispatch.checkpoint import execdir, gc
from slurm_dispatch.checkpoint.stores.base import Store
from slurm_dispatch.errors import UsageError

from .gc_world import World, epoch

E1, E2 = epoch(1), epoch(1, 1)
LAG = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def wait(self, seconds: float) -> None:
        self.now += seconds


class LaggingView:
    """A node's view of a store: every read answered from a cache up to ``lag`` old (as an NFS
    client's attribute and directory caches answer); writes go straight through."""

    READS = (
        "list_exec",
        "list_exec_entries",
        "exec_entries",
        "read_exec_file",
        "has_publication",
        "publication_names",
        "list_intents",
        "list_pins",
        "exists",
    )

    def __init__(self, store: Any, clock: Clock, lag: float) -> None:
        self._store, self._clock, self._lag = store, clock, lag
        self._cache: dict[tuple[Any, ...], tuple[float, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._store, name)
        if name not in self.READS:
            return real

        def read(*args: Any) -> Any:
            key = (name, *args)
            hit = self._cache.get(key)
            if hit is not None and self._clock.now - hit[0] < self._lag:
                value = hit[1]
            else:
                value = real(*args)
                self._cache[key] = (self._clock.now, value)
            return list(value) if isinstance(value, list) else value

        return read


def lagging(store: Store, clock: Clock, lag: float) -> Store:
    """A :class:`LaggingView` of ``store``, passed where a Store is taken.  It is no Store (it
    answers each method by delegating to ``store``), so the type checker is told by a cast."""
    return cast(Store, LaggingView(store, clock, lag))


def scene(world: World, clock: Clock) -> tuple[str, str, Store, Store]:
    """A published 1..3; B (live) was started from A's step 3, which it cannot load, and is
    about to fall back to step 2.  Both views have read the root a moment ago."""
    a = world.execution(E1)
    pubs = [world.saved(a, E1, step) for step in (1, 2, 3)]
    b = world.execution(E2, resume=pubs[-1])
    gc_view = lagging(world.store, clock, LAG)
    b_view = lagging(world.store, clock, LAG)
    assert b_view.has_publication(pubs[1])  # B's node looked at pub/ a moment ago
    return a, b, gc_view, b_view


def fall_back_during(world: World, a: str, b: str, b_view: Store, name: str) -> Any:
    def pause(where: str) -> None:
        if where == "unpublished":
            save = f"exec/{a}/checkpoint-2"
            world.store.create_exec_file(
                b, execdir.choice_name(save), execdir.choice_bytes(save, b, "fallback")
            )
            # B's check after its record: its stale view still shows the publication, so it
            # goes on to load the save.
            assert b_view.has_publication(name)

    return pause


def test_with_the_wait_a_choice_seen_late_is_spared(world: World) -> None:
    clock = Clock()
    a, b, gc_view, b_view = scene(world, clock)
    name = sorted(world.names())[1]
    said: list[str] = []
    gc.collect(
        world.root,
        1,
        store=gc_view,
        lag=LAG,
        wait=clock.wait,
        say=said.append,
        pause=fall_back_during(world, a, b, b_view, name),
    )
    assert world.exists(f"exec/{a}/checkpoint-2")  # B loads it: it stays
    assert not world.exists(f"exec/{a}/checkpoint-1")
    assert clock.now == 2 * LAG and "twice ListingLag" in said[0]


def test_without_the_wait_a_lagging_view_loses_the_save(world: World) -> None:
    """Why the wait is there: with the same lag and no wait, the save B is loading goes."""
    clock = Clock()
    a, b, gc_view, b_view = scene(world, clock)
    name = sorted(world.names())[1]
    gc.collect(
        world.root,
        1,
        store=gc_view,
        lag=0,
        wait=clock.wait,
        pause=fall_back_during(world, a, b, b_view, name),
    )
    assert not world.exists(f"exec/{a}/checkpoint-2")


def test_the_lag_defaults_to_nfs_s_and_is_configurable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISPATCH_LISTING_LAG", raising=False)
    conf = tmp_path / "dispatch.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    assert gc.listing_lag() == 60.0  # NFS's acdirmax default
    conf.write_text("ListingLag=5\n")
    assert gc.listing_lag() == 5.0
    monkeypatch.setenv("DISPATCH_LISTING_LAG", "0")
    assert gc.listing_lag() == 0.0
    monkeypatch.setenv("DISPATCH_LISTING_LAG", "soon")
    with pytest.raises(UsageError, match="'soon'"):
        gc.listing_lag()


def test_watch_keep_waits_out_the_lag_beside_its_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a listing lag, `watch --keep`'s cleanup runs beside the scans: a scan returns at
    once (it is not held for twice the lag), and the cleanup removes what it should after."""
    import threading

    from slurm_dispatch.execution.saverules import SaveRule
    from slurm_dispatch.execution.watch import Watcher

    from .gc_world import posix_world

    monkeypatch.setenv("DISPATCH_LISTING_LAG", "0.5")
    world = posix_world(tmp_path)
    a = world.execution(E1)
    world.saved(a, E1, 1)
    lines: list[str] = []
    watcher = Watcher(
        world.root, str(tmp_path / "root" / "exec" / a), E1, SaveRule.make(), lines.append
    )
    watcher.keep = 1
    world.save(a, 2)
    watcher.scan()
    assert [p.step for p in watcher.scan()] == [2]
    cleaning = [t for t in threading.enumerate() if t.name == "dispatch-cleanup"]
    assert cleaning and cleaning[0].is_alive()  # still waiting: the scan did not
    assert world.exists(f"exec/{a}/checkpoint-1")
    cleaning[0].join(30)
    assert not world.exists(f"exec/{a}/checkpoint-1")
    assert any("twice ListingLag" in line for line in lines)
    assert any(f"removed save exec/{a}/checkpoint-1" in line for line in lines)
