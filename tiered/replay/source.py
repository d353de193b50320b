"""One archived broker seen as a RocketMQ message store (read-only).

Answers what ``DefaultMessageStore`` answers a broker's processors: a
queue's min and max offsets, a pull's records by the store's status rules
(``getMessage``), the offset for a time, the earliest store time. It reads
the archive through ``tiered.query.reader`` only.

The catalog and manifests are read when the source is built and again by
each ``refresh``, which swaps in a whole new snapshot: a read in flight
finishes on the snapshot it started on. Reads run on a thread pool: each
thread has its own ``ColdReader`` over the current snapshot's fully loaded
``Archive`` (only read after loading). A pull reads a window of records
ahead (tiered/replay/window.py); ``pull_cached`` answers, without reading,
every pull that the manifests or a window already answer, so the server
runs it on the event loop and only sends the rest to the read threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tiered.archive.manifest import Manifest
from tiered.archive.storage import ObjectStore
from tiered.query.batchread import is_batch
from tiered.query.reader import Archive, ColdReader, QueueRef, ReadStatus
from tiered.replay import batchqueue
from tiered.replay.window import WINDOW_RECORDS, WindowCache, read_window, window_of

# DefaultMessageStore's GetMessageStatus names (sent as the pull's remark)
FOUND = "FOUND"
NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"


@dataclass(frozen=True, kw_only=True)
class Pulled:
    """A pull's result: ``body`` is the stored records, concatenated."""

    status: str
    body: bytes | memoryview  # a view of a window's bytes (window.Window.cut)
    count: int
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The archive as one refresh saw it."""

    archive: Archive
    manifests: dict[tuple[str, int], Manifest]
    topics: dict[str, int]  # topic -> queue count (highest archived queue id + 1)
    # the BatchCQ queues, found once: asking each manifest walks its segments, on every pull
    batch: frozenset[tuple[str, int]] = frozenset()


class ArchiveSource:
    def __init__(self, store: ObjectStore, cluster: str, broker: str, *, windows: WindowCache | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.broker = broker
        self._snap = self._load()
        self._local = threading.local()
        self.windows = windows or WindowCache()

    def _load(self) -> Snapshot:
        archive = Archive(store=self.store, brokers=[(self.cluster, self.broker)])
        refs = archive.queues()
        manifests = archive.manifests(refs)
        served = {(r.topic, r.queue_id): m for r, m in manifests.items()}
        topics: dict[str, int] = {}
        for topic, qid in served:
            topics[topic] = max(topics.get(topic, 0), qid + 1)
        return Snapshot(archive=archive, manifests=served, topics=topics,
                        batch=frozenset(q for q, m in served.items() if is_batch(m)))

    def refresh(self) -> set[tuple[str, int]]:
        """Read the catalog and manifests again; the queues whose archive
        grew (or that are new)."""
        old, new = self._snap, self._load()
        self._snap = new
        return {q for q, m in new.manifests.items()
                if q not in old.manifests or m.next_offset > old.manifests[q].next_offset}

    @property
    def topics(self) -> dict[str, int]:
        return self._snap.topics

    def _reader(self, snap: Snapshot | None = None) -> ColdReader:
        archive = (snap or self._snap).archive
        reader = getattr(self._local, "reader", None)
        if reader is None or reader.archive is not archive:
            reader = self._local.reader = ColdReader(self.store, archive=archive)
        return reader

    def _ref(self, topic: str, queue_id: int) -> QueueRef:
        return QueueRef(self.cluster, self.broker, topic, queue_id)

    def manifest(self, topic: str, queue_id: int, snap: Snapshot | None = None) -> Manifest | None:
        return (snap or self._snap).manifests.get((topic, queue_id))

    def min_offset(self, topic: str, queue_id: int, snap: Snapshot | None = None) -> int:
        """The first offset still archived (0 for a queue never archived)."""
        snap = snap or self._snap
        m = self.manifest(topic, queue_id, snap)
        if m is None:
            return 0
        if (topic, queue_id) in snap.batch:  # BatchCQ: offsets count messages (tiered/replay/batchqueue.py)
            return batchqueue.bounds(m)[0]
        return m.segments[0].q_start if m.segments else m.next_offset

    def max_offset(self, topic: str, queue_id: int, snap: Snapshot | None = None) -> int:
        """The offset after the last archived record, as the broker's max offset."""
        snap = snap or self._snap
        m = self.manifest(topic, queue_id, snap)
        if m is not None and (topic, queue_id) in snap.batch:
            return batchqueue.bounds(m)[1]
        return 0 if m is None else m.next_offset

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int) -> Pulled:
        """``getMessage``'s rules: out-of-range offsets get a status and the
        corrected next offset; gaps the archive recorded are stepped over.
        May read the archive: run it off the event loop."""
        got = self._pull(topic, queue_id, offset, max_count, max_bytes, read=True)
        assert got is not None
        return got

    def pull_cached(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int) -> Pulled | None:
        """``pull``'s answer when it needs no read of the archive (the
        manifests answer it, or a window holds its records), else None."""
        return self._pull(topic, queue_id, offset, max_count, max_bytes, read=False)

    def _pull(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int, *,
              read: bool) -> Pulled | None:
        snap = self._snap  # one snapshot for the whole pull
        m = self.manifest(topic, queue_id, snap)
        lo, hi = self.min_offset(topic, queue_id, snap), self.max_offset(topic, queue_id, snap)

        def result(status: str, next_offset: int, body: bytes | memoryview = b"", count: int = 0) -> Pulled:
            return Pulled(status=status, body=body, count=count, next_offset=next_offset, min_offset=lo,
                          max_offset=hi)

        if m is None:
            return result(NO_MATCHED_LOGIC_QUEUE, 0)
        if hi == 0:
            return result(NO_MESSAGE_IN_QUEUE, 0)
        if offset < lo:
            return result(OFFSET_TOO_SMALL, lo)
        if offset == hi:
            return result(OFFSET_OVERFLOW_ONE, offset)
        if offset > hi:
            return result(OFFSET_OVERFLOW_BADLY, hi)
        if (topic, queue_id) in snap.batch:  # BatchCQ: a record holds several messages, so no windows
            if not read:
                return None
            got = batchqueue.pull(self._reader(snap), self._ref(topic, queue_id), m, offset, max_count, max_bytes)
            if got is None:
                return result(OFFSET_OVERFLOW_ONE, hi)
            return result(FOUND, got.next_offset, got.body, got.messages)
        seg = m.segment_for(offset)
        cut = None if seg is None else self.windows.cut(topic, queue_id, seg, offset, max_count, max_bytes)
        if cut is not None:
            return result(FOUND, offset + cut[1], cut[0], cut[1])
        if not read:
            return None
        count, nbytes = max(max_count, WINDOW_RECORDS), max(max_bytes, self.windows.window_bytes(len(snap.manifests)))
        if seg is not None:
            window = read_window(self.store, seg, topic=topic, queue_id=queue_id, start=offset, max_count=count,
                                 max_bytes=nbytes)
            if window is not None:
                self.windows.add(topic, queue_id, window)
                cut = window.cut(offset, min(max_count, seg.q_end - offset), max_bytes)
                assert cut is not None  # the window was read with the pull's limits or larger ones
                return result(FOUND, offset + cut[1], cut[0], cut[1])
        ref = self._ref(topic, queue_id)
        reader = self._reader(snap)
        start = offset
        res = reader.read(ref, start, max_count=count, max_bytes=nbytes)
        while res.status is ReadStatus.OFFSET_IN_GAP:  # never archived: serve what follows
            start = res.next_offset
            res = reader.read(ref, start, max_count=count, max_bytes=nbytes)
        if res.status is not ReadStatus.FOUND:  # a gap running to the end
            return result(OFFSET_OVERFLOW_ONE, res.next_offset)
        seg = m.segment_for(start)
        assert seg is not None  # records were found there
        window = window_of(seg, res.records, start, max_count=count, max_bytes=nbytes)
        self.windows.add(topic, queue_id, window)
        cut = window.cut(start, min(max_count, seg.q_end - start), max_bytes)
        assert cut is not None  # the window was read with the pull's limits or larger ones
        return result(FOUND, start + cut[1], cut[0], cut[1])

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int, upper: bool = False) -> int:
        """``getOffsetInQueueByTime`` (RocketMQ 5.x): the lower boundary is the
        first offset stored at or after the time (the max offset when every
        record is older); the upper boundary the last one stored at or before
        it (0 when every record is newer)."""
        if self.manifest(topic, queue_id) is None:
            return 0
        ref = self._ref(topic, queue_id)
        if not upper:
            return self._lower(ref, timestamp_ms)
        after = self._lower(ref, timestamp_ms + 1)
        if after <= self.min_offset(topic, queue_id):
            return 0
        return after - 1

    def _lower(self, ref: QueueRef, timestamp_ms: int) -> int:
        """The first offset stored at or after the time (the max offset when all are older)."""
        m = self.manifest(ref.topic, ref.queue_id)
        if m is not None and is_batch(m):
            return batchqueue.offset_for_time(self._reader(), ref, m, timestamp_ms)
        found = self._reader().offset_for_time(ref, timestamp_ms)
        return 0 if found is None else found

    def earliest_store_ms(self, topic: str, queue_id: int) -> int:
        """The store time of the first archived record; -1 when there is none."""
        lo, hi = self.min_offset(topic, queue_id), self.max_offset(topic, queue_id)
        if self.manifest(topic, queue_id) is None or lo >= hi:
            return -1
        m = self.manifest(topic, queue_id)
        first = m.segments[0].q_start if m is not None and is_batch(m) else lo  # BatchCQ: the first entry
        res = self._reader().read(self._ref(topic, queue_id), first, max_count=1)
        return res.records[0].store_timestamp if res.records else -1
