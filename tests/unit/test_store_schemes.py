"""The table of stores (checkpoint/stores/schemes.py) is what open_store, the root checks and
their messages read, and the SDKs of remote stores are imported only under checkpoint/stores/."""

from __future__ import annotations

import ast
import pathlib

import pytest

from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.checkpoint.stores import open as opener
from slurm_dispatch.checkpoint.stores import schemes
from slurm_dispatch.checkpoint.stores.base import Store
from slurm_dispatch.errors import UsageError

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "slurm_dispatch"
STORES = PACKAGE / "checkpoint" / "stores"
SDKS = ("boto3", "botocore", "s3transfer", "azure")


def _imported(tree: ast.AST) -> list[str]:
    """Every module an import statement names, lazy (inside functions) ones included, and
    every ``__import__``/``import_module`` of a literal name."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in ("__import__", "import_module")
        ):
            names.append(node.args[0].value)
    return names


def test_the_sdks_of_remote_stores_are_imported_only_under_checkpoint_stores() -> None:
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORES in path.parents:
            continue
        for name in _imported(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in SDKS:
                outside.append(f"{path.relative_to(PACKAGE.parent)}: {name}")
    assert outside == []


def test_the_scan_sees_a_lazy_import() -> None:
    tree = ast.parse(
        "def f():\n    from botocore.exceptions import ClientError\n"
        "    import boto3.s3\n    __import__('s3transfer')\n"
    )
    assert _imported(tree) == ["botocore.exceptions", "boto3.s3", "s3transfer"]


@pytest.mark.parametrize("row", schemes.SCHEMES, ids=lambda row: row.name)
def test_each_row_names_a_store_class_and_an_extra(row: schemes.Scheme) -> None:
    assert row.prefix == row.prefix.lower() and row.prefix.endswith("://")
    assert (STORES / f"{row.module}.py").is_file()
    assert row.cls in (STORES / f"{row.module}.py").read_text()
    extras = (PACKAGE.parent / "pyproject.toml").read_text()
    assert f"\n{row.extra} = [" in extras
    assert row.matches(row.example) and row.matches(row.prefix.upper() + "b/p")
    assert schemes.scheme_of(row.example) is row


def test_the_s3_row_is_a_remote_store_and_a_folder_is_none() -> None:
    assert store.is_remote_root("s3://bucket/prefix") and store.is_remote_root("S3://b/p")
    assert not store.is_remote_root("/scratch/ckpt") and not store.is_remote_root("gs://b/p")
    assert store.scheme_of("/scratch/ckpt") is None and store.scheme_of("gs://b/p") is None
    cls = schemes.scheme_of("s3://b/p").store_class()  # type: ignore[union-attr]
    assert issubclass(cls, Store) and cls.__name__ == "S3Store"


def test_the_root_checks_word_their_refusals_from_the_table() -> None:
    with pytest.raises(UsageError) as one_slash:
        opener.check_root_scheme("s3:/bucket/p")
    assert str(one_slash.value) == (
        "checkpoint root 's3:/bucket/p' is not an S3 URL, which has two slashes: "
        "s3://bucket/p; for a local folder of that name, write ./s3:/bucket/p"
    )
    with pytest.raises(UsageError) as other:
        opener.check_root_scheme("gs://bucket/p")
    assert str(other.value) == (
        "checkpoint root 'gs://bucket/p': 'gs://' roots are not "
        "supported (use a folder or s3://bucket/prefix or az://container/prefix)"
    )
    opener.check_root_scheme("/scratch/ckpt")
    opener.check_root_scheme("s3://bucket/p")


def test_each_remote_store_has_its_staging_and_a_folder_none() -> None:
    from slurm_dispatch.execution import staging

    for row in schemes.SCHEMES:
        if row.remote:
            assert row.name in staging.STAGINGS
            assert callable(staging.of(row.example).choose_resume)  # the module imports
    with pytest.raises(ValueError, match="not a remote root"):
        staging.of("/scratch/ckpt")


def test_a_remote_root_is_checked_by_its_store_without_asking_it() -> None:
    """dispatch-sbatch records a remote root as its store normalizes it (control/root_setup)."""
    from slurm_dispatch.checkpoint.stores.posix import PosixStore
    from slurm_dispatch.checkpoint.stores.s3 import parse_root

    cls = schemes.scheme_of("s3://b/p").store_class()  # type: ignore[union-attr]
    assert cls.checked_root("s3://bucket/runs/x/") == parse_root("s3://bucket/runs/x/").url
    with pytest.raises(NotImplementedError):
        PosixStore.checked_root("/scratch/ckpt")
