"""Build one cold segment from validated local records.

The cold CommitLog object is the records' bytes exactly as the broker
wrote them, concatenated; the cold ConsumeQueue holds one 20-byte entry per
record pointing into the queue's own cold CommitLog byte space (absolute
offsets, so segments can later be merged by concatenation). Memory is the
segment's bytes plus 20 bytes per record.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from tiered.codec import CQ_ENTRY
from tiered.keyindex import build_bloom, build_index
from tiered.localstore import QueuedRecord
from tiered.manifest import Segment, segment_keys


@dataclass(frozen=True)
class BuiltSegment:
    segment: Segment
    commitlog: bytes | bytearray
    consumequeue: bytes | bytearray
    index: bytes | None


class SegmentBuilder:
    def __init__(self, prefix: str, q_start: int, cl_start: int, *, key_index: bool = True) -> None:
        self.prefix = prefix
        self.q_start = q_start
        self.cl_start = cl_start
        self.key_index = key_index
        self._cl = bytearray()
        self._cq = bytearray()
        self._keys: list[tuple[int, list[str]]] = []
        self.count = 0
        self.min_store = self.max_store = self.min_born = self.max_born = 0

    @property
    def nbytes(self) -> int:
        return len(self._cl)

    @property
    def next_offset(self) -> int:
        return self.q_start + self.count

    def add(self, item: QueuedRecord) -> None:
        rec = item.record
        if item.queue_offset != self.next_offset:
            raise ValueError(f"record {item.queue_offset} does not follow {self.next_offset - 1}")
        self._cq += CQ_ENTRY.pack(self.cl_start + len(self._cl), rec.size, item.tags_code)
        self._cl += rec.raw
        st, bt = rec.store_timestamp, rec.born_timestamp
        if self.count == 0:
            self.min_store = self.max_store = st
            self.min_born = self.max_born = bt
        else:
            # store times grow with offsets, but a broker clock step back must not lie here
            if st < self.min_store:
                self.min_store = st
            if st > self.max_store:
                self.max_store = st
            if bt < self.min_born:
                self.min_born = bt
            if bt > self.max_born:
                self.max_born = bt
        if self.key_index:
            keys = rec.keys
            uniq = rec.unique_key
            if uniq:
                keys.append(uniq)
            if keys:
                self._keys.append((item.queue_offset, keys))
        self.count += 1

    def build(self, now_ms: int) -> BuiltSegment:
        if not self.count:
            raise ValueError("an empty segment is never built")
        q_end = self.q_start + self.count
        cl_end = self.cl_start + len(self._cl)
        cl_key, cq_key, ix_key = segment_keys(self.prefix, self.cl_start, cl_end, self.q_start, q_end)
        index = build_index(self.q_start, self._keys) if self._keys else None
        bloom = build_bloom(k for _, keys in self._keys for k in keys) if self._keys else None
        cl, cq = self._cl, self._cq  # handed over, not copied: the builder is done
        seg = Segment(
            q_start=self.q_start, q_end=q_end, cl_start=self.cl_start, cl_end=cl_end,
            min_store_ms=self.min_store, max_store_ms=self.max_store,
            min_born_ms=self.min_born, max_born_ms=self.max_born,
            commitlog_key=cl_key, consumequeue_key=cq_key, index_key=ix_key if index else None,
            commitlog_crc=zlib.crc32(cl), consumequeue_crc=zlib.crc32(cq), created_ms=now_ms, bloom=bloom,
        )
        return BuiltSegment(seg, cl, cq, index)
