"""Write BatchCQ topics into a store, as RocketMQ 5.3.3's broker does.

A producer's batch sent to a BatchCQ topic is one CommitLog record (sys
flag INNER_BATCH | NEED_UNWRAP, properties ``INNER_NUM`` and ``INNER_BASE``,
a body of ``MessageDecoder.encodeMessage`` inner messages; see
``tiered.format.innerbatch``); a single message is an ordinary record. Each
gets one BatchConsumeQueue entry (``tiered.store.batchcq``) and advances the
queue's offset by its message count (``BatchConsumeQueue.assignQueueOffset``
and ``increaseQueueOffset``). Tests build the edges the one real store does
not cover with it: several files per queue, a queue starting above 0.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tiered.format.codec import Host, Message, encode_properties, encode_record, tags_code
from tiered.format.innerbatch import INNER_BATCH_FLAG, NEED_UNWRAP_FLAG, PROPERTY_INNER_BASE, PROPERTY_INNER_NUM
from tiered.store.batchcq import BATCH_DIR, BCQ_ENTRY_SIZE, BatchEntry
from tiered.store.storewriter import Appended, StoreWriter

_INNER_HEAD = struct.Struct(">iiiii")  # total size, magic 0, body CRC 0, flag, body length
_I16 = struct.Struct(">h")


@dataclass(frozen=True, slots=True, kw_only=True)
class InnerDraft:
    """One message of a batch to write."""

    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0


def encode_inner(messages: Sequence[InnerDraft]) -> bytes:
    """``MessageDecoder.encodeMessages``: the body of an inner-batch record."""
    parts = []
    for m in messages:
        props = encode_properties(m.properties)
        size = _INNER_HEAD.size + len(m.body) + 2 + len(props)
        parts.append(_INNER_HEAD.pack(size, 0, 0, m.flag, len(m.body)) + m.body + _I16.pack(len(props)) + props)
    return b"".join(parts)


class BatchWriter:
    """BatchCQ queues of the store ``writer`` writes (its CommitLog, its topics.json)."""

    def __init__(self, writer: StoreWriter, *, bcq_entries_per_file: int = 300_000) -> None:
        self.writer = writer
        self.file_bytes = bcq_entries_per_file * BCQ_ENTRY_SIZE
        self._next: dict[tuple[str, int], tuple[int, int]] = {}  # (next entry, next queue offset)

    def start_at(self, topic: str, queue_id: int, *, entry: int, offset: int) -> None:
        """Begin an empty queue at BatchConsumeQueue entry ``entry`` (its file
        named by the entry's byte: a queue whose earlier files the broker
        deleted) with queue offset ``offset``."""
        self._next[(topic, queue_id)] = (entry, offset)

    def next_offset(self, topic: str, queue_id: int) -> int:
        return self._next.get((topic, queue_id), (0, 0))[1]

    def put_batch(self, topic: str, queue_id: int, messages: Sequence[InnerDraft], *,
                  properties: Mapping[str, str] | None = None, store_timestamp: int = 0,
                  born_timestamp: int | None = None, born_host: Host | None = None) -> Appended:
        """One inner-batch record of ``messages`` (``properties``: the outer
        record's besides INNER_NUM and INNER_BASE, e.g. UNIQ_KEY, WAIT)."""
        base = self.next_offset(topic, queue_id)
        props = dict(properties or {})
        props[PROPERTY_INNER_NUM] = str(len(messages))
        props[PROPERTY_INNER_BASE] = str(base)
        return self._append(topic, queue_id, encode_inner(messages), props, INNER_BATCH_FLAG | NEED_UNWRAP_FLAG,
                            len(messages), store_timestamp, born_timestamp, born_host, flag=0)

    def put_single(self, topic: str, queue_id: int, body: bytes, *, properties: Mapping[str, str] | None = None,
                   store_timestamp: int = 0, flag: int = 0) -> Appended:
        """An ordinary message in a BatchCQ queue: one entry, batch size 1."""
        return self._append(topic, queue_id, body, dict(properties or {}), 0, 1, store_timestamp, None, None,
                            flag=flag)

    def _append(self, topic: str, queue_id: int, body: bytes, props: dict[str, str], sys_flag: int, count: int,
                store_ms: int, born_ms: int | None, born_host: Host | None, *, flag: int) -> Appended:
        w = self.writer
        entry, base = self._next.get((topic, queue_id), (0, 0))
        data = bytearray(encode_record(Message(
            topic=topic, queue_id=queue_id, body=body, properties=props, flag=flag, sys_flag=sys_flag,
            born_timestamp=born_ms if born_ms is not None else store_ms,
            born_host=born_host or Host("127.0.0.1", 50000), store_timestamp=store_ms, store_host=w.store_host)))
        physical = w.append_record(data, base)
        w.write_pending()  # the record before its entry, as the broker's reput orders them
        tags = tags_code(props.get("TAGS"))
        self._write_entry(topic, queue_id, entry, BatchEntry(
            commitlog_offset=physical, size=len(data), tags_code=tags, store_timestamp=store_ms, base_offset=base,
            batch_size=count))
        self._next[(topic, queue_id)] = (entry + 1, base + count)
        w.register_topic(topic, queue_id)
        w.set_topic_attribute(topic, "queue.type", "BatchCQ")
        return Appended(topic, queue_id, base, physical, len(data))

    def _write_entry(self, topic: str, queue_id: int, entry: int, unit: BatchEntry) -> None:
        byte = entry * BCQ_ENTRY_SIZE
        start = byte - byte % self.file_bytes
        path = self.writer.root / BATCH_DIR / topic / str(queue_id) / f"{start:020d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < self.file_bytes:
                os.ftruncate(fd, self.file_bytes)  # preallocated, as MappedFileQueue requires
            os.pwrite(fd, unit.pack(), byte - start)
        finally:
            os.close(fd)
