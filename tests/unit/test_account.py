"""The one home of "run work in a forked child as an account" (slurm_dispatch/_account.py),
which the site's view (as each user) and the doctor (as SlurmUser) both use: the child really
is the account (nobody, a real one), says what it returned or raised, gets only the
environment and folder it is given, and an alarm ends a child that hangs."""

from __future__ import annotations

import json
import os
import pwd
import signal
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from slurm_dispatch import _account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="becomes another account")
NOBODY = pwd.getpwnam("nobody")


def said(exc: BaseException) -> bytes:
    return f"{type(exc).__name__}: {exc}".encode()


def test_the_child_is_the_account_and_says_what_it_returned() -> None:
    def ids() -> bytes:
        return json.dumps(
            [
                os.getuid(),
                os.geteuid(),
                os.getgid(),
                os.getegid(),
                sorted(os.getgroups()),
                os.getcwd(),
                os.environ.get("MARK"),
            ]
        ).encode()

    os.environ["MARK"] = "root's"
    try:
        data, status = _account.run_as(NOBODY, ids, said)
    finally:
        del os.environ["MARK"]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    groups = sorted(set(os.getgrouplist(NOBODY.pw_name, NOBODY.pw_gid)))
    got = json.loads(data)
    assert got[:4] == [NOBODY.pw_uid] * 2 + [NOBODY.pw_gid] * 2
    assert sorted(set(got[4])) == groups
    assert got[5:] == [os.getcwd(), "root's"]  # nothing asked: the caller's folder and env
    assert os.geteuid() == 0  # the caller is still root


def test_an_environment_and_folder_asked_for_are_all_the_child_has() -> None:
    def where() -> bytes:
        return json.dumps([dict(os.environ), os.getcwd()]).encode()

    data, _ = _account.run_as(NOBODY, where, said, env={"HOME": "/nonexistent", "A": "b"}, cwd="/")
    assert json.loads(data) == [{"HOME": "/nonexistent", "A": "b"}, "/"]


def test_what_the_child_raised_comes_back_in_the_callers_words() -> None:
    def refused() -> bytes:
        os.setuid(0)  # nobody cannot become root again
        return b"root again"

    data, status = _account.run_as(NOBODY, refused, said)
    assert data == b"PermissionError: [Errno 1] Operation not permitted"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

    def leaves() -> bytes:
        raise SystemExit(3)  # never runs the caller's code on: reported like the rest

    data, status = _account.run_as(NOBODY, leaves, said)
    assert (data, os.WEXITSTATUS(status)) == (b"SystemExit: 3", 0)


def test_an_alarm_ends_a_child_that_hangs() -> None:
    def hangs() -> bytes:
        time.sleep(60)
        return b"woke"

    began = time.monotonic()
    data, status = _account.run_as(NOBODY, hangs, said, alarm=1)
    assert time.monotonic() - began < 30
    assert data == b""
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM


def test_an_alarm_ends_a_child_whose_group_lookup_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The account's groups come from the directory service (sssd, LDAP), which can hang: the
    # lookup is the child's, under its alarm, so root's prune or release service never waits
    # on it (it ran in the caller before, outside any alarm).
    def hangs(name: str, gid: int) -> list[int]:
        time.sleep(40)
        return [gid]

    monkeypatch.setattr(os, "getgrouplist", hangs)
    began = time.monotonic()
    data, status = _account.run_as(NOBODY, lambda: b"ran", said, alarm=1)
    assert time.monotonic() - began < 30
    assert data == b""
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM


def test_a_long_answer_comes_back_whole() -> None:
    big = os.urandom(1 << 20)
    data, _ = _account.run_as(NOBODY, lambda: big, said)
    assert data == big


@pytest.mark.parametrize("how", ["ignored", "blocked"])
def test_an_alarm_ends_a_child_that_hangs_whatever_the_caller_did_with_sigalrm(how: str) -> None:
    """A release service started by something that ignores or blocks SIGALRM (a wrapper's
    `trap '' ALRM`, a supervisor's signal mask: both survive exec) forked children that
    inherited it, so the alarm meant to end a child hung on a user's file system did nothing
    and root's pass over every user waited on that one child."""

    def hangs() -> bytes:
        time.sleep(20)
        return b"woke"

    if how == "ignored":
        before = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    else:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        began = time.monotonic()
        data, status = _account.run_as(NOBODY, hangs, said, alarm=1)
        took = time.monotonic() - began
    finally:
        if how == "ignored":
            signal.signal(signal.SIGALRM, before)
        else:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert data == b"" and took < 15, (data, took)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM


def test_an_answer_past_the_limit_ends_the_child_and_is_refused() -> None:
    """The site's view reads each user's answer as root, and the answer holds what the user
    wrote (a hold's evidence): a hostile user's records made root read, and keep in memory,
    however much they liked.  Past ``limit`` the child is ended and nothing of it is kept."""
    big = b"x" * (1 << 20)
    started = time.monotonic()
    with pytest.raises(OverflowError, match=r"nobody.*more than 65536 bytes"):
        _account.run_as(NOBODY, lambda: big, said, limit=1 << 16)
    assert time.monotonic() - started < 10


def test_the_site_view_names_a_user_whose_answer_is_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_dispatch.control import siteview

    monkeypatch.setattr(siteview, "ANSWER_LIMIT", 1 << 16)
    got = siteview.as_user(NOBODY, "/nonexistent", lambda home: {"holds": ["x" * (1 << 20)]})
    assert got == {
        "errors": [
            f"reading /nonexistent as nobody: the answer passed "
            f"{1 << 16} bytes; not read further (its records hold more than "
            "a site view shows)"
        ]
    }


def children() -> list[tuple[int, str, int]]:
    """This process's children, zombies too: (pid, state as /proc shows it, uid)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found.append((int(name), fields[0], uid))
    return found


def stopped_children() -> list[int]:
    """This process's children that are stopped (state T)."""
    return [pid for pid, state, _ in children() if state == "T"]


def children_as(uid: int) -> list[int]:
    """This process's children running as ``uid`` (or left unreaped)."""
    return [pid for pid, _, owner in children() if owner == uid]


T = TypeVar("T")


def rescued(call: Callable[[], T], after: float = 40.0) -> tuple[T | Exception, float]:
    """``call()``'s result (or what it raised) and how long it took; a child of ours still
    stopped ``after`` seconds on is continued, so that a caller waiting on it for ever makes
    the test fail on the time taken rather than hang."""
    import threading

    done = threading.Event()

    def rescue() -> None:
        if not done.wait(after):
            for pid in stopped_children():
                os.kill(pid, signal.SIGCONT)

    threading.Thread(target=rescue, daemon=True).start()
    began = time.monotonic()
    try:
        got: T | Exception = call()
    except Exception as exc:  # noqa: BLE001 - what it raised is the result
        got = exc
    finally:
        done.set()
    return got, time.monotonic() - began


def test_a_child_its_account_stopped_is_killed_at_the_deadline() -> None:
    """The child runs as the account, so the account may SIGSTOP it: its
    alarm then stays pending, and root's parent read the pipe for ever (the release service,
    prune, metrics and holds stopped for every user).  The parent keeps the bound itself: past
    the alarm (and a short grace) it kills the child, reaps it and raises TimeoutError."""
    import subprocess

    def stops() -> bytes:
        # A process of the account's own (not root's) stops the child: the account can.
        subprocess.run(["kill", "-STOP", str(os.getpid())], check=True)
        return b"woke"

    got, took = rescued(lambda: _account.run_as(NOBODY, stops, said, alarm=1))
    assert isinstance(got, TimeoutError), got
    assert took < 1 + _account.GRACE + 10, took
    assert "nobody" in str(got) and "no answer within" in str(got) and "SIGKILL" in str(got)
    assert children_as(NOBODY.pw_uid) == []  # killed and reaped: nothing left behind
