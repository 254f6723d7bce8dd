"""``dispatch watch`` where frameworks put their saves: a watched folder that the
framework makes at its first save, and a run that ends having published nothing.

Watcher's rules run directly on real folders; the process behaviour runs the real ``dispatch
watch`` as a subprocess (helpers from test_watch.py)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from slurm_dispatch.errors import StoreError
from slurm_dispatch.execution.saverules import SaveRule
from slurm_dispatch.execution.watch import Watcher, WatchLoop
from tests.unit.test_watch import (
    DISPATCH,
    EPOCH,
    hf_save,
    published,
    torch_like_zip,
    two_scans,
    watch_env,
)

# ---- a watched folder made at the first save -------------------------------------------


def test_a_folder_made_at_the_first_save_is_waited_for(root: Path, folder: Path) -> None:
    """Lightning's ModelCheckpoint(dirpath=...), accelerate and torchtitan make their folder
    at the first save: inside the execution's folder, its absence is the normal start."""
    lines: list[str] = []
    w = Watcher(
        str(root), str(folder / "ckpts"), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder)
    )
    assert w.scan() == [] and w.scan() == []
    assert not w.appeared
    (folder / "ckpts").mkdir()
    hf_save(folder / "ckpts", 3)
    assert two_scans(w) == [3]
    assert w.appeared
    assert lines == [f"published step 3: {folder}/ckpts/checkpoint-3"]


@pytest.mark.parametrize("where", ["a file", "under a file", "not inside the execution's"])
def test_a_watched_folder_that_cannot_come_is_still_an_error(
    root: Path, folder: Path, where: str
) -> None:
    target = folder / "ckpts"
    if where == "a file":
        target.write_text("not a folder")
    elif where == "under a file":
        (folder / "file").write_text("")
        target = folder / "file" / "ckpts"
    else:
        target = root / "exec" / "other"
    w = Watcher(str(root), str(target), EPOCH, SaveRule.make(), exec_dir=str(folder))
    with pytest.raises(StoreError, match=f"cannot list the watched folder '{target}'"):
        w.scan()


def test_a_folder_that_appears_then_goes_is_an_error(root: Path, folder: Path) -> None:
    w = Watcher(str(root), str(folder / "ckpts"), EPOCH, SaveRule.make(), exec_dir=str(folder))
    (folder / "ckpts").mkdir()
    assert w.scan() == []
    (folder / "ckpts").rmdir()
    with pytest.raises(StoreError, match="No such file or directory"):
        w.scan()


def test_watch_publishes_into_a_folder_the_command_makes(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    save = folder / "ckpts" / "checkpoint-4"
    proc = subprocess.run(
        [
            *DISPATCH,
            "watch",
            "--interval",
            "0.05",
            "--dir",
            str(folder / "ckpts"),
            "--",
            "sh",
            "-c",
            f"sleep 0.3; mkdir -p {save} && echo '{{}}' > {save}/trainer_state.json",
        ],
        env=watch_env(root, folder),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert published(root) == [(4, "checkpoint-4")]
    assert "never appeared" not in proc.stderr


def test_a_folder_that_never_appeared_is_said_once_at_the_end(root: Path, folder: Path) -> None:
    proc = subprocess.run(
        [
            *DISPATCH,
            "watch",
            "--interval",
            "0.05",
            "--dir",
            str(folder / "ckpts"),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(0.3)",
        ],
        env=watch_env(root, folder),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "never appeared" in line]
    assert said == [
        f"dispatch watch: the watched folder {folder}/ckpts never appeared: nothing was saved there"
    ], proc.stderr


# ---- a run that published nothing is never quiet ---------------------------------------


def run_watch(root: Path, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DISPATCH, "watch", "--interval", "0.05", *args],
        env=watch_env(root, folder),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def lightning_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(torch_like_zip(1, 100))
    return path


def test_a_run_that_wrote_saves_elsewhere_says_so_and_succeeds(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    """`dispatch watch -- python train.py --output_dir ./out`: the saves are outside the
    execution's folder; watch cannot tell them from anything else, but says it published
    nothing and where saves must be."""
    out = tmp_path / "out" / "checkpoint-5"
    proc = run_watch(
        root, folder, "--", "sh", "-c", f"mkdir -p {out} && echo '{{}}' > {out}/trainer_state.json"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"dispatch watch: published nothing: no complete save was found in {folder}; saves "
        "must be written there (at most 4 names below it), named checkpoint-<N>/ (holding its "
        "--ready file, 'trainer_state.json'), checkpoint_<N>/ (accelerate's, holding "
        "'random_states_0.pkl'), step-<N>/ (a torch.distributed.checkpoint save), "
        "*step=<N>*.ckpt or hpc_ckpt_<n>.ckpt (Lightning's save at the requeue signal)"
    ], proc.stderr


def test_saves_watch_missed_are_named_with_what_finds_them_and_fail(
    root: Path, folder: Path
) -> None:
    (folder / "ckpts").mkdir()
    deep = folder / "logs" / "run" / "version_0" / "more" / "checkpoints" / "epoch=0-step=5.ckpt"
    missed_dir = folder / "elsewhere" / "epoch=0-step=3.ckpt"
    proc = run_watch(
        root,
        folder,
        "--dir",
        str(folder / "ckpts"),
        "--",
        "python3",
        "-c",
        "import sys; sys.exit(0)",
    )
    assert proc.returncode == 0 and "published nothing" in proc.stderr, proc.stderr
    lightning_file(deep)
    lightning_file(missed_dir)
    (folder / "ckpts" / "checkpoint-7").mkdir()  # a custom loop's: no trainer_state.json
    (folder / "ckpts" / "checkpoint-7" / "model.pt").write_bytes(b"w")
    (folder / ".hidden" / "checkpoint-9").mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"w")  # no step: not a save
    proc = run_watch(root, folder, "--dir", str(folder / "ckpts"), "--", "true")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(
        f"dispatch watch: published nothing: no complete save was "
        f"found in {folder}/ckpts; saves must be written there (at "
        f"most 4 names below it), inside this execution's folder "
        f"{folder}, named "
    )
    assert lines[1:] == [
        f"dispatch watch: never published: {folder}/ckpts/checkpoint-7 (it never held a whole "
        "trainer_state.json: --ready NAME names the file its writer writes last)",
        f"dispatch watch: never published: {missed_dir} (--dir {missed_dir.parent} would "
        "have found it)",
        f"dispatch watch: never published: {deep} (--dir {deep.parent} would have found it)",
        "dispatch watch: 3 save(s) above were never published: watch exits non-zero (2 when "
        "the command succeeded), so the job is a failure (the resubmit rule applies), not a "
        "completed job whose work nobody can resume",
    ], proc.stderr
    assert published(root) == []


def test_saves_behind_a_symlinked_folder_are_named_and_fail(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    """`ln -s /scratch/$USER/run "$DISPATCH_EXEC_DIR/lightning_logs"`: watch never follows a
    symlink, so nothing is published; the saves behind it are named, and the run fails."""
    scratch = tmp_path / "scratch"
    save = lightning_file(scratch / "version_0" / "checkpoints" / "epoch=0-step=5.ckpt")
    (folder / "lightning_logs").symlink_to(scratch)
    (folder / "loop").symlink_to(folder)  # a symlink back up is looked through once, not for ever
    shown = folder / "lightning_logs" / "version_0" / "checkpoints" / save.name
    proc = run_watch(root, folder, "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[1:] == [
        f"dispatch watch: never published: {shown} (behind the symlink {folder}/lightning_logs "
        f"-> {scratch}, which watch never follows: write the saves into the execution's "
        "folder itself)",
        "dispatch watch: 1 save(s) above were never published: watch exits non-zero (2 when "
        "the command succeeded), so the job is a failure (the resubmit rule applies), not a "
        "completed job whose work nobody can resume",
    ], proc.stderr
    assert published(root) == []


def test_a_pattern_that_misses_the_saves_is_named(root: Path, folder: Path) -> None:
    hf_save(folder, 3)
    proc = run_watch(root, folder, "--pattern", "model_{step}.pt", "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert (
        f"dispatch watch: never published: {folder}/checkpoint-3 (--pattern "
        "'model_{step}.pt' does not match it; without --pattern watch takes it for a "
        "save)"
    ) in proc.stderr.splitlines(), proc.stderr


def test_a_command_that_failed_keeps_its_status(root: Path, folder: Path) -> None:
    (folder / "checkpoint-7").mkdir()
    (folder / "checkpoint-8").write_bytes(b"a file")
    proc = run_watch(root, folder, "--", "sh", "-c", "exit 5")
    assert proc.returncode == 5, proc.stderr
    assert f"never published: {folder}/checkpoint-7 (it never held" in proc.stderr
    assert (
        f"never published: {folder}/checkpoint-8 (a file, where watch takes a folder of "
        "that name for a save: --pattern 'checkpoint-{step}' takes it)"
    ) in proc.stderr


def test_a_save_still_being_written_at_the_end_is_not_counted(root: Path, folder: Path) -> None:
    """It is named as still being written; nothing else is wrong with the run."""
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    save = folder / "epoch=0-step=4.ckpt"
    save.write_bytes(torch_like_zip(1, 100))
    with open(save, "ab"):  # held open for writing by this process, past the end
        assert WatchLoop(w, ["true"], 0.05, 0.5, lines.append).run() == 0
    assert lines[0].startswith("not publishing step 4 yet: process ")  # the writer, once
    assert lines[1:-1] == [
        f"not publishing {save}: still being written 0.5 s (--timeout) after the end"
    ], lines
    assert lines[-1].startswith("published nothing: "), lines


# ---- saves where the frameworks put them by default -------------------------------------


def accelerate_save(folder: Path, index: int, last: bool = True) -> Path:
    """accelerate's save_state with automatic naming: checkpoints/checkpoint_<i>/, its RNG
    states written last."""
    save = folder / "checkpoints" / f"checkpoint_{index}"
    save.mkdir(parents=True)
    (save / "model.safetensors").write_bytes(b"w" * 100)
    (save / "optimizer.bin").write_bytes(b"o" * 100)
    if last:
        (save / "random_states_0.pkl").write_bytes(b"r" * 10)
    return save


def dcp_save(path: Path) -> Path:
    """A torch.distributed.checkpoint save, as torchtitan's CheckpointManager makes one."""
    import torch
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.arange(8.0)}, checkpoint_id=str(path), no_dist=True)
    return path


def test_lightnings_default_layout_is_found(root: Path, folder: Path) -> None:
    """ModelCheckpoint without a dirpath under Trainer(default_root_dir=$DISPATCH_EXEC_DIR):
    lightning_logs/version_0/checkpoints/epoch=E-step=S.ckpt, 4 names deep."""
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    assert w.scan() == []  # lightning_logs/ is made later: entered when it appears
    checkpoints = folder / "lightning_logs" / "version_0" / "checkpoints"
    save = lightning_file(checkpoints / "epoch=0-step=5.ckpt")
    lightning_file(checkpoints / "last.ckpt")  # no step: never a save
    (folder / "lightning_logs" / "version_0" / "hparams.yaml").write_text("{}")
    assert two_scans(w) == [5]
    lightning_file(checkpoints / "epoch=1-step=10.ckpt")
    assert two_scans(w) == [10]
    assert published(root) == [(5, save.name), (10, "epoch=1-step=10.ckpt")]
    assert lines[0] == f"published step 5: {save}"


def test_accelerates_automatic_naming_waits_for_its_rng_states(root: Path, folder: Path) -> None:
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make())
    save = accelerate_save(folder, 0, last=False)
    assert w.scan() == [] and w.scan() == [] and w.scan() == []
    (save / "random_states_0.pkl").write_bytes(b"r" * 10)
    assert two_scans(w) == [0]
    accelerate_save(folder, 1)
    assert two_scans(w) == [1]
    # --ready names every save folder's last file, accelerate's too
    other = Watcher(str(root), str(folder / "other"), EPOCH, SaveRule.make(ready="done"))
    (folder / "other").mkdir()
    save = accelerate_save(folder / "other", 5)
    assert other.scan() == [] and other.scan() == []
    (save / "done").write_text("1")
    assert two_scans(other) == [5]


def registered(save: Path, count: int) -> Path:
    """The objects registered for checkpointing, which save_state writes after its RNG
    states: custom_checkpoint_<k>.pkl for k below ``count``."""
    for k in range(count):
        (save / f"custom_checkpoint_{k}.pkl").write_bytes(b"c" * 10)
    return save


def test_an_accelerate_save_cut_before_its_registered_objects_waits_for_them(
    root: Path, folder: Path
) -> None:
    """A trainer killed after random_states_0.pkl and before its custom_checkpoint_<k>.pkl
    leaves a save that looks whole and that every load_state refuses (it counts them): one
    holding fewer of them than another save of its folder is not published, and said once."""
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append)
    registered(accelerate_save(folder, 0), 2)
    assert two_scans(w) == [0]
    cut = registered(accelerate_save(folder, 1), 1)
    assert w.scan() == [] and w.scan() == [] and w.scan() == []
    assert lines[1:] == [
        f"not publishing step 1 yet: {cut} holds 1 of the 2 objects "
        "registered for checkpointing that the other saves of its folder "
        "hold (custom_checkpoint_<k>.pkl, which accelerate writes after "
        "random_states_0.pkl)"
    ], lines
    registered(cut, 2)
    assert two_scans(w) == [1]


def test_an_accelerate_save_holds_the_objects_of_the_save_it_resumed_from(
    root: Path, folder: Path
) -> None:
    """The first save of a resumed execution: the save it resumed from says how many objects
    the trainer registers."""
    source = registered(accelerate_save(root / "exec" / "older", 4), 2)
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), resume_from=str(source))
    cut = registered(accelerate_save(folder, 0), 1)
    assert w.scan() == [] and w.scan() == []
    registered(cut, 2)
    assert two_scans(w) == [0]
    # --ready names the last file itself: the count is not asked.
    given = Watcher(
        str(root),
        str(folder / "given"),
        EPOCH,
        SaveRule.make(ready="custom_checkpoint_0.pkl"),
        resume_from=str(source),
    )
    registered(accelerate_save(folder / "given", 0), 1)
    assert two_scans(given) == [0]


def test_torchtitans_dcp_folder_is_one_save(root: Path, folder: Path) -> None:
    save = dcp_save(folder / "checkpoint" / "step-10")
    (save / "checkpoint-3").mkdir()  # a save's insides are never scanned as further saves
    (save / "checkpoint-3" / "trainer_state.json").write_text("{}")
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make())
    assert two_scans(w) == [10]
    assert published(root) == [(10, "step-10")]


def test_a_saves_insides_symlinks_hidden_and_too_deep_are_never_saves(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    outer = hf_save(folder, 5)
    hf_save(outer, 9)  # inside a save
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hf_save(elsewhere, 11)
    (folder / "link").symlink_to(elsewhere)  # never followed
    (folder / ".cache").mkdir()
    hf_save(folder / ".cache", 12)  # a name starting with "." is never entered
    deep = folder / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    hf_save(deep, 13)  # 5 names deep
    hf_save(deep.parent, 4)  # 4 names deep: found
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make())
    assert two_scans(w) == [4, 5]
    assert w.scan() == []
    assert published(root) == [(4, "checkpoint-4"), (5, "checkpoint-5")]


def test_watch_publishes_lightnings_default_layout_with_no_option(root: Path, folder: Path) -> None:
    checkpoints = folder / "lightning_logs" / "version_0" / "checkpoints"
    proc = run_watch(
        root,
        folder,
        "--",
        sys.executable,
        "-c",
        f"""
import io, os, zipfile
os.makedirs({str(checkpoints)!r})
for step in (5, 10):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"x" * 100)
    open(os.path.join({str(checkpoints)!r}, "epoch=0-step=%d.ckpt" % step), "wb").write(
        buffer.getvalue())
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert published(root) == [(5, "epoch=0-step=5.ckpt"), (10, "epoch=0-step=10.ckpt")]
    assert "published nothing" not in proc.stderr


# ---- a resumed execution whose steps go backwards --------------------------------------

NEXT = EPOCH + 1  # the resumed execution's: its first requeue


def _resumed_from(root: Path, step: int) -> Path:
    """The save an earlier execution published at ``step``, which this one resumed from."""
    (root / "exec" / "old").mkdir()
    save = hf_save(root / "exec" / "old", step)
    from slurm_dispatch.checkpoint import publish as store

    store.publish(str(root), EPOCH, step, str(save))
    return save


@pytest.mark.parametrize("step, said", [(2, True), (7, True), (9, False)])
def test_a_resumed_execution_publishing_at_or_below_its_resume_step_is_said(
    root: Path, folder: Path, step: int, said: bool
) -> None:
    """torchtitan's model-only resume starts again at step 1: its saves outrank the
    further-along one (a newer epoch) without an error.  Watch says so once."""
    source = _resumed_from(root, 7)
    lines: list[str] = []
    w = Watcher(
        str(root), str(folder), NEXT, SaveRule.make(), lines.append, resume_from=str(source)
    )
    hf_save(folder, step)
    assert two_scans(w) == [step]
    hf_save(folder, step + 100 if not said else 1 + step)
    w.scan(), w.scan()
    back = [line for line in lines if "at or below" in line]
    if said:
        assert back == [
            f"step {step} ({folder}/checkpoint-{step}) is at or below step 7 of "
            f"the save this execution resumed from ({source}): the trainer "
            "started counting again, so its saves outrank the further-along one; "
            "make the trainer restore its step (and optimizer) from the save it "
            "loads"
        ]
    else:
        assert back == []


def test_accelerates_save_index_is_said_not_taken_for_a_step(root: Path, folder: Path) -> None:
    source = _resumed_from(root, 7)
    lines: list[str] = []
    w = Watcher(
        str(root), str(folder), NEXT, SaveRule.make(), lines.append, resume_from=str(source)
    )
    save = folder / "checkpoints" / "checkpoint_0"
    save.mkdir(parents=True)
    (save / "random_states_0.pkl").write_bytes(b"r" * 10)
    assert two_scans(w) == [0]
    assert lines[1:] == [
        "checkpoint_0 is accelerate's save index (0, 1, 2 again in every "
        "execution), not a training step: the step is not known and is not "
        "compared across executions"
    ]


def test_dispatch_watch_takes_the_resume_source_from_the_job(root: Path, folder: Path) -> None:
    """The command reads $DISPATCH_RESUME_FROM, as the launcher sets it, and says a step
    below the save it names; publishing goes on and the run ends as the command did."""
    source = _resumed_from(root, 7)
    save = folder / "saved-1"
    proc = subprocess.run(
        [
            *DISPATCH,
            "watch",
            "--interval",
            "0.05",
            "--pattern",
            "saved-{step}",
            "--",
            "sh",
            "-c",
            f"sleep 0.3; mkdir -p {save} && echo '{{}}' > {save}/trainer_state.json",
        ],
        env={
            **watch_env(root, folder),
            "DISPATCH_EPOCH": str(NEXT),
            "DISPATCH_RESUME_FROM": str(source),
        },
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert published(root) == [(7, "checkpoint-7"), (1, "saved-1")]
    assert (
        f"dispatch watch: step 1 ({save}) is at or below step 7 of the save this "
        f"execution resumed from ({source})"
    ) in proc.stderr


def test_a_relative_dir_under_a_symlinked_root_is_the_executions(
    root: Path, folder: Path, tmp_path: Path
) -> None:
    """`cd "$DISPATCH_EXEC_DIR" && dispatch watch --dir ckpts`, the root reached through a
    symlink (a home folder linked to a parallel file system): the working folder Python sees
    is the physical one, which is still this execution's folder."""
    link = tmp_path / "home-ck"
    link.symlink_to(root)
    own = link / "exec" / "a"
    save = own / "ckpts" / "checkpoint-4"
    proc = subprocess.run(
        [
            *DISPATCH,
            "watch",
            "--interval",
            "0.05",
            "--dir",
            "ckpts",
            "--",
            "sh",
            "-c",
            f"mkdir -p {save} && echo '{{}}' > {save}/trainer_state.json",
        ],
        env=watch_env(link, own),
        cwd=own,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert published(root) == [(4, "checkpoint-4")]
    assert proc.stderr.splitlines() == [f"dispatch watch: published step 4: {save}"]


def test_a_published_save_the_trainer_deletes_is_said_once(root: Path, folder: Path) -> None:
    """Lightning's ModelCheckpoint keeps one save by default (save_top_k=1): it deletes the
    save watch published as soon as it has written the next, which watch has not confirmed
    yet; a replacement started then resumes from a save that is gone."""
    lines: list[str] = []
    w = Watcher(str(root), str(folder), EPOCH, SaveRule.make(), lines.append, exec_dir=str(folder))
    where = folder / "lightning_logs" / "version_0" / "checkpoints"
    first = lightning_file(where / "epoch=0-step=3.ckpt")
    assert two_scans(w) == [3]
    lightning_file(where / "epoch=0-step=6.ckpt")
    first.unlink()
    assert w.scan() == [] and w.scan()[0].step == 6
    assert lines[1:] == [
        f"the newest published save {first} was deleted before a newer one was published "
        "(the trainer's own rotation?): a replacement started now would resume from a save "
        "that is gone; keep every save (Lightning's save_top_k -1, accelerate's total_limit "
        "unset, torchtitan's --checkpoint.keep-latest-k 0, Hugging Face's save_total_limit "
        "unset) and let dispatch clean up (--keep)",
        f"published step 6: {where}/epoch=0-step=6.ckpt",
    ]
