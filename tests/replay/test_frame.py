"""The frame codec against frames laid out as apache/rocketmq's code lays them
(``RemotingCommand.encode``, ``RocketMQSerializable.rocketMQProtocolEncode``,
``NettyDecoder``), bad frames, and a fuzz of the decoder."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.errors import BadFrameError
from tiered.replay.frame import JSON, MAX_FRAME, ROCKETMQ, Command, decode, encode, frame_length


def java_json_frame(header: dict, body: bytes = b"") -> bytes:
    """RemotingCommand.encode with the JSON serializer: the frame after its length field."""
    raw = json.dumps(header).encode()
    return struct.pack(">i", (JSON << 24) | len(raw)) + raw + body


def java_str(value: str | None, short: bool) -> bytes:
    raw = (value or "").encode()
    return struct.pack(">h" if short else ">i", len(raw)) + raw


def java_binary_frame(code: int, lang: int, version: int, opaque: int, flag: int, remark: str | None,
                      ext: dict[str, str], body: bytes = b"") -> bytes:
    """RocketMQSerializable.rocketMQProtocolEncode, then the header-info field."""
    ext_raw = b"".join(java_str(k, True) + java_str(v, False) for k, v in ext.items())
    header = struct.pack(">hbhii", code, lang, version, opaque, flag) + java_str(remark, False) + \
        struct.pack(">i", len(ext_raw)) + ext_raw
    return struct.pack(">i", (ROCKETMQ << 24) | len(header)) + header + body


def java_binary_decode(frame: bytes) -> dict:
    """RocketMQSerializable.rocketMQProtocolDecode of a whole frame, length field included."""
    (length, info) = struct.unpack_from(">ii", frame)
    assert length == len(frame) - 4 and info >> 24 == ROCKETMQ
    hlen = info & 0xFFFFFF
    pos = 8
    code, lang, version, opaque, flag = struct.unpack_from(">hbhii", frame, pos)
    pos += 13
    (rlen,) = struct.unpack_from(">i", frame, pos)
    remark = frame[pos + 4:pos + 4 + rlen].decode() if rlen else None
    pos += 4 + rlen
    (elen,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    end = pos + elen
    ext = {}
    while pos < end:
        (klen,) = struct.unpack_from(">h", frame, pos)
        key = frame[pos + 2:pos + 2 + klen].decode()
        pos += 2 + klen
        (vlen,) = struct.unpack_from(">i", frame, pos)
        ext[key] = frame[pos + 4:pos + 4 + vlen].decode()
        pos += 4 + vlen
    assert pos == 8 + hlen
    return {"code": code, "language": lang, "version": version, "opaque": opaque, "flag": flag, "remark": remark,
            "ext": ext, "body": frame[8 + hlen:]}


def test_a_json_pull_request_as_the_java_client_sends_it() -> None:
    header = {"code": 11, "extFields": {"consumerGroup": "g", "topic": "Orders", "queueId": "2",
                                        "queueOffset": "17", "maxMsgNums": "32", "sysFlag": "3"},
              "flag": 0, "language": "JAVA", "opaque": 42, "serializeTypeCurrentRPC": "JSON", "version": 475}
    cmd = decode(java_json_frame(header))
    assert cmd == Command(code=11, opaque=42, flag=0, language="JAVA", version=475, remark=None,
                          ext=header["extFields"], body=b"", serialize=JSON)
    assert not cmd.is_response and not cmd.is_oneway


def test_json_ext_values_sent_as_numbers_or_booleans_are_read_as_their_text() -> None:
    cmd = decode(java_json_frame({"code": 14, "flag": 2, "opaque": 1, "language": "CPP",
                                  "extFields": {"queueId": 3, "setZeroIfNotFound": False, "x": None}}, b"body"))
    assert cmd.ext == {"queueId": "3", "setZeroIfNotFound": "false"}
    assert cmd.is_oneway and cmd.language == "CPP" and cmd.body == b"body"


def test_a_binary_request_with_remark_and_ext_fields() -> None:
    frame = java_binary_frame(105, 1, 317, -5, 0, "hi", {"topic": "Orders", "é": "ü"}, b"xyz")
    cmd = decode(frame)
    assert cmd == Command(code=105, opaque=-5, flag=0, language="CPP", version=317, remark="hi",
                          ext={"topic": "Orders", "é": "ü"}, body=b"xyz", serialize=ROCKETMQ)


def test_a_binary_request_without_remark_or_ext_fields() -> None:
    cmd = decode(java_binary_frame(34, 0, 0, 9, 2, None, {}))
    assert cmd.remark is None and cmd.ext == {} and cmd.is_oneway and cmd.serialize == ROCKETMQ


def test_a_binary_response_reads_back_with_the_java_layout() -> None:
    cmd = Command(code=19, opaque=77, flag=1, remark="OFFSET_OVERFLOW_ONE", serialize=ROCKETMQ,
                  ext={"nextBeginOffset": "5", "minOffset": "0"}, body=b"records")
    assert java_binary_decode(encode(cmd)) == {"code": 19, "language": 0, "version": 0, "opaque": 77, "flag": 1,
                                               "remark": "OFFSET_OVERFLOW_ONE",
                                               "ext": {"nextBeginOffset": "5", "minOffset": "0"}, "body": b"records"}


def test_a_json_response_has_string_ext_values_and_the_response_flag() -> None:
    frame = encode(Command(code=0, opaque=3, flag=1, ext={"offset": "12"}, body=b"b"))
    length, info = struct.unpack_from(">ii", frame)
    assert length == len(frame) - 4 and info >> 24 == JSON
    header = json.loads(frame[8:8 + (info & 0xFFFFFF)])
    assert header == {"code": 0, "flag": 1, "language": "JAVA", "opaque": 3, "serializeTypeCurrentRPC": "JSON",
                      "version": 0, "extFields": {"offset": "12"}}
    assert frame[8 + (info & 0xFFFFFF):] == b"b"


@pytest.mark.parametrize("length", [-1, -(1 << 31), 0, 3, MAX_FRAME - 3, (1 << 31) - 1])
def test_frame_lengths_the_broker_refuses(length: int) -> None:
    with pytest.raises(BadFrameError):
        frame_length(struct.pack(">i", length))


def test_frame_lengths_the_broker_accepts() -> None:
    assert frame_length(struct.pack(">i", 4)) == 4
    assert frame_length(struct.pack(">i", MAX_FRAME - 4)) == MAX_FRAME - 4


@pytest.mark.parametrize("frame", [
    b"",  # no header-info field
    struct.pack(">i", 100) + b"{}",  # header length past the frame
    struct.pack(">i", (2 << 24) | 2) + b"{}",  # serialize type 2
    struct.pack(">i", 5) + b"{code",  # broken JSON
    struct.pack(">i", 2) + b"[]",  # not an object
    struct.pack(">i", 2) + b"{}",  # no code
    struct.pack(">i", 12) + b'{"code":"x"}',
    struct.pack(">i", 20) + b'{"code":1,"flag":1.5}',
    struct.pack(">i", 23) + b'{"code":1,"opaque":1e99}',
    struct.pack(">i", 30) + b'{"code":1,"extFields":{"a":[]}}',
    struct.pack(">i", 3) + b"\xff\xfe\x00",  # not UTF-8
    struct.pack(">i", (1 << 24) | 5) + b"\x00\x0b\x00\x00\x00",  # binary header cut short
], ids=lambda f: f.hex()[:24])
def test_frames_that_cannot_be_decoded(frame: bytes) -> None:
    with pytest.raises(BadFrameError):
        decode(frame)


def test_binary_ext_fields_longer_than_the_header_are_refused() -> None:
    good = java_binary_frame(11, 0, 0, 1, 0, None, {"a": "b"})
    head = bytearray(good)
    struct.pack_into(">i", head, 4 + 13 + 4, 1000)  # the extFields length
    with pytest.raises(BadFrameError):
        decode(bytes(head))
    struct.pack_into(">i", head, 4 + 13 + 4, 4)  # ends inside the first entry
    with pytest.raises(BadFrameError):
        decode(bytes(head))


def test_binary_strings_that_are_not_utf8_or_overrun_are_refused() -> None:
    bad_remark = struct.pack(">hbhii", 11, 0, 0, 1, 0) + struct.pack(">i", 2) + b"\xff\xff" + struct.pack(">i", 0)
    with pytest.raises(BadFrameError):
        decode(struct.pack(">i", (1 << 24) | len(bad_remark)) + bad_remark)
    negative = struct.pack(">hbhii", 11, 0, 0, 1, 0) + struct.pack(">i", -3) + struct.pack(">i", 0)
    with pytest.raises(BadFrameError):
        decode(struct.pack(">i", (1 << 24) | len(negative)) + negative)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_any_bytes_decode_or_raise_bad_frame(data: bytes) -> None:
    try:
        cmd = decode(data)
    except BadFrameError:
        return
    assert isinstance(cmd, Command) and all(isinstance(v, str) for v in cmd.ext.values())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([JSON, ROCKETMQ]), st.binary(max_size=200), st.integers(0, 0xFFFFFF))
def test_fuzz_headers_of_either_type_decode_or_raise_bad_frame(kind: int, header: bytes, hlen: int) -> None:
    try:
        decode(struct.pack(">i", (kind << 24) | hlen) + header)
    except BadFrameError:
        pass


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from([JSON, ROCKETMQ]), code=st.integers(-32768, 32767), opaque=st.integers(-(1 << 31),
       (1 << 31) - 1), flag=st.integers(0, 3), remark=st.none() | _text.filter(bool),
       ext=st.dictionaries(_text.filter(bool), _text.filter(bool), max_size=5), body=st.binary(max_size=50))
def test_encode_then_decode_is_the_same_command(kind: int, code: int, opaque: int, flag: int, remark: str | None,
                                                ext: dict[str, str], body: bytes) -> None:
    cmd = Command(code=code, opaque=opaque, flag=flag, remark=remark, ext=ext, body=body, serialize=kind)
    frame = encode(cmd)
    assert frame_length(frame[:4]) == len(frame) - 4
    assert decode(frame[4:]) == cmd
