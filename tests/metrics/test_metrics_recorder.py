"""PrometheusRecorder: exact values after each Recorder call, per-topic
aggregation, pre-initialised series, protocol conformance, thread safety."""

from __future__ import annotations

import enum
import inspect
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tiered.metrics import ALL_QUEUES, JOBS, OPS, OUTCOMES, PrometheusRecorder
from tiered import __version__, native
from tiered.recorder import NullRecorder, Recorder

STARTED = 1_700_000_000.0


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def rec(registry: CollectorRegistry) -> PrometheusRecorder:
    return PrometheusRecorder(registry, started_s=STARTED)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def protocol_methods() -> list[str]:
    return sorted(n for n, m in vars(Recorder).items() if inspect.isfunction(m) and not n.startswith("_"))


def test_implements_every_protocol_method_with_the_same_signature() -> None:
    names = protocol_methods()
    assert "archived" in names and "skew_detected" in names
    for name in names:
        want = inspect.signature(getattr(Recorder, name))
        got = inspect.signature(getattr(PrometheusRecorder, name))
        assert list(got.parameters) == list(want.parameters), name
    # NullRecorder is the reference implementation of the same protocol.
    assert all(callable(getattr(NullRecorder(), n)) for n in names)


def test_default_registry_is_private() -> None:
    a, b = PrometheusRecorder(), PrometheusRecorder()  # no duplicate-registration error
    a.archived("t", 0, 1, 1)
    assert a.registry.get_sample_value("tiered_archived_messages_total", {"topic": "t"}) == 1
    assert b.registry.get_sample_value("tiered_archived_messages_total", {"topic": "t"}) is None


def test_archived_counts_messages_and_bytes_per_topic(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.archived("orders", 0, 10, 1000)
    rec.archived("orders", 3, 5, 500)
    rec.archived("%DLQ%g1", 0, 1, 7)
    assert value(registry, "tiered_archived_messages_total", topic="orders") == 15
    assert value(registry, "tiered_archived_bytes_total", topic="orders") == 1500
    assert value(registry, "tiered_archived_messages_total", topic="%DLQ%g1") == 1
    assert value(registry, "tiered_archived_bytes_total", topic="%DLQ%g1") == 7


def test_lag_per_queue_last_value_wins(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.lag("orders", 0, 100, 10_000, 12.5)
    rec.lag("orders", 1, 7, 70, 3.0)
    rec.lag("orders", 0, 40, 4_000, 2.0)
    assert value(registry, "tiered_archive_lag_messages", topic="orders", queue="0") == 40
    assert value(registry, "tiered_archive_lag_bytes", topic="orders", queue="0") == 4_000
    assert value(registry, "tiered_archive_lag_seconds", topic="orders", queue="0") == 2.0
    assert value(registry, "tiered_archive_lag_messages", topic="orders", queue="1") == 7
    assert value(registry, "tiered_archive_lag_messages", topic="orders", queue=ALL_QUEUES) is None


def test_per_topic_mode_sums_backlog_and_takes_worst_age(registry: CollectorRegistry) -> None:
    rec = PrometheusRecorder(registry, per_queue=False)
    rec.lag("orders", 0, 100, 10_000, 12.5)
    rec.lag("orders", 1, 7, 70, 30.0)
    rec.lag("orders", 2, 0, 0, 0.0)
    rec.lag("audit", 0, 1, 2, 3.0)
    rec.lag("orders", 0, 50, 5_000, 1.0)  # per-queue values are kept: this replaces queue 0 only
    assert value(registry, "tiered_archive_lag_messages", topic="orders", queue="all") == 57
    assert value(registry, "tiered_archive_lag_bytes", topic="orders", queue="all") == 5_070
    assert value(registry, "tiered_archive_lag_seconds", topic="orders", queue="all") == 30.0
    assert value(registry, "tiered_archive_lag_messages", topic="audit", queue="all") == 1
    assert value(registry, "tiered_archive_lag_messages", topic="orders", queue="0") is None
    text = generate_latest(registry).decode()
    assert 'queue="0"' not in text and 'queue="1"' not in text


def test_forget_queue_drops_its_lag(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.lag("gone", 0, 5, 5, 5.0)
    rec.forget_queue("gone", 0)
    rec.forget_queue("never", 9)  # unknown queue: no error
    assert value(registry, "tiered_archive_lag_messages", topic="gone", queue="0") is None


def test_gap_counts_events_and_lost_messages(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.gap("orders", 0, 120)
    rec.gap("orders", 1, 3)
    assert value(registry, "tiered_gaps_total", topic="orders") == 2
    assert value(registry, "tiered_gap_messages_total", topic="orders") == 123


def test_record_problems_count_per_topic(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.corrupt_record("orders", 0)
    rec.corrupt_record("orders", 1)
    rec.quarantined("orders", 0)
    rec.skew_detected("orders", 2)
    rec.queue_error("dispatch", "orders", 0)
    rec.queue_error("clean", "orders", 0)
    rec.queue_error("clean", "orders", 1)
    assert value(registry, "tiered_corrupt_records_total", topic="orders") == 2
    assert value(registry, "tiered_quarantined_records_total", topic="orders") == 1
    assert value(registry, "tiered_clock_skew_segments_total", topic="orders") == 1
    assert value(registry, "tiered_queue_errors_total", task="dispatch", topic="orders") == 1
    assert value(registry, "tiered_queue_errors_total", task="clean", topic="orders") == 2


def test_first_sight_of_a_topic_creates_its_alert_counters_at_zero(
    rec: PrometheusRecorder, registry: CollectorRegistry
) -> None:
    assert value(registry, "tiered_gaps_total", topic="orders") is None
    rec.lag("orders", 0, 0, 0, 0.0)
    for name in (
        "tiered_gaps_total", "tiered_corrupt_records_total", "tiered_quarantined_records_total",
        "tiered_archived_messages_total", "tiered_cleaner_deleted_segments_total",
    ):
        assert value(registry, name, topic="orders") == 0.0, name
    for job in JOBS:
        assert value(registry, "tiered_queue_errors_total", task=job, topic="orders") == 0.0


def test_job_and_store_series_exist_from_the_start(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    for job in JOBS:
        assert value(registry, "tiered_last_success_timestamp_seconds", task=job) == STARTED
        assert value(registry, "tiered_rounds_total", task=job, outcome="ok") == 0
        assert value(registry, "tiered_rounds_total", task=job, outcome="error") == 0
        assert value(registry, "tiered_round_duration_seconds_count", task=job) == 0
    for op in OPS:
        assert value(registry, "tiered_object_store_retries_total", op=op) == 0
        for outcome in OUTCOMES:
            assert value(registry, "tiered_object_store_requests_total", op=op, outcome=outcome) == 0
    assert value(registry, "tiered_orphans_collected_total") == 0
    assert value(registry, "tiered_build_info", version=__version__) == 1
    assert value(registry, "tiered_native_core_loaded") == (0 if native.core is None else 1)


def test_native_core_gauge_says_when_the_python_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "core", None)
    registry = CollectorRegistry()
    PrometheusRecorder(registry)
    assert value(registry, "tiered_native_core_loaded") == 0


def test_round_finished_updates_last_success_only_on_success(
    rec: PrometheusRecorder, registry: CollectorRegistry
) -> None:
    rec.round_finished("dispatch", 0.3, True, STARTED + 20)
    rec.round_finished("dispatch", 7.0, False, STARTED + 40)
    rec.round_finished("clean", 42.0, True, STARTED + 3600)
    assert value(registry, "tiered_last_success_timestamp_seconds", task="dispatch") == STARTED + 20
    assert value(registry, "tiered_last_success_timestamp_seconds", task="clean") == STARTED + 3600
    assert value(registry, "tiered_rounds_total", task="dispatch", outcome="ok") == 1
    assert value(registry, "tiered_rounds_total", task="dispatch", outcome="error") == 1
    assert value(registry, "tiered_round_duration_seconds_count", task="dispatch") == 2
    assert value(registry, "tiered_round_duration_seconds_sum", task="dispatch") == pytest.approx(7.3)
    assert value(registry, "tiered_round_duration_seconds_bucket", task="dispatch", le="0.5") == 1
    assert value(registry, "tiered_round_duration_seconds_bucket", task="dispatch", le="10.0") == 2


class _Outcome(str, enum.Enum):  # what a storage layer might hand in
    TIMEOUT = "timeout"


def test_store_requests_retries_and_latency(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.store_request("put", "ok", 0.2)
    rec.store_request("put", "throttled", 0.01)
    rec.store_request("get", _Outcome.TIMEOUT, 30.0)
    rec.store_retry("put")
    rec.store_retry("put")
    assert value(registry, "tiered_object_store_requests_total", op="put", outcome="ok") == 1
    assert value(registry, "tiered_object_store_requests_total", op="put", outcome="throttled") == 1
    assert value(registry, "tiered_object_store_requests_total", op="get", outcome="timeout") == 1
    assert value(registry, "tiered_object_store_retries_total", op="put") == 2
    assert value(registry, "tiered_object_store_request_duration_seconds_count", op="put") == 2
    assert value(registry, "tiered_object_store_request_duration_seconds_sum", op="put") == pytest.approx(0.21)
    assert value(registry, "tiered_object_store_request_duration_seconds_bucket", op="get", le="30.0") == 1
    assert value(registry, "tiered_object_store_request_duration_seconds_bucket", op="get", le="10.0") == 0


def test_unknown_op_and_outcome_are_bounded(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.store_request("multipart_upload_part", "SlowDown: secret-ish detail", 0.1)
    rec.store_request("multipart_upload_part", "SlowDown: secret-ish detail", 0.1)
    rec.store_retry("rename")
    assert value(registry, "tiered_object_store_requests_total", op="other", outcome="error") == 2
    assert value(registry, "tiered_object_store_retries_total", op="other") == 1
    assert "secret-ish" not in generate_latest(registry).decode()


def test_negative_counts_are_dropped_not_raised(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.archived("t", 0, -1, -5)
    rec.orphans_collected(-2)
    assert value(registry, "tiered_archived_messages_total", topic="t") == 0
    assert value(registry, "tiered_orphans_collected_total") == 0


def test_cold_tier_shape_per_topic(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.cold_tier("orders", 0, 5_000_000, 12, 1_700_000_123_456)
    rec.cold_tier("empty", 0, 0, 0, None)
    assert value(registry, "tiered_cold_bytes", topic="orders") == 5_000_000
    assert value(registry, "tiered_cold_segments", topic="orders") == 12
    assert value(registry, "tiered_oldest_archived_timestamp_seconds", topic="orders") == 1_700_000_123.456
    assert value(registry, "tiered_cold_bytes", topic="empty") == 0
    assert value(registry, "tiered_oldest_archived_timestamp_seconds", topic="empty") is None
    rec.cold_tier("orders", 0, 1_000, 1, None)  # everything expired: the old timestamp must not linger
    assert value(registry, "tiered_cold_segments", topic="orders") == 1
    assert value(registry, "tiered_oldest_archived_timestamp_seconds", topic="orders") is None


def test_cleaner_activity(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.cleaner_deleted("orders", 3, 3_000)
    rec.cleaner_deleted("orders", 1, 10)
    rec.orphans_collected(4)
    rec.orphans_collected(1)
    rec.merged("orders", 5)
    rec.merged("orders", 2)
    assert value(registry, "tiered_cleaner_deleted_segments_total", topic="orders") == 4
    assert value(registry, "tiered_cleaner_deleted_bytes_total", topic="orders") == 3_010
    assert value(registry, "tiered_orphans_collected_total") == 5
    assert value(registry, "tiered_merges_total", topic="orders") == 2
    assert value(registry, "tiered_merged_segments_total", topic="orders") == 7


def test_labels_carry_no_offsets(rec: PrometheusRecorder, registry: CollectorRegistry) -> None:
    rec.archived("t", 3, 1, 123_456_789)
    rec.lag("t", 3, 1, 987_654_321, 1.0)
    label_values = {
        v for family in registry.collect() for s in family.samples for k, v in s.labels.items() if k != "le"
    }
    assert "123456789" not in label_values and "987654321" not in label_values


@pytest.mark.parametrize("per_queue", [True, False])
def test_many_threads_lose_no_update(per_queue: bool) -> None:
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry, per_queue=per_queue)
    threads, calls = 16, 500
    errors: list[BaseException] = []
    stop = threading.Event()

    def work(qid: int) -> None:
        try:
            for i in range(calls):
                rec.archived(f"topic{qid % 4}", qid, 1, 10)
                rec.lag(f"topic{qid % 4}", qid, i, i * 10, float(i))
                rec.store_request("put", "ok", 0.001)
                rec.cold_tier(f"topic{qid % 4}", qid, i, i, i * 1000)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    def scrape() -> None:
        while not stop.is_set():
            generate_latest(registry)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    workers = [threading.Thread(target=work, args=(q,)) for q in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    scraper.join()
    assert not errors
    total = sum(registry.get_sample_value("tiered_archived_messages_total", {"topic": f"topic{t}"}) for t in range(4))
    assert total == threads * calls
    assert registry.get_sample_value("tiered_object_store_requests_total", {"op": "put", "outcome": "ok"}) == threads * calls
    last = calls - 1
    if per_queue:
        for q in range(threads):
            assert value(registry, "tiered_archive_lag_messages", topic=f"topic{q % 4}", queue=str(q)) == last
    else:
        for t in range(4):
            assert value(registry, "tiered_archive_lag_messages", topic=f"topic{t}", queue="all") == last * threads / 4
            assert value(registry, "tiered_archive_lag_seconds", topic=f"topic{t}", queue="all") == last


def test_storage_layer_uses_only_known_ops_and_outcomes() -> None:
    # The storage wrapper names its ops in source; a new op must join OPS, or
    # it would be recorded as "other".
    import re
    from pathlib import Path

    import tiered

    root = Path(tiered.__file__).parent
    storage = "".join((root / "archive" / name).read_text(encoding="utf-8")
                      for name in ("objectstore.py", "filestore.py", "s3store.py", "storage.py"))
    errors = (root / "errors.py").read_text(encoding="utf-8")
    ops = set(re.findall(r'\brequest\(\s*"(\w+)"', storage))
    outcomes = set(re.findall(r'outcome="(\w+)"', storage + errors))
    assert ops and ops <= set(OPS)
    assert outcomes and outcomes <= set(OUTCOMES)
