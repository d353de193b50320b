"""Records read ahead and kept in memory, so that most pulls read nothing.

A consumer pulls a queue in order, 32 records at a time. Reading each pull
from the archive costs two ranged GETs and decoding every record; instead a
pull that misses reads a *window*: up to ``WINDOW_RECORDS`` records of the
queue from its offset, within one segment, decoded and checked once by
``ColdReader.read`` and kept as their stored bytes, concatenated, with the
end of each record. The records of a segment are contiguous, so the pulls
that follow are a slice of those bytes, cut on the event loop.

The cache is bounded: at most ``CACHE_BYTES`` of windows, the least recently
used dropped first. A window is at most the cache's share of one served
queue (and ``WINDOW_BYTES``), so every served queue read at once keeps a
window until its consumer gets to it, rather than a read ahead being dropped
unread. A window is never smaller than the pull that reads it (up to 256 KiB,
the broker's byte cap), so with more than 256 queues read at once in turn
windows can be dropped before they are read to the end, and a pull then
reads more than it serves. Segments are sealed and never change, so a
window is valid as long as the snapshot still has its segment (it is keyed
by the segment's object).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from tiered.archive.manifest import Segment
from tiered.archive.storage import ObjectStore
from tiered.format.batch import CQ_DTYPE, check_run
from tiered.format.codec import CQ_ENTRY_SIZE, MIN_RECORD_SIZE, Record
from tiered.query.reader import get_range

WINDOW_RECORDS = 1024
WINDOW_BYTES = 1 << 20
CACHE_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True, eq=False)
class Window:
    """Records [start, start + len(ends)) of one segment: ``data`` is their
    stored bytes, concatenated; ``ends[i]`` where record ``start + i`` ends."""

    segment: str  # the segment's CommitLog object
    start: int
    data: bytes
    ends: list[int]
    # the read's byte cap when that is what ended the window (the next
    # record did not fit), else -1
    budget: int = -1

    @property
    def end(self) -> int:
        return self.start + len(self.ends)

    def cut(self, offset: int, max_count: int, max_bytes: int) -> tuple[memoryview, int] | None:
        """(body, count) of a pull at ``offset`` as ``ColdReader.read`` would
        give it (at most ``max_count`` records and ``max_bytes``, at least one),
        or None when the window does not hold all of them. The body is a view
        of the window's bytes: copied once, into the response's frame."""
        i = offset - self.start
        n = len(self.ends)
        if not 0 <= i < n:
            return None
        base = self.ends[i - 1] if i else 0
        j = i + max_count
        if j > n and self.ends[-1] - base <= max_bytes:
            if not 0 <= base + max_bytes <= self.budget:
                return None  # the pull runs past the window: more records may follow
            # the record after the window overflowed the budget, so it overflows this pull too
        k = max(bisect_right(self.ends, base + max_bytes, i, min(j, n)), i + 1)
        return memoryview(self.data)[base:self.ends[k - 1]], k - i


def read_window(store: ObjectStore, segment: Segment, *, topic: str, queue_id: int, start: int, max_count: int,
                max_bytes: int) -> Window | None:
    """The window ``ColdReader.read(start, max_count, max_bytes)`` reads, with
    its records checked all at once (``check_run``: every check the decoder
    makes, in the native core's loop where it is built), or None when any
    check fails or an object is short: then the window is read through
    ``ColdReader.read``, which accepts an unusual record or raises the typed
    error naming it. So this decides nothing the decoder would not."""
    count = max(1, min(max_count, segment.q_end - start))
    first = (start - segment.q_start) * CQ_ENTRY_SIZE
    cq = get_range(store, segment.consumequeue_key, first, first + count * CQ_ENTRY_SIZE, None)
    if len(cq) != count * CQ_ENTRY_SIZE:
        return None
    entries = np.frombuffer(cq, CQ_DTYPE)
    sizes = entries["size"].astype(np.int64)
    phys = entries["phys"].astype(np.int64)
    ends = np.cumsum(sizes)
    keep = max(1, int(np.searchsorted(ends, max_bytes, side="right")))  # at least one record
    entries, sizes, phys, ends = entries[:keep], sizes[:keep], phys[:keep], ends[:keep]
    lo, hi = int(phys[0]), int(phys[0] + ends[-1])
    if lo < segment.cl_start or hi > segment.cl_end or np.any(phys[1:] != phys[:-1] + sizes[:-1]):
        return None
    data = get_range(store, segment.commitlog_key, lo - segment.cl_start, hi - segment.cl_start, None)
    if len(data) != hi - lo or len(data) < MIN_RECORD_SIZE:
        return None
    batch = check_run(memoryview(data), lo, entries, topic=topic.encode("utf-8"), queue_id=queue_id,
                      first_offset=start, source=segment.commitlog_key, check_phys=False)
    if batch is None or batch.count != keep:
        return None
    by_bytes = keep < count
    return Window(segment=segment.commitlog_key, start=start, data=bytes(data), ends=ends.tolist(),
                  budget=max_bytes if by_bytes else -1)


def window_of(segment: Segment, records: list[Record], start: int, *, max_count: int, max_bytes: int) -> Window:
    """The window of ``records`` from queue offset ``start``, read with
    ``ColdReader.read``'s ``max_count`` and ``max_bytes``."""
    n = len(records)
    by_bytes = n < max_count and start + n < segment.q_end
    return Window(segment=segment.commitlog_key, start=start, data=b"".join(r.raw for r in records),
                  ends=list(accumulate(len(r.raw) for r in records)), budget=max_bytes if by_bytes else -1)


class WindowCache:
    """Windows by queue, least recently used dropped past ``max_bytes``.
    Safe to share between the event loop (lookups) and read threads (adds)."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lru: OrderedDict[tuple[str, int, int], Window] = OrderedDict()
        self._by_queue: dict[tuple[str, int], list[Window]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def window_bytes(self, queues: int) -> int:
        """How much one window may read ahead with ``queues`` queues served."""
        return min(WINDOW_BYTES, self.max_bytes // max(queues, 1))

    def cut(self, topic: str, queue_id: int, segment: Segment, offset: int, max_count: int,
            max_bytes: int) -> tuple[bytes, int] | None:
        """A pull's (body, count) from a window of ``segment``, or None."""
        with self._lock:
            for w in self._by_queue.get((topic, queue_id), ()):
                if w.segment == segment.commitlog_key and w.start <= offset < w.end:
                    # a window ending at its segment's end holds everything the pull may take
                    got = w.cut(offset, min(max_count, segment.q_end - offset), max_bytes)
                    if got is not None:
                        self._lru.move_to_end((topic, queue_id, w.start))
                        return got
        return None

    def add(self, topic: str, queue_id: int, window: Window) -> None:
        key = (topic, queue_id, window.start)
        with self._lock:
            self._drop(key)
            self._lru[key] = window
            self._by_queue.setdefault((topic, queue_id), []).append(window)
            self._bytes += len(window.data)
            while self._bytes > self.max_bytes:  # a window larger than the cache is not kept
                self._drop(next(iter(self._lru)))

    def _drop(self, key: tuple[str, int, int]) -> None:
        window = self._lru.pop(key, None)
        if window is None:
            return
        self._bytes -= len(window.data)
        queue = self._by_queue[key[:2]]
        queue.remove(window)
        if not queue:
            del self._by_queue[key[:2]]
