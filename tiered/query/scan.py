"""Scans of the archive in parallel pieces: plan on one machine, read anywhere.

``plan`` turns what a query asks for (``ScanSpec``: brokers, topics, queues,
queue-offset and time ranges) into ``Slice``s, plain picklable descriptors
of a run of one segment. Pruning happens before any data is read: the
catalog drops queues (by name, and by a start time it cannot have), the
manifests drop segments by their offset and store/born time ranges, and
offset ranges trim slices exactly. A segment larger than ``max_slice_bytes``
is cut into several slices by message count.

``read_slice`` reads one slice with two ranged GETs: its cold ConsumeQueue
entries, then the cold CommitLog bytes they cover. When the store-time range
is narrower than the segment's, a binary search over record headers (one
small ranged GET each) trims the CommitLog read to the records in range, so a
one-hour query over a day-long segment reads about an hour of it.

Everything a slice needs travels in it; the object store is rebuilt from a
picklable ``ObjectStore`` (no client inside), so a slice can be read on any
Spark executor.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc

from tiered.format.codec import CQ_ENTRY_SIZE
from tiered.query.batchscan import decode_batch_records
from tiered.query.columnar import BatchDecoder, Where, arange, check_entries, parse_entries, rows_batch
from tiered.errors import CorruptRecordError, StorageError
from tiered.archive.manifest import Manifest, Segment
from tiered.format.keyindex import bloom_may_contain, lookup
from tiered.query.reader import Archive, QueueRef, ReadStats, first_at_or_after, get_object, get_range, probe_store_ms
from tiered.query.spark_schema import TIMESTAMP, arrow_schema
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)

DEFAULT_SLICE_BYTES = 128 << 20
CHUNK_ROWS = 16384
CHUNK_BYTES = 16 << 20
PIECE_BYTES = 16 << 20  # CommitLog bytes per ranged GET when reading a slice


@dataclass(frozen=True)
class Bounds:
    """An inclusive integer range; None is unbounded."""

    lo: int | None = None
    hi: int | None = None

    def and_(self, lo: int | None = None, hi: int | None = None) -> Bounds:
        nlo = self.lo if lo is None else (lo if self.lo is None else max(lo, self.lo))
        nhi = self.hi if hi is None else (hi if self.hi is None else min(hi, self.hi))
        return Bounds(nlo, nhi)

    @property
    def empty(self) -> bool:
        return self.lo is not None and self.hi is not None and self.lo > self.hi

    @property
    def unbounded(self) -> bool:
        return self.lo is None and self.hi is None

    def overlaps(self, lo: int, hi: int) -> bool:
        """Does [lo, hi] meet this range?"""
        return not self.empty and (self.lo is None or hi >= self.lo) and (self.hi is None or lo <= self.hi)

    def covers(self, lo: int, hi: int) -> bool:
        return (self.lo is None or lo >= self.lo) and (self.hi is None or hi <= self.hi)


@dataclass(frozen=True)
class ScanSpec:
    """What a scan keeps. Set-valued fields: None keeps everything."""

    clusters: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    topics: frozenset[str] | None = None
    topic_prefixes: tuple[str, ...] | None = None
    queue_ids: frozenset[int] | None = None
    queue_offset: Bounds = Bounds()
    store_us: Bounds = Bounds()  # microseconds, inclusive
    born_us: Bounds = Bounds()

    def with_set(self, name: str, values: frozenset) -> ScanSpec:
        current = getattr(self, name)
        changes: dict[str, Any] = {name: values if current is None else current & values}
        return replace(self, **changes)

    @property
    def nothing(self) -> bool:
        return any(s is not None and not s for s in (self.clusters, self.brokers, self.topics, self.queue_ids)) or \
            self.queue_offset.empty or self.store_us.empty or self.born_us.empty

    def topic_ok(self, topic: str) -> bool:
        return (self.topics is None or topic in self.topics) and \
            (self.topic_prefixes is None or any(topic.startswith(p) for p in self.topic_prefixes))

    def queue_ok(self, queue_id: int) -> bool:
        return self.queue_ids is None or queue_id in self.queue_ids

    def segment_ok(self, seg: Segment) -> bool:
        q_lo, q_hi = (int(seg.msg_start or 0), int(seg.msg_end or 0)) if seg.batch else (seg.q_start, seg.q_end)
        return (self.queue_offset.overlaps(q_lo, q_hi - 1)
                and self.store_us.overlaps(seg.min_store_ms * 1000, seg.max_store_ms * 1000 + 999)
                and self.born_us.overlaps(seg.min_born_ms * 1000, seg.max_born_ms * 1000 + 999))


@dataclass(frozen=True, kw_only=True)
class Slice:
    """Queue offsets [q_start, q_end) of one segment: everything needed to read them."""

    cluster: str
    broker: str
    topic: str
    queue_id: int
    commitlog_key: str
    consumequeue_key: str
    seg_q_start: int
    seg_q_end: int
    seg_cl_start: int
    seg_cl_end: int
    min_store_ms: int
    max_store_ms: int
    q_start: int
    q_end: int
    # a BatchCQ queue's segment: records of several messages each, at queue
    # offsets [msg_start, msg_end) of the whole segment (docs/batchcq.md)
    msg_start: int | None = None
    msg_end: int | None = None

    @property
    def batch(self) -> bool:
        return self.msg_start is not None

    @property
    def ref(self) -> QueueRef:
        return QueueRef(self.cluster, self.broker, self.topic, self.queue_id)

    @property
    def messages(self) -> int:
        return self.q_end - self.q_start

    @property
    def est_bytes(self) -> int:
        seg_msgs = max(1, self.seg_q_end - self.seg_q_start)
        return (self.seg_cl_end - self.seg_cl_start) * self.messages // seg_msgs

    def segment(self) -> Segment:
        """The parts of the segment a read needs (a Segment for the probe helpers)."""
        return Segment(q_start=self.seg_q_start, q_end=self.seg_q_end, cl_start=self.seg_cl_start,
                       cl_end=self.seg_cl_end, min_store_ms=self.min_store_ms, max_store_ms=self.max_store_ms,
                       min_born_ms=0, max_born_ms=0, commitlog_key=self.commitlog_key,
                       consumequeue_key=self.consumequeue_key, index_key=None, commitlog_crc=0,
                       consumequeue_crc=0, created_ms=0)

    def __str__(self) -> str:
        return f"{self.cluster}/{self.broker}/{self.topic}/{self.queue_id} [{self.q_start},{self.q_end})"


def segment_slices(ref: QueueRef, seg: Segment, q_lo: int, q_hi: int, max_bytes: int) -> list[Slice]:
    """[q_lo, q_hi) of ``seg`` (clamped to it) cut into slices of about ``max_bytes``."""
    lo, hi = max(q_lo, seg.q_start), min(q_hi, seg.q_end)
    if lo >= hi:
        return []
    est = seg.nbytes * (hi - lo) // max(1, seg.messages)
    parts = max(1, math.ceil(est / max(1, max_bytes)))
    if seg.batch:  # one slice: the whole segment's message range is what its rows count
        parts = 1
    step = math.ceil((hi - lo) / parts)
    out = []
    for start in range(lo, hi, step):
        out.append(Slice(cluster=ref.cluster, broker=ref.broker, topic=ref.topic, queue_id=ref.queue_id,
                         commitlog_key=seg.commitlog_key, consumequeue_key=seg.consumequeue_key,
                         seg_q_start=seg.q_start, seg_q_end=seg.q_end, seg_cl_start=seg.cl_start, seg_cl_end=seg.cl_end,
                         min_store_ms=seg.min_store_ms, max_store_ms=seg.max_store_ms, q_start=start,
                         q_end=min(hi, start + step), msg_start=seg.msg_start, msg_end=seg.msg_end))
    return out


@dataclass
class Plan:
    slices: list[Slice]
    queues: int = 0  # queues whose manifest was read
    segments: int = 0  # segments listed by those manifests
    segments_kept: int = 0


def plan(archive: Archive, spec: ScanSpec, *, max_slice_bytes: int = DEFAULT_SLICE_BYTES,
         key: str | None = None) -> Plan:
    """The slices a scan reads, pruned by catalog and manifests (no data read).
    With ``key`` (a KEYS entry or a UNIQ_KEY), only the records the segments'
    bloom filters and key indexes point at (index hash collisions included:
    the reader drops them); a segment without an index is read whole."""
    out = Plan([])
    if spec.nothing:
        return out
    q_lo = spec.queue_offset.lo if spec.queue_offset.lo is not None else 0
    q_hi = spec.queue_offset.hi + 1 if spec.queue_offset.hi is not None else 1 << 62
    for ref, seg in _kept_segments(archive, spec, out):
        if key is None:
            out.slices.extend(segment_slices(ref, seg, q_lo, q_hi, max_slice_bytes))
            continue
        if seg.bloom and not bloom_may_contain(seg.bloom, key):
            continue
        offsets = _indexed_offsets(archive.store, seg, key)
        if offsets is None:
            out.slices.extend(segment_slices(ref, seg, q_lo, q_hi, max_slice_bytes))
            continue
        for off in offsets:
            if q_lo <= off < q_hi:
                out.slices.extend(segment_slices(ref, seg, off, off + 1, max_slice_bytes))
    return out


def _kept_segments(archive: Archive, spec: ScanSpec, out: Plan) -> Iterator[tuple[QueueRef, Segment]]:
    refs = []
    broker_ok = lambda c, b: ((spec.clusters is None or c in spec.clusters)  # noqa: E731
                              and (spec.brokers is None or b in spec.brokers))
    for ref in archive.queues(spec.topic_ok, spec.queue_ok, broker_ok):
        entry = archive.catalog_entry(ref)
        # The catalog may lag the manifests: only what it cannot get wrong prunes.
        # Its first offset and oldest time only grow, so a start past the query's
        # end rules the queue out; its end offset and newest time may be stale.
        if entry is not None:
            if spec.store_us.hi is not None and entry.min_store_ms is not None \
                    and entry.min_store_ms * 1000 > spec.store_us.hi:
                continue
            if spec.queue_offset.hi is not None and entry.first_offset > spec.queue_offset.hi \
                    and entry.segments > 0:
                continue
        refs.append(ref)
    manifests = archive.manifests(refs)
    out.queues = len(manifests)
    for ref in refs:
        m = manifests.get(ref)
        if m is None:
            continue
        out.segments += len(m.segments)
        for seg in m.segments:
            if spec.segment_ok(seg):
                out.segments_kept += 1
                yield ref, seg


def _indexed_offsets(store: ObjectStore, seg: Segment, key: str) -> list[int] | None:
    """Queue offsets the segment's key index lists for ``key``; None when the
    segment has no usable index (then it is read whole)."""
    if not seg.index_key:
        return None
    try:
        return sorted(set(lookup(get_object(store, seg.index_key, None), key, seg.index_key)))
    except (CorruptRecordError, StorageError) as exc:
        log.warning("key index unusable, reading the whole segment instead: %s", exc)
        return None


def manifest_slices(ref: QueueRef, m: Manifest, q_from: int, q_to: int, max_bytes: int) -> list[Slice]:
    """Slices covering [q_from, q_to) of a queue (gaps and expired ranges left out)."""
    out = []
    for seg in m.segments:
        if seg.q_end > q_from and seg.q_start < q_to:
            out.extend(segment_slices(ref, seg, q_from, q_to, max_bytes))
    return out


# --- reading a slice --------------------------------------------------------------


@dataclass
class SliceResult:
    rows: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)


def _narrow(store: ObjectStore, sl: Slice, offsets: pa.Array, store_us: Bounds, stats: ReadStats) -> tuple[int, int]:
    """[i, j): the entries whose store time may fall in ``store_us`` (binary
    search over record headers; times grow with offsets)."""
    n = len(offsets)
    lo_ms = None if store_us.lo is None else -(-store_us.lo // 1000)  # first ms >= lo
    hi_ms = None if store_us.hi is None else store_us.hi // 1000  # last ms <= hi
    seg = sl.segment()
    cache: dict[int, int] = {}
    offs = offsets.to_pylist() if n <= 4096 else None

    def ts_of(i: int) -> int:
        if i not in cache:
            off = offs[i] if offs is not None else offsets[i].as_py()
            cache[i] = probe_store_ms(store, seg, off, stats)
        return cache[i]

    i = 0 if lo_ms is None or sl.min_store_ms >= lo_ms else first_at_or_after(n, ts_of, lo_ms)
    j = n if hi_ms is None or sl.max_store_ms <= hi_ms else first_at_or_after(n, ts_of, hi_ms + 1)
    return i, max(i, j)


def _slice_entries(store: ObjectStore, sl: Slice, where: Where, window: Bounds, stats: ReadStats
                   ) -> tuple[pa.Array, pa.Array, int, int, int] | None:
    """The slice's ConsumeQueue entries, checked and narrowed to ``window``:
    (offsets, sizes, first entry's index in the slice, first byte, end byte);
    None when no record of the slice can be in the window."""
    n = sl.messages
    cq_lo = (sl.q_start - sl.seg_q_start) * CQ_ENTRY_SIZE
    cq = get_range(store, sl.consumequeue_key, cq_lo, cq_lo + n * CQ_ENTRY_SIZE, stats)
    if len(cq) != n * CQ_ENTRY_SIZE:
        raise CorruptRecordError(sl.consumequeue_key, cq_lo + len(cq) - len(cq) % CQ_ENTRY_SIZE,
                                 f"object ends before queue offset {sl.q_end} (its manifest's range)")
    offsets, sizes = parse_entries(cq, where, sl.q_start)
    i, j = 0, n
    if not window.covers(sl.min_store_ms * 1000, sl.max_store_ms * 1000 + 999):
        try:
            i, j = _narrow(store, sl, offsets, window, stats)
        except (CorruptRecordError, StorageError) as exc:
            log.info("no time narrowing for %s (%s): reading the whole slice", sl, exc)
    if i >= j:
        return None
    offsets, sizes = offsets.slice(i, j - i), sizes.slice(i, j - i)
    first = offsets[0].as_py()
    last_end = offsets[j - i - 1].as_py() + sizes[j - i - 1].as_py()
    if first < sl.seg_cl_start or last_end > sl.seg_cl_end or last_end <= first:
        raise CorruptRecordError(sl.consumequeue_key, cq_lo + i * CQ_ENTRY_SIZE,
                                 f"entries point outside the segment's CommitLog bytes "
                                 f"[{sl.seg_cl_start},{sl.seg_cl_end})")
    check_entries(offsets, sizes, first, last_end - first, where, sl.q_start + i)
    return offsets, sizes, i, first, last_end


def read_slice(store: ObjectStore, sl: Slice, decoder: BatchDecoder, *, store_us: Bounds = Bounds(),
               exact_store_us: Bounds = Bounds(), stats: ReadStats | None = None,
               result: SliceResult | None = None, narrow: bool = True) -> Iterator[pa.RecordBatch]:
    """The records of a slice as RecordBatches of ``decoder.columns``.

    ``store_us`` narrows the read (records outside it may still come back);
    ``exact_store_us`` filters rows exactly (and narrows too, unless ``narrow``
    is false: then every row of the slice is read and filtered). A slice whose objects are missing
    or whose ConsumeQueue is unusable raises (naming the object and offset),
    or with ``decoder.skip_corrupt`` counts all its records as skipped.
    """
    stats = stats if stats is not None else ReadStats()
    result = result if result is not None else SliceResult()
    n = sl.messages
    where = Where(sl.commitlog_key, sl.seg_cl_start, sl.consumequeue_key, sl.seg_q_start)
    window = store_us.and_(exact_store_us.lo, exact_store_us.hi) if narrow else Bounds()
    try:
        span = _slice_entries(store, sl, where, window, stats)
    except (CorruptRecordError, StorageError) as exc:
        _skip_slice(decoder, result, sl, n, exc)
        return
    if span is None:
        return
    offsets, sizes, i, first, last_end = span
    m = len(offsets)
    avg = max(1, (last_end - first) // m)
    rows = _TimeFilter.of(sl, exact_store_us)
    work = decoder
    if rows.active and "store_timestamp" not in decoder.columns:
        work = BatchDecoder(decoder.queue, decoder.columns + ("store_timestamp",), verify_crc=decoder.verify_crc,
                            skip_corrupt=decoder.skip_corrupt, decompress=decoder.decompress)
    read = _SliceRead(store=store, sl=sl, decoder=decoder, work=work, result=result, stats=stats, where=where,
                      offsets=offsets, sizes=sizes, first_row=i, step=max(1, min(CHUNK_ROWS, CHUNK_BYTES // avg)),
                      rows=rows)
    try:
        yield from read.batches(_pieces(offsets, first, m))
    finally:
        if work is not decoder:
            decoder.skipped += work.skipped
            decoder.skipped_at.extend(work.skipped_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class _TimeFilter:
    """Rows kept by their exact store time; inactive when the slice lies wholly
    inside the range (every row kept)."""

    active: bool
    lo: pa.Scalar | None
    hi: pa.Scalar | None

    @classmethod
    def of(cls, sl: Slice, exact_store_us: Bounds) -> _TimeFilter:
        lo, hi = exact_store_us.lo, exact_store_us.hi
        return cls(active=not exact_store_us.unbounded and not exact_store_us.covers(
                       sl.min_store_ms * 1000, sl.max_store_ms * 1000 + 999),
                   lo=pa.scalar(lo, pa.int64()).cast(TIMESTAMP) if lo is not None else None,
                   hi=pa.scalar(hi, pa.int64()).cast(TIMESTAMP) if hi is not None else None)

    def apply(self, batch: pa.RecordBatch, columns: tuple[str, ...]) -> pa.RecordBatch:
        if self.active and batch.num_rows:
            return _in_time(batch, self.lo, self.hi).select(list(columns))
        return batch


@dataclass(frozen=True, slots=True, kw_only=True)
class _SliceRead:
    """The read of a slice's CommitLog bytes once its entries are known and
    checked: pieces fetched one ahead, decoded in steps of rows."""

    store: ObjectStore
    sl: Slice
    decoder: BatchDecoder  # the caller's: its columns are what comes back
    work: BatchDecoder  # the decoder used: the caller's, or one reading store_timestamp too for the filter
    result: SliceResult
    stats: ReadStats
    where: Where
    offsets: pa.Array
    sizes: pa.Array
    first_row: int  # the first entry's index in the slice
    step: int  # rows per decode call
    rows: _TimeFilter

    def fetch(self, a: int, b: int) -> tuple[int, bytes]:
        lo = self.offsets[a].as_py()
        hi = self.offsets[b - 1].as_py() + self.sizes[b - 1].as_py()
        # a short object comes back short: the whole records in it are still read
        sl = self.sl
        return lo, get_range(self.store, sl.commitlog_key, lo - sl.seg_cl_start, hi - sl.seg_cl_start, self.stats)

    def batches(self, pieces: list[tuple[int, int]]) -> Iterator[pa.RecordBatch]:
        m = len(self.offsets)
        # each piece of the CommitLog range is fetched while the one before is decoded
        with ThreadPoolExecutor(1, thread_name_prefix="tiered-fetch") as pool:
            pending = pool.submit(self.fetch, *pieces[0])
            for p, (a, b) in enumerate(pieces):
                try:
                    base, data = pending.result()
                except (CorruptRecordError, StorageError) as exc:
                    _skip_slice(self.decoder, self.result, self.sl, m - a, exc)
                    return
                short = _short_piece(self.sl, self.offsets, self.sizes, a, b, base, len(data))
                if short is not None:
                    b, cut = short
                elif p + 1 < len(pieces):
                    pending = pool.submit(self.fetch, *pieces[p + 1])
                yield from self.decode(data, base, a, b)
                if short is not None:  # the object ends inside this piece: the rest is missing
                    _skip_slice(self.decoder, self.result, self.sl, m - b, cut)
                    return

    def decode(self, data: bytes, base: int, a: int, b: int) -> Iterator[pa.RecordBatch]:
        """The rows of records [a, b), fetched as ``data`` from cold CommitLog offset ``base``."""
        sl, work = self.sl, self.work
        if sl.batch:  # one row per message of each record
            msg_range = (int(sl.msg_start or 0), int(sl.msg_end or 0))
            yield from self._counted(decode_batch_records(work, data, base, self.offsets.slice(a, b - a),
                                                          self.sizes.slice(a, b - a), self.where, msg_range))
            return
        buf = pa.py_buffer(data)
        for k in range(a, b, self.step):
            count = min(self.step, b - k)
            before = work.skipped
            batch = work.decode(buf, base, self.offsets.slice(k, count), self.sizes.slice(k, count),
                                sl.q_start + self.first_row + k, self.where)
            if work.skipped != before:
                self.result.skipped += work.skipped - before
                self.result.problems.extend(work.skipped_at[-3:])
                log.warning("skipped %d corrupt archived records of %s", work.skipped - before, sl)
            yield from self._counted(batch)

    def _counted(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        batch = self.rows.apply(batch, self.decoder.columns)
        self.result.rows += batch.num_rows
        if batch.num_rows:
            yield batch


def _in_time(batch: pa.RecordBatch, lo_ts: pa.Scalar | None, hi_ts: pa.Scalar | None) -> pa.RecordBatch:
    """The rows whose store time is in [lo_ts, hi_ts] (either end optional)."""
    ts = batch.column("store_timestamp")
    mask = pc.greater_equal(ts, lo_ts) if lo_ts is not None else None
    if hi_ts is not None:
        upper = pc.less_equal(ts, hi_ts)
        mask = upper if mask is None else pc.and_(mask, upper)
    return batch.filter(mask) if mask is not None else batch


def _short_piece(sl: Slice, offsets: pa.Array, sizes: pa.Array, a: int, b: int, base: int, got: int
                 ) -> tuple[int, CorruptRecordError] | None:
    """None when the piece [a, b) came back whole; else (end of the whole
    records fetched, the error for the rest: object and offset where it ends)."""
    ends = pc.subtract(pc.add(offsets.slice(a, b - a), sizes.slice(a, b - a).cast(pa.int64())), base)
    whole = pc.sum(pc.less_equal(ends, got).cast(pa.int64())).as_py() or 0
    if whole == b - a:
        return None
    return a + whole, CorruptRecordError(sl.commitlog_key, base - sl.seg_cl_start + got,
                                         "object ends before its manifest's range")


def _skip_slice(decoder: BatchDecoder, result: SliceResult, sl: Slice, count: int, exc: Exception) -> None:
    """A slice (or its rest) cannot be read: raise, or skip and count it."""
    if not decoder.skip_corrupt:
        raise exc
    decoder.skipped += count
    result.skipped += count
    result.problems.append(str(exc))
    log.warning("skipped %d archived records of %s: %s", count, sl, exc)


def _pieces(offsets: pa.Array, first: int, m: int) -> list[tuple[int, int]]:
    """Rows [0, m) cut into runs of whole records of about PIECE_BYTES each."""
    piece = pc.divide(pc.subtract(offsets, first), PIECE_BYTES)
    ends = pc.run_end_encode(piece).run_ends.to_pylist() if m else []
    out, start = [], 0
    for end in ends:
        out.append((start, end))
        start = end
    return out


# --- answers from the manifests alone -----------------------------------------------

# Columns a slice knows without reading a byte of it: its queue's names, and
# the queue offsets [q_start, q_end) (a segment holds every offset of its
# range; gaps and expired ranges lie between segments, never inside one).
METADATA_COLUMNS = frozenset({"cluster", "broker", "topic", "queue_id", "queue_offset"})
METADATA_ROWS = 1 << 20  # rows per batch: a few MiB of queue offsets


def metadata_batches(sl: Slice, columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """The slice's rows of ``columns`` (all in ``METADATA_COLUMNS``, possibly
    none: a batch of zero columns still carries its row count, which is all
    ``count(*)`` needs) without any object-store request."""
    bad = [c for c in columns if c not in METADATA_COLUMNS]
    if bad:
        raise ValueError(f"columns {bad} need the records; only {sorted(METADATA_COLUMNS)} come from manifests")
    schema = arrow_schema(columns)
    lo, hi = (int(sl.msg_start or 0), int(sl.msg_end or 0)) if sl.batch else (sl.q_start, sl.q_end)
    if sl.batch and (sl.q_start, sl.q_end) != (sl.seg_q_start, sl.seg_q_end):
        raise ValueError(f"{sl}: a part of a BatchCQ segment has no message count without its records")
    for start in range(lo, hi, METADATA_ROWS):
        n = min(METADATA_ROWS, hi - start)
        values = {"cluster": sl.cluster, "broker": sl.broker, "topic": sl.topic, "queue_id": sl.queue_id}
        arrays = [arange(start, n) if c == "queue_offset"
                  else pa.repeat(pa.scalar(values[c], schema.field(c).type), n) for c in columns]
        yield rows_batch(arrays, schema, n)
