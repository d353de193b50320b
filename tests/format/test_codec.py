"""Codec round trips over every field's range, Java hashCode semantics of the
tags code, properties, hosts and the error paths of decode/peek/encode."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered.format.codec import (
    BLANK_MAGIC,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    Host,
    MagicVersion,
    Message,
    Peek,
    SysFlag,
    body_crc,
    check_against_entry,
    crc32,
    decode_cq_entry,
    decode_properties,
    decode_record,
    encode_blank,
    encode_cq_entry,
    encode_properties,
    encode_record,
    offset_msg_id,
    parse_offset_msg_id,
    peek,
    tags_code,
)
from tiered.errors import CorruptRecordError, NotWrittenYetError, TieredError

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
PORT = st.integers(0, 65535)


def java_hash(s: str) -> int:
    """Reference Java String.hashCode(), written independently of the codec:
    split code points above U+FFFF into surrogate pairs by hand, wrap like a
    32-bit int after every step."""
    units: list[int] = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    h = 0
    for u in units:
        h = h * 31 + u
        h = (h + 2**31) % 2**32 - 2**31  # Java int overflow
    return h


# --- tags code ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a", 97),                       # 'a'
        ("ab", 3105),                    # 97 * 31 + 98
        ("TagA", 2598919),               # ((84*31 + 97)*31 + 103)*31 + 65
        ("hello", 99162322),
        ("hello world", 1794106052),
        ("polygenelubricants", -2147483648),  # the classic Integer.MIN_VALUE hash
        ("é", 233),
        ("中", 20013),
        ("😀", 1772899),                 # U+1F600 = D83D DE00: 0xD83D*31 + 0xDE00
        ("a😀", 97 * 31 * 31 + 1772899),  # 3014559
    ],
)
def test_tags_code_known_java_values(text: str, expected: int) -> None:
    assert java_hash(text) == expected
    assert tags_code(text) == expected


def test_tags_code_surrogate_pair_is_not_the_code_point() -> None:
    assert tags_code("😀") != 0x1F600
    assert tags_code("😀") == 0xD83D * 31 + 0xDE00


def test_tags_code_none_and_empty() -> None:
    assert tags_code(None) == 0
    assert tags_code("") == 0


def test_tags_code_lone_surrogate_hashes_like_java() -> None:
    # Java strings may hold a lone surrogate; hashCode just uses the unit.
    assert tags_code("\ud83d") == 0xD83D
    assert tags_code("x\udc00") == 120 * 31 + 0xDC00


@given(st.text(max_size=60))
@settings(max_examples=300)
def test_tags_code_matches_reference(text: str) -> None:
    code = tags_code(text)
    assert code == java_hash(text)
    assert -(2**31) <= code < 2**31


# --- properties -----------------------------------------------------------------

PROP_TEXT = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=30)


@given(st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=8))
def test_properties_round_trip(props: dict[str, str]) -> None:
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert decode_properties(memoryview(raw)) == props


def test_properties_exact_bytes() -> None:
    raw = encode_properties({"TAGS": "标签", "KEYS": "a b"})
    assert raw == "TAGS\x01标签\x02KEYS\x01a b\x02".encode()
    assert decode_properties(raw) == {"TAGS": "标签", "KEYS": "a b"}


def test_properties_with_separator_rejected() -> None:
    with pytest.raises(ValueError):
        encode_properties({"a\x01": "b"})
    with pytest.raises(ValueError):
        encode_properties({"a": "b\x02"})


def test_decode_properties_errors_name_source_and_offset() -> None:
    with pytest.raises(CorruptRecordError) as info:
        decode_properties(b"TAGS\x01ok\x02\xff\xfe\x02", "file.x", 100)
    assert info.value.source == "file.x"
    assert info.value.offset == 100 + 8
    with pytest.raises(CorruptRecordError) as info:
        decode_properties(b"NOSEP\x02", "file.y", 7)
    assert info.value.source == "file.y" and info.value.offset == 7


def test_decode_properties_tolerates_missing_trailing_separator() -> None:
    assert decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}
    assert decode_properties(b"") == {}


# --- hosts and message ids ---------------------------------------------------------


def test_host_parse_and_str() -> None:
    assert Host.parse("10.0.0.1:10911") == Host("10.0.0.1", 10911)
    assert Host.parse("[::1]:10911") == Host("::1", 10911)
    assert str(Host("::1", 5)) == "[::1]:5"
    assert str(Host("1.2.3.4", 5)) == "1.2.3.4:5"
    assert Host("::1", 5).is_v6 and not Host("1.2.3.4", 5).is_v6
    assert Host("1.2.3.4", 258).packed() == bytes([1, 2, 3, 4, 0, 0, 1, 2])
    with pytest.raises(ValueError):
        Host.parse("not-an-ip:1")


IPV4 = st.ip_addresses(v=4).map(str)
IPV6 = st.ip_addresses(v=6).map(str)
HOST = st.builds(Host, st.one_of(IPV4, IPV6), PORT)


@given(HOST, INT64)
def test_offset_msg_id_round_trip(host: Host, offset: int) -> None:
    msg_id = offset_msg_id(host, offset)
    assert len(msg_id) == (56 if host.is_v6 else 32)
    assert msg_id == msg_id.upper()
    assert parse_offset_msg_id(msg_id) == (host, offset)


# --- records ------------------------------------------------------------------------

TOPIC = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=128, max_size=200),  # v2
    st.integers(125, 300).map(lambda n: "t" * n),  # straddles the 127-byte boundary
)
TAG_TEXT = st.text(st.characters(blacklist_characters="\x01\x02 ", blacklist_categories=("Cs",)), min_size=1, max_size=20)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    props = draw(st.dictionaries(PROP_TEXT.filter(bool), PROP_TEXT, max_size=5))
    if draw(st.booleans()):
        props["TAGS"] = draw(TAG_TEXT)
    if draw(st.booleans()):
        props["KEYS"] = " ".join(draw(st.lists(TAG_TEXT, min_size=1, max_size=4)))
    if draw(st.booleans()):
        props["UNIQ_KEY"] = draw(st.text("0123456789ABCDEF", min_size=32, max_size=32))
    body = draw(st.one_of(st.just(b""), st.binary(max_size=300), st.integers(0, 70_000).map(lambda n: b"\xab" * n)))
    return Message(
        topic=draw(TOPIC),
        queue_id=draw(INT32),
        body=body,
        properties=props,
        flag=draw(INT32),
        sys_flag=draw(INT32),
        born_timestamp=draw(INT64),
        born_host=draw(HOST),
        store_timestamp=draw(INT64),
        store_host=draw(HOST),
        reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64),
        queue_offset=draw(INT64),
        physical_offset=draw(INT64),
        version=draw(st.sampled_from([None, MagicVersion.V2])),
    )


@given(messages(), st.integers(0, 50))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_record_round_trip(msg: Message, pad: int) -> None:
    raw = encode_record(msg)
    buf = memoryview(b"\x5a" * pad + raw + b"\x00" * 8)
    rec = decode_record(buf, pad, "src")
    topic_bytes = msg.topic.encode()
    expected_sys = (msg.sys_flag & ~0x30) | (0x10 if msg.born_host.is_v6 else 0) | (0x20 if msg.store_host.is_v6 else 0)
    long_topic = len(topic_bytes) > 127
    assert rec.version == (MagicVersion.V2 if (long_topic or msg.version == MagicVersion.V2) else MagicVersion.V1)
    assert rec.magic == (MAGIC_V2 if rec.version == MagicVersion.V2 else MAGIC_V1)
    assert rec.size == len(raw) == struct.unpack_from(">i", raw)[0]
    assert rec.position == pad and rec.source == "src"
    assert rec.body_crc == zlib.crc32(msg.body) & 0x7FFFFFFF
    assert rec.queue_id == msg.queue_id
    assert rec.flag == msg.flag
    assert rec.queue_offset == msg.queue_offset
    assert rec.physical_offset == msg.physical_offset
    assert rec.sys_flag == expected_sys
    assert rec.born_timestamp == msg.born_timestamp
    assert rec.born_host == msg.born_host
    assert rec.store_timestamp == msg.store_timestamp
    assert rec.store_host == msg.store_host
    assert rec.reconsume_times == msg.reconsume_times
    assert rec.prepared_transaction_offset == msg.prepared_transaction_offset
    assert rec.body_bytes() == msg.body
    assert rec.topic == msg.topic
    assert bytes(rec.topic_raw) == topic_bytes
    assert rec.properties == dict(msg.properties)
    assert rec.tags == msg.properties.get("TAGS")
    assert rec.keys == [k for k in msg.properties.get("KEYS", "").split(" ") if k]
    assert rec.unique_key == msg.properties.get("UNIQ_KEY")
    assert bytes(rec.raw) == raw
    assert rec.msg_id == offset_msg_id(msg.store_host, msg.physical_offset)
    # byte-identical re-encoding
    assert encode_record(rec.to_message()) == raw
    # the fixed fields sit where the spec says
    assert struct.unpack_from(">iIiiiqqiq", raw) == (
        len(raw), rec.magic, rec.body_crc, msg.queue_id, msg.flag, msg.queue_offset,
        msg.physical_offset, expected_sys, msg.born_timestamp,
    )
    born_len = 20 if msg.born_host.is_v6 else 8
    assert struct.unpack_from(">q", raw, 48 + born_len)[0] == msg.store_timestamp
    assert peek(buf, pad, "src") == (Peek.RECORD, len(raw))


def test_large_body_round_trip() -> None:
    body = bytes(range(256)) * 16384  # 4 MiB
    raw = encode_record(Message(topic="big", queue_id=1, body=body, properties={"TAGS": "x"}))
    rec = decode_record(memoryview(raw), 0)
    assert rec.body_bytes() == body
    assert rec.body_crc == zlib.crc32(body) & 0x7FFFFFFF
    assert rec.size == len(raw) == 91 + len(body) + 3 + len(b"TAGS\x01x\x02")


def test_body_is_a_view_not_a_copy() -> None:
    data = bytearray(encode_record(Message(topic="t", queue_id=0, body=b"abcdef")))
    rec = decode_record(memoryview(data), 0, verify_crc=False)
    data[88] = ord("Z")  # IPv4 hosts: the body starts at byte 88
    assert bytes(rec.body) == b"Zbcdef"
    assert isinstance(rec.body, memoryview) and isinstance(rec.raw, memoryview)


def test_record_views_survive_the_callers_view() -> None:
    data = encode_record(Message(topic="t", queue_id=0, body=b"abcdef", properties={"TAGS": "x"}))
    with memoryview(data) as mv:
        rec = decode_record(mv, 0)
    assert rec.body_bytes() == b"abcdef" and rec.topic == "t" and rec.tags == "x"


def test_encode_rejects_what_the_format_cannot_hold() -> None:
    with pytest.raises(ValueError):
        encode_record(Message(topic="t" * 128, queue_id=0, body=b"", version=MagicVersion.V1))
    with pytest.raises(ValueError):
        encode_record(Message(topic="t" * 65536, queue_id=0, body=b""))
    with pytest.raises(ValueError):
        encode_record(Message(topic="t", queue_id=0, body=b"", properties={"K": "v" * 0x7FFF}))
    # exactly at the limit is fine: 1 + 1 + n + 1 bytes
    raw = encode_record(Message(topic="t", queue_id=0, body=b"", properties={"K": "v" * (0x7FFF - 3)}))
    assert decode_record(memoryview(raw), 0).properties["K"] == "v" * (0x7FFF - 3)


def test_v1_topic_of_127_bytes_stays_v1_and_128_goes_v2() -> None:
    r127 = decode_record(memoryview(encode_record(Message(topic="a" * 127, queue_id=0, body=b""))), 0)
    r128 = decode_record(memoryview(encode_record(Message(topic="a" * 128, queue_id=0, body=b""))), 0)
    assert r127.magic == MAGIC_V1 and r128.magic == MAGIC_V2
    assert r128.size == r127.size + 2  # one more topic byte, one more length byte


def test_host_bits_in_sys_flag_follow_the_hosts() -> None:
    msg = Message(topic="t", queue_id=0, body=b"", sys_flag=0x30 | 0x1, born_host=Host("1.1.1.1", 1),
                  store_host=Host("::2", 2))
    rec = decode_record(memoryview(encode_record(msg)), 0)
    assert rec.sys_flag == SysFlag.STORE_HOST_V6 | SysFlag.COMPRESSED


def test_body_crc_helper() -> None:
    assert body_crc(b"") == 0
    assert body_crc(b"Hello RocketMQ") == 1774740973
    assert body_crc(memoryview(b"xyz")) == zlib.crc32(b"xyz") & 0x7FFFFFFF


# --- decode errors ----------------------------------------------------------------------

GOOD = encode_record(Message(topic="topic", queue_id=2, body=b"payload", properties={"TAGS": "t"},
                             queue_offset=9, physical_offset=777))


def _patched(at: int, fmt: str, value: int, base: bytes = GOOD) -> memoryview:
    data = bytearray(base)
    struct.pack_into(fmt, data, at, value)
    return memoryview(data)


def test_zeros_are_not_written_yet() -> None:
    with pytest.raises(NotWrittenYetError) as info:
        decode_record(memoryview(bytes(200)), 16, "cl")
    assert info.value.source == "cl" and info.value.offset == 16
    with pytest.raises(NotWrittenYetError):
        decode_record(memoryview(GOOD[:5]), 0)
    assert peek(memoryview(bytes(200)), 0) == (Peek.UNWRITTEN, 0)
    assert peek(memoryview(bytes(5)), 0) == (Peek.UNWRITTEN, 0)
    assert peek(memoryview(bytes(10)), 10) == (Peek.UNWRITTEN, 0)


def test_bad_magic() -> None:
    with pytest.raises(CorruptRecordError) as info:
        decode_record(_patched(4, ">I", 0xDEADBEEF), 0, "cl")
    assert (info.value.source, info.value.offset) == ("cl", 0)
    with pytest.raises(CorruptRecordError):
        peek(_patched(4, ">I", 0xDEADBEEF), 0, "cl")


def test_filler_is_not_a_record() -> None:
    with pytest.raises(CorruptRecordError):
        decode_record(memoryview(encode_blank(100) + bytes(92)), 0)


def test_size_too_small_or_too_large() -> None:
    for size in (0, 1, MIN_RECORD_SIZE - 1, -5):
        with pytest.raises(CorruptRecordError):
            decode_record(_patched(0, ">i", size), 0)
    with pytest.raises(CorruptRecordError):
        decode_record(_patched(0, ">i", len(GOOD) + 1), 0)  # runs past the buffer
    with pytest.raises(CorruptRecordError):
        decode_record(memoryview(GOOD[:-1]), 0)  # truncated buffer
    with pytest.raises(CorruptRecordError):
        decode_record(_patched(0, ">i", len(GOOD) - 1, GOOD + b"\0"), 0)  # size disagrees with the fields


def test_field_lengths_that_run_past_the_record() -> None:
    body_len_at = 84
    with pytest.raises(CorruptRecordError) as info:
        decode_record(_patched(body_len_at, ">i", 10_000), 0, "cl")
    assert info.value.offset == body_len_at
    with pytest.raises(CorruptRecordError):
        decode_record(_patched(body_len_at, ">i", -1), 0)
    topic_len_at = 88 + len(b"payload")
    with pytest.raises(CorruptRecordError):
        decode_record(_patched(topic_len_at, ">B", 200), 0)
    props_len_at = topic_len_at + 1 + len(b"topic")
    with pytest.raises(CorruptRecordError):
        decode_record(_patched(props_len_at, ">h", -1), 0)
    with pytest.raises(CorruptRecordError):
        decode_record(_patched(props_len_at, ">h", 1), 0)


def test_crc_mismatch_and_skip() -> None:
    data = bytearray(GOOD)
    data[90] ^= 0x01
    with pytest.raises(CorruptRecordError) as info:
        decode_record(memoryview(data), 0, "cl")
    assert (info.value.source, info.value.offset) == ("cl", 0)
    rec = decode_record(memoryview(data), 0, "cl", verify_crc=False)
    assert rec.body_bytes() != b"payload"


def test_invalid_utf8_in_topic_and_properties_is_corruption() -> None:
    bad_topic = bytearray(GOOD)
    bad_topic[88 + 7 + 1] = 0xFF
    rec = decode_record(memoryview(bytes(bad_topic)), 0, "cl")
    with pytest.raises(CorruptRecordError):
        rec.topic
    bad_props = bytearray(GOOD)
    bad_props[-2] = 0xFF
    rec = decode_record(memoryview(bytes(bad_props)), 0, "cl")
    with pytest.raises(CorruptRecordError):
        rec.properties
    with pytest.raises(CorruptRecordError):
        rec.to_dict()


def test_peek_validates_sizes() -> None:
    with pytest.raises(CorruptRecordError):
        peek(_patched(0, ">i", 0), 0)  # valid magic, zero size
    with pytest.raises(CorruptRecordError):
        peek(memoryview(struct.pack(">iI", 4, BLANK_MAGIC)), 0)  # filler shorter than itself
    with pytest.raises(CorruptRecordError):
        peek(memoryview(b"\0\0\0\1\0"), 0)  # a few nonzero trailing bytes


def test_errors_are_tiered_errors() -> None:
    assert issubclass(CorruptRecordError, TieredError) and issubclass(NotWrittenYetError, TieredError)
    assert not CorruptRecordError("a", 1, "b").retriable


# --- ConsumeQueue entries and entry checks -------------------------------------------------


@given(INT64, INT32, INT64)
def test_cq_entry_round_trip(phys: int, size: int, tags: int) -> None:
    raw = encode_cq_entry(phys, size, tags)
    assert len(raw) == 20
    assert decode_cq_entry(raw) == (phys, size, tags)


def test_cq_entry_short_is_not_written_yet() -> None:
    with pytest.raises(NotWrittenYetError):
        decode_cq_entry(b"\0" * 19)
    with pytest.raises(NotWrittenYetError):
        decode_cq_entry(b"\0" * 30, 20)


def test_check_against_entry() -> None:
    rec = decode_record(memoryview(GOOD), 0, "cl")
    ok = dict(topic=b"topic", queue_id=2, queue_offset=9, commitlog_offset=777, size=len(GOOD))
    check_against_entry(rec, **ok)
    for field, bad in [("topic", b"topic2"), ("topic", b"topi"), ("queue_id", 3), ("queue_offset", 8),
                       ("commitlog_offset", 778), ("size", len(GOOD) + 1)]:
        with pytest.raises(CorruptRecordError) as info:
            check_against_entry(rec, **{**ok, field: bad})
        assert (info.value.source, info.value.offset) == ("cl", 0)


def test_to_dict_fields() -> None:
    rec = decode_record(memoryview(GOOD), 0)
    d = rec.to_dict()
    assert d == {
        "topic": "topic", "queue_id": 2, "queue_offset": 9, "commitlog_offset": 777, "size": len(GOOD),
        "magic_version": 1, "body_crc": zlib.crc32(b"payload") & 0x7FFFFFFF, "sys_flag": 0, "flag": 0,
        "born_timestamp": 0, "born_host": "127.0.0.1:0", "store_timestamp": 0, "store_host": "127.0.0.1:10911",
        "reconsume_times": 0, "prepared_transaction_offset": 0, "tags": "t", "keys": [], "unique_key": None,
        "msg_id": offset_msg_id(Host("127.0.0.1", 10911), 777), "properties": {"TAGS": "t"}, "body_length": 7,
    }


@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_the_crc32_in_use_is_zlibs(data: bytes, start: int) -> None:
    # archives and manifests hold these values: they must be zlib's CRC-32 exactly
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)
