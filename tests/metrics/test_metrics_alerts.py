"""alerts.yaml and the Grafana dashboard: structure, sane PromQL, and every
``tiered_*`` name they use exists in a PrometheusRecorder's exposition."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from tiered.metrics import PrometheusRecorder
from tiered.metrics.names import (
    ALERTS_PATH,
    DASHBOARD_PATH,
    dashboard_queries,
    declared_sample_names,
    metric_names_in_dashboard,
    metric_names_in_expr,
    metric_names_in_rules,
    present_sample_names,
    rule_exprs,
)
from tiered.store.consumeroffsets import ConsumerPosition, PositionState
from tiered.recorder import Recorder

SEVERITIES = {"critical", "warning", "info"}
DURATION = re.compile(r"^(0|(\d+(ms|s|m|h|d|w|y))+)$")
_PAIRS = {")": "(", "]": "[", "}": "{"}


# -- helpers -----------------------------------------------------------------


def bracket_problem(expr: str) -> str | None:
    """None if (), [] and {} nest properly outside string literals."""
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for ch in expr:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in ")]}":
            if not stack or stack.pop() != _PAIRS[ch]:
                return f"unexpected {ch!r}"
    if quote:
        return "unterminated string"
    return f"unclosed {stack[-1]!r}" if stack else None


def exercise(recorder: Any) -> None:
    """Call every Recorder method once, with values that create every series."""
    recorder.archived("orders", 0, 10, 1000)
    recorder.lag("orders", 0, 5, 500, 12.0)
    recorder.gap("orders", 0, 3)
    recorder.corrupt_record("orders", 0)
    recorder.quarantined("orders", 0)
    recorder.queue_error("dispatch", "orders", 0)
    recorder.round_finished("dispatch", 1.5, True, 1_700_000_000.0)
    recorder.store_request("put", "ok", 0.05)
    recorder.store_retry("put")
    recorder.cold_tier("orders", 0, 10_000, 2, 1_699_999_000_000)
    recorder.cleaner_deleted("orders", 1, 100)
    recorder.orphans_collected(2)
    recorder.merged("orders", 3)
    recorder.skew_detected("orders", 0)
    recorder.forget_queue("gone", 9)
    recorder.recovery("manifest_rebuilt", "orders")
    recorder.recovery("bucket_identity_changed")
    recorder.skipped_busy("clean", "orders", 0)
    recorder.queue_stuck("orders", 1, "corrupt_local_data")
    recorder.queue_committed("orders", 0, 1_700_000_000.0)
    recorder.store_layout({"directory": 1, "queue_type": 1})
    recorder.confirm_offset(2_860_053)
    if hasattr(recorder, "lease_state"):  # the sidecar's, beyond the core's protocol
        recorder.lease_state(True, 1_700_000_120.0)
        recorder.lease_change("acquired")
        recorder.store_probe(True)


_ARCHIVE_ONLY_POSITION = ConsumerPosition(
    group="g", topic="orders", queue_id=0, committed_offset=1, local_min_offset=5, local_max_offset=9,
    archived_first_offset=0, archived_next_offset=9, state=PositionState.ARCHIVE_ONLY)


class _Spy:
    def __init__(self, inner: Any) -> None:
        self.inner, self.called = inner, set()

    def __getattr__(self, name: str) -> Any:
        self.called.add(name)
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def exposition() -> str:
    registry = CollectorRegistry()
    recorder = PrometheusRecorder(registry)
    exercise(recorder)
    recorder.consumers.source = lambda: [_ARCHIVE_ONLY_POSITION]  # scrape-time consumer positions (issue 18)
    return generate_latest(registry).decode()


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS_PATH.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_PATH.read_text(encoding="utf-8"))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows nest theirs
    return out


def panel_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


# -- the exercise covers the protocol -----------------------------------------


def test_exercise_calls_every_recorder_method() -> None:
    spy = _Spy(PrometheusRecorder(CollectorRegistry()))
    exercise(spy)
    protocol = {n for n, m in vars(Recorder).items() if inspect.isfunction(m) and not n.startswith("_")}
    assert spy.called - {"lease_state", "lease_change", "store_probe"} == protocol


# -- names used exist ---------------------------------------------------------


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_name_used_is_exposed(source: str, exposition: str) -> None:
    used = metric_names_in_rules(ALERTS_PATH) if source == "rules" else metric_names_in_dashboard(DASHBOARD_PATH)
    assert len(used) >= 8
    assert used - declared_sample_names(exposition) == set()
    assert used - present_sample_names(exposition) == set()


def test_names_in_runbook_text_exist(rules: list[dict[str, Any]], exposition: str) -> None:
    declared = declared_sample_names(exposition)
    families = declared | {n[: -len("_bucket")] for n in declared if n.endswith("_bucket")}
    for rule in rules:
        text = " ".join(rule["annotations"].values())
        assert metric_names_in_expr(text) - families == set(), rule["alert"]


def test_required_names_are_exposed(exposition: str) -> None:
    required = {
        "tiered_archived_messages_total", "tiered_archived_bytes_total", "tiered_archive_lag_messages",
        "tiered_archive_lag_seconds", "tiered_gaps_total", "tiered_corrupt_records_total",
        "tiered_last_success_timestamp_seconds", "tiered_object_store_requests_total",
        "tiered_cleaner_deleted_segments_total",
    }
    required |= {
        "tiered_queue_stuck", "tiered_queue_last_success_timestamp_seconds", "tiered_object_store_up",
        "tiered_lease_held", "tiered_lease_expiry_timestamp_seconds", "tiered_lease_changes_total",
        "process_start_time_seconds",
    }
    assert required <= present_sample_names(exposition)
    for name in present_sample_names(exposition):
        assert name.startswith(("tiered_", "process_")), name
        assert not name.endswith("_created"), name  # disabled: a third of all series for nothing


def test_helpers_catch_unknown_and_bare_histogram_names(tmp_path: Path, exposition: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "groups:\n- name: x\n  rules:\n"
        "  - alert: A\n    expr: rate(tiered_bogus_total[5m]) > 0\n"
        "  - alert: B\n    expr: histogram_quantile(0.9, rate(tiered_round_duration_seconds[5m])) > 1\n"
        "  - record: r\n    expr: sum(tiered_gaps_total)\n",
        encoding="utf-8",
    )
    assert metric_names_in_rules(bad) - declared_sample_names(exposition) == {
        "tiered_bogus_total",
        "tiered_round_duration_seconds",  # a classic histogram has no bare sample
    }
    board = tmp_path / "board.json"
    board.write_text(json.dumps({
        "panels": [{"type": "row", "panels": [{"targets": [{"expr": "sum(tiered_nope)"}]}]}],
        "templating": {"list": [{"query": {"query": "label_values(tiered_gone_total, topic)"}},
                                {"definition": "label_values(tiered_gaps_total, topic)"}]},
    }))
    assert metric_names_in_dashboard(board) == {"tiered_nope", "tiered_gone_total", "tiered_gaps_total"}
    assert metric_names_in_expr('x{label="$tiered_var"} + tiered_a:rate5m') == {"tiered_a:rate5m"}


def test_declared_names_understand_openmetrics() -> None:
    om = (
        "# TYPE tiered_gaps counter\n# TYPE tiered_build info\n"
        "# TYPE tiered_round_duration_seconds histogram\n# EOF\n"
    )
    assert declared_sample_names(om) == {
        "tiered_gaps_total", "tiered_build_info", "tiered_round_duration_seconds_bucket",
        "tiered_round_duration_seconds_sum", "tiered_round_duration_seconds_count",
        "tiered_round_duration_seconds_created",
    }


# -- alerts.yaml --------------------------------------------------------------


def test_every_rule_is_complete(rules: list[dict[str, Any]]) -> None:
    assert len(rules) >= 6
    names = [rule.get("alert") for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        name = rule.get("alert")
        assert isinstance(name, str) and name.startswith("Tiered"), rule
        assert isinstance(rule.get("expr"), str) and rule["expr"].strip(), name
        assert DURATION.match(str(rule.get("for", ""))), name
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and len(annotations.get("description", "")) > 80, name
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, name


def test_expressions_are_bracket_balanced(rules: list[dict[str, Any]], dashboard: dict[str, Any]) -> None:
    for expr in [r["expr"] for r in rules] + dashboard_queries(DASHBOARD_PATH):
        assert bracket_problem(expr) is None, expr
        assert metric_names_in_expr(expr), expr  # every expression reads one of ours


def test_bracket_checker_can_fail() -> None:
    assert bracket_problem("sum(rate(x[5m])") == "unclosed '('"
    assert bracket_problem("x{a=\"(\"}") is None
    assert bracket_problem("rate(x[5m)]") == "unexpected ')'"
    assert bracket_problem('x{a="b}') == "unterminated string"


def test_required_alerts(rules: list[dict[str, Any]]) -> None:
    by_expr = {r["alert"]: " ".join(r["expr"].split()) for r in rules}
    severity = {r["alert"]: r["labels"]["severity"] for r in rules}

    def find(*needles: str) -> list[str]:
        return [a for a, e in by_expr.items() if all(n in e for n in needles)]

    gap = find("increase(tiered_gaps_total[")
    assert gap and all(severity[a] == "critical" for a in gap)
    assert find("tiered_archive_lag_messages >")
    assert find("tiered_archive_lag_seconds >")
    assert find("tiered_corrupt_records_total")
    assert find("tiered_object_store_requests_total{outcome=~", "/")
    assert find('time() - tiered_last_success_timestamp_seconds{task="dispatch"} > 300')
    assert find('time() - tiered_last_success_timestamp_seconds{task="clean"}')


def test_rule_outcomes_are_known_values(rules: list[dict[str, Any]]) -> None:
    from tiered.metrics import OUTCOMES

    for rule in rules:
        for match in re.findall(r'outcome(?:=|!=|=~|!~)"([^"]*)"', rule["expr"]):
            assert set(match.split("|")) <= set(OUTCOMES), rule["alert"]


def test_rules_parse_as_promql(rules: list[dict[str, Any]], dashboard: dict[str, Any]) -> None:
    promql_parser = pytest.importorskip("promql_parser")  # optional: the real PromQL grammar
    for rule in rules:
        promql_parser.parse(rule["expr"])
    grafana = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "1m"}
    for expr in panel_exprs(dashboard):
        for macro, value in grafana.items():
            expr = expr.replace(macro, value)
        promql_parser.parse(expr.replace("$instance", ".*").replace("$topic", ".*"))


# -- dashboard ----------------------------------------------------------------


def test_dashboard_shape(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and len(dashboard["uid"]) <= 40
    assert dashboard["title"] == "RocketMQ tiered storage"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["topic"]["type"] == "query"
    assert "topic" in variables["topic"]["definition"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24


def test_dashboard_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        g = panel["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, panel["title"]
        cells |= area


def test_dashboard_covers_the_topics(dashboard: dict[str, Any]) -> None:
    used = metric_names_in_dashboard(DASHBOARD_PATH)
    for name in (
        "tiered_archived_messages_total",  # throughput
        "tiered_archive_lag_seconds",  # lag
        "tiered_gaps_total",  # gaps
        "tiered_queue_errors_total",  # errors
        "tiered_object_store_requests_total",  # request rate
        "tiered_object_store_request_duration_seconds_bucket",  # latency
        "tiered_cold_bytes",  # cold tier size
        "tiered_cleaner_deleted_segments_total",  # cleaner
    ):
        assert name in used, name
    topic_filtered = [e for e in panel_exprs(dashboard) if 'topic=~"$topic"' in e]
    assert len(topic_filtered) >= 10


def test_rule_exprs_helper_reads_every_rule(rules: list[dict[str, Any]]) -> None:
    assert rule_exprs(ALERTS_PATH) == [r["expr"] for r in rules]
