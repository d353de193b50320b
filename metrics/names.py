"""Which ``tiered_*`` metrics the alert rules and the dashboard refer to.

Shared by the unit test (against a freshly exercised ``PrometheusRecorder``)
and the live-service test (against a real scrape), so that a renamed metric
breaks a test instead of silently blanking a panel or muting an alert.

Names are compared as sample names: a histogram family ``x`` declares
``x_bucket``, ``x_sum`` and ``x_count`` (that is the "strip the suffix"
rule, applied in the other direction, so a bare ``x`` in PromQL, which
matches nothing for a classic histogram, is reported as unknown).

Names are found with a regex over PromQL text, which is enough for our own
files: a ``tiered_`` token not preceded by an identifier character. It would
also match a ``tiered_`` word inside a quoted label value; we have none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

_NAME = re.compile(r"(?<![A-Za-z0-9_:$])tiered_[A-Za-z0-9_:]*")
_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)", re.MULTILINE)
# The sample names a family of each type exposes, as suffixes of the family
# name ("" = the bare name). Text-format counters already end in "_total".
_SAMPLE_SUFFIXES = {
    "counter": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
}

PACKAGE_DIR = Path(__file__).resolve().parent
ALERTS_PATH = PACKAGE_DIR / "alerts.yaml"
DASHBOARD_PATH = PACKAGE_DIR / "dashboards" / "tiered.json"


def metric_names_in_expr(expr: str) -> set[str]:
    """Every ``tiered_*`` name in a PromQL expression, as written (with any
    ``_bucket``/``_sum``/``_count``/``_total`` suffix)."""
    return set(_NAME.findall(expr))


def rule_exprs(path: str | Path) -> list[str]:
    """The ``expr`` of every alerting or recording rule in a rules file."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    return [
        str(rule["expr"])
        for group in doc.get("groups") or []
        for rule in group.get("rules") or []
        if "expr" in rule
    ]


def metric_names_in_rules(path: str | Path) -> set[str]:
    """``tiered_*`` names used by the rules file at ``path``."""
    return {name for expr in rule_exprs(path) for name in metric_names_in_expr(expr)}


def dashboard_queries(path: str | Path) -> list[str]:
    """Every PromQL string of a Grafana dashboard: panel targets (rows
    included, collapsed or not) and template variable queries."""
    return list(_queries(json.loads(Path(path).read_text(encoding="utf-8"))))


def metric_names_in_dashboard(path: str | Path) -> set[str]:
    """``tiered_*`` names used by the Grafana dashboard JSON at ``path``."""
    return {name for query in dashboard_queries(path) for name in metric_names_in_expr(query)}


def declared_sample_names(exposition: str) -> set[str]:
    """Sample names an exposition declares with ``# TYPE`` lines, whether or
    not a sample is present yet (a labelled counter nobody incremented still
    has its ``# TYPE`` line). Understands both the Prometheus text format
    (counter names carry ``_total``) and OpenMetrics (they do not)."""
    names: set[str] = set()
    for family, kind in _TYPE_LINE.findall(exposition):
        if kind == "counter" and not family.endswith("_total"):
            family += "_total"  # OpenMetrics names the family without it
        elif kind == "info" and not family.endswith("_info"):
            family += "_info"
        names.update(family + suffix for suffix in _SAMPLE_SUFFIXES.get(kind, ("",)))
    return names


def present_sample_names(exposition: str) -> set[str]:
    """Sample names that have at least one sample in an exposition."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def _queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if node.get("type") == "datasource":
            return  # a data source variable's "query" is a plugin id, not PromQL
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                yield value["query"]  # Grafana 9+ variable: {"query": "...", "refId": ...}
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)
