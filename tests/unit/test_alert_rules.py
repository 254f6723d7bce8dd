"""The Prometheus alerting rules shipped in contrib/ (docs/admin-guide.md, alerts): valid for
promtool, each unit-tested firing and not firing, and naming only metrics slurm-dispatch writes.

promtool comes from Debian's ``prometheus`` package (``.ci/run`` installs it).  Each rule's
tests bite: with its expression replaced by one that always fires, or never does, the unit
tests fail."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from slurm_dispatch.node import metrics

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "contrib" / "prometheus" / "slurm-dispatch-alerts.yml"
TESTS = Path(__file__).parent / "alerts" / "slurm-dispatch-alerts.test.yml"
ALERTS = (
    "SlurmDispatchRestartStorm",
    "SlurmDispatchNoProgress",
    "SlurmDispatchHoldExpiring",
    "SlurmDispatchSupervisorSilent",
    "SlurmDispatchHooksFailing",
    "SlurmDispatchNodeSurvivors",
    "SlurmDispatchMetricsStale",
)


def promtool(*argv: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool not found: apt-get install prometheus (Debian's package has it)"
    return subprocess.run([tool, *argv], capture_output=True, text=True, timeout=120)


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def test_the_rules_are_valid_and_pass_their_unit_tests() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout
    tested = promtool("test", "rules", str(TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert [rule["alert"] for rule in rules()] == list(ALERTS)


def test_each_alert_is_tested_firing_and_not_firing() -> None:
    cases = [
        case
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in ALERTS:
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"{alert} never tested firing"
        assert any(not case["exp_alerts"] for case in mine), (
            f"{alert} never tested at a time it must not fire"
        )


@pytest.mark.parametrize("alert", ALERTS)
def test_the_tests_of_each_alert_bite(alert: str, tmp_path: Path) -> None:
    """A rule that always fires, or never does, fails its tests."""
    for broken in ("vector(1)", "vector(1) < 0"):
        data = yaml.safe_load(RULES.read_text())
        for group in data["groups"]:
            for rule in group["rules"]:
                if rule["alert"] == alert:
                    rule["expr"] = broken
                    rule.pop("for", None)
        (tmp_path / "rules.yml").write_text(yaml.safe_dump(data))
        tests = yaml.safe_load(TESTS.read_text())
        tests["rule_files"] = [str(tmp_path / "rules.yml")]
        (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
        tested = promtool("test", "rules", str(tmp_path / "tests.yml"))
        said = tested.stdout + tested.stderr
        assert tested.returncode != 0 and f"alertname: {alert}," in said, (broken, said)


def test_the_rules_name_only_metrics_slurm_dispatch_writes() -> None:
    named = set()
    for rule in rules():
        named |= set(re.findall(r"\bslurm_dispatch_[a-z_]+", rule["expr"]))
    assert named and named <= set(metrics.FAMILIES), named - set(metrics.FAMILIES)
