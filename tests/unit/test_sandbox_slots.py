"""A port slot belongs to one sandbox folder.

Two folders whose paths hash to one slot ran on one bridge and one set of namespaces: the second
died on "Address already in use" and either one's ``down`` removed the other's network.  Here
the claims (slurm_dispatch.sandbox.slots) in a folder of the test's own, as root.
"""

from __future__ import annotations

import os
import shutil
from itertools import count
from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import slots
from slurm_dispatch.sandbox.layout import PORT_SLOTS, Layout


@pytest.fixture
def claims(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.fail("the slot claims are root's (the sandbox's checks run as root)")
    tmp_path.chmod(0o755)
    return tmp_path / "port-slots"


def folder(tmp_path: Path, name: str) -> Layout:
    path = tmp_path / name
    path.mkdir(mode=0o755)
    return Layout(path)


def twins(tmp_path: Path) -> tuple[Layout, Layout]:
    """Two sandbox folders whose paths prefer the same slot."""
    seen: dict[int, str] = {}
    for i in count():
        name = f"sb{i}"
        slot = Layout(tmp_path / name).preferred_slot
        if slot in seen:
            return folder(tmp_path, seen[slot]), folder(tmp_path, name)
        seen[slot] = name
    raise AssertionError("unreachable")


def test_two_folders_that_hash_alike_get_two_slots(tmp_path: Path, claims: Path) -> None:
    first, second = twins(tmp_path)
    assert first.preferred_slot == second.preferred_slot
    assert slots.take(first, claims) == [f"took port slot {first.preferred_slot}"]
    said = slots.take(second, claims)
    assert first.port_slot == first.preferred_slot
    assert second.port_slot != first.port_slot
    assert said == [f"took port slot {second.port_slot} ({first.preferred_slot} is {first.root}'s)"]
    assert slots.holder(first.port_slot, claims) == first.root
    assert slots.holder(second.port_slot, claims) == second.root
    # Claimed again (every `up`), each keeps its own and nothing changes.
    assert slots.take(first, claims) == slots.take(second, claims) == []
    assert second.controller_port != first.controller_port
    assert second.node_port(0) != first.node_port(0)


def test_a_removed_folders_slot_is_taken_over(tmp_path: Path, claims: Path) -> None:
    first, second = twins(tmp_path)
    slots.take(first, claims)
    shutil.rmtree(first.root)
    assert slots.holder(first.preferred_slot, claims) is None
    assert slots.take(second, claims) == [f"took port slot {second.preferred_slot}"]
    assert slots.holder(second.preferred_slot, claims) == second.root


def test_a_folder_records_no_slot_it_does_not_own(tmp_path: Path, claims: Path) -> None:
    first, second = twins(tmp_path)
    slots.take(first, claims)
    # A copy of the first's record (a folder copied whole) is not a claim: it moves on.
    second.port_slot_file.write_text(f"{first.port_slot}\n")
    assert slots.holder(first.port_slot, claims) == first.root
    slots.take(second, claims)
    assert second.port_slot != first.port_slot
    assert slots.holder(first.port_slot, claims) == first.root


def test_no_free_slot_names_the_holders(tmp_path: Path, claims: Path) -> None:
    layouts = [folder(tmp_path, f"sb{i}") for i in range(PORT_SLOTS - 1)]
    for layout in layouts:
        slots.take(layout, claims)
    assert len({layout.port_slot for layout in layouts}) == PORT_SLOTS - 1
    late = folder(tmp_path, "late")
    with pytest.raises(
        SandboxError,
        match=f"no free port slot for the sandbox in {late.root}"
        f": every one is held.*1: {tmp_path}/sb",
    ):
        slots.take(late, claims)
    assert late.recorded_slot() is None
