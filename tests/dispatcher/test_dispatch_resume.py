"""The skipped-message bug: after a failed upload, archiving must resume AT
the failed message, never at the one after it. These tests fail if any
attempt after a failure starts past the first uncommitted offset."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatchkit import assert_exact, new_dispatcher, new_writer, produce, read_manifest
from faultproxy import FaultProxy, FaultSchedule
from tiered.store.localstore import LocalStore
from tiered.archive.storage import ObjectStore, RetryPolicy, S3Options, open_store

Q = ("Orders", 0)


def _arm(store: ObjectStore, should_fail: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    """Wrap the store's raw calls: ``should_fail(op, key)`` -> raise a
    retriable connection error. Returns the log of failed (op, key)."""
    failed: list[tuple[str, str]] = []

    def wrap(op: str, raw: Callable) -> Callable:  # noqa: ANN202
        def call(key, *args):  # noqa: ANN001, ANN202
            if should_fail(op, key):
                failed.append((op, key))
                raise ConnectionResetError(104, "injected connection reset")
            return raw(key, *args)
        return call

    store._raw_put = wrap("put", store._raw_put)  # type: ignore[method-assign]
    store._raw_put_if = wrap("put_if", store._raw_put_if)  # type: ignore[method-assign]
    return failed


def _starts(store: ObjectStore) -> list[int]:
    m = read_manifest(store, *Q)
    return [s.q_start for s in m.segments] if m else []


@pytest.mark.parametrize(("what", "layout"), [("segment", 2), ("manifest", 2), ("commitlog", 1), ("consumequeue", 1)])
def test_failed_upload_resumes_at_the_failed_message(what, layout, cold_url, open_cold, tmp_path, clock, recorder):
    store = open_cold(cold_url, recorder=recorder, retry=RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.001))
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 40, clock=clock, body_size=100)
    local = LocalStore(tmp_path / "store")
    # layout 1 writes a segment as three objects: the CommitLog's, then the ConsumeQueue's
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1,
                       segment_bytes=1000, max_delay_ms=0, parallelism=1, layout=layout)
    armed = {"on": True}
    state = {"segments_seen": 0}

    def should_fail(op: str, key: str) -> bool:
        # fail every attempt at the third segment's `what` object, while armed
        if not armed["on"]:
            return False
        if what == "manifest":
            if key.endswith("manifest.json"):
                state["segments_seen"] += 1
                return state["segments_seen"] >= 3
            return False
        if f"/{what}/" in key and op == "put":
            name = key.rsplit("/", 1)[1]
            seen = state.setdefault("keys", [])
            if name not in seen:
                seen.append(name)
            return seen.index(name) >= 2
        return False

    failed = _arm(store, should_fail)
    result = d.run_round()
    assert failed, "the fault never fired"
    assert result.errors, "the failure was not reported"
    m = read_manifest(store, *Q)
    committed = m.next_offset
    assert len(m.segments) == 2
    assert committed == m.segments[-1].q_end
    # nothing past the failed message was committed, and no gap was recorded over it
    assert not m.gaps
    assert recorder.queue_errors[("dispatch", *Q)] == 1
    assert recorder.retries  # each failed attempt was retried before giving up

    armed["on"] = False
    clock.advance(1)
    result = d.run_round()
    assert result.ok, result.errors
    starts = _starts(store)
    # the first segment after the failure starts exactly at the failed message
    assert starts[2] == committed, f"resumed at {starts[2]}, the failed message is {committed}"
    assert_exact(store, local, [Q])


def test_failed_upload_over_http_resumes_at_the_failed_message(tmp_path, moto_endpoint, s3_bucket, clock, recorder):
    """The same through the real S3 client path: the proxy answers 500 to
    every PUT of the third segment's object until disarmed."""
    armed = {"on": True}
    names: list[str] = []

    def decide(req):  # noqa: ANN001, ANN202
        if req.method != "PUT" or "/segment/" not in req.key:
            return None
        name = req.key.rsplit("/", 1)[1]
        if name not in names:
            names.append(name)
        return "500" if armed["on"] and names.index(name) == 2 else None

    with FaultProxy(moto_endpoint, FaultSchedule(decide=decide)) as proxy:
        store = open_store(f"s3://{s3_bucket}/archive", s3=S3Options(endpoint_url=proxy.url),
                           retry=RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.001), recorder=recorder)
        with new_writer(tmp_path / "store") as w:
            produce(w, *Q, 40, clock=clock)
        local = LocalStore(tmp_path / "store")
        d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1,
                           segment_bytes=1000, max_delay_ms=0, parallelism=1)
        assert d.run_round().errors
        committed = read_manifest(store, *Q).next_offset
        assert proxy.injected["500"] == 3  # every attempt of the failed upload
        assert recorder.retries["put"] == 2
        armed["on"] = False
        assert d.run_round().ok
        assert _starts(store)[2] == committed
        assert_exact(store, local, [Q])


def test_a_failure_in_the_middle_of_a_catch_up_keeps_what_was_committed(tmp_path, clock, recorder):
    store = open_store(f"file://{tmp_path / 'cold'}", recorder=recorder,
                       retry=RetryPolicy(attempts=1))
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 60, clock=clock)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1,
                       segment_bytes=800, max_delay_ms=0)
    calls = {"n": 0}

    def should_fail(op: str, key: str) -> bool:
        if "/segment/" in key:
            calls["n"] += 1
            return calls["n"] % 4 == 0  # every 4th data upload fails once
        return False

    _arm(store, should_fail)
    offsets_seen: list[int] = []
    for _ in range(30):
        before = read_manifest(store, *Q)
        d._failures.clear()  # no backoff wait between attempts in this test
        d.run_round()
        after = read_manifest(store, *Q)
        if after is not None:
            new = after.segments[len(before.segments) if before else 0:]
            if new:
                assert new[0].q_start == (before.next_offset if before else 0)
                offsets_seen += [s.q_start for s in new]
        if after is not None and after.next_offset == 60:
            break
    assert_exact(store, local, [Q])
    assert recorder.queue_errors[("dispatch", *Q)] >= 1
