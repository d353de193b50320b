"""Expiry carried out against real stores (file:// and the moto S3 server)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from clean_support import HOUR_MS, PREFIX, Rig

from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions
from tiered.archive.coldtier import ColdTier
from tiered.config import RetentionSettings
from tiered.errors import StorageError
from tiered.archive.manifest import CATALOG, Manifest, Segment, segment_keys


@pytest.fixture
def rig(tmp_path: Path, cold_url: str, open_cold) -> Rig:  # noqa: ANN001
    r = Rig(tmp_path, store=open_cold(cold_url))
    yield r
    r.close()


def archive_three_queues(rig: Rig) -> None:
    """Queues T/0, T/1, U/0, each with a segment at t0 and one at t0+40 min."""
    for _ in range(2):
        for topic, qid in (("T", 0), ("T", 1), ("U", 0)):
            rig.produce(topic, qid, 3)
        rig.dispatch()
        rig.advance(40 * 60)


def test_expired_prefix_goes_manifest_first_then_objects_in_one_batch(rig: Rig) -> None:
    archive_three_queues(rig)  # now = t0 + 80 min
    rig.clean()  # first pass: the orphan scan; nothing is past 1 h yet except the first segments
    m = {q: rig.manifest(*q) for q in (("T", 0), ("T", 1), ("U", 0))}
    assert all(len(x.segments) == 1 and x.segments[0].q_start == 3 for x in m.values())
    assert all(x.next_offset == 6 for x in m.values())
    deletes = rig.events.data("delete")
    assert len(deletes) == 9  # 3 queues x (commitlog, consumequeue, index)
    assert len(rig.events.delete_requests) == 1, "the deletes of all queues go in one batched request"
    # every manifest commit precedes the first object deletion
    first_delete = rig.events.events.index(deletes[0])
    manifest_puts = [i for i, e in enumerate(rig.events.events) if e.key.endswith("manifest.json")]
    assert len([i for i in manifest_puts if i < first_delete]) == 3 + 3 + 3  # 2 dispatch + 1 clean commit each
    assert not [i for i in manifest_puts if i > first_delete]
    # what stays reads back byte for byte
    for (topic, qid) in m:
        expected = {o: raw for o, raw in rig.expected(topic, qid).items() if o >= 3}
        assert rig.archive(topic, qid) == expected
    assert rig.recorder.deleted == {"T": 2, "U": 1}
    catalog = rig.objects.get(f"{PREFIX}/{CATALOG}")
    assert b'"first_offset":3' in catalog


def test_nothing_expired_makes_zero_requests(rig: Rig) -> None:
    archive_three_queues(rig)
    rig.clean()  # the first pass scans for orphans (one LIST) and expires the first segments
    rig.recorder.requests.clear()
    for _ in range(5):
        rep = rig.clean()
        assert rep.ok and not rep.committed
        rig.advance(60)
    assert rig.recorder.total_requests() == 0
    rig.advance(HOUR_MS / 1000)  # now the second segments expire: requests again
    rig.clean()
    assert rig.recorder.ops["delete"] == 1


def test_deletes_are_batched_1000_keys_per_request(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    # 400 tiny segments of 2 queues, committed directly (the dispatcher would take long)
    for qid in (0, 1):
        segs = []
        prefix = f"{PREFIX}/T/{qid}"
        for i in range(200):
            cl, cq, ix = segment_keys(prefix, i, i + 1, i, i + 1)
            t = rig.clock.now_ms() - 2 * HOUR_MS
            segs.append(Segment(q_start=i, q_end=i + 1, cl_start=i, cl_end=i + 1, min_store_ms=t, max_store_ms=t, min_born_ms=t, max_born_ms=t, commitlog_key=cl, consumequeue_key=cq, index_key=ix, commitlog_crc=0, consumequeue_crc=0, created_ms=t))
        # the manifest first: objects without one would be (rightly) refused as unaccounted history
        rig.cold.commit("T", qid, lambda _m, s=tuple(segs), q=qid: Manifest(
            topic="T", queue_id=q, next_offset=200, cl_next=200, segments=s))
        for seg in segs:
            for k in seg.keys():
                rig.objects.put(k, b"x")
    rig.cold.loaded = True
    rep = rig.clean(orphans=False)
    assert rep.ok and rep.expired_segments == 400
    sizes = [len(b) for b in rig.events.delete_requests]
    assert sizes == [1000, 200] and rep.delete_requests == 2
    assert rig.events.kinds("delete") == {"commitlog": 400, "consumequeue": 400, "index": 400}
    rig.close()


@pytest.mark.parametrize("start_position", ["earliest", "latest"])
def test_idle_queue_keeps_progress_and_resumes_without_hole_or_rearchive(rig: Rig, start_position: str) -> None:
    rig.produce("T", 0, 10)
    rig.dispatch()
    rig.start_position = start_position  # 'latest' applies to new queues only: never restart from "now"
    before = rig.manifest("T")
    rig.advance(2 * 3600)
    rep = rig.clean()
    assert rep.expired_segments == 1
    m = rig.manifest("T")
    assert m.segments == () and m.gaps == () and m.next_offset == 10 and m.cl_next == before.cl_next
    assert rig.cold.catalog().queues[0].next_offset == 10
    # a restart that lost the local manifest cache rebuilds it from the bucket
    rig.restart(lose_cache=True)
    rig.advance(5 * 3600)
    rig.produce("T", 0, 4)
    rig.dispatch()
    m = rig.manifest("T")
    assert m.gaps == ()
    assert [(s.q_start, s.q_end, s.cl_start) for s in m.segments] == [(10, 14, before.cl_next)]
    assert rig.archive("T") == {o: raw for o, raw in rig.expected("T").items() if o >= 10}
    # offsets 0..9 were archived exactly once, never again
    assert rig.events.kinds("put")["commitlog"] == 2


def test_queue_gone_locally_keeps_its_archive_until_retention(rig: Rig) -> None:
    rig.produce("T", 0, 5)
    rig.produce("T", 1, 5)
    rig.dispatch()
    shutil.rmtree(rig.root / "store" / "consumequeue" / "T" / "0")  # the broker dropped the queue
    rig.advance(50 * 60)
    rig.dispatch()
    rep = rig.clean()
    assert rep.ok and rep.expired_segments == 0
    assert rig.archive("T", 0) == rig.expected("T", 0)
    rig.advance(11 * 60)
    rep = rig.clean()
    assert rep.expired_segments == 2
    assert rig.manifest("T", 0).next_offset == 5


def test_per_topic_retention_from_topics_json_and_changes_take_effect_next_pass(tmp_path: Path) -> None:
    rig = Rig(tmp_path, retention=RetentionSettings(default_hours=3, topics={"B": 2, "A": 9}))
    for topic in ("A", "B", "C"):
        rig.produce(topic, 0, 2)
    rig.writer.set_topic_attribute("A", "reserve.time", "1")  # broker wins over the config's 9 h
    rig.dispatch()
    rig.advance(1.5 * 3600)
    rep = rig.clean()
    assert {p.topic: (p.retention.source, len(p.expire)) for p in rep.plan.queues} == {
        "A": ("reserve.time", 1), "B": ("config", 0), "C": ("default", 0)}
    rig.writer.set_topic_attribute("C", "reserve.time", "1.25")  # shortened: applies at the next pass
    rig.writer.set_topic_attribute("B", "reserve.time", "48")  # lengthened: B (config 2 h) is kept
    rig.advance(0.75 * 3600)  # t0 + 2.25 h
    rep = rig.clean()
    assert {p.topic: len(p.expire) for p in rep.plan.queues} == {"A": 0, "B": 0, "C": 1}
    assert len(rig.manifest("B").segments) == 1
    rig.writer.set_topic_attribute("B", "reserve.time", None)  # back to the config's 2 h
    rep = rig.clean()
    assert {p.topic: len(p.expire) for p in rep.plan.queues} == {"A": 0, "B": 1, "C": 0}
    rig.close()


def test_unreadable_topics_json_expires_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, retention=RetentionSettings(default_hours=1))
    rig.produce("A", 0, 2)
    rig.dispatch()
    rig.advance(3 * 3600)
    for name in ("topics.json", "topics.json.bak"):
        (tmp_path / "store" / "config" / name).write_text("{not json")
    rep = rig.clean()
    assert not rep.ok and "retention" in rep.errors
    assert rep.expired_segments == 0 and len(rig.manifest("A").segments) == 1
    assert ("clean", False) in rig.recorder.rounds
    rig.writer.write_topics()  # repaired
    rep = rig.clean()
    assert rep.ok and rep.expired_segments == 1
    rig.close()


def test_future_stamped_segment_is_kept_and_reported_once(rig: Rig) -> None:
    rig.upload_bytes = 1  # upload by size: the dispatcher holds future-stamped data back by time
    rig.restart()
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.produce("T", 0, 1, ts=rig.clock.now_ms() + 24 * HOUR_MS)  # a broker clock a day ahead
    rig.dispatch()
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(2 * 3600)
    rep = rig.clean()
    m = rig.manifest("T")
    assert rep.expired_segments == 1 and [s.q_start for s in m.segments] == [2, 3]
    assert [(q.topic, s.verdict.value) for q, s in rep.plan.skewed] == [("T", "future")]
    rig.clean()
    rig.advance(60)
    rig.clean()
    assert rig.recorder.skew == {("T", 0): 1}
    assert rig.archive("T") == {o: raw for o, raw in rig.expected("T").items() if o >= 2}
    rig.advance(24 * 3600)  # the future arrived and passed retention
    rep = rig.clean()
    assert rep.expired_segments == 2 and rig.manifest("T").segments == ()


def test_busy_queue_is_skipped_then_cleaned(rig: Rig) -> None:
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(2 * 3600)
    rig.cleaner.options = replace(rig.cleaner.options, lock_wait_ms=20)
    lock = rig.cold.lock("T", 0)
    with lock:  # held for the whole pass
        rep = rig.clean()
    assert rep.busy == [("T", 0)] and rep.expired_segments == 0 and rep.ok
    assert rig.recorder.skipped == {("clean", "T", 0): 1}
    assert len(rig.manifest("T").segments) == 1
    assert rig.events.data("delete") == []
    rep = rig.clean()
    assert rep.expired_segments == 1


def test_two_writers_race_no_double_or_wrong_deletion(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(60)
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(3600 + 30)  # only the first segment is past retention
    other = ColdTier(rig.objects, "TestCluster", "broker-a", clock=rig.clock)
    other.load()
    # another writer expires the same prefix first
    first = other.cached("T", 0).segments[0]
    other.commit("T", 0, lambda m: Manifest(topic=m.topic, queue_id=m.queue_id, next_offset=m.next_offset,
                                            cl_next=m.cl_next, segments=m.segments[1:]))
    rep = rig.clean(orphans=False)
    assert rep.ok and rep.conflicts and rep.expired_segments == 0
    assert rig.events.data("delete") == []  # the loser deletes nothing (the winner's job, or orphans')
    m = rig.manifest("T")
    assert [s.q_start for s in m.segments] == [2] and first not in m.segments
    assert rig.clean(orphans=False).conflicts == []  # replanned from the fresh manifest
    rig.close()


def test_dispatcher_commit_between_plan_and_commit_is_kept(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(2 * 3600)
    # another process appends a segment behind the cleaner's cached manifest
    other = Dispatcher(rig.local, ColdTier(rig.objects, "TestCluster", "broker-a", clock=rig.clock),
                       clock=rig.clock, options=DispatchOptions(archive=ArchiveOptions(max_delay_ms=0), parallelism=1))
    rig.produce("T", 0, 3)
    assert other.run_round().segments == 1
    rep = rig.clean(orphans=False)
    assert rep.ok and rep.expired_segments == 1
    m = rig.manifest("T")
    assert [(s.q_start, s.q_end) for s in m.segments] == [(2, 5)]
    assert rig.archive("T") == {o: raw for o, raw in rig.expected("T").items() if o >= 2}
    rig.close()


def test_failed_delete_is_reported_and_objects_left_as_orphans(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(2 * 3600)
    raw = rig.objects._raw_delete

    def broken(keys: list[str]) -> None:
        raise StorageError("delete", keys[0], "access denied", retriable=False)

    rig.objects._raw_delete = broken  # type: ignore[method-assign]
    rep = rig.clean(orphans=False)
    assert not rep.ok and "delete" in rep.errors
    assert rig.manifest("T").segments == ()  # committed first: the objects are orphans now
    rig.objects._raw_delete = raw  # type: ignore[method-assign]
    assert rig.clean(orphans=False).ok
    rig.close()


def test_a_queue_the_dispatcher_holds_is_waited_for_not_skipped(rig: Rig) -> None:
    """The cleaner and the dispatcher start together: the busy queue is
    retried after the others and expires in the same pass."""
    import threading

    for topic in ("Busy", "Free"):
        rig.produce(topic, 0, 2)
    rig.dispatch()
    rig.advance(2 * 3600)
    lock = rig.cold.lock("Busy", 0)
    lock.acquire()
    holder_done = threading.Event()

    def release_when_the_others_are_done() -> None:
        # the dispatcher's step ends once the cleaner has committed the free queue
        # (read from the bucket, not through the cleaner's own cache)
        key = f"{PREFIX}/Free/0/manifest.json"
        try:
            while Manifest.from_bytes(rig.objects.get(key)).segments:
                holder_done.wait(0.005)
        finally:
            lock.release()

    t = threading.Thread(target=release_when_the_others_are_done)
    t.start()
    rep = rig.clean()
    t.join()
    assert rep.busy == [] and rep.ok
    assert {p.topic for p in rep.expired()} == {"Busy", "Free"}
    assert rig.manifest("Busy").segments == () and rig.recorder.skipped == {}
