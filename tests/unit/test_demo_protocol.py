"""`make demo-protocol` on a loaded machine (as a newcomer ran it on a fresh clone with
Debian's python3): the replacement execution ran to a fixed step 20, and when it started after the
old execution had already passed step 20, it resumed there, had nothing left to do, published
nothing, and the demo ended "demo: wrong lineage", exit 1.

The replacement's late start is made certain by a `dispatch` on PATH in front of the real one
(a fake at the process boundary): the replacement's first `dispatch epoch` waits until the old
execution has published step 20."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_protocol_demo_holds_when_the_replacement_starts_late(tmp_path: Path) -> None:
    real = shutil.which("dispatch")
    assert real
    shim = tmp_path / "bin/dispatch"
    shim.parent.mkdir()
    shim.write_text(f"""#!/bin/sh
if [ "$1" = epoch ] && [ "${{SLURM_RESTART_COUNT:-}}" = 1 ] && mkdir {tmp_path}/late 2>/dev/null
then
    until [ "$({real} list -H | wc -l)" -ge 4 ]; do sleep 0.05; done
fi
exec {real} "$@"
""")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}:{Path(real).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(REPO / "demo/protocol.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "== ok: the overlap was harmless" in done.stdout
    assert (tmp_path / "late").is_dir()  # the replacement did start late


def test_the_protocol_demo_ends_when_dispatch_cannot_run(tmp_path: Path) -> None:
    # A clone moved after `make install` left .venv/bin/dispatch naming the old venv's Python:
    # the demo's wait for the first two publications spun for ever on "cannot execute".
    broken = tmp_path / "bin/dispatch"
    broken.parent.mkdir()
    broken.write_text("#!/nonexistent/python\n")
    broken.chmod(0o755)
    env = {**os.environ, "PATH": f"{broken.parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(REPO / "demo/protocol.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "demo: the first execution ended before it published twice" in done.stderr, done.stderr[
        -2000:
    ]
