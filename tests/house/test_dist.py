"""`make dist`: what a site installs from (docs/admin-guide.md, install: the package is on no
index).

The wheel installs into a fresh venv and gives the site's commands and the hooks' entry point,
without the sandbox;
the site tarball holds the hook parts, the config templates and the admin guide.  The wheel holds
every subpackage of the layout (docs/architecture.md) and the permanent ``slurm_dispatch/launch.py``
shim that every batch script runs, and ``python -m slurm_dispatch.launch`` from the installed wheel
reaches the launcher."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_dist_gives_an_installable_wheel_and_the_site_parts(tmp_path: Path) -> None:
    # Built from a fresh venv, as a newcomer's would be: it has no `wheel`, which building with
    # --no-build-isolation needed ("invalid command 'bdist_wheel'").
    build = tmp_path / "build-venv"
    subprocess.run([sys.executable, "-m", "venv", str(build)], check=True, timeout=120)
    made = subprocess.run(
        ["make", "-s", "dist", f"PYTHON={build}/bin/python", f"VENV={build}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    wheels = sorted((REPO / "dist").glob("slurm_dispatch-*.whl"))
    (site,) = sorted((REPO / "dist").glob("slurm-dispatch-site-*.tar.gz"))
    assert len(wheels) == 1
    # Every module of the checkout's package is in the wheel (a subpackage left out
    # of packages.find would install a tool that fails at its first lazy import), the shim too.
    with zipfile.ZipFile(wheels[0]) as wheel:
        shipped = {n for n in wheel.namelist() if n.startswith("slurm_dispatch/")}
    # But not the sandbox, which apt-installs Slurm and starts daemons as
    # root: the developer's tool stays in the clone.
    sandbox = {"slurm_dispatch/cli/sandbox.py", "slurm_dispatch/cli_sandbox.py"} | {
        p.relative_to(REPO).as_posix() for p in (REPO / "slurm_dispatch/sandbox").rglob("*.py")
    }
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "slurm_dispatch").rglob("*.py")}
    assert "slurm_dispatch/launch.py" in modules and "slurm_dispatch/sandbox/cluster.py" in sandbox
    assert modules - sandbox - shipped == set(), sorted(modules - sandbox - shipped)
    assert shipped & sandbox == set(), sorted(shipped & sandbox)
    assert not any(n.startswith("slurm_dispatch/sandbox/") for n in shipped)
    assert {
        f"{p.relative_to(REPO).as_posix()}/__init__.py"
        for p in (REPO / "slurm_dispatch").rglob("*")
        if p.is_dir() and p.name != "__pycache__" and "sandbox" not in p.parts
    } <= shipped
    with zipfile.ZipFile(wheels[0]) as wheel:
        every = wheel.namelist()
        (entry_points,) = [n for n in every if n.endswith(".dist-info/entry_points.txt")]
        scripts = wheel.read(entry_points).decode()
        (record_name,) = [n for n in every if n.endswith(".dist-info/RECORD")]
        record_lines = wheel.read(record_name).decode().splitlines()
    assert "dispatch-sandbox" not in scripts and "dispatch-admin =" in scripts, scripts
    assert not [n for n in every if "dispatch-sandbox" in n]
    # RECORD lists exactly what the wheel holds (pip checks each hash on install)
    assert sorted(line.split(",")[0] for line in record_lines) == sorted(every)
    with tarfile.open(site) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {
        "contrib/prolog.d/05-dispatch",
        "contrib/epilog.d/05-dispatch",
        "site-config/dispatch.conf",
        "site-config/slurm.conf.dispatch",
        "site-config/dispatch-recheck",
        "docs/admin-guide.md",
    } <= names
    commands = ("dispatch", "dispatch-sbatch", "dispatch-cease", "dispatch-admin")
    assert not [n for n in names if "dispatch-sandbox" in n]
    # The man pages and completions, for a site's system-wide install
    assert {f"docs/man/man1/{c}.1" for c in commands} <= names
    assert {f"contrib/completion/{c}" for c in commands} <= names
    # Installed as the user guide says, its dependencies (click, tenacity) with it: a venv of
    # the system's site packages had them only where this interpreter is not itself a venv.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [
            str(venv / "bin/pip"),
            "install",
            "-q",
            "-c",
            str(REPO / "tests/constraints.txt"),
            str(wheels[0]),
        ],
        check=True,
        timeout=300,
    )
    for command in commands:
        out = subprocess.run(
            [str(venv / "bin" / command), "--help"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0 and "Usage" in out.stdout + out.stderr, (command, out)
    assert not (venv / "bin/dispatch-sandbox").exists()
    assert not list(venv.glob("lib/python*/site-packages/slurm_dispatch/sandbox"))
    hooks = subprocess.run(
        [
            str(venv / "bin/python"),
            "-I",
            "-c",
            "import slurm_dispatch.hooks, slurm_dispatch; print(slurm_dispatch.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert str(venv) in hooks.stdout
    # The permanent launcher name, run as every batch script runs it, from the installed wheel
    # (-I and a folder outside the checkout: the checkout is not on sys.path): its usage error.
    launched = subprocess.run(
        [str(venv / "bin/python"), "-I", "-m", "slurm_dispatch.launch"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launched.returncode == 2, launched
    assert launched.stderr.startswith("dispatch-launch: usage: python -m slurm_dispatch.launch"), (
        launched
    )
    found = subprocess.run(
        [
            str(venv / "bin/python"),
            "-I",
            "-c",
            "import slurm_dispatch.launch as shim; print(shim.__file__)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert found.stdout.strip() == str(
        next(venv.glob("lib/python*/site-packages/slurm_dispatch/execution/launch.py"))
    ), found
    # and in the venv's share/, where man and bash-completion look beside a bin/ on PATH
    for command in commands:
        assert (venv / f"share/bash-completion/completions/{command}").is_file()
        found = subprocess.run(
            ["man", "-w", command],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **{k: v for k, v in os.environ.items() if k != "MANPATH"},
                "PATH": f"{venv}/bin:/usr/bin:/bin",
            },
        )
        assert found.stdout.strip() == str(venv / f"share/man/man1/{command}.1"), found
    # The systemd units, where the guides copy them from
    for unit in (
        "dispatch-supervise.service",
        "dispatch-supervise.timer",
        "dispatch-release.service",
        "dispatch-release.timer",
    ):
        assert (venv / "share/slurm-dispatch/systemd" / unit).read_text() == (
            REPO / "contrib/systemd" / unit
        ).read_text()


def test_the_shipped_parts_default_to_the_python_the_admin_guide_installs() -> None:
    # The parts defaulted to /usr/bin/python3, which the guide never installs
    # into, so an admin who followed it had hooks that recorded nothing.
    guide = (REPO / "docs/admin-guide.md").read_text()
    venvs = set(re.findall(r"python3 -m venv (/\S+?)/?[\s`]", guide))
    assert len(venvs) == 1, venvs
    (venv,) = venvs
    for part in (
        "contrib/prolog.d/05-dispatch",
        "contrib/epilog.d/05-dispatch",
        "site-config/dispatch-recheck",
    ):
        defaults = re.findall(r"^DISPATCH_PYTHON=(\S+)", (REPO / part).read_text(), re.M)
        assert defaults == [f"{venv}/bin/python"], (part, defaults)


def _wheel_data(key: str) -> list[str]:
    """The files pyproject.toml's data-files put under ``key`` in the wheel, as the site wheel
    keeps them (tools/site_wheel.py leaves the sandbox's out)."""
    import glob

    import tomllib

    sys.path.insert(0, str(REPO / "tools"))
    try:
        import site_wheel
    finally:
        sys.path.pop(0)
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"
    ].get(key, [])
    names = sorted({Path(f).name for p in patterns for f in glob.glob(str(REPO / p))})
    return [n for n in names if not site_wheel.left_out(f"x.data/data/{key}/{n}")]


def test_the_user_guide_lists_the_man_pages_the_wheel_installs() -> None:
    """The guide listed a dispatch-sandbox page the wheel does not install
    (it installs dispatch-admin's)."""
    installing = (REPO / "docs/user-guide.md").read_text().split("## Installing", 1)[1]
    installing = installing.split("\n## ", 1)[0]
    listed = set(re.findall(r"`man (dispatch[\w-]*)`", installing))
    shipped = {n.removesuffix(".1") for n in _wheel_data("share/man/man1")}
    assert (
        listed == shipped == {"dispatch", "dispatch-sbatch", "dispatch-cease", "dispatch-admin"}
    ), (listed, shipped)
    completions = set(_wheel_data("share/bash-completion/completions"))
    assert completions == shipped
    # click's own completion variables, for the click commands the wheel has
    named = set(re.findall(r"`_(DISPATCH[A-Z_]*)_COMPLETE", installing))
    assert {n.lower().replace("_", "-") for n in named} <= shipped, named


def test_the_wheel_ships_the_systemd_units_the_guides_copy() -> None:
    """The units were in no wheel (the completions and man pages were), and
    the guide copied them from a clone."""
    units = _wheel_data("share/slurm-dispatch/systemd")
    assert units == sorted(
        p.name for p in (REPO / "contrib/systemd").iterdir() if p.suffix in (".service", ".timer")
    ), units
    assert {"dispatch-supervise.service", "dispatch-supervise.timer"} <= set(units)
    user = (REPO / "docs/user-guide.md").read_text()
    assert (
        "cp ~/.venvs/dispatch/share/slurm-dispatch/systemd/dispatch-supervise.* "
        "~/.config/systemd/user/"
    ) in user
    admin = (REPO / "docs/admin-guide.md").read_text()
    assert "/opt/slurm-dispatch/share/slurm-dispatch/systemd/dispatch-release.*" in admin
