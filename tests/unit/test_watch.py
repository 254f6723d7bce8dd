"""``dispatch watch``: which saves look whole, step order, a restarted watch, the first
store error, signal forwarding to the command, the last scans, and bad input.

The rules are tested on :class:`Watcher` directly; the process behaviour runs the real
``dispatch watch`` as a subprocess on real folders (no mocks), polling for conditions.  A save
that looks whole is published at the second scan that finds it unchanged (the first one only
records it): ``two_scans`` models that; test_watch_complete.py tests the rule itself (writers,
changes between scans, durability).
"""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from slurm_dispatch.checkpoint import execdir, model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import OutOfBounds, UsageError
from slurm_dispatch.execution.saverules import SaveRule, compile_pattern, file_complete
from slurm_dispatch.execution.watch import Published, Watcher, WatchLoop

DISPATCH = [sys.executable, "-m", "slurm_dispatch.cli.dispatch"]

EPOCH = model.Epoch(0, 1, 0).value


def watcher(
    root: Path, folder: Path, rule: SaveRule | None = None, lines: list[str] | None = None
) -> Watcher:
    sink = lines if lines is not None else []
    return Watcher(str(root), str(folder), EPOCH, rule or SaveRule.make(), sink.append)


def hf_save(folder: Path, step: int, state: str = '{"global_step": 1}') -> Path:
    """A Hugging Face-shaped save: weights first, trainer_state.json last."""
    save = folder / f"checkpoint-{step}"
    save.mkdir()
    (save / "model.safetensors").write_bytes(b"w" * 100)
    (save / "trainer_state.json").write_text(state)
    return save


def two_scans(w: Watcher) -> list[int]:
    """The steps a first scan, which sees the saves, then a second, which finds them the
    same, publish; the first must publish none of them."""
    assert w.scan() == [], "published at the first scan that saw it"
    return [p.step for p in w.scan()]


def published(root: Path) -> list[tuple[int, str]]:
    return [(f.step, os.path.basename(f.path)) for f in store.list_publications(str(root))]


def torch_like_zip(members: int = 3, size: int = 50_000) -> bytes:
    """The layout torch.save writes: a zip of stored members, central directory last."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for i in range(members):
            archive.writestr(f"archive/data/{i}", os.urandom(size))
    return buffer.getvalue()


# ---- what complete means ---------------------------------------------------------------


def test_a_folder_waits_for_its_whole_ready_file(root: Path, folder: Path) -> None:
    w = watcher(root, folder)
    save = folder / "checkpoint-5"
    save.mkdir()
    (save / "model.safetensors").write_bytes(b"w")
    assert w.scan() == []
    # Trainer opens trainer_state.json, then writes it: empty, then cut, are not complete.
    (save / "trainer_state.json").write_text("")
    assert w.scan() == []
    (save / "trainer_state.json").write_text('{"global_step": ')
    assert w.scan() == []
    (save / "trainer_state.json").write_text('{"global_step": 5}')
    assert two_scans(w) == [5]
    assert published(root) == [(5, "checkpoint-5")]


def test_a_save_removed_before_it_was_published_is_no_longer_waited_for(
    root: Path, folder: Path
) -> None:
    w = watcher(root, folder)
    save = hf_save(folder, 3)
    assert w.scan() == [] and w.waiting() == ["checkpoint-3"]
    (save / "model.safetensors").unlink()
    (save / "trainer_state.json").unlink()
    save.rmdir()
    assert w.scan() == [] and w.waiting() == []
    assert published(root) == []


def test_ready_names_another_last_file(root: Path, folder: Path) -> None:
    w = watcher(root, folder, SaveRule.make(ready="DONE"))
    save = hf_save(folder, 3)
    assert w.scan() == [] and w.scan() == [], "trainer_state.json is not the ready file"
    (save / "DONE").write_text("x")
    assert two_scans(w) == [3]


def test_files_named_by_step_are_saves_when_whole(root: Path, folder: Path) -> None:
    w = watcher(root, folder)
    # (hpc_ckpt_<n>.ckpt is a save whose step is inside it: test_watch_hpc.py)
    for name in (
        "last.ckpt",
        "global_step=7.ckpt",
        ".tmp-step=9.ckpt",
        "checkpoint-4",  # checkpoint-N must be a folder
        "step=3.pt",  # not Lightning's extension: --pattern says what else is a save
        "epoch=0-step=5.ckpt.dispatch-manifest.json",
    ):  # the integrations' manifest
        (folder / name).write_bytes(b"x")
    (folder / "epoch=0-step=60.ckpt").write_bytes(b"")  # created, not yet written
    (folder / "epoch=1-step=50.ckpt").mkdir()  # a sharded save (several ranks): not watch's
    assert w.scan() == [] and w.scan() == []
    (folder / "epoch=0-step=60.ckpt").write_bytes(b"legacy pickle, not a zip")
    assert two_scans(w) == [60]
    assert published(root) == [(60, "epoch=0-step=60.ckpt")]


def test_a_zip_copied_into_place_is_published_only_when_whole(root: Path, folder: Path) -> None:
    """fsspec's commit (Lightning's _atomic_save) is a rename on one file system but a copy
    into the final name when $TMPDIR is on another: the .ckpt is visible while it grows.
    A torch.save zip is whole once its end record ends the file."""
    data = torch_like_zip()
    w = watcher(root, folder)
    target = folder / "epoch=0-step=70.ckpt"
    for cut in (4, len(data) // 2, len(data) - 23, len(data) - 1):
        target.write_bytes(data[:cut])
        for _ in range(2):  # unchanged across two scans, and still not whole
            assert w.scan() == [], f"published a zip cut at {cut} of {len(data)} bytes"
    target.write_bytes(data)
    assert two_scans(w) == [70]


def test_a_zip64_end_record_is_whole(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # > 65,535 members: zip64 end records
        for i in range(65_536):
            archive.writestr(str(i), b"")
    data = buffer.getvalue()
    assert data[-42:-38] == b"PK\x06\x07", "not a zip64 archive"
    path = tmp_path / "step=1.ckpt"
    path.write_bytes(data)
    assert file_complete(str(path))
    path.write_bytes(data[:-30])
    assert not file_complete(str(path))


def test_pattern_with_step_placeholder(root: Path, folder: Path) -> None:
    w = watcher(root, folder, SaveRule.make(pattern="model_{step}.[pP]t"))
    for name in ("model_3.pt", "model_4.Pt", "model_5.pt.tmp", "model_x.pt", "checkpoint-9"):
        (folder / name).write_bytes(b"x")
    (folder / "model_8.pt").mkdir()  # a folder needs the ready file
    assert two_scans(w) == [3, 4]
    (folder / "model_8.pt" / "trainer_state.json").write_text("{}")
    assert two_scans(w) == [8]


@pytest.mark.parametrize(
    "pattern, word",
    [
        ("model.pt", "{step} exactly once"),
        ("a{step}b{step}", "{step} exactly once"),
        ("sub/{step}", "no '/'"),
        (".hidden{step}", "not starting with '.'"),
        ("x[{step}", "'[' without its ']'"),
    ],
)
def test_bad_patterns_are_named(pattern: str, word: str) -> None:
    with pytest.raises(UsageError) as info:
        compile_pattern(pattern)
    assert f"--pattern {pattern!r}" in str(info.value) and word in str(info.value)


def test_bad_values_are_named(root: Path, folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--ready 'a/b'"):
        SaveRule.make(ready="a/b")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(UsageError, match="'.*elsewhere' is not inside the checkpoint root"):
        Watcher(str(root), str(tmp_path / "elsewhere"), EPOCH, SaveRule.make())
    with pytest.raises(UsageError, match="'.*nope' is not a directory"):
        Watcher(str(tmp_path / "nope"), str(folder), EPOCH, SaveRule.make())
    with pytest.raises(
        UsageError, match="'s3://b/run' is on S3: watch needs the execution's prefix"
    ):
        Watcher("s3://b/run", str(folder), EPOCH, SaveRule.make())
    with pytest.raises(UsageError, match="'gs://b/run': 'gs://' roots are not supported"):
        Watcher("gs://b/run", str(folder), EPOCH, SaveRule.make())
    with pytest.raises(OutOfBounds, match="submission 0"):
        Watcher(str(root), str(folder), 5, SaveRule.make())
    w = watcher(root, folder)
    for interval, timeout in ((0.0, 1.0), (1.0, -2.0), (float("nan"), 1.0)):
        with pytest.raises(UsageError, match="must be a positive number"):
            WatchLoop(w, None, interval, timeout, print)


# ---- order, once, restarts --------------------------------------------------------------


def test_saves_publish_in_step_order_each_once(root: Path, folder: Path) -> None:
    lines: list[str] = []
    w = watcher(root, folder, lines=lines)
    for step in (30, 10, 20):
        hf_save(folder, step)
    (folder / "epoch=0-step=20.ckpt").write_bytes(b"x")  # a second save of step 20
    assert two_scans(w) == [10, 20, 30]
    assert w.scan() == []
    pubs = store.list_publications(str(root))
    made = sorted(pubs, key=lambda f: os.stat(root / "pub" / f.name).st_ctime_ns)
    assert [f.step for f in made] == [10, 20, 30], "created out of step order"
    assert lines == [
        f"published step 10: {folder}/checkpoint-10",
        f"published step 20: {folder}/checkpoint-20",
        f"not publishing step 20: {folder}/epoch=0-step=20.ckpt (step 20 is already published)",
        f"published step 30: {folder}/checkpoint-30",
    ]
    assert len(pubs) == 3


def test_a_restarted_watch_neither_fails_nor_republishes(root: Path, folder: Path) -> None:
    first = watcher(root, folder)
    hf_save(folder, 5)
    hf_save(folder, 10)
    assert two_scans(first) == [5, 10]
    # Cleanup may have pruned the older save meanwhile.
    for part in (folder / "checkpoint-5").iterdir():
        part.unlink()
    (folder / "checkpoint-5").rmdir()
    lines: list[str] = []
    again = watcher(root, folder, lines=lines)
    assert again.scan() == [] and lines == []
    hf_save(folder, 7)  # below the mark: never published, said once
    hf_save(folder, 15)
    assert two_scans(again) == [15]
    assert again.scan() == []
    assert lines == [
        f"not publishing step 7: {folder}/checkpoint-7 (step 10 is already published)",
        f"published step 15: {folder}/checkpoint-15",
    ]
    assert [s for s, _ in published(root)] == [5, 10, 15]


def test_the_mark_is_this_folders_own(root: Path, folder: Path) -> None:
    """Another execution's higher steps (an old run's late saves) do not hold this one back."""
    other = root / "exec" / "b"
    other.mkdir()
    store.publish(str(root), EPOCH, 900, str(hf_save(other, 900)))
    hf_save(folder, 5)
    assert two_scans(watcher(root, folder)) == [5]


def test_a_save_published_by_hand_meanwhile_is_not_an_error(root: Path, folder: Path) -> None:
    lines: list[str] = []
    w = watcher(root, folder, lines=lines)
    assert w.scan() == []
    save = hf_save(folder, 4)
    store.publish(str(root), EPOCH, 4, str(save))
    assert two_scans(w) == [4]
    assert lines == [f"step 4 was already published: {save}"]
    assert len(store.list_publications(str(root))) == 1


# ---- the process: command, signals, last scan, errors ----------------------------------


def watch_env(root: Path, folder: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DISPATCH_CHECKPOINT": str(root),
        "DISPATCH_EXEC_DIR": str(folder),
        "DISPATCH_EPOCH": str(EPOCH),
    }


def start_watch(root: Path, folder: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as err:
        return subprocess.Popen(
            [*DISPATCH, "watch", *args],
            env=watch_env(root, folder),
            stderr=err,
            stdin=subprocess.DEVNULL,
        )


def poll(condition: Callable[[], object], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


CHILD = r"""
import os, signal, sys, time
folder, flag = os.environ["DISPATCH_EXEC_DIR"], sys.argv[1]
seen = open(flag + ".signals", "a", buffering=1)
def got(signum, frame):
    seen.write(signal.Signals(signum).name + "\n")
for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGCONT"):
    signal.signal(getattr(signal, name), got)
def save(step):
    path = os.path.join(folder, "checkpoint-%d" % step)
    os.mkdir(path)
    open(os.path.join(path, "trainer_state.json"), "w").write("{}")
for step in map(int, sys.argv[3:]):
    save(step)
open(flag + ".started", "w").close()
while not os.path.exists(flag + ".go"):
    time.sleep(0.01)
if os.path.exists(flag + ".late"):
    save(int(open(flag + ".late").read()))
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Path]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    yield script


def test_signals_reach_the_command_and_its_status_is_watchs(
    root: Path, folder: Path, child: Path, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    proc = start_watch(
        root,
        folder,
        "--interval",
        "0.05",
        "--",
        sys.executable,
        str(child),
        str(flag),
        "7",
        log=tmp_path / "err",
    )
    try:
        poll(lambda: Path(f"{flag}.started").exists(), "the command to start")
        names = ["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGCONT"]
        for name in names:
            proc.send_signal(getattr(signal, name))
            poll(
                lambda n=name: n in Path(f"{flag}.signals").read_text().split(),  # type: ignore[misc]
                f"{name} forwarded",
            )
        assert proc.poll() is None, "watch ended on a signal meant for its command"
        Path(f"{flag}.go").touch()
        assert proc.wait(timeout=20) == 7
    finally:
        proc.kill()
    assert Path(f"{flag}.signals").read_text().split() == names


def test_the_last_scans_publish_a_save_made_just_before_the_end(
    root: Path, folder: Path, child: Path, tmp_path: Path
) -> None:
    """With an interval of an hour, only the first scan comes before the command's end, and
    it publishes nothing (it sees step 10 once); the last scans, at most a second apart,
    confirm step 10 and then the save the command wrote last."""
    flag = tmp_path / "flag"
    Path(f"{flag}.late").write_text("20")
    hf_save(folder, 10)
    proc = start_watch(
        root,
        folder,
        "--interval",
        "3600",
        "--",
        sys.executable,
        str(child),
        str(flag),
        "0",
        log=tmp_path / "err",
    )
    try:
        poll(lambda: Path(f"{flag}.started").exists(), "the command to start")
        assert published(root) == []
        Path(f"{flag}.go").touch()  # the command saves step 20, then exits at once
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    assert published(root) == [(10, "checkpoint-10"), (20, "checkpoint-20")]
    assert (tmp_path / "err").read_text().splitlines() == [
        f"dispatch watch: published step {s}: {folder}/checkpoint-{s}" for s in (10, 20)
    ]


def test_a_command_killed_by_a_signal_gives_128_plus_it(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    proc = start_watch(root, folder, "--", "/bin/sh", "-c", "kill -KILL $$", log=tmp_path / "err")
    try:
        assert proc.wait(timeout=20) == 128 + signal.SIGKILL
    finally:
        proc.kill()


TERM_ENDS_IT = r"""
import os, signal, sys, time
flag, status = sys.argv[1], sys.argv[2]
def got(signum, frame):
    raise SystemExit(None if status == "none" else int(status))  # as Lightning does on TERM
signal.signal(signal.SIGTERM, got)
signal.signal(signal.SIGUSR1, got)
open(flag + ".started", "w").close()
while True:
    time.sleep(0.01)
"""


@pytest.mark.parametrize(
    "sent, status, expected",
    [
        ("SIGTERM", "none", 128 + signal.SIGTERM),
        ("SIGTERM", "0", 128 + signal.SIGTERM),
        ("SIGTERM", "3", 3),
        ("SIGUSR1", "none", 0),
    ],
)
def test_a_command_that_exits_0_after_a_forwarded_term_is_not_done(
    root: Path, folder: Path, tmp_path: Path, sent: str, status: str, expected: int
) -> None:
    """Lightning turns TERM into SystemExit with no code: under `exec dispatch watch` with
    `--signal=B:TERM@150` the job would end COMPLETED, training unfinished, and the supervisor
    would stop for good.  Watch exits 128+15 instead, and says why; a failure status of the
    command's own stays, and a signal that is not TERM changes nothing."""
    script = tmp_path / "term.py"
    script.write_text(TERM_ENDS_IT)
    flag, err = tmp_path / "flag", tmp_path / "err"
    proc = start_watch(
        root,
        folder,
        "--interval",
        "0.05",
        "--",
        sys.executable,
        str(script),
        str(flag),
        status,
        log=err,
    )
    try:
        poll(lambda: Path(f"{flag}.started").exists(), "the command to start")
        proc.send_signal(getattr(signal, sent))
        assert proc.wait(timeout=20) == expected
    finally:
        proc.kill()
    said = [line for line in err.read_text().splitlines() if "TERM" in line]
    if expected == 128 + signal.SIGTERM:
        assert said == [
            "dispatch watch: the command exited 0 after watch forwarded it TERM: "
            "its work is not done, so watch exits 143 (a failure: the job's "
            "resubmit rule applies, its next execution resumes from the newest "
            "published save)"
        ], err.read_text()
    else:
        assert said == [], err.read_text()


def handles(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_without_a_command_term_ends_after_the_last_scans(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    hf_save(folder, 1)
    proc = start_watch(root, folder, "--interval", "3600", log=tmp_path / "err")
    try:
        poll(lambda: handles(proc.pid, signal.SIGTERM), "watch to handle TERM")
        assert published(root) == []  # at most one scan so far: it saw step 1 once
        hf_save(folder, 3)
        proc.send_signal(signal.SIGUSR1)  # Slurm's warning signal does not end it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    assert published(root) == [(1, "checkpoint-1"), (3, "checkpoint-3")]


class Unwritable:
    """pub/ that nobody, root included, can create a file in: chattr +i as root."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(path)], check=True)
        else:
            path.chmod(0o555)

    def undo(self) -> None:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(self.path)], check=True)
        self.path.chmod(0o755)


@pytest.mark.parametrize("command_status, expected", [(0, 2), (3, 3)])
def test_a_store_error_stops_publishing_and_fails(
    root: Path, folder: Path, child: Path, tmp_path: Path, command_status: int, expected: int
) -> None:
    pub = Unwritable(root / "pub")
    flag = tmp_path / "flag"
    err = tmp_path / "err"
    Path(f"{flag}.late").write_text("2")
    try:
        proc = start_watch(
            root,
            folder,
            "--interval",
            "0.05",
            "--",
            sys.executable,
            str(child),
            str(flag),
            str(command_status),
            "1",
            log=err,
        )
        try:
            poll(lambda: "stopped publishing" in err.read_text(), "the store error")
            pub.undo()  # writable again: watch stays stopped, step 2 is never published
            Path(f"{flag}.go").touch()
            assert proc.wait(timeout=20) == expected
        finally:
            proc.kill()
    finally:
        pub.undo()
    text = err.read_text()
    assert f"dispatch watch: stopped publishing: cannot create '{root}/pub/" in text, text
    assert published(root) == []
    assert stat.S_ISDIR(os.stat(root / "pub").st_mode)


def test_without_a_command_a_store_error_exits_2_at_once(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    hf_save(folder, 1)
    pub = Unwritable(root / "pub")
    try:
        proc = start_watch(root, folder, "--interval", "0.05", log=tmp_path / "err")
        try:
            assert proc.wait(timeout=20) == 2
        finally:
            proc.kill()
    finally:
        pub.undo()
    assert "stopped publishing: cannot create" in (tmp_path / "err").read_text()


@pytest.mark.parametrize(
    "args, env, word",
    [
        (["--pattern", "model.pt"], {}, "--pattern 'model.pt' must hold {step}"),
        (["--interval", "0"], {}, "--interval 0.0 must be a positive number"),
        (["--interval", "soon"], {}, "'soon' is not a valid float"),
        (["--dir", "/tmp"], {}, "--dir '/tmp' is outside this execution's folder"),
        (["--", "no-such-command-here"], {}, "command 'no-such-command-here' not found"),
        ([], {"DISPATCH_EPOCH": ""}, "$DISPATCH_EPOCH is required"),
        ([], {"DISPATCH_EPOCH": "12x"}, "$DISPATCH_EPOCH '12x' is not an integer"),
        ([], {"DISPATCH_CHECKPOINT": ""}, "--root is required"),
    ],
)
def test_bad_input_is_named(
    root: Path, folder: Path, args: list[str], env: dict[str, str], word: str
) -> None:
    proc = subprocess.run(
        [*DISPATCH, "watch", *args],
        env={**watch_env(root, folder), **env},
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2 and word in proc.stderr, proc.stderr
    assert not (root / "pub").exists()


def test_a_fifo_is_never_waited_on(root: Path, folder: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: a scan must not."""
    (folder / "checkpoint-1").mkdir()
    os.mkfifo(folder / "checkpoint-1" / "trainer_state.json")
    os.mkfifo(folder / "epoch=0-step=2.ckpt")
    assert watcher(root, folder).scan() == []


class HungWatcher(Watcher):
    """A store that stops answering (a hung mount): its scan never returns by itself."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = threading.Event()

    def scan(self) -> list[Published]:
        self.release.wait(60)
        return super().scan()


def test_a_scan_longer_than_the_timeout_stops_watch(root: Path, folder: Path) -> None:
    lines: list[str] = []
    hung = HungWatcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append)
    hf_save(folder, 1)
    started = time.monotonic()
    assert WatchLoop(hung, None, 0.05, 0.3, lines.append).run() == 2
    assert time.monotonic() - started < 10
    assert lines == [
        f"stopped publishing: a scan of {str(folder)!r} did not finish within 0.3 s (--timeout)"
    ]
    hung.release.set()  # the stuck scan resumes late: it must publish nothing
    poll(
        lambda: not any(t.name == "dispatch-watch-scan" for t in threading.enumerate()),
        "the stuck scan to end",
    )
    assert published(root) == []


def test_a_publication_leaves_the_trainers_own_save_marked(
    root: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that records its own progress (the API, a callback) under watch: watch
    publishing the last save while the loop is inside its next one must not write 'not
    saving' over the loop's mark, or the stall watcher counts the rest of that save."""
    import json

    from slurm_dispatch.execution import steps

    monkeypatch.setattr(steps, "_current", steps._UNSET)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(folder))
    trainer = {
        "step": 10,
        "calls": 10,
        "time": 1.0,
        "saving": True,
        "what": "save",
        "saves": 0,
        "pid": os.getpid() + 100000,
    }
    (folder / execdir.PROGRESS).write_text(json.dumps(trainer))
    w = watcher(root, folder)
    hf_save(folder, 10)
    assert two_scans(w) == [10]
    assert steps.read(str(folder)) == trainer
    (folder / execdir.PROGRESS).write_text(json.dumps({**trainer, "saving": False}))
    hf_save(folder, 20)
    assert two_scans(w) == [20]  # the loop is not in a save: the publication is progress
    assert steps.read(str(folder))["step"] == 20


def test_each_published_save_is_progress_for_the_stall_watcher(
    root: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled job (docs/user-guide.md): watch records the step of each save it publishes, at
    once."""
    from slurm_dispatch.execution import steps

    monkeypatch.setattr(steps, "_current", steps._UNSET)
    monkeypatch.setenv("DISPATCH_LOCAL_DIR", str(folder))
    w = watcher(root, folder)
    hf_save(folder, 10)
    assert two_scans(w) == [10]
    assert steps.read(str(folder))["step"] == 10
    hf_save(folder, 20)
    assert two_scans(w) == [20]
    assert steps.read(str(folder))["step"] == 20  # written at once, not after the interval
    monkeypatch.setattr(steps, "_current", steps._UNSET)
