"""The soak's mutants keep applying as the product moves: each one's text is in the product
exactly once, so `python -m soak.mutants` breaks what it says it breaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from soak import checker, mutants

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_once_and_changes_its_files(
    mutant: mutants.Mutant, tmp_path: Path
) -> None:
    paths = sorted({edit.path for edit in mutant.edits})
    for path in paths:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((REPO / path).read_text())
    mutants.apply(mutant, tmp_path)
    for path in paths:
        changed = (tmp_path / path).read_text()
        assert changed != (REPO / path).read_text() and "MUTANT" in changed
        if path.endswith(".py"):  # still Python: it breaks behaviour, not the import
            compile(changed, path, "exec")
    assert set(mutant.expected) <= set(checker.INVARIANTS)


def test_a_mutant_whose_text_moved_is_refused_by_name(tmp_path: Path) -> None:
    moved = mutants.Mutant("gone", (mutants.Edit("x.py", "old text\n", "new\n"),), ("resume",), "")
    (tmp_path / "x.py").write_text("something else\n")
    with pytest.raises(ValueError, match="mutant gone: its text is in x.py 0 times"):
        mutants.apply(moved, tmp_path)
    assert (tmp_path / "x.py").read_text() == "something else\n"


def test_the_four_builds_the_soak_once_passed_are_mutants() -> None:
    assert {
        "latest-ignores-epoch",
        "gc-spares-no-resume-choice",
        "launcher-skips-shared-claim",
        "ended-counted-as-ceased",
    } <= {m.name for m in mutants.MUTANTS}


def test_every_invariant_of_the_checker_has_a_mutant_meant_for_it() -> None:
    """A soak whose invariant no broken build was ever put through proves nothing of it."""
    meant = {name for m in mutants.MUTANTS for name in m.expected}
    assert set(checker.INVARIANTS) - meant == set()
