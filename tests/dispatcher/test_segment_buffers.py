"""Segment buffers: mapped without zeroing, with room for the v2 tail,
and reused after their upload, given back once by their last holder
(dispatcher/segment.py BufferPool, tiered/format/segbuffer.py). None of it
may change a byte of what is archived."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.dispatcher.segment import SEGMENT_BUFFERS, BufferPool, SegmentBuilder
from tiered.archive import segmeta
from tiered.format.batch import RecordBatch
from tiered.format.keyindex import lookup
from tiered.format.segbuffer import SegmentBuffer

from dispatchkit import extend_like_the_pass, props_batch

PROPS = [b"KEYS\x01k%d a%d\x02UNIQ_KEY\x01u%d" % (i, i % 3, i) for i in range(40)]


def _batch(first_offset: int = 0) -> RecordBatch:
    # records far bigger than the tail reserved behind them, as in a real segment
    return props_batch([(bytes([i]) * (2000 + i), props) for i, props in enumerate(PROPS)], first_offset)


def _packed(builder: SegmentBuilder) -> SegmentBuffer:
    built = builder.build(1_700_000_000_000)
    desc = segmeta.Descriptor(cluster="c", broker="b", topic="T", queue_id=3, history="h", segment=built.segment)
    packed = segmeta.pack_v2(built.commitlog, built.consumequeue, built.index, desc, consume=True)
    assert isinstance(packed, SegmentBuffer) and packed is built.commitlog  # the tail appended to it
    return packed


def _reserved(key_index: bool = True) -> SegmentBuilder:
    b = _batch()
    builder = SegmentBuilder("p", 0, 1000, key_index=key_index)
    builder.reserve(b.nbytes, b.count)
    builder.add(b)
    return builder


@pytest.fixture(autouse=True)
def _empty_pool():  # noqa: ANN202
    SEGMENT_BUFFERS.clear()  # nothing another test gave back decides what these see
    yield
    SEGMENT_BUFFERS.clear()


def test_a_reserved_segment_packs_in_place_into_the_same_bytes() -> None:
    fresh = SegmentBuilder("p", 0, 1000)
    fresh.add(_batch())  # grown as it goes, no reservation
    expected = bytes(_packed(fresh))
    builder = _reserved()
    reserved = builder._cl
    assert isinstance(reserved, SegmentBuffer) and len(reserved) > builder.nbytes
    packed = _packed(builder)
    assert packed is reserved  # entries, index and descriptor appended to the records' own buffer
    assert bytes(packed) == expected
    records = b"".join(bytes(_batch().view[p:p + s]) for p, s in zip(_batch().positions, _batch().sizes))
    assert packed[:len(records)] == records


def test_a_reused_buffer_full_of_old_bytes_builds_the_same_segment() -> None:
    expected = bytes(_packed(_reserved()))
    junk = SegmentBuffer(1 << 16)
    junk[:] = b"\xee" * len(junk)
    assert SEGMENT_BUFFERS.give(junk)
    builder = _reserved()
    assert len(SEGMENT_BUFFERS._idle) == 0  # the pass took it
    assert bytes(_packed(builder)) == expected
    built = _reserved().build(0)
    assert built.index is not None and lookup(built.index, "u7") == [7] and lookup(built.index, "a1") == list(
        range(1, 40, 3))


def test_take_gives_exactly_the_bytes_asked_whatever_was_given_back() -> None:
    pool = BufferPool(limit=2, max_bytes=1 << 20)
    big = SegmentBuffer(5000)
    assert pool.give(big)
    assert pool.take(100) is big and len(big) == 100  # shrunk to what is asked
    assert len(pool.take(7000)) == 7000  # none left: a fresh one
    assert pool._idle == []


def test_a_buffer_is_given_back_once_by_its_last_holder() -> None:
    pool = BufferPool(limit=4, max_bytes=1 << 20)
    buf = SegmentBuffer(10)
    assert pool.give(buf)
    with pytest.raises(ValueError, match="given back twice"):
        pool.give(buf)  # two holders of one buffer would copy two segments into it
    assert pool._idle == [buf]
    assert not pool.give(b"immutable") and not pool.give(bytearray(10))  # not segment buffers: left to the GC
    assert pool.take(10) is buf and pool._idle == []
    assert pool.give(buf)  # taken, then given back again by its new holder


def test_a_view_held_past_the_give_keeps_that_buffer_from_the_next_segments() -> None:
    """A view of a buffer given back (one a failed request's traceback
    holds) must never see a next segment's bytes: the mapping refuses to
    resize under it, and ``take`` hands out a fresh buffer instead."""
    pool = BufferPool(limit=4, max_bytes=1 << 20)
    buf = SegmentBuffer(10)
    buf[:] = b"0123456789"
    view = memoryview(buf)
    assert pool.give(buf)
    fresh = pool.take(10)
    assert fresh is not buf and len(fresh) == 10 and pool._idle == []
    fresh[:] = b"x" * 10
    assert view.tobytes() == b"0123456789"


def test_the_pool_is_bounded_in_count_and_bytes() -> None:
    pool = BufferPool(limit=2, max_bytes=100)
    a, b, c, d, e = (SegmentBuffer(n) for n in (101, 60, 41, 40, 1))
    assert not pool.give(a)  # over the bytes alone
    assert pool.give(b)
    assert not pool.give(c)  # 101 bytes would be idle
    assert pool.give(d)
    assert not pool.give(e)  # a third buffer
    assert sorted(len(x) for x in pool._idle) == [40, 60]


def test_a_round_gives_its_uploaded_buffers_back_and_stays_exact(tmp_path, clock, monkeypatch) -> None:  # noqa: ANN001
    from dispatchkit import assert_exact, new_dispatcher, new_writer, produce
    from tiered.archive.storage import open_store
    from tiered.store.localstore import LocalStore

    queues = [("T", 0), ("T", 1), ("U", 0)]
    sd = tmp_path / "store"
    with new_writer(sd) as w:
        for i in range(40):
            for q in queues:
                produce(w, *q, 1, clock=clock, body_size=200, seed=i)
    clock.advance(1)
    store, local = open_store(f"file://{tmp_path / 'cold'}"), LocalStore(sd)
    taken: list[bool] = []  # whether each segment's buffer was one given back
    caps: list[int] = []  # the pool's cap while the round ran
    real_take = SEGMENT_BUFFERS.take

    def take(nbytes: int) -> SegmentBuffer:
        taken.append(bool(SEGMENT_BUFFERS._idle))
        caps.append(SEGMENT_BUFFERS.max_bytes)
        return real_take(nbytes)

    monkeypatch.setattr(SEGMENT_BUFFERS, "take", take)
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, segment_bytes=2000,
                       layout=2, parallelism=2)
    result = d.run_round()
    assert not result.errors and result.segments >= 12
    # every uploaded segment's buffer came back: the later segments were built in them
    assert any(taken[2:]) and not taken[0]
    assert set(caps) == {2 * d.pass_budget} and d.pass_budget == 2 * 2000  # two waves, and a segment past each
    assert not SEGMENT_BUFFERS._idle  # nothing held once the round is over
    assert assert_exact(store, local, queues) == {q: 40 for q in queues}


def test_records_copied_into_buffer_and_extended_build_what_add_builds() -> None:
    """The CommitLog pass copies a window's records into each builder's
    ``buffer`` itself, then ``extend``s it with their arrays and keys: the
    same segment, byte for byte, as ``add``."""

    whole = _batch()
    expected = SegmentBuilder("p", 0, 1000)
    expected.add(whole)
    builder = SegmentBuilder("p", 0, 1000)
    sizes = whole.sizes
    extend_like_the_pass(builder, whole, [(0, 2), (2, whole.count)])  # two windows
    assert builder.count == expected.count and builder.nbytes == expected.nbytes
    got, want = builder.build(5), expected.build(5)
    assert got.segment == want.segment and bytes(got.commitlog) == bytes(want.commitlog)
    assert got.consumequeue == want.consumequeue and got.index == want.index
    with pytest.raises(ValueError, match="extend 0 to 7"):
        SegmentBuilder("p", 0, 0).extend(7, sizes[:1], whole.tags[:1], whole.store_ms[:1], whole.born_ms[:1], None,
                                          None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5)), min_size=1, max_size=8), st.integers(0, 3))
def test_extend_many_hands_each_builder_what_extend_hands_it(rounds, gap):
    """Many builders given their records in one ``extend_many`` call (rows of
    shared arrays, with rows of no builder between them), round after round,
    hold exactly what one ``extend`` each gives them."""
    import numpy as np

    from tiered.dispatcher.segment import ragged

    whole = _batch()
    n = len(rounds)
    one, many = [SegmentBuilder("p", 0, 1000) for _ in range(n)], [SegmentBuilder("p", 0, 1000) for _ in range(n)]
    for step in range(2):
        # builder i takes the next counts[i] records of the batch (its own copy of them)
        counts = np.array([(c + step) % 6 for c, _k in rounds], np.int64)
        los = np.cumsum(counts + gap) - counts - gap  # rows of no builder between them
        rows = ragged(los, counts)
        table = {f: np.zeros(int(los[-1] + counts[-1]) + gap, np.int64) for f in ("sizes", "tags", "store", "born")}
        picks = np.arange(len(rows)) % whole.count
        for f, src in (("sizes", whole.sizes), ("tags", whole.tags), ("store", whole.store_ms),
                       ("born", whole.born_ms)):
            table[f][rows] = src[picks]
        keys = [np.arange(k, dtype=np.int64) + i for i, (_c, k) in enumerate(rounds)]
        hashes = [np.arange(k, dtype=np.uint64) * 7 + i for i, (_c, k) in enumerate(rounds)]
        ends = []
        for i, (b1, b2) in enumerate(zip(one, many)):
            lo, hi = int(los[i]), int(los[i] + counts[i])
            end = b1.nbytes + int(table["sizes"][lo:hi].sum())
            b1.buffer(end)
            b1.extend(end, table["sizes"][lo:hi], table["tags"][lo:hi], table["store"][lo:hi], table["born"][lo:hi],
                      keys[i], hashes[i])
            b2.buffer(end)
            ends.append(end)
        key_bounds = np.concatenate(([0], np.cumsum([len(k) for k in keys])))
        SegmentBuilder.extend_many(many, np.array(ends, np.int64), table["sizes"], table["tags"], table["store"],
                                   table["born"], los, los + counts, np.concatenate(keys), np.concatenate(hashes),
                                   key_bounds)
    for b1, b2 in zip(one, many):
        assert (b1.count, b1.nbytes) == (b2.count, b2.nbytes)
        for f in ("_sizes", "_tags", "_store", "_born", "_key_offsets", "_key_hashes"):
            got, want = getattr(b2, f), getattr(b1, f)
            assert [a.tolist() for a in got if len(a)] == [a.tolist() for a in want if len(a)], f


def test_extend_many_checks_every_builder_before_it_changes_one() -> None:
    import numpy as np

    builders = [SegmentBuilder("p", 0, 0) for _ in range(3)]
    sizes = np.array([5, 6, 7], np.int64)
    for b in builders:
        b.buffer(20)
    no_keys = np.zeros(0, np.int64)
    with pytest.raises(ValueError, match="builder 2: records of 7 bytes extend 0 to 8"):
        SegmentBuilder.extend_many(builders, np.array([5, 6, 8], np.int64), sizes, sizes, sizes, sizes,
                                   np.arange(3), np.arange(1, 4), no_keys, no_keys.astype(np.uint64),
                                   np.zeros(4, np.int64))
    assert [b.count for b in builders] == [0, 0, 0] and [b.nbytes for b in builders] == [0, 0, 0]
    with pytest.raises(ValueError, match="3 builders"):
        SegmentBuilder.extend_many(builders, np.array([5, 6], np.int64), sizes, sizes, sizes, sizes,
                                   np.arange(3), np.arange(1, 4), no_keys, no_keys.astype(np.uint64),
                                   np.zeros(4, np.int64))
