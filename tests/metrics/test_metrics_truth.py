"""Health signals on bad days, through the real dispatcher and recorder: an
object-store outage (a proxy in front of moto answering 500), a queue stuck
on corrupt data, data the broker deletes before it was ever archived, and
the series count of a large broker."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dispatchkit import assert_exact, new_dispatcher, new_writer, produce, read_manifest
from faultproxy import FaultProxy, FaultSchedule
from metrics import PrometheusRecorder
from tiered.codec import CQ_ENTRY_SIZE
from tiered.clock import ManualClock
from tiered.localstore import LocalStore
from tiered.storage import RetryPolicy, S3Options, open_store

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
