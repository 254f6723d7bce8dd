"""The sbatch option table (slurm/sbatch_options.py) against the sbatch of the release the real
tier runs: each option of that release's rows is one sbatch knows, taking a value exactly as the
table says (required, optional, none), each short letter too, and every option sbatch's --help
and --usage name is in the table.

sbatch reads its options before it asks the controller anything, so no cluster runs: a
slurm.conf naming a controller is enough, and each probe's script is empty (stdin), where sbatch
stops ("Batch script is empty!").  getopt's own words tell the probes apart: "requires an
argument", "doesn't allow an argument", "unrecognized option", "invalid option".  On the host's
Slurm it is the host's sbatch; with ``DISPATCH_SANDBOX_SLURM`` naming another release, that
release's, run in its Debian root (built first where missing, as ``up`` would); all probes run
in one shell, so the root is entered once.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import string
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from slurm_dispatch.sandbox import cluster as sandbox_lib
from slurm_dispatch.sandbox import layout as sandbox_layout
from slurm_dispatch.sandbox import root as sandbox_root
from slurm_dispatch.slurm import sbatch_options

pytestmark = pytest.mark.real

CONF = """\
ClusterName=probe
SlurmctldHost=localhost
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=probe Nodes=localhost Default=YES
"""
MARK = "@@sbatch-probe@@"


class Probe:
    """An sbatch (the host's, or the one in ``root``), run with a slurm.conf of its own in
    ``folder`` (a folder the root shares with the host, such as /tmp's)."""

    def __init__(self, folder: Path, root: Optional[Path]) -> None:
        self.root = root
        host = shutil.which("sbatch")
        if root is None and host is None:
            pytest.fail("no sbatch on PATH: the real tier needs this machine's Slurm")
        self.sbatch = "/usr/bin/sbatch" if root is not None else str(host)
        if root is not None and sandbox_root.mount_point(root, folder) is not None:
            pytest.fail(f"{folder} is not in a folder the root shares (/tmp)")
        (folder / "slurm.conf").write_text(CONF)
        self.folder = folder
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LC_ALL": "C",
            "SLURM_CONF": str(folder / "slurm.conf"),
        }

    def many(self, argvs: list[tuple[str, ...]]) -> list[str]:
        """What sbatch printed for each argv (stdout and stderr together)."""
        script = "\n".join(
            f"echo {MARK}; {shlex.join([self.sbatch, *argv])} </dev/null 2>&1" for argv in argvs
        )
        command = ["/bin/sh", "-c", script]
        if self.root is not None:
            command = sandbox_root.enter_argv(self.root, self.folder, command)
        out = subprocess.run(
            command,
            env=self.env,
            cwd=self.folder,
            text=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=600,
        ).stdout
        parts = out.split(MARK + "\n")[1:]
        assert len(parts) == len(argvs), out[-2000:]
        return parts

    def __call__(self, *words: str) -> str:
        return self.many([words])[0]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Probe:
    chosen = sandbox_root.normalize(os.environ.get(sandbox_layout.RELEASE_ENV))
    root = None if chosen == sandbox_root.HOST else sandbox_lib.build_root(chosen)[0]
    return Probe(tmp_path_factory.mktemp("sbatch-probe"), root)


@pytest.fixture(scope="module")
def release(probe: Probe) -> str:
    out = probe("--version")
    found = re.search(r"(\d+)\.(\d+)\.\d+", out)
    assert found, f"sbatch --version said {out!r}"
    name = f"{int(found[1]):02d}.{int(found[2]):02d}"
    assert name in sbatch_options.RELEASES, (
        f"this machine runs Slurm {name}, a release slurm/sbatch_options.py has no rows for: "
        "add its rows (tools/sbatch_options.py prints them from Slurm's source)"
    )
    return name


def test_every_long_option_takes_the_value_the_table_says(probe: Probe, release: str) -> None:
    table = sbatch_options.options(release)
    names = sorted(table)
    bare = probe.many([(f"--{name}",) for name in names])
    given = probe.many([(f"--{name}=1",) for name in names])
    wrong = []
    for name, alone, with_value in zip(names, bare, given):
        value = table[name].value
        seen = {
            "unknown": "unrecognized option" in alone or "unrecognized option" in with_value,
            "needs": f"option '--{name}' requires an argument" in alone,
            "refuses": f"option '--{name}' doesn't allow an argument" in with_value,
        }
        expected = {
            "unknown": False,
            "needs": value == sbatch_options.REQUIRED,
            "refuses": value == sbatch_options.NONE,
        }
        if seen != expected:
            wrong.append(
                f"--{name} ({value}): sbatch said {alone.strip()!r} alone, "
                f"{with_value.strip()!r} with =1"
            )
    assert wrong == [], f"Slurm {release}: " + "\n".join(wrong)


def test_every_short_letter_is_the_tables(probe: Probe, release: str) -> None:
    shorts = sbatch_options.short_options(release)
    spare = next(c for c in string.ascii_letters if c not in shorts)  # no option's letter
    letters = list(string.ascii_letters)
    alone = probe.many([(f"-{c}",) for c in letters])
    followed = probe.many([(f"-{c}{spare}",) for c in letters])
    wrong = []
    for letter, out, out_spare in zip(letters, alone, followed):
        option = shorts.get(letter)
        known = f"invalid option -- '{letter}'" not in out
        needs = f"option requires an argument -- '{letter}'" in out
        # a letter without a value reads the next letter as an option of its own
        takes_rest = f"invalid option -- '{spare}'" not in out_spare
        # -h and -V print and exit at once: what follows them is never read
        read_on = option is not None and option.canonical not in ("help", "version")
        seen = (known, needs, takes_rest if read_on else None)
        expected = (
            option is not None,
            option is not None and option.value == sbatch_options.REQUIRED,
            None if option is None or not read_on else option.value != sbatch_options.NONE,
        )
        if seen != expected:
            wrong.append(
                f"-{letter} ({option}): sbatch said {out.strip()!r}, then "
                f"{out_spare.strip()!r} for -{letter}{spare}"
            )
    assert wrong == [], f"Slurm {release}: " + "\n".join(wrong)


def test_every_option_sbatchs_help_names_is_in_the_table(probe: Probe, release: str) -> None:
    text = probe("--help") + probe("--usage")
    named = set(re.findall(r"--([a-z][a-z0-9-]*[a-z0-9])", text))
    assert len(named) > 50, text  # the help was read
    # Not in the table: sbatch must refuse it too (24.11's and 26.05's help still name --power,
    # which 24.05 removed).
    others = sorted(named - set(sbatch_options.options(release)))
    said = probe.many([(f"--{name}=1",) for name in others])
    assert [name for name, out in zip(others, said) if "unrecognized option" not in out] == []
