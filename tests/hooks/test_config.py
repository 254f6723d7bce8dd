"""dispatch.conf: Slurm-style Key=Value, one search path, defaults, problems named precisely."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_dispatch import config


def test_missing_default_file_means_defaults(tmp_path: Path) -> None:
    cfg = config.load(environ={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert cfg.problems == []
    assert cfg.state_dir == "/var/lib/slurm-dispatch"
    assert cfg.hook_timeout == 5.0
    assert cfg.shared_hold_for == 86400.0
    assert cfg.cessation_signal == "dispatch-cease"
    assert cfg.cessation_interval == 60.0


def test_search_path() -> None:
    assert config.config_path({}) == "/etc/slurm/dispatch.conf"
    assert config.config_path({"SLURM_CONF": "/x/etc/slurm.conf"}) == "/x/etc/dispatch.conf"
    assert (
        config.config_path({"SLURM_CONF": "/x/slurm.conf", "SLURM_DISPATCH_CONF": "/y/d.conf"})
        == "/y/d.conf"
    )


def test_explicit_missing_file_is_a_problem(tmp_path: Path) -> None:
    cfg = config.load(environ={"SLURM_DISPATCH_CONF": str(tmp_path / "nope.conf")})
    assert len(cfg.problems) == 1 and "nope.conf: no such file" in cfg.problems[0]


def test_parse_keys_case_insensitive_comments_quotes(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.conf"
    path.write_text(
        "# comment\n\nstatedir = /srv/state  # trailing\nHOOKTIMEOUT=2.5\n"
        'CessationSignal="/opt/bin/dispatch-cease --x"\nSharedHoldFor=1-00:00:00\n'
        "CessationInterval=00:30\nBootTimeTolerance=10\n"
    )
    cfg = config.load(str(path))
    assert cfg.problems == []
    assert (
        cfg.state_dir,
        cfg.hook_timeout,
        cfg.cessation_signal,
        cfg.shared_hold_for,
        cfg.cessation_interval,
        cfg.boot_time_tolerance,
    ) == ("/srv/state", 2.5, "/opt/bin/dispatch-cease --x", 86400.0, 30.0, 10.0)


def test_empty_cessation_signal_means_none(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.conf"
    path.write_text("CessationSignal=\n")
    assert config.load(str(path)).cessation_signal == ""


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("86400", 86400.0),
        ("24:00:00", 86400.0),
        ("1-00:00:00", 86400.0),
        ("1-0", 86400.0),
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("05:30", 330.0),
        ("1.5", 1.5),
        ("0-01", 3600.0),
        ("1-02:03", 86400 + 2 * 3600 + 180),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert config.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "x", "-1", "1:2:3:4", "1-", "1-25:00:00", "00:61", "1h", "inf", "nan", "1--2"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        config.parse_duration(text)


def test_problems_name_key_value_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.conf"
    path.write_text(
        "StateDir=relative/path\nHookTimeout=600\nColour=blue\njunk line\n"
        "SharedHoldFor=forever\nHookTimeout=1\n"
    )
    cfg = config.load(str(path))
    text = "\n".join(cfg.problems)
    assert f"{path}:1: bad value for StateDir: 'relative/path' is not an absolute path" in text
    assert f"{path}:2: bad value for HookTimeout" in text and "'600'" in text
    assert f"{path}:3: unknown key 'Colour' (value 'blue')" in text
    assert f"{path}:4: 'junk line' is not Key=Value" in text
    assert f"{path}:5: bad value for SharedHoldFor: 'forever'" in text
    assert f"{path}:6: HookTimeout given again" in text
    # Every bad key keeps its default.
    assert (cfg.state_dir, cfg.hook_timeout, cfg.shared_hold_for) == (
        "/var/lib/slurm-dispatch",
        5.0,
        86400.0,
    )


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"A" * (config.MAX_BYTES + 10)])
def test_garbled_file_gives_defaults_and_a_problem(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "dispatch.conf"
    path.write_bytes(content)
    cfg = config.load(str(path))
    assert cfg.problems and cfg.state_dir == config.DEFAULT_STATE_DIR


def test_fifo_and_directory_do_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.conf"
    os.mkfifo(fifo)
    assert "not a regular file" in config.load(str(fifo)).problems[0]
    assert config.load(str(tmp_path)).problems


def test_escaped_hash(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.conf"
    path.write_text("CessationSignal=/opt/a\\#b # comment\n")
    assert config.load(str(path)).cessation_signal == "/opt/a#b"


def test_a_value_given_again_is_judged_and_named_if_bad(tmp_path: Path) -> None:
    """The shipped dispatch.conf sets HookTimeout=5; an admin appends HookTimeout=abc: the
    problem said "HookTimeout given again", never that abc is not a duration.
    Each value is judged first; which value stands is said as it is."""
    path = tmp_path / "dispatch.conf"
    path.write_text("HookTimeout=5\nHookTimeout=abc\n")
    cfg = config.load(str(path))
    assert cfg.problems == [
        f"{path}:2: bad value for HookTimeout: 'abc' is not a duration (seconds, MM:SS, "
        "HH:MM:SS or D-HH:MM:SS); line 1's value 5.0 stands"
    ]
    assert cfg.hook_timeout == 5.0
    path.write_text("HookTimeout=5\nHookTimeout=7\n")
    assert config.load(str(path)).problems == [
        f"{path}:2: HookTimeout given again (first on line 1); line 1's value 5.0 stands"
    ]
    path.write_text("HookTimeout=abc\nHookTimeout=7\n")
    cfg = config.load(str(path))
    assert cfg.problems[1] == (
        f"{path}:2: HookTimeout given again (first on line 1, whose "
        "value is bad); using the default 5.0"
    )
    assert cfg.problems[0].startswith(f"{path}:1: bad value for HookTimeout: 'abc'")
    assert cfg.hook_timeout == 5.0


@pytest.mark.parametrize(
    "given,meant",
    [
        ("HookTimout", "HookTimeout"),
        ("hook_timeout", "HookTimeout"),
        ("CessationIntreval", "CessationInterval"),
        ("StateDirectory", "StateDir"),
        ("SiteViewGroups", "SiteViewGroup"),
    ],
)
def test_a_misspelt_key_is_answered_with_the_key_meant(
    tmp_path: Path, given: str, meant: str
) -> None:
    """Every command-line typo gets a "did you mean"; a dispatch.conf typo got the list of
    every key."""
    path = tmp_path / "dispatch.conf"
    path.write_text(f"{given}=5\n")
    assert config.load(str(path)).problems == [
        f"{path}:1: unknown key {given!r} (value '5'); did you mean {meant}?"
    ]


def test_a_key_like_none_still_lists_every_key(tmp_path: Path) -> None:
    path = tmp_path / "dispatch.conf"
    path.write_text("Colour=blue\n")
    (problem,) = config.load(str(path)).problems
    assert "did you mean" not in problem
    assert problem.endswith("valid keys are " + ", ".join(config.KEYS)), problem


def test_a_command_refusing_a_file_does_not_say_what_would_have_stood(tmp_path: Path) -> None:
    """A command stops on every problem, so "line 1's value 5.0 stands" (a hook's, which goes
    on) is not said in its refusal, as "using the default" is not."""
    path = tmp_path / "dispatch.conf"
    path.write_text("HookTimeout=5\nHookTimeout=abc\nHookTimeout=7\nStateDir=x\n")
    said = config.refusal(config.load(str(path)))
    assert said == (
        f"{path}:2: bad value for HookTimeout: 'abc' is not a duration (seconds, "
        f"MM:SS, HH:MM:SS or D-HH:MM:SS); {path}:3: HookTimeout given again (first "
        f"on line 1); {path}:4: bad value for StateDir: 'x' is not an absolute "
        "path"
    ), said


@pytest.mark.parametrize("breaker", ["\x0c", "\x0b", "\x1c", "\x85", "\u2028"])
def test_a_problem_names_the_line_an_editor_shows(breaker: str) -> None:
    """Lines are what Slurm's parser and an editor take them to be (split on '\\n'): a page
    break (^L) or another character str.splitlines() splits on made every later problem name
    the wrong line (HookTimeoutt on line 3 was reported on line 4)."""
    cfg = config.parse(f"HookTimeout=5\n{breaker}\nHookTimeoutt=3\n", "d.conf")
    assert len(cfg.problems) == 1 and cfg.problems[0].startswith("d.conf:3: unknown key"), (
        cfg.problems
    )
