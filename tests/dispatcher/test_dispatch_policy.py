"""What a round decides, with a manual clock: size and age thresholds, the
first archive's start position, topic filters, bounded parallelism and
memory, catch-up, the per-round budget, idle rounds, and the backoff of a
failing queue."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

from dispatchkit import BROKER, CLUSTER, CountingRecorder, assert_exact, new_dispatcher, new_writer, produce, read_manifest
from tiered.dispatcher import TopicFilter, is_system_topic
from tiered.dispatcher.filters import TopicVerdict
from tiered.store.localstore import LocalStore
from tiered.archive.storage import FileStore, RetryPolicy

Q = ("Policy", 0)
WRITES = ("put", "put_if_absent", "put_if_match")


def _file_store(tmp_path, recorder=None):  # noqa: ANN001, ANN202
    return FileStore(str(tmp_path / "cold"), recorder=recorder, retry=RetryPolicy(attempts=1))


def test_size_threshold(tmp_path, clock, recorder):
    store = _file_store(tmp_path, recorder)
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=6000,
                       max_delay_ms=3_600_000, segment_bytes=1 << 20)
    d.start()  # takes the lease: a write, but not one of the round's
    before = sum(recorder.total_requests(op) for op in WRITES)
    produce(w, *Q, 10, clock=clock, body_size=200)  # ~3 KB
    assert d.run_round().segments == 0
    assert read_manifest(store, *Q) is None
    assert sum(recorder.total_requests(op) for op in WRITES) == before
    produce(w, *Q, 15, clock=clock, body_size=200)  # now > 6 KB pending
    r = d.run_round()
    assert r.segments == 1 and r.messages == 25
    w.close()


def test_age_threshold_counts_from_the_oldest_pending_message(tmp_path, clock, recorder):
    store = _file_store(tmp_path, recorder)
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1 << 30,
                       max_delay_ms=10_000)
    produce(w, *Q, 3, clock=clock)
    clock.advance(9)
    produce(w, *Q, 3, clock=clock)  # young
    assert d.run_round().segments == 0  # oldest is 9 s old
    clock.advance(1)
    r = d.run_round()  # oldest is 10 s old: everything pending goes, young ones too
    assert r.segments == 1 and r.messages == 6
    clock.advance(5)
    produce(w, *Q, 2, clock=clock)
    assert d.run_round().segments == 0
    w.close()


def test_start_position_earliest_latest_and_timestamp(tmp_path, clock):
    w = new_writer(tmp_path / "store")
    t0 = clock.now_ms()
    for i in range(10):
        produce(w, "Early", 0, 1, clock=clock, seed=i)
        produce(w, "Late", 0, 1, clock=clock, seed=i)
        produce(w, "Timed", 0, 1, clock=clock, seed=i)
        clock.advance(1)
    local = LocalStore(tmp_path / "store")
    stamp = datetime.fromtimestamp((t0 + 5_000) / 1000, tz=timezone.utc).isoformat()
    kw = dict(upload_bytes=1, max_delay_ms=0)
    stores = {}
    for pos, topic in (("earliest", "Early"), ("latest", "Late"), (stamp, "Timed")):
        stores[topic] = FileStore(str(tmp_path / f"cold-{topic}"))
        d = new_dispatcher(stores[topic], local, tmp_path / f"state-{topic}", clock, start_position=pos,
                           topic_filter=TopicFilter(include=(topic,)), **kw)
        d.run_round()
        produce(w, topic, 0, 4, clock=clock, seed=99)
        d.run_round()
    assert read_manifest(stores["Early"], "Early", 0).first_offset == 0
    late = read_manifest(stores["Late"], "Late", 0)
    assert (late.first_offset, late.next_offset) == (10, 14)  # only what came after the first look
    assert read_manifest(stores["Timed"], "Timed", 0).first_offset == 5
    for topic in stores:
        assert_exact(stores[topic], local, [(topic, 0)])
    w.close()


def test_topic_filter():
    f = TopicFilter()
    for system in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_wheel_timer", "TBW102",
                   "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC"):
        assert is_system_topic(system) and not f.accepts(system), system
    for ordinary in ("Orders", "%RETRY%group", "%DLQ%group", "rmq_sys", "%LMQ%q1"):
        assert f.accepts(ordinary), ordinary
    f = TopicFilter(include=("Orders*", "%DLQ%*", "SCHEDULE_TOPIC_XXXX"), exclude=("*Test",))
    assert f.accepts("Orders") and f.accepts("OrdersEU") and f.accepts("%DLQ%g")
    assert not f.accepts("OrdersTest") and not f.accepts("%RETRY%g") and not f.accepts("Payments")
    assert f.accepts("SCHEDULE_TOPIC_XXXX")  # a system topic named explicitly
    assert not TopicFilter(include=("*",)).accepts("RMQ_SYS_TRACE_TOPIC")  # never through a wildcard
    assert TopicFilter(include_system=True).accepts("RMQ_SYS_TRACE_TOPIC")
    assert not TopicFilter(extra_system=frozenset({"DefaultCluster"})).accepts("DefaultCluster")


def test_filters_decide_what_a_round_archives(tmp_path, clock):
    w = new_writer(tmp_path / "store")
    topics = ["Orders", "OrdersTest", "%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC", "broker-a"]
    for t in topics:
        produce(w, t, 0, 3, clock=clock)
    local = LocalStore(tmp_path / "store")
    store = FileStore(str(tmp_path / "cold"))
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       topic_filter=TopicFilter(exclude=("*Test",), extra_system=frozenset({"broker-a"})))
    d.run_round()
    archived = {t for t in topics if read_manifest(store, t, 0) is not None}
    assert archived == {"Orders", "%RETRY%g", "%DLQ%g"}
    w.close()


def test_parallelism_and_memory_are_bounded(tmp_path, clock):
    """At most ``parallelism`` segments are in flight at once, and no segment
    exceeds ``segment_bytes``: memory is bounded by their product."""
    store = _file_store(tmp_path)
    active = {"now": 0, "max": 0}
    lock = threading.Lock()
    raw_put = store._raw_put

    def slow_put(key, data, *crc):  # noqa: ANN001, ANN002, ANN202
        if "/segment/" in key:  # a segment's object (layout 2)
            with lock:
                active["now"] += 1
                active["max"] = max(active["max"], active["now"])
            time.sleep(0.005)  # keep uploads in flight long enough to overlap
            try:
                return raw_put(key, data, *crc)
            finally:
                with lock:
                    active["now"] -= 1
        return raw_put(key, data, *crc)

    store._raw_put = slow_put  # type: ignore[method-assign]
    w = new_writer(tmp_path / "store", commitlog_file_size=1 << 20)
    queues = [("Par", q) for q in range(8)]
    for q in queues:
        produce(w, *q, 40, clock=clock, body_size=200)
    w.close()
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=3000, parallelism=3)
    r = d.run_round()
    assert r.ok and r.messages == 320
    assert 1 < active["max"] <= 3
    for q in queues:
        assert all(s.nbytes <= 3000 for s in read_manifest(store, *q).segments)
    assert_exact(store, local, queues)


def test_catch_up_uploads_several_segments_in_one_round(tmp_path, clock):
    store = _file_store(tmp_path)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 200, clock=clock, body_size=200)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=4000)
    r = d.run_round()
    assert r.messages == 200 and r.segments >= 10 and r.lag_messages == 0
    assert_exact(store, local, [Q])


def test_round_budget_lets_every_queue_progress(tmp_path, clock):
    """A huge backlog on one queue does not starve the others: every queue
    gets a segment in turn, the big one catches up only while the budget
    lasts, and continues next round. Each upload takes 1 s of manual time."""
    store = _file_store(tmp_path)
    raw_put = store._raw_put

    def timed_put(key, data, *crc):  # noqa: ANN001, ANN002, ANN202
        if "/segment/" in key:  # a segment's object (layout 2)
            clock.advance(1)
        return raw_put(key, data, *crc)

    store._raw_put = timed_put  # type: ignore[method-assign]
    big, big2 = ("Huge", 0), ("Huge", 1)
    small = [("Small", q) for q in range(3)]
    with new_writer(tmp_path / "store", commitlog_file_size=1 << 20) as w:
        produce(w, *big, 400, clock=clock, body_size=200)
        produce(w, *big2, 400, clock=clock, body_size=200)
        for q in small:
            produce(w, *q, 5, clock=clock, body_size=200)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=4000, parallelism=1, round_budget_s=10)
    r = d.run_round()
    for q in small:
        assert read_manifest(store, *q).next_offset == 5, "a small queue was starved"
    m1, m2 = read_manifest(store, *big), read_manifest(store, *big2)
    assert 0 < m1.next_offset < 400 and 0 < m2.next_offset < 400
    assert abs(len(m1.segments) - len(m2.segments)) <= 1  # the two backlogs share the budget in turns
    assert r.segments <= 10 + len(small) + 2
    assert r.lag_messages > 0
    for _ in range(20):
        if d.run_round().lag_messages == 0:
            break
    assert_exact(store, local, [big, big2, *small])


def test_idle_round_makes_no_request(cold_url, open_cold, tmp_path, clock):
    rec = CountingRecorder()
    store = open_cold(cold_url, recorder=rec)
    queues = [("Idle", q) for q in range(50)]
    w = new_writer(tmp_path / "store")
    for q in queues:
        produce(w, *q, 2, clock=clock)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=rec, upload_bytes=1 << 20,
                       max_delay_ms=60_000, identity_check_s=60.0)
    clock.advance(60)
    assert d.run_round().messages == 100
    produce(w, "Pending", 0, 2, clock=clock)  # below both thresholds: waits, reading only the identity
    w.close()
    before, gets = rec.total_requests(), rec.total_requests("get")
    for _ in range(3):
        clock.advance(1)
        r = d.run_round()
        assert r.ok and r.segments == 0
    # a round with new data reads the bucket identity first (a new or emptied
    # bucket is noticed before anything is written), whether it writes or not
    assert rec.total_requests() - before == 3 == rec.total_requests("get") - gets, rec.requests
    clock.advance(60)
    assert d.run_round().messages == 2
    # a round in which no queue has new data makes no request, for up to a minute
    before = rec.total_requests()
    for _ in range(5):
        clock.advance(11)
        r = d.run_round()
        assert r.ok and r.segments == 0
    assert rec.total_requests() == before, rec.requests  # 55 s since the last identity read
    clock.advance(5)
    assert d.run_round().ok
    # then one GET, the identity, and again none until the next minute
    assert rec.total_requests() - before == 1, rec.requests
    clock.advance(30)
    assert d.run_round().ok and rec.total_requests() - before == 1
    # after a restart with the manifest cache on disk: its first round reads the identity only
    d2 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, recorder=rec,
                        upload_bytes=1 << 20, max_delay_ms=60_000)
    d2.start()
    before = rec.total_requests()
    clock.advance(1)
    d2.run_round()
    assert rec.total_requests() - before == 1  # the identity only
    clock.advance(1)
    d2.run_round()
    assert rec.total_requests() - before == 1


def test_an_emptied_bucket_is_noticed_by_idle_rounds_within_the_identity_interval(cold_url, open_cold, tmp_path,
                                                                                  clock):
    store = open_cold(cold_url)
    queues = [("Gone", q) for q in range(3)]
    with new_writer(tmp_path / "store") as w:
        for q in queues:
            produce(w, *q, 4, clock=clock)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       identity_check_s=60.0)
    assert d.run_round().messages == 12
    store.delete_many([o.key for o in store.list_keys("")])  # emptied under the idle dispatcher
    clock.advance(30)
    r = d.run_round()  # idle, identity read 30 s ago: not noticed yet, nothing written
    assert r.ok and r.messages == 0 and store.list_keys("") == []
    clock.advance(30)
    r = d.run_round()  # due: noticed; the write lease went with the bucket, so this round stops
    assert r.fenced is not None and r.messages == 0
    # and writes nothing: no thread of the round takes a new lease and goes on
    assert sorted(o.key for o in store.list_keys("")) == [f"{CLUSTER}/{BROKER}/_identity.json"]
    r = d.run_round()  # the lease taken again, the cache rebuilt: everything still local archived again
    assert r.ok and r.messages == 12
    assert_exact(store, local, queues)


@pytest.mark.s3
def test_an_outage_fails_every_idle_round_once_the_identity_is_due(tmp_path, clock, moto_endpoint, s3_bucket):
    from faultproxy import FaultProxy, FaultSchedule
    from tiered.archive.storage import S3Options, open_store

    rec = CountingRecorder()
    down = {"now": False}
    schedule = FaultSchedule(decide=lambda req: "500" if down["now"] else None)
    with FaultProxy(moto_endpoint, schedule) as proxy, new_writer(tmp_path / "store") as w:
        store = open_store(f"s3://{s3_bucket}/archive", s3=S3Options(endpoint_url=proxy.url),
                           retry=RetryPolicy(attempts=1), recorder=rec)
        produce(w, *Q, 3, clock=clock)
        d = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, recorder=rec,
                           upload_bytes=1, max_delay_ms=0, identity_check_s=60.0)
        assert d.run_round().ok
        down["now"] = True
        clock.advance(20)
        assert d.run_round().ok  # idle and not due: no request, nothing to fail
        for _ in range(3):  # due from now on: every round reads it again, and fails, until it works
            clock.advance(40)
            r = d.run_round()
            assert not r.ok and r.failed and list(r.errors) == ["_identity.json"]
        down["now"] = False
        clock.advance(20)
        assert d.run_round().ok
        before = rec.total_requests()
        clock.advance(20)
        assert d.run_round().ok and rec.total_requests() == before


def test_a_failing_queue_backs_off_with_jitter_and_the_others_go_on(tmp_path, clock, recorder):
    store = _file_store(tmp_path, recorder)
    attempts = {"n": 0}
    raw_put = store._raw_put

    def failing_put(key, data, *crc):  # noqa: ANN001, ANN002, ANN202
        if "/Bad/" in key:
            attempts["n"] += 1
            raise PermissionError(13, "denied")
        return raw_put(key, data, *crc)

    store._raw_put = failing_put  # type: ignore[method-assign]
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0,
                       failure_backoff_s=20, failure_backoff_max_s=600)
    produce(w, "Bad", 0, 3, clock=clock)
    produce(w, "Good", 0, 3, clock=clock)
    r = d.run_round()
    assert "Bad/0" in r.errors and read_manifest(store, "Good", 0).next_offset == 3
    assert attempts["n"] == 1
    d.run_round()  # the first retry comes with the next round
    assert attempts["n"] == 2
    failures, until = d.backoff("Bad", 0)
    assert failures == 2 and 10 <= until - clock.monotonic() <= 20  # 20 s, jittered to [50%, 100%]
    produce(w, "Good", 0, 3, clock=clock)
    assert d.run_round().messages == 3  # the others go on; Bad waits
    assert attempts["n"] == 2
    clock.advance(20)
    d.run_round()
    assert attempts["n"] == 3
    failures, until = d.backoff("Bad", 0)
    assert failures == 3 and 20 <= until - clock.monotonic() <= 40
    for _ in range(10):
        clock.advance(600)
        d.run_round()
    assert d.backoff("Bad", 0)[1] - clock.monotonic() <= 600  # capped
    store._raw_put = raw_put  # type: ignore[method-assign]
    clock.advance(600)
    assert d.run_round().ok
    assert d.backoff("Bad", 0) == (0, 0.0)
    assert read_manifest(store, "Bad", 0).next_offset == 3
    w.close()


def test_two_rounds_never_run_at_once(tmp_path, clock):
    store = _file_store(tmp_path)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 5, clock=clock)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0)
    entered, release = threading.Event(), threading.Event()
    raw_put = store._raw_put

    def blocking_put(key, data, *crc):  # noqa: ANN001, ANN002, ANN202
        entered.set()
        assert release.wait(10)
        return raw_put(key, data, *crc)

    store._raw_put = blocking_put  # type: ignore[method-assign]
    results = []
    t = threading.Thread(target=lambda: results.append(d.run_round()))
    t.start()
    assert entered.wait(10)
    second = d.run_round()
    assert second.skipped and second.segments == 0
    release.set()
    t.join(10)
    assert results[0].ok and results[0].messages == 5


@pytest.mark.parametrize("parallelism", [1, 4])
def test_a_queue_locked_by_the_cleaner_is_skipped_not_blocked(tmp_path, clock, parallelism):
    store = _file_store(tmp_path)
    with new_writer(tmp_path / "store") as w:
        produce(w, "L", 0, 5, clock=clock)
        produce(w, "L", 1, 5, clock=clock)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       parallelism=parallelism)
    d.start()
    lock = d.cold.lock("L", 0)
    with lock:
        r = d.run_round()
    assert r.ok and read_manifest(store, "L", 1).next_offset == 5 and read_manifest(store, "L", 0) is None
    assert d.run_round().messages == 5


def test_stays_below_the_cluster_confirmed_commitlog_offset(tmp_path, clock):
    """Controller mode: only what the cluster confirmed is archived, so a
    record a failover later truncates never reaches the archive."""
    store = _file_store(tmp_path)
    w = new_writer(tmp_path / "store")
    appended = [w.put(*Q, b"x" * 100, store_timestamp=clock.now_ms()) for _ in range(10)]
    w.write_checkpoint(confirm_offset=appended[5].commitlog_offset + appended[5].size)  # 0..5 confirmed
    local = LocalStore(tmp_path / "store", broker_mode="controller")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0)
    d.run_round()
    assert read_manifest(store, *Q).next_offset == 6
    w.write_checkpoint(confirm_offset=appended[-1].commitlog_offset + appended[-1].size)
    d.run_round()
    assert read_manifest(store, *Q).next_offset == 10
    w.close()
    assert_exact(store, local, [Q])


def test_the_oldest_pending_store_time_is_read_once_while_its_entry_stays(tmp_path, clock, recorder):
    """A queue waiting to be due is asked its oldest pending message's age
    every round (to plan the wave, to run, for the lag): the record is read
    once, then its time is kept while the ConsumeQueue entry at that offset
    is the same, and read again when the queue moves on or the entry there
    changes (a store written again). Due exactly when its age says so, and
    the lag's age follows the record, not when it was first seen."""
    from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE

    store = _file_store(tmp_path, recorder)
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1 << 30,
                       max_delay_ms=10_000)
    reads: list[tuple[str, int, int]] = []
    real = local.iter_queue

    def counted(topic, queue_id, offset, **kw):  # noqa: ANN001, ANN003, ANN202
        if kw.get("max_count") == 1:
            reads.append((topic, queue_id, offset))
        return real(topic, queue_id, offset, **kw)

    local.iter_queue = counted  # type: ignore[method-assign]
    produce(w, *Q, 3, clock=clock)
    first_ms = clock.now_ms()
    for _ in range(3):
        clock.advance(2)
        assert d.run_round().segments == 0
    assert reads == [(*Q, 0)]  # three rounds, three asks a round: one read
    assert d.archiver.oldest_pending_ms(*Q, 0) == first_ms
    clock.advance(5)  # 11 s old: due
    r = d.run_round()
    assert r.segments == 1 and r.messages == 3
    produce(w, *Q, 2, clock=clock)
    second_ms = clock.now_ms()
    clock.advance(3)
    assert d.run_round().segments == 0
    assert reads == [(*Q, 0), (*Q, 3)]  # moved on: the record at the new offset, once
    assert d.archiver.oldest_pending_ms(*Q, 3) == second_ms
    # the entry at offset 3 rewritten (its tags code: another record there): read again
    cq = tmp_path / "store" / "consumequeue" / Q[0] / str(Q[1]) / f"{0:020d}"
    with open(cq, "r+b") as fh:
        fh.seek(3 * CQ_ENTRY_SIZE)
        phys, size, tags = CQ_ENTRY.unpack(fh.read(CQ_ENTRY_SIZE))
        fh.seek(3 * CQ_ENTRY_SIZE)
        fh.write(CQ_ENTRY.pack(phys, size, tags + 1))
    assert d.archiver.oldest_pending_ms(*Q, 3) == second_ms
    assert reads == [(*Q, 0), (*Q, 3), (*Q, 3)]
    w.close()


def test_topic_verdicts_say_why():
    f = TopicFilter(exclude=("Audit*",), extra_system=frozenset({"DevCluster", "broker-dev"}))
    v = f.verdict("rmq_sys_wheel_timer")
    assert (v.archived, v.system) == (False, True) and v.reason.startswith("timer wheel:")
    for topic, archived, says in [
        ("RMQ_SYS_TRANS_HALF_TOPIC", False, "transaction half messages"),
        ("RMQ_SYS_TRANS_OP_HALF_TOPIC", False, "transaction op records"),
        ("TRANS_CHECK_MAX_TIME_TOPIC", True, "transactions the broker gave up checking"),  # like a DLQ
        ("rmq_sys_REVIVE_LOG_DevCluster", False, "POP consumption checkpoints"),
        ("rmq_sys_SYNC_BROKER_MEMBER_broker-dev", False, "broker member sync topic"),
        ("rmq_sys_TRACE_DATA_region1", False, "message traces"),
        ("CHECKPOINT_TOPIC", False, "RocksDB consumer-offset checkpoints"),
        ("DevCluster", False, "the broker's cluster or broker-name route topic"),
        ("DevCluster_REPLY_TOPIC", True, "request-reply responses"),
        ("rmq_sys_something_new", False, "a broker topic this version does not know"),
        ("AuditLog", False, "topics.exclude matches 'Audit*'"),
    ]:
        v = f.verdict(topic)
        assert v.archived is archived and v.reason.startswith(says), topic
        assert f.accepts(topic) is archived, topic
    assert f.verdict("Orders") == TopicVerdict(topic="Orders", archived=True, system=False, reason=None)
    assert not TopicFilter(include=("Orders",)).verdict("Payments").archived
    # an archived-by-default broker topic still follows include and exclude
    assert not TopicFilter(include=("Orders",)).accepts("TRANS_CHECK_MAX_TIME_TOPIC")
    v = TopicFilter(exclude=("TRANS_*",)).verdict("TRANS_CHECK_MAX_TIME_TOPIC")
    assert not v.archived and v.reason.endswith("; topics.exclude matches 'TRANS_*'")
    v = TopicFilter(include=("*", "RMQ_SYS_TRANS_HALF_TOPIC")).verdict("RMQ_SYS_TRANS_HALF_TOPIC")
    assert v.archived and v.reason.endswith("; archived: named in topics.include")
    assert TopicFilter(include_system=True).accepts("RMQ_SYS_TRANS_OP_HALF_TOPIC")
