"""Inner-batch records: one CommitLog record holding several messages.

A producer's batch sent to a BatchCQ topic is stored as ONE record with
sys flag INNER_BATCH (0x80, usually with NEED_UNWRAP 0x40), properties
``INNER_NUM`` (messages inside) and ``INNER_BASE`` (queue offset of the
first), and a body of inner messages one after another, each as RocketMQ's
``MessageDecoder.encodeMessage`` writes it (big-endian)::

    offset  size  field
         0     4  total size of this inner message
         4     4  magic (0)
         8     4  body CRC (0)
        12     4  flag
        16   4+n  body length + body
         .   2+n  properties length (signed 16-bit) + properties

``MessageDecoder.decodeMessage(MessageExt, List)`` unwraps it: inner message
i gets queue offset base + i, its own flag, body and properties, and the
outer record's topic, queue, hosts, timestamps, sys flag and CommitLog offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tiered.errors import CorruptRecordError
from tiered.format.codec import Message, Record, decode_properties, decode_record, encode_record
from tiered.format.compression import COMPRESSED_FLAG, COMPRESSION_TYPE_MASK, decompress, is_compressed

INNER_BATCH_FLAG = 0x80
NEED_UNWRAP_FLAG = 0x40
PROPERTY_INNER_NUM = "INNER_NUM"
PROPERTY_INNER_BASE = "INNER_BASE"

_HEAD = struct.Struct(">iiiii")  # total size, magic, body CRC, flag, body length
_PROPS_LEN = struct.Struct(">h")


@dataclass(frozen=True, slots=True, kw_only=True)
class InnerMessage:
    """One message unwrapped from an inner-batch record."""

    index: int  # position inside the batch
    queue_offset: int  # the outer record's queue offset + index
    flag: int
    body: bytes
    properties: dict[str, str]

    @property
    def msg_id(self) -> str | None:
        """The client's id, as RocketMQ's MessageClientExt gives it: UNIQ_KEY."""
        return self.properties.get("UNIQ_KEY")


def is_inner_batch(sys_flag: int) -> bool:
    return bool(sys_flag & INNER_BATCH_FLAG)


def batch_size(rec: Record) -> int:
    """Messages this record stands for in a BatchCQ queue: ``INNER_NUM`` of an
    inner batch (as ``CommitLog.checkMessageAndReturnSize`` takes it, with
    ``INNER_BASE`` present), 1 for a single message."""
    return _dispatched(rec, PROPERTY_INNER_NUM, 1)


def base_offset(rec: Record) -> int:
    """The base offset a BatchConsumeQueue entry of this record holds:
    ``INNER_BASE`` with ``INNER_NUM`` present, else the record's queue offset
    (``DispatchRequest`` as ``CommitLog.checkMessageAndReturnSize`` fills it)."""
    return _dispatched(rec, PROPERTY_INNER_BASE, rec.queue_offset)


def _dispatched(rec: Record, name: str, default: int) -> int:
    """Property ``name`` as a number where the broker's dispatch reads it (both
    INNER_NUM and INNER_BASE set), else ``default``."""
    props = rec.properties
    if PROPERTY_INNER_NUM not in props or PROPERTY_INNER_BASE not in props:
        return default
    try:
        return int(props[name])
    except ValueError:
        raise CorruptRecordError(rec.source, rec.position, f"{name} {props[name][:20]!r} is not a number") from None


def decode_inner(body: bytes | memoryview, base_offset: int, source: str = "<buffer>",
                 position: int = 0) -> list[InnerMessage]:
    """The inner messages of an (uncompressed) inner-batch body. ``source``
    and ``position`` (where the body starts in it) name bad data."""
    buf = memoryview(body)
    out: list[InnerMessage] = []
    at = 0
    while at < len(buf):
        where = position + at
        if at + _HEAD.size > len(buf):
            raise CorruptRecordError(source, where, "inner message header cut off by the end of the body")
        total, _magic, _crc, flag, body_len = _HEAD.unpack_from(buf, at)
        props_at = at + _HEAD.size + body_len
        if body_len < 0 or props_at + 2 > len(buf):
            raise CorruptRecordError(source, where, f"inner message body length {body_len} runs past the batch")
        props_len = _PROPS_LEN.unpack_from(buf, props_at)[0]
        end = props_at + 2 + props_len
        if props_len < 0 or end > len(buf) or total != end - at:
            raise CorruptRecordError(source, where, f"inner message size {total} != its fields' {end - at}")
        props = decode_properties(buf[props_at + 2:end], source, position + props_at + 2)
        out.append(InnerMessage(
            index=len(out), queue_offset=base_offset + len(out), flag=flag,
            body=bytes(buf[at + _HEAD.size:props_at]),
            # string2messageProperties keeps no empty name or value
            properties={k: v for k, v in props.items() if k and v},
        ))
        at = end
    return out


def unwrap(rec: Record) -> list[InnerMessage]:
    """The messages of an inner-batch record (decompressed first when its
    sys flag says so); a single message's record gives one, itself."""
    if not is_inner_batch(rec.sys_flag):
        return [InnerMessage(index=0, queue_offset=rec.queue_offset, flag=rec.flag, body=rec.body_bytes(),
                             properties=rec.properties)]
    body: bytes | memoryview = rec.body
    position = rec.position + rec.body_start
    if is_compressed(rec.sys_flag):
        body = decompress(bytes(body), rec.sys_flag)
    inner = decode_inner(body, rec.queue_offset, rec.source, position)
    expected = batch_size(rec)
    if len(inner) != expected:
        raise CorruptRecordError(rec.source, rec.position,
                                 f"inner batch holds {len(inner)} messages, INNER_NUM says {expected}")
    return inner


def inner_records(rec: Record) -> list[Record]:
    """Each message of an inner-batch record as a record of its own, the way
    ``MessageDecoder.decodeMessage`` hands it to a consumer: the outer
    record's header (topic, queue, hosts, times, sys flag, CommitLog offset)
    with the message's queue offset, flag, body and properties. Made, not
    archived: never compare their bytes. A single message gives itself."""
    if not is_inner_batch(rec.sys_flag):
        return [rec]
    sys_flag = rec.sys_flag
    if is_compressed(sys_flag):  # the inner bodies come out of the decompressed batch
        sys_flag &= ~(COMPRESSED_FLAG | COMPRESSION_TYPE_MASK)
    out = []
    for msg in unwrap(rec):
        raw = encode_record(Message(
            topic=rec.topic, queue_id=rec.queue_id, body=msg.body, properties=msg.properties, flag=msg.flag,
            sys_flag=sys_flag, born_timestamp=rec.born_timestamp, born_host=rec.born_host,
            store_timestamp=rec.store_timestamp, store_host=rec.store_host, reconsume_times=rec.reconsume_times,
            prepared_transaction_offset=rec.prepared_transaction_offset, queue_offset=msg.queue_offset,
            physical_offset=rec.physical_offset, version=rec.version))
        made = decode_record(memoryview(raw), 0, rec.source, verify_crc=False)
        made.position = rec.position
        out.append(made)
    return out

