"""The sandbox's accounting: slurmdbd on a MariaDB server of its own, as every real site keeps it.

A site keeps what slurmctld forgets (an ended job past ``MinJobAge``) in Slurm's accounting,
which ``sacct`` reads from slurmdbd; the supervisor's path for a forgotten job goes there.  So
the sandbox runs ``slurmdbd`` (``AccountingStorageType=accounting_storage/slurmdbd``) on a
database server of its own: Debian's MariaDB (``mariadbd``, as the mysql user), its data, socket,
pid file and log under ``<state>/db``, no network (slurmdbd reaches it through its socket, named
by ``MYSQL_UNIX_PORT``, with root's socket authentication).  Sandboxes side by side never share
a server, so one's ``down`` stops nobody else's database; slurmdbd listens on the folder's own
port (:attr:`.layout.Layout.dbd_port`).  The server is the host's for every release (only its
SQL is spoken); slurmdbd is the release's own (a Debian root holds it, or has no accounting).

Role: whether a sandbox keeps accounting (:func:`wanted`: ``$DISPATCH_SANDBOX_ACCOUNTING``,
``slurmdbd`` by default where the release has slurmdbd, or ``none``), ``slurmdbd.conf``
(:func:`render_slurmdbd_conf`, beside slurm.conf, where slurmdbd looks: it takes no ``-f``),
the server's first data folder (:func:`ensure_database`, ``mariadb-install-db`` once) and its
TLS certificate (self-signed, made once with ``openssl``) for 22.05's slurmdbd only: 24.11's
and 26.05's (MariaDB Connector/C 3.4) stop at their first query over TLS to this server
(:data:`NO_TLS_FROM`), and connect without it on a retry 5 s later.

Invariant: nothing outside the state folder is read or written; the server never listens on
a network port.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from ..errors import SandboxError
from . import network
from .clients import program
from .layout import DB_USER, Layout
from .state_folder import append, own_folder, tail, write_text

ACCOUNTING_ENV = "DISPATCH_SANDBOX_ACCOUNTING"
SLURMDBD = "slurmdbd"
NONE = "none"
DATABASE = "slurm_acct_db"
# A small server: a sandbox's accounting holds a few thousand jobs, and several sandboxes run
# side by side on one machine (about 90 MB resident each with these).  Durability is not
# wanted (a crash of the machine loses the sandbox anyway): no doublewrite, no flush per commit.
SERVER_OPTIONS = (
    "--skip-networking",
    "--skip-name-resolve",
    "--performance-schema=0",
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=8M",
    "--innodb-doublewrite=0",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-lock-wait-timeout=900",
    "--max-connections=50",
)


def wanted(root: Optional[Path]) -> str:
    """``slurmdbd`` or ``none``: ``$DISPATCH_SANDBOX_ACCOUNTING`` when set, else ``slurmdbd``
    where the release has one (the host's is installed with ``up``; a Debian root's must hold
    it), else ``none``."""
    raw = os.environ.get(ACCOUNTING_ENV, "").strip()
    if raw in (SLURMDBD, NONE):
        if raw == SLURMDBD and root is not None and not has_slurmdbd(root):
            raise SandboxError(
                f"${ACCOUNTING_ENV}=slurmdbd, but the Debian root {root} holds "
                "no slurmdbd: its release's row lists no slurmdbd package"
            )
        return raw
    if raw:
        raise SandboxError(
            f"${ACCOUNTING_ENV}={raw!r}: choose {SLURMDBD} (slurmdbd on a "
            f"MariaDB server of the sandbox's own) or {NONE} (no accounting)"
        )
    return SLURMDBD if root is None or has_slurmdbd(root) else NONE


def has_slurmdbd(root: Path) -> bool:
    return os.access(root / "usr" / "sbin" / "slurmdbd", os.X_OK)


def slurm_conf_lines(layout: Layout, accounting: str) -> list[str]:
    """slurm.conf's accounting lines: slurmdbd on the controller's address (nodes reach it
    there too) and the folder's own port, or none.  A connection to slurmdbd takes its munge
    socket from AccountingStoragePass, not AuthInfo (without it, sacct used munged's default
    socket, which is the machine's, not the sandbox's)."""
    if accounting != SLURMDBD:
        return ["AccountingStorageType=accounting_storage/none"]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={network.net_of(layout).host_address}",
        f"AccountingStoragePort={layout.dbd_port}",
        f"AccountingStoragePass={layout.munge_socket}",
    ]


def render_slurmdbd_conf(layout: Layout, hostname: str) -> str:
    """slurmdbd.conf: root's (SlurmUser=root, as slurmctld), the sandbox's munged, its own
    port, and the sandbox's server through its socket (``MYSQL_UNIX_PORT``, set by
    :func:`.daemons.slurmdbd`) as the database's root."""
    return (
        "\n".join(
            [
                "# slurmdbd.conf of the slurm-dispatch sandbox, written by `dispatch-sandbox up`.",
                f"DbdHost={hostname}",
                f"DbdPort={layout.dbd_port}",
                "SlurmUser=root",
                "AuthType=auth/munge",
                f"AuthInfo=socket={layout.munge_socket}",
                f"PidFile={layout.slurmdbd_pid_file}",
                f"LogFile={layout.slurmdbd_log}",
                "DebugLevel=info",
                "StorageType=accounting_storage/mysql",
                "StorageHost=localhost",
                "StorageUser=root",
                f"StorageLoc={DATABASE}",
            ]
        )
        + "\n"
    )


def ensure_database(layout: Layout) -> list[str]:
    """The server's data folder, made once with ``mariadb-install-db`` (about 10 s here) and
    marked made (:attr:`.layout.Layout.db_made`) when complete; an interrupted one is made
    again from nothing."""
    entry = pwd.getpwnam(DB_USER)
    own_folder(layout.db_dir, entry.pw_uid, entry.pw_gid, 0o755)
    if layout.db_made.exists():
        return _forget_cluster_id(layout)
    started = time.monotonic()
    log = layout.log_dir / "install-db.log"
    argv = [
        program("mariadb-install-db"),
        "--no-defaults",
        f"--datadir={layout.db_data}",
        f"--user={DB_USER}",
        "--auth-root-authentication-method=socket",
        "--skip-test-db",
        *SERVER_OPTIONS,
    ]
    shutil.rmtree(layout.db_data, ignore_errors=True)  # an interrupted one: links not followed
    with append(log) as out:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/"
        )
    if proc.returncode != 0:
        raise SandboxError(f"{shlex.join(argv)} failed (exit {proc.returncode}):\n" + tail(log))
    write_text(layout.db_made, f"{DATABASE}\n")
    return [
        f"made the accounting database's server in {layout.db_dir} "
        f"({time.monotonic() - started:.1f} s)",
        *_forget_cluster_id(layout),
    ]


def _forget_cluster_id(layout: Layout) -> list[str]:
    """slurmctld keeps the ClusterID its accounting gave it (``clustername`` in its state
    folder) and stops at "CLUSTER ID MISMATCH" when slurmdbd's database holds another: one
    saved before this database was made (a folder from before the sandbox kept accounting, or
    whose server was made again) is removed, and slurmctld registers anew."""
    saved = layout.state_save / "clustername"
    try:
        if saved.stat().st_mtime >= layout.db_made.stat().st_mtime:
            return []
        saved.unlink()
    except FileNotFoundError:
        return []
    return [f"removed slurmctld's cluster id saved before its accounting database ({saved})"]


# The first release whose slurmdbd fails over TLS to this MariaDB (10.11): 24.11's and 26.05's
# first query, `select @var := concat('')`, comes back as "5027 Number of columns in result
# (=1) exceeds maximum allowed (=0)" and slurmdbd stops (fatal: _check_mysql_concat_is_sane);
# without TLS they connect on a retry 5 s later.  22.05's speaks TLS to it.
NO_TLS_FROM = (24, 11)


def _speaks_tls(major: str) -> bool:
    try:
        return tuple(int(part) for part in major.split(".")[:2]) < NO_TLS_FROM
    except ValueError:
        return True


def ensure_certificate(layout: Layout, major: str) -> list[str]:
    """The server's self-signed certificate and key in ``<state>/etc``, made once (the key
    root's and the mysql group's, 0640); none where ``openssl`` is not installed, and none
    for a release ``major`` whose
    slurmdbd cannot speak TLS to this server (:data:`NO_TLS_FROM`: one made before is
    removed, and the caller restarts the server without it)."""
    if not _speaks_tls(major):
        removed = [path for path in (layout.db_cert, layout.db_key) if path.exists()]
        for path in removed:
            path.unlink()
        return (
            [
                f"removed the accounting server's TLS certificate: Slurm {major}'s slurmdbd "
                "fails over TLS to this MariaDB"
            ]
            if removed
            else []
        )
    if layout.db_key.exists() and layout.db_cert.exists():
        return []
    openssl = program("openssl")
    if not os.path.isabs(openssl):
        return []
    made = layout.etc / ".db-key.new"
    made.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(made),
            "-out",
            str(layout.db_cert),
            "-days",
            "3650",
            "-subj",
            "/CN=dispatch-sandbox-accounting",
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        umask=0o077,
    )
    if proc.returncode != 0:
        made.unlink(missing_ok=True)
        raise SandboxError(
            f"openssl could not make the accounting server's certificate: "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    os.chown(made, 0, pwd.getpwnam(DB_USER).pw_gid)
    os.chmod(made, 0o640)
    os.chmod(layout.db_cert, 0o644)
    os.rename(made, layout.db_key)
    return [f"made the accounting server's certificate {layout.db_cert}"]
