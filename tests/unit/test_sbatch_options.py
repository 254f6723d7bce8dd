"""sbatch's options release by release (slurm/sbatch_options.py), and dispatch-sbatch reading
every one of them as sbatch does: the value taken, the script found after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_dispatch.control import sbatch_args
from slurm_dispatch.errors import UsageError
from slurm_dispatch.slurm import sbatch_options

RELEASES = sbatch_options.RELEASES
Split = tuple[list[str], str, list[str], set[str]]  # sbatch words, script, its args, names


def split(argv: list[str]) -> Split:
    line = sbatch_args.parse_command_line(argv)
    assert line.script is not None
    return line.sbatch, line.script, line.script_args, line.long_names


def mismatches(cases: list[tuple[list[str], Split]]) -> list[str]:
    """Each command line whose split is not the one expected, with both."""
    wrong = []
    for argv, expected in cases:
        try:
            got: object = split(argv)
        except UsageError as exc:
            got = exc
        if got != expected:
            wrong.append(f"{argv}: {got}, not {expected}")
    return wrong


@pytest.mark.parametrize("release", RELEASES)
def test_every_long_option_of_every_release_leaves_the_script_found(release: str) -> None:
    cases: list[tuple[list[str], Split]] = []
    for option in sbatch_options.options(release).values():
        name, names = f"--{option.name}", {option.canonical}
        cases.append(([f"{name}=v1", "job.sh", "a"], ([f"{name}=v1"], "job.sh", ["a"], names)))
        if option.value == sbatch_options.REQUIRED:
            # the next word is the value, whatever it looks like (getopt's required argument)
            cases += [
                ([name, value, "job.sh", "a"], ([name, value], "job.sh", ["a"], names))
                for value in ("v1", "-v1", "job.sh")
            ]
        else:
            # an optional value is only ever --name=value: the next word is the script
            cases.append(([name, "job.sh", "a"], ([name], "job.sh", ["a"], names)))
    assert mismatches(cases) == []


@pytest.mark.parametrize("release", RELEASES)
def test_every_short_option_of_every_release_leaves_the_script_found(release: str) -> None:
    cases: list[tuple[list[str], Split]] = []
    for letter, option in sbatch_options.short_options(release).items():
        short, names = f"-{letter}", {option.canonical}
        if option.value == sbatch_options.REQUIRED:
            cases += [
                ([short, "v1", "job.sh"], ([short, "v1"], "job.sh", [], names)),
                ([short, "-v", "job.sh"], ([short, "-v"], "job.sh", [], names)),
                ([f"{short}v1", "job.sh"], ([f"{short}v1"], "job.sh", [], names)),
                # after a letter without a value, in one word (-HN 2)
                (
                    [f"-H{letter}", "v1", "job.sh"],
                    ([f"-H{letter}", "v1"], "job.sh", [], names | {"hold"}),
                ),
            ]
        elif option.value == sbatch_options.OPTIONAL:
            # the rest of the word is its value (never more options), the next word the script
            cases += [
                ([f"{short}Hx", "job.sh"], ([f"{short}Hx"], "job.sh", [], names)),
                ([short, "job.sh"], ([short], "job.sh", [], names)),
            ]
        else:
            cases += [
                ([short, "job.sh", "x"], ([short], "job.sh", ["x"], names)),
                (
                    [f"{short}N", "2", "job.sh"],
                    ([f"{short}N", "2"], "job.sh", [], names | {"nodes"}),
                ),
            ]
    assert mismatches(cases) == []


@pytest.mark.parametrize("release", RELEASES)
def test_every_option_of_every_release_reads_the_same_in_sbatch_lines(release: str) -> None:
    wrong = []
    for option in sbatch_options.options(release).values():
        value = " v1" if option.value == sbatch_options.REQUIRED else ""
        text = f"#!/bin/bash\n#SBATCH --{option.name}{value} --{option.name}=v2 -N 1\necho\n"
        names = sbatch_args.read_header(text, "job.sh").long_names
        if names != {option.canonical, "nodes"}:
            wrong.append(f"{option.name}: {names}")
    assert wrong == []


@pytest.mark.parametrize(
    "argv,sbatch,names",
    [
        # Seen on 22.05: each value was taken for the script, or refused.
        (["--wait-all-nodes", "1"], ["--wait-all-nodes", "1"], {"wait-all-nodes"}),
        (["--segment", "4"], ["--segment", "4"], {"segment"}),
        (["--mem-update", "10@600"], ["--mem-update", "10@600"], {"mem-update"}),
        (["--tres-bind", "gres/gpu:verbose"], ["--tres-bind", "gres/gpu:verbose"], {"tres-bind"}),
        (["--cluster=x"], ["--cluster=x"], {"clusters"}),  # an alias, not an ambiguous prefix
        (["--container-id", "5"], ["--container-id", "5"], {"container-id"}),
        # -k takes its value only in its own word: "es" of -kyes was read as -e's value
        (["-kyes"], ["-kyes"], {"no-kill"}),
        (["--tasks-per-node", "2"], ["--tasks-per-node", "2"], {"ntasks-per-node"}),
        (["--requeue=expedite"], ["--requeue=expedite"], {"requeue"}),  # 25.11's expedited requeue
        (["--mem-u", "1@2"], ["--mem-u", "1@2"], {"mem-update"}),  # a prefix of a 26.05 option
    ],
)
def test_the_issues_command_lines(argv: list[str], sbatch: list[str], names: set[str]) -> None:
    assert split([*argv, "job.sh", "a"]) == (sbatch, "job.sh", ["a"], names)


def test_a_name_needs_a_value_on_every_release_or_on_none() -> None:
    """The invariant that lets one grammar read every release's command line: a name (or a
    letter) never changes between taking the next word and not."""
    for table in (sbatch_options.options, sbatch_options.short_options):
        kinds: dict[str, set[bool]] = {}
        meanings: dict[str, set[str]] = {}
        for release in sbatch_options.RELEASES:
            for key, option in table(release).items():
                kinds.setdefault(key, set()).add(option.value == sbatch_options.REQUIRED)
                meanings.setdefault(key, set()).add(option.canonical)
        assert {k for k, v in kinds.items() if len(v) > 1} == set()
        assert {k for k, v in meanings.items() if len(v) > 1} == set()


def test_the_releases_differ_where_slurms_sources_do() -> None:
    """A few rows read from slurm_opt.c at each tag: what each release added or changed."""
    old, new = sbatch_options.options("22.05"), sbatch_options.options("26.05")
    assert "power" in old and "power" not in new
    assert {"segment", "mem-update", "container-id", "tres-bind"} & set(old) == set()
    assert {"segment", "mem-update", "container-id", "tres-bind"} <= set(new)
    assert old["requeue"].value == sbatch_options.NONE
    assert new["requeue"].value == sbatch_options.OPTIONAL  # --requeue=expedite, 25.11
    assert sbatch_options.options("25.05")["requeue"].value == sbatch_options.NONE
    assert sbatch_options.options("25.11")["requeue"].value == sbatch_options.OPTIONAL
    assert len(old) == 106 and len(new) == 120


@pytest.mark.parametrize(
    "given,found,candidates",
    [
        ("job", "job-name", []),
        ("cluster", "clusters", []),
        ("tasks-per", "ntasks-per-node", []),
        ("seg", "segment", []),  # 24.11 on; 22.05's sbatch refuses it itself
        ("clus", None, ["cluster", "cluster-constraint", "clusters"]),
        ("zzz", None, []),
    ],
)
def test_find_long(given: str, found: str | None, candidates: list[str]) -> None:
    option, others = sbatch_options.find_long(given)
    assert (option.canonical if option else None, others) == (found, candidates)


def test_an_unknown_option_takes_no_value_and_the_error_says_so(tmp_path: Path) -> None:
    """sbatch's getopt reads no value for an option it does not know, so the next word is the
    script; when that word is no script, the error says why it was taken for one."""
    from slurm_dispatch.control import submit

    line = sbatch_args.parse_command_line(["--zzz-new", "5", "job.sh"])
    assert (line.sbatch, line.script, line.script_args) == (["--zzz-new"], "5", ["job.sh"])
    with pytest.raises(
        UsageError,
        match=r"cannot read script '5'.*--zzz-new.*"
        r"--zzz-new=VALUE",
    ):
        submit.read_request(
            ["--checkpoint", str(tmp_path), "--zzz-new", "5", "job.sh"], cwd=str(tmp_path), env={}
        )
