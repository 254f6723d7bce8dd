"""The docs say what the commands do.

Every command a page shows (`dispatch <cmd> --opt`, `dispatch-sbatch --opt`, `dispatch-cease`,
`dispatch-sandbox`, `#DISPATCH` lines, `make <target>`) names a command and options that exist;
every relative link and anchor resolves; the README stays short and starts with `make demo` and
`make test`; each guide has its contents; the reference, the man pages and the completions are
what the commands' own help gives now; the README's ten-line job publishes and resumes."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

import click
import pytest

from slurm_dispatch.cli import manpages
from slurm_dispatch.cli.admin import main as admin_cli
from slurm_dispatch.cli.cease import main as cease_cli
from slurm_dispatch.cli.dispatch import main as dispatch_cli
from slurm_dispatch.cli.sandbox import cli as sandbox_cli
from slurm_dispatch.control import sbatch_args

REPO = Path(__file__).resolve().parents[2]
GUIDES = ["docs/user-guide.md", "docs/admin-guide.md", "docs/development.md"]


def pages() -> list[Path]:
    """Every markdown page of the project that a reader is pointed at."""
    found = [REPO / "README.md", REPO / "bench/README.md"]
    found += sorted((REPO / "docs").rglob("*.md"))
    return [p for p in found if p.is_file()]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# --- reading markdown ---------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)\s*$")


def code_blocks(text: str) -> Iterator[tuple[str, str]]:
    """Each fenced block's language and text."""
    lang: Optional[str] = None
    lines: list[str] = []
    for line in text.split("\n"):
        match = FENCE.match(line.strip())
        if match and lang is None:
            lang, lines = match.group(1), []
        elif line.strip() == "```" and lang is not None:
            yield lang, "\n".join(lines)
            lang = None
        elif lang is not None:
            lines.append(line)


def prose(text: str) -> str:
    """The text outside fenced blocks."""
    out, inside = [], False
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            inside = not inside
        elif not inside:
            out.append(line)
    return "\n".join(out)


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    title = re.sub(r"`", "", title.strip().lower())
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", prose(text), re.M)}


# --- which commands a page shows ----------------------------------------------------------------

COMMANDS = ("dispatch", "dispatch-sbatch", "dispatch-cease", "dispatch-admin", "dispatch-sandbox")
ENDS = {"|", "||", "&&", ";", "&", ")", "\\"}


def words_of(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an apostrophe in prose, an unbalanced quote of a fragment
        return line.split()


def invocations(line: str, first_only: bool = False) -> Iterator[list[str]]:
    """The words of each dispatch command on a shell line, up to the end of that command
    (``first_only``: only a command the line starts with, after variable assignments)."""
    words = words_of(line)
    if first_only:
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):
            words = words[1:]
    for i, word in enumerate(words):
        if first_only and i > 0:
            break
        bare = word.split("$(")[-1].lstrip("(`").rstrip("`")
        name = bare.rsplit("/bin/", 1)[-1] if "/bin/" in bare else bare
        if name not in COMMANDS or not (bare == name or bare.endswith("/bin/" + name)):
            continue
        out = [name]
        for follow in words[i + 1 :]:
            if follow in ENDS or follow.startswith(("#", "$(")) or follow in COMMANDS:
                break
            stop = follow.endswith((")", ";", "`", "}"))
            out.append(follow.rstrip(");`}"))
            if stop:
                break
        yield out


def shown_lines(text: str) -> Iterator[tuple[str, bool]]:
    """Shell lines a page shows: its shell code blocks (continuations joined), and its inline
    code spans, which are taken for a command only where they start with one (a span like
    `==> slurm-dispatch: ... dispatch job ...` shows output)."""
    for lang, block in code_blocks(text):
        if lang in ("", "sh", "bash", "shell", "console"):
            for line in block.replace("\\\n", " ").split("\n"):
                yield line, False
    for span in re.findall(r"`([^`\n]+)`", prose(text).replace("\n", " ")):
        yield span, True


def click_options(command: click.Command, ctx: click.Context) -> set[str]:
    names: set[str] = set()
    for param in command.get_params(ctx):
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def check_click(
    words: list[str], command: click.Command, where: str, parent: Optional[click.Context] = None
) -> None:
    """``words`` after the command's name: options it has, subcommands it has.  (Contexts as
    the command line makes them: click keeps the first help option a command is asked for.)"""
    ctx = click.Context(
        command, info_name=words[0].split()[-1], parent=parent, **command.context_settings
    )
    for i, word in enumerate(words[1:], 1):
        word = word.strip("[]").rstrip(".")
        if word == "--":
            return  # what follows is another command's (watch, exec)
        if word.startswith("-") and len(word) > 1 and not word[1].isdigit():
            option = word.split("=", 1)[0]
            assert option in click_options(command, ctx), (
                f"{where}: {' '.join(words[:i])} has no option {option}"
            )
        elif isinstance(command, click.Group):
            if not re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", word):
                return  # a placeholder (COMMAND, ...): nothing more to check
            subs = []
            for name in word.split("|"):
                sub = command.get_command(ctx, name)
                assert sub is not None, f"{where}: {words[0]} has no command {name!r}"
                subs.append(sub)
            check_click([f"{words[0]} {word}"] + words[i + 1 :], subs[0], where, ctx)
            return


SBATCH_LONG = (
    sbatch_args.DISPATCH_WITH_ARG
    | sbatch_args.DISPATCH_FLAGS
    | sbatch_args.LONG_WITH_ARG
    | sbatch_args.LONG_FLAGS
    | {"help", "version"}
)
SBATCH_TAKES = sbatch_args.DISPATCH_WITH_ARG | sbatch_args.LONG_WITH_ARG


def check_sbatch(words: list[str], where: str) -> None:
    """dispatch-sbatch's options, up to the script: its own and sbatch's, in full."""
    args = iter(words[1:])
    for word in args:
        word = word.strip("[]")
        if word.startswith("--") and len(word) > 2:
            name = word[2:].split("=", 1)[0]
            assert name in SBATCH_LONG, f"{where}: dispatch-sbatch has no option --{name}"
            if name in SBATCH_TAKES and "=" not in word:
                next(args, None)
        elif word.startswith("-") and len(word) > 1:
            if word[1] in sbatch_args.SHORT_WITH_ARG and len(word) == 2:
                next(args, None)
        else:
            return  # the script: the rest is its own


def check_line(line: str, where: str, first_only: bool = False) -> None:
    for words in invocations(line, first_only):
        if words[0] == "dispatch-sbatch":
            check_sbatch(words, where)
        else:
            commands: dict[str, click.Command] = {
                "dispatch": dispatch_cli,
                "dispatch-cease": cease_cli,
                "dispatch-admin": admin_cli,
                "dispatch-sandbox": sandbox_cli,
            }
            check_click(words, commands[words[0]], where)
    if line.lstrip().startswith("#DISPATCH"):
        sbatch_args.read_header("#!/bin/bash\n" + line.strip() + "\n", where)


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, re.M))


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_every_command_a_page_shows_exists(page: Path) -> None:
    text = page.read_text()
    targets = make_targets()
    for line, inline in shown_lines(text):
        check_line(line, rel(page), first_only=inline)
        for target in re.findall(r"(?:^|[;&|] *)make ([\w-]+)", line.strip()):
            assert target in targets, f"{rel(page)}: no make target {target!r}"


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_every_python_example_parses_and_names_what_exists(page: Path) -> None:
    """A page's Python parses, and what it imports from slurm_dispatch (and uses of it:
    `api.publish`) exists."""
    for lang, block in code_blocks(page.read_text()):
        if lang != "python":
            continue
        tree = ast.parse(block)
        names: dict[str, object] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slurm_dis"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        importlib.import_module(f"{node.module}.{alias.name}")  # a submodule
                    names[alias.asname or alias.name] = getattr(module, alias.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = names.get(node.value.id)
                if inspect.ismodule(owner):
                    assert hasattr(owner, node.attr), (
                        f"{rel(page)}: {node.value.id}.{node.attr} does not exist"
                    )


SCRIPTS = sorted((REPO / "examples").rglob("*.sh")) + sorted((REPO / "demo").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=rel)
def test_every_command_a_shipped_script_runs_exists(script: Path) -> None:
    """The examples and demos are docs too: what they run, with what options, exists."""
    for line in script.read_text().replace("\\\n", " ").split("\n"):
        check_line(line, rel(script))


@pytest.mark.parametrize(
    "line,wrong",
    [
        ("dispatch status JOB --jsn", "--jsn"),
        ("dispatch stats JOB", "'stats'"),
        ("dispatch-sbatch --checkpoint ck --resubmits 3 job.sh", "--resubmits"),
        ("x=$(dispatch latest --rot ck)", "--rot"),
        ("dispatch-sandbox up --slrum 24.11", "--slrum"),
        ("dispatch-cease 12 --restrat 0", "--restrat"),
        ("#DISPATCH --chekpoint /x", "--chekpoint"),
    ],
)
def test_the_check_catches_a_wrong_command(line: str, wrong: str) -> None:
    """The checker above is not vacuous: each of these is a mistake it names."""
    with pytest.raises((AssertionError, Exception)) as info:
        check_line(line, "page")
    assert wrong in str(info.value)


def test_the_check_passes_what_is_right() -> None:
    for line in [
        "dispatch-sbatch --checkpoint /scratch/$USER/run1 --resubmit 3 -N 2 "
        "--time=4:00:00 train.sh --lr 3e-4",
        "resume=${DISPATCH_RESUME_FROM:-$(dispatch latest)}",
        "exec dispatch watch -- python train.py --output_dir x",
        "dispatch-sandbox exec --slurm 24.11 --user u -- dispatch-sbatch --checkpoint ck train.sh",
        "dispatch publish|latest|list",
        "dispatch gc [--root ROOT] [--keep K] [--dry-run]",
        "/opt/slurm-dispatch/bin/dispatch-cease 12 --json",
    ]:
        check_line(line, "page")


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_every_relative_link_resolves(page: Path) -> None:
    text = prose(page.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: link {target} leads nowhere"
        if fragment and dest.suffix == ".md":
            assert fragment in anchors(dest.read_text()), (
                f"{rel(page)}: link {target}: no heading #{fragment} in {rel(dest)}"
            )


def test_the_readme_starts_with_make_demo_and_make_test_and_stays_short() -> None:
    """The README: 510 lines for every reader at once; the first commands stay the first."""
    text = (REPO / "README.md").read_text()
    _lang, first = next(code_blocks(text))
    commands = [line.split("#")[0].strip() for line in first.split("\n") if line.strip()]
    assert commands[:2] == ["make demo", "make test"]
    assert text.index("```") < text.index("\n## "), "a section comes before the two commands"
    assert len(text.split("\n")) <= 80
    for page in (
        "docs/user-guide.md",
        "docs/admin-guide.md",
        "docs/development.md",
        "docs/reference/README.md",
    ):
        assert f"({page})" in text, f"the README does not point to {page}"


@pytest.mark.parametrize("guide", GUIDES)
def test_each_guide_lists_its_sections_first(guide: str) -> None:
    text = (REPO / guide).read_text()
    sections = [m.group(1) for m in re.finditer(r"^## (.+)$", prose(text), re.M)]
    assert len(sections) >= 3
    head = text[: text.index("\n## ")]
    for title in sections:
        assert f"(#{slug(title)})" in head, f"{guide}: contents miss {title!r}"


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_no_page_installs_from_an_index(page: Path) -> None:
    """slurm-dispatch is on no index: `pip install 'slurm-dispatch[s3]'` cannot work."""
    wrong = re.findall(r"pip install [^`\n]*'?slurm-dispatch\b", page.read_text())
    assert not wrong, f"{rel(page)}: {wrong}"


def test_the_user_guide_installs_the_wheel_make_dist_builds() -> None:
    text = (REPO / "docs/user-guide.md").read_text()
    version = manpages.__version__
    assert f"'dist/slurm_dispatch-{version}-py3-none-any.whl[s3]'" in text
    assert "make dist" in text


def test_the_readme_ten_line_job_publishes_and_resumes(tmp_path: Path) -> None:
    """The README's example, run as the launcher runs it (the contract's variables set, the
    real `dispatch publish`): a first execution publishes ten saves; a replacement resuming from
    the fourth publishes steps 5 to 10 in its own folder, and its last is the latest."""
    text = (REPO / "README.md").read_text()
    script = next(
        block for lang, block in code_blocks(text) if lang == "sh" and "#DISPATCH" in block
    )
    assert len(script.split("\n")) <= 10
    root = tmp_path / "ck"
    (root / "pub").mkdir(parents=True)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "dispatch"
    shim.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        "'from slurm_dispatch.cli.dispatch import main; main()' \"$@\"\n"
    )
    shim.chmod(0o755)
    job = tmp_path / "train.sh"
    job.write_text(script + "\n")

    def execution(attempt: str, epoch: int, resume: str) -> None:
        exec_dir = root / "exec" / attempt
        exec_dir.mkdir(parents=True)
        env = dict(
            os.environ,
            PATH=f"{bindir}:{os.environ['PATH']}",
            DISPATCH_CHECKPOINT=str(root),
            DISPATCH_EPOCH=str(epoch),
            DISPATCH_EXEC_DIR=str(exec_dir),
            DISPATCH_RESUME_FROM=resume,
        )
        subprocess.run(["bash", str(job)], env=env, check=True, capture_output=True, timeout=300)

    latest = [
        sys.executable,
        "-c",
        "from slurm_dispatch.cli.dispatch import main; main()",
        "latest",
        "--root",
        str(root),
    ]
    execution("a1", 1000000, "")
    assert len(list((root / "pub").iterdir())) == 10
    execution("a2", 2000000, str(root / "exec/a1/checkpoint-4"))
    assert len(list((root / "pub").iterdir())) == 16
    out = subprocess.run(latest, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == str(root / "exec/a2/checkpoint-10")
    assert not (root / "exec/a2/checkpoint-4").exists()


# --- the reference, the man pages, the completions -----------------------------------------------


def test_the_generated_pages_are_what_the_commands_help_says() -> None:
    """Regenerating gives the committed reference, man pages and completions; a help
    text changed without `make docs` fails here, naming the pages."""
    stale = [
        path
        for path, text in manpages.outputs().items()
        if not (REPO / path).is_file() or (REPO / path).read_text() != text
    ]
    import difflib

    diff = "".join(
        line
        for path in stale[:1]
        for line in difflib.unified_diff(
            (REPO / path).read_text().splitlines(True),
            manpages.outputs()[path].splitlines(True),
            path,
            "from the help now",
            n=1,
        )
    )
    assert not stale, f"run `make docs` (python3 -m slurm_dispatch.cli.manpages): {stale}\n{diff}"


def test_the_pages_do_not_depend_on_who_asked_click_first() -> None:
    """click keeps the help option of the first context that asks a command for it: one made
    without the group's settings (`--help` only, no `-h`; a test, a tool) must not change the
    pages.  Fresh interpreters, since a command asked once keeps its answer."""
    generate = (
        "import json, click; from slurm_dispatch.cli import manpages; "
        "from slurm_dispatch.cli.dispatch import main; s = main.commands['status']; "
        "{} print(json.dumps(manpages.outputs()))"
    )
    texts = [
        subprocess.run(
            [sys.executable, "-c", generate.format(first)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        for first in ("", "s.get_params(click.Context(s, info_name='status'));")
    ]
    assert texts[0] == texts[1]
    assert "-h, --help" in json.loads(texts[1])["docs/reference/dispatch.md"]


def test_every_command_and_option_is_in_its_man_page_and_reference() -> None:
    commands: list[tuple[click.Command, str]] = [
        (dispatch_cli, "dispatch"),
        (cease_cli, "dispatch-cease"),
        (admin_cli, "dispatch-admin"),
        (sandbox_cli, "dispatch-sandbox"),
    ]
    for command, name in commands:
        man = (REPO / f"docs/man/man1/{name}.1").read_text()
        ref = (REPO / f"docs/reference/{name}.md").read_text()
        ctx = click.Context(command, info_name=name, **command.context_settings)
        todo = [(command, ctx)]
        if isinstance(command, click.Group):
            for sub in command.list_commands(ctx):
                todo.append((command.get_command(ctx, sub), ctx))  # type: ignore[arg-type]
                assert f".SS {name} {sub}".replace("-", "\\-") in man
                assert f"## {name} {sub}" in ref
        for cmd, _ in todo:
            for param in cmd.params:
                for opt in param.opts:
                    if opt.startswith("-"):
                        assert opt.replace("-", "\\-") in man and opt in ref, (name, opt)
    sbatch_man = (REPO / "docs/man/man1/dispatch-sbatch.1").read_text()
    for option in sorted(sbatch_args.DISPATCH_WITH_ARG | sbatch_args.DISPATCH_FLAGS):
        assert f"\\-\\-{option.replace('-', chr(92) + '-')}" in sbatch_man, option


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff renders man pages")
@pytest.mark.parametrize("name", COMMANDS)
def test_each_man_page_renders_without_a_warning(name: str) -> None:
    page = REPO / f"docs/man/man1/{name}.1"
    out = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stderr == ""
    out.stdout = re.sub(".\x08", "", out.stdout)  # grotty's overstrikes for bold
    assert "NAME" in out.stdout and "SYNOPSIS" in out.stdout and name in out.stdout


def complete(tmp_path: Path, command: str, words: list[str]) -> list[str]:
    """What bash offers for ``words`` (the last being completed), with the shipped script."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, module in [
        ("dispatch", "slurm_dispatch.cli.dispatch"),
        ("dispatch-sandbox", "slurm_dispatch.cli.sandbox"),
    ]:
        shim = bindir / name
        shim.write_text(
            f"#!/bin/sh\nexec {sys.executable} -c 'from {module} import main; main()' \"$@\"\n"
        )
        shim.chmod(0o755)
    function = (
        "_dispatch_sbatch"
        if command == "dispatch-sbatch"
        else "_" + command.replace("-", "_") + "_completion"
    )
    array = " ".join(shlex.quote(w) for w in words)
    script = (
        f"source {shlex.quote(str(REPO / 'contrib/completion' / command))}\n"
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}\n"
        f"{function} {command} {shlex.quote(words[-1])} {shlex.quote(words[-2])}\n"
        f"printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    out = subprocess.run(
        ["bash", "--norc", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}"),
    )
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.split("\n") if line]


def test_bash_completes_dispatch_commands_and_options(tmp_path: Path) -> None:
    """Click's completion, once enabled, through the shipped script."""
    assert {"status", "supervise"} <= set(complete(tmp_path, "dispatch", ["dispatch", "s"]))
    assert "--timeline" in complete(tmp_path, "dispatch", ["dispatch", "status", "--"])
    assert "partition" in complete(tmp_path, "dispatch-sandbox", ["dispatch-sandbox", "pa"])


def test_bash_completes_dispatch_sbatch_options_then_files(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\n")
    assert complete(tmp_path, "dispatch-sbatch", ["dispatch-sbatch", "--chec"]) == ["--checkpoint"]
    offered = complete(tmp_path, "dispatch-sbatch", ["dispatch-sbatch", "--w"])
    assert "--warn-before" in offered and "--wrap" not in offered  # refused, never offered
    assert "--partition" in complete(
        tmp_path, "dispatch-sbatch", ["dispatch-sbatch", "-N", "2", "--part"]
    )
    assert complete(tmp_path, "dispatch-sbatch", ["dispatch-sbatch", "j"]) == ["job.sh"]
    # after the script, its own arguments: no option of ours is offered
    assert (
        complete(
            tmp_path,
            "dispatch-sbatch",
            ["dispatch-sbatch", "--checkpoint", "ck", "job.sh", "--chec"],
        )
        == []
    )
