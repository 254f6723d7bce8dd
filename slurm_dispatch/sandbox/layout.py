"""Where a sandbox's things live: every path and port of one state folder, and the folder itself.

Role: :class:`Layout` derives each path (configuration, munge key and socket, pid files, logs,
spool, state, venv, manifest, lock) and the port slot from the state folder's path; the
folder's choice (``--dir``, ``$DISPATCH_SANDBOX_DIR``, the release's default) and its checks
(a path slurm.conf can hold, a socket path that fits) are here, and so is the manifest
(``sandbox.json``: the nodes, the job user, the release and its root) that the other verbs read.

Invariant: paths follow from the folder's path alone, and ports from its port slot (no I/O
here but reading the manifest and ``port-slot``): the slot the folder owns
(:mod:`.slots` records it when ``up`` claims one), else the one its path prefers (0 for the
default folder, any other one of 1..49 from a CRC of its path), so sandboxes in two folders
run side by side even where their paths hash alike.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import SandboxError
from . import root as sandbox_root

DEFAULT_DIR = Path("/var/tmp/slurm-dispatch-sandbox")
DIR_ENV = "DISPATCH_SANDBOX_DIR"
USER_ENV = "DISPATCH_SANDBOX_USER"
# Which Slurm the sandbox runs: "host" (this machine's, the default) or a release of
# sandbox_root.RELEASES, run from a Debian root; a release's default folder is DEFAULT_DIR-<it>.
RELEASE_ENV = "DISPATCH_SANDBOX_SLURM"
HOST_RELEASE = sandbox_root.HOST
DEFAULT_USER = "dispatchuser"
DEFAULT_NODE_COUNT = 3
MAX_NODE_COUNT = 32
# Well away from Slurm's defaults (6817/6818) so a system Slurm can run beside the sandbox.
# A sandbox in another folder shifts them (Layout.port_slot) so that two can run at once.
CONTROLLER_PORT = 16817
FIRST_NODE_PORT = 17001
# slurmdbd's port (DBD_PORT - slot), between the controller's and the nodes' ranges.
DBD_PORT = 16917
PORT_SLOTS = 50
MUNGE_USER = "munge"
# The account MariaDB's server runs as (Debian's mariadb-server makes it).
DB_USER = "mysql"
PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Layout:
    """Every path of one sandbox, derived from its state folder."""

    root: Path

    @property
    def preferred_slot(self) -> int:
        """0 for the default folder, else 1..49 derived from the folder's path: where ``up``
        looks first for a slot of its own (another folder may hash to it too)."""
        if self.root == DEFAULT_DIR:
            return 0
        return 1 + zlib.crc32(str(self.root).encode()) % (PORT_SLOTS - 1)

    @property
    def port_slot_file(self) -> Path:
        return self.root / "port-slot"

    def recorded_slot(self) -> Optional[int]:
        """The slot this folder owns (``port-slot``, written by :func:`.slots.take`), or None
        when it records none (a folder from before claims, or one never brought up)."""
        try:
            slot = int(self.port_slot_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return slot if 0 <= slot < PORT_SLOTS else None

    @property
    def port_slot(self) -> int:
        """The slot this folder owns, else the one its path prefers."""
        recorded = self.recorded_slot()
        return self.preferred_slot if recorded is None else recorded

    @property
    def controller_port(self) -> int:
        return CONTROLLER_PORT - self.port_slot

    @property
    def dbd_port(self) -> int:
        return DBD_PORT - self.port_slot

    def node_port(self, index: int) -> int:
        """Port of the node at ``index`` (0 for n1); room for MAX_NODE_COUNT per slot."""
        return FIRST_NODE_PORT + (MAX_NODE_COUNT + 8) * self.port_slot + index

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def site_conf(self) -> Path:
        return self.etc / "site.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_pid_file(self) -> Path:
        return self.munge_dir / "munged.pid"

    @property
    def munge_log(self) -> Path:
        return self.munge_dir / "munged.log"

    @property
    def munge_seed(self) -> Path:
        return self.munge_dir / "munged.seed"

    @property
    def slurmdbd_conf(self) -> Path:
        """Where slurmdbd reads its configuration: beside ``SLURM_CONF`` (it takes no -f)."""
        return self.etc / "slurmdbd.conf"

    @property
    def slurmdbd_pid_file(self) -> Path:
        return self.run_dir / "slurmdbd.pid"

    @property
    def slurmdbd_log(self) -> Path:
        return self.log_dir / "slurmdbd.log"

    @property
    def db_dir(self) -> Path:
        """The sandbox's own MariaDB server (the mysql user's): data, socket, pid file, log."""
        return self.root / "db"

    @property
    def db_data(self) -> Path:
        return self.db_dir / "data"

    @property
    def db_cert(self) -> Path:
        """The server's TLS certificate (self-signed, root's) and key (readable by mysql)."""
        return self.etc / "db-cert.pem"

    @property
    def db_key(self) -> Path:
        return self.etc / "db-key.pem"

    @property
    def db_made(self) -> Path:
        """Written once the server's data folder is complete (root's, beside ``db/``)."""
        return self.root / ".db-made"

    @property
    def db_socket(self) -> Path:
        return self.db_dir / "mysqld.sock"

    @property
    def db_pid_file(self) -> Path:
        return self.db_dir / "mariadbd.pid"

    @property
    def db_log(self) -> Path:
        return self.db_dir / "mariadbd.log"

    @property
    def state_save(self) -> Path:
        return self.root / "state"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def venv_bin(self) -> Path:
        return self.venv / "bin"

    @property
    def source_hash_file(self) -> Path:
        return self.venv / ".slurm-dispatch-source-sha256"

    @property
    def manifest(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def slurmctld_pid_file(self) -> Path:
        return self.run_dir / "slurmctld.pid"

    @property
    def slurmctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    def slurmd_pid_file(self, node: str) -> Path:
        return self.run_dir / f"slurmd-{node}.pid"

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"


def default_dir(release: Optional[str] = None) -> Path:
    """The default state folder of ``release`` (default ``$DISPATCH_SANDBOX_SLURM``, else the
    host's): DEFAULT_DIR for the host's Slurm, ``DEFAULT_DIR-<release>`` for another."""
    chosen = sandbox_root.normalize(release if release is not None else os.environ.get(RELEASE_ENV))
    return DEFAULT_DIR if chosen == HOST_RELEASE else Path(f"{DEFAULT_DIR}-{chosen}")


def state_dir(override: Optional[PathLike] = None) -> Path:
    """The sandbox state folder: ``override``, else ``$DISPATCH_SANDBOX_DIR``, else the default
    folder of ``$DISPATCH_SANDBOX_SLURM``'s release (:func:`default_dir`)."""
    # An empty value (DISPATCH_SANDBOX_DIR= from a Makefile) means the default, not ".".
    chosen = override if override not in (None, "") else os.environ.get(DIR_ENV) or default_dir()
    path = Path(os.path.abspath(os.fspath(chosen)))
    bad = [c for c in " \t\n,=\"'#" if c in str(path)]
    if bad:
        raise SandboxError(
            f"sandbox folder {str(path)!r} contains {''.join(bad)!r}; slurm.conf cannot quote "
            "that: choose a folder whose path has no spaces, commas, '=', quotes or '#'"
        )
    # A unix socket path must fit in 108 bytes.
    if len(str(Layout(path).munge_socket)) > 100:
        raise SandboxError(
            f"sandbox folder {str(path)!r} is too long for a unix socket path "
            "(keep it under about 80 characters)"
        )
    return path


def job_user(wanted: Optional[str], manifest: dict[str, Any]) -> str:
    """The job user of ``up``: ``wanted`` (``up --user``), else ``$DISPATCH_SANDBOX_USER``, else
    the one the folder's manifest names, else :data:`DEFAULT_USER`."""
    return wanted or os.environ.get(USER_ENV) or str(manifest.get("user") or DEFAULT_USER)


def node_names(count: int) -> list[str]:
    """``n1`` … ``nCOUNT``."""
    if not 1 <= count <= MAX_NODE_COUNT:
        raise SandboxError(f"node count {count} is out of range: choose 1 to {MAX_NODE_COUNT}")
    return [f"n{i}" for i in range(1, count + 1)]


def read_manifest(layout: Layout) -> dict[str, Any]:
    try:
        data = json.loads(layout.manifest.read_text())
    except (OSError, ValueError) as exc:
        raise SandboxError(f"cannot read {layout.manifest}: {exc}") from exc
    if not isinstance(data, dict):
        raise SandboxError(f"{layout.manifest} is not a JSON object")
    return data


def known_node(layout: Layout, node: str) -> str:
    if not layout.manifest.exists():
        raise SandboxError(f"no sandbox in {layout.root}: run `dispatch-sandbox up` first")
    nodes = list(read_manifest(layout).get("nodes", []))
    if node not in nodes:
        raise SandboxError(f"unknown node {node!r}: valid nodes are {', '.join(nodes)}")
    return node
