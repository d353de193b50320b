"""Segment buffers start at a page (dispatcher/segment.py ``fit``, the
compiled ``realign`` of tiered/_native.c), so a file:// store can
write them around the page cache (O_DIRECT): from the pool, through the
pass's reserve/buffer/extend and the v2 tail appended in place. Alignment
never changes a byte: the same segments come out of unaligned buffers, and
of the Python fallback."""

from __future__ import annotations

import fcntl
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.dispatcher import segment
from tiered.dispatcher.segment import ALIGN, SEGMENT_BUFFERS, BufferPool, SegmentBuilder, fit
from tiered.archive import segmeta
from tiered.archive.filewrite import DIRECT_MIN
from tiered.archive.storage import open_store
from tiered.format.batch import RecordBatch

from dispatchkit import direct_opens, extend_like_the_pass, props_batch
from nativekit import need_native

@pytest.fixture(autouse=True, scope="module")
def _aligned_buffers() -> None:
    need_native()  # realign: buffers start at a page only where the native core is built
    assert segment._realign is not None

PROPS = [b"KEYS\x01k%d a%d\x02UNIQ_KEY\x01u%d" % (i, i % 3, i) for i in range(40)]


def _address(buf: bytearray | bytes) -> int:
    return int(np.frombuffer(buf, np.uint8).ctypes.data) if len(buf) else 0


def _batch(record: int = 2000, first_offset: int = 0) -> RecordBatch:
    return props_batch([(bytes([i]) * (record + i), props) for i, props in enumerate(PROPS)], first_offset)


@pytest.fixture(autouse=True)
def _empty_pool():  # noqa: ANN202
    SEGMENT_BUFFERS.clear()
    yield
    SEGMENT_BUFFERS.clear()


def _pass_like(builder: SegmentBuilder, whole: RecordBatch) -> None:
    """What the CommitLog pass does: reserve once, copy records into
    ``buffer`` window by window, ``extend``."""
    builder.reserve(whole.nbytes, whole.count)
    extend_like_the_pass(builder, whole, [(0, 15), (15, whole.count)])


def _pack(builder: SegmentBuilder) -> bytes | bytearray:
    built = builder.build(1_700_000_000_000)
    desc = segmeta.Descriptor(cluster="c", broker="b", topic="T", queue_id=3, history="h", segment=built.segment)
    return segmeta.pack_v2(built.commitlog, built.consumequeue, built.index, desc, consume=True)


def test_the_pool_hands_out_page_aligned_buffers_and_reuses_them_in_place() -> None:
    pool = BufferPool(limit=4, max_bytes=64 << 20)
    for n in (ALIGN, ALIGN + 1, 5000, 1 << 16, (1 << 20) + 3, 16 << 20):
        buf = pool.take(n)
        assert len(buf) == n and _address(buf) % ALIGN == 0, n
    buf = pool.take(16 << 20)
    at = _address(buf)
    assert pool.give(buf, holders=1)
    del buf
    again = pool.take((16 << 20) - 12345)  # a little shorter: the same memory, its pages mapped already
    assert _address(again) == at and len(again) == (16 << 20) - 12345
    assert pool.give(again, holders=1)
    del again
    small = pool.take(1 << 20)  # under half of its allocation: CPython would move it, unaligned
    assert _address(small) % ALIGN == 0 and len(small) == 1 << 20
    assert pool.give(small, holders=1)
    del small
    big = pool.take(20 << 20)  # over its allocation
    assert _address(big) % ALIGN == 0 and len(big) == 20 << 20 and pool._idle == []


def test_a_buffer_given_back_unaligned_is_replaced_by_an_aligned_one() -> None:
    pool = BufferPool(limit=4, max_bytes=64 << 20)
    odd = bytearray(b"\xee" * ((1 << 20) + 1))
    del odd[:1]  # its start one byte further: not at a page, whatever malloc gave
    assert _address(odd) % ALIGN != 0
    assert pool.give(odd, holders=1)
    del odd
    buf = pool.take(1 << 20)
    assert _address(buf) % ALIGN == 0 and len(buf) == 1 << 20 and pool._idle == []


@pytest.mark.parametrize("record", [2000, 40_000])
def test_alignment_survives_reserve_buffer_extend_build_and_pack_v2(record: int, monkeypatch) -> None:  # noqa: ANN001
    whole = _batch(record)
    builder = SegmentBuilder("p", 0, 1000)
    _pass_like(builder, whole)
    at = _address(builder._cl)
    assert at % ALIGN == 0
    packed = _pack(builder)
    assert isinstance(packed, bytearray) and _address(packed) == at  # the tail appended in place
    assert (len(packed) >= DIRECT_MIN) == (record > 20_000)
    # unaligned buffers, grown by grow's Python path: the very same object
    monkeypatch.setattr(segment, "_realign", None)
    SEGMENT_BUFFERS.clear()
    plain = SegmentBuilder("p", 0, 1000)
    _pass_like(plain, whole)
    assert bytes(_pack(plain)) == bytes(packed)


def test_a_builder_growing_past_its_reservation_stays_aligned_with_its_bytes() -> None:
    expected = SegmentBuilder("p", 0, 1000)
    expected.add(_batch(30_000))
    want = bytes(expected.build(5).commitlog)
    builder = SegmentBuilder("p", 0, 1000)
    builder.reserve(5000)  # far short: grown again and again while adding
    first = _address(builder._cl)
    builder.add(_batch(30_000))
    assert _address(builder._cl) % ALIGN == 0 and _address(builder._cl) != first
    got = builder.build(5).commitlog
    assert bytes(got) == want and _address(got) % ALIGN == 0


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * ALIGN + 7), min_size=1, max_size=8))
def test_fit_keeps_the_same_bytes_compiled_or_not(sizes: list[int]) -> None:
    """``fit`` decides lengths and kept bytes the same with or without the
    compiled ``realign``; only where the bytes sit differs."""
    results = []
    for native in (segment._realign, None):
        saved, segment._realign = segment._realign, native
        try:
            buf, seen = bytearray(), []
            for i, n in enumerate(sizes):
                buf = fit(buf, n)
                kept = min(n, len(seen[-1]) if seen else 0)
                assert len(buf) == n and bytes(buf[:kept]) == (seen[-1][:kept] if seen else b"")
                buf[:] = bytes([i % 251 + 1]) * n  # what the builder copies in
                seen.append(bytes(buf))
                if native is not None and n >= ALIGN:
                    assert _address(buf) % ALIGN == 0
            results.append(seen)
        finally:
            segment._realign = saved
    assert results[0] == results[1]


def test_realign_refuses_what_grow_refuses() -> None:
    realign = segment._realign
    assert realign is not None
    buf = bytearray(b"records")
    view = memoryview(buf)
    with pytest.raises(BufferError):  # a view of it would point at freed memory
        realign(buf, 1 << 20, 7, ALIGN)
    view.release()
    with pytest.raises(ValueError, match="power of two"):
        realign(buf, 10, 0, 3000)
    with pytest.raises(ValueError, match="keep 8 bytes of 7"):
        realign(buf, 10, 8, ALIGN)
    with pytest.raises(TypeError):
        realign(b"bytes", 10, 0, ALIGN)
    grown = realign(buf, 1 << 20, 7, ALIGN)
    assert grown[:7] == b"records" and len(grown) == 1 << 20 and _address(grown) % ALIGN == 0


def test_a_buffer_in_a_direct_write_cannot_be_given_back(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The pool takes a buffer back only when nothing but its known holders
    refers to it: while the store writes it with O_DIRECT (the kernel reading
    its pages), the store's own references keep it out, so no next segment
    can be copied into pages still being written."""
    pool = BufferPool(limit=4, max_bytes=64 << 20)
    buf = pool.take(2 * DIRECT_MIN + 5)
    buf[:] = os.urandom(len(buf))
    want = bytes(buf)
    real = os.write
    in_flight: list[bool] = []

    def write(fd: int, data) -> int:  # noqa: ANN001
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            in_flight.append(pool.give(buf, holders=1))  # the test's own name: the only one it knows of
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    store = open_store(f"file://{tmp_path}")
    store.put("T/0/obj", buf)
    assert in_flight == [False] and pool._idle == []
    assert store.get("T/0/obj") == want
    assert pool.give(buf, holders=1)  # the write is over: now it may serve a next segment


def test_a_round_writes_the_same_objects_with_and_without_direct_writes(tmp_path, clock, monkeypatch) -> None:  # noqa: ANN001
    from dispatchkit import BROKER, CLUSTER, assert_exact, new_dispatcher, new_writer, produce
    from tiered.archive.manifest import IDENTITY
    from tiered.archive.storage import FileStore
    from tiered.store.localstore import LocalStore

    queues = [("T", 0), ("T", 1), ("U", 0)]
    sd = tmp_path / "store"
    with new_writer(sd, commitlog_file_size=1 << 20) as w:
        for i in range(12):
            for q in queues:
                produce(w, *q, 20, clock=clock, body_size=5000, seed=i)
    clock.advance(1)
    direct = direct_opens(monkeypatch)
    objects = {}
    for name, on in (("direct", True), ("cached", False)):
        store, local = FileStore(str(tmp_path / name), direct=on), LocalStore(sd)
        if not on:  # the same bucket identity, so the same history ids in the descriptors
            store.put(f"{CLUSTER}/{BROKER}/{IDENTITY}", (tmp_path / "direct" / CLUSTER / BROKER / IDENTITY).read_bytes())
        d = new_dispatcher(store, local, tmp_path / f"state-{name}", clock, upload_bytes=1, max_delay_ms=0,
                           segment_bytes=1 << 20, layout=2, parallelism=2)
        result = d.run_round()
        assert not result.errors and result.segments >= 6
        assert assert_exact(store, local, queues) == {q: 240 for q in queues}
        objects[name] = {o.key: store.get(o.key) for o in store.list_keys() if "/segment" in o.key}
        assert store.leftovers() == []
    big = [k for k, v in objects["direct"].items() if len(v) >= DIRECT_MIN]
    assert len(big) >= 3 and len(direct) >= len(big)  # those went around the page cache, the rest through it
    assert all(str(tmp_path / "direct") in p for p in direct)
    assert objects["direct"] == objects["cached"]  # byte for byte, every segment object
