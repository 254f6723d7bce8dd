"""What ``squeue -O`` prints, rendered from scontrol-style job fields, for the fakes.

The fakes keep jobs as ``scontrol show job`` fields (``JobId``, ``JobState``, ``Restarts``,
``Comment``, ...) because that is how people read them; this renders the exact text the Slurm
adapter asks squeue for, taking the field list and its suffixes (the nonces) from the argv, so a
fake answers whatever format the adapter uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence


def _uid(fields: Mapping[str, str]) -> str:
    value = fields.get("UserId", str(os.getuid()))
    if value.endswith(")") and "(" in value:
        return value[value.rfind("(") + 1 : -1]
    return value


def _wait_status(code: str) -> str:
    """squeue's exit_code field for scontrol's ExitCode: the wait status (22.05 prints 768
    for 3:0)."""
    status, _, signal = code.partition(":")
    return str((int(status) << 8) | int(signal or 0))


def value_of(fields: Mapping[str, str], name: str) -> str:
    task = fields.get("ArrayTaskId")
    values = {
        "JobID": fields["JobId"],
        "ArrayJobID": fields.get("ArrayJobId") or fields["JobId"],
        "ArrayTaskID": task if task else "N/A",
        "State": fields.get("JobState", "PENDING"),
        "RestartCnt": fields.get("Restarts", "0"),
        "UserID": _uid(fields),
        "NodeList": ""
        if fields.get("NodeList", "(null)") == "(null)"
        else fields.get("NodeList", ""),
        "SubmitTime": fields.get("SubmitTime", "2026-01-01T00:00:00"),
        "StartTime": fields.get("StartTime", "Unknown"),
        "EndTime": fields.get("EndTime", "Unknown"),
        "exit_code": _wait_status(fields.get("ExitCode", "0:0")),
        "Reason": fields.get("Reason", "None"),
        "Comment": fields.get("Comment") or "(null)",
        "SLUID": fields.get("SLUID", "N/A"),
    }
    return values[name]


def render(argv: Sequence[str], jobs: Iterable[Mapping[str, str]]) -> str:
    """squeue's output for ``argv`` (``--Format A:0sfx,B:0sfx``) over ``jobs``."""
    spec = argv[list(argv).index("--Format") + 1]
    fields = []
    for item in spec.split(","):
        name, _, rest = item.partition(":")
        fields.append((name, rest.lstrip("0123456789.")))
    out = []
    for job in jobs:
        out.append("".join(value_of(job, name) + suffix for name, suffix in fields) + "\n")
    return "".join(out)


def selected(
    argv: Sequence[str], jobs: Iterable[Mapping[str, str]], uid: int
) -> list[Mapping[str, str]]:
    """The jobs squeue would print for ``argv``: ``--me`` (uid ``uid``) or ``--jobs ID``."""
    argv = list(argv)
    listed = list(jobs)
    if "--me" in argv:
        return [j for j in listed if _uid(j) == str(uid)]
    if "--jobs" in argv:
        wanted = argv[argv.index("--jobs") + 1]
        return [
            j
            for j in listed
            if wanted
            in (
                j["JobId"],
                j.get("ArrayJobId"),
                f"{j.get('ArrayJobId')}_{j.get('ArrayTaskId')}" if j.get("ArrayTaskId") else None,
            )
        ]
    return listed


_COMMANDS = """#!{python}
# A fake squeue/scontrol for tests and benches: answers what dispatch-cease asks about one
# job and its nodes, logs every call, and fails loudly on anything else.
import json, sys
sys.path.insert(0, {repo!r})
from tests.fakes import squeue
prog = sys.argv[0].rsplit("/", 1)[-1]
args = sys.argv[1:]
with open({log!r}, "a") as out:
    out.write(" ".join([prog, *args]) + "\\n")
JOB = json.loads({job!r})
if prog == "squeue" and args == ["--version"]:
    print("slurm " + (JOB.get("Version") or "24.11.5"))
elif prog == "squeue" and "--jobs" in args:
    if args[args.index("--jobs") + 1] != JOB["JobId"]:
        sys.stderr.write("slurm_load_jobs error: Invalid job id specified\\n")
        sys.exit(1)
    sys.stdout.write(squeue.render(args, [JOB]))
elif prog == "scontrol" and args[:3] == ["-o", "show", "node"]:
    for name in args[3].split(","):
        print(f"NodeName={{name}} Arch=x86_64 State=IDLE BootTime={boot} Reason=none")
else:
    sys.exit("unexpected Slurm call: " + " ".join([prog, *args]))
"""


def install_commands(
    bin_dir: os.PathLike[str], log: str, job: Mapping[str, str], boot: str = "2020-01-01T00:00:00"
) -> None:
    """Write fake ``squeue`` and ``scontrol`` into ``bin_dir`` (put it first on PATH)."""
    import json
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    text = _COMMANDS.format(
        python=sys.executable, repo=repo, log=log, job=json.dumps(dict(job)), boot=boot
    )
    for prog in ("squeue", "scontrol"):
        path = Path(bin_dir) / prog
        path.write_text(text)
        path.chmod(0o755)
