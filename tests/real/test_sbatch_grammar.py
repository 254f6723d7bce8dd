"""The sbatch option table (slurm/sbatch_options.py) against the sbatch this machine runs: each
option of its release's row set is one sbatch knows, taking a value exactly as the table says
(required, optional, none), each short letter too, and every option sbatch's --help and --usage
name is in the table.

sbatch reads its options before it asks the controller anything, so no sandbox runs: a
slurm.conf naming a controller is enough, and each probe's script is empty (stdin), where sbatch
stops ("Batch script is empty!").  getopt's own words tell the probes apart: "requires an
argument", "doesn't allow an argument", "unrecognized option", "invalid option".
"""

from __future__ import annotations

import os
import re
import shutil
import string
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_dispatch.slurm import sbatch_options

pytestmark = pytest.mark.real

CONF = """\
ClusterName=probe
SlurmctldHost=localhost
NodeName=localhost CPUs=1 State=UNKNOWN
PartitionName=probe Nodes=localhost Default=YES
"""


class Probe:
    """The host's sbatch, run with a slurm.conf of its own in ``folder``."""

    def __init__(self, folder: Path) -> None:
        sbatch = shutil.which("sbatch")
        if sbatch is None:
            pytest.fail("no sbatch on PATH: the real tier needs this machine's Slurm")
        self.sbatch = sbatch
        (folder / "slurm.conf").write_text(CONF)
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        self.env.update(SLURM_CONF=str(folder / "slurm.conf"), LC_ALL="C")

    def __call__(self, *words: str) -> str:
        proc = subprocess.run([self.sbatch, *words], env=self.env, cwd=self.folder, text=True,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        return proc.stdout + proc.stderr

    def many(self, argvs: list[tuple[str, ...]]) -> list[str]:
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda argv: self(*argv), argvs))


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Probe:
    return Probe(tmp_path_factory.mktemp("sbatch-probe"))


@pytest.fixture(scope="module")
def release(probe: Probe) -> str:
    out = probe("--version")
    found = re.search(r"(\d+)\.(\d+)\.\d+", out)
    assert found, f"sbatch --version said {out!r}"
    name = f"{int(found[1]):02d}.{int(found[2]):02d}"
    assert name in sbatch_options.RELEASES, (
        f"this machine runs Slurm {name}, a release slurm/sbatch_options.py has no rows for: "
        "add its rows (tools/sbatch_options.py prints them from Slurm's source)")
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
        expected = {"unknown": False, "needs": value == sbatch_options.REQUIRED,
                    "refuses": value == sbatch_options.NONE}
        if seen != expected:
            wrong.append(f"--{name} ({value}): sbatch said {alone.strip()!r} alone, "
                         f"{with_value.strip()!r} with =1")
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
        expected = (option is not None,
                    option is not None and option.value == sbatch_options.REQUIRED,
                    None if option is None or not read_on
                    else option.value != sbatch_options.NONE)
        if seen != expected:
            wrong.append(f"-{letter} ({option}): sbatch said {out.strip()!r}, then "
                         f"{out_spare.strip()!r} for -{letter}{spare}")
    assert wrong == [], f"Slurm {release}: " + "\n".join(wrong)


def test_every_option_sbatchs_help_names_is_in_the_table(probe: Probe, release: str) -> None:
    text = probe("--help") + probe("--usage")
    named = set(re.findall(r"--([a-z][a-z0-9-]*[a-z0-9])", text))
    assert len(named) > 50, text  # the help was read
    assert named - set(sbatch_options.options(release)) == set()
