"""Scans (Spark, export) over a BatchCQ queue's segments: one row per message.

A batch segment's records are inner batches (``tiered.format.innerbatch``):
each fetched record is checked as ``ColdReader`` checks it, unwrapped into
its messages as RocketMQ hands them to a consumer, and the messages go
through the same column decoder as any record, at their own queue offsets.
"""

from __future__ import annotations

import pyarrow as pa

from tiered.errors import CorruptRecordError
from tiered.format.codec import decode_record
from tiered.format.innerbatch import inner_records
from tiered.query.columnar import BatchDecoder, Where


def decode_batch_records(decoder: BatchDecoder, data: bytes, base: int, offsets: pa.Array, sizes: pa.Array,
                         where: Where, msg_range: tuple[int, int]) -> pa.RecordBatch:
    """The messages of the records at cold CommitLog ``offsets`` (``sizes``),
    laid end to end in ``data`` from cold offset ``base``. ``msg_range``:
    the segment's message offsets, which every record's must lie in."""
    view = memoryview(data)
    made: list[bytes] = []
    qoffs: list[int] = []
    positions: list[int] = []
    topic = decoder.queue.topic.encode("utf-8")
    for off, size in zip(offsets.to_pylist(), sizes.to_pylist()):
        position = off - where.cl_object_start
        try:
            rec = decode_record(view, off - base, where.cl_key, verify_crc=decoder.verify_crc)
            if rec.size != size or rec.queue_id != decoder.queue.queue_id or rec.topic_raw != topic \
                    or not msg_range[0] <= rec.queue_offset < msg_range[1]:
                raise CorruptRecordError(where.cl_key, position, "record does not match its cold ConsumeQueue entry")
            messages = inner_records(rec)
        except CorruptRecordError as exc:
            if not decoder.skip_corrupt:
                raise CorruptRecordError(where.cl_key, position, exc.reason) from None
            decoder.skipped += 1
            if len(decoder.skipped_at) < 10:
                decoder.skipped_at.append(f"{where.cl_key} @ {position}: {exc.reason}")
            continue
        for msg in messages:
            made.append(bytes(msg.raw))
            qoffs.append(msg.queue_offset)
            positions.append(position)
    return decoder.decode_made(made, qoffs, positions, where)
