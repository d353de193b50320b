"""Golden bytes built by hand, field by field, from docs/design.md section 2.

Nothing here is produced by the encoder under test: every expected byte
string is assembled with ``struct.pack`` in the order the spec lists the
fields, then decoded (every field checked) and re-encoded byte-identically.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from tiered.format.codec import (
    CQ_FILLER_SIZE,
    Host,
    MagicVersion,
    Message,
    Peek,
    decode_cq_entry,
    decode_record,
    encode_blank,
    encode_cq_entry,
    encode_record,
    offset_msg_id,
    parse_offset_msg_id,
    peek,
    tags_code,
)

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def props_bytes(pairs: list[tuple[str, str]]) -> bytes:
    return "".join(f"{k}\x01{v}\x02" for k, v in pairs).encode("utf-8")


# --- record 1: magic v1, both hosts IPv4 --------------------------------------

BODY1 = b"Hello RocketMQ"
# zlib CRC32 of BODY1 masked with 0x7FFFFFFF, computed once and pinned here.
CRC1 = 1774740973
PROPS1 = [("TAGS", "TagA"), ("KEYS", "order-1 order-2"), ("UNIQ_KEY", "7F0000010B6C18B4AAC2")]
P1 = props_bytes(PROPS1)
TOPIC1 = b"TopicTest"
SIZE1 = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + (4 + 4) + 8 + (4 + 4) + 4 + 8 + (4 + len(BODY1)) + (1 + len(TOPIC1)) + (2 + len(P1))
GOLDEN1 = b"".join([
    i32(SIZE1),
    u32(MAGIC_V1),
    i32(CRC1),
    i32(3),                       # queue id
    i32(0),                       # flag
    i64(7),                       # queue offset
    i64(1234),                    # physical offset
    i32(0),                       # sys flag
    i64(1700000000123),           # born timestamp
    bytes([192, 168, 0, 10]), i32(54321),   # born host
    i64(1700000000456),           # store timestamp
    bytes([10, 0, 0, 1]), i32(10911),       # store host
    i32(0),                       # reconsume times
    i64(0),                       # prepared transaction offset
    i32(len(BODY1)), BODY1,
    bytes([len(TOPIC1)]), TOPIC1,
    struct.pack(">h", len(P1)), P1,
])

# --- record 2: magic v2, 130-byte topic -----------------------------------------

TOPIC2 = ("%DLQ%" + "consumer-group-" * 9)[:130].encode()
BODY2 = bytes(range(256)) * 3
P2 = props_bytes([("RECONSUME_TIME", "3"), ("DLQ_ORIGIN_TOPIC", "orders"), ("TAGS", "*")])
SIZE2 = 48 + 8 + 8 + 8 + 4 + 8 + 4 + len(BODY2) + 2 + len(TOPIC2) + 2 + len(P2)
GOLDEN2 = b"".join([
    i32(SIZE2),
    u32(MAGIC_V2),
    i32(zlib.crc32(BODY2) & 0x7FFFFFFF),
    i32(0),                       # queue id
    i32(-7),                      # flag (a Java int, may be negative)
    i64(123456789012),            # queue offset
    i64(9876543210987),           # physical offset
    i32(0x8),                     # sys flag: transaction commit
    i64(1),                       # born timestamp
    bytes([127, 0, 0, 1]), i32(65535),
    i64(2),                       # store timestamp
    bytes([255, 255, 255, 255]), i32(0),
    i32(3),                       # reconsume times
    i64(4455667788),              # prepared transaction offset
    i32(len(BODY2)), BODY2,
    struct.pack(">H", len(TOPIC2)), TOPIC2,
    struct.pack(">h", len(P2)), P2,
])

# --- record 3: IPv6 born host (sys flag 0x10), IPv4 store host, empty body and properties

TOPIC3 = b"ipv6"
SIZE3 = 48 + 20 + 8 + 8 + 4 + 8 + 4 + 0 + 1 + len(TOPIC3) + 2 + 0
BORN6 = bytes.fromhex("20010db8000000000000000000000001")  # 2001:db8::1
GOLDEN3 = b"".join([
    i32(SIZE3),
    u32(MAGIC_V1),
    i32(0),                       # CRC32 of the empty body is 0
    i32(15),
    i32(0),
    i64(0),
    i64(0),
    i32(0x10),                    # born host IPv6
    i64(1600000000000),
    BORN6, i32(40000),            # born host: 16 + 4 bytes
    i64(1600000000999),           # store timestamp at byte 68, not 56
    bytes([10, 1, 2, 3]), i32(10911),
    i32(0),
    i64(0),
    i32(0),
    bytes([len(TOPIC3)]), TOPIC3,
    struct.pack(">h", 0),
])

# --- record 4: both hosts IPv6 (sys flag 0x30) ------------------------------------

TOPIC4 = b"v6v6"
BODY4 = b"\x00\x01"
P4 = props_bytes([("UNIQ_KEY", "U")])
STORE6 = bytes(15) + b"\x01"  # ::1
SIZE4 = 48 + 20 + 8 + 20 + 4 + 8 + 4 + len(BODY4) + 1 + len(TOPIC4) + 2 + len(P4)
GOLDEN4 = b"".join([
    i32(SIZE4), u32(MAGIC_V1), i32(zlib.crc32(BODY4) & 0x7FFFFFFF), i32(1), i32(0), i64(5), i64(4096),
    i32(0x30 | 0x2), i64(10),
    BORN6, i32(1),
    i64(11),                      # store timestamp at byte 68
    STORE6, i32(10911),           # store host: 16 + 4 bytes
    i32(0), i64(0), i32(len(BODY4)), BODY4, bytes([len(TOPIC4)]), TOPIC4, struct.pack(">h", len(P4)), P4,
])


def test_golden_sizes_follow_the_spec_arithmetic() -> None:
    assert len(GOLDEN1) == SIZE1 == 91 + len(BODY1) + len(TOPIC1) + len(P1)
    assert len(GOLDEN2) == SIZE2
    assert len(GOLDEN3) == SIZE3 == 91 + 12 + len(TOPIC3)
    assert len(GOLDEN4) == SIZE4
    assert zlib.crc32(BODY1) & 0x7FFFFFFF == CRC1


def test_golden_v1_ipv4_decodes_every_field() -> None:
    rec = decode_record(memoryview(GOLDEN1), 0, "golden1")
    assert rec.source == "golden1"
    assert rec.position == 0
    assert rec.size == SIZE1
    assert rec.magic == MAGIC_V1
    assert rec.version is MagicVersion.V1
    assert rec.body_crc == CRC1
    assert rec.queue_id == 3
    assert rec.flag == 0
    assert rec.queue_offset == 7
    assert rec.physical_offset == 1234
    assert rec.sys_flag == 0
    assert rec.born_timestamp == 1700000000123
    assert rec.born_host == Host("192.168.0.10", 54321)
    assert rec.store_timestamp == 1700000000456
    assert rec.store_host == Host("10.0.0.1", 10911)
    assert rec.reconsume_times == 0
    assert rec.prepared_transaction_offset == 0
    assert rec.body_bytes() == BODY1
    assert bytes(rec.body) == BODY1
    assert rec.topic == "TopicTest"
    assert bytes(rec.topic_raw) == TOPIC1
    assert bytes(rec.properties_raw) == P1
    assert rec.properties == dict(PROPS1)
    assert rec.tags == "TagA"
    assert rec.keys == ["order-1", "order-2"]
    assert rec.unique_key == "7F0000010B6C18B4AAC2"
    assert bytes(rec.raw) == GOLDEN1
    assert rec.msg_id == "0A00000100002A9F00000000000004D2"


def test_golden_v1_ipv4_reencodes_identically() -> None:
    msg = Message(
        topic="TopicTest", queue_id=3, body=BODY1, properties=dict(PROPS1), flag=0, sys_flag=0,
        born_timestamp=1700000000123, born_host=Host("192.168.0.10", 54321),
        store_timestamp=1700000000456, store_host=Host("10.0.0.1", 10911),
        queue_offset=7, physical_offset=1234,
    )
    assert encode_record(msg) == GOLDEN1
    assert encode_record(decode_record(memoryview(GOLDEN1), 0).to_message()) == GOLDEN1


def test_golden_v2_long_topic() -> None:
    assert len(TOPIC2) == 130
    rec = decode_record(memoryview(GOLDEN2), 0)
    assert rec.magic == MAGIC_V2 and rec.version is MagicVersion.V2
    assert rec.size == SIZE2
    assert rec.body_crc == zlib.crc32(BODY2) & 0x7FFFFFFF
    assert rec.queue_id == 0
    assert rec.flag == -7
    assert rec.queue_offset == 123456789012
    assert rec.physical_offset == 9876543210987
    assert rec.sys_flag == 0x8
    assert rec.born_timestamp == 1
    assert rec.born_host == Host("127.0.0.1", 65535)
    assert rec.store_timestamp == 2
    assert rec.store_host == Host("255.255.255.255", 0)
    assert rec.reconsume_times == 3
    assert rec.prepared_transaction_offset == 4455667788
    assert rec.body_bytes() == BODY2
    assert rec.topic_raw == TOPIC2
    assert rec.topic == TOPIC2.decode()
    assert rec.properties == {"RECONSUME_TIME": "3", "DLQ_ORIGIN_TOPIC": "orders", "TAGS": "*"}
    assert rec.tags == "*" and rec.keys == [] and rec.unique_key is None
    # version picked automatically for a topic longer than 127 bytes
    msg = rec.to_message()
    assert encode_record(msg) == GOLDEN2
    assert encode_record(Message(**{**_fields(msg), "version": None})) == GOLDEN2


def test_golden_ipv6_born_host_moves_the_store_timestamp() -> None:
    assert struct.unpack_from(">q", GOLDEN3, 68)[0] == 1600000000999
    # where an IPv4 record has its store timestamp (56) sit the last 8 bytes of 2001:db8::1
    assert struct.unpack_from(">q", GOLDEN3, 56)[0] == 1
    rec = decode_record(memoryview(GOLDEN3), 0)
    assert rec.size == SIZE3
    assert rec.magic == MAGIC_V1
    assert rec.body_crc == 0
    assert rec.queue_id == 15
    assert rec.flag == 0
    assert rec.queue_offset == 0
    assert rec.physical_offset == 0
    assert rec.sys_flag == 0x10
    assert rec.born_timestamp == 1600000000000
    assert rec.born_host == Host("2001:db8::1", 40000)
    assert str(rec.born_host) == "[2001:db8::1]:40000"
    assert rec.store_timestamp == 1600000000999
    assert rec.store_host == Host("10.1.2.3", 10911)
    assert rec.reconsume_times == 0
    assert rec.prepared_transaction_offset == 0
    assert rec.body_bytes() == b""
    assert rec.topic == "ipv6"
    assert rec.properties == {}
    assert rec.tags is None and rec.keys == [] and rec.unique_key is None
    assert rec.msg_id == "0A01020300002A9F0000000000000000"
    msg = Message(topic="ipv6", queue_id=15, body=b"", born_timestamp=1600000000000,
                  born_host=Host("2001:db8::1", 40000), store_timestamp=1600000000999,
                  store_host=Host("10.1.2.3", 10911))
    assert encode_record(msg) == GOLDEN3
    assert encode_record(rec.to_message()) == GOLDEN3


def test_golden_both_hosts_ipv6() -> None:
    rec = decode_record(memoryview(GOLDEN4), 0)
    assert rec.sys_flag == 0x32
    assert rec.born_host == Host("2001:db8::1", 1)
    assert rec.store_timestamp == 11
    assert rec.store_host == Host("::1", 10911)
    assert rec.reconsume_times == 0
    assert rec.body_bytes() == BODY4
    assert rec.topic == "v6v6"
    assert rec.unique_key == "U"
    assert rec.msg_id == "00000000000000000000000000000001" "00002A9F" "0000000000001000"
    assert len(rec.msg_id) == 56
    assert encode_record(rec.to_message()) == GOLDEN4


def test_golden_records_decode_at_an_offset_inside_a_larger_buffer() -> None:
    buf = b"\xee" * 13 + GOLDEN1 + GOLDEN3 + GOLDEN2 + GOLDEN4 + b"\0" * 16
    mv = memoryview(buf)
    pos = 13
    seen = []
    while True:
        kind, size = peek(mv, pos)
        if kind is Peek.UNWRITTEN:
            break
        assert kind is Peek.RECORD
        rec = decode_record(mv, pos, "buf")
        assert rec.position == pos and rec.size == size
        seen.append(bytes(rec.raw))
        pos += size
    assert seen == [GOLDEN1, GOLDEN3, GOLDEN2, GOLDEN4]


def test_golden_blank_filler() -> None:
    golden = bytes.fromhex("000003E8" "CBD43194")
    assert golden == struct.pack(">iI", 1000, BLANK_MAGIC)
    assert encode_blank(1000) == golden
    assert encode_blank(8) == bytes.fromhex("00000008CBD43194")
    assert peek(memoryview(golden + bytes(992)), 0) == (Peek.BLANK, 1000)
    with pytest.raises(ValueError):
        encode_blank(7)


def test_golden_consumequeue_entry() -> None:
    golden = bytes.fromhex("00000000000004D2" "000000C8" "000000000027A807")
    assert golden == struct.pack(">q", 1234) + struct.pack(">i", 200) + struct.pack(">q", 2598919)
    assert tags_code("TagA") == 2598919
    assert encode_cq_entry(1234, 200, tags_code("TagA")) == golden
    assert decode_cq_entry(golden) == (1234, 200, 2598919)
    assert decode_cq_entry(b"\xff" * 3 + golden, 3) == (1234, 200, 2598919)
    # a negative tags code is sign-extended to 64 bits
    neg = bytes.fromhex("0000000000000000" "0000005B" "FFFFFFFF80000000")
    assert encode_cq_entry(0, 91, tags_code("polygenelubricants")) == neg
    # the broker's filler entry
    filler = bytes.fromhex("0000000000000000" "7FFFFFFF" "0000000000000000")
    assert encode_cq_entry(0, CQ_FILLER_SIZE, 0) == filler
    assert decode_cq_entry(filler) == (0, 2147483647, 0)


def test_golden_offset_msg_id() -> None:
    # store host 10.0.0.1:10911 (0x2A9F), physical offset 1234 (0x4D2)
    assert offset_msg_id(Host("10.0.0.1", 10911), 1234) == "0A00000100002A9F00000000000004D2"
    assert parse_offset_msg_id("0A00000100002A9F00000000000004D2") == (Host("10.0.0.1", 10911), 1234)
    v6 = "20010DB8000000000000000000000001" "0000C350" "000000FFFFFFFFFF"
    assert offset_msg_id(Host("2001:db8::1", 50000), 0xFF_FFFF_FFFF) == v6
    assert parse_offset_msg_id(v6) == (Host("2001:db8::1", 50000), 0xFF_FFFF_FFFF)
    assert parse_offset_msg_id(v6.lower()) == (Host("2001:db8::1", 50000), 0xFF_FFFF_FFFF)
    with pytest.raises(ValueError):
        parse_offset_msg_id("0A000001")


def _fields(msg: Message) -> dict:
    return {name: getattr(msg, name) for name in Message.__dataclass_fields__}
