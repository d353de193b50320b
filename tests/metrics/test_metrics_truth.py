"""Health signals on bad days, through the real dispatcher and recorder: an
object-store outage (a proxy in front of moto answering 500), a queue stuck
on corrupt data, data the broker deletes before it was ever archived, and
the series count of a large broker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dispatchkit import assert_exact, expire_below, new_dispatcher, new_writer, produce, read_manifest
from faultproxy import FaultProxy, FaultSchedule
from tiered.metrics import PrometheusRecorder
from tiered.clock import ManualClock
from tiered.store.localstore import LocalStore
from tiered.archive.storage import RetryPolicy, S3Options, open_store

A0, A1 = ("Orders", 0), ("Orders", 1)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def lag(registry: CollectorRegistry, q: tuple[str, int], what: str) -> float | None:
    return value(registry, f"tiered_archive_lag_{what}", topic=q[0], queue=str(q[1]))


def queue_bytes(local: LocalStore, q: tuple[str, int], start: int) -> int:
    return sum(item.record.size for item in local.iter_queue(*q, start))


@pytest.mark.s3
def test_store_outage_lag_grows_and_last_success_stops(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry, started_s=clock.now_ms() / 1000)
    down = {"now": False}
    schedule = FaultSchedule(decide=lambda req: "500" if down["now"] else None)
    with FaultProxy(moto_endpoint, schedule) as proxy, new_writer(tmp_path / "store") as w:
        store = open_store(f"s3://{s3_bucket}/archive", s3=S3Options(endpoint_url=proxy.url),
                           retry=RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.002), recorder=rec)
        local = LocalStore(tmp_path / "store")
        for q in (A0, A1):
            produce(w, *q, 20, clock=clock)
        d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=rec, max_delay_ms=1000)
        clock.advance(2)
        assert d.run_round().ok
        good_s = clock.now_ms() / 1000
        assert value(rec.registry, "tiered_last_success_timestamp_seconds", task="dispatch") == good_s
        assert value(registry, "tiered_queue_last_success_timestamp_seconds", topic="Orders", queue="0") == good_s
        assert value(registry, "tiered_object_store_up") == 1
        assert lag(registry, A0, "messages") == 0

        produced_ms = clock.now_ms()
        for q in (A0, A1):
            produce(w, *q, 7, clock=clock)
        down["now"] = True
        for minute in range(1, 6):
            clock.advance(60)
            result = d.run_round()
            assert not result.ok
            for q in (A0, A1):
                # recomputed from the local store every round, not frozen at its last good value
                assert lag(registry, q, "messages") == 7
                assert lag(registry, q, "bytes") == queue_bytes(local, q, 20)
                assert lag(registry, q, "seconds") == (clock.now_ms() - produced_ms) / 1000
            assert value(registry, "tiered_last_success_timestamp_seconds", task="dispatch") == good_s
            assert value(registry, "tiered_queue_last_success_timestamp_seconds", topic="Orders", queue="1") == good_s
            assert value(registry, "tiered_object_store_up") == 0
            assert value(registry, "tiered_rounds_total", task="dispatch", outcome="error") == minute
        # transport failures are the store's, not the queues': nothing reads as stuck
        assert "tiered_queue_stuck{" not in generate_latest(registry).decode()

        down["now"] = False
        clock.advance(700)  # past any back-off
        assert d.run_round().ok
        back_s = clock.now_ms() / 1000
        assert value(registry, "tiered_last_success_timestamp_seconds", task="dispatch") == back_s
        for q in (A0, A1):
            assert lag(registry, q, "messages") == lag(registry, q, "bytes") == lag(registry, q, "seconds") == 0
            assert value(registry, "tiered_queue_last_success_timestamp_seconds", topic=q[0],
                         queue=str(q[1])) == back_s
        assert value(registry, "tiered_object_store_up") == 1
        assert_exact(open_store(f"s3://{s3_bucket}/archive", s3=S3Options(endpoint_url=moto_endpoint)), local,
                     [A0, A1])


def _flip_body_byte(store_dir: Path, local: LocalStore, q: tuple[str, int], offset: int) -> None:
    item = next(iter(local.iter_queue(*q, offset, max_count=1, verify_crc=False)))
    phys = item.record.physical_offset
    start = max(int(f.name) for f in (store_dir / "commitlog").iterdir() if int(f.name) <= phys)
    with open(store_dir / "commitlog" / f"{start:020d}", "r+b") as fh:
        fh.seek(phys - start + 100)  # inside the body
        b = fh.read(1)
        fh.seek(phys - start + 100)
        fh.write(bytes([b[0] ^ 0x5A]))


def test_stuck_queue_exports_lag_and_state_until_it_moves(tmp_path: Path) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry, started_s=clock.now_ms() / 1000)
    sd = tmp_path / "store"
    store = open_store(f"file://{tmp_path / 'cold'}", recorder=rec)
    produced_ms = clock.now_ms()
    with new_writer(sd) as w:
        for q in (A0, A1):
            produce(w, *q, 10, clock=clock, body_size=300)
    local = LocalStore(sd)
    _flip_body_byte(sd, local, A0, 4)
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=rec, upload_bytes=1, max_delay_ms=0)
    stuck = {"topic": "Orders", "queue": "0", "reason": "corrupt_local_data"}
    for _ in range(4):
        clock.advance(700)  # each round past the back-off: the queue is retried and stops again
        result = d.run_round()
        assert list(result.errors) == ["Orders/0"]
        assert value(registry, "tiered_queue_stuck", **stuck) == 1
        assert lag(registry, A0, "messages") == 6  # offsets 4..9 wait behind the corrupt record
        assert lag(registry, A0, "bytes") == queue_bytes(local, A0, 5) + next(iter(
            local.iter_queue(*A0, 4, max_count=1, verify_crc=False))).record.size
        assert lag(registry, A0, "seconds") == (clock.now_ms() - produced_ms) / 1000  # grows while stuck
        assert lag(registry, A1, "messages") == 0
    assert value(registry, "tiered_queue_stuck", topic="Orders", queue="1", reason="corrupt_local_data") is None
    # a data stop is the queue's alert, not a stalled dispatcher
    assert value(registry, "tiered_last_success_timestamp_seconds", task="dispatch") == clock.now_ms() / 1000
    _flip_body_byte(sd, local, A0, 4)  # repaired: the queue moves again
    clock.advance(700)
    assert d.run_round().ok
    assert value(registry, "tiered_queue_stuck", **stuck) is None
    assert lag(registry, A0, "messages") == 0
    assert read_manifest(store, *A0).next_offset == 10


def test_data_deleted_before_the_first_archive_is_a_gap(tmp_path: Path) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry, started_s=clock.now_ms() / 1000)
    sd = tmp_path / "store"
    store = open_store(f"file://{tmp_path / 'cold'}", recorder=rec)
    with new_writer(sd) as w:
        produce(w, *A0, 300, clock=clock, body_size=300)
    local = LocalStore(sd)
    # the sidecar sees the queue from offset 0 but cannot archive yet (the
    # object store is down, or it is below its thresholds: here the delay)
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=rec, max_delay_ms=3_600_000)
    assert d.run_round().ok
    assert read_manifest(store, *A0) is None
    assert lag(registry, A0, "messages") == 300
    starts = sorted(int(f.name) for f in (sd / "commitlog").iterdir())
    expire_below(sd, starts[2])
    first = LocalStore(sd).queue_range(*A0).min_offset
    assert first > 0
    clock.advance(3600)
    result = d.run_round()
    assert result.ok, result.errors
    m = read_manifest(store, *A0)
    assert [(g.q_start, g.q_end, g.reason) for g in m.gaps] == [(0, first, "expired_locally")]
    assert m.first_offset == 0 and m.next_offset == 300
    assert value(registry, "tiered_gaps_total", topic="Orders") == 1
    assert value(registry, "tiered_gap_messages_total", topic="Orders") == first
    assert_exact(store, LocalStore(sd), [A0])


def test_series_per_queue_at_a_large_broker() -> None:
    """900 queues: 100 topics of 8 queues and 100 retry topics of 1, every
    per-queue and per-topic series created, a few queues stuck."""
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry)
    queues = [(f"T{t}", q) for t in range(100) for q in range(8)] + [(f"%RETRY%g{t}", 0) for t in range(100)]
    for topic, q in queues:
        rec.archived(topic, q, 10, 1000)
        rec.lag(topic, q, 1, 100, 2.0)
        rec.cold_tier(topic, q, 1000, 1, 1_700_000_000_000)
        rec.queue_committed(topic, q, 1_700_000_000.0)
        rec.gap(topic, q, 1)
        rec.cleaner_deleted(topic, 1, 10)
        rec.merged(topic, 2)
        rec.queue_error("clean", topic, q)
    for topic, q in queues[:5]:
        rec.queue_stuck(topic, q, "corrupt_local_data")
    rec.store_request("put", "ok", 0.1)
    rec.lease_state(True, 1_700_000_120.0)
    text = generate_latest(registry).decode()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) <= 10 * len(queues), len(series)
    assert not [s for s in series if re.match(r"\w+_created[{ ]", s)]
    assert not [s for s in series if re.search(r'[{,](job|instance)="', s)]
    per_queue = [s for s in series if 'queue="3"' in s and 'topic="T7"' in s]
    assert len(per_queue) == 4  # lag messages, bytes, seconds; last success
    assert sum('tiered_queue_stuck{' in s for s in series) == 5


def test_a_queue_no_longer_watched_loses_its_series(tmp_path: Path) -> None:
    from tiered.dispatcher import TopicFilter

    clock = ManualClock()
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry)
    with new_writer(tmp_path / "store") as w:
        for q in (A0, ("Audit", 0)):
            produce(w, *q, 5, clock=clock)
    store = open_store(f"file://{tmp_path / 'cold'}", recorder=rec)
    d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, recorder=rec,
                       max_delay_ms=3_600_000)
    d.run_round()
    assert lag(registry, ("Audit", 0), "messages") == 5 and lag(registry, A0, "messages") == 5
    d.filter = TopicFilter(exclude=("Audit",))
    d.run_round()
    assert lag(registry, ("Audit", 0), "messages") is None
    assert value(registry, "tiered_rounds_total", task="dispatch", outcome="error") == 0
    assert lag(registry, A0, "messages") == 5
