"""The sandbox's nodes as Slurm sees them: their states, and waiting until they are usable.

Role: :func:`node_states` reads ``sinfo -N``; a node is usable when idle or running work with
no flag (``*`` not responding, ``~`` powered off and the like); :func:`wait_until_usable`
waits for the nodes ``up`` and ``heal`` promise, resuming one that answers but stays DOWN or
drained.

Invariant: a node is resumed only after it has answered in a down or drained state for 5 s
(``ReturnToService=2`` usually returns it first), never one that does not answer; the reason it
was down is kept in the returned actions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ..errors import SandboxError
from .clients import run_slurm
from .daemons import logs_tail
from .layout import Layout, PathLike, state_dir

# Node states (sinfo %T, flags stripped) in which a node accepts or runs work.
USABLE_STATES = frozenset({"idle", "mixed", "allocated"})
# sinfo appends these to a state: * not responding, ~ powered off, # powering up, ! powering
# down, % powering down, $ maintenance, @ pending reboot, ^ rebooting, - planned.
_STATE_FLAGS = "*~#!%$@^-"


@dataclass
class NodeStatus:
    """One node as ``sinfo`` reports it (``state`` keeps flags such as ``*``)."""

    name: str
    state: str
    reason: str = ""

    @property
    def usable(self) -> bool:
        return is_usable(self.state)


def node_states(directory: Optional[PathLike] = None) -> dict[str, NodeStatus]:
    """Each node's state and reason from ``sinfo -N``; raises if the controller does not answer."""
    layout = Layout(state_dir(directory))
    out = run_slurm(layout, ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], timeout=15)
    states: dict[str, NodeStatus] = {}
    for line in out.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            reason = "" if parts[2].strip() == "none" else parts[2].strip()
            states[parts[0].strip()] = NodeStatus(parts[0].strip(), parts[1].strip(), reason)
    return states


def down_since(layout: Layout, name: str) -> Optional[float]:
    """When the controller set node ``name`` DOWN (its reason's time, ``sinfo %H``, as epoch
    seconds), or None when it is not down or the controller does not say."""
    try:
        out = run_slurm(layout, ["sinfo", "-N", "-h", "-n", name, "-o", "%T|%H"], timeout=15)
    except SandboxError:
        return None
    for line in out.splitlines():
        state, _, stamp = line.partition("|")
        if _base_state(state.strip()).startswith("down"):
            try:
                return time.mktime(time.strptime(stamp.strip(), "%Y-%m-%dT%H:%M:%S"))
            except ValueError:
                return None
    return None


def _base_state(state: str) -> str:
    return state.rstrip(_STATE_FLAGS).lower()


def is_usable(state: str) -> bool:
    return not any(flag in state for flag in _STATE_FLAGS) and _base_state(state) in USABLE_STATES


def wait_until_usable(layout: Layout, nodes: Sequence[str], deadline: float) -> list[str]:
    """Wait until each node is idle (or running jobs); resume nodes that answer but stay down."""
    actions: list[str] = []
    resumed: set[str] = set()
    seen_down_responding: dict[str, float] = {}
    last: dict[str, NodeStatus] = {}
    while True:
        try:
            last = node_states(layout.root)
        except SandboxError:
            last = {}
        if last and all(n in last and last[n].usable for n in nodes):
            return actions
        now = time.monotonic()
        for name in nodes:
            node = last.get(name)
            if node is None or name in resumed or "*" in node.state:
                continue
            base = _base_state(node.state)
            # ReturnToService=2 returns an answering DOWN node by itself within a ping or two;
            # resume only if it has not after a few seconds.  Drained nodes too (a hook that
            # failed in some test): the promise is a usable cluster, and the reason is kept
            # in the returned actions.
            if base in (
                "down",
                "drained",
                "draining",
                "drain",
                "fail",
                "failing",
            ) or base.startswith("drain"):
                first = seen_down_responding.setdefault(name, now)
                if now - first >= 5:
                    run_slurm(layout, ["scontrol", "update", f"nodename={name}", "state=resume"])
                    resumed.add(name)
                    actions.append(
                        f"resumed {name} (was {node.state}"
                        + (f": {node.reason})" if node.reason else ")")
                    )
        if now > deadline:
            states = ", ".join(f"{n}={last[n].state}" if n in last else f"{n}=?" for n in nodes)
            raise SandboxError(f"nodes not usable in time ({states}):\n" + logs_tail(layout, nodes))
        time.sleep(0.2)
