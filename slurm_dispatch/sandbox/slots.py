"""Which port slot each sandbox folder of this machine owns.

A slot (0..49) gives a sandbox its ports, its bridge (``dsbS``), its namespaces and its
subnet (:mod:`.layout`, :mod:`.network`).  The slot a folder's path hashes to
(:attr:`Layout.preferred_slot`) is only where ``up`` starts looking: two folders can hash to
one slot, and a sandbox in the second then adopted the first's bridge and namespaces, died on
"Address already in use", and either one's ``down`` removed the other's network.

Invariant: a slot belongs to one folder.  :func:`take` records the owner in a claim file per
slot under :data:`CLAIMS` (root's, machine-wide), made with an exclusive create under a lock,
and the slot in the folder's own ``port-slot`` (which :attr:`Layout.port_slot` reads).  A
claim whose folder no longer records that slot (the folder was removed) is stale and taken
over; a live one sends the folder to the next free slot, and when every slot is held the
error names the holders.  The default folder keeps slot 0, which no other folder takes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..errors import SandboxError
from . import state_folder
from .layout import DEFAULT_DIR, PORT_SLOTS, Layout

CLAIMS_ENV = "DISPATCH_SANDBOX_SLOTS"
# Not under /var/lib/slurm-dispatch: that is the hooks' default StateDir, which a test of a
# hook without its configuration writes into (and reads back) on this same machine.
CLAIMS = Path("/var/lib/slurm-dispatch-sandbox/port-slots")


def claims_folder() -> Path:
    """Where the claims are kept: ``$DISPATCH_SANDBOX_SLOTS``, else :data:`CLAIMS`."""
    return Path(os.path.abspath(os.environ.get(CLAIMS_ENV) or CLAIMS))


def holder(slot: int, claims: Optional[Path] = None) -> Optional[Path]:
    """The folder that owns ``slot`` now, or None: a claim counts while its folder still
    records that slot (a removed folder's claim is stale)."""
    text = state_folder.read_own((claims or claims_folder()) / str(slot))
    if not text or not text.strip():
        return None
    folder = Path(text.strip())
    return folder if Layout(folder).recorded_slot() == slot else None


def take(layout: Layout, claims: Optional[Path] = None) -> list[str]:
    """Make ``layout``'s folder the owner of a slot: the one it records, else the one its path
    prefers, else the next free one.  Returns what was done ([] when it already owned one)."""
    claims = claims or claims_folder()
    state_folder.claim(claims, create=True)
    with state_folder.locked(claims / ".lock"):
        recorded = layout.recorded_slot()
        if recorded is not None and holder(recorded, claims) in (None, layout.root):
            if holder(recorded, claims) is None:
                state_folder.write_text(claims / str(recorded), f"{layout.root}\n")
            return []
        if layout.root == DEFAULT_DIR:
            candidates = [0]
        else:
            first = layout.preferred_slot
            candidates = [1 + (first - 1 + i) % (PORT_SLOTS - 1) for i in range(PORT_SLOTS - 1)]
        held: dict[int, Path] = {}
        for slot in candidates:
            owner = holder(slot, claims)
            if owner is None or owner == layout.root:
                state_folder.write_text(claims / str(slot), f"{layout.root}\n")
                state_folder.write_text(layout.port_slot_file, f"{slot}\n")
                moved = (
                    ""
                    if slot == layout.preferred_slot
                    else f" ({layout.preferred_slot} is {held[layout.preferred_slot]}'s)"
                )
                return [f"took port slot {slot}{moved}"]
            held[slot] = owner
    names = ", ".join(f"{slot}: {folder}" for slot, folder in sorted(held.items()))
    raise SandboxError(
        f"no free port slot for the sandbox in {layout.root}: every one is "
        f"held ({names}); remove a sandbox folder you no longer use "
        "(`dispatch-sandbox remove --dir DIR`)"
    )


def release(layout: Layout, claims: Optional[Path] = None) -> list[str]:
    """Give up the slot ``layout``'s folder owns (``dispatch-sandbox remove``): its claim is
    removed when it names this folder, never another's.  Returns what was done."""
    slot = layout.recorded_slot()
    claims = claims or claims_folder()
    if slot is None or not state_folder.claim(claims, create=False):
        return []
    with state_folder.locked(claims / ".lock"):
        if holder(slot, claims) != layout.root:
            return []
        (claims / str(slot)).unlink()
    return [f"released port slot {slot}"]
