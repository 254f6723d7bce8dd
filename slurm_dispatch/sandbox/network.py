"""The sandbox's management network: a bridge on this machine and a network namespace per node.

Each node's slurmd starts inside its own network namespace (``ip netns``, entered with
``nsenter --net``: the mount namespace stays the host's, so every file, the munge socket among
them, is where it always is), and slurmstepd and the job's processes inherit it.  The namespace
has its loopback and one end of a veth pair, with the node's own address on the sandbox's /24;
the other end is a port of the sandbox's bridge on this machine, which holds the controller's
address (``.1``).  Nothing routes out: the bridge has no uplink and the namespaces no default
route, so a node reaches the controller and the other nodes, and nothing else.

:func:`cut` takes the bridge's end of a node's veth down: everything the node sends or receives
(slurmd, slurmstepd, the job's own processes) is lost, as when a switch port dies, while its
file system stays reachable (a storage network that outlives the management network).  The cut
is made outside the node's namespace, so nothing on the node, root included, can undo it;
:func:`restore` brings the link up.  Only ``ip`` and ``nsenter`` are needed (iproute2 and
util-linux, on every Debian): no firewall tool, whose rules another program on the machine
could reorder or flush.

Role: the names (:class:`Net`: bridge ``dsbS``, namespace ``dsbS-nX``, veth ``dsbSnX`` for
port slot S), the subnet (slot S gets ``10.217.S.0/24``; ``$DISPATCH_SANDBOX_SUBNET`` chooses
another), :func:`ensure` (idempotent: makes what is missing, repairs what a crash left half
made, never reconnects a node that :func:`cut` cut), :func:`remove` (no namespace, veth or
bridge left), and reading whether a node is cut (no root needed).

Invariant: only links and namespaces whose names are this slot's are ever touched; a subnet
that an address or route of this machine already covers is refused, naming what covers it.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import SandboxError
from .layout import Layout

SUBNET_ENV = "DISPATCH_SANDBOX_SUBNET"
NETNS_DIR = Path("/run/netns")
# Inside a node's namespace its end of the veth is called so.
NODE_LINK = "eth0"
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Net:
    """The names and addresses of one sandbox's network (from its folder's port slot)."""

    slot: int
    subnet: ipaddress.IPv4Network

    @property
    def bridge(self) -> str:
        return f"dsb{self.slot}"

    @property
    def host_address(self) -> str:
        """The controller's address: this machine's, on the bridge."""
        return str(self.subnet.network_address + 1)

    def node_address(self, index: int) -> str:
        """The address of the node at ``index`` (0 for n1)."""
        return str(self.subnet.network_address + 11 + index)

    def netns(self, node: str) -> str:
        return f"dsb{self.slot}-{node}"

    def netns_path(self, node: str) -> Path:
        return NETNS_DIR / self.netns(node)

    def veth(self, node: str) -> str:
        """The bridge's end of the node's veth pair (at most 15 bytes: dsb49n32)."""
        return f"dsb{self.slot}{node}"


def net_of(layout: Layout) -> Net:
    """The network of ``layout``'s sandbox: its slot's /24, or ``$DISPATCH_SANDBOX_SUBNET``."""
    raw = os.environ.get(SUBNET_ENV, "").strip()
    if not raw:
        return Net(layout.port_slot, ipaddress.IPv4Network(f"10.217.{layout.port_slot}.0/24"))
    try:
        subnet = ipaddress.IPv4Network(raw, strict=True)
    except ValueError as exc:
        raise SandboxError(
            f"${SUBNET_ENV}={raw!r} is not a network: {exc} "
            "(give a private /24 such as 10.99.3.0/24)"
        ) from None
    if subnet.prefixlen != 24 or not subnet.is_private:
        raise SandboxError(
            f"${SUBNET_ENV}={raw!r} must be a private /24 (such as "
            "10.99.3.0/24): the sandbox gives each node an address in it"
        )
    return Net(layout.port_slot, subnet)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            ["ip", *args],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": _PATH, "LANG": "C"},
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise SandboxError(
            "`ip` (iproute2) is not installed: the sandbox's nodes each get "
            "a network namespace with it"
        ) from None
    if check and proc.returncode != 0:
        raise SandboxError(
            f"ip {' '.join(args)} failed (exit {proc.returncode}): "
            + (proc.stderr + proc.stdout).strip()
        )
    return proc


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def link_up(name: str) -> bool:
    """Whether the link is administratively up (IFF_UP in its flags); readable by anyone."""
    try:
        return bool(int(Path("/sys/class/net", name, "flags").read_text(), 16) & 1)
    except (OSError, ValueError):
        return False


def is_cut(layout: Layout, node: str) -> bool:
    """Whether :func:`cut` cut ``node`` off: its veth exists and is down."""
    name = net_of(layout).veth(node)
    return link_exists(name) and not link_up(name)


def _taken_by(net: Net) -> Optional[str]:
    """What on this machine already covers the subnet (not our bridge), or None."""
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        words = line.split()
        if "inet" in words and words[1].rstrip(":") != net.bridge:
            iface = ipaddress.IPv4Interface(words[words.index("inet") + 1])
            if iface.network.overlaps(net.subnet) and iface.network.prefixlen > 0:
                return f"address {iface} on {words[1].rstrip(':')}"
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if not words or words[0] in (
            "default",
            "local",
            "broadcast",
            "unreachable",
            "blackhole",
            "prohibit",
            "throw",
            "multicast",
        ):
            continue
        try:
            route = ipaddress.IPv4Network(words[0], strict=False)
        except ValueError:
            continue
        dev = words[words.index("dev") + 1] if "dev" in words else ""
        if route.prefixlen > 0 and route.overlaps(net.subnet) and dev != net.bridge:
            return f"route {line.strip()}"
    return None


def _netns_inode(path: Path) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def in_netns(pid: int, layout: Layout, node: str) -> bool:
    """Whether process ``pid`` runs in ``node``'s namespace (not the host's, not a stale one)."""
    want = _netns_inode(net_of(layout).netns_path(node))
    return want is not None and _netns_inode(Path(f"/proc/{pid}/ns/net")) == want


def netns_argv(layout: Layout, node: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``node``'s network namespace (the mount namespace stays ours)."""
    return ["nsenter", f"--net={net_of(layout).netns_path(node)}", "--", *argv]


def ensure(layout: Layout, nodes: Sequence[str]) -> list[str]:
    """Make the bridge and each node's namespace and veth, whichever are missing or half made.

    A node that :func:`cut` cut off (its veth down) stays cut.  Returns what it did.
    """
    net = net_of(layout)
    actions: list[str] = []
    if not link_exists(net.bridge):
        taken = _taken_by(net)
        if taken is not None:
            raise SandboxError(
                f"the sandbox's network {net.subnet} is taken on this machine ({taken}): set "
                f"${SUBNET_ENV} to a free private /24 (such as 10.99.3.0/24), or use another "
                "--dir"
            )
        _ip("link", "add", net.bridge, "type", "bridge")
        actions.append(f"created bridge {net.bridge} ({net.subnet})")
    # Bridged traffic between nodes must not meet this machine's firewall (br_netfilter).
    _ip(
        "link",
        "set",
        net.bridge,
        "type",
        "bridge",
        "nf_call_iptables",
        "0",
        "nf_call_ip6tables",
        "0",
        "nf_call_arptables",
        "0",
        check=False,
    )
    host = f"{net.host_address}/24"
    if host not in _ip("-o", "-4", "addr", "show", "dev", net.bridge).stdout.split():
        _ip("addr", "add", host, "dev", net.bridge)
    if not link_up(net.bridge):
        _ip("link", "set", net.bridge, "up")
    for index, node in enumerate(nodes):
        actions += _ensure_node(net, index, node)
    return actions


def _ensure_node(net: Net, index: int, node: str) -> list[str]:
    actions: list[str] = []
    ns, veth = net.netns(node), net.veth(node)
    if _netns_inode(net.netns_path(node)) is None:
        # A stale entry (a file with no namespace bound) goes first.
        _ip("netns", "delete", ns, check=False)
        _ip("netns", "add", ns)
        actions.append(f"created network namespace {ns}")
    inside = _ip("-n", ns, "-o", "link", "show", NODE_LINK, check=False).returncode == 0
    cut = link_exists(veth) and not link_up(veth)
    if link_exists(veth) and not inside:
        # Its other end is in a namespace that is gone from /run/netns: make a new pair.
        _ip("link", "delete", veth, check=False)
        cut = False
    if not link_exists(veth):
        _ip("-n", ns, "link", "delete", NODE_LINK, check=False)
        _ip("link", "add", veth, "type", "veth", "peer", "name", NODE_LINK, "netns", ns)
        actions.append(f"connected {node} ({net.node_address(index)}) to {net.bridge}")
    _ip("-n", ns, "link", "set", "lo", "up")
    address = f"{net.node_address(index)}/24"
    if address not in _ip("-n", ns, "-o", "-4", "addr", "show", "dev", NODE_LINK).stdout.split():
        _ip("-n", ns, "addr", "flush", "dev", NODE_LINK)
        _ip("-n", ns, "addr", "add", address, "dev", NODE_LINK)
    _ip("-n", ns, "link", "set", NODE_LINK, "up")
    _ip("link", "set", veth, "master", net.bridge)
    if not cut and not link_up(veth):
        _ip("link", "set", veth, "up")
    return actions


def cut(layout: Layout, node: str) -> None:
    """Cut ``node`` off the management network (its veth down, on the bridge's side)."""
    veth = net_of(layout).veth(node)
    if not link_exists(veth):
        raise SandboxError(f"{node} has no network link {veth}: run `dispatch-sandbox up`")
    _ip("link", "set", veth, "down")


def restore(layout: Layout, node: str) -> bool:
    """Reconnect ``node``; False when it was not cut."""
    veth = net_of(layout).veth(node)
    if not link_exists(veth):
        raise SandboxError(f"{node} has no network link {veth}: run `dispatch-sandbox up`")
    if link_up(veth):
        return False
    _ip("link", "set", veth, "up")
    return True


def remove(layout: Layout, nodes: Sequence[str] = ()) -> list[str]:
    """Delete every namespace and veth of this slot (``nodes`` and any other ``dsbS-*``) and
    the bridge.  Processes left in a namespace (a dead node's jobs) keep it, unreachable;
    nothing of it stays visible on this machine.  Returns what it did."""
    net = net_of(layout)
    actions: list[str] = []
    names = set(nodes)
    prefix = f"dsb{net.slot}-"
    if NETNS_DIR.is_dir():
        names |= {p.name[len(prefix) :] for p in NETNS_DIR.iterdir() if p.name.startswith(prefix)}
    for node in sorted(names):
        if link_exists(net.veth(node)):
            _ip("link", "delete", net.veth(node), check=False)
        if (NETNS_DIR / net.netns(node)).exists():
            _ip("netns", "delete", net.netns(node), check=False)
            actions.append(f"removed network namespace {net.netns(node)}")
    if link_exists(net.bridge):
        _ip("link", "delete", net.bridge, check=False)
        actions.append(f"removed bridge {net.bridge}")
    return actions
