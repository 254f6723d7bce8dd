"""``dispatch watch``: publish each complete save of one execution's folder as it appears.

The seed's in-job helper, for saves one process writes, and for the one kind of save that
several ranks write that it can judge: a ``torch.distributed.checkpoint`` (DCP) folder, whose
coordinator renames ``.metadata`` into place only after every rank has written its shards
(saverules says why that is safe and what is still checked).  Other saves several ranks write
publish through the integrations, after a barrier.  A
:class:`Watcher` scans the folder, and below it where the frameworks put their saves by
default (Lightning's ``lightning_logs/version_N/checkpoints/``, accelerate's
``checkpoints/checkpoint_<i>``, torchtitan's ``checkpoint/step-<N>``; Lightning's own SLURM
auto-requeue saves ``hpc_ckpt_<n>.ckpt`` into ``default_root_dir`` at the requeue signal, then
requeues: published at the step read from it, so the requeued execution resumes from it):
every folder whose name is not a save's, at most SCAN_DEPTH names deep, never a save's
insides (a DCP folder stays one save), a symlink, a name starting with "." or, on S3, the
staging folder's copies dispatch fetched (``resume-<n>/``, ``fetched/``: saves already
published, staging.Staging.DOWNLOADS);
:class:`WatchLoop` repeats the scan every interval, runs the user's command as its child,
forwards Slurm's signals to it and scans a last time when it exits.

Invariants:

* Each save is published at most once, in step order, and never one at or below the
  greatest step already published from the folder (read from ``pub/`` by the first scan,
  then kept), so a restarted watch neither fails nor republishes.
* Only complete saves are published.  A save is complete when it looks whole
  (:class:`SaveRule`: a folder's ready file is whole; a file is in place, non-empty and, for
  a zip, ended by its end record), its snapshot (every entry under it, recursively: type,
  size, mtime and ctime in ns, inode) is the same at two consecutive scans and again after it
  is synced, and no process of this user on this node holds one of its files open for
  writing or maps one shared and writable (saverules).  So a save is published one interval
  after it is finished at the earliest, about two at the latest; after the command exits the
  last scans come at most a second apart until no save that looks whole is left unconfirmed
  (at most ``timeout``).  A writer that is on another node, closes every file and changes
  nothing for a whole interval is the case this cannot see: ``--ready`` names a file the
  writer writes last.
* A save is durable before it is published: every file and folder of it, and the folder
  holding it, is fsynced first (the integrations' ``sync_save``), so neither a publication
  nor ``--keep``'s cleanup, which runs only after publications, ever relies on data that has
  not reached the disk.  A save that cannot be synced is a store error.  (On S3 the upload is
  the durable copy.)
* The first error stops publishing for good: nothing is published after it, and the run
  ends non-zero.
* Publishing Lightning's save at the requeue signal (``hpc_ckpt_<n>.ckpt``, which Lightning
  follows with its own ``scontrol requeue``) marks the execution's folder as the callbacks'
  requeue does (``.dispatch-requeued.json``, on a folder root): ``--max-requeues`` budgets
  Slurm's requeues, not the job going on past its time limit.  So does such a save whose
  step, read from it, is already published (the signal came right after a periodic save of
  that step): it is not published, but Lightning requeues all the same.
* A command killed by the USR1 or USR2 that watch forwarded to it (the warning signal) had
  no handler for it: watch says so, naming what installs Lightning's (srun), as the job fails.
* A command that watch forwarded TERM to and that then exits 0 has not finished its work
  (Lightning turns TERM into a clean exit; ``--signal=B:TERM@150`` sends it before the limit):
  watch says so and exits 128+15, so Slurm records a failure and the resubmit rule applies,
  never a completed job the supervisor stops for good.
* A watched folder inside the execution's own folder that does not exist yet is waited for
  (the framework makes it at its first save); if it never appears, the end says so once.  One
  outside the execution's folder, a file in its place, one that cannot be read, or one that
  goes after it appeared is a store error.  A folder inside the execution's only once symlinks
  are resolved (a relative ``--dir`` under a root reached through a symlink) is spelled below
  it as the launcher spells it (:func:`spelled_as_own`).
* Lightning's save at the requeue signal (``hpc_ckpt_<n>.ckpt``, in its ``default_root_dir``)
  found in the execution's folder outside the watched one and never published is named at
  the end, and the run ends non-zero, as for a run that published nothing.
* A run that ends without an error having published nothing of the execution's folder (by
  watch or an integration) is never quiet: it says so, naming the folder watched and the names
  saves must have.  Entries of the execution's folder that the frameworks' default names call
  saves with a step (:func:`step_named`) and that were not published are named each with what
  would have found it (``--dir``, ``--pattern``, ``--ready``; behind a symlink or one
  itself, which watch never follows, writing them into the execution's folder), and the run
  ends non-zero (2
  when the command succeeded): a job whose saves nobody can resume is a failure.  A save
  still being written at the end is said as such and not counted.
* A resumed execution ($DISPATCH_RESUME_FROM) that publishes a step at or below the step of
  the save it resumed from is said once, with the option that restores the step where it is
  known (torchtitan's model-only resume restarts at step 1), and so is accelerate's save
  index, which is never compared with a step (``checkpoint/progress``); publishing goes on.
* The save this watch published last, deleted before a newer one is published (a framework's
  own rotation: Lightning's save_top_k is 1 by default), is said once: a replacement started
  then would resume from a save that is gone.
* A name's meaning never changes, so a name decided once (not a save, or at or below the
  mark) is never looked at again: a scan of a folder of old saves costs one listing, and one
  more per folder entered below it (those are listed at every scan: a save may appear there).

Library code: it never prints; progress and errors go through the ``report`` callback.
"""

from __future__ import annotations

import math
import os
import select
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..checkpoint import execdir, model, progress
from ..checkpoint import publish as store
from ..checkpoint.stores.open import check_root_scheme
from ..errors import AlreadyPublished, DispatchError, OutsideRoot, StoreError, UsageError
from . import staging, steps
from .saverules import (
    ACCELERATE_READY,
    DCP_METADATA,
    DCP_METADATA_TMP,
    FOLDER,
    INSIDE,
    SCAN_DEPTH,
    STEP_INSIDE,
    Entry,
    NotASave,
    SaveRule,
    dcp_only,
    dcp_problem,
    file_complete,
    files_of,
    is_dcp_save,
    looks_whole,
    open_for_writing,
    registered_objects,
    snapshot,
    step_inside,
    step_named,
    symlink_on,
)
from .saves import sync_save
from .staging import StagedUploader

DEFAULT_INTERVAL = 2.0
LAST_GAP = 1.0  # after the command exits: the most seconds between the last scans
DEFAULT_TIMEOUT = 300.0
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGHUP,
    signal.SIGCONT,
)
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # without a command: scan, then stop
_DEFAULT_RULE = SaveRule.make()  # the frameworks' names, whatever --pattern says
_WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)  # --warn-before's: a trainer must handle them
STOPPED_CODE = 2  # watch stopped at an error (and the command, if any, succeeded)
# A command that exits 0 after watch forwarded it TERM did not finish its work (Lightning turns
# TERM into SystemExit with no code): watch exits as if TERM had killed it.
TERMED_CODE = 128 + signal.SIGTERM


@dataclass(frozen=True)
class Published:
    step: int
    path: str
    name: str


class Watcher:
    """Scans one folder and publishes its complete saves; one scan at a time."""

    # --keep K: after a scan that published, cleanup applies the rule of `dispatch gc --keep K`
    # to the root (gc.py); None: no cleanup.  Cleanup's errors are said and end cleanup only.
    keep: Optional[int] = None

    def __init__(
        self,
        root: str,
        folder: str,
        epoch: int,
        rule: SaveRule,
        report: Callable[[str], None] = lambda line: None,
        upload_to: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
        exec_dir: Optional[str] = None,
        resume_from: Optional[str] = None,
    ) -> None:
        # On an s3:// root, ``folder`` is the local staging folder and each complete save is
        # uploaded under ``upload_to`` (the execution's prefix), then published (staging.of).
        # ``exec_dir``: the execution's own folder (its staging folder on S3), when known.
        self.uploader: Optional[StagedUploader] = None
        self.staging: Optional[staging.Staging] = None  # a remote root's (staging.of)
        self.phase: Optional[tuple[float, str]] = None  # (since, what) of a long step in a scan
        self.folder = os.path.abspath(folder)
        self.exec_dir = os.path.abspath(exec_dir) if exec_dir else None
        # A folder inside the execution's own may be made by the framework at its first save
        # (Lightning's ModelCheckpoint(dirpath=...), accelerate's checkpoints/, torchtitan's
        # checkpoint/): until it first appears, its absence is the normal start of a run.
        self.may_be_absent = self.exec_dir is not None and self.folder.startswith(
            self.exec_dir.rstrip("/") + "/"
        )
        self.appeared = False
        if store.is_remote_root(root):
            self.staging = staging.of(root)
            self.uploader = self.staging.watch_uploader(
                root, folder, upload_to, timeout, report, may_be_absent=self.may_be_absent
            )
        check_root_scheme(root)  # gs://, file://...: refused, never taken for a folder's name
        self.root = root if self.uploader else os.path.abspath(root)
        if self.uploader is None and not os.path.isdir(self.root):
            raise UsageError(f"checkpoint root {root!r} is not a directory")
        try:
            if self.uploader is None:
                model.relative_inside(self.root, self.folder)
        except OutsideRoot:
            raise UsageError(
                f"folder {folder!r} is not inside the checkpoint root {root!r}; "
                "publications name saves under the root"
            ) from None
        self.epoch = model.check_epoch_value(epoch)
        self.rule = rule
        self.report = report
        self.mark: Optional[int] = None  # the greatest step published from the folder
        self.cancelled = False  # set by the runner when a scan overran: publish nothing more
        self._settled: set[str] = set()  # names decided for good
        # name -> (is a folder, snapshot) of a save above the mark that looked whole at the
        # last scan; published once the next scan finds it unchanged and unwritten.
        self._seen: dict[str, tuple[bool, tuple[Entry, ...]]] = {}
        self._held: set[str] = set()  # names whose writer has been said once
        self._told: set[str] = set()  # saves whose missing part was said once (DCP, accelerate)
        self._unlisted: set[str] = set()  # folders under it that could not be listed (said)
        # name -> ((size, mtime_ns, inode), step or why unreadable) of a save file whose name
        # holds no step (Lightning's hpc_ckpt_<n>.ckpt), read once it looks whole; and the
        # names whose step could not be read (said once, named at the end).
        self._inside: dict[str, tuple[tuple[int, int, int], int | str]] = {}
        self._unreadable: dict[str, str] = {}
        # The save this execution resumed from ($DISPATCH_RESUME_FROM) and its published step,
        # read at the first publication; a publication at or below it is said once (progress).
        self.resume_from = resume_from or None
        self._resumed_step: Optional[int] = None
        self._progress_said = False
        # accelerate: folder (relative) -> the most registered objects a save published from
        # it held; the save resumed from's, read once (registered_objects).
        self._objects: dict[str, int] = {}
        self._resumed_objects: Optional[int] = None
        # The save this watch published last, and whether its deletion was said (once).
        self._newest: Optional[str] = None
        self._gone_said = False

    def _own_mark(self) -> int:
        if self.uploader is not None:
            return self.uploader.own_mark()
        prefix = self.folder + "/"
        steps = [f.step for f in store.list_publications(self.root) if f.path.startswith(prefix)]
        return max(steps, default=-1)

    def _listing(self) -> list[str]:
        """The entries to decide on, as paths relative to the folder: each one not decided
        yet, at most SCAN_DEPTH names deep.  A folder whose name is not a save's is entered
        (frameworks put their saves a few folders down: Lightning's
        lightning_logs/version_N/checkpoints/), a save never is (its insides are its own), nor a
        symlink or a name starting with "."; such a folder is listed again at every scan, all
        else is decided once."""
        out: list[str] = []
        pending: list[tuple[str, int]] = [("", 1)]
        while pending:
            rel, depth = pending.pop()
            for entry in self._entries(rel):
                name = entry.name
                path = f"{rel}/{name}" if rel else name
                if path in self._settled or not rel and self._fetched(entry.path):
                    continue
                if (
                    depth < SCAN_DEPTH
                    and not name.startswith(".")
                    and self.rule.step_of(name) is None
                    and _is_folder(entry)
                ):
                    pending.append((path, depth + 1))
                else:
                    out.append(path)
        return out

    def _fetched(self, path: str) -> bool:
        """``path`` is (or is in) a copy dispatch fetched into the staging folder (resume-<n>/,
        fetched/): a save already published, never one of this execution's, nor removed."""
        if self.uploader is None or self.staging is None:
            return False
        first = os.path.relpath(path, self.exec_dir or self.folder).split("/", 1)[0]
        return self.staging.DOWNLOADS.fullmatch(first) is not None

    def _entries(self, rel: str) -> list[os.DirEntry[str]]:
        """The entries of the folder (``rel`` "") or of a folder under it."""
        path = os.path.join(self.folder, rel) if rel else self.folder
        try:
            with os.scandir(path) as found:
                entries = list(found)
        except FileNotFoundError as exc:
            if rel or (self.may_be_absent and not self.appeared):
                return []  # not made yet, or removed meanwhile: the next scan looks again
            raise StoreError(
                f"cannot list the watched folder {self.folder!r}: {exc.strerror}"
            ) from None
        except OSError as exc:
            if not rel:
                raise StoreError(
                    f"cannot list the watched folder {self.folder!r}: {exc.strerror}"
                ) from None
            if rel not in self._unlisted:
                self._unlisted.add(rel)
                self.report(f"cannot list {path}: {exc.strerror} (saves under it are not seen)")
            return []
        if not rel:
            self.appeared = True
        return entries

    def scan(self) -> list[Published]:
        """Publish the complete saves above the mark, in step order; return them."""
        first = self.mark is None
        mark = self._own_mark() if self.mark is None else self.mark
        self.mark = mark
        listed = self._listing()
        self._say_newest_gone()
        stable = self._stable(listed, mark, first)
        for name in set(self._seen) - set(listed):
            del self._seen[name]  # removed before it was published
        published = self._publish_stable(stable) if stable else []
        if published and self.keep is not None and not self.cancelled:
            self._clean(self.keep)
        return published

    def _stable(self, listed: list[str], mark: int, first: bool) -> list[tuple[int, str]]:
        """(step, name) of each listed save above ``mark`` found unchanged since the last
        scan; a name that is no save, or a save at or below the mark, is settled (said unless
        this is the first scan)."""
        stable: list[tuple[int, str]] = []
        settled = self._settled
        for name in listed:
            if name in settled:
                continue
            found = self.rule.step_of(os.path.basename(name))
            if found is None:
                settled.add(name)
                continue
            step, kind = found
            if kind == INSIDE:
                inside = self._step_inside(name)
                if inside is None:
                    continue
                step = inside
            if step <= mark:
                self._settle(name)
                if kind == INSIDE:  # Lightning requeues after it all the same
                    self._mark_own_requeue(os.path.join(self.folder, name))
                if not first:
                    self.report(
                        f"not publishing step {step}: {os.path.join(self.folder, name)} "
                        f"(step {mark} is already published)"
                    )
                continue
            if self._unchanged(name, step, kind):
                stable.append((step, name))
        return stable

    def _publish_stable(self, stable: list[tuple[int, str]]) -> list[Published]:
        """Publish the stable saves in step order, but none a process still has open for
        writing (said once per save)."""
        published = []
        writers = self._writers([name for _, name in stable])
        for step, name in sorted(stable):
            if name in writers:
                if name not in self._held:
                    self._held.add(name)
                    pid, path = writers[name]
                    self.report(
                        f"not publishing step {step} yet: process {pid} has {path} open for writing"
                    )
                continue
            done = self._publish(step, name)
            if done is not None:
                published.append(done)
        return published

    def _step_inside(self, name: str) -> Optional[int]:
        """The step read from a save file whose name holds none (Lightning's save at the
        requeue signal, ``hpc_ckpt_<n>.ckpt``) once it looks whole; None before that, or when
        it cannot be read (said once, and named at the end: never published)."""
        path = os.path.join(self.folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is None or not file_complete(path):
            self._seen.pop(name, None)
            return None
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = self._inside.get(name)
        found = known[1] if known is not None and known[0] == key else step_inside(path)
        self._inside[name] = (key, found)
        if isinstance(found, int):
            self._unreadable.pop(name, None)
            return found
        self._seen.pop(name, None)
        if name not in self._unreadable:
            self.report(f"not publishing {path}: its step cannot be read from it: {found}")
        self._unreadable[name] = found
        return None

    def _say_newest_gone(self) -> None:
        """Once per run: the save this watch published last is gone (POSIX; on S3 the upload
        is the save).  A framework's own rotation deletes a save as soon as it has written the
        next (Lightning's save_top_k is 1 by default), before watch can confirm that one: a
        replacement started then resumes from a save that is not there."""
        if (
            self._newest is None
            or self._gone_said
            or self.uploader is not None
            or os.path.lexists(self._newest)
        ):
            return
        self._gone_said = True
        self.report(
            f"the newest published save {self._newest} was deleted before a newer one "
            "was published (the trainer's own rotation?): a replacement started now "
            "would resume from a save that is gone; keep every save (Lightning's "
            "save_top_k -1, accelerate's total_limit unset, torchtitan's "
            "--checkpoint.keep-latest-k 0, Hugging Face's save_total_limit unset) and "
            "let dispatch clean up (--keep)"
        )

    def published_anything(self) -> bool:
        """A publication names a save of this execution's folder (of the watched folder when
        that is not known), by this watch or another publisher (an integration); True when
        the store cannot say."""
        try:
            if self.uploader is not None:
                return self.uploader.own_mark() >= 0
            base = (self.exec_dir or self.folder).rstrip("/") + "/"
            return any(f.path.startswith(base) for f in store.list_publications(self.root))
        except DispatchError:
            return True

    def missed(self) -> list[tuple[str, str]]:
        """(path, the option that would have found it) for each entry of the execution's
        folder (the watched one when that is not known) named as a save with a step by the
        frameworks' defaults that this watch did not take for a save, or took for one that
        never looked whole; what is still being written (said already) is not among them."""
        base = self.exec_dir or self.folder
        waiting = {os.path.join(self.folder, name) for name in self._seen}
        out = []
        for path in step_named(base):
            if path in waiting or self._fetched(path):
                continue
            option = self._option_for(path)
            if option is not None:
                out.append((path, option))
        return out

    def requeue_saves_outside(self) -> list[str]:
        """Lightning's saves at the requeue signal (``hpc_ckpt_<n>.ckpt``, in its
        ``default_root_dir``) in the execution's folder but outside the watched one, which no
        publication names: Lightning requeues the job right after such a save, and the next
        execution resumes from an older one.  On a folder root."""
        if self.uploader is not None or self.exec_dir is None:
            return []
        inside = self.folder.rstrip("/") + "/"
        found = [
            path
            for path in step_named(self.exec_dir)
            if _DEFAULT_RULE.step_of(os.path.basename(path)) == (STEP_INSIDE, INSIDE)
            and not path.startswith(inside)
        ]
        if not found:
            return []
        try:
            published = {f.path for f in store.list_publications(self.root)}
        except DispatchError:
            return []
        return [path for path in found if path not in published]

    def _option_for(self, path: str) -> Optional[str]:
        """What would have made watch publish the save at ``path``; None for a save that
        watch took for one and decided on (said already)."""
        parent, name = os.path.split(path)
        link = symlink_on(path, self.exec_dir or self.folder)
        if link is not None:
            return (
                f"behind the symlink {link} -> {os.readlink(link)}, which watch never "
                "follows: write the saves into the execution's folder itself"
            )
        if os.path.islink(path):
            return (
                f"a symlink to {os.readlink(path)}, which watch never follows: write the "
                "save itself into the execution's folder"
            )
        inside = (path + "/").startswith(self.folder.rstrip("/") + "/")
        if not inside or (path.count("/") - self.folder.rstrip("/").count("/") > SCAN_DEPTH):
            return f"--dir {parent} would have found it"
        rel = os.path.relpath(path, self.folder)
        if any(rel.startswith(f"{folder}/") for folder in self._unlisted):
            return None  # said: a folder above it could not be listed
        found = self.rule.step_of(name)
        if rel in self._unreadable:
            return f"its step could not be read from it: {self._unreadable[rel]}"
        if found is None:
            return (
                f"--pattern {self.rule.pattern!r} does not match it; without --pattern "
                "watch takes it for a save"
            )
        if rel in self._settled:
            if found[1] == FOLDER and os.path.isfile(path) and not os.path.islink(path):
                pattern = name.replace(str(found[0]), "{step}", 1)
                return (
                    f"a file, where watch takes a folder of that name for a save: "
                    f"--pattern {pattern!r} takes it"
                )
            return None  # decided on and said (a FIFO in it, a step already published)
        if os.path.isdir(path) and not os.path.islink(path):
            if dcp_only(name, found[1]) or is_dcp_save(path):
                return "it never was a complete torch.distributed.checkpoint save"
            return (
                f"it never held a whole {self.rule.ready_for(name)}: --ready NAME names "
                "the file its writer writes last"
            )
        return "it never looked whole: a non-empty file, a zip ended by its end record"

    def waiting(self) -> list[str]:
        """The saves above the mark that look whole but are not confirmed yet (seen at one
        scan only, changed since, or still open for writing), by name."""
        return sorted(self._seen)

    def _settle(self, name: str) -> None:
        self._settled.add(name)
        self._seen.pop(name, None)
        self._held.discard(name)

    def _unchanged(self, name: str, step: int, kind: str) -> bool:
        """The save looks whole and its snapshot is the one the last scan took (which it
        keeps otherwise, for the next scan)."""
        path = os.path.join(self.folder, name)
        base = os.path.basename(name)
        is_folder = self._kind(name, kind)
        only_dcp = dcp_only(base, kind)
        if is_folder is None or not looks_whole(
            path, is_folder, self.rule.ready_for(base), only_dcp
        ):
            self._seen.pop(name, None)
            if is_folder:
                self._say_dcp_problem(name, step, path)
            return False
        if self.rule.counts_objects(base) and not self._holds_objects(name, step, path):
            self._seen.pop(name, None)
            return False
        now = self._snapshot(name, step)
        if now is None:
            self._seen.pop(name, None)
            return False
        before = self._seen.get(name)
        self._seen[name] = (is_folder, now)
        return before == (is_folder, now)

    def _holds_objects(self, name: str, step: int, path: str) -> bool:
        """An accelerate save holds as many registered objects as the saves of its folder
        published before it and the save this execution resumed from: a trainer killed after
        its RNG states and before them leaves a save every ``load_state`` refuses.  Said once
        when it does not."""
        if self._resumed_objects is None:
            source = self.resume_from or ""
            self._resumed_objects = (
                registered_objects(source)
                if self.rule.counts_objects(os.path.basename(source.rstrip("/")))
                else 0
            )
        kin = self._objects.get(os.path.dirname(name), 0)
        want, have = max(kin, self._resumed_objects), registered_objects(path)
        if have >= want:
            return True
        if name not in self._told:
            self._told.add(name)
            where = (
                "the other saves of its folder hold"
                if kin == want
                else f"the save this execution resumed from holds ({self.resume_from})"
            )
            self.report(
                f"not publishing step {step} yet: {path} holds {have} of the {want} "
                f"objects registered for checkpointing that {where} "
                f"(custom_checkpoint_<k>.pkl, which accelerate writes after "
                f"{ACCELERATE_READY})"
            )
        return False

    def _say_dcp_problem(self, name: str, step: int, path: str) -> None:
        """Say once what a DCP save whose ``.metadata`` is in place still lacks (a shard not
        there yet on a lagging shared file system, or lost)."""
        if name in self._told or not os.path.lexists(os.path.join(path, DCP_METADATA)):
            return
        problem = dcp_problem(path)
        if problem is not None and not problem.startswith(DCP_METADATA_TMP):
            self._told.add(name)
            self.report(f"not publishing step {step} yet: {path}: {problem}")

    def _snapshot(self, name: str, step: int) -> Optional[tuple[Entry, ...]]:
        path = os.path.join(self.folder, name)
        try:
            return snapshot(path)
        except NotASave as exc:
            self._settle(name)
            self.report(
                f"not publishing step {step}: {path} holds {exc.path}, which is not a "
                "regular file, folder or symlink"
            )
            return None
        except OSError as exc:
            raise StoreError(f"cannot inspect {path!r}: {exc.strerror}") from None

    def _writers(self, names: list[str]) -> dict[str, tuple[int, str]]:
        """name -> (pid, file) for the saves among ``names`` that a process of this user on
        this node still writes (one pass over /proc for them all)."""
        owner: dict[str, str] = {}
        for name in names:
            path = os.path.join(self.folder, name)
            for file in files_of(path, self._seen[name][1]):
                owner[file] = name
        out: dict[str, tuple[int, str]] = {}
        for pid, file in open_for_writing(set(owner)):
            out.setdefault(owner[file], (pid, file))
        return out

    def _clean(self, keep: int) -> None:
        from ..checkpoint import gc

        if gc.listing_lag() > 0:
            # Cleanup waits out the listing lag (ListingLag) before it removes: beside the
            # scans, never in their way (one run at a time; its lines come through report).
            gc.collect_in_background(self.root, keep, self.report)
            return
        try:
            done = gc.collect(self.root, keep)
        except DispatchError as exc:
            self.keep = None  # publishing goes on; a cleanup that failed once is not retried
            self.report(f"cleanup stopped (saves are still published): {exc}")
            return
        for removal in done.removals:
            if not removal.skipped:
                self.report(f"removed {removal.kind} {removal.path} ({removal.bytes} bytes)")

    def _kind(self, name: str, kind: str) -> Optional[bool]:
        """True for a folder save, False for a file save, None while it is absent; an entry
        of the wrong kind is settled (never a save)."""
        path = os.path.join(self.folder, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot inspect {path!r}: {exc.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            # A .ckpt folder is Lightning's sharded save: a save once it is a whole DCP one.
            return True
        if stat.S_ISREG(st.st_mode) and kind != FOLDER:
            return False
        # A checkpoint-N file, a symlink (never followed): not a save, now or later.
        self._settle(name)
        return None

    def _durable(self, step: int, name: str) -> bool:
        """Sync the save (POSIX), then check it is still what the scans saw: True when it may
        be published now."""
        path = os.path.join(self.folder, name)
        if self.uploader is None:
            try:
                sync_save(path)
            except FileNotFoundError:
                self._seen.pop(name, None)  # a part went meanwhile: it is not what was seen
                return False
            except OSError as exc:
                raise StoreError(
                    f"cannot sync {path!r} before publishing it: {exc.strerror}"
                ) from None
        seen = self._seen.get(name)
        now = self._snapshot(name, step)
        if seen is None or now is None or seen[1] != now:
            if now is not None and seen is not None:
                self._seen[name] = (seen[0], now)
            return False
        return True

    def _publish(self, step: int, name: str) -> Optional[Published]:
        path = os.path.join(self.folder, name)
        assert self.mark is not None
        if step <= self.mark:  # a second save of a step just published
            self._settle(name)
            if self.rule.step_of(os.path.basename(name)) == (STEP_INSIDE, INSIDE):
                self._mark_own_requeue(path)
            self.report(
                f"not publishing step {step}: {path} (step {self.mark} is already published)"
            )
            return None
        if self.cancelled or not self._durable(step, name):
            return None
        try:
            pub = self._put(step, path)
        except AlreadyPublished:
            self.report(f"step {step} was already published: {path}")
            pub = ""
        except OutsideRoot:
            if os.path.lexists(path):
                raise
            self._settle(name)
            self.report(f"not publishing step {step}: {path} was deleted before it could be")
            return None
        if self.uploader is not None and self.cancelled:
            return None  # the scan overran while the save was uploading: not published
        self.mark = step
        self._newest = path
        self._settle(name)
        progress = steps.recorder()  # a published save is progress (the stall watcher's)
        if progress is not None and progress.another_pauses():
            progress = None  # the loop under watch is in a save of its own: leave its mark
        if progress is not None:
            progress.step(step)
            progress.flush()
        if self.rule.counts_objects(os.path.basename(name)):
            folder = os.path.dirname(name)
            self._objects[folder] = max(self._objects.get(folder, 0), registered_objects(path))
        if pub:
            self.report(
                f"published step {step}: {self.uploader.url_of(path) if self.uploader else path}"
            )
        if self.uploader is not None:
            self.uploader.published(path)
        self._say_progress(step, path)
        if self.rule.step_of(os.path.basename(name)) == (STEP_INSIDE, INSIDE):
            self._mark_own_requeue(path)
        return Published(step, path, pub)

    def _mark_own_requeue(self, save: str) -> None:
        """Lightning runs ``scontrol requeue`` right after its save at the requeue signal:
        mark the execution's folder as the callbacks do before their requeue
        (``.dispatch-requeued.json``), so ``--max-requeues``, which budgets Slurm's requeues,
        does not count the job going on past its time limit.  On a folder root; a mark that
        cannot be written is said, and the requeue then counts as Slurm's."""
        if self.uploader is not None or self.exec_dir is None:
            return
        attempt = os.path.basename(self.exec_dir.rstrip("/"))
        try:
            execdir.mark_requeued(store.open_store(self.root), attempt, save)
        except (DispatchError, OSError) as exc:
            self.report(
                f"cannot mark this execution's own requeue in its folder ({exc}): "
                "--max-requeues counts Lightning's requeue as Slurm's"
            )

    def _say_progress(self, step: int, path: str) -> None:
        """Once per run: a publication at or below the step of the save this execution
        resumed from (the trainer started counting again), or a save index taken for the
        step of a resumed execution (progress)."""
        if self.resume_from is None or self._progress_said:
            return
        if self._resumed_step is None:
            try:
                steps = [
                    f.step for f in store.list_publications(self.root) if f.path == self.resume_from
                ]
            except DispatchError:
                steps = []
            self._resumed_step = max(steps, default=-1)
        if self._resumed_step < 0:
            return  # its publication is gone: nothing to compare with
        shown = self.uploader.url_of(path) if self.uploader else path
        said = progress.index_note(shown) or progress.went_backwards(
            self.resume_from, self._resumed_step, [(shown, step)]
        )
        if said:
            self._progress_said = True
            self.report(said)

    def _put(self, step: int, path: str) -> str:
        """Publish the save (on S3: upload it first, then publish its URL)."""
        if self.uploader is None:
            return store.publish(self.root, self.epoch, step, path)
        self.phase = (time.monotonic(), f"uploading {path} to {self.uploader.url_of(path)}")
        try:
            return self.uploader.put(self.epoch, step, path, lambda: self.cancelled)
        finally:
            self.phase = (time.monotonic(), f"a scan of {self.folder!r}")


def spelled_as_own(folder: str, own: str) -> str:
    """``folder`` spelled below the execution's folder ``own`` as ``own`` is spelled, when it
    is inside it only once symlinks are resolved; else ``folder`` as given.

    ``cd "$DISPATCH_EXEC_DIR" && dispatch watch --dir ckpts`` makes an absolute path of the
    working folder, which the system gives with every symlink resolved: under a root reached
    through one (a home folder linked to a parallel file system), that path is not below
    ``own`` as the launcher spelled it, nor below the root publications are named under."""
    absolute, base = os.path.abspath(folder), os.path.abspath(own)
    if (absolute + "/").startswith(base.rstrip("/") + "/"):
        return folder
    real, real_base = os.path.realpath(absolute), os.path.realpath(base)
    if real == real_base:
        return base
    if real.startswith(real_base.rstrip("/") + "/"):
        return os.path.join(base, os.path.relpath(real, real_base))
    return folder


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class WatchLoop:
    """Scans every ``interval`` seconds; with a command, runs it as a child, forwards the
    signals Slurm sends (:data:`FORWARDED`) and makes the last scans once it exits: one, and
    while a save that looks whole is not confirmed, another at most :data:`LAST_GAP` seconds
    later, for at most ``timeout`` (what is still being written then is said, not published).

    Without a command, TERM, INT and HUP end the run after the last scans (exit 0); USR1, USR2
    and CONT are ignored.  A scan that does not finish within ``timeout`` seconds is an error.
    The first error stops publishing; it is reported at once.  The exit status is the
    command's; after an error it is the command's when that failed, else 2 (also 2 without a
    command); a command that exits 0 after a TERM was forwarded to it gives 128+15
    (:data:`TERMED_CODE`, said).
    """

    def __init__(
        self,
        watcher: Watcher,
        command: Optional[list[str]],
        interval: float,
        timeout: float,
        report: Callable[[str], None],
    ) -> None:
        for label, value in (("--interval", interval), ("--timeout", timeout)):
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{label} {value!r} must be a positive number of seconds")
        self.watcher = watcher
        self.command = list(command) if command else None
        self.interval = interval
        self.timeout = timeout
        self.report = report
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.error: Optional[DispatchError] = None
        self._pending: list[int] = []
        self._ending = False
        self.termed = False  # a TERM was forwarded to the running command
        self.forwarded: set[int] = set()  # the signals forwarded to it
        self.missed = 0  # saves on disk never published, in a run that published nothing
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == signal.SIGCHLD:
            return  # only to wake the loop (through the wakeup fd): the child may have ended
        if self.command is None:
            self._ending = self._ending or signum in _ENDING
        elif self.child is None:
            self._pending.append(signum)
        else:
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        assert self.child is not None
        if self.child.returncode is None:
            try:
                os.kill(self.child.pid, signum)
            except ProcessLookupError:
                return  # it has just exited; the loop sees that next
            self.termed = self.termed or signum == signal.SIGTERM
            self.forwarded.add(signum)

    def _wait(self, seconds: Optional[float]) -> None:
        """Sleep until a signal, the child's exit, a scan's end, or ``seconds`` pass."""
        try:
            ready, _, _ = select.select([self._wake_r], [], [], seconds)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select
            return
        if ready:
            try:
                while os.read(self._wake_r, 512):
                    pass
            except BlockingIOError:
                pass

    def _scan(self) -> None:
        """One scan in a worker thread, so signals are forwarded meanwhile and a scan stuck
        on a hung file system is noticed after ``timeout``."""
        outcome: dict[str, BaseException] = {}
        done = threading.Event()

        def work() -> None:
            try:
                self.watcher.scan()
            except BaseException as exc:  # handed to the main thread
                outcome["error"] = exc
            finally:
                done.set()
                try:
                    os.write(self._wake_w, b"\0")
                except OSError:  # pragma: no cover - the runner already closed the pipe
                    pass

        started = time.monotonic()
        self.watcher.phase = None
        threading.Thread(target=work, name="dispatch-watch-scan", daemon=True).start()
        while not done.is_set():
            # Each upload (S3) and the scan around them has --timeout of its own.
            since, what = self.watcher.phase or (started, f"a scan of {self.watcher.folder!r}")
            left = max(since, started) + self.timeout - time.monotonic()
            if left <= 0:
                self.watcher.cancelled = True
                self._fail(
                    StoreError(f"{what} did not finish within {self.timeout:g} s (--timeout)")
                )
                return
            self._wait(left)
        error = outcome.get("error")
        if isinstance(error, DispatchError):
            self._fail(error)
        elif error is not None:
            raise error

    def _fail(self, error: DispatchError) -> None:
        self.error = error
        self.report(f"stopped publishing: {error}")

    def _start_child(self) -> None:
        assert self.command is not None
        try:
            self.child = subprocess.Popen(self.command)
        except FileNotFoundError:
            raise UsageError(f"command {self.command[0]!r} not found") from None
        except PermissionError:
            raise UsageError(f"command {self.command[0]!r} is not executable") from None
        except OSError as exc:
            raise UsageError(f"cannot run command {self.command[0]!r}: {exc.strerror}") from None
        for signum in self._pending:
            self._forward(signum)
        self._pending.clear()

    def run(self) -> int:
        handled = (*FORWARDED, signal.SIGCHLD)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            if self.command is not None:
                self._start_child()
            self._loop()
            self._last_scans()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)
        return self._status()

    def _last_scans(self) -> None:
        """Saves written just before the end: scan, and while a save that looks whole is not
        confirmed yet, scan again at most LAST_GAP seconds later, for at most ``timeout``."""
        gap = min(self.interval, LAST_GAP)
        deadline = time.monotonic() + self.timeout
        while self.error is None:
            self._scan()
            if self.error is not None or not self.watcher.waiting():
                self._say_the_end()
                return
            if time.monotonic() + gap > deadline:
                for name in self.watcher.waiting():
                    self.report(
                        f"not publishing {os.path.join(self.watcher.folder, name)}: "
                        f"still being written {self.timeout:g} s (--timeout) after "
                        "the end"
                    )
                self._say_the_end()
                return
            end = time.monotonic() + gap
            while time.monotonic() < end:  # a signal may wake the wait early
                self._wait(end - time.monotonic())

    def _say_the_end(self) -> None:
        """After the last scans: what a run that ended without an error should know.  One
        that published nothing says so, names the saves it missed, if any, and then fails."""
        if self.error is not None:
            return  # said already, and the run ends non-zero
        watcher = self.watcher
        if watcher.may_be_absent and not watcher.appeared:
            self.report(
                f"the watched folder {watcher.folder} never appeared: nothing was saved there"
            )
        if watcher.published_anything():
            outside = watcher.requeue_saves_outside()
            for path in outside:
                self.report(
                    f"never published: {path} (Lightning's save at the requeue signal, "
                    f"outside the watched folder {watcher.folder}: without --dir watch "
                    "publishes it)"
                )
            self.missed = len(outside)
            return
        inside = (
            ""
            if watcher.exec_dir in (None, watcher.folder)
            else (f", inside this execution's folder {watcher.exec_dir}")
        )
        self.report(
            f"published nothing: no complete save was found in {watcher.folder}; "
            f"saves must be written there (at most {SCAN_DEPTH} names below it){inside}, "
            f"named {watcher.rule.describe()}"
        )
        missed = watcher.missed()
        for path, option in missed:
            self.report(f"never published: {path} ({option})")
        if missed:
            self.missed = len(missed)
            self.report(
                f"{len(missed)} save(s) above were never published: watch exits "
                f"non-zero ({STOPPED_CODE} when the command succeeded), so the job is a "
                "failure (the resubmit rule applies), not a completed job whose work "
                "nobody can resume"
            )

    def _loop(self) -> None:
        next_scan = time.monotonic()
        while True:
            if self.child is not None and self.child.poll() is not None:
                return
            if self.command is None and (self._ending or self.error is not None):
                return
            now = time.monotonic()
            if self.error is None and now >= next_scan:
                self._scan()
                next_scan = max(next_scan + self.interval, time.monotonic())
                continue
            self._wait(None if self.error is not None else next_scan - now)

    def _status(self) -> int:
        code = 0
        if self.child is not None:
            code = exit_status(self.child.wait())
        warned = [s for s in _WARNINGS if s in self.forwarded and code == 128 + s]
        if warned:
            self.report(
                f"the command was killed by {signal.Signals(warned[0]).name}, which "
                "watch forwarded to it (the warning signal): it has no handler for "
                "it.  Lightning installs its own (save hpc_ckpt_<n>.ckpt, requeue) "
                "only where it detects Slurm: run it under srun (exec dispatch watch "
                "-- srun python ...), or add DispatchCallback"
            )
        if (self.error is not None or self.missed) and code == 0:
            return STOPPED_CODE
        if code == 0 and self.termed:
            self.report(
                f"the command exited 0 after watch forwarded it TERM: its work is not "
                f"done, so watch exits {TERMED_CODE} (a failure: the job's resubmit rule "
                "applies, its next execution resumes from the newest published save)"
            )
            return TERMED_CODE
        return code
