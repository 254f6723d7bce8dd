"""No module outside slurm_dispatch/slurm/ runs Slurm's tools or imports pyslurm: the adapter is
the one way to Slurm (its argv live in slurm/cli_backend.py).

What counts, found with ast in every module of slurm_dispatch/ outside slurm/:

* an argv literal: a list or tuple whose first item is the string ``squeue``, ``scontrol``,
  ``sacct``, ``sbatch``, ``scancel``, ``sinfo``, ``srun`` or ``salloc``;
* a call whose first argument is such a string (``subprocess.run("sbatch ...")`` would be a
  shell line, ``run("squeue", ...)``), or a string starting with one and a space given to a
  subprocess call;
* ``import pyslurm`` or ``from pyslurm ...``, and an ``import_module("pyslurm")``.

The one exception is the sandbox (slurm_dispatch/sandbox/): it drives its own development
cluster with sinfo and scontrol (ping, reconfigure, resume a node), which is not dispatch's
use of a site's Slurm.
"""

from __future__ import annotations

import ast
from pathlib import Path

from slurm_dispatch.slurm import adapter

PACKAGE = Path(adapter.__file__).resolve().parents[1]
TOOLS = frozenset({"squeue", "scontrol", "sacct", "sbatch", "scancel", "sinfo", "srun", "salloc"})
EXEMPT = ("slurm", "sandbox")


def _tool(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in TOOLS or node.value.split(" ", 1)[0] in TOOLS and " " in node.value)
    )


def _subprocess_call(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in (
        "run",
        "Popen",
        "call",
        "check_call",
        "check_output",
        "system",
        "getoutput",
        "getstatusoutput",
    )


def crossings(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in EXEMPT:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            what = ""
            if (
                isinstance(node, (ast.List, ast.Tuple))
                and node.elts
                and isinstance(node.elts[0], ast.Constant)
                and node.elts[0].value in TOOLS
            ):
                what = f"argv {node.elts[0].value!r}"
            elif (
                isinstance(node, ast.Call)
                and node.args
                and _tool(node.args[0])
                and _subprocess_call(node)
            ):
                what = "runs a Slurm tool"
            elif isinstance(node, ast.Import) and any(
                a.name.split(".")[0] == "pyslurm" for a in node.names
            ):
                what = "imports pyslurm"
            elif (
                isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyslurm"
            ):
                what = "imports pyslurm"
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "pyslurm"
            ):
                what = "imports pyslurm"
            if what:
                found.append(f"{relative}:{getattr(node, 'lineno', 0)}: {what}")
    return found


def test_only_the_adapter_reaches_slurm() -> None:
    assert crossings() == [], (
        "Slurm is reached through slurm_dispatch/slurm/ only: add the "
        "call to the adapter (slurm/cli_backend.py holds the argv)"
    )


def test_the_scan_sees_a_crossing(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "m.py").write_text(
        'import subprocess\nimport pyslurm\nargv = ["scontrol", "update"]\n'
        'subprocess.run("squeue --me", shell=True)\nx = ["sbatch"] and "sbatch" == y\n'
    )
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "m.py").write_text('argv = ["scontrol", "ping"]\n')
    found = crossings(tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "3", "4", "5"], found
