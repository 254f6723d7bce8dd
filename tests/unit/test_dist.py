"""`make dist`: what a site installs from (issue 9, for admins: the package is on no index).

The wheel installs into a fresh venv and gives the four commands and the hooks' entry point;
the site tarball holds the hook parts, the config templates and the admin guide."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_dist_gives_an_installable_wheel_and_the_site_parts(tmp_path: Path) -> None:
    subprocess.run(["make", "-s", "dist", f"PYTHON={sys.executable}"], cwd=REPO, check=True,
                   capture_output=True, text=True, timeout=300)
    wheels = sorted((REPO / "dist").glob("slurm_dispatch-*.whl"))
    (site,) = sorted((REPO / "dist").glob("slurm-dispatch-site-*.tar.gz"))
    assert len(wheels) == 1
    with tarfile.open(site) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"contrib/prolog.d/05-dispatch", "contrib/epilog.d/05-dispatch",
            "site-config/dispatch.conf", "site-config/slurm.conf.dispatch",
            "site-config/dispatch-recheck", "docs/admin-guide.md"} <= names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-deps", str(wheels[0])],
                   check=True, timeout=300)
    for command in ("dispatch", "dispatch-sbatch", "dispatch-cease", "dispatch-sandbox"):
        out = subprocess.run([str(venv / "bin" / command), "--help"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "Usage" in out.stdout + out.stderr, (command, out)
    hooks = subprocess.run([str(venv / "bin/python"), "-I", "-c",
                            "import slurm_dispatch.hooks, slurm_dispatch; "
                            "print(slurm_dispatch.__file__)"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert str(venv) in hooks.stdout
