"""Build one cold segment from validated local records.

The cold CommitLog object is the records' bytes exactly as the broker
wrote them, concatenated; the cold ConsumeQueue holds one 20-byte entry per
record pointing into the queue's own cold CommitLog byte space (absolute
offsets, so segments can later be merged by concatenation). The hot path
of archiving: records come in batches (``LocalStore.iter_batches``) and
everything per record is done on arrays, except copying the bytes, hashing
keys and one CRC over each object.

Layout v2 (the default, tiered/archive/layout.py) puts the records, the entries and
the key index in one object; the archiver adds the descriptor when it packs
it (``segmeta.pack_v2``). Its bloom filter is not built: it stays out of the
manifest so a commit does not grow with the archive's history, and a lookup
reads the segment's index section instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiered.format.batch import CQ_DTYPE, RecordBatch, copy_spans
from tiered.format.codec import crc32
from tiered.errors import CorruptRecordError
from tiered.archive.layout import COMPRESSIONS, LAYOUT_V2, section_keys, segment_object_key
from tiered.format.keyindex import (  # noqa: F401  (BadProperties, batch_keys: their home before keyindex)
    EMPTY_BLOOM, BadProperties, batch_keys, bloom_of_hashes, index_of_hashes, record_key_hashes)
from tiered.archive.manifest import Segment, segment_keys

@dataclass(frozen=True, kw_only=True)
class BuiltSegment:
    segment: Segment
    commitlog: bytes | bytearray
    consumequeue: bytes
    index: bytes | None
    compression: str = "none"  # of the v2 object


class SegmentBuilder:
    """Collects consecutive records of one queue, batch by batch.

    ``add`` copies the records' bytes at once into the segment's buffer (so
    the local store can give the mapped CommitLog pages back behind the
    read; holding views of the mapping until the build would fault them in
    again) and keeps a few arrays; ``build`` hands the buffer over without
    copying it. Memory is the segment's bytes plus some 50 bytes per record.
    """

    def __init__(self, prefix: str, q_start: int, cl_start: int, *, key_index: bool = True,
                 layout: int = LAYOUT_V2, compression: str = "none") -> None:
        if compression not in COMPRESSIONS or (compression != "none" and layout != 2):
            raise ValueError(f"compression {compression!r} needs layout v2 and one of {COMPRESSIONS}")
        self.prefix = prefix
        self.q_start = q_start
        self.cl_start = cl_start
        self.key_index = key_index
        self.layout = layout
        self.compression = compression
        self._cl = bytearray()  # the records' bytes in [:_n]; the rest is room reserved
        self._n = 0
        self._sizes: list[np.ndarray] = []
        self._tags: list[np.ndarray] = []
        self._store: list[np.ndarray] = []
        self._born: list[np.ndarray] = []
        self._key_offsets: list[np.ndarray] = []  # queue offset - q_start, per key
        self._key_hashes: list[np.ndarray] = []
        self.count = 0

    @property
    def nbytes(self) -> int:
        return self._n

    @property
    def next_offset(self) -> int:
        return self.q_start + self.count

    def add(self, batch: RecordBatch, *, keys: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Adds ``batch``; when a record's properties are corrupt, adds the
        records before it and raises CorruptRecordError. ``keys``: the
        batch's keys found already (record index in the batch, key hash), as
        ``record_key_hashes`` finds them (dispatcher.commitpass
        finds those of many queues' batches at once)."""
        if batch.first_offset != self.next_offset:
            raise ValueError(f"record {batch.first_offset} does not follow {self.next_offset - 1}")
        positions, sizes = batch.positions, batch.sizes
        total = int(sizes.sum())
        self._room(total)
        # copied once, straight into the segment (one call per batch)
        copy_spans(self._cl, self._n, batch.view, positions, positions + sizes)
        if keys is not None or not self.key_index:
            if keys is not None and len(keys[0]):
                self._key_offsets.append(keys[0] + (batch.first_offset - self.q_start))
                self._key_hashes.append(keys[1])
            self._n += total
            self._add_arrays(batch, batch.count)
            return
        # the keys read from the bytes just copied, not from pages of the
        # mapped CommitLog all over again
        at = np.cumsum(sizes) - sizes + self._n  # of each record in the buffer
        n = batch.count
        error: CorruptRecordError | None = None
        props_at, ends = at + (batch.props_at - positions), at + sizes
        with memoryview(self._cl) as chunk:  # released before the buffer may grow again
            try:
                owners, hashes = record_key_hashes(chunk, props_at, ends)
            except BadProperties as bad:
                n = bad.record  # the records before it
                error = CorruptRecordError(batch.source, int(batch.props_at[n]) + bad.at,
                                           "properties are not valid UTF-8")
                owners, hashes = record_key_hashes(chunk, props_at[:n], ends[:n])
        if len(owners):
            self._key_offsets.append(owners + (batch.first_offset - self.q_start))
            self._key_hashes.append(hashes)
        if n:
            self._n = int(at[n]) if n < batch.count else self._n + total
            self._add_arrays(batch, n)
        if error is not None:
            raise error

    def reserve(self, nbytes: int) -> None:
        """Room for ``nbytes`` more record bytes, allocated at once (the
        CommitLog pass knows what it will add): a buffer grown record by
        record is moved by realloc again and again."""
        self._room(nbytes)

    def _room(self, nbytes: int) -> None:
        need = self._n + nbytes
        have = len(self._cl)
        if need <= have:
            return
        if not have:
            self._cl = bytearray(need)
            return
        # half as much again: a few moves over a segment read with no reservation
        self._cl += bytes(max(need, have + have // 2) - have)

    def _add_arrays(self, batch: RecordBatch, n: int) -> None:
        """The first ``n`` records' sizes, tags and times (their bytes are in)."""
        self._sizes.append(batch.sizes[:n])
        self._tags.append(batch.tags[:n])
        self._store.append(batch.store_ms[:n])
        self._born.append(batch.born_ms[:n])
        self.count += n

    def build(self, now_ms: int) -> BuiltSegment:
        if not self.count:
            raise ValueError("an empty segment is never built")
        q_end = self.q_start + self.count
        sizes = np.concatenate(self._sizes)
        used = self._n
        cl, self._cl, self._n = self._cl, bytearray(), 0  # handed over, not copied: the builder is done
        del cl[used:]  # the room reserved and not filled
        cl_end = self.cl_start + len(cl)
        entries = np.empty(len(sizes), CQ_DTYPE)
        entries["phys"] = np.cumsum(sizes) - sizes + self.cl_start
        entries["size"] = sizes
        entries["tags"] = np.concatenate(self._tags)
        cq = entries.tobytes()
        index = bloom = None
        if self.key_index:
            bloom = EMPTY_BLOOM
            if self._key_hashes:
                hashes = np.concatenate(self._key_hashes)
                index = index_of_hashes(self.q_start, np.concatenate(self._key_offsets), hashes)
                if self.layout != LAYOUT_V2:  # v2 has no bloom: not built for nothing (~0.14 CPU s per GB)
                    bloom = bloom_of_hashes(hashes)
        if self.layout == LAYOUT_V2:
            if self.key_index and index is None:  # no bloom in v2: an empty index says "no keys"
                index = index_of_hashes(self.q_start, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
            bloom = None
            obj = segment_object_key(self.prefix, self.q_start, q_end, self.cl_start, cl_end,
                                            compression=self.compression)
            cl_key, cq_key, ix_key = section_keys(obj, len(cl), len(cq), len(index) if index is not None else None)
        else:
            cl_key, cq_key, ix_key = segment_keys(self.prefix, self.cl_start, cl_end, self.q_start, q_end)
        store, born = np.concatenate(self._store), np.concatenate(self._born)
        # min and max, not first and last: a broker clock stepping back must not lie here
        seg = Segment(
            q_start=self.q_start, q_end=q_end, cl_start=self.cl_start, cl_end=cl_end,
            min_store_ms=int(store.min()), max_store_ms=int(store.max()),
            min_born_ms=int(born.min()), max_born_ms=int(born.max()),
            commitlog_key=cl_key, consumequeue_key=cq_key, index_key=ix_key if index else None,
            commitlog_crc=crc32(cl), consumequeue_crc=crc32(cq), created_ms=now_ms, bloom=bloom,
        )
        return BuiltSegment(segment=seg, commitlog=cl, consumequeue=cq, index=index,
                            compression=self.compression)
