"""Inner-batch bodies (MessageDecoder.encodeMessage runs): decoded exactly,
and every malformed one a typed error naming the source and byte offset."""

from __future__ import annotations

import struct

import pytest

from tiered.errors import CorruptRecordError
from tiered.format.codec import Host, Message, decode_record, encode_record
from tiered.format.innerbatch import batch_size, decode_inner, inner_records, unwrap
from tiered.store.batchwriter import InnerDraft, encode_inner

DRAFTS = [InnerDraft(body=b"first", properties={"KEYS": "a b", "TAGS": "t", "EMPTY": ""}, flag=7),
          InnerDraft(body=b"", properties={"UNIQ_KEY": "U2"})]


def test_decode_as_rocketmq() -> None:
    raw = encode_inner(DRAFTS)
    assert struct.unpack_from(">iiiii", raw, 0) == (20 + 5 + 2 + len("KEYS\x01a b\x02TAGS\x01t\x02EMPTY\x01\x02"),
                                                     0, 0, 7, 5)
    msgs = decode_inner(raw, 40, "obj", 100)
    # string2messageProperties drops an empty value
    assert [(m.index, m.queue_offset, m.flag, m.body, m.properties, m.msg_id) for m in msgs] == [
        (0, 40, 7, b"first", {"KEYS": "a b", "TAGS": "t"}, None), (1, 41, 0, b"", {"UNIQ_KEY": "U2"}, "U2")]


@pytest.mark.parametrize(("cut", "at", "why"), [
    (lambda raw: raw[:10], 100, "header cut off"),
    (lambda raw: struct.pack(">i", 999) + raw[4:], 100, "inner message size 999"),
    (lambda raw: raw[:16] + struct.pack(">i", 10_000) + raw[20:], 100, "body length 10000"),
])
def test_malformed_bodies_name_source_and_offset(cut, at: int, why: str) -> None:  # noqa: ANN001
    with pytest.raises(CorruptRecordError) as info:
        decode_inner(cut(encode_inner(DRAFTS)), 0, "obj", 100)
    assert (info.value.source, info.value.offset) == ("obj", at) and why in info.value.reason


def _record(num: str) -> bytes:
    return encode_record(Message(topic="T", queue_id=1, body=encode_inner(DRAFTS), sys_flag=0xC0, queue_offset=9,
                                 properties={"INNER_NUM": num, "INNER_BASE": "9"}, born_host=Host("::1", 5),
                                 store_timestamp=123, physical_offset=5000))


def test_records_of_each_message_and_inner_num_checked() -> None:
    rec = decode_record(memoryview(_record("2")), 0, "cl")
    assert batch_size(rec) == 2 and [m.queue_offset for m in unwrap(rec)] == [9, 10]
    made = inner_records(rec)
    assert [(r.queue_offset, r.physical_offset, r.store_timestamp, str(r.born_host), r.flag, r.properties,
             r.body_bytes()) for r in made] == [
        (9, 5000, 123, str(Host("::1", 5)), 7, {"KEYS": "a b", "TAGS": "t"}, b"first"),
        (10, 5000, 123, str(Host("::1", 5)), 0, {"UNIQ_KEY": "U2"}, b"")]
    with pytest.raises(CorruptRecordError, match="holds 2 messages, INNER_NUM says 3"):
        unwrap(decode_record(memoryview(_record("3")), 0, "cl"))
    with pytest.raises(CorruptRecordError, match="INNER_NUM 'x' is not a number"):
        batch_size(decode_record(memoryview(_record("x")), 0, "cl"))
