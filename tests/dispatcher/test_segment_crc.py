"""The segment's CRC-32 (``Segment.commitlog_crc``, and the v2 object's
upload checksum continued from it) kept by ``SegmentBuilder`` as records
come in, not computed by reading the whole segment again at the build:
given by the CommitLog pass with each ``extend`` (computed as it copied),
continued over whatever ``add`` copied since. Every way and mix of ways
records come in builds the CRC-32 zlib-ng computes over the final bytes."""

from __future__ import annotations

import numpy as np
import pytest
from zlib_ng.zlib_ng import crc32

from tiered.dispatcher.segment import SegmentBuilder
from tiered.errors import CorruptRecordError
from tiered.format.batch import RecordBatch
from tiered.format.keyindex import record_key_hashes

from dispatchkit import props_batch

PROPS = [b"KEYS\x01k%d\x02UNIQ_KEY\x01u%d" % (i, i) for i in range(12)]


def _batch(first: int, count: int, *, spoil: int | None = None) -> RecordBatch:
    records = [(bytes([first + i]) * (300 + 7 * (first + i)), PROPS[(first + i) % len(PROPS)]) for i in range(count)]
    if spoil is not None:  # properties that are not UTF-8: ``add`` keeps the records before it
        head, props = records[spoil]
        records[spoil] = (head, props[:6] + b"\xff" + props[7:])
    return props_batch(records, first)


def _extend(builder: SegmentBuilder, batch: RecordBatch, *, crc: bool) -> None:
    """As the CommitLog pass does: the records copied into ``buffer`` by the
    caller, then ``extend``, with the CRC-32 continued over the copy when
    ``crc`` (the pass's), else without one."""
    at = builder.nbytes
    end = at + batch.nbytes
    buf = builder.buffer(end)
    running = builder.crc() if crc else 0
    for p, n in zip(batch.positions.tolist(), batch.sizes.tolist()):
        buf[at:at + n] = batch.view[p:p + n]
        running = crc32(batch.view[p:p + n], running)
        at += n
    owners, hashes = record_key_hashes(batch.view, batch.props_at, batch.positions + batch.sizes)
    builder.extend(end, batch.sizes, batch.tags, batch.store_ms, batch.born_ms, owners + batch.first_offset, hashes,
                   crc=running if crc else None)


@pytest.mark.parametrize("ways", [
    "a", "e", "E", "eeee", "aaa", "eaea", "aeae", "eEa", "aEe", "EEa", "eae!", "e!",
])
def test_every_way_and_mix_of_ways_builds_the_crc_of_the_final_bytes(ways: str) -> None:
    """a: ``add``; e: the pass's copy and ``extend`` with its CRC; E:
    ``extend`` without one; !: an ``add`` stopped by properties that are not
    UTF-8 (the records before them kept, the bytes copied after them not
    the segment's). The buffer comes from the pool, full of an earlier
    segment's bytes: only the bytes counted may be in the CRC."""
    builder = SegmentBuilder("p", 0, 1000)
    builder.reserve(64 << 10)
    with memoryview(builder.buffer(64 << 10)) as old:
        old[:] = b"\xab" * len(old)
    offset = 0
    for way in ways:
        batch = _batch(offset, 3, spoil=1 if way == "!" else None)
        if way == "a":
            builder.add(batch)
        elif way == "!":
            with pytest.raises(CorruptRecordError, match="not valid UTF-8"):
                builder.add(batch)
            assert builder.count == offset + 1  # the record before it
        else:
            _extend(builder, batch, crc=way == "e")
        offset = builder.count
    expected = b"".join(bytes(batch.view[p:p + n]) for batch in [_batch(0, offset)]
                        for p, n in zip(batch.positions.tolist(), batch.sizes.tolist()))
    assert builder.crc() == crc32(expected)
    built = builder.build(5)
    assert bytes(built.commitlog) == expected
    assert built.segment.commitlog_crc == crc32(expected)
    # the same segment as one ``add`` of it all makes
    plain = SegmentBuilder("p", 0, 1000)
    plain.add(_batch(0, offset))
    assert plain.build(5).segment == built.segment


def test_a_crc_given_with_extend_is_the_segments_without_reading_it_again() -> None:
    """The build takes the CRC ``extend`` was given for the bytes it covers
    and reads only the bytes after them: a CRC given wrong (a copy changed
    behind the pass's back) reaches the manifest and the upload's checksum
    as given, where the store and every reader's check refuse it, rather
    than being silently recomputed over the changed bytes."""
    builder = SegmentBuilder("p", 0, 0)
    first = _batch(0, 4)
    _extend(builder, first, crc=True)
    right = builder.crc()
    builder.extend(builder.nbytes, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros(0, np.int64), None, None, crc=right ^ 1)
    second = _batch(4, 2)
    builder.add(second)
    tail = b"".join(bytes(second.view[p:p + n]) for p, n in zip(second.positions.tolist(), second.sizes.tolist()))
    assert builder.build(5).segment.commitlog_crc == crc32(tail, right ^ 1)
