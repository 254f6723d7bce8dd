"""The plan: what dispatch will do with a job, printed before anything is submitted.

Invariant: it makes nothing, and refuses what ``dispatch-sbatch`` would refuse (an array on
one root, a warning past the time limit, a root that is a file), so a plan is never shown for
a job that could not be submitted."""

from __future__ import annotations

import os

from . import badnodes, rules
from .request import Request, refuse_array_on_one_root, refuse_warning_past_limit
from .root_setup import checkpoint_root, refuse_a_root_that_is_no_folder
from .sbatch_words import array_of
from .settings import avoid_setting, site_settings, stall_setting


def _human(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _array_line(request: Request) -> list[str]:
    """For an array: the rules below apply to each task on its own."""
    tasks = array_of(
        request.sbatch,
        os.environ,
        request.header.sbatch_lines,
        os.path.basename(request.script_path),
    )
    if tasks is None:
        return []
    return [
        f"  array       {len(tasks)} task(s), each on its own: a task's end, budget, "
        "submission numbers and holds are its own; a failed task is resubmitted alone"
    ]


def describe(request: Request) -> str:
    opts = request.options
    root = checkpoint_root(opts, request.cwd)
    refuse_array_on_one_root(request, root)  # what dispatch-sbatch would refuse
    refuse_a_root_that_is_no_folder(root)
    refuse_warning_past_limit(request)
    settings = site_settings()
    hold, signal = _human(int(settings.hold_for)), settings.signal or ""
    lines = [
        f"Plan for {os.path.basename(request.script_path)}",
        f"  checkpoint  {root}",
        "  mode        "
        + (
            "shared checkpoint: no automatic requeue; every restart is a hold"
            if opts.shared_checkpoint
            else "isolated: each execution writes <checkpoint>/exec/<attempt>/"
        ),
        f"  generation  {'G+1 of ' + opts.supersede if opts.supersede else '0 (new job)'}",
        f"  resubmit    budget {opts.resubmit}",
        *_array_line(request),
        "",
        "  END STATE      WHAT HAPPENS",
    ]
    for rule in rules.rules_for(
        opts.shared_checkpoint, opts.resubmit, hold, signal, request.expedited
    ):
        lines.append(f"  {rule.end_state:<14} {rule.text}")
    stop = rules.no_progress_rule(opts.max_no_progress)
    lines.append(
        f"  {'no progress':<14} "
        + (
            stop.text
            if stop is not None
            else "restarted whatever the executions publish (--max-no-progress 0)"
        )
    )
    lines.append(
        f"  {'exit codes':<14} " + rules.exit_codes_text(opts.stop_on_exit, opts.restart_on_exit)
    )
    lines.append(f"  {'requeues':<14} " + rules.max_requeues_text(opts.max_requeues))
    lines.append(f"  {'bad nodes':<14} " + badnodes.plan_text(*avoid_setting(opts)))
    lines.append(f"  {'stalled':<14} " + rules.stall_text(*stall_setting(opts), opts.warn_before))
    poison = rules.quarantine_rule(opts.quarantine_after)
    lines.append(
        f"  {'poisoned save':<14} "
        + (
            poison.text
            if poison is not None
            else "never quarantined by dispatch (--quarantine-after 0)"
        )
    )
    if opts.shared_checkpoint and opts.resubmit > 0:
        told = "by mail (Slurm's MailProg, to --mail-user or you)"
        if settings.notify:
            told += f" and by {settings.notify}"
        lines.append(
            f"  A hold is told {told} when it is made and "
            f"{_human(int(settings.warn_before))} before it expires; "
            "`dispatch status` and squeue show its deadline."
        )
    if opts.resubmit > 0 or opts.shared_checkpoint:
        from .heartbeat import WAYS

        lines.append(
            "  Resubmissions and holds are made by `dispatch supervise`: run it with "
            f"{WAYS}; without it a failed job stays failed."
        )
    lines.append("")
    lines.append("Nothing was submitted.")
    return "\n".join(lines) + "\n"
