"""An execution's contract (execution/contract.py): the DISPATCH_* variables have one reader,
which api.execution() and the integrations' saves.Execution.current() both use; they agree on
every variable they both read, each keeps its own strictness and words, and no other module
reads a contract variable by name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_dispatch import api
from slurm_dispatch.errors import UsageError
from slurm_dispatch.execution import contract, launch, saves

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_dispatch"
FULL = {
    "DISPATCH_JOB": "dabcdefg",
    "DISPATCH_GENERATION": "1",
    "DISPATCH_SUBMISSION": "2",
    "DISPATCH_EPOCH": str(1_000_002_000_003),
    "DISPATCH_ATTEMPT": "a" * 26,
    "DISPATCH_CHECKPOINT": "/ck",
    "DISPATCH_EXEC_DIR": "/ck/exec/" + "a" * 26,
    "DISPATCH_RESUME_FROM": "/ck/exec/b/step-1",
    "DISPATCH_STAGE_DIR": "/tmp/st",
    "DISPATCH_LOCAL_DIR": "/tmp/st",
}
# What each reader calls a variable (api's identity, the integrations' execution).
API = {
    "DISPATCH_JOB": "job",
    "DISPATCH_GENERATION": "generation",
    "DISPATCH_SUBMISSION": "submission",
    "DISPATCH_EPOCH": "epoch",
    "DISPATCH_ATTEMPT": "attempt",
    "DISPATCH_CHECKPOINT": "checkpoint",
    "DISPATCH_EXEC_DIR": "exec_dir",
    "DISPATCH_RESUME_FROM": "resume_from",
}
SAVES = {
    "DISPATCH_JOB": "job",
    "DISPATCH_EPOCH": "epoch",
    "DISPATCH_ATTEMPT": "attempt",
    "DISPATCH_CHECKPOINT": "root",
    "DISPATCH_EXEC_DIR": "exec_dir",
    "DISPATCH_RESUME_FROM": "resume_from",
    "DISPATCH_STAGE_DIR": "stage_dir",
}


def test_the_contract_names_every_variable_the_launcher_sets_once() -> None:
    assert launch.CONTRACT is contract.VARIABLES
    assert sorted(FULL) == sorted(contract.VARIABLES)
    assert len(set(contract.VARIABLES)) == len(contract.VARIABLES)
    read = contract.Contract.read(FULL)
    assert [read.variable(f) for f in ("job", "epoch", "local_dir")] == [
        "DISPATCH_JOB",
        "DISPATCH_EPOCH",
        "DISPATCH_LOCAL_DIR",
    ]
    assert contract.Contract.read({}).missing() == list(contract.IDENTITY)


@pytest.mark.parametrize("name", sorted(FULL))
def test_both_readers_see_each_variable_alike(name: str) -> None:
    changed = {
        **FULL,
        name: "7"
        if name in ("DISPATCH_GENERATION", "DISPATCH_SUBMISSION", "DISPATCH_EPOCH")
        else FULL[name] + "x",
    }
    for env in (FULL, changed):
        identity, integration = api.execution(env), saves.Execution.current(env)
        assert identity is not None and integration is not None
        for variable in set(API) & set(SAVES):
            assert getattr(identity, API[variable]) == getattr(integration, SAVES[variable])
        for variable, field in API.items():
            value = getattr(identity, field)
            assert str(value) == env[variable], (variable, value)
        for variable, field in SAVES.items():
            assert str(getattr(integration, field)) == env[variable], variable


def test_each_reader_keeps_its_strictness_and_its_words() -> None:
    bad = {**FULL, "DISPATCH_EPOCH": "12x"}
    with pytest.raises(UsageError) as strict:
        api.execution(bad)
    assert str(strict.value) == "$DISPATCH_EPOCH='12x' is not an integer"
    with pytest.raises(UsageError) as lenient:
        saves.Execution.current(bad)
    assert str(lenient.value) == "DISPATCH_EPOCH '12x' is not an integer"
    partial = {k: v for k, v in FULL.items() if k not in ("DISPATCH_ATTEMPT", "DISPATCH_JOB")}
    assert api.execution(partial) is None  # no DISPATCH_JOB: not in a dispatch execution
    integration = saves.Execution.current(partial)
    assert integration is not None and (integration.job, integration.attempt) == ("", "")
    with pytest.raises(UsageError) as lacking:
        api.execution({**partial, "DISPATCH_JOB": "d"})
    assert str(lacking.value) == (
        "a dispatch execution's environment lacks DISPATCH_ATTEMPT "
        "(was the script started by the dispatch launcher?)"
    )
    fresh = {**FULL, "DISPATCH_RESUME_FROM": "", "DISPATCH_STAGE_DIR": ""}
    identity, integration = api.execution(fresh), saves.Execution.current(fresh)
    assert identity is not None and identity.resume_from is None
    assert integration is not None and integration.resume_from == ""  # nothing to resume
    assert integration.stage_dir is None
    absent = {k: v for k, v in FULL.items() if k != "DISPATCH_RESUME_FROM"}
    assert saves.Execution.current(absent).resume_from is None  # type: ignore[union-attr]
    no_epoch = {k: v for k, v in FULL.items() if k != "DISPATCH_EPOCH"}
    with pytest.raises(UsageError, match="DISPATCH_EPOCH '' is not an integer"):
        saves.Execution.current(no_epoch)
    assert saves.Execution.current({**FULL, "DISPATCH_EXEC_DIR": ""}) is None
    with pytest.raises(UsageError, match="a folder, an s3:// root or an az:// root only"):
        saves.Execution.current({**FULL, "DISPATCH_CHECKPOINT": "gs://b/ck"})


def test_api_execution_is_the_contracts_identity() -> None:
    assert api.Execution is contract.Execution
    assert "Execution" in api.__all__ and "execution" in api.__all__


def test_the_contract_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import slurm_dispatch.execution.contract; "
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('slurm_')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert (
        out.strip() == "['slurm_dispatch', 'slurm_dispatch.execution', "
        "'slurm_dispatch.execution.contract']"
    )


# Modules that may read a contract variable by name, and why: the launcher writes them all (a
# dict keyed by name, which it reads back for its header and record); the dispatch commands
# name them as click options' envvar= and read the publish command's folder from them.
READERS = {"execution/contract.py", "execution/launch.py", "cli/dispatch.py"}
GETTERS = {"get", "getenv", "pop", "setdefault"}


def _reads(tree: ast.AST) -> list[ast.Constant]:
    """The contract variables ``tree`` reads: ``x.get(NAME)``, ``os.getenv(NAME)``,
    ``x[NAME]`` (a column header or a message that names one is not a read)."""
    found = []
    for node in ast.walk(tree):
        keys: list[ast.expr] = []
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in GETTERS
        ):
            keys = node.args[:1]
        elif isinstance(node, ast.Subscript):
            keys = [node.slice]
        found += [k for k in keys if isinstance(k, ast.Constant) and k.value in contract.VARIABLES]
    return found


def test_no_other_module_reads_a_contract_variable_by_name() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        if name not in READERS:
            found += [
                f"{name}:{n.lineno}: {n.value!s}" for n in _reads(ast.parse(path.read_text()))
            ]
    assert found == []


def test_the_scan_sees_a_read() -> None:
    tree = ast.parse(
        "import os\nos.environ.get('DISPATCH_EPOCH'), env['DISPATCH_JOB'], "
        "os.getenv('DISPATCH_ATTEMPT'), print('DISPATCH_JOB')\n"
    )
    assert [n.value for n in _reads(tree)] == ["DISPATCH_EPOCH", "DISPATCH_JOB", "DISPATCH_ATTEMPT"]
