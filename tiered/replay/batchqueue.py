"""A BatchCQ queue served as a RocketMQ 5.x broker serves it.

The archive numbers a BatchCQ queue by its BatchConsumeQueue entries, one
record each (docs/batchcq.md); a broker speaks in message offsets. Its
``DefaultMessageStore.getMessage`` over a ``BatchConsumeQueue``:

- min and max offsets are message offsets (the first entry's base, the
  last entry's base + batch size);
- a pull at offset N starts at the entry whose messages hold N
  (``getBatchMsgIndexBuffer``: the last entry with base <= N) and returns
  whole stored records, an inner batch included in full even when N is in
  its middle;
- each record counts its batch size against ``maxMsgNums``
  (``isTheBatchFull``: the first record is always taken, a later one only
  while the count stays within it and the bytes within the cap);
- ``nextBeginOffset`` is the last record's base + batch size.

The client unwraps inner batches (``PullAPIWrapper`` with
``MessageDecoder.decodeMessages``), as it does for a broker.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.archive.manifest import Manifest
from tiered.format.innerbatch import base_offset, batch_size
from tiered.query.batchread import entry_for, message_bounds, message_offset
from tiered.query.reader import ColdReader, QueueRef, ReadStatus


@dataclass(frozen=True, kw_only=True)
class BatchPull:
    body: bytes
    messages: int  # messages the records stand for
    next_offset: int  # message offset


def bounds(m: Manifest) -> tuple[int, int]:
    """(min, max) message offsets of the archived queue."""
    return message_bounds(m)


def pull(reader: ColdReader, ref: QueueRef, m: Manifest, offset: int, max_count: int,
         max_bytes: int) -> BatchPull | None:
    """Whole records from the one holding message ``offset`` (within
    ``bounds``); None when nothing is archived from there on (a gap to the
    end)."""
    entry = entry_for(reader, ref, m, offset)
    res = reader.read(ref, entry, max_count=max_count, max_bytes=max_bytes)
    while res.status is ReadStatus.OFFSET_IN_GAP:  # never archived: serve what follows
        res = reader.read(ref, res.next_offset, max_count=max_count, max_bytes=max_bytes)
    if res.status is not ReadStatus.FOUND:
        return None
    parts: list[bytes] = []
    messages = size = 0
    next_offset = offset
    for rec in res.records:
        n = batch_size(rec)
        if parts and (messages + n > max_count or size + len(rec.raw) > max_bytes):
            break
        parts.append(bytes(rec.raw))
        messages += n
        size += len(rec.raw)
        next_offset = base_offset(rec) + n
    return BatchPull(body=b"".join(parts), messages=messages, next_offset=next_offset)


def offset_for_time(reader: ColdReader, ref: QueueRef, m: Manifest, timestamp_ms: int) -> int:
    """The lower boundary in message offsets: the first message of the first
    record stored at or after the time (the max offset when all are older)."""
    found = reader.offset_for_time(ref, timestamp_ms)
    return bounds(m)[1] if found is None else message_offset(reader, ref, m, found)
