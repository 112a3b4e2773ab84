"""The shipped Prometheus rules pass `promtool check rules`, and `promtool test rules`
proves each alert fires on synthetic series that break its condition and stays silent on
series that do not (alert_rules_test.yaml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.prometheus import tool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "helm" / "sloline" / "files" / "rules" / "sloline.rules.yaml"
RULE_TESTS = Path(__file__).with_name("alert_rules_test.yaml")


def _promtool() -> str:
    return tool("promtool")


def _alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["alert"] for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_documented() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]
    }
    docs = (ROOT / "docs" / "operations.md").read_text()
    for alert in _alerts():
        assert alert in fired, f"no promtool case shows {alert} firing"
        assert f"`{alert}`" in docs, f"docs/operations.md does not describe {alert}"
