"""Key extraction for the index, on arrays: the same keys the codec reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.dispatcher.segment import SegmentBuilder
from tiered.format.codec import decode_properties
from tiered.errors import CorruptRecordError
from tiered.format.keyindex import batch_keys, lookup

from dispatchkit import props_batch

_NAMES = st.sampled_from(["KEYS", "UNIQ_KEY", "TAGS", "XKEYS", "KEYSX", "UNIQ_KEYS", "", "K", "k€ys"])
_VALUE = st.lists(st.sampled_from(list("ab  c\x01é€K") + ["KEYS", "UNIQ_KEY\x01x"]), max_size=8).map("".join)
_PROPS = st.lists(st.tuples(_NAMES, _VALUE), max_size=6)


def _expected(props: bytes) -> list[str]:
    """What Record.keys and Record.unique_key read, the index's definition."""
    parsed = decode_properties(props)
    keys = [k for k in parsed.get("KEYS", "").split(" ") if k]
    uniq = parsed.get("UNIQ_KEY")
    return keys + ([uniq] if uniq else [])


def _encode(items: list[tuple[str, str]], trailing: bool) -> bytes:
    text = "\x02".join(f"{k}\x01{v}" for k, v in items) + ("\x02" if trailing and items else "")
    return text.encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PROPS, st.booleans(), st.binary(max_size=20)), min_size=1, max_size=8))
def test_batch_keys_equal_what_the_codec_reads(records) -> None:  # noqa: ANN001
    raw = [(head, _encode(items, trailing)) for items, trailing, head in records]
    b = props_batch(raw)
    owners, blob, at, end = batch_keys(b.view, b.props_at, b.positions + b.sizes)
    got: list[list[str]] = [[] for _ in raw]
    for owner, a, e in zip(owners.tolist(), at.tolist(), end.tolist()):
        got[owner].append(blob[a:e].decode("utf-8"))
    assert [sorted(g) for g in got] == [sorted(_expected(props)) for _, props in raw]


def test_batch_keys_of_ordinary_records() -> None:
    raw = [(b"\x00" * 30, f"TAGS\x01t\x02KEYS\x01k{i} other\x02UNIQ_KEY\x01U{i:04d}\x02".encode()) for i in range(5)]
    b = props_batch(raw)
    owners, blob, at, end = batch_keys(b.view, b.props_at, b.positions + b.sizes)
    pairs = sorted((o, blob[a:e]) for o, a, e in zip(owners.tolist(), at.tolist(), end.tolist()))
    assert pairs == sorted([(i, f"k{i}".encode()) for i in range(5)] + [(i, b"other") for i in range(5)]
                           + [(i, f"U{i:04d}".encode()) for i in range(5)])


def test_properties_that_are_not_utf8_name_the_record_and_byte() -> None:
    raw = [(b"h" * 10, b"KEYS\x01a\x02"), (b"h" * 10, b"KEYS\x01ok\x02"), (b"h" * 10, b"KEYS\x01b\xff\x02")]
    batch = props_batch(raw, first_offset=7)
    with pytest.raises(CorruptRecordError) as exc:
        SegmentBuilder("p", 7, 0).add(batch)
    assert exc.value.source == "/store/commitlog/0"
    assert exc.value.offset == int(batch.props_at[2]) + len(b"KEYS\x01b")


def test_builder_keeps_the_records_before_corrupt_properties() -> None:
    raw = [(b"h" * 10, b"KEYS\x01a\x02"), (b"h" * 10, b"KEYS\x01b\x02"), (b"h" * 10, b"KEYS\x01\xc3(\x02")]
    builder = SegmentBuilder("p", 100, 0)
    with pytest.raises(CorruptRecordError):
        builder.add(props_batch(raw, first_offset=100))
    assert builder.count == 2
    built = builder.build(now_ms=1)
    assert bytes(built.commitlog) == b"".join(h + p for h, p in raw[:2])
    assert lookup(built.index, "a") == [100] and lookup(built.index, "b") == [101] and lookup(built.index, "c") == []


@pytest.mark.parametrize("reserve", [0, 10, 1 << 16])
def test_the_segment_holds_exactly_the_records_whatever_was_reserved(reserve: int) -> None:
    # room reserved and not filled is cut at build; a builder outgrowing it
    # (the per-queue read finishing what the pass began) keeps every byte
    first = props_batch([(b"head-%d|" % i, b"KEYS\x01k%d" % i) for i in range(3)])
    second = props_batch([(b"more-%d|" % i, b"UNIQ_KEY\x01u%d" % i) for i in range(4)], first_offset=3)
    b = SegmentBuilder("p", 0, 0, key_index=True, layout=2)
    b.reserve(reserve)
    b.add(first)
    b.add(second)
    want = bytes(first.view) + bytes(second.view)
    assert b.nbytes == len(want)
    built = b.build(0)
    assert bytes(built.commitlog) == want
    assert built.segment.nbytes == len(want) and built.segment.messages == 7


def test_a_v2_object_packed_in_place_is_the_one_packed_by_copy() -> None:
    from tiered.archive import segmeta

    b = SegmentBuilder("p", 0, 0, key_index=True, layout=2)
    b.add(props_batch([(b"head-%d|" % i, b"KEYS\x01k%d" % i) for i in range(5)]))
    built = b.build(0)
    desc = segmeta.Descriptor(cluster="C", broker="b", topic="T", queue_id=0, history="h", segment=built.segment)
    copied = segmeta.pack_v2(bytes(built.commitlog), built.consumequeue, built.index, desc)
    records = built.commitlog
    packed = segmeta.pack_v2(records, built.consumequeue, built.index, desc, consume=True)
    assert packed is records and bytes(packed) == copied  # no copy of the records, the same bytes
    assert segmeta.parse(packed, "obj").segment == built.segment
    with pytest.raises(ValueError, match="do not match"):  # given up and grown: not a segment's records any more
        segmeta.pack_v2(records, built.consumequeue, built.index, desc, consume=True)
