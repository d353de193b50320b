"""Build one cold segment from validated local records.

The cold CommitLog object is the records' bytes exactly as the broker
wrote them, concatenated; the cold ConsumeQueue holds one 20-byte entry per
record pointing into the queue's own cold CommitLog byte space (absolute
offsets, so segments can later be merged by concatenation). The hot path
of archiving: records come in batches (``LocalStore.iter_batches``) and
everything per record is done on arrays, except copying the bytes, hashing
keys and one CRC over each object (over the records, kept by the
CommitLog pass as it copies them: ``SegmentBuilder.extend``/``crc``).

Layout v2 (the default, tiered/archive/layout.py) puts the records, the entries and
the key index in one object; the archiver adds the descriptor when it packs
it (``segmeta.pack_v2``). Its bloom filter is not built: it stays out of the
manifest so a commit does not grow with the archive's history, and a lookup
reads the segment's index section instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from tiered.format.batch import CQ_DTYPE, RecordBatch, copy_spans
from tiered.format.codec import crc32, decode_record
from tiered.format.innerbatch import batch_size, is_inner_batch, unwrap
from tiered.errors import CorruptRecordError
from tiered.archive.layout import COMPRESSIONS, LAYOUT_V2, section_keys, segment_object_key
from tiered.format.keyindex import EMPTY_BLOOM, BadProperties, bloom_of_hashes, index_of_hashes, record_key_hashes
from tiered.format.keyindex import key_hashes as key_hashes_of
from tiered.format.segbuffer import SegmentBuffer
from tiered.archive.manifest import Segment, segment_keys

# the v2 object's tail reserved behind the records (SegmentBuilder.reserve): an
# index entry is 12 bytes a key, two keys a record guessed (KEYS and UNIQ_KEY);
# the descriptor and footer well under the room given. A guess short of it
# costs one realloc in pack_v2, nothing else.
_KEY_ROOM = 2 * 12
_DESCRIPTOR_ROOM = 4096


# Segment buffers start at a page (SegmentBuffer): tiered.archive.filewrite
# writes such a buffer with O_DIRECT, around the page cache.
ALIGN = 4096


def ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """starts[r], starts[r] + 1, ... counts[r] items for each r, one after the other."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(starts - (ends - counts), counts)


class BufferPool:
    """Segment buffers given back after their upload, for the next segments.

    A fresh buffer of a segment's size is memory the kernel has never mapped
    for this process: copying the records into it page-faults every page of
    it (half of the CommitLog pass's CPU on 16 MiB segments). A buffer given
    back has its pages mapped already. Bounded: at most ``limit`` buffers
    and ``max_bytes`` held idle, so peak memory grows by at most that;
    ``take`` hands the most recent back first.

    Ownership is explicit: a buffer is given back once, by its last holder
    (the upload, once the store has written it), and from then on is the
    pool's until a ``take`` hands it to one new holder.
    """

    def __init__(self, *, limit: int, max_bytes: int) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._idle: list[SegmentBuffer] = []
        self._bytes = 0  # held in _idle
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> SegmentBuffer:
        """A buffer of ``nbytes`` bytes at a page, whose values are undefined:
        one given back, resized (its pages up to ``nbytes`` mapped already,
        those past it returned to the kernel), else a fresh one."""
        with self._lock:
            buf = self._idle.pop() if self._idle else None
            self._bytes -= len(buf) if buf is not None else 0
        if buf is not None:
            try:
                buf.resize(nbytes)
                return buf
            except BufferError:  # a view outlived its give (a retried put's first try): the view keeps it
                pass
        return SegmentBuffer(nbytes)

    def give(self, buf: object) -> bool:
        """``buf`` kept for a later ``take``, when it is a segment buffer and
        the pool has room: called by its last holder, which uses it no more
        (the next segment is copied into it). Anything else (bytes a
        compressed object was made into) is left to the garbage collector;
        a buffer given back twice is a ValueError, never two holders."""
        if not isinstance(buf, SegmentBuffer):
            return False
        with self._lock:
            if any(idle is buf for idle in self._idle):
                raise ValueError("a segment buffer given back twice")
            if len(self._idle) >= self.limit or self._bytes + len(buf) > self.max_bytes:
                return False
            self._idle.append(buf)
            self._bytes += len(buf)
        return True

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()
            self._bytes = 0


# the segments of one wave of uploads come back as the next wave's pass begins:
# four of 32 MiB, or a thousand small ones of a pass over 1,000 queues (their
# fresh pages cost the pass as much as the copy into them); a round sizes
# max_bytes to its waves and empties the pool when it ends
SEGMENT_BUFFERS = BufferPool(limit=1024, max_bytes=256 << 20)


@dataclass(frozen=True, kw_only=True)
class BuiltSegment:
    segment: Segment
    commitlog: bytes | SegmentBuffer  # the records; a builder's buffer, its upload the last holder
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
                 layout: int = LAYOUT_V2, compression: str = "none", batch: bool = False) -> None:
        if compression not in COMPRESSIONS or (compression != "none" and layout != 2):
            raise ValueError(f"compression {compression!r} needs layout v2 and one of {COMPRESSIONS}")
        self.prefix = prefix
        self.q_start = q_start
        self.cl_start = cl_start
        self.key_index = key_index
        self.layout = layout
        self.compression = compression
        # a BatchCQ queue's records: the segment records the messages' queue
        # offsets and indexes the inner messages' keys (docs/batchcq.md)
        self.batch = batch
        # the records' bytes in [:_n]; the rest is room reserved (a SegmentBuffer
        # from the first room asked for: nothing is mapped for an empty builder)
        self._cl: SegmentBuffer | bytearray = bytearray()
        self._n = 0
        # CRC-32 of _cl[:_crc_end]: kept by a caller that computed it as it copied
        # (``extend``), continued over the rest by ``crc`` (at the build)
        self._crc = 0
        self._crc_end = 0
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

    def buffer(self, end: int) -> SegmentBuffer | bytearray:
        """The segment's buffer with room for record bytes up to ``end``, for a
        caller that copies records into it itself (the CommitLog pass, a
        window's records of every queue in one call) and then ``extend``s."""
        self._room(end - self._n)
        return self._cl

    def extend(self, end: int, sizes: np.ndarray, tags: np.ndarray, store_ms: np.ndarray, born_ms: np.ndarray,
               key_offsets: np.ndarray | None, key_hashes: np.ndarray | None, *, crc: int | None = None) -> None:
        """Records the caller copied into ``buffer(end)`` from ``nbytes`` up to
        ``end``: their sizes, tags and times, and their keys (queue offset -
        ``q_start``, hash), as ``add`` keeps them. ``crc``: the CRC-32 of the
        segment's bytes up to ``end``, computed as they were copied (the
        CommitLog pass's, from ``crc()``): the build does not read them again
        for it."""
        if end - self._n != int(sizes.sum()):
            raise ValueError(f"records of {int(sizes.sum())} bytes extend {self._n} to {end}")
        self.extend_unchecked(end, sizes, tags, store_ms, born_ms, key_offsets, key_hashes, crc)

    def extend_unchecked(self, end: int, sizes: np.ndarray, tags: np.ndarray, store_ms: np.ndarray,
                         born_ms: np.ndarray, key_offsets: np.ndarray | None, key_hashes: np.ndarray | None,
                         crc: int | None) -> None:
        """``extend`` without its check that the sizes add up to ``end``, for a
        caller that checked it already: ``extend_many`` checks every builder's
        at once, cheaper than a check a builder."""
        if key_offsets is not None and key_hashes is not None and len(key_offsets):
            self._key_offsets.append(key_offsets)
            self._key_hashes.append(key_hashes)
        self._n = end
        if crc is not None:
            self._crc, self._crc_end = crc, end
        self._append(sizes, tags, store_ms, born_ms)

    def crc(self) -> int:
        """The CRC-32 of the segment's bytes so far: the one ``extend`` was
        given, continued over the bytes added since (``add``'s, read once
        here)."""
        if self._crc_end < self._n:
            with memoryview(self._cl) as cl:  # released before the buffer may move
                self._crc = crc32(cl[self._crc_end:self._n], self._crc)
            self._crc_end = self._n
        return self._crc

    @staticmethod
    def extend_many(builders: list[SegmentBuilder], ends: np.ndarray, sizes: np.ndarray, tags: np.ndarray,
                    store_ms: np.ndarray, born_ms: np.ndarray, los: np.ndarray, his: np.ndarray,
                    key_offsets: np.ndarray, key_hashes: np.ndarray, key_bounds: np.ndarray,
                    crcs: np.ndarray | None = None) -> None:
        """``extend`` of many builders in one call (the CommitLog pass hands a
        thousand queues their records at once; a call each, with its checks,
        cost more than their records): builder i's records are rows
        ``los[i]:his[i]`` of ``sizes``, ``tags``, ``store_ms`` and
        ``born_ms``, its keys rows ``key_bounds[i]:key_bounds[i + 1]`` of
        ``key_offsets`` and ``key_hashes``; ``crcs[i]``, when given, the CRC-32
        of its bytes up to ``ends[i]``. Checked for every builder (its
        records' sizes add up to ``ends[i]`` from what it holds) before any
        changes."""
        n = len(builders)
        counts = his - los
        if len(los) != n or len(his) != n or len(ends) != n or len(key_bounds) != n + 1 or (counts < 0).any():
            raise ValueError(f"{n} builders: one row range and end each, and key bounds, are needed")
        held = np.fromiter((b.nbytes for b in builders), np.int64, n)
        done = np.concatenate(([0], np.cumsum(sizes.take(ragged(los, counts)))))
        bounds = np.concatenate(([0], np.cumsum(counts)))
        wrong = np.flatnonzero(done[bounds[1:]] - done[bounds[:-1]] != ends - held)
        if len(wrong):
            i = int(wrong[0])
            raise ValueError(f"builder {i}: records of {int(done[bounds[i + 1]] - done[bounds[i]])} bytes "
                             f"extend {int(held[i])} to {int(ends[i])}")
        if crcs is not None and len(crcs) != n:
            raise ValueError(f"{n} builders: {len(crcs)} CRCs")
        crc_of = crcs.tolist() if crcs is not None else [None] * n
        for b, end, lo, hi, k_lo, k_hi, crc in zip(builders, ends.tolist(), los.tolist(), his.tolist(),
                                                   key_bounds[:-1].tolist(), key_bounds[1:].tolist(), crc_of):
            b.extend_unchecked(end, sizes[lo:hi], tags[lo:hi], store_ms[lo:hi], born_ms[lo:hi],
                               key_offsets[k_lo:k_hi], key_hashes[k_lo:k_hi], crc)

    def reserve(self, nbytes: int, records: int = 0) -> None:
        """Room for ``nbytes`` more record bytes of ``records`` records,
        allocated at once (the CommitLog pass knows what it will add): a
        buffer grown record by record is moved by realloc again and again.
        In layout v2 the room holds the object's tail too (entries, key
        index, descriptor): ``build`` trims the buffer to the records, which
        keeps its allocation, so ``segmeta.pack_v2(consume=True)`` appends
        the tail without moving a segment's worth of bytes."""
        tail = 0
        if self.layout == LAYOUT_V2 and records:
            tail = records * (CQ_DTYPE.itemsize + _KEY_ROOM * self.key_index) + _DESCRIPTOR_ROOM
        self._room(nbytes + tail)

    def _room(self, nbytes: int) -> None:
        need = self._n + nbytes
        have = len(self._cl)
        if need <= have:
            return
        if not isinstance(self._cl, SegmentBuffer):  # pages a past segment mapped already, when one was given back
            self._cl = SEGMENT_BUFFERS.take(need)
            return
        # half as much again when growing: a few resizes over a segment read with no
        # reservation. All ``have`` bytes kept (mremap moves no byte): the CommitLog
        # pass copies records in before it ``extend``s.
        self._cl.resize(max(need, have + have // 2))

    def _add_arrays(self, batch: RecordBatch, n: int) -> None:
        """The first ``n`` records' sizes, tags and times (their bytes are in)."""
        self._append(batch.sizes[:n], batch.tags[:n], batch.store_ms[:n], batch.born_ms[:n])

    def _append(self, sizes: np.ndarray, tags: np.ndarray, store_ms: np.ndarray, born_ms: np.ndarray) -> None:
        self._sizes.append(sizes)
        self._tags.append(tags)
        self._store.append(store_ms)
        self._born.append(born_ms)
        self.count += len(sizes)

    def build(self, now_ms: int) -> BuiltSegment:
        if not self.count:
            raise ValueError("an empty segment is never built")
        q_end = self.q_start + self.count
        sizes = np.concatenate(self._sizes)
        used = self._n
        cl_crc = self.crc()
        cl, self._cl, self._n = self._cl, bytearray(), 0  # handed over, not copied: the builder is done
        if not isinstance(cl, SegmentBuffer) or used > len(cl):
            raise ValueError(f"records of {used} bytes extended past the buffer asked for")
        cl.resize(used)  # the room reserved and not filled, returned to the kernel
        cl_end = self.cl_start + len(cl)
        entries = np.empty(len(sizes), CQ_DTYPE)
        entries["phys"] = np.cumsum(sizes) - sizes + self.cl_start
        entries["size"] = sizes
        entries["tags"] = np.concatenate(self._tags)
        cq = entries.tobytes()
        msg_range: tuple[int | None, int | None] = (None, None)
        if self.batch:
            msg_range = batch_messages(cl, entries["phys"] - self.cl_start, sizes, self._key_offsets,
                                       self._key_hashes)
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
            commitlog_crc=cl_crc, consumequeue_crc=crc32(cq), created_ms=now_ms, bloom=bloom,
            msg_start=msg_range[0], msg_end=msg_range[1],
        )
        return BuiltSegment(segment=seg, commitlog=cl, consumequeue=cq, index=index,
                            compression=self.compression)


def batch_messages(cl: SegmentBuffer | bytes, positions: np.ndarray, sizes: np.ndarray, key_offsets: list[np.ndarray],
                   key_hashes: list[np.ndarray]) -> tuple[int, int]:
    """A BatchCQ segment's message range (the first record's queue offset to
    the last one's + its batch size), and its inner messages' keys added to
    the key index (record index, hash), so a key finds its batch's record.
    The records were checked against their entries as they were read."""
    with memoryview(cl) as view:
        records = [decode_record(view, p, "<segment>", verify_crc=False) for p in positions.tolist()]
        owners: list[int] = []
        keys: list[str] = []
        for i, rec in enumerate(records):
            if not is_inner_batch(rec.sys_flag):
                continue  # a single message's keys are the record's own, indexed already
            for msg in unwrap(rec):
                found = [k for k in msg.properties.get("KEYS", "").split(" ") if k]
                if msg.msg_id:
                    found.append(msg.msg_id)
                owners.extend([i] * len(found))
                keys.extend(found)
        if keys:
            key_offsets.append(np.asarray(owners, np.int64))
            key_hashes.append(key_hashes_of(keys))
        first, last = records[0], records[-1]
        return first.queue_offset, last.queue_offset + batch_size(last)
