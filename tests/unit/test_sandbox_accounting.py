"""The sandbox's accounting (slurm_dispatch/sandbox/accounting.py): whether a sandbox keeps it,
and what slurm.conf and slurmdbd.conf then say.  The daemons themselves run in the real tier."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slurm_dispatch.errors import SandboxError
from slurm_dispatch.sandbox import accounting, daemons, slurm_conf
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox.layout import Layout


def test_accounting_is_on_by_default_where_the_release_has_slurmdbd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(accounting.ACCOUNTING_ENV, raising=False)
    assert accounting.wanted(None) == accounting.SLURMDBD  # the host's: installed by up
    root = tmp_path / "root"
    (root / "usr" / "sbin").mkdir(parents=True)
    assert accounting.wanted(root) == accounting.NONE  # a root built without slurmdbd
    monkeypatch.setenv(accounting.ACCOUNTING_ENV, "slurmdbd")
    with pytest.raises(SandboxError, match="holds no slurmdbd"):
        accounting.wanted(root)
    dbd = root / "usr" / "sbin" / "slurmdbd"
    dbd.write_text("#!/bin/sh\n")
    dbd.chmod(0o755)
    assert accounting.wanted(root) == accounting.SLURMDBD
    monkeypatch.setenv(accounting.ACCOUNTING_ENV, "none")
    assert accounting.wanted(root) == accounting.wanted(None) == accounting.NONE
    monkeypatch.setenv(accounting.ACCOUNTING_ENV, "mysql")
    with pytest.raises(SandboxError, match=r"DISPATCH_SANDBOX_ACCOUNTING='mysql'"):
        accounting.wanted(None)


def test_slurm_conf_points_at_the_folders_own_slurmdbd_and_munged(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "sb")
    text = slurm_conf.render_slurm_conf(layout, ["n1"], "host", accounting=accounting.SLURMDBD)
    assert "AccountingStorageType=accounting_storage/slurmdbd\n" in text
    assert f"AccountingStoragePort={layout.dbd_port}\n" in text
    # Without it a client's connection to slurmdbd used the machine's munged, not the sandbox's.
    assert f"AccountingStoragePass={layout.munge_socket}\n" in text
    none = slurm_conf.render_slurm_conf(layout, ["n1"], "host")
    assert "AccountingStorageType=accounting_storage/none\n" in none
    assert "AccountingStoragePort" not in none
    dbd = accounting.render_slurmdbd_conf(layout, "host")
    assert f"DbdPort={layout.dbd_port}\n" in dbd and f"PidFile={layout.slurmdbd_pid_file}\n" in dbd
    assert "StorageHost=localhost\n" in dbd  # its socket: MYSQL_UNIX_PORT, never a port


def test_no_slots_slurmdbd_port_is_another_sandboxs_port(tmp_path: Path) -> None:
    dbd, others = set(), set()
    for slot in range(sandbox_layout.PORT_SLOTS):
        layout = Layout(tmp_path / f"sb{slot}")
        layout.root.mkdir()
        layout.port_slot_file.write_text(f"{slot}\n")
        assert layout.port_slot == slot
        dbd.add(layout.dbd_port)
        others.add(layout.controller_port)
        others.update(layout.node_port(i) for i in range(sandbox_layout.MAX_NODE_COUNT))
    assert len(dbd) == sandbox_layout.PORT_SLOTS and not dbd & others


def test_the_server_speaks_tls_once_it_has_its_certificate(tmp_path: Path) -> None:
    """24.11's and 26.05's slurmdbd try TLS first, even on a socket; against a server without
    it they connected only on a retry 5 s later (measured on 24.11, every up)."""
    layout = Layout(tmp_path / "sb")
    assert not any(arg.startswith("--ssl") for arg in daemons.mariadbd(layout).argv)
    layout.etc.mkdir(parents=True)
    layout.db_cert.write_text("cert\n")
    layout.db_key.write_text("key\n")
    argv = daemons.mariadbd(layout).argv
    assert f"--ssl-cert={layout.db_cert}" in argv and f"--ssl-key={layout.db_key}" in argv


def test_24_11s_and_26_05s_server_speaks_no_tls(tmp_path: Path) -> None:
    """24.11's and 26.05's slurmdbd stop at their first query over TLS to this MariaDB (10.11):
    "5027 Number of columns in result (=1) exceeds maximum allowed (=0)", then "fatal:
    _check_mysql_concat_is_sane" (seen on every fresh 26.05 sandbox after 1475552, and on
    24.11's in make test: neither real tier could start).  Without TLS it connects.  A
    certificate made for such a folder before is removed, so the server starts without it."""
    layout = Layout(tmp_path / "sb")
    layout.etc.mkdir(parents=True)
    layout.db_cert.write_text("cert\n")
    layout.db_key.write_text("key\n")
    said = accounting.ensure_certificate(layout, "26.05")
    assert not layout.db_cert.exists() and not layout.db_key.exists(), said
    assert said and "TLS" in said[0]
    assert not any(arg.startswith("--ssl") for arg in daemons.mariadbd(layout).argv)
    assert accounting.ensure_certificate(layout, "26.05") == []
    assert accounting.ensure_certificate(layout, "24.11") == []
    if shutil.which("openssl"):
        accounting.ensure_certificate(layout, "22.05")
        assert layout.db_cert.exists() and layout.db_key.exists()
