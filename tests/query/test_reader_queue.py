"""ColdReader: queue reads, time lookup, key lookup, corruption, on file:// and S3."""

from __future__ import annotations

from dataclasses import replace

import pytest

from readerkit import CLUSTER, BROKER, T0, TopicSpec, archive, write_store
from tiered.archive import layout
from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError
from tiered.format.keyindex import bloom_may_contain
from tiered.archive.manifest import Segment
from tiered.query.reader import ColdReader, QueueRef, ReadStats, ReadStatus


def local_raw(local, topic: str, qid: int) -> dict[int, bytes]:
    rng = local.queue_range(topic, qid)
    return {i.queue_offset: bytes(i.record.raw) for i in local.iter_queue(topic, qid, rng.min_offset)}


def test_read_returns_the_local_records_with_two_gets_per_call(archived) -> None:
    reader = ColdReader(archived.store)
    for topic, qid in archived.local.queues():
        ref = QueueRef(CLUSTER, BROKER, topic, qid)
        expected = local_raw(archived.local, topic, qid)
        reader.archive.manifest(ref)  # cached from here on
        archived.counter.reset()
        offset, calls, got = 0, 0, {}
        while True:
            res = reader.read(ref, offset, max_count=7)
            calls += 1
            if res.status is ReadStatus.NO_NEW_MESSAGE:
                break
            assert res.status is ReadStatus.FOUND
            for rec in res.records:
                got[rec.queue_offset] = bytes(rec.raw)
            offset = res.next_offset
        assert got == expected
        assert archived.counter.ops["get"] <= 2 * calls
        assert archived.counter.ops["list"] == 0


def test_read_stays_in_one_segment_and_honours_max_bytes(archived) -> None:
    reader = ColdReader(archived.store)
    ref = reader.queue("Orders", 0)
    seg = reader.archive.manifest(ref).segments[0]
    res = reader.read(ref, seg.q_end - 2, max_count=50)
    assert [r.queue_offset for r in res.records] == [seg.q_end - 2, seg.q_end - 1]
    assert res.next_offset == seg.q_end
    res = reader.read(ref, 0, max_count=50, max_bytes=1)
    assert len(res.records) == 1 and res.next_offset == 1


def test_statuses_past_the_end_and_below_the_first_kept_offset(archived) -> None:
    reader = ColdReader(archived.store)
    ref = reader.queue("Orders", 1)
    m = reader.archive.manifest(ref)
    assert reader.read(ref, m.next_offset).status is ReadStatus.NO_NEW_MESSAGE
    assert reader.read(QueueRef(CLUSTER, BROKER, "Nope", 0), 0).status is ReadStatus.NO_SUCH_QUEUE
    # the cleaner expires the first segment: offsets below are gone from the archive
    tier = ColdTier(archived.store, CLUSTER, BROKER)
    first_kept = m.segments[1].q_start
    tier.commit("Orders", 1, lambda cur: replace(cur, segments=cur.segments[1:]))
    reader = ColdReader(archived.store)
    res = reader.read(ref, 0)
    assert res.status is ReadStatus.OFFSET_TOO_SMALL and res.next_offset == first_kept
    assert [r.queue_offset for r in reader.iter_queue(ref, 0, 3)] == [first_kept, first_kept + 1, first_kept + 2]


def test_offset_for_time_is_the_first_offset_stored_at_or_after(archived) -> None:
    reader = ColdReader(archived.store)
    ref = reader.queue("Orders", 0)
    rng = archived.local.queue_range("Orders", 0)
    times = [(i.queue_offset, i.record.store_timestamp)
             for i in archived.local.iter_queue("Orders", 0, rng.min_offset)]
    m = reader.archive.manifest(ref)
    for t in (T0 - 1, T0, times[37][1], times[37][1] + 1, times[-1][1], times[-1][1] + 1):
        expect = next((o for o, ts in times if ts >= t), m.next_offset)
        archived.counter.reset()
        assert reader.offset_for_time(ref, t) == expect, t
        # one ConsumeQueue GET plus a binary search of record headers, at most
        assert archived.counter.ops["get"] <= 1 + (m.segments[0].messages.bit_length() + 1)


def test_key_lookup_reads_only_segments_that_may_hold_the_key(archived_v1) -> None:
    # layout 1: each segment's bloom is in the manifest (layout 2 segments carry none there)
    archived = archived_v1
    stats = ReadStats(record_keys=True)
    reader = ColdReader(archived.store, stats=stats)
    refs = reader.archive.queues()
    manifests = reader.archive.manifests(refs)
    for key in ("Orders-k77", "UNIQOrders00000078", "%DLQ%billing-k5"):
        stats.keys.clear()
        archived.counter.reset()
        found = list(reader.find_key(key))
        assert len(found) == 1
        ref, rec = found[0]
        assert key in rec.keys or rec.unique_key == key
        if key.startswith("Orders-k"):
            assert (ref.topic, ref.queue_id, rec.queue_offset) == archived.keys[key]
        maybe = {s.commitlog_key: s for m in manifests.values() for s in m.segments
                 if bloom_may_contain(s.bloom, key)}
        all_segments = sum(len(m.segments) for m in manifests.values())
        assert len(maybe) < all_segments / 3
        # only data objects of bloom candidates are touched: one index each, then
        # the ConsumeQueue and CommitLog ranges of the hit
        touched_cl = [k for k in stats.keys if "/commitlog/" in k]
        assert len(touched_cl) == 1 and set(touched_cl) <= set(maybe)
        assert sum("/index/" in k for k in stats.keys) == len(maybe)
        assert archived.counter.ops["get"] == len(maybe) + 2


def test_key_lookup_finds_every_holder(archived) -> None:
    reader = ColdReader(archived.store)
    found = sorted((r.topic, r.queue_id, rec.queue_offset) for r, rec in reader.find_key("shared-3"))
    expect = sorted((t, q, o) for t, q in archived.local.queues()
                    for o, rec in ((i.queue_offset, i.record) for i in archived.local.iter_queue(
                        t, q, archived.local.queue_range(t, q).min_offset)) if "shared-3" in rec.keys)
    assert found == expect and len(found) == (240 + 40) // 5
    assert list(reader.find_key("no-such-key")) == []


def test_segments_without_an_index_are_scanned(tmp_path, open_cold) -> None:
    write_store(tmp_path / "store", [TopicSpec("Old", queues=1, messages=60)])
    store = open_cold(f"file://{tmp_path / 'cold'}")
    local = archive(tmp_path / "store", store, tmp_path / "state", key_index=False)
    reader = ColdReader(store, stats=ReadStats(record_keys=True))
    m = reader.archive.manifest(QueueRef(CLUSTER, BROKER, "Old", 0))
    assert all(s.index_key is None and s.bloom is None for s in m.segments) and len(m.segments) > 1
    found = [rec.queue_offset for _, rec in reader.find_key("Old-k42")]
    assert found == [42]
    assert local.max_offset("Old", 0) == 60
    assert sum(k in {s.commitlog_key for s in m.segments} for k in reader.stats.keys) == len(m.segments)


def _corrupt_body_byte(store, seg: Segment) -> int:
    """Flip one body byte of the segment's second record; its position in the object."""
    obj = layout.object_of(seg.commitlog_key)  # records first in either layout
    data = bytearray(store.get(obj))
    cq = layout.read_part(store, seg.consumequeue_key)
    second = int.from_bytes(cq[20:28], "big") - seg.cl_start
    data[second + 100] ^= 0xFF
    store.put(obj, bytes(data))
    return second


def test_corrupt_object_names_object_and_offset_or_is_skipped_and_counted(archived) -> None:
    reader = ColdReader(archived.store)
    ref = reader.queue("Orders", 0)
    seg = reader.archive.manifest(ref).segments[1]
    pos = _corrupt_body_byte(archived.store, seg)
    with pytest.raises(CorruptRecordError) as info:
        list(reader.iter_queue(ref, 0))
    assert info.value.source == seg.commitlog_key
    assert info.value.offset == pos
    assert seg.commitlog_key in str(info.value) and f"@ {pos}" in str(info.value)
    skipping = ColdReader(archived.store, skip_corrupt=True)
    got = [r.queue_offset for r in skipping.iter_queue(ref, 0)]
    assert skipping.skipped == 1
    assert seg.q_start + 1 not in got and len(got) == len(local_raw(archived.local, "Orders", 0)) - 1


def test_missing_object_is_an_error_or_skipped(archived) -> None:
    reader = ColdReader(archived.store)
    ref = reader.queue("Orders", 1)
    seg = reader.archive.manifest(ref).segments[0]
    lost = layout.object_of(seg.commitlog_key)  # the segment's object, either layout
    archived.store.delete_many([lost])
    with pytest.raises(Exception) as info:
        reader.read(ref, 0)
    assert lost in str(info.value)
    skipping = ColdReader(archived.store, skip_corrupt=True)
    got = list(skipping.iter_queue(ref, 0))
    assert skipping.skipped == seg.messages and got[0].queue_offset == seg.q_end


def test_indexed_segments_without_keys_are_skipped_not_scanned(tmp_path, open_cold, store_writer) -> None:
    with store_writer() as w:
        for i in range(50):
            w.put("NoKeys", 0, b"payload-%d" % i)  # no KEYS, no UNIQ_KEY
    store = open_cold(f"file://{tmp_path / 'cold'}")
    # layout 1: the bloom of each segment is in the manifest
    archive(tmp_path / "store", store, tmp_path / "state", segment_bytes=2048, layout=1)
    reader = ColdReader(store, stats=ReadStats(record_keys=True))
    m = reader.archive.manifest(QueueRef(CLUSTER, BROKER, "NoKeys", 0))
    assert len(m.segments) > 1 and all(s.index_key is None and s.bloom for s in m.segments)
    assert list(reader.find_key("anything")) == []
    assert reader.stats.keys == [] or not any("/commitlog/" in k or "/index/" in k for k in reader.stats.keys)
