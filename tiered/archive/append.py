"""The write path of the archive: a built segment becomes its objects, and
the manifest change that commits it (or a gap) is checked against the base
it was built on. ``ColdTier.append`` and ``ColdTier.append_gap`` are the
entry points; this module holds what they do between the build and the
conditional commit.

Objects are written before the manifest names them, under names fixed by
their offset ranges: a repeated attempt rewrites the same bytes under the
same keys, and a crash in between leaves an orphan the cleaner collects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from tiered.archive import chunks, layout, segmeta
from tiered.archive.chunks import Carried
from tiered.archive.manifest import ChunkRef, Gap, Manifest, Segment
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectStore
from tiered.errors import ConflictError
from tiered.format.codec import crc32
from tiered.format.segbuffer import SegmentBuffer

Change = Callable[[Manifest | None], Manifest]


class SegmentParts(Protocol):
    """What a segment builder hands the archive (the dispatcher's
    ``BuiltSegment``): the segment and its bytes, not yet packed."""

    @property
    def segment(self) -> Segment: ...

    @property
    def commitlog(self) -> bytes | SegmentBuffer: ...  # the records; a SegmentBuffer is packed in place (v2)

    @property
    def consumequeue(self) -> bytes: ...

    @property
    def index(self) -> bytes | None: ...

    @property
    def compression(self) -> str: ...  # of the v2 object


def carry(base: Manifest | None, seg: Segment, compression: str, topic: str, queue_id: int,
          load: Callable[[ChunkRef], chunks.Chunk]) -> Carried:
    """The chunks that committing ``seg`` (a layout v2 segment) on ``base``
    seals, placed in ``seg``'s object: its upload carries them and the
    commit references them there (``commit(carried=...)``), so sealing
    costs no request. Deterministic: the same base and segment give the
    same bytes, so a retried upload rewrites the object as it was."""
    if base is None or seg.layout != 2:
        return Carried()
    if len(base.segments) - sum(r.live for r in base.chunks) < chunks.CHUNK_SEGMENTS:
        # the inline tail cannot seal a chunk yet (the newest segment stays
        # inline): no plan, which costs as much as the history, for 15
        # commits in 16; the commit's own plan writes anything else
        return Carried()
    obj = seg.keys()[0]
    at = segmeta.carried_at(seg, compression)
    offset = at

    def place(name: str, body: bytes) -> str:
        nonlocal offset
        where = layout.section_key(obj, offset, len(body))
        offset += len(body)
        return where

    plan = chunks.plan(base.chunks, base.segments, base.segments + (seg,), topic, queue_id, load, place=place)
    if not plan.writes:
        return Carried()
    return Carried(body=b"".join(body for _, body in plan.writes), at=at, places=dict(plan.placed))


def upload(store: ObjectStore, parts: SegmentParts, desc: Descriptor, carried: Carried | None) -> Segment:
    """Write the objects of ``parts`` for its layout; return its segment as
    the manifest records it. v2: one PUT of records, entries, index,
    ``carried`` chunks and descriptor, the records' buffer consumed (grown
    into the object when it is a SegmentBuffer). v1: the ConsumeQueue object
    last, as its descriptor promises the others exist."""
    seg = parts.segment
    if seg.layout == 2:
        packed = segmeta.pack_v2(parts.commitlog, parts.consumequeue, parts.index, desc, parts.compression,
                                 consume=True, carried=carried.body if carried is not None else b"")
        store.put(seg.keys()[0], packed, crc=object_crc(packed, seg, parts.compression))
        return replace(seg, stored_bytes=len(packed))  # the manifest knows it, the descriptor cannot
    store.put(seg.commitlog_key, parts.commitlog, crc=seg.commitlog_crc)  # the object is the segment's bytes
    if parts.index is not None and seg.index_key:
        store.put(seg.index_key, parts.index)
    store.put(seg.consumequeue_key, segmeta.attach(parts.consumequeue, desc))
    return seg


def object_crc(packed: bytes | SegmentBuffer, seg: Segment, compression: str) -> int | None:
    """The CRC-32 of a v2 object, for its upload's checksum: an uncompressed
    one is the segment's bytes and a tail behind them, so it is the
    segment's CRC (kept as its records were copied in) continued over the
    tail, not all of it read again. None for a compressed one."""
    if compression != "none":
        return None
    with memoryview(packed) as view:
        return crc32(view[seg.nbytes:], seg.commitlog_crc)


def segment_change(topic: str, queue_id: int, base: Manifest | None, seg: Segment, history: str) -> Change:
    """The change committing ``seg`` on ``base``: ConflictError when the
    manifest read at commit time no longer ends where ``base`` did (another
    writer, or a stale cache), itself when ``seg`` is already its last
    segment (a commit whose response was lost)."""
    base_next = base.next_offset if base is not None else seg.q_start

    def change(current: Manifest | None) -> Manifest:
        if current is not None and current.segments and current.segments[-1] == seg:
            return current  # our commit landed; its response was lost
        if current is None and base is not None:
            raise ConflictError(f"{topic}/{queue_id}: the manifest disappeared from the cold tier")
        current = current or Manifest.empty(topic, queue_id, seg.q_start, history)
        if current.next_offset != base_next or current.cl_next != seg.cl_start:
            raise ConflictError(f"{topic}/{queue_id}: archive moved to {current.next_offset} meanwhile")
        if current.history not in ("", history):
            raise ConflictError(f"{topic}/{queue_id}: the manifest's history changed meanwhile")
        return replace(current.with_segment(seg), history=history)
    return change


def gap_change(topic: str, queue_id: int, base: Manifest | None, gap: Gap, history: str) -> Change:
    """The change recording ``gap`` on ``base``; ``history`` names a queue's
    first manifest, one that starts with the gap."""
    def change(current: Manifest | None) -> Manifest:
        if current is not None and current.gaps and current.gaps[-1] == gap and current.next_offset == gap.q_end:
            return current  # our commit landed; its response was lost
        if current is None and base is not None:
            raise ConflictError(f"{topic}/{queue_id}: the manifest disappeared from the cold tier")
        current = current or Manifest.empty(topic, queue_id, gap.q_start, history)
        if current.next_offset != gap.q_start:
            raise ConflictError(f"{topic}/{queue_id}: archive moved to {current.next_offset} meanwhile")
        return current.with_gap(gap)
    return change
