"""The site wheel: the wheel setuptools built, without the sandbox (``make dist`` runs this).

``dispatch-sandbox`` apt-installs Slurm and starts daemons as root: a developer's tool, which
must not land on every compute and login node with the wheel a site installs.  ``python3
tools/site_wheel.py WHEEL`` rewrites a wheel of this project without it:
``slurm_dispatch/sandbox/``, ``slurm_dispatch/cli/sandbox.py``, the old
``slurm_dispatch/cli_sandbox.py``, the ``dispatch-sandbox`` console script, man page and
completion; ``RECORD`` is written anew for what stays.  Standard library only.  Every other
install (``make install``'s editable one, the sandbox's own venv) keeps the sandbox, so a
clone's ``make demo`` and ``make test`` are unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile

LEFT_OUT = ("slurm_dispatch/sandbox/", "slurm_dispatch/cli/sandbox.py",
            "slurm_dispatch/cli_sandbox.py")
LEFT_OUT_DATA = ("/share/man/man1/dispatch-sandbox.1",
                 "/share/bash-completion/completions/dispatch-sandbox")


def left_out(name: str) -> bool:
    """Whether a wheel member is the sandbox's (kept out of the site wheel)."""
    return name.startswith(LEFT_OUT) or (".data/data/" in name and name.endswith(LEFT_OUT_DATA))


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def strip_sandbox(path: str) -> None:
    """Rewrite the wheel at ``path`` without the sandbox (see the module docstring)."""
    with zipfile.ZipFile(path) as wheel:
        members = [(info, wheel.read(info)) for info in wheel.infolist()]
    kept = []
    record_name = None
    for info, data in members:
        if left_out(info.filename):
            continue
        if info.filename.endswith(".dist-info/RECORD"):
            record_name = info.filename
            continue
        if info.filename.endswith(".dist-info/entry_points.txt"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines
                           if not line.startswith("dispatch-sandbox ")).encode()
        kept.append((info, data))
    if record_name is None:
        raise RuntimeError(f"{path}: no RECORD in the wheel setuptools built")
    record = "".join(_record_line(info.filename, data) + "\n" for info, data in kept)
    record += f"{record_name},,\n"
    scratch = path + ".site"
    with zipfile.ZipFile(scratch, "w", zipfile.ZIP_DEFLATED) as out:
        for info, data in kept:
            out.writestr(info, data)
        out.writestr(zipfile.ZipInfo(record_name, date_time=kept[0][0].date_time),
                     record.encode())
    os.replace(scratch, path)


def main(argv: list[str]) -> int:
    if not argv:
        sys.exit("usage: python3 tools/site_wheel.py WHEEL...  (each rewritten without the "
                 "sandbox)")
    for path in argv:
        strip_sandbox(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
