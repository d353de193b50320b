"""The segment descriptor: what a manifest needs, carried by the segment itself.

Every ConsumeQueue object written since format 1.1 ends with a trailer, so
the archive can be recovered from the bucket alone when a manifest is lost
(deleted by hand, a lifecycle rule, a partial restore)::

    entries      n x 20 bytes, the cold ConsumeQueue (unchanged, read by offset)
    descriptor   UTF-8 JSON: {"descriptor": 1, "cluster", "broker", "topic",
                 "queue_id", "history", "segment": {every Segment field},
                 "gaps_before": [Gap, ...]}
    footer       16 bytes, big-endian: descriptor length (u32),
                 zlib CRC32 of the descriptor (u32), magic b"TRDSEG01"

Readers of entries never look past ``messages * 20`` bytes, so objects with
and without a trailer read the same. ``history`` is the id of the manifest
history the segment was committed into: a rebuild adopts only segments of
one history, and the cleaner deletes an unreferenced object only when it
can prove the object belongs to the manifest's own history.
``gaps_before`` are the recorded gaps between the previous segment and this
one, so a rebuilt manifest tells a recorded gap from a lost segment.

Layout v2 (tiered/archive/layout.py) carries the same descriptor and footer at the
end of its one segment object, after the records, the entries and the key
index; its ``descriptor`` number is 2 (the segment's keys are sections of
that object) and it starts where the index section ends. ``pack_v2`` builds
that object.

A v2 object that carries manifest chunks (tiered/archive/chunks.py) has
``descriptor`` number 3 and ``"chunks": {"at", "length"}``, their place in
the object as stored: uncompressed, a section between the key index and the
descriptor (which then starts at ``at + length``); compressed, a zstd
skippable frame in front of the compressed payload (``at`` = 8), the
payload itself as in number 2. A tiered older than descriptor 3 refuses
such an object loudly (a newer descriptor), as its 4.0 head.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from tiered.format.codec import crc32
from tiered.format.segbuffer import SegmentBuffer
from tiered.archive import layout
from tiered.errors import CorruptRecordError
from tiered.archive.manifest import Gap, Segment, segment_doc

# 1: v1 trailer on the ConsumeQueue object; 2: layout v2; 3: layout v2 carrying manifest chunks
DESCRIPTOR_VERSION = 3
DESCRIPTOR_CARRIER = 3
MAGIC = b"TRDSEG01"
# descriptor length (u32), CRC32 of the descriptor (u32), magic (8 bytes)
FOOTER = struct.Struct(">II8s")
MAX_DESCRIPTOR = 16 << 20

_SEGMENT_FIELDS = tuple(f.name for f in fields(Segment))
_GAP_FIELDS = tuple(f.name for f in fields(Gap))


@dataclass(frozen=True, slots=True, kw_only=True)
class Descriptor:
    cluster: str
    broker: str
    topic: str
    queue_id: int
    history: str
    segment: Segment
    gaps_before: tuple[Gap, ...] = ()
    # (offset in the object as stored, length) of the manifest chunks it carries
    chunks: tuple[int, int] | None = None

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "descriptor": DESCRIPTOR_CARRIER if self.chunks else self.segment.layout, "cluster": self.cluster,
            "broker": self.broker, "topic": self.topic, "queue_id": self.queue_id, "history": self.history,
            "segment": segment_doc(self.segment),
            "gaps_before": [asdict(g) for g in self.gaps_before],
        }
        if self.chunks:
            doc["chunks"] = {"at": self.chunks[0], "length": self.chunks[1]}
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")


def attach(entries: bytes | bytearray, desc: Descriptor) -> bytes:
    """The ConsumeQueue object: entries, then the descriptor and its footer."""
    body = desc.to_bytes()
    return bytes(entries) + body + FOOTER.pack(len(body), crc32(body), MAGIC)


def carried_at(seg: Segment, compression: str = "none") -> int:
    """Where the manifest chunks a v2 object carries start in it, as stored."""
    return layout.CARRIED_AT_ZSTD if compression == "zstd" else descriptor_at(seg)


def pack_v2(records: bytes | SegmentBuffer, entries: bytes, index: bytes | None, desc: Descriptor,
            compression: str = "none", *, consume: bool = False, carried: bytes = b"") -> bytes | SegmentBuffer:
    """The one object of a layout v2 segment (tiered/archive/layout.py), with
    the manifest chunks it ``carried`` where ``desc.chunks`` says.

    ``consume``: ``records`` (a SegmentBuffer) is the caller's to give up;
    the rest of the object is appended to it in place and it is returned,
    rather than all of it copied into a new buffer (a segment's worth of
    memory and of copying)."""
    seg = desc.segment
    if len(records) != seg.nbytes or len(entries) != seg.messages * 20:
        raise ValueError("records or entries do not match the segment")
    if (desc.chunks or (0, 0))[1] != len(carried) or (carried and desc.chunks != (carried_at(seg, compression),
                                                                                  len(carried))):
        raise ValueError("the descriptor does not place the carried chunks where they go")
    body = desc.to_bytes()
    footer = FOOTER.pack(len(body), crc32(body), MAGIC)
    if compression == "zstd":
        return layout.compress(b"".join((records, entries, index or b"", body, footer)), carried=carried)
    tail = (entries, index or b"", carried, body, footer)
    if consume and isinstance(records, SegmentBuffer):
        records.append(*tail)
        return records
    return b"".join((records, *tail))


def descriptor_at(seg: Segment) -> int:
    """Where a segment's descriptor starts in the object that carries it."""
    if seg.layout == 1:
        return seg.messages * 20
    _, at, length = layout.split(seg.index_key or seg.consumequeue_key)
    return at + (length or 0)


def parse(data: bytes | bytearray | memoryview, source: str) -> Descriptor | None:
    """The descriptor of a whole ConsumeQueue object; None for an object
    written before trailers existed (no footer magic). A footer that is
    there but does not check out is corruption, named with its offset."""
    view = memoryview(data)
    if len(view) < FOOTER.size:
        return None
    length, crc, magic = FOOTER.unpack_from(view, len(view) - FOOTER.size)
    if magic != MAGIC:
        return None
    start = len(view) - FOOTER.size - length
    if length > MAX_DESCRIPTOR or start < 0:
        raise CorruptRecordError(source, len(view) - FOOTER.size, f"descriptor length {length} out of bounds")
    body = bytes(view[start:start + length])
    if crc32(body) != crc:
        raise CorruptRecordError(source, start, "descriptor CRC mismatch")
    try:
        doc = json.loads(body)
        if int(doc["descriptor"]) > DESCRIPTOR_VERSION:
            raise CorruptRecordError(source, start, f"descriptor version {doc['descriptor']} is newer than this tiered")
        seg: dict[str, Any] = doc["segment"]
        desc = Descriptor(
            cluster=str(doc["cluster"]), broker=str(doc["broker"]), topic=str(doc["topic"]),
            queue_id=int(doc["queue_id"]), history=str(doc["history"]),
            segment=Segment(**{k: v for k, v in seg.items() if k in _SEGMENT_FIELDS}),
            gaps_before=tuple(Gap(**{k: v for k, v in g.items() if k in _GAP_FIELDS})
                              for g in doc.get("gaps_before", [])),
        )
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(source, start, f"malformed descriptor: {type(exc).__name__}") from None
    number = int(doc["descriptor"])
    if desc.segment.layout != (2 if number == DESCRIPTOR_CARRIER else number):
        raise CorruptRecordError(source, start, f"descriptor {number} names a layout "
                                                f"{desc.segment.layout} segment")
    expect = descriptor_at(desc.segment)
    if number == DESCRIPTOR_CARRIER:
        try:
            at, length = int(doc["chunks"]["at"]), int(doc["chunks"]["length"])
        except (KeyError, TypeError, ValueError):
            raise CorruptRecordError(source, start, "carrier descriptor without a valid chunks place") from None
        if length <= 0 or at not in (expect, layout.CARRIED_AT_ZSTD):
            raise CorruptRecordError(source, start, f"carried chunks placed at {at}+{length}, neither behind the "
                                                    f"key index ({expect}) nor in a leading skippable frame")
        desc = replace(desc, chunks=(at, length))
        if at == expect:  # in the payload, between the key index and the descriptor
            expect += length
    if start != expect:
        raise CorruptRecordError(source, start, f"descriptor says {desc.segment.messages} entries ending at "
                                                f"{expect}, the object holds {start} bytes before it")
    return desc


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentParts:
    """A whole segment as stored, read for checking (verify, merge)."""

    carrier: str  # the object holding the descriptor: the ConsumeQueue object (v1), the segment object (v2)
    commitlog: bytes
    entries: bytes  # the cold ConsumeQueue entries, without the descriptor
    index: bytes | None
    descriptor: Descriptor | None  # None: a v1 object written before descriptors


def read_parts(store: Any, seg: Segment, *, with_index: bool = True) -> SegmentParts:
    """Every part of ``seg`` in either layout: three GETs in v1, one in v2.
    Raises StorageError, or CorruptRecordError for a bad descriptor."""
    carrier = layout.object_of(seg.consumequeue_key)
    if seg.layout == 2:
        payload = layout.read_payload(store, carrier)

        def part(key: str) -> bytes:
            _, at, length = layout.split(key)
            return payload[at:at + (length or 0)]

        return SegmentParts(carrier=carrier, commitlog=part(seg.commitlog_key), entries=part(seg.consumequeue_key),
                            index=part(seg.index_key) if seg.index_key and with_index else None,
                            descriptor=parse(payload, carrier))
    cl = store.get(seg.commitlog_key)
    cq = store.get(seg.consumequeue_key)
    desc = parse(cq, carrier)
    index = store.get(seg.index_key) if seg.index_key and with_index else None
    return SegmentParts(carrier=carrier, commitlog=cl, entries=cq[:seg.messages * 20] if desc is not None else cq,
                        index=index, descriptor=desc)
