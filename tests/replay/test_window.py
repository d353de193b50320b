"""Pulls cut from read-ahead windows answer exactly what reading each pull
through the library answers, the cache stays within its bound, and a
corrupt record is the decoder's error, not served."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaykit import BROKER, CLUSTER, Archived, make_archive
from tiered.archive.storage import open_store
from tiered.errors import CorruptRecordError
from tiered.query.reader import ColdReader, QueueRef, ReadStatus
from tiered.replay.source import FOUND, ArchiveSource
from tiered.replay.window import WindowCache, read_window

LIMITS = [(1, 1 << 20), (5, 1 << 20), (32, 1 << 20), (32, 300), (7, 900), (32, 1)]


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Archived:
    return make_archive(tmp_path_factory.mktemp("window"))


def library_pull(reader: ColdReader, ref: QueueRef, offset: int, max_count: int,
                 max_bytes: int) -> tuple[bytes, int, int]:
    """(body, count, next offset) of a pull read through ColdReader.read."""
    res = reader.read(ref, offset, max_count=max_count, max_bytes=max_bytes)
    while res.status is ReadStatus.OFFSET_IN_GAP:
        res = reader.read(ref, res.next_offset, max_count=max_count, max_bytes=max_bytes)
    return b"".join(r.raw for r in res.records), len(res.records), res.next_offset


def queues(source: ArchiveSource) -> list[tuple[str, int]]:
    return [(t, q) for t, n in sorted(source.topics.items()) for q in range(n)]


@pytest.mark.parametrize("cache_bytes", [64 << 20, 2000])
@pytest.mark.parametrize(("max_count", "max_bytes"), LIMITS)
def test_every_pull_is_the_librarys(archived: Archived, cache_bytes: int, max_count: int, max_bytes: int) -> None:
    store = open_store(archived.cold_url)
    source = ArchiveSource(store, CLUSTER, BROKER, windows=WindowCache(cache_bytes))
    reader = ColdReader(store)
    for topic, qid in queues(source):
        ref = QueueRef(CLUSTER, BROKER, topic, qid)
        lo, hi = source.min_offset(topic, qid), source.max_offset(topic, qid)
        assert hi > lo
        for offset in range(lo, hi):  # every offset, in order: misses, then pulls cut from windows
            body, count, nxt = library_pull(reader, ref, offset, max_count, max_bytes)
            got = source.pull(topic, qid, offset, max_count, max_bytes)
            assert (got.status, got.body, got.count, got.next_offset) == (FOUND, body, count, nxt)
            cached = source.pull_cached(topic, qid, offset, max_count, max_bytes)
            # read once, the same pull is answered from memory (unless its window was dropped)
            assert cached == got if cache_bytes > 1 << 20 else cached in (None, got)
            assert source.windows.nbytes <= cache_bytes


def test_a_consumer_reading_in_order_reads_each_window_once(archived: Archived) -> None:
    store = open_store(archived.cold_url)
    source = ArchiveSource(store, CLUSTER, BROKER)
    expected = archived.messages
    for topic, qid in queues(source):
        offset, reads, got = source.min_offset(topic, qid), 0, b""
        while offset < source.max_offset(topic, qid):
            pulled = source.pull_cached(topic, qid, offset, 4, 1 << 20)
            if pulled is None:
                reads += 1
                pulled = source.pull(topic, qid, offset, 4, 1 << 20)
            got += pulled.body
            offset = pulled.next_offset
        segments = source.manifest(topic, qid)
        assert segments is not None and reads == len(segments.segments)  # one window a segment here
        stored = sum(e.store_size for k, e in expected.items() if k[:2] == (topic, qid))
        assert len(got) == stored


def test_the_fast_check_reads_what_the_library_reads(archived: Archived) -> None:
    store = open_store(archived.cold_url)
    source = ArchiveSource(store, CLUSTER, BROKER)
    reader = ColdReader(store)
    for topic, qid in queues(source):
        manifest = source.manifest(topic, qid)
        assert manifest is not None
        for seg in manifest.segments:
            window = read_window(store, seg, topic=topic, queue_id=qid, start=seg.q_start, max_count=1024,
                                 max_bytes=1 << 20)
            assert window is not None  # a clean segment never needs the decoder
            body, count, _ = library_pull(reader, QueueRef(CLUSTER, BROKER, topic, qid), seg.q_start, 1024, 1 << 20)
            assert (window.data, len(window.ends)) == (body, count)


def test_a_corrupt_record_is_the_decoders_error(tmp_path: Path) -> None:
    archived = make_archive(tmp_path)
    store = open_store(archived.cold_url)
    source = ArchiveSource(store, CLUSTER, BROKER)
    manifest = source.manifest("Orders", 1)
    assert manifest is not None
    seg = manifest.segments[0]
    name, _, part = seg.commitlog_key.partition("#")  # the segment's CommitLog may be a part of an object
    at = int(part.split("+")[0]) if part else 0
    path = tmp_path / "cold" / name
    data = bytearray(path.read_bytes())
    data[at + 95] ^= 0xFF  # in the first record's body: its CRC no longer matches
    path.write_bytes(bytes(data))
    assert read_window(store, seg, topic="Orders", queue_id=1, start=seg.q_start, max_count=32,
                       max_bytes=1 << 20) is None
    with pytest.raises(CorruptRecordError) as err:
        source.pull("Orders", 1, seg.q_start, 32, 1 << 20)
    assert err.value.source == seg.commitlog_key
    assert source.pull_cached("Orders", 1, seg.q_start, 32, 1 << 20) is None  # nothing of it was kept
    other = source.pull("Orders", 0, source.min_offset("Orders", 0), 32, 1 << 20)
    assert other.status == FOUND and other.count > 0
