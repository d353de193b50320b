"""Faults on the wire: a proxy in front of moto fails a fraction of the calls
with 500 InternalError, 503 SlowDown, a connection reset, a stall past the
client's read timeout, or a reset after the write was applied. The archive
must still be exact, and the retries must be counted."""

from __future__ import annotations

import errno
import random
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from faultproxy import FaultProxy, FaultSchedule
from dispatchkit import CLUSTER, BROKER, assert_exact, new_dispatcher, new_writer, produce
from tiered.metrics import PrometheusRecorder
from tiered.archive.coldtier import ColdTier
from tiered.errors import BadResponseError, PreconditionFailedError
from tiered.store.localstore import LocalStore
from tiered.archive.storage import FileStore, RetryPolicy, S3Options, open_store
from tiered.ops.verify import verify

pytestmark = pytest.mark.s3

FAST_RETRY = RetryPolicy(attempts=8, base_delay=0.001, max_delay=0.02)
QUEUES = [("TopicA", 0), ("TopicA", 1), ("%DLQ%group", 0)]


def _proxied_store(proxy: FaultProxy, bucket: str, recorder, read_timeout: float = 0.5):  # noqa: ANN001, ANN202
    return open_store(f"s3://{bucket}/archive", s3=S3Options(endpoint_url=proxy.url, read_timeout=read_timeout,
                                                             connect_timeout=2.0),
                      retry=FAST_RETRY, recorder=recorder)


def test_faulty_s3_keeps_the_archive_exact_and_counts_retries(tmp_path, moto_endpoint, s3_bucket, clock):
    registry = CollectorRegistry()
    recorder = PrometheusRecorder(registry)
    schedule = FaultSchedule(rate=0.2, seed=7)
    with FaultProxy(moto_endpoint, schedule, stall_s=0.8) as proxy:
        store = _proxied_store(proxy, s3_bucket, recorder)
        with new_writer(tmp_path / "store") as w:
            local = LocalStore(tmp_path / "store")
            d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder,
                               upload_bytes=2000, segment_bytes=3000, max_delay_ms=1000, parallelism=3)
            for step in range(4):
                for topic, qid in QUEUES:
                    produce(w, topic, qid, 15, clock=clock, seed=step)
                clock.advance(2)
                for _ in range(3):
                    d.run_round()
            for _ in range(5):  # whatever a queue's last failure left pending
                clock.advance(60)
                d.run_round()
        assert proxy.injected, "the schedule injected no fault"
        assert set(proxy.injected) == {"500", "503", "reset", "stall", "reset_after"}, proxy.injected
    clean = open_store(f"s3://{s3_bucket}/archive", s3=S3Options(endpoint_url=moto_endpoint))
    counts = assert_exact(clean, local, QUEUES)
    assert all(n == 60 for n in counts.values()), counts
    report = verify(ColdTier(clean, CLUSTER, BROKER), local)
    assert report.ok, report.problems
    retries = sum(s.value for m in registry.collect() if m.name == "tiered_object_store_retries"
                  for s in m.samples if s.name == "tiered_object_store_retries_total")
    assert retries > 0
    outcomes = {s.labels["outcome"] for m in registry.collect() if m.name == "tiered_object_store_requests"
                for s in m.samples if s.name == "tiered_object_store_requests_total" and s.value > 0}
    assert {"throttled", "timeout", "error"} <= outcomes, outcomes


@pytest.mark.parametrize("kind", ["500", "503", "reset", "stall", "reset_after"])
def test_each_fault_kind_is_translated_and_retried(kind, moto_endpoint, s3_bucket, recorder):
    """Every other request for a method and key fails with ``kind``: each
    call's first attempt fails, its retry succeeds."""
    seen: Counter[tuple[str, str]] = Counter()

    def decide(req):  # noqa: ANN001, ANN202
        mark = (req.method, req.key)
        seen[mark] += 1
        return kind if seen[mark] % 2 == 1 else None

    with FaultProxy(moto_endpoint, FaultSchedule(decide=decide), stall_s=0.4) as proxy:
        store = _proxied_store(proxy, s3_bucket, recorder, read_timeout=0.25)
        store.put("a/obj", b"x" * 100)
        assert store.get("a/obj") == b"x" * 100
        assert store.get_range("a/obj", 10, 20) == b"x" * 10
        if kind == "reset_after":
            # The first attempt landed and its response was lost: the retry's
            # precondition fails. Callers (ColdTier.commit, LeaseManager) read
            # back and recognise their own write; the store only reports.
            with pytest.raises(PreconditionFailedError):
                store.put_if_absent("a/cond", b"v1")
            data, etag = store.get_with_etag("a/cond")
            assert data == b"v1"
            with pytest.raises(PreconditionFailedError):
                store.put_if_match("a/cond", b"v2", etag)
        else:
            etag = store.put_if_absent("a/cond", b"v1")
            assert store.get_with_etag("a/cond")[0] == b"v1"
            store.put_if_match("a/cond", b"v2", etag)
        assert store.get("a/cond") == b"v2"
        assert [o.key for o in store.list_keys("a/")] == ["a/cond", "a/obj"]
        assert store.head("a/obj").size == 100
        store.delete_many(["a/obj"])
        assert store.head("a/obj") is None
    # s3fs's aiohttp session silently re-sends an idempotent request once
    # when a pooled connection is reset; boto3 calls are never retried
    # outside ObjectStore.request, so each of them counts its retry.
    assert recorder.retries["put_if_absent"] + recorder.retries["put_if_match"] >= 1, recorder.retries
    assert sum(recorder.retries.values()) >= 4, recorder.retries


def test_faults_at_the_storage_interface_on_file(tmp_path, clock, recorder):
    """The same guarantee on file://: a wrapper fails a fraction of the calls
    with retriable OS errors (EIO, EBUSY, a timeout)."""
    rng = random.Random(3)

    class FlakyFileStore(FileStore):
        def _maybe_fail(self) -> None:
            if rng.random() < 0.25:
                raise rng.choice([OSError(errno.EIO, "I/O error"), OSError(errno.EBUSY, "busy"), TimeoutError()])

        def _raw_put(self, key, data, crc=None):  # noqa: ANN001, ANN202
            self._maybe_fail()
            return super()._raw_put(key, data, crc)

        def _raw_put_if(self, key, data, etag):  # noqa: ANN001, ANN202
            self._maybe_fail()
            return super()._raw_put_if(key, data, etag)

        def _raw_get_etag(self, key):  # noqa: ANN001, ANN202
            self._maybe_fail()
            return super()._raw_get_etag(key)

    store = FlakyFileStore(str(tmp_path / "cold"), retry=FAST_RETRY, recorder=recorder)
    store._sleep = lambda s: None
    with new_writer(tmp_path / "store") as w:
        local = LocalStore(tmp_path / "store")
        d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder,
                           upload_bytes=1500, segment_bytes=2500, max_delay_ms=1000)
        for step in range(3):
            for topic, qid in QUEUES:
                produce(w, topic, qid, 20, clock=clock, seed=step)
            clock.advance(2)
            d.run_round()
        for _ in range(4):
            clock.advance(60)
            d.run_round()
    counts = assert_exact(FileStore(str(tmp_path / "cold")), local, QUEUES)
    assert all(n == 60 for n in counts.values())
    assert recorder.retries["put"] > 0


@pytest.mark.parametrize("fault", ["bad_response", "corrupt_local"])
def test_a_store_failure_is_not_a_stuck_queue_a_data_stop_is(fault, tmp_path, clock, recorder):
    """The stuck metric follows what the error carries: a store answering
    garbage fails the queue (retried next round) without calling it stuck,
    corrupt local data stops it as corrupt_local_data."""
    healthy = [False]

    class SpoilingFileStore(FileStore):
        def _raw_put(self, key, data, crc=None):  # noqa: ANN001, ANN202
            if fault == "bad_response" and not healthy[0]:
                raise BadResponseError("put", key, "no ETag")
            return super()._raw_put(key, data, crc)

    store = SpoilingFileStore(str(tmp_path / "cold"), retry=FAST_RETRY, recorder=recorder)
    store._sleep = lambda s: None
    with new_writer(tmp_path / "store") as w:
        produce(w, "TopicA", 0, 10, clock=clock, body_size=300)
    local = LocalStore(tmp_path / "store")
    if fault == "corrupt_local":
        item = next(iter(local.iter_queue("TopicA", 0, 4, max_count=1, verify_crc=False)))
        path = tmp_path / "store" / "commitlog" / f"{0:020d}"
        with open(path, "r+b") as fh:
            fh.seek(item.record.physical_offset + 100)  # inside the body: the CRC fails
            fh.write(bytes([fh.read(1)[0] ^ 0x5A]))
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0)
    result = d.run_round()
    assert list(result.errors) == ["TopicA/0"]
    if fault == "bad_response":
        assert "bad response: no ETag" in result.errors["TopicA/0"] and recorder.stuck == {}
        healthy[0] = True
        clock.advance(60)
        assert d.run_round().ok and recorder.stuck == {}
        assert_exact(FileStore(str(tmp_path / "cold")), local, [("TopicA", 0)])
    else:
        assert recorder.stuck == {("TopicA", 0): "corrupt_local_data"}
