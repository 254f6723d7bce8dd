"""The sandbox network's names and subnet (slurm_dispatch.sandbox.network), without root.

What the real tier cannot show cheaply: every slot's names fit the kernel's 15-byte limit and
never meet another slot's, and a bad $DISPATCH_SANDBOX_SUBNET is refused naming the value.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import network
from slurm_dispatch.sandbox.layout import MAX_NODE_COUNT, PORT_SLOTS, Layout, node_names


def test_names_fit_the_kernel_and_no_two_slots_share_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(network.SUBNET_ENV, raising=False)
    seen: dict[str, int] = {}
    for slot in range(PORT_SLOTS):
        net = network.Net(slot, network.net_of(Layout(Path("/x"))).subnet)
        names = [
            net.bridge,
            *(net.veth(n) for n in node_names(MAX_NODE_COUNT)),
            *(net.netns(n) for n in node_names(MAX_NODE_COUNT)),
        ]
        for name in names:
            assert len(name.encode()) <= 15, name
            assert seen.setdefault(name, slot) == slot, name
    # Slot 1's namespace names are not a prefix match for slot 12's (remove() relies on it).
    assert not network.Net(12, net.subnet).netns("n1").startswith("dsb1-")


def test_each_node_has_its_own_address_and_the_controller_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(network.SUBNET_ENV, raising=False)
    layout = Layout(Path("/var/tmp/some-sandbox"))
    net = network.net_of(layout)
    assert str(net.subnet) == f"10.217.{layout.port_slot}.0/24"
    addresses = [net.node_address(i) for i in range(MAX_NODE_COUNT)]
    assert net.host_address == f"10.217.{layout.port_slot}.1"
    assert len(set(addresses)) == MAX_NODE_COUNT and net.host_address not in addresses
    assert all(network.ipaddress.IPv4Address(a) in net.subnet for a in addresses)
    monkeypatch.setenv(network.SUBNET_ENV, "10.99.3.0/24")
    assert network.net_of(layout).node_address(0) == "10.99.3.11"


@pytest.mark.parametrize(
    "value, words",
    [
        ("10.99.3.7/24", "has host bits set"),
        ("banana", "not a network"),
        ("10.99.0.0/16", "must be a private /24"),
        ("8.8.8.0/24", "must be a private /24"),
    ],
)
def test_a_bad_subnet_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str, words: str
) -> None:
    monkeypatch.setenv(network.SUBNET_ENV, value)
    with pytest.raises(SandboxError, match=words) as refused:
        network.net_of(Layout(Path("/var/tmp/some-sandbox")))
    assert repr(value) in str(refused.value)
