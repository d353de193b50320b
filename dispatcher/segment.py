"""Build one cold segment from validated local records.

The cold CommitLog object is the records' bytes exactly as the broker
wrote them, concatenated; the cold ConsumeQueue holds one 20-byte entry per
record pointing into the queue's own cold CommitLog byte space (absolute
offsets, so segments can later be merged by concatenation).

The hot path of archiving, so: ``add`` copies each record's bytes once, at
once, into the segment's buffer (so the local store can give the mapped
CommitLog pages back behind the read; holding slices of the mapping until
the build would fault them in again) and keeps a few integers; ``build``
hands that buffer over without copying it. Memory is the segment's bytes
plus some 100 bytes per record while it is built.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from itertools import accumulate

from tiered.codec import CQ_ENTRY
from tiered.errors import CorruptRecordError
from tiered.keyindex import build_bloom, build_index
from tiered.localstore import QueuedRecord
from tiered.manifest import Segment, segment_keys

_KEYS = "KEYS\x01"
_UNIQ = "UNIQ_KEY\x01"


def _value(props: str, name: str) -> str | None:
    """The value of property ``name`` ("NAME\\x01") in the broker's
    ``name \\x01 value \\x02`` encoding, without splitting all of it."""
    i = props.find(name)
    if i < 0:
        return None
    while i > 0 and props[i - 1] != "\x02":  # inside another property's name or value
        i = props.find(name, i + 1)
        if i < 0:
            return None
    start = i + len(name)
    end = props.find("\x02", start)
    return props[start:end] if end >= 0 else props[start:]


def index_keys(props_raw: bytes | memoryview, source: str = "<record>", position: int = 0) -> list[str]:
    """The keys a record is indexed by: its KEYS (space separated) and its
    UNIQ_KEY. Properties that are not UTF-8 make the record corrupt, as
    ``codec.decode_properties`` says."""
    if not props_raw:
        return []
    try:
        props = bytes(props_raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(source, position + exc.start, "properties are not valid UTF-8") from None
    keys: list[str] = []
    value = _value(props, _KEYS)
    if value:
        keys.extend(k for k in value.split(" ") if k)
    uniq = _value(props, _UNIQ)
    if uniq:
        keys.append(uniq)
    return keys


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
        self._sizes: list[int] = []
        self._tags: list[int] = []
        self._store: list[int] = []
        self._born: list[int] = []
        self._keys: list[tuple[int, list[str]]] = []
        self.count = 0

    @property
    def nbytes(self) -> int:
        return len(self._cl)

    @property
    def next_offset(self) -> int:
        return self.q_start + self.count

    def add(self, item: QueuedRecord) -> None:
        rec = item.record
        offset = item.queue_offset
        if offset != self.q_start + self.count:
            raise ValueError(f"record {offset} does not follow {self.next_offset - 1}")
        raw = rec.raw
        self._cl += raw
        self._sizes.append(len(raw))
        self._tags.append(item.tags_code)
        self._store.append(rec.store_timestamp)
        self._born.append(rec.born_timestamp)
        if self.key_index:
            keys = index_keys(rec.properties_raw, rec.source, rec.position)
            if keys:
                self._keys.append((offset, keys))
        self.count += 1

    def build(self, now_ms: int) -> BuiltSegment:
        if not self.count:
            raise ValueError("an empty segment is never built")
        q_end = self.q_start + self.count
        sizes = self._sizes
        cl, self._cl = self._cl, bytearray()  # handed over, not copied: the builder is done
        cl_end = self.cl_start + len(cl)
        offsets = accumulate(sizes[:-1], initial=self.cl_start)
        cq = b"".join(map(CQ_ENTRY.pack, offsets, sizes, self._tags))
        cl_key, cq_key, ix_key = segment_keys(self.prefix, self.cl_start, cl_end, self.q_start, q_end)
        index = build_index(self.q_start, self._keys) if self._keys else None
        bloom = build_bloom(k for _, keys in self._keys for k in keys) if self.key_index else None
        # min and max, not first and last: a broker clock stepping back must not lie here
        seg = Segment(
            q_start=self.q_start, q_end=q_end, cl_start=self.cl_start, cl_end=cl_end,
            min_store_ms=min(self._store), max_store_ms=max(self._store),
            min_born_ms=min(self._born), max_born_ms=max(self._born),
            commitlog_key=cl_key, consumequeue_key=cq_key, index_key=ix_key if index else None,
            commitlog_crc=zlib.crc32(cl), consumequeue_crc=zlib.crc32(cq), created_ms=now_ms, bloom=bloom,
        )
        return BuiltSegment(seg, cl, cq, index)
