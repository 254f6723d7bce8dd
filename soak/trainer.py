"""A light soak trainer, run inside a dispatch job with the sandbox's venv Python.

``trainer.py publish``: resume from ``$DISPATCH_RESUME_FROM``, save every SOAK_SAVE_EVERY
steps into ``$DISPATCH_EXEC_DIR`` and publish each save with ``dispatch publish``.
``trainer.py watch``: the same saves (``trainer_state.json`` written last), published by the
``dispatch watch --keep`` the job script runs it under.  ``trainer.py shared``: one mutable
state file in the root (a ``--shared-checkpoint`` job).  ``trainer.py stamp``: reads
``dispatch watch``'s output on stdin and records each publication it reports, as it happens.

Each writes its history (:mod:`history`, copied beside it) into ``$SOAK_HISTORY``, with a
heartbeat every second.  ``SOAK_FAIL`` (a probability per save) makes it exit 3 on purpose.

Two jobs of the soak's cases (:mod:`soak.cases`) break on purpose:
``SOAK_CRASH_AT_START=1`` exits 3 right after its start fact, before any save (a job that never
makes progress); ``SOAK_POISON_STEP=K`` with ``SOAK_POISON_MARK=PATH``: the first execution to
reach step K (the one that creates PATH) writes a file ``poison`` into that save, publishes it
and exits 3, and every execution that loads a save holding ``poison`` exits 3 right after its
start fact (a poisoned save: every resume from it crashes before publishing).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from history import History  # type: ignore[import-not-found]  # noqa: E402  (copied beside it)

from slurm_dispatch.checkpoint import model  # noqa: E402


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def relative(root: str, path: str) -> str:
    return path[len(root.rstrip("/")) + 1 :] if path.startswith(root.rstrip("/") + "/") else path


def chose_at(exec_dir: str) -> float:
    try:
        with open(os.path.join(exec_dir, ".dispatch"), encoding="utf-8") as f:
            return float(json.load(f)["time"])
    except (OSError, ValueError, KeyError):
        return time.time()


def poison_first() -> bool:
    """Whether this execution is the first to reach ``SOAK_POISON_STEP`` (it creates the
    mark): only that one poisons its save, so the saves of later ones are whole."""
    try:
        os.close(os.open(env("SOAK_POISON_MARK"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def beating(hist: History) -> None:
    def loop() -> None:
        while True:
            hist.write("beat")
            time.sleep(1.0)

    threading.Thread(target=loop, daemon=True).start()


def stamp(hist: History, root: str, epoch: int) -> int:
    prefix = "dispatch watch: published step "
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith(prefix):
            step_text, _, path = line[len(prefix) :].strip().partition(": ")
            rel = relative(root, path)
            hist.write(
                "published",
                step=int(step_text),
                path=rel,
                name=model.format_name(epoch, int(step_text), rel),
            )
    return 0


def main(mode: str) -> int:
    root, exec_dir = env("DISPATCH_CHECKPOINT"), env("DISPATCH_EXEC_DIR")
    epoch, attempt = int(env("DISPATCH_EPOCH", "0")), env("DISPATCH_ATTEMPT")
    hist = History(env("SOAK_HISTORY"), attempt)
    if mode == "stamp":
        return stamp(hist, root, epoch)
    task = env("SLURM_ARRAY_TASK_ID")
    shared = mode == "shared"
    resumed = env("DISPATCH_RESUME_FROM")
    state = os.path.join(root, "state")
    step = 0
    if shared and os.path.exists(state):
        with open(state, encoding="utf-8") as f:
            step = int(f.read().strip() or 0)
    loaded = None
    local = ""  # the save loaded (on S3, its local copy)
    if not shared and resumed:
        # dispatch fetch chooses as the integrations do: the launcher's choice, or the previous
        # save of its lineage when that one cannot be loaded (on S3, a local copy, checked).
        local = subprocess.run(
            ["dispatch", "fetch"], check=True, text=True, capture_output=True
        ).stdout.strip()
        if not resumed.startswith("s3://"):
            loaded = local  # the save itself: a folder root's saves are local
        if local:
            with open(os.path.join(local, "weights"), encoding="utf-8") as f:
                step = int(f.read().strip())
    poisoned = bool(local) and os.path.exists(os.path.join(local, "poison"))
    hist.write(
        "start",
        job=env("DISPATCH_JOB"),
        task=int(task) if task else None,
        submission=int(env("DISPATCH_SUBMISSION", "0")),
        epoch=epoch,
        root=root,
        shared=shared,
        resumed=resumed,
        loaded=loaded,
        chose_at=chose_at(env("DISPATCH_STAGE_DIR") or exec_dir),
        slurm_job_id=env("SLURM_JOB_ID"),
        step=step,
    )
    if poisoned or env("SOAK_CRASH_AT_START") == "1":
        why = "resumed from a poisoned save" if poisoned else "crashing before any save"
        hist.write("end", reason=why, step=step)
        return 3
    beating(hist)
    steps, every = int(env("SOAK_STEPS", "60")), int(env("SOAK_SAVE_EVERY", "5"))
    interval, fail = float(env("SOAK_INTERVAL", "1")), float(env("SOAK_FAIL", "0"))
    rng = random.Random(attempt)
    while step < steps:
        time.sleep(interval)
        step += 1
        if step % every:
            continue
        if shared:
            with open(state + ".tmp", "w", encoding="utf-8") as f:
                f.write(str(step))
            os.replace(state + ".tmp", state)
            hist.write("save", step=step, path="state")
        else:
            save = os.path.join(env("DISPATCH_LOCAL_DIR") or exec_dir, f"checkpoint-{step}")
            os.mkdir(save)
            with open(os.path.join(save, "weights"), "w", encoding="utf-8") as f:
                f.write(str(step))
            poison = step == int(env("SOAK_POISON_STEP", "0")) and poison_first()
            if poison:  # every resume from this save crashes before publishing
                with open(os.path.join(save, "poison"), "w", encoding="utf-8") as f:
                    f.write("1")
            with open(os.path.join(save, "trainer_state.json"), "w", encoding="utf-8") as f:
                json.dump({"global_step": step}, f)  # last: watch's "complete"
            rel = relative(root, save)
            hist.write("save", step=step, path=rel, **({"poisoned": True} if poison else {}))
            if mode == "publish":
                name = model.format_name(epoch, step, rel)
                hist.write("publishing", step=step, path=rel, name=name)
                subprocess.run(
                    ["dispatch", "publish", "--step", str(step), save],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                hist.write("published", step=step, path=rel, name=name)
            if poison:
                hist.write("end", reason="poisoned its save", step=step)
                return 3
        if fail and rng.random() < fail:
            hist.write("end", reason="failing on purpose", step=step)
            return 3
    hist.write("end", reason="done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
