"""Every key dispatch.conf knows is in the admin guide's configuration table and in the
shipped template, with the default the code has, so the three never drift apart again
(SlurmBackend, StoreTimeout, StageDir and ListingLag had been missed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_dispatch import config

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "admin-guide.md"
TEMPLATE = REPO / "site-config" / "dispatch.conf"
NO_DEFAULT = "(none"  # a key whose default is "not set": the table says what that means


def table_rows() -> dict[str, str]:
    """The configuration table's rows: key -> the default column, as written."""
    text = GUIDE.read_text()
    section = text.split("## Configuration reference (dispatch.conf)", 1)[1].split("\n## ", 1)[0]
    return {
        m.group(1): m.group(2).strip()
        for m in re.finditer(r"^\| `(\w+)` \| (.*?) \|", section, re.MULTILINE)
    }


def attribute(key: str) -> str:
    return config._KEYS[key.lower()][1]


@pytest.mark.parametrize("key", config.KEYS)
def test_the_admin_guide_table_has_the_key_with_its_default(key: str) -> None:
    rows = table_rows()
    assert key in rows, f"{key} is missing from {GUIDE.name}'s configuration table"
    shown = rows[key]
    default = getattr(config.Config(), attribute(key))
    if shown.startswith(NO_DEFAULT):
        assert default in ("", None), f"{key}: the table says none, the code {default!r}"
        return
    parsed = config.parse(f"{key}={shown.strip('`')}")
    assert parsed.problems == [] and getattr(parsed, attribute(key)) == default, (shown, default)


def test_the_template_has_every_key_and_its_values_are_the_defaults() -> None:
    text = TEMPLATE.read_text()
    for key in config.KEYS:
        assert re.search(rf"^#?{key}=", text, re.MULTILINE), f"{key} is missing from {TEMPLATE}"
    parsed = config.parse(text, str(TEMPLATE))
    assert parsed.problems == []
    given = {
        line.split("=", 1)[0].lower()
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    for key in config.KEYS:
        if key.lower() in given:
            assert getattr(parsed, attribute(key)) == getattr(config.Config(), attribute(key)), key
