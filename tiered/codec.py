"""RocketMQ CommitLog records and ConsumeQueue entries, decoded and encoded.

All integers are big-endian. A CommitLog record, fields in order::

    offset  size  field
         0     4  total size (whole record)
         4     4  magic: v1 0xDAA320A7, v2 0xDAA320AB
         8     4  body CRC: zlib.crc32(body) & 0x7FFFFFFF
        12     4  queue id
        16     4  flag
        20     8  queue offset (index in its ConsumeQueue)
        28     8  physical offset (byte offset in the broker CommitLog)
        36     4  sys flag
        40     8  born timestamp, ms
        48  8/20  born host: IPv4 4 + port 4, IPv6 16 + port 4 (sys flag 0x10)
         .     8  store timestamp, ms          <- moves with the born host size
         .  8/20  store host (sys flag 0x20)
         .     4  reconsume times
         .     8  prepared transaction offset
         .   4+n  body length + body
         . 1/2+n  topic length (1 byte v1, 2 bytes v2) + topic
         .   2+n  properties length (signed 16-bit) + properties

    End-of-file filler: when a record does not fit, the rest of the file
    starts with [remaining length: 4][0xCBD43194: 4]; zeros follow.

    Properties: UTF-8 "name \\x01 value \\x02" repeated.

A ConsumeQueue entry is [CommitLog offset: 8][record size: 4][tags code: 8].

Decoding walks a memoryview with ``unpack_from``; the body stays a slice of
the caller's buffer until ``body_bytes()`` is asked for. Every malformed
input raises ``CorruptRecordError`` (source, offset, reason); bytes that are
simply not written yet (zeros) raise ``NotWrittenYetError``.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any

from tiered.errors import CorruptRecordError, NotWrittenYetError

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
BLANK_LENGTH = 8
CRC_MASK = 0x7FFFFFFF

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"

# ConsumeQueue filler entries at the head of a queue that starts above 0.
CQ_FILLER_SIZE = 0x7FFFFFFF


class MagicVersion(IntEnum):
    V1 = 1
    V2 = 2


class SysFlag(IntFlag):
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORN_HOST_V6 = 0x10
    STORE_HOST_V6 = 0x20
    INNER_BATCH = 0x80


# [total size][magic][body crc][queue id][flag][queue offset][physical offset][sys flag][born ts]
_HEAD = struct.Struct(">iIiiiqqiq")
# The common case, both hosts IPv4: the whole fixed part in one unpack.
_FIXED_V4 = struct.Struct(">iIiiiqqiq4sIq4sIiqi")
_HOST_V4 = struct.Struct(">4sI")
_HOST_V6 = struct.Struct(">16sI")
_I64 = struct.Struct(">q")
_RECON_PREP_BODYLEN = struct.Struct(">iqi")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_BLANK = struct.Struct(">iI")
_SIZE_MAGIC = struct.Struct(">iI")
CQ_ENTRY = struct.Struct(">qiq")
CQ_ENTRY_SIZE = CQ_ENTRY.size  # 20

_HEAD_SIZE = _HEAD.size  # 48
# Smallest possible record: IPv4 hosts, empty body, 1-byte empty topic, no properties.
MIN_RECORD_SIZE = _HEAD_SIZE + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
MAX_PROPERTIES = 0x7FFF


@dataclass(frozen=True, slots=True)
class Host:
    """An IPv4 or IPv6 address and port, as the broker stores it."""

    ip: str
    port: int

    @property
    def is_v6(self) -> bool:
        return ":" in self.ip

    def packed(self) -> bytes:
        return ipaddress.ip_address(self.ip).packed + self.port.to_bytes(4, "big", signed=True)

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Host:
        if text.startswith("["):
            ip, _, port = text[1:].partition("]:")
        else:
            ip, _, port = text.rpartition(":")
        ipaddress.ip_address(ip)
        return cls(ip, int(port))


def _host(ip_bytes: bytes, port: int) -> Host:
    return Host(str(ipaddress.ip_address(ip_bytes)), port)


def body_crc(body: bytes | memoryview) -> int:
    return zlib.crc32(body) & CRC_MASK


def tags_code(tags: str | None) -> int:
    """Java ``String.hashCode()`` of the tags: UTF-16 code units, int overflow,
    widened to a signed 64-bit value (0 for no tags)."""
    if not tags:
        return 0
    h = 0
    units = tags.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def offset_msg_id(store_host: Host, physical_offset: int) -> str:
    """The broker's offset message id: store host address + port + physical
    offset, upper-case hex (32 digits for IPv4, 56 for IPv6)."""
    return (store_host.packed() + physical_offset.to_bytes(8, "big", signed=True)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    raw = bytes.fromhex(msg_id)
    if len(raw) == 16:
        ip, port, off = raw[:4], raw[4:8], raw[8:]
    elif len(raw) == 28:
        ip, port, off = raw[:16], raw[16:20], raw[20:]
    else:
        raise ValueError(f"not an offset message id: {msg_id!r}")
    return _host(ip, int.from_bytes(port, "big", signed=True)), int.from_bytes(off, "big", signed=True)


def encode_properties(props: Mapping[str, str]) -> bytes:
    parts = []
    for name, value in props.items():
        if NAME_VALUE_SEP in name or PROPERTY_SEP in name or NAME_VALUE_SEP in value or PROPERTY_SEP in value:
            raise ValueError(f"property {name!r} holds a separator character")
        parts.append(f"{name}{NAME_VALUE_SEP}{value}{PROPERTY_SEP}")
    return "".join(parts).encode("utf-8")


def decode_properties(raw: bytes | memoryview, source: str = "<buffer>", offset: int = 0) -> dict[str, str]:
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(source, offset + exc.start, "properties are not valid UTF-8") from None
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEP):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEP)
        if not sep:
            raise CorruptRecordError(source, offset, f"property without a value separator: {name[:40]!r}")
        props[name] = value
    return props


class Record:
    """One decoded CommitLog record: a view over the caller's buffer.

    ``body`` and ``raw`` are memoryview slices (no copy); they stay valid as
    long as the underlying buffer does. Text fields decode on first use.
    """

    __slots__ = (
        "source", "position", "size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
        "physical_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
        "store_host", "reconsume_times", "prepared_transaction_offset", "body", "topic_raw",
        "properties_raw", "raw", "_props",
    )

    source: str
    position: int
    size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: memoryview
    topic_raw: memoryview
    properties_raw: memoryview
    raw: memoryview

    @property
    def version(self) -> MagicVersion:
        return MagicVersion.V2 if self.magic == MAGIC_V2 else MagicVersion.V1

    @property
    def topic(self) -> str:
        return bytes(self.topic_raw).decode("utf-8")

    @property
    def properties(self) -> dict[str, str]:
        props = self._props
        if props is None:
            props = self._props = decode_properties(self.properties_raw, self.source, self.position)
        return props

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get("KEYS", "").split(" ") if k]

    @property
    def unique_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)

    def body_bytes(self) -> bytes:
        return bytes(self.body)

    def to_message(self) -> Message:
        return Message(
            topic=self.topic, queue_id=self.queue_id, body=self.body_bytes(), properties=self.properties,
            flag=self.flag, sys_flag=self.sys_flag, born_timestamp=self.born_timestamp,
            born_host=self.born_host, store_timestamp=self.store_timestamp, store_host=self.store_host,
            reconsume_times=self.reconsume_times, prepared_transaction_offset=self.prepared_transaction_offset,
            queue_offset=self.queue_offset, physical_offset=self.physical_offset, version=self.version,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields ``tiered inspect --json`` prints (body as its length)."""
        props = self.properties
        return {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "commitlog_offset": self.physical_offset,
            "size": self.size,
            "magic_version": int(self.version),
            "body_crc": self.body_crc,
            "sys_flag": self.sys_flag,
            "flag": self.flag,
            "born_timestamp": self.born_timestamp,
            "born_host": str(self.born_host),
            "store_timestamp": self.store_timestamp,
            "store_host": str(self.store_host),
            "reconsume_times": self.reconsume_times,
            "prepared_transaction_offset": self.prepared_transaction_offset,
            "tags": props.get("TAGS"),
            "keys": [k for k in props.get("KEYS", "").split(" ") if k],
            "unique_key": props.get("UNIQ_KEY"),
            "msg_id": self.msg_id,
            "properties": props,
            "body_length": len(self.body),
        }


def decode_record(
    buf: memoryview,
    position: int,
    source: str = "<buffer>",
    *,
    verify_crc: bool = True,
) -> Record:
    """Decode the record starting at ``position`` of ``buf``.

    ``buf`` must be a memoryview of bytes (format "B"). Raises
    NotWrittenYetError for a zero size (preallocated, unwritten space) and
    CorruptRecordError for anything malformed, including a filler (callers
    that walk a file check ``peek`` first).
    """
    end = len(buf)
    if position < 0 or position + 8 > end:
        raise NotWrittenYetError(source, position, "record header beyond the written data")
    size, magic = _SIZE_MAGIC.unpack_from(buf, position)
    if size == 0 and magic == 0:
        raise NotWrittenYetError(source, position)
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptRecordError(source, position, f"bad magic code 0x{magic:08X}")
    if size < MIN_RECORD_SIZE:
        raise CorruptRecordError(source, position, f"total size {size} below the minimum {MIN_RECORD_SIZE}")
    if position + size > end:
        raise CorruptRecordError(source, position, f"total size {size} runs past the end of the data ({end - position} bytes left)")
    rec_end = position + size
    rec = Record.__new__(Record)
    rec.source = source
    rec.position = position
    rec.size = size
    rec.magic = magic
    rec._props = None
    sys_flag = struct.unpack_from(">i", buf, position + 36)[0]
    if not sys_flag & 0x30:
        (_, _, crc, rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset, rec.sys_flag,
         rec.born_timestamp, bip, bport, rec.store_timestamp, sip, sport, rec.reconsume_times,
         rec.prepared_transaction_offset, body_len) = _FIXED_V4.unpack_from(buf, position)
        rec.born_host = _host(bip, bport)
        rec.store_host = _host(sip, sport)
        p = position + _FIXED_V4.size
    else:
        (_, _, crc, rec.queue_id, rec.flag, rec.queue_offset, rec.physical_offset, rec.sys_flag,
         rec.born_timestamp) = _HEAD.unpack_from(buf, position)
        p = position + _HEAD_SIZE
        host_s = _HOST_V6 if sys_flag & SysFlag.BORN_HOST_V6 else _HOST_V4
        if p + host_s.size + 8 > rec_end:
            raise CorruptRecordError(source, p, "born host runs past the record")
        rec.born_host = _host(*host_s.unpack_from(buf, p))
        p += host_s.size
        rec.store_timestamp = _I64.unpack_from(buf, p)[0]
        p += 8
        host_s = _HOST_V6 if sys_flag & SysFlag.STORE_HOST_V6 else _HOST_V4
        if p + host_s.size + _RECON_PREP_BODYLEN.size > rec_end:
            raise CorruptRecordError(source, p, "store host runs past the record")
        rec.store_host = _host(*host_s.unpack_from(buf, p))
        p += host_s.size
        rec.reconsume_times, rec.prepared_transaction_offset, body_len = _RECON_PREP_BODYLEN.unpack_from(buf, p)
        p += _RECON_PREP_BODYLEN.size
    rec.body_crc = crc
    if body_len < 0 or p + body_len > rec_end:
        raise CorruptRecordError(source, p - 4, f"body length {body_len} runs past the record")
    rec.body = buf[p:p + body_len]
    p += body_len
    if magic == MAGIC_V1:
        if p + 1 > rec_end:
            raise CorruptRecordError(source, p, "topic length runs past the record")
        topic_len = buf[p]
        p += 1
    else:
        if p + 2 > rec_end:
            raise CorruptRecordError(source, p, "topic length runs past the record")
        topic_len = _U16.unpack_from(buf, p)[0]
        p += 2
    if p + topic_len + 2 > rec_end:
        raise CorruptRecordError(source, p, f"topic length {topic_len} runs past the record")
    rec.topic_raw = buf[p:p + topic_len]
    p += topic_len
    props_len = _I16.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len != rec_end:
        raise CorruptRecordError(
            source, p - 2, f"properties length {props_len} does not end at the total size {size}"
        )
    rec.properties_raw = buf[p:rec_end]
    rec.raw = buf[position:rec_end]
    if verify_crc and zlib.crc32(rec.body) & CRC_MASK != crc:
        raise CorruptRecordError(source, position, "body CRC mismatch")
    return rec


class Peek(IntEnum):
    RECORD = 0
    BLANK = 1
    UNWRITTEN = 2


def peek(buf: memoryview, position: int, source: str = "<buffer>") -> tuple[Peek, int]:
    """What starts at ``position``: a record (and its size), the end-of-file
    filler (and the remaining length), or unwritten space."""
    if position + 8 > len(buf):
        if any(buf[position:]):
            raise CorruptRecordError(source, position, "trailing bytes too short for a record header")
        return Peek.UNWRITTEN, 0
    size, magic = _SIZE_MAGIC.unpack_from(buf, position)
    if magic == BLANK_MAGIC:
        return Peek.BLANK, size
    if size == 0 and magic == 0:
        return Peek.UNWRITTEN, 0
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptRecordError(source, position, f"bad magic code 0x{magic:08X}")
    return Peek.RECORD, size


@dataclass(frozen=True, slots=True)
class Message:
    """A message to encode, with every field the record carries."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = Host("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: Host = Host("127.0.0.1", 10911)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    # None picks v2 only when the topic needs it (longer than 127 bytes).
    version: MagicVersion | None = None


def encode_record(msg: Message) -> bytes:
    """The exact bytes the broker writes for ``msg``.

    The host sys-flag bits are derived from the hosts, so they always agree.
    """
    topic = msg.topic.encode("utf-8")
    props = encode_properties(msg.properties)
    version = msg.version or (MagicVersion.V2 if len(topic) > 127 else MagicVersion.V1)
    if version == MagicVersion.V1 and len(topic) > 127:
        raise ValueError(f"topic of {len(topic)} bytes needs magic v2")
    if len(topic) > 0xFFFF:
        raise ValueError("topic longer than 65535 bytes")
    if len(props) > MAX_PROPERTIES:
        raise ValueError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES}")
    sys_flag = msg.sys_flag & ~0x30
    if msg.born_host.is_v6:
        sys_flag |= SysFlag.BORN_HOST_V6
    if msg.store_host.is_v6:
        sys_flag |= SysFlag.STORE_HOST_V6
    born = msg.born_host.packed()
    store = msg.store_host.packed()
    topic_len = bytes([len(topic)]) if version == MagicVersion.V1 else _U16.pack(len(topic))
    tail = b"".join((
        born,
        _I64.pack(msg.store_timestamp),
        store,
        _RECON_PREP_BODYLEN.pack(msg.reconsume_times, msg.prepared_transaction_offset, len(msg.body)),
        msg.body,
        topic_len,
        topic,
        _I16.pack(len(props)),
        props,
    ))
    size = _HEAD_SIZE + len(tail)
    head = _HEAD.pack(
        size, MAGIC_V1 if version == MagicVersion.V1 else MAGIC_V2, body_crc(msg.body), msg.queue_id,
        msg.flag, msg.queue_offset, msg.physical_offset, sys_flag, msg.born_timestamp,
    )
    return head + tail


def encode_blank(remaining: int) -> bytes:
    """The end-of-file filler for ``remaining`` bytes left in a CommitLog file."""
    if remaining < BLANK_LENGTH:
        raise ValueError("no room for the end-of-file filler")
    return _BLANK.pack(remaining, BLANK_MAGIC)


def encode_cq_entry(commitlog_offset: int, size: int, tags: int) -> bytes:
    return CQ_ENTRY.pack(commitlog_offset, size, tags)


def decode_cq_entry(buf: memoryview | bytes, position: int = 0) -> tuple[int, int, int]:
    if position + CQ_ENTRY_SIZE > len(buf):
        raise NotWrittenYetError("<consumequeue>", position, "entry beyond the written data")
    return CQ_ENTRY.unpack_from(buf, position)


def check_against_entry(
    rec: Record, *, topic: bytes, queue_id: int, queue_offset: int, commitlog_offset: int, size: int
) -> None:
    """Raise CorruptRecordError unless ``rec`` is what its ConsumeQueue entry says."""
    if rec.size != size:
        raise CorruptRecordError(rec.source, rec.position, f"size {rec.size} != ConsumeQueue size {size}")
    if rec.queue_id != queue_id:
        raise CorruptRecordError(rec.source, rec.position, f"queue id {rec.queue_id} != {queue_id}")
    if rec.queue_offset != queue_offset:
        raise CorruptRecordError(rec.source, rec.position, f"queue offset {rec.queue_offset} != {queue_offset}")
    if rec.physical_offset != commitlog_offset:
        raise CorruptRecordError(
            rec.source, rec.position, f"physical offset {rec.physical_offset} != {commitlog_offset}"
        )
    if rec.topic_raw != topic:
        raise CorruptRecordError(rec.source, rec.position, "topic differs from its ConsumeQueue")
