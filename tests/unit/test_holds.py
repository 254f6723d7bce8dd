"""The cessation question on the control side (control/holds.py): what the supervisor and
`dispatch release` say, record and exit with, pinned word for word, and the check that the
question, its loop and the held job's comments have one home."""

from __future__ import annotations

import ast
import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control import record, submit
from slurm_dispatch.control.holds import Answer, release
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import RefusedError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture
from .test_supervisor import Clock, Signal

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def held_job(
    fake: FakeCluster, clock: Clock, signal: Any, settings: Settings
) -> tuple[record.JobRecord, str, str, Supervisor]:
    done = submit_one("ck-h", "--shared-checkpoint", "--resubmit", "3")
    fake.set(done.slurm_job_id, JobState="NODE_FAIL", Restarts="0")
    # The hold is made by a pass that asks no signal (a pass that does asks at once, in
    # test_supervisor): each test's own passes then ask it.
    report = Supervisor(Slurm(), dataclasses.replace(settings, signal=None), clock=clock).run_pass()
    sup = Supervisor(Slurm(), settings, signal_runner=signal, clock=clock)
    held = str(done.job.submissions()[-1]["slurm_job_id"])
    assert report.actions[0] == (
        f"{done.job.id}: node failure: submission 2 held as Slurm job "
        f"{held} until 1970-01-13 13:46 UTC"
    )
    return done.job, done.slurm_job_id, held, sup


def cessations(job: record.JobRecord) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in e.items() if k not in ("time", "ns", "v")}
        for e in job.events()
        if e["event"] == "cessation"
    ]


def test_the_supervisors_hold_and_its_lifting_say_what_they_said(cluster: FakeCluster) -> None:  # noqa: F811
    clock, signal = Clock(), Signal("not ceased", "ceased")
    job, ended, held, sup = held_job(cluster, clock, signal, Settings(interval=60))
    assert cluster.jobs[held]["Comment"] == (
        f"dispatch:{job.id}/2 held: shared checkpoint; node failure of job {ended}; waits "
        "until its processes are proven gone or a person releases it; expires "
        "1970-01-13 13:46 UTC"
    )
    assert sup.run_pass().actions == [f"{job.id}: dispatch-cease {ended}: not ceased"]
    clock.now += 61
    assert sup.run_pass().actions == [
        f"{job.id}: dispatch-cease {ended}: ceased",
        f"{job.id}: hold on Slurm job {held} lifted: ceased",
    ]
    argv = ["dispatch-cease", ended, "--restart", "0", "--json"]
    assert cessations(job) == [
        {
            "event": "cessation",
            "asked_at": 1_000_000.0,
            "held_slurm_job_id": held,
            "ended_slurm_job_id": ended,
            "verdict": "not ceased",
            "code": 1,
            "evidence": {"nodes": [{"node": "n1", "evidence": "not ceased"}]},
            "command": argv,
        },
        {
            "event": "cessation",
            "asked_at": 1_000_061.0,
            "held_slurm_job_id": held,
            "ended_slurm_job_id": ended,
            "verdict": "ceased",
            "code": 0,
            "evidence": {"nodes": [{"node": "n1", "evidence": "ceased"}]},
            "command": argv,
        },
    ]
    released = [e for e in job.events() if e["event"] == "released"]
    assert [(e["slurm_job_id"], e["by"], e.get("task")) for e in released] == [
        (held, "cessation signal", None)
    ]
    assert re.fullmatch(
        f"dispatch:{job.id}/2 released \\(ceased\\) {STAMP}", cluster.jobs[held]["Comment"]
    ), cluster.jobs[held]["Comment"]


def site_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, mode: int = 0o755
) -> Path:
    """A CessationSignal ``script`` (made ``mode``) named by this test's dispatch.conf."""
    signal = tmp_path / "cease"
    signal.write_text(script)
    signal.chmod(mode)
    conf = tmp_path / "dispatch.conf"
    conf.write_text(f"CessationSignal={signal}\n")
    monkeypatch.setenv("SLURM_DISPATCH_CONF", str(conf))
    return signal


def refused_release(
    fake: FakeCluster, clock: Clock, signal: str, answer: str
) -> tuple[record.JobRecord, str, str, Any]:
    """A held job whose release, asking ``signal`` (answering ``answer``), is refused."""
    job, ended, held, _ = held_job(fake, clock, Signal(), Settings(signal=None))
    with pytest.raises(RefusedError) as info:
        release(Slurm(), job, Settings(signal=signal), signal_runner=Signal(answer), clock=clock)
    return job, ended, held, info


def test_a_persons_release_is_refused_then_forced_with_the_same_words(cluster: FakeCluster) -> None:  # noqa: F811
    clock = Clock()
    job, ended, held, info = refused_release(cluster, clock, "site-cease --quiet", "not ceased")
    settings = Settings(signal="site-cease --quiet")
    assert str(info.value) == (
        f"the ended execution the hold of {job.id} waits for is not proven gone, so its "
        f"processes may still write the shared checkpoint: {ended}: not ceased: n1: not "
        f"ceased.  Release anyway with `dispatch release --force {job.id}`"
    )
    assert info.value.exit_code == 1
    assert cessations(job) == [
        {
            "event": "cessation",
            "asked_at": 1_000_000.0,
            "held_slurm_job_id": held,
            "ended_slurm_job_id": ended,
            "verdict": "not ceased",
            "code": 1,
            "evidence": {"nodes": [{"node": "n1", "evidence": "not ceased"}]},
            "command": ["site-cease", "--quiet", ended, "--restart", "0", "--json"],
        }
    ]
    assert cluster.jobs[held]["Reason"] == "JobHeldUser"
    assert release(Slurm(), job, settings, force=True, clock=clock) == held
    assert len(cessations(job)) == 1  # --force asks nothing
    assert [e["by"] for e in job.events() if e["event"] == "released"] == [
        "a person (dispatch release --force)"
    ]
    assert re.fullmatch(
        f"dispatch:{job.id}/2 released by a person {STAMP}", cluster.jobs[held]["Comment"]
    ), cluster.jobs[held]["Comment"]
    with pytest.raises(record.RecordError) as again:
        release(Slurm(), job, settings, force=True)
    assert str(again.value) == f"the hold on Slurm job {held} of {job.id} is already released"


def test_dispatch_release_prints_and_exits_as_it_did(
    cluster: FakeCluster,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signal = site_signal(
        tmp_path,
        monkeypatch,
        '#!/bin/sh\necho \'{"reason": "survivors", "nodes": [{"node": '
        '"n2", "proven": false, "evidence": "pid 7"}]}\'\nexit 1\n',
    )
    job, ended, held, _ = held_job(cluster, Clock(), Signal(), Settings(signal=None))
    refused = CliRunner().invoke(cli.main, ["release", job.id])
    assert refused.exit_code == 1
    assert refused.stdout == ""
    assert refused.stderr == (
        f"dispatch: the ended execution the hold of {job.id} waits for is not proven gone, so "
        f"its processes may still write the shared checkpoint: {ended}: not ceased: survivors; "
        f"n2: pid 7.  Release anyway with `dispatch release --force {job.id}`\n"
    )
    assert [c["command"] for c in cessations(job)] == [
        [str(signal), ended, "--restart", "0", "--json"]
    ]
    forced = CliRunner().invoke(cli.main, ["release", "--force", job.id])
    assert (forced.exit_code, forced.stdout) == (
        0,
        f"released Slurm job {held} of dispatch job {job.id}\n",
    )
    again = CliRunner().invoke(cli.main, ["release", job.id])
    assert (again.exit_code, again.stderr) == (
        2,
        f"dispatch: the hold on Slurm job {held} of {job.id} is already released\n",
    )


def test_a_superseding_jobs_held_comment_is_the_same_sentence(cluster: FakeCluster) -> None:  # noqa: F811
    old = submit_one("ck-s", "--shared-checkpoint")
    new = submit.submit_new(submit.read_request(["--supersede", old.job.id, "job.sh"]), Slurm())
    comment = cluster.jobs[new.slurm_job_id]["Comment"]
    assert re.fullmatch(
        f"dispatch:{new.job.id}/1 held: shared checkpoint; supersedes {old.job.id} \\(Slurm "
        f"job {old.slurm_job_id}\\); waits until its processes are proven gone or a person "
        f"releases it; expires {STAMP}",
        comment,
    ), comment


def test_the_answer_of_a_signal_is_read_as_before(tmp_path: Path) -> None:
    from slurm_dispatch.control.holds import ask_signal

    script = tmp_path / "s"
    script.write_text("#!/bin/sh\necho '{\"a\": 1}'\necho oops >&2\nexit $1\n")
    script.chmod(0o755)
    assert ask_signal([str(script), "0"], 10) == Answer("ceased", 0, {"a": 1})
    assert ask_signal([str(script), "1"], 10) == Answer("not ceased", 1, {"a": 1})
    assert ask_signal([str(script), "2"], 10) == Answer(
        "error", 2, {"output": {"a": 1}, "stderr": "oops"}
    )
    assert ask_signal([str(tmp_path / "none")], 10) == Answer(
        "error", None, f"{str(tmp_path / 'none')!r} not found"
    )


# -- one home -----------------------------------------------------------------------------


def _modules() -> Iterator[tuple[str, ast.AST]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text())


HOLD_WORDS = ("held: shared checkpoint", " released ", " hold over: ")


def test_the_hold_comments_are_written_in_holds_only() -> None:
    """Every text put on a held Slurm job's comment (held, released, hold over) is made in
    control/holds.py: an f-string holding one of their words elsewhere is a second copy that
    would drift from it (docstrings and plain messages are not f-string pieces of a comment,
    but a status line that says "released" with spaces round it would be: none does)."""
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr) and name != "control/holds.py":
                text = "".join(
                    v.value
                    for v in node.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)
                )
                found += [f"{name}:{node.lineno}: {w!r}" for w in HOLD_WORDS if w in text]
    assert found == []


def _is_cessation(node: ast.expr) -> bool:
    return (
        (isinstance(node, ast.Attribute) and node.attr == "Cessation")
        or (isinstance(node, ast.Name) and node.id == "Cessation")
        or (isinstance(node, ast.Constant) and node.value == "cessation")
    )


def test_the_cessation_question_is_asked_and_recorded_in_holds_only() -> None:
    """The loop over the ended executions a hold waits for (the signal's argv, ending in
    ``--restart R --json``; a cessation fact recorded per answer) exists once, in
    control/holds.py.  The node side's and the commands' own ``--restart`` options are the
    question answered, not asked: they are not looked at."""
    found = []
    for name, tree in _modules():
        if name == "control/holds.py":
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.List)
                and any(isinstance(e, ast.Constant) and e.value == "--json" for e in node.elts)
                and any(isinstance(e, ast.Constant) and e.value == "--restart" for e in node.elts)
            ):
                found.append(f"{name}:{node.lineno}: the signal's argv")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append"
                and node.args
                and _is_cessation(node.args[0])
            ):
                found.append(f"{name}:{node.lineno}: a cessation fact recorded")
    assert found == []


def test_the_scans_see_what_they_look_for() -> None:
    """The two scans above find the copies they forbid in control/holds.py itself."""
    tree = ast.parse((PACKAGE / "control" / "holds.py").read_text())
    pieces = "".join(
        str(v.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.JoinedStr)
        for v in n.values
        if isinstance(v, ast.Constant)
    )
    assert all(w in pieces for w in HOLD_WORDS)
    assert any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "append"
        and n.args
        and _is_cessation(n.args[0])
        for n in ast.walk(tree)
    )


def test_asking_a_signal_that_cannot_run_or_prints_bytes_never_raises(tmp_path: Path) -> None:
    # The invariant "asking never raises": a CessationSignal that is not executable (a site's
    # chmod slip) or prints bytes that are not UTF-8 is an "error" answer, recorded and shown
    # like any other, not a PermissionError/UnicodeDecodeError out of the supervisor's pass
    # or a traceback from `dispatch release`.
    from slurm_dispatch.control.holds import ask_signal

    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\nexit 0\n")
    plain.chmod(0o644)
    assert ask_signal([str(plain)], 10) == Answer(
        "error", None, f"{str(plain)!r} cannot be run: Permission denied"
    )
    garbled = tmp_path / "garbled"
    garbled.write_text("#!/bin/sh\nprintf 'ok \\377'\nprintf '\\376' >&2\nexit $1\n")
    garbled.chmod(0o755)
    assert ask_signal([str(garbled), "1"], 10) == Answer("not ceased", 1, "ok \ufffd")
    assert ask_signal([str(garbled), "3"], 10) == Answer(
        "error", 3, {"output": "ok \ufffd", "stderr": "\ufffd"}
    )


def test_dispatch_release_with_a_signal_that_cannot_run_is_refused(
    cluster: FakeCluster,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signal = site_signal(tmp_path, monkeypatch, "#!/bin/sh\nexit 0\n", mode=0o644)
    job, ended, held, _ = held_job(cluster, Clock(), Signal(), Settings(signal=None))
    refused = CliRunner().invoke(cli.main, ["release", job.id])
    assert (refused.exit_code, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"dispatch: the ended execution the hold of {job.id} waits for is not proven gone, so "
        f"its processes may still write the shared checkpoint: {ended}: error: "
        f"{str(signal)!r} cannot be run: Permission denied.  Release anyway with "
        f"`dispatch release --force {job.id}`\n"
    )
    assert [(c["verdict"], c.get("code")) for c in cessations(job)] == [("error", None)]
    assert cluster.jobs[held]["Reason"] == "JobHeldUser"


def test_a_signal_setting_that_does_not_split_is_an_error_answer(cluster: FakeCluster) -> None:  # noqa: F811
    # dispatch.conf's CessationSignal is split as a shell would; an unbalanced quote (an
    # admin's slip) raised ValueError out of the question: asking never raises, so it is an
    # "error" answer, recorded, and the release is refused with the words.
    job, ended, held, info = refused_release(cluster, Clock(), 'site-cease "--quiet', "ceased")
    assert (
        f"{ended}: error: CessationSignal 'site-cease \"--quiet' does not split into "
        "words: No closing quotation"
    ) in str(info.value)
    assert [(c["verdict"], c["command"]) for c in cessations(job)] == [
        ("error", ['site-cease "--quiet', ended, "--restart", "0", "--json"])
    ]
    assert cluster.jobs[held]["Reason"] == "JobHeldUser"


def test_a_notifier_printing_bytes_is_an_answer_too() -> None:
    # run_notifier's rule is the signal's: any failure is an answer, never an exception; a
    # mailer that prints bytes that are not UTF-8 (a Latin-1 locale) raised UnicodeDecodeError
    # out of the supervisor's telling.
    from slurm_dispatch.control.supervisor import run_notifier

    assert run_notifier(["sh", "-c", "cat >/dev/null; printf 'sent \\351'"], "hi", 10) == (
        True,
        "sent \ufffd",
    )
    assert run_notifier(["sh", "-c", "printf '\\377' >&2; exit 4"], "", 10) == (
        False,
        "sh exited 4: \ufffd",
    )


def test_a_signal_that_cannot_be_run_says_why_on_the_pass_line(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """The pass said only "dispatch-cease 27: error" for a signal the pass
    could not find (the systemd unit's PATH), and the hold waited 24 h without a reason."""
    from slurm_dispatch.control.holds import ask_signal

    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    job, ended, _, sup = held_job(
        cluster, Clock(), ask_signal, Settings(interval=60, signal="no-such-signal-x")
    )
    (line,) = sup.run_pass().actions
    assert line.startswith(
        f"{job.id}: no-such-signal-x {ended}: error ('no-such-signal-x' not "
        "found on PATH (/usr/local/bin:/usr/bin:/bin) nor beside "
    ), line
    assert line.endswith("set CessationSignal= to its absolute path in dispatch.conf)"), line


def test_a_persons_resubmit_of_a_shared_job_asks_the_signal_first(
    cluster: FakeCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    """`dispatch resubmit` of a shared-checkpoint job whose last execution
    ended with its node asked Slurm only and submitted unheld, beside a cut-off execution that
    may still write.  It asks the site's CessationSignal about the last execution, records
    the answer, and refuses while that is not proven gone (naming it), unless --force."""
    done = submit_one("ck-r", "--shared-checkpoint")
    job, ended = done.job, done.slurm_job_id
    job.append(
        "started",
        submission=1,
        slurm_job_id=ended,
        restart=0,
        attempt="a" * 26,
        epoch=1_000_000,
        exec_dir="/x",
        node="n1",
        nodes="n1",
        host="h",
        pid=1,
    )
    cluster.set(ended, JobState="NODE_FAIL")
    answer = tmp_path / "answer"
    answer.write_text("1")
    site_signal(
        tmp_path,
        monkeypatch,
        f'#!/bin/sh\necho \'{{"reason": "n1 not responding"}}\'\nexit $(cat {answer})\n',
    )
    refused = CliRunner().invoke(cli.main, ["resubmit", job.id])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 1, refused.output
    assert f"Slurm job {ended} restart 0 on n1" in said and "not proven gone" in said, said
    assert f"dispatch resubmit --force {job.id}" in said, said
    assert len(cluster.sbatch_calls()) == 1, "submitted although not proven gone"
    (fact,) = cessations(job)
    assert (fact["ended_slurm_job_id"], fact["verdict"]) == (ended, "not ceased")
    # Proven gone: submitted, unheld (a person's resubmission is the restart).
    answer.write_text("0")
    again = CliRunner().invoke(cli.main, ["resubmit", job.id])
    assert again.exit_code == 0, again.output
    assert len(cluster.sbatch_calls()) == 2 and "--hold" not in cluster.sbatch_calls()[-1]
    assert [c["verdict"] for c in cessations(job)] == ["not ceased", "ceased"]
    # --force: the person's call, nothing asked.
    cluster.set(str(job.submissions()[-1]["slurm_job_id"]), JobState="NODE_FAIL")
    answer.write_text("1")
    forced = CliRunner().invoke(cli.main, ["resubmit", "--force", job.id])
    assert forced.exit_code == 0, forced.output
    assert len(cluster.sbatch_calls()) == 3 and len(cessations(job)) == 2
