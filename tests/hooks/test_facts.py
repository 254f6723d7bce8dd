"""Facts: host lists, the O_NOFOLLOW write chain, trusted reads, grouping, the survivor scan."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_dispatch.node import facts

from ..fakes.hooks import dying_after, record, state_dir


@pytest.mark.parametrize(
    "text,names",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1-2,5],gpu01", ["n1", "n2", "n5", "gpu01"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("(null)", []),
        ("", []),
        ("a,b", ["a", "b"]),
    ],
)
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert facts.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[a-b]", "n[3-1]"])
def test_bad_hostlist(text: str) -> None:
    with pytest.raises(ValueError):
        facts.expand_hostlist(text)


def test_written_fact_modes_owners_and_reading(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    name = facts.write_fact(state, 1234, 2345, "77", "start", "n1", {"time": 1.0, "restart": 0})
    base = Path(state)
    for path, mode, gid in (
        (base / "facts", 0o711, 0),
        (base / "facts/1234", 0o750, 2345),
        (base / "facts/1234/77", 0o750, 2345),
        (base / "facts/1234/77" / name, 0o640, 2345),
    ):
        info = path.lstat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (mode, 0, gid), path
    found, problems = facts.read_job_facts(state, 1234, "77")
    assert problems == [] and found[0]["kind"] == "start" and found[0]["node"] == "n1"


def test_names_are_plain(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    for bad in ("../x", ".hidden", "a/b", "", "x\n"):
        with pytest.raises(facts.FactError):
            facts.write_fact(state, 1, 1, bad, "start", "n1", {})
        with pytest.raises(facts.FactError):
            facts.write_fact(state, 1, 1, "1", "start", bad, {})


@pytest.mark.parametrize("where", ["facts", "facts/1000", "facts/1000/100"])
def test_planted_symlink_is_never_followed(tmp_path: Path, where: str) -> None:
    state, _ = state_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = Path(state) / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside)
    with pytest.raises(facts.FactError, match="cannot open|refus"):
        record(state, "start", "n1", time=1.0, restart=0)
    assert list(outside.iterdir()) == []


def test_group_writable_chain_is_refused(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    (Path(state) / "facts").mkdir(mode=0o777)
    os.chmod(Path(state) / "facts", 0o777)
    with pytest.raises(facts.FactError, match="writable by group or others"):
        record(state, "start", "n1", time=1.0, restart=0)


def test_reader_reports_garbled_and_skips_fifos(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    record(state, "start", "n1", time=1.0, restart=0)
    job = Path(state) / "facts/1000/100"
    (job / "end.n1.0000000000000001aaaaaaaa").write_text("{not json")
    os.mkfifo(job / "end.n1.0000000000000002bbbbbbbb")
    found, problems = facts.read_job_facts(state, 1000, "100")
    assert [f["kind"] for f in found] == ["start"]
    assert any("garbled" in p for p in problems)
    assert any("not a regular file" in p for p in problems)


def test_group_executions_ties_end_to_start_not_to_restart_variable(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    start = record(state, "start", "n1", time=1.0, restart=0)
    # The late Epilog of a rejoined node reports restart 1; its start says 0.
    record(
        state,
        "end",
        "n1",
        time=5.0,
        restart=1,
        start_token=start.split(".")[-1],
        survivors=[],
        scan_error=None,
    )
    record(state, "ctld-start", "slurmctld", time=0.5, restart=0, nodes=["n1"])
    record(
        state,
        "ctld-end",
        "slurmctld",
        time=3.0,
        restart=0,
        nodes=["n1"],
        slurm={"SLURM_JOB_EXIT_CODE2": "0:0"},
    )
    record(state, "ctld-start", "slurmctld", time=4.0, restart=1, nodes=["n2"])
    executions = facts.execution_facts("100", state, 1000)
    assert [e["restart"] for e in executions] == [0, 1]
    first = executions[0]
    assert first["nodes"]["n1"]["ceased"] is True and first["allocated"] == ["n1"]
    assert first["end"]["requeued"] is True and first["end"]["exit_code"] == "0:0"
    assert executions[1]["allocated"] == ["n2"] and executions[1]["end"] is None


def _spawn_escaped(job_id: str, restart: str | None) -> int:
    """A process of 'job_id' that escaped with setsid and a double fork; returns its pid."""
    env = {"SLURM_JOB_ID": job_id, "PATH": "/usr/bin:/bin"}
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = restart
    out = subprocess.run(
        ["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.strip())


def test_scan_finds_an_escaped_process_of_the_right_execution() -> None:
    job_id = f"9{os.getpid()}"
    pid = _spawn_escaped(job_id, "2")
    try:
        found = facts.scan_survivors({job_id: 2})[job_id]
        assert [s["pid"] for s in found] == [pid]
        assert found[0]["cmdline"] == "sleep 60" and found[0]["ppid"] == 1 or found[0]["ppid"]
        assert facts.scan_survivors({job_id: 1})[job_id] == []
        assert facts.scan_survivors({job_id: None})[job_id][0]["pid"] == pid
    finally:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while facts.scan_survivors({job_id: 2})[job_id] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert facts.scan_survivors({job_id: 2})[job_id] == []


def test_scan_ignores_slurm_hooks_running_as_root_and_itself() -> None:
    job_id = f"8{os.getpid()}"
    env = {"SLURM_JOB_ID": job_id, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
    proc = subprocess.Popen(["sleep", "60"], env={**env, "PATH": "/usr/bin:/bin"})
    try:
        assert facts.scan_survivors({job_id: None})[job_id] == []
    finally:
        proc.kill()
        proc.wait()
    code = (
        "import os, json; from slurm_dispatch.node import facts; "
        f"print(json.dumps(facts.scan_survivors({{'{job_id}': None}})))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        env={"SLURM_JOB_ID": job_id},
        check=True,
    ).stdout
    assert json.loads(out) == {job_id: []}


def test_dumps_equals_json_dumps() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(st.characters(exclude_categories=["Cs"])),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )

    @settings(max_examples=300, deadline=None)
    @given(values)
    def check(value: object) -> None:
        text = facts.dumps(value)
        assert json.loads(text) == value
        assert text == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    check()


def test_fact_names_parse_from_the_right(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    name = facts.write_fact(state, 1, 1, "5", "start", "node.with.dots", {"restart": 3})
    assert facts.parse_name(name) == ("start", "node.with.dots", "3", name.split(".")[-1])
    assert facts.parse_name("start.n1.x") is None


def test_facts_carry_a_format_version_and_older_facts_read_as_version_1(tmp_path: Path) -> None:
    state, _ = state_dir(tmp_path)
    name = record(state, "start", "n1", time=1.0, restart=0)
    job = Path(state) / "facts/1000/100"
    assert json.loads((job / name).read_text())["v"] == facts.FORMAT_VERSION == 1
    # Written before versions existed (no "v"): read as version 1.
    old = dict(json.loads((job / name).read_text()), node="n2", token="0000000000000001aaaaaaaa")
    del old["v"]
    (job / "start.n2.0.0000000000000001aaaaaaaa").write_text(json.dumps(old))
    # A newer writer's format is named as a problem, never used as evidence.
    newer = dict(old, v=2, node="n3", token="0000000000000002bbbbbbbb")
    (job / "start.n3.0.0000000000000002bbbbbbbb").write_text(json.dumps(newer))
    found, problems = facts.read_job_facts(state, 1000, "100")
    assert sorted(f["node"] for f in found) == ["n1", "n2"]
    assert len(problems) == 1 and "format version 2" in problems[0], problems


def test_fact_error_is_in_the_one_error_tree() -> None:
    from slurm_dispatch import errors
    from slurm_dispatch.node import factstore

    assert facts.FactError is errors.FactError is factstore.FactError
    assert issubclass(facts.FactError, errors.DispatchError)


# -- a writer killed at any step (CI, 2026-12-03: the 24.11 tier's first job) --------------
#
# A hook past its HookTimeout is ended where it stands (its watchdog, then the parent's
# SIGKILL).  The first job of a fresh sandbox, slow on a loaded machine, left facts/<uid> as
# its mkdir made it (root:root 0700): every later writer took the folder as it found it, and
# the user could read none of its facts again (dispatch-cease: "cannot open .../facts/1008:
# Permission denied", 19 tests of the 24.11 tier).

_CRASHING_WRITER = (
    """
import os, sys
from slurm_dispatch.node import factstore
state, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
"""
    + dying_after(
        "int(sys.argv[4])",
        ("mkdir", "open", "fchown", "fchmod", "write", "rename", "link", "unlink"),
    )
    + """
factstore.write_fact(state, uid, gid, "77", "start", "n1", {"time": 1.0, "restart": 0})
os._exit(0)
"""
)

_USER_READER = """
import json, os, sys
from slurm_dispatch.node import factstore
state, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.setgroups([]); os.setgid(gid); os.setuid(uid)
found, problems = factstore.read_job_facts(state, uid, "77")
print(json.dumps({"nodes": sorted(f["node"] for f in found), "problems": problems}))
"""


def _as_subprocess(program: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program, *map(str, args)],
        text=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="writes facts as root and reads them as a user")
def test_a_writer_killed_at_any_step_leaves_the_facts_whole_and_the_users_to_read() -> None:
    import shutil
    import tempfile

    uid, gid = 54321, 54322
    step = 1
    while True:
        # Under /var/tmp, passable by everyone (pytest's own folder is root's 0700).
        base = Path(tempfile.mkdtemp(prefix="facts-killed-", dir="/var/tmp"))
        try:
            base.chmod(0o755)
            state, _ = state_dir(base)
            writer = _as_subprocess(_CRASHING_WRITER, state, uid, gid, step)
            assert writer.returncode in (0, 3), writer.stderr
            # The next hook for the job writes as ever, and the user reads every whole fact.
            facts.write_fact(state, uid, gid, "77", "end", "n2", {"time": 2.0, "restart": 0})
            root = Path(state)
            for path, mode, group in (
                (root / "facts", 0o711, 0),
                (root / "facts/54321", 0o750, gid),
                (root / "facts/54321/77", 0o750, gid),
            ):
                info = path.lstat()
                assert (stat.S_IMODE(info.st_mode), info.st_gid) == (mode, group), (step, path)
            reader = _as_subprocess(_USER_READER, state, uid, gid)
            assert reader.returncode == 0, (step, reader.stderr)
            read = json.loads(reader.stdout)
            whole = ["n1", "n2"] if writer.returncode == 0 else None
            assert read["problems"] == [], (step, read)
            assert read["nodes"] in (["n2"], ["n1", "n2"]) and (
                whole is None or read["nodes"] == whole
            ), read
        finally:
            shutil.rmtree(base, ignore_errors=True)
        if writer.returncode == 0:
            break
        step += 1
    assert step > 5  # every step of the write was a place to die


def test_a_second_fact_of_the_same_name_is_refused_and_the_first_kept(tmp_path: Path) -> None:
    # Facts are written once: an end takes its start's token, so two ends of one start (two
    # EpilogSlurmctlds, or Epilogs, that found the same open start) have one name.  The first
    # must stand; a rename onto it would replace the survivors it found with another's none.
    _second_end_refused_first_kept(state_dir(tmp_path)[0])


def _second_end_refused_first_kept(state: str) -> None:
    token = facts.new_token()
    body = {"time": 1.0, "restart": 0}
    facts.write_fact(
        state, 1234, 2345, "77", "end", "n1", {**body, "survivors": [{"pid": 4242}]}, token=token
    )
    with pytest.raises(facts.FactError, match="exists"):
        facts.write_fact(
            state, 1234, 2345, "77", "end", "n1", {**body, "survivors": []}, token=token
        )
    found, problems = facts.read_job_facts(state, 1234, "77")
    assert problems == [] and [f["survivors"] for f in found] == [[{"pid": 4242}]]
    assert sorted(os.listdir(Path(state) / "facts/1234/77")) == [f"end.n1.0.{token}"]


def test_a_sites_private_facts_folder_stays_private_whatever_the_writers_find_below_it(
    tmp_path: Path,
) -> None:
    # The admin guide's privacy choice: facts/ 0700, dispatch-cease only as root.  The repair
    # of a half-made folder (private, where it should be open to the job's group) is for the
    # per-user and per-job folders a killed writer left; it must never open facts/ itself.
    state, _ = state_dir(tmp_path)
    top = Path(state) / "facts"
    top.mkdir(mode=0o700)
    (top / "1234").mkdir(mode=0o700)  # as a writer killed after its mkdir left it
    old = os.umask(0o777)
    try:
        facts.write_fact(state, 1234, 2345, "77", "start", "n1", {"time": 1.0, "restart": 0})
    finally:
        os.umask(old)
    assert stat.S_IMODE(top.lstat().st_mode) == 0o700
    for path in (top / "1234", top / "1234/77"):
        info = path.lstat()
        assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o750, 2345), path
    found, problems = facts.read_job_facts(state, 1234, "77")
    assert problems == [] and len(found) == 1


@pytest.mark.parametrize("refusal", ["EPERM", "EOPNOTSUPP", "EMLINK", "ENOSYS"])
def test_a_file_system_without_hard_links_still_takes_each_fact_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    # StateDir on a file system that has no hard links: the kernel's answer for one without
    # a link operation is EPERM; a FUSE file system whose daemon has none answers ENOSYS
    # (libfuse's default for an operation not implemented), where the fact was refused, and every
    # fact of that node.
    import errno

    state, _ = state_dir(tmp_path)

    def no_link(*args: object, **kwargs: object) -> None:
        raise OSError(getattr(errno, refusal), os.strerror(getattr(errno, refusal)))

    monkeypatch.setattr(os, "link", no_link)
    _second_end_refused_first_kept(state)
