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
simply not written yet (zeros) raise ``NotWrittenYetError``. The common
record (both hosts IPv4, every length consistent) is decoded by one unpack
of its 88-byte fixed part; anything else, and every error, by a
field-by-field walk. ``decode_and_check`` adds the ConsumeQueue entry's
checks.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any, Final

from zlib_ng.zlib_ng import crc32  # zlib's CRC-32, the same values, ~5x faster (SIMD)

from tiered.errors import CorruptRecordError, NotWrittenYetError
from tiered.format.lmq import LMQ_PREFIX_RAW, is_lmq, lmq_offset, lmq_problem

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
# The common case, both hosts IPv4: the whole fixed part in one unpack, the
# hosts kept packed (address + port, 8 bytes) until somebody asks for them.
_FIXED_V4 = struct.Struct(">iIiiiqqiq8sq8siqi")
_FIXED_V4_SIZE = _FIXED_V4.size  # 88: where the body starts when both hosts are IPv4
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_RECON_PREP_BODYLEN = struct.Struct(">iqi")
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

# Index of each fixed field in Record._f, the tuple _FIXED_V4 unpacks (the
# IPv6 walk builds the same tuple, with 20-byte packed hosts).
# literal indexes (Final) so that a type checker knows each field's type
_F_SIZE: Final = 0
_F_MAGIC: Final = 1
_F_CRC: Final = 2
_F_QUEUE_ID: Final = 3
_F_FLAG: Final = 4
_F_QUEUE_OFFSET: Final = 5
_F_PHYSICAL_OFFSET: Final = 6
_F_SYS_FLAG: Final = 7
_F_BORN_TS: Final = 8
_F_BORN_HOST: Final = 9
_F_STORE_TS: Final = 10
_F_STORE_HOST: Final = 11
_F_RECONSUME: Final = 12
_F_PREPARED: Final = 13
_F_BODY_LEN: Final = 14



@dataclass(frozen=True, slots=True)
class Host:
    """An IPv4 or IPv6 address and port, as the broker stores it."""

    ip: str
    port: int

    @property
    def is_v6(self) -> bool:
        return ":" in self.ip

    def packed(self) -> bytes:
        # every record carries two hosts and they repeat: parse each once
        packed = _PACKED_CACHE.get(self)
        if packed is None:
            packed = ipaddress.ip_address(self.ip).packed + self.port.to_bytes(4, "big", signed=True)
            if len(_PACKED_CACHE) >= _HOST_CACHE_MAX:
                _PACKED_CACHE.clear()
            _PACKED_CACHE[self] = packed
        return packed

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


# Hosts repeat (a few producers, one broker): decode each packed form once.
_HOST_CACHE: dict[bytes, Host] = {}
_HOST_CACHE_MAX = 4096
_PACKED_CACHE: dict[Host, bytes] = {}  # and encode each host once


def _host_of(packed: bytes) -> Host:
    """A Host from its stored form: 4 or 16 address bytes + a 4-byte signed
    port (a Java int, so any 32-bit value decodes and re-encodes)."""
    host = _HOST_CACHE.get(packed)
    if host is None:
        host = _host(packed[:-4], int.from_bytes(packed[-4:], "big", signed=True))
        if len(_HOST_CACHE) >= _HOST_CACHE_MAX:
            _HOST_CACHE.clear()
        _HOST_CACHE[packed] = host
    return host


def body_crc(body: bytes | memoryview) -> int:
    return crc32(body) & CRC_MASK


def tags_code(tags: str | None) -> int:
    """Java ``String.hashCode()`` of the tags: UTF-16 code units (a lone
    surrogate counts as itself, as in Java), int overflow, widened to a
    signed 64-bit value (0 for no tags)."""
    if not tags:
        return 0
    units = tags.encode("utf-16-be", "surrogatepass")
    h = 0
    for unit in struct.unpack(f">{len(units) >> 1}H", units):
        h = (31 * h + unit) & 0xFFFFFFFF
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


# The fixed fields as ``_FIXED_V4`` (or the slow path) unpacks them: hosts
# are the packed address + port, everything else an integer.
_Fixed = tuple[int, int, int, int, int, int, int, int, int, bytes, int, bytes, int, int, int]


class Record:
    """One decoded CommitLog record: a view over the caller's buffer.

    ``raw`` is a memoryview slice of the caller's buffer (no copy); ``body``,
    ``topic_raw`` and ``properties_raw`` are slices of it made on access.
    They stay valid as long as ``raw`` is referenced, even after the caller
    releases its own view. The fixed fields are kept as the one tuple
    ``struct`` unpacked; hosts, topic and properties decode on first use.
    """

    __slots__ = ("_f", "raw", "source", "position", "_props")

    _f: _Fixed
    raw: memoryview
    source: str
    position: int
    _props: dict[str, str] | None

    @property
    def size(self) -> int:
        """Total size of the record in bytes."""
        return self._f[_F_SIZE]

    @property
    def magic(self) -> int:
        """Magic code (v1 0xDAA320A7 or v2 0xDAA320AB)."""
        return self._f[_F_MAGIC]

    @property
    def body_crc(self) -> int:
        """Stored CRC32 of the body, masked with 0x7FFFFFFF."""
        return self._f[_F_CRC]

    @property
    def queue_id(self) -> int:
        """Queue id."""
        return self._f[_F_QUEUE_ID]

    @property
    def flag(self) -> int:
        """The producer's flag."""
        return self._f[_F_FLAG]

    @property
    def queue_offset(self) -> int:
        """Index of the record in its ConsumeQueue."""
        return self._f[_F_QUEUE_OFFSET]

    @property
    def physical_offset(self) -> int:
        """Byte offset of the record in the broker CommitLog."""
        return self._f[_F_PHYSICAL_OFFSET]

    @property
    def sys_flag(self) -> int:
        """System flag bits (see SysFlag)."""
        return self._f[_F_SYS_FLAG]

    @property
    def born_timestamp(self) -> int:
        """Producer-side timestamp, ms."""
        return self._f[_F_BORN_TS]

    @property
    def store_timestamp(self) -> int:
        """Broker store timestamp, ms."""
        return self._f[_F_STORE_TS]

    @property
    def reconsume_times(self) -> int:
        """Reconsume times."""
        return self._f[_F_RECONSUME]

    @property
    def prepared_transaction_offset(self) -> int:
        """Prepared transaction offset."""
        return self._f[_F_PREPARED]

    @property
    def body_length(self) -> int:
        """Length of the body in bytes."""
        return self._f[_F_BODY_LEN]

    @property
    def born_host(self) -> Host:
        return _host_of(self._f[_F_BORN_HOST])

    @property
    def store_host(self) -> Host:
        return _host_of(self._f[_F_STORE_HOST])

    @property
    def body_start(self) -> int:
        """Where the body starts in the record's bytes: after the fixed fields
        and the two hosts, whose length (IPv4 or IPv6) the sys flag says."""
        sys_flag = self._f[_F_SYS_FLAG]
        return _FIXED_V4_SIZE + (12 if sys_flag & 0x10 else 0) + (12 if sys_flag & 0x20 else 0)

    def _topic_span(self) -> tuple[int, int]:
        raw = self.raw
        p = self.body_start + self._f[_F_BODY_LEN]
        if self._f[_F_MAGIC] == MAGIC_V1:
            return p + 1, p + 1 + raw[p]
        return p + 2, p + 2 + ((raw[p] << 8) | raw[p + 1])

    @property
    def body(self) -> memoryview:
        start = self.body_start
        return self.raw[start:start + self._f[_F_BODY_LEN]]

    @property
    def topic_raw(self) -> memoryview:
        start, end = self._topic_span()
        return self.raw[start:end]

    @property
    def properties_raw(self) -> memoryview:
        return self.raw[self._topic_span()[1] + 2:]

    @property
    def version(self) -> MagicVersion:
        return MagicVersion.V2 if self._f[_F_MAGIC] == MAGIC_V2 else MagicVersion.V1

    @property
    def topic(self) -> str:
        start, end = self._topic_span()
        try:
            return bytes(self.raw[start:end]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(self.source, self.position + start + exc.start, "topic is not valid UTF-8") from None

    @property
    def properties(self) -> dict[str, str]:
        props = self._props
        if props is None:
            start = self._topic_span()[1] + 2
            props = self._props = decode_properties(self.raw[start:], self.source, self.position + start)
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

    def __repr__(self) -> str:
        return (f"Record({bytes(self.topic_raw)!r} queue {self.queue_id} offset {self.queue_offset} "
                f"@ {self.physical_offset}, {self.size} bytes)")

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
            "body_length": self._f[_F_BODY_LEN],
        }


_new_record = object.__new__


def decode_record(
    buf: memoryview,
    position: int,
    source: str = "<buffer>",
    *,
    verify_crc: bool = True,
) -> Record:
    """Decode the record starting at ``position`` of ``buf``.

    ``buf`` must be a memoryview of bytes (format "B"); bytes and mmap work
    too. Raises NotWrittenYetError for a zero size (preallocated, unwritten
    space) and CorruptRecordError for anything malformed, including a filler
    (callers that walk a file check ``peek`` first).
    """
    # Fast path: both hosts IPv4 and every length consistent. Anything else,
    # including every error, takes the field-by-field walk below.
    if position >= 0:
        try:
            f = _FIXED_V4.unpack_from(buf, position)
        except struct.error:
            f = None
        if f is not None and not f[7] & 0x30:
            size = f[0]
            magic = f[1]
            rec_end = position + size
            body_len = f[14]
            p = position + _FIXED_V4_SIZE + body_len  # topic length
            if ((magic == MAGIC_V1 or magic == MAGIC_V2) and size >= MIN_RECORD_SIZE and rec_end <= len(buf)
                    and body_len >= 0 and p + 3 <= rec_end):
                q = p + 1 + buf[p] if magic == MAGIC_V1 else p + 2 + ((buf[p] << 8) | buf[p + 1])
                if q + 2 <= rec_end:
                    props_len = (buf[q] << 8) | buf[q + 1]
                    if props_len < 0x8000 and q + 2 + props_len == rec_end and (
                        not verify_crc or crc32(buf[position + _FIXED_V4_SIZE:p]) & CRC_MASK == f[2]
                    ):
                        rec = _new_record(Record)
                        rec._f = f
                        rec.raw = buf[position:rec_end]
                        rec.source = source
                        rec.position = position
                        rec._props = None
                        return rec
    return _decode_walk(buf, position, source, verify_crc)


def _decode_walk(buf: memoryview, position: int, source: str, verify_crc: bool) -> Record:
    """Field by field, every length checked against the record and the buffer."""
    end = len(buf)
    if position < 0 or position + 8 > end:
        raise NotWrittenYetError(source, position, "record header beyond the written data")
    size, magic = _SIZE_MAGIC.unpack_from(buf, position)
    if size == 0 and magic == 0:
        raise NotWrittenYetError(source, position)
    if magic == BLANK_MAGIC:
        raise CorruptRecordError(source, position, "the end-of-file filler where a record was expected")
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptRecordError(source, position, f"bad magic code 0x{magic:08X}")
    if size < MIN_RECORD_SIZE:
        raise CorruptRecordError(source, position, f"total size {size} below the minimum {MIN_RECORD_SIZE}")
    if position + size > end:
        raise CorruptRecordError(
            source, position, f"total size {size} runs past the end of the data ({end - position} bytes left)"
        )
    rec_end = position + size
    head = _HEAD.unpack_from(buf, position)
    sys_flag = head[7]
    p = position + _HEAD_SIZE
    host_len = 20 if sys_flag & SysFlag.BORN_HOST_V6 else 8
    if p + host_len + 8 > rec_end:
        raise CorruptRecordError(source, p, "born host runs past the record")
    born = bytes(buf[p:p + host_len])
    p += host_len
    store_ts = _I64.unpack_from(buf, p)[0]
    p += 8
    host_len = 20 if sys_flag & SysFlag.STORE_HOST_V6 else 8
    if p + host_len + _RECON_PREP_BODYLEN.size > rec_end:
        raise CorruptRecordError(source, p, "store host runs past the record")
    store = bytes(buf[p:p + host_len])
    p += host_len
    reconsume, prepared, body_len = _RECON_PREP_BODYLEN.unpack_from(buf, p)
    p += _RECON_PREP_BODYLEN.size
    if body_len < 0 or p + body_len > rec_end:
        raise CorruptRecordError(source, p - 4, f"body length {body_len} runs past the record")
    body_at = p
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
    p += topic_len
    props_len = _I16.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len != rec_end:
        raise CorruptRecordError(
            source, p - 2, f"properties length {props_len} does not end at the total size {size}"
        )
    if verify_crc and crc32(buf[body_at:body_at + body_len]) & CRC_MASK != head[2]:
        raise CorruptRecordError(source, position, "body CRC mismatch")
    rec = _new_record(Record)
    rec._f = head + (born, store_ts, store, reconsume, prepared, body_len)
    rec.raw = buf[position:rec_end]
    rec.source = source
    rec.position = position
    rec._props = None
    return rec


class Peek(IntEnum):
    RECORD = 0
    BLANK = 1
    UNWRITTEN = 2


def peek(buf: memoryview, position: int, source: str = "<buffer>") -> tuple[Peek, int]:
    """What starts at ``position``: a record (and its size), the end-of-file
    filler (and the remaining length), or unwritten space. A size that
    cannot be right (below the smallest record or filler) is corruption, so
    a caller stepping by it always moves forward."""
    if position < 0:
        raise CorruptRecordError(source, position, "negative position")
    if position + 8 > len(buf):
        if any(buf[position:]):
            raise CorruptRecordError(source, position, "trailing bytes too short for a record header")
        return Peek.UNWRITTEN, 0
    size, magic = _SIZE_MAGIC.unpack_from(buf, position)
    if magic == BLANK_MAGIC:
        if size < BLANK_LENGTH:
            raise CorruptRecordError(source, position, f"end-of-file filler of {size} bytes")
        return Peek.BLANK, size
    if size == 0 and magic == 0:
        return Peek.UNWRITTEN, 0
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptRecordError(source, position, f"bad magic code 0x{magic:08X}")
    if size < MIN_RECORD_SIZE:
        raise CorruptRecordError(source, position, f"total size {size} below the minimum {MIN_RECORD_SIZE}")
    return Peek.RECORD, size


@dataclass(frozen=True, slots=True, kw_only=True)
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
    # plain int arithmetic: IntFlag would mask a negative Java int to 8 bits
    sys_flag = int(msg.sys_flag) & ~0x30
    if msg.born_host.is_v6:
        sys_flag |= int(SysFlag.BORN_HOST_V6)
    if msg.store_host.is_v6:
        sys_flag |= int(SysFlag.STORE_HOST_V6)
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


def cq_written_entries(buf: memoryview | bytes, hint: int | None = None) -> int:
    """How many entries of a preallocated ConsumeQueue file are written:
    the first entry whose size is 0, by binary search (entries are written
    in order, and zeros follow the last one). ``hint``, the answer of an
    earlier look, is taken when the entries on either side of it say it is
    still the end: two entries read, where the search touches ~18 pages of
    a 6 MB file (each a page fault once the pages were given back)."""
    n = len(buf) // CQ_ENTRY_SIZE
    if hint is not None and 0 <= hint <= n:
        size_at = _I32.unpack_from
        if ((hint == 0 or size_at(buf, (hint - 1) * CQ_ENTRY_SIZE + 8)[0] != 0)
                and (hint == n or size_at(buf, hint * CQ_ENTRY_SIZE + 8)[0] == 0)):
            return hint
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if _I32.unpack_from(buf, mid * CQ_ENTRY_SIZE + 8)[0] != 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


def decode_cq_entry(buf: memoryview | bytes, position: int = 0) -> tuple[int, int, int]:
    if position < 0 or position + CQ_ENTRY_SIZE > len(buf):
        raise NotWrittenYetError("<consumequeue>", position, "entry beyond the written data")
    return CQ_ENTRY.unpack_from(buf, position)


def entry_problem(rec: Record, *, topic: bytes, queue_id: int, queue_offset: int) -> str | None:
    """Why ``rec`` is not entry ``queue_offset`` of queue ``topic``/``queue_id``
    (topic, queue id, queue offset; size and position are the caller's);
    None when it is. An LMQ queue's records are its parents' (``tiered.format.lmq``),
    unless one was sent to the LMQ topic itself."""
    if topic[:len(LMQ_PREFIX_RAW)] == LMQ_PREFIX_RAW and rec.topic_raw != topic:
        try:
            props = rec.properties
        except CorruptRecordError as exc:
            return exc.reason
        return lmq_problem(props, rec.queue_id, topic=topic.decode("utf-8", "replace"), queue_id=queue_id,
                           queue_offset=queue_offset)
    if rec.queue_id != queue_id:
        return f"queue id {rec.queue_id} != {queue_id}"
    if rec.queue_offset != queue_offset:
        return f"queue offset {rec.queue_offset} != {queue_offset}"
    if rec.topic_raw != topic:
        return "topic differs from its ConsumeQueue"
    return None


def entry_offset(rec: Record, topic: str) -> int:
    """The offset of ``rec`` in queue ``topic``, which it was checked to
    belong to: its own queue offset, except in an LMQ queue holding a parent
    topic's record, where its properties give the offset."""
    if is_lmq(topic) and rec.topic_raw != topic.encode("utf-8"):
        offset = lmq_offset(rec.properties, topic)
        if offset is not None:
            return offset
    return rec.queue_offset


def check_against_entry(
    rec: Record, *, topic: bytes, queue_id: int, queue_offset: int, commitlog_offset: int, size: int
) -> None:
    """Raise CorruptRecordError unless ``rec`` is what its ConsumeQueue entry says."""
    if rec.size != size:
        raise CorruptRecordError(rec.source, rec.position, f"size {rec.size} != ConsumeQueue size {size}")
    if rec.physical_offset != commitlog_offset:
        raise CorruptRecordError(
            rec.source, rec.position, f"physical offset {rec.physical_offset} != {commitlog_offset}"
        )
    problem = entry_problem(rec, topic=topic, queue_id=queue_id, queue_offset=queue_offset)
    if problem is not None:
        raise CorruptRecordError(rec.source, rec.position, problem)


def decode_and_check(
    buf: memoryview,
    position: int,
    source: str,
    topic: bytes,
    queue_id: int,
    queue_offset: int,
    commitlog_offset: int,
    size: int,
    verify_crc: bool = True,
) -> Record:
    """``decode_record`` then ``check_against_entry``: a record read through
    its ConsumeQueue entry. (``LocalStore.iter_queue`` inlines the common
    case in its loop and calls this for everything else.)

    Raises exactly what the two would: NotWrittenYetError for zeros,
    CorruptRecordError (source, offset) for a malformed record or one that
    is not what its entry says.
    """
    rec = decode_record(buf, position, source, verify_crc=verify_crc)
    check_against_entry(
        rec, topic=topic, queue_id=queue_id, queue_offset=queue_offset, commitlog_offset=commitlog_offset, size=size
    )
    return rec
