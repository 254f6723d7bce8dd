"""Reading dispatch-sbatch's command line and script headers; rendering the batch script."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_dispatch.control import sbatch_args
from slurm_dispatch.errors import UsageError

GOLDEN = Path(__file__).parent / "golden" / "batch-script.sh"


@pytest.mark.parametrize(
    "argv,sbatch,script,args",
    [
        (["job.sh"], [], "job.sh", []),
        (["-N2", "job.sh", "-N", "3"], ["-N2"], "job.sh", ["-N", "3"]),
        (["-N", "2", "--time", "10", "job.sh"], ["-N", "2", "--time", "10"], "job.sh", []),
        (["-HN", "2", "job.sh"], ["-HN", "2"], "job.sh", []),
        (
            ["--parsable", "--export=NONE", "job.sh", "x"],
            ["--parsable", "--export=NONE"],
            "job.sh",
            ["x"],
        ),
        (["--job", "name", "job.sh"], ["--job", "name"], "job.sh", []),  # getopt prefix
        (["-vvv", "job.sh"], ["-vvv"], "job.sh", []),
        (["--checkpoint", "/c", "-a", "1-3", "job.sh"], ["-a", "1-3"], "job.sh", []),
        (["-o", "out %j", "--", "job.sh"], ["-o", "out %j", "--"], "job.sh", []),
    ],
)
def test_command_line_split(
    argv: list[str], sbatch: list[str], script: str, args: list[str]
) -> None:
    line = sbatch_args.parse_command_line(argv)
    assert (line.sbatch, line.script, line.script_args) == (sbatch, script, args)


def test_dispatch_options_anywhere_before_script() -> None:
    line = sbatch_args.parse_command_line(
        [
            "-N",
            "2",
            "--checkpoint=/ck",
            "--resubmit",
            "3",
            "--shared-checkpoint",
            "--supersede",
            "dabc",
            "job.sh",
            "--checkpoint",
            "not-ours",
        ]
    )
    d = line.dispatch
    assert (d.checkpoint, d.resubmit, d.shared_checkpoint, d.supersede) == ("/ck", 3, True, "dabc")
    assert line.script_args == ["--checkpoint", "not-ours"]
    assert line.sbatch == ["-N", "2"]


@pytest.mark.parametrize(
    "argv,word",
    [
        (["--resubmit", "many", "job.sh"], "--resubmit 'many'"),
        (["--resubmit", "-1", "job.sh"], "--resubmit -1"),
        (["--checkpoint"], "--checkpoint needs a value"),
        (["-N"], "-N needs a value"),
        (["--shared-checkpoint=yes", "job.sh"], "takes no value"),
        (["--ex", "job.sh"], "ambiguous"),
    ],
)
def test_command_line_errors_name_the_value(argv: list[str], word: str) -> None:
    with pytest.raises(UsageError, match=word):
        sbatch_args.parse_command_line(argv)


SCRIPT = """#!/usr/bin/env python3
# a comment
#SBATCH --job-name="my job" -N 2
#SBATCH --time=10  # a trailing comment
#DISPATCH --checkpoint /ck --resubmit 2

#SBATCH --parsable
import os
#SBATCH --hold
"""


def test_header_reads_directives_like_sbatch() -> None:
    header = sbatch_args.read_header(SCRIPT, "job.py")
    assert header.shebang == "#!/usr/bin/env python3"
    assert header.sbatch_words == ["--job-name=my job", "-N", "2", "--time=10", "--parsable"]
    assert {"job-name", "parsable", "time"} <= header.long_names
    assert "hold" not in header.long_names  # after the first command: not a directive
    assert (header.dispatch.checkpoint, header.dispatch.resubmit) == ("/ck", 2)
    assert header.sbatch_lines[-1] == "#SBATCH --parsable"


def test_command_line_wins_over_directives() -> None:
    header = sbatch_args.read_header(SCRIPT, "job.py")
    line = sbatch_args.parse_command_line(["--resubmit", "5", "job.py"])
    merged = line.dispatch.merged_over(header.dispatch)
    assert (merged.checkpoint, merged.resubmit) == ("/ck", 5)


@pytest.mark.parametrize(
    "text,word",
    [
        ("#!/bin/bash\r\necho hi\r\n", "DOS line breaks"),
        ("echo hi\n", "does not start with '#!'"),
        ("#!/bin/bash\n#DISPATCH -N 2\n", "dispatch options only"),
        ("#!/bin/bash\n#DISPATCH --resubmit x\n", "--resubmit 'x'"),
        ("#!/bin/bash\n#SBATCH --comment 'unclosed\n", "line 2"),
    ],
)
def test_header_errors(text: str, word: str) -> None:
    with pytest.raises(UsageError, match=word):
        sbatch_args.read_header(text, "job.sh")


def test_render_batch_script_golden() -> None:
    """The rendered batch script is pinned.  Re-bless after an intended change with
    BLESS_GOLDEN=1 pytest tests/unit/test_sbatch_args.py, then review the diff."""
    header = sbatch_args.read_header(SCRIPT, "job.py")
    text = sbatch_args.render_batch_script(
        header=header,
        python="/opt/venv/bin/python3",
        job_path="/home/u/.local/state/slurm-dispatch/jobs/dabc'x y",
        submission=3,
    )
    if os.environ.get("BLESS_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendered batch script changed; see the docstring"


@given(
    st.text(
        alphabet=st.characters(blacklist_characters="\0\n\r", blacklist_categories=["Cs"]),
        min_size=1,
        max_size=30,
    )
)
def test_render_quotes_weird_paths(weird: str) -> None:
    """Whatever the job path is, bash reads back exactly that path (shlex quoting)."""
    import shlex

    header = sbatch_args.read_header("#!/bin/bash\n", "x")
    text = sbatch_args.render_batch_script(
        header=header, python="/p y/python", job_path="/j/" + weird, submission=1
    )
    last = text.split("\n")[-2]
    words = shlex.split(last)
    assert words[:4] == ["exec", "/p y/python", "-m", "slurm_dispatch.launch"]
    assert words[5] == "/j/" + weird
