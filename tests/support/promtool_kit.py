"""Run ``promtool test rules`` over our alert rules.

promtool compares the annotations of a firing alert too; our annotations are
long runbook texts, checked separately by ``promtool check rules``. So the
rules are handed to promtool without them, and tests name labels only.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "metrics" / "alerts.yaml"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:  # installed by the README's test command; CI runs that command
        raise AssertionError("promtool not found: install Debian's 'prometheus' package (see README)")
    return path


def rules_without_annotations(src: Path = ALERTS) -> dict[str, Any]:
    doc = yaml.safe_load(src.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return doc


def run_rule_tests(workdir: Path, tests: dict[str, Any] | Path, rules: dict[str, Any] | None = None,
                   ) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` in ``workdir`` with ``alerts.yaml`` (annotations
    stripped) next to the test file."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "alerts.yaml").write_text(yaml.safe_dump(rules or rules_without_annotations()), encoding="utf-8")
    test_file = workdir / "alerts_test.yaml"
    if isinstance(tests, Path):
        test_file.write_text(tests.read_text(encoding="utf-8"), encoding="utf-8")
    else:
        test_file.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    return subprocess.run([promtool(), "test", "rules", test_file.name], cwd=workdir, capture_output=True,
                          text=True, timeout=120, check=False)
