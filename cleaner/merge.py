"""Build one segment from a run of adjacent segments, by concatenation.

The cold CommitLog of a queue is one byte space and cold ConsumeQueue
entries hold absolute offsets into it, so the merged CommitLog is the run's
CommitLog objects concatenated (the same records at the same cold offsets,
byte for byte) and the merged ConsumeQueue is their ConsumeQueue objects
concatenated. Nothing is rewritten.

Before anything is uploaded every input is checked: object length and CRC
against the manifest, every ConsumeQueue entry against the record it points
at (decoded, body CRC verified, queue id and offset matching). The key index
and bloom filter are rebuilt from the records; the store-time range is
recomputed from the records, never copied from metadata.

The merged objects get new names (``segment_keys`` carries start AND end
offsets), so a reader holding the previous manifest keeps reading the old
objects until their deferred deletion.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tiered.cleaner.plan import MergeRun
from tiered.archive import layout, segmeta
from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE, Record, crc32, decode_record, entry_problem
from tiered.format.innerbatch import batch_size, inner_records, is_inner_batch
from tiered.errors import CorruptRecordError, NotWrittenYetError
from tiered.format.keyindex import build_bloom, build_index
from tiered.format.segbuffer import SegmentBuffer
from tiered.archive.manifest import Segment, segment_keys
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergedSegment:
    run: MergeRun
    segment: Segment
    commitlog: bytes | bytearray
    consumequeue: bytes | SegmentBuffer  # entries and descriptor (v1); the whole segment object (v2)
    index: bytes | None
    history: str

    def objects(self) -> list[tuple[str, bytes | SegmentBuffer]]:
        if self.segment.layout == 2:
            return [(self.segment.keys()[0], self.consumequeue)]
        out = [(self.segment.commitlog_key, self.commitlog)]
        if self.index is not None and self.segment.index_key:
            out.append((self.segment.index_key, self.index))
        # the ConsumeQueue object last: its descriptor promises the others exist
        return out + [(self.segment.consumequeue_key, self.consumequeue)]


def build_merged(
    store: ObjectStore, prefix: str, topic: str, queue_id: int, run: MergeRun, now_ms: int,
    describe: Callable[[Segment], Descriptor],
) -> MergedSegment:
    """Read, verify and concatenate ``run``. Raises CorruptRecordError (naming
    the object and offset) when any input disagrees with its manifest entry,
    StorageError when an object cannot be read."""
    segs = run.segments
    for a, b in zip(segs, segs[1:]):
        if b.q_start != a.q_end or b.cl_start != a.cl_end:
            raise ValueError(f"{topic}/{queue_id}: segments [{a.q_start},{a.q_end}) and [{b.q_start},{b.q_end}) "
                             "are not adjacent")
    cl, cq = _read_run(store, segs)
    want_index = any(s.index_key for s in segs)
    keys, times = _check_records(segs, cl, cq, topic, queue_id, want_index)
    if times[0] != min(s.min_store_ms for s in segs) or times[1] != max(s.max_store_ms for s in segs):
        log.warning("merged records' store times differ from the manifest's; using the records'",
                    extra={"topic": topic, "queue": queue_id, "offset": segs[0].q_start})
    return _pack(run, prefix, cl, cq, keys, want_index, times, now_ms, describe)


def _read_run(store: ObjectStore, segs: Sequence[Segment]) -> tuple[bytearray, bytearray]:
    """The run's CommitLog bytes and ConsumeQueue entries, each concatenated,
    every object held to its manifest entry's length and CRC."""
    cl = bytearray()
    cq = bytearray()
    for seg in segs:
        parts = segmeta.read_parts(store, seg, with_index=False)  # either layout
        data = parts.commitlog
        if len(data) != seg.nbytes or crc32(data) != seg.commitlog_crc:
            raise CorruptRecordError(seg.commitlog_key, 0, "length or CRC differs from the manifest")
        cl += data
        entries = parts.entries[:seg.messages * CQ_ENTRY_SIZE]  # without the descriptor
        if len(entries) != seg.messages * CQ_ENTRY_SIZE or crc32(entries) != seg.consumequeue_crc:
            raise CorruptRecordError(seg.consumequeue_key, 0, "length or CRC differs from the manifest")
        cq += entries
    return cl, cq


def _where(segs: Sequence[Segment], cl_offset: int) -> tuple[str, int]:
    """The input object and offset in it that hold a cold CommitLog offset."""
    for seg in segs:
        if seg.cl_start <= cl_offset < seg.cl_end:
            return seg.commitlog_key, cl_offset - seg.cl_start
    return segs[-1].commitlog_key, cl_offset - segs[-1].cl_start


def _check_records(segs: Sequence[Segment], cl: bytearray, cq: bytearray, topic: str, queue_id: int,
                   want_index: bool) -> tuple[list[tuple[int, list[str]]], tuple[int, int, int, int]]:
    """Every entry of the run against the record it points at, the records
    tiling the run's CommitLog bytes exactly: the keys to index (when
    ``want_index``) and the records' (min, max) store and born times."""
    first, last = segs[0], segs[-1]
    view = memoryview(cl)
    topic_raw = topic.encode("utf-8")
    keys: list[tuple[int, list[str]]] = []
    times = _Times()
    expect = first.cl_start
    next_msg = first.msg_start  # a BatchCQ run: the queue offset the next record starts at (docs/batchcq.md)
    for i in range(last.q_end - first.q_start):
        q = first.q_start + i
        off, size, _tags = CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE)
        if off != expect:
            seg = next(s for s in segs if s.q_start <= q < s.q_end)
            raise CorruptRecordError(seg.consumequeue_key, (q - seg.q_start) * CQ_ENTRY_SIZE,
                                     f"entry {q} points at {off}, expected {expect}")
        try:
            rec = decode_record(view, off - first.cl_start, first.commitlog_key)
        except (CorruptRecordError, NotWrittenYetError) as exc:
            key, at = _where(segs, off)
            raise CorruptRecordError(key, at, f"record {q}: {getattr(exc, 'reason', exc)}") from None
        if rec.size != size or entry_problem(rec, topic=topic_raw, queue_id=queue_id,
                                             queue_offset=q if next_msg is None else next_msg):
            key, at = _where(segs, off)
            raise CorruptRecordError(key, at, f"record does not match its ConsumeQueue entry {q}")
        if next_msg is not None:
            next_msg += batch_size(rec)
        expect += size
        times.add(rec.store_timestamp, rec.born_timestamp)
        if want_index and (ks := _record_keys(rec, batch=next_msg is not None)):
            keys.append((q, ks))
    if next_msg != last.msg_end:
        key, at = _where(segs, expect)
        raise CorruptRecordError(key, at, f"records end at queue offset {next_msg}, the run at {last.msg_end}")
    if expect != last.cl_end:
        key, at = _where(segs, expect)
        raise CorruptRecordError(key, at, f"records end at {expect}, the run at {last.cl_end}")
    return keys, times.bounds()


class _Times:
    """The lowest and highest store and born times of the records seen (all 0 before the first)."""

    def __init__(self) -> None:
        self.seen = False
        self.min_store = self.max_store = self.min_born = self.max_born = 0

    def add(self, st: int, bt: int) -> None:
        if not self.seen:
            self.seen = True
            self.min_store = self.max_store = st
            self.min_born = self.max_born = bt
            return
        self.min_store, self.max_store = min(self.min_store, st), max(self.max_store, st)
        self.min_born, self.max_born = min(self.min_born, bt), max(self.max_born, bt)

    def bounds(self) -> tuple[int, int, int, int]:
        return self.min_store, self.max_store, self.min_born, self.max_born


def _record_keys(rec: Record, *, batch: bool) -> list[str]:
    """The keys a record is found by: its KEYS, its UNIQ_KEY and, in a BatchCQ
    queue, those of the messages an inner batch holds."""
    ks = rec.keys
    uniq = rec.unique_key
    if uniq:
        ks.append(uniq)
    if batch and is_inner_batch(rec.sys_flag):
        for msg in inner_records(rec):
            ks += msg.keys + ([msg.unique_key] if msg.unique_key else [])
    return ks


def _pack(run: MergeRun, prefix: str, cl: bytearray, cq: bytearray, keys: list[tuple[int, list[str]]],
          want_index: bool, times: tuple[int, int, int, int], now_ms: int,
          describe: Callable[[Segment], Descriptor]) -> MergedSegment:
    """The merged segment's objects and manifest entry, in the layout of the run's first segment."""
    first, last = run.segments[0], run.segments[-1]
    min_store, max_store, min_born, max_born = times
    index = build_index(first.q_start, keys) if keys or (want_index and first.layout == 2) else None
    bloom: str | None = build_bloom(k for _, ks in keys for k in ks)  # every record was read: fully indexed
    # v2 in, v2 out, compressed as the run's first segment was; no bloom in the manifest
    compression = "zstd" if layout.compressed(layout.object_of(first.commitlog_key)) else "none"
    if first.layout == 2:
        obj = layout.segment_object_key(prefix, first.q_start, last.q_end, first.cl_start, last.cl_end,
                                        compression=compression)
        keys3 = layout.section_keys(obj, len(cl), len(cq), len(index) if index is not None else None)
        bloom = None
    else:
        keys3 = segment_keys(prefix, first.cl_start, last.cl_end, first.q_start, last.q_end)
    seg = Segment(
        q_start=first.q_start, q_end=last.q_end, cl_start=first.cl_start, cl_end=last.cl_end,
        min_store_ms=min_store, max_store_ms=max_store, min_born_ms=min_born, max_born_ms=max_born,
        commitlog_key=keys3[0], consumequeue_key=keys3[1], index_key=keys3[2] if index is not None else None,
        commitlog_crc=crc32(cl), consumequeue_crc=crc32(cq), created_ms=now_ms, bloom=bloom,
        msg_start=first.msg_start, msg_end=last.msg_end,
    )
    desc = describe(seg)
    if seg.layout == 2:
        packed = segmeta.pack_v2(cl, bytes(cq), index, desc, compression)
        return MergedSegment(run, replace(seg, stored_bytes=len(packed)), cl, packed, index, desc.history)
    return MergedSegment(run, seg, cl, segmeta.attach(cq, desc), index, desc.history)
