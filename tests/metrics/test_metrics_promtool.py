"""Every alert rule has a promtool unit test (metrics/tests/alerts_test.yaml),
and promtool runs it: each rule fires when it must and is silent when it must not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from promtool_kit import ALERTS, ROOT, promtool, rules_without_annotations, run_rule_tests

TESTS = ROOT / "metrics" / "tests" / "alerts_test.yaml"


def test_rules_pass_promtool_check() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_rule_has_a_firing_and_a_silent_case() -> None:
    rules = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r}
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    firing = {c["alertname"] for c in cases if c.get("exp_alerts")}
    silent = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert rules - firing == set(), "rules without a firing test"
    assert rules - silent == set(), "rules without a silent test"


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    out = run_rule_tests(tmp_path, TESTS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_a_changed_rule_fails_its_test(tmp_path: Path) -> None:
    rules = rules_without_annotations()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "TieredQueueStuck":
                rule["for"] = "2h"  # would resolve... never fire within the test's window
    out = run_rule_tests(tmp_path, TESTS, rules)
    assert out.returncode != 0
    assert "TieredQueueStuck" in out.stdout + out.stderr
