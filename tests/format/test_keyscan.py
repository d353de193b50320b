"""The native core's key scan (tiered/_native_keys.c) against the numpy one.

Both answer ``record_key_hashes``: the keys a segment's key index holds
(each space-separated piece of a record's last KEYS value, and its last
UNIQ_KEY value), as (record index, version 2 key hash), in one order; or
BadProperties naming the first record whose properties are not UTF-8 and
the byte of them where the bad sequence starts. The numpy path is held to
the record decoder by tests/dispatcher/test_segment_keys.py; here the
compiled one is held to the numpy one, on generated properties of every
awkward kind, and the UTF-8 check to Python's own strict decoder.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.dispatcher.segment import SegmentBuilder
from tiered.errors import CorruptRecordError
from tiered.format import keyindex
from tiered.format.batch import RecordBatch
from tiered.format.codec import decode_properties
from tiered.format.keyindex import BadProperties, key_hash, record_key_hashes, record_key_hashes_numpy

from nativekit import need_native

pytestmark = pytest.mark.timeout(120)

# names that are, or look like, the two the index reads
NAMES = [b"KEYS", b"UNIQ_KEY", b"KEYSX", b"KEY", b"UNIQ", b"UNIQ_KEYS", b"TAGS", b"", b"xKEYS", b"keys"]
# every kind of byte sequence Python's strict decoder refuses
BAD_UTF8 = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xc2", b"\xe0\x80\xaf", b"\xe0\x9f\xbf", b"\xed\xa0\x80",
            b"\xed\xbf\xbf", b"\xe2\x82", b"\xe2", b"\xf0\x8f\xbf\xbf", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80",
            b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xc3\x28", b"\xe2\x28\xa1"]
GOOD_UTF8 = ["é", "€", "😀", "\U0010ffff", "\ud7ff", "\ue000", "\u0080", "\u07ff", "\u0800", "\U00010000"]

_text = st.text(st.sampled_from(list("ab Z09-_ ") + GOOD_UTF8 + ["\x01"]), max_size=90).map(str.encode)
_value = st.one_of(_text, st.sampled_from([b"", b" ", b"  ", b" a", b"a ", b"a  b", b"k" * 65, b"k " * 40, b"x" * 200]))
_prop = st.tuples(st.sampled_from(NAMES), _value)


@st.composite
def _properties(draw: st.DrawFn) -> bytes:
    """One record's properties: name \\x01 value \\x02 ..., the trailing
    \\x02 sometimes missing, sometimes a non-UTF-8 sequence inside."""
    raw = b"".join(name + b"\x01" + value + b"\x02" for name, value in draw(st.lists(_prop, max_size=6)))
    if raw and draw(st.booleans()):
        raw = raw[:-1]
    if draw(st.integers(0, 9)) == 0:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from(BAD_UTF8)) + raw[at:]
    return raw


def _layout(props: list[bytes], gaps: list[int]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The properties in one buffer, apart by filler bytes (records' other fields)."""
    buf, starts, ends = bytearray(), [], []
    for p, gap in zip(props, gaps):
        buf += bytes([0xFF, 2, 1, 0x20])[:gap % 5] * (gap // 5 + 1)
        starts.append(len(buf))
        buf += p
        ends.append(len(buf))
    buf += b"\xff\x02"
    return bytes(buf), np.array(starts, np.int64), np.array(ends, np.int64)


def _answer(fn, buf, starts, ends) -> tuple[object, ...]:  # noqa: ANN001
    try:
        owners, hashes = fn(buf, starts, ends)
    except BadProperties as bad:
        return ("bad", bad.record, bad.at)
    assert owners.dtype == np.int64 and hashes.dtype == np.uint64
    return ("ok", owners.tolist(), hashes.tolist())


def test_the_install_built_the_compiled_scan() -> None:
    # the extension is optional at build time: a silent build failure would
    # quietly fall back to the slower path, so the test environment says it
    core = need_native()
    assert keyindex._native is core
    assert core.key_hash(b"order-1") == key_hash("order-1")
    assert core.key_hash(b"") == key_hash("")


@settings(max_examples=600, deadline=2000)
@given(st.lists(st.tuples(_properties(), st.integers(0, 12)), max_size=12))
def test_compiled_and_numpy_find_the_same_keys(records: list[tuple[bytes, int]]) -> None:
    need_native()
    buf, starts, ends = _layout([p for p, _ in records], [g for _, g in records])
    native = _answer(record_key_hashes, buf, starts, ends)
    assert native == _answer(record_key_hashes_numpy, buf, starts, ends)
    # the same from a memoryview and a bytearray (a segment's buffer)
    assert native == _answer(record_key_hashes, memoryview(buf), starts, ends)
    assert native == _answer(record_key_hashes, bytearray(buf), starts, ends)


@settings(max_examples=600, deadline=2000)
@given(st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)), min_size=1, max_size=4))
def test_the_utf8_check_is_pythons_strict_decoder(props: list[bytes]) -> None:
    buf, starts, ends = _layout(props, [3] * len(props))
    expected: tuple[object, ...] | None = None
    for i, p in enumerate(props):
        try:
            p.decode("utf-8")
        except UnicodeDecodeError as exc:
            expected = ("bad", i, exc.start)
            break
    native = _answer(record_key_hashes, buf, starts, ends)
    if expected is None:
        assert native[0] == "ok"
    else:
        assert native == expected
    assert native == _answer(record_key_hashes_numpy, buf, starts, ends)


def test_keys_of_known_properties() -> None:
    props = [
        b"KEYS\x01a b  c\x02UNIQ_KEY\x01u1\x02xKEYS\x01no\x02KEYS\x01z",  # the last KEYS counts: only z
        b"UNIQ_KEY\x01\x02KEYS\x01 q ",  # an empty UNIQ_KEY is no key; spaces at the ends
        b"KEYSX\x01no\x02UNIQ_KEYS\x01no\x02TAGS\x01no",  # names that only start like the two
        b"",
        b"UNIQ_KEY\x01first\x02UNIQ_KEY\x01" + "é€😀".encode() + b"\x02KEYS\x01" + b"k" * 70,
    ]
    buf, starts, ends = _layout(props, [0, 4, 7, 2, 9])
    owners, hashes = record_key_hashes(buf, starts, ends)
    # KEYS pieces of all records first, then the UNIQ_KEY values
    assert owners.tolist() == [0, 1, 4, 0, 4]
    assert hashes.tolist() == [key_hash(k) for k in ("z", "q", "k" * 70, "u1", "é€😀")]


def test_the_first_bad_record_and_its_byte_are_named() -> None:
    props = [b"KEYS\x01ok", b"KEYS\x01a\xed\xa0\x80b", b"\xff"]
    buf, starts, ends = _layout(props, [0, 0, 0])
    with pytest.raises(BadProperties) as got:
        record_key_hashes(buf, starts, ends)
    assert (got.value.record, got.value.at) == (1, 6)
    owners, hashes = record_key_hashes(buf, starts[:1], ends[:1])
    assert owners.tolist() == [0] and hashes.tolist() == [key_hash("ok")]


def test_no_records_and_spans_outside_the_buffer() -> None:
    empty = np.zeros(0, np.int64)
    owners, hashes = record_key_hashes(b"", empty, empty)
    assert owners.tolist() == [] and hashes.tolist() == []
    with pytest.raises(ValueError, match="outside"):
        record_key_hashes(b"KEYS\x01a", np.array([0], np.int64), np.array([7], np.int64))
    with pytest.raises(ValueError, match="outside"):
        record_key_hashes(b"KEYS\x01a", np.array([3], np.int64), np.array([2], np.int64))
    with pytest.raises(ValueError, match="one length"):
        need_native().keys(b"KEYS\x01a", np.array([0], np.int64), np.array([6, 6], np.int64))


@settings(max_examples=300, deadline=2000)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["KEYS", "UNIQ_KEY", "KEYSX", "TAGS", ""]),
                                   st.text(st.sampled_from(list("ab  é€\x01")), max_size=12)), max_size=5),
                max_size=6))
def test_the_compiled_keys_are_the_ones_the_codec_reads(records: list[list[tuple[str, str]]]) -> None:
    # the index's definition: Record.keys and Record.unique_key, read by the record decoder
    props = ["\x02".join(f"{k}\x01{v}" for k, v in items).encode() for items in records]
    buf, starts, ends = _layout(props, [6] * len(props))
    owners, hashes = record_key_hashes(buf, starts, ends)
    got: list[list[int]] = [[] for _ in props]
    for owner, h in zip(owners.tolist(), hashes.tolist()):
        got[owner].append(h)
    want = []
    for p in props:
        parsed = decode_properties(p)
        keys = [k for k in parsed.get("KEYS", "").split(" ") if k] + [u for u in [parsed.get("UNIQ_KEY")] if u]
        want.append(sorted(key_hash(k) for k in keys))
    assert [sorted(g) for g in got] == want


def _segment(props: list[bytes]) -> tuple[int, bytes, bytes | None, str | None]:
    """(records kept, records' bytes, index, where the error was) of a segment built from records
    whose properties are ``props`` (behind 30 bytes of other fields)."""
    heads = [bytes([i]) * 30 for i in range(len(props))]
    raw = b"".join(h + p for h, p in zip(heads, props))
    sizes = np.array([len(h) + len(p) for h, p in zip(heads, props)], np.int64)
    positions = np.cumsum(sizes) - sizes
    n = len(props)
    batch = RecordBatch(first_offset=0, view=memoryview(raw), source="/store/commitlog/0", positions=positions,
                        sizes=sizes, tags=np.zeros(n, np.int64), store_ms=np.zeros(n, np.int64),
                        born_ms=np.zeros(n, np.int64), props_at=positions + 30)
    builder = SegmentBuilder("p", 0, 0, key_index=True, layout=2)
    error = None
    try:
        builder.add(batch)
    except CorruptRecordError as exc:
        error = f"{exc.source}@{exc.offset}"
    built = builder.build(now_ms=1)
    return builder.count, bytes(built.commitlog), built.index, error


def test_a_segment_is_byte_identical_with_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    need_native()
    props = [b"KEYS\x01a b  a\x02UNIQ_KEY\x01u0", b"", b"UNIQ_KEY\x01" + b"u" * 70 + b"\x02KEYS\x01 x ",
             b"TAGS\x01t\x02KEYS\x01" + "é€😀".encode(), b"KEYS\x01bad\xe0\x80\xaf", b"KEYS\x01after"]
    compiled = _segment(props)
    monkeypatch.setattr(keyindex, "_native", None)
    assert _segment(props) == compiled
    count, _records, index, error = compiled
    bad_at = 30 * 5 + sum(map(len, props[:4])) + len(b"KEYS\x01bad")  # in record 4's properties
    assert count == 4 and error == f"/store/commitlog/0@{bad_at}"
    assert index is not None and keyindex.lookup(index, "a") == [0] and keyindex.lookup(index, "é€😀") == [3]
    assert keyindex.lookup(index, "u" * 70) == [2] and keyindex.lookup(index, "after") == []


def _sequences() -> list[bytes]:
    """Every 1- and 2-byte sequence; 3 and 4 bytes with every lead byte and
    continuation bytes at each boundary of Unicode's table 3-7."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    out = [bytes([a]) for a in range(256)] + [bytes([a, b]) for a in range(256) for b in range(256)]
    out += [bytes([a, b, c]) for a in range(0xC0, 0x100) for b in edges for c in edges]
    out += [bytes([a, b, c, d]) for a in range(0xE0, 0x100) for b in edges for c in (0x80, 0xBF, 0x7F)
            for d in (0x80, 0xBF, 0xC0)]
    return out


def test_the_utf8_check_on_every_short_sequence() -> None:
    mismatched = []
    for seq in _sequences():
        for props in (b"KEYS\x01" + seq, b"KEYS\x01" + seq + b"z"):  # at the end, and followed by ASCII
            try:
                props.decode("utf-8")
                want = None
            except UnicodeDecodeError as exc:
                want = exc.start
            buf, starts, ends = _layout([b"KEYS\x01ok", props], [2, 3])
            try:
                record_key_hashes(buf, starts, ends)
                got = None
            except BadProperties as bad:
                got = bad.at if bad.record == 1 else -1
            if got != want:
                mismatched.append((props, got, want))
    assert mismatched == []
