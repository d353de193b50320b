"""Segment buffers start at a page (tiered/format/segbuffer.py, mapped
memory), so a file:// store can write them around the page cache
(O_DIRECT): from the pool, through the pass's reserve/buffer/extend and
the v2 tail appended in place. Where the bytes sit never changes a byte:
the same segments come out of the pass's path and of ``add``'s."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tiered.dispatcher.segment import ALIGN, SEGMENT_BUFFERS, BufferPool, SegmentBuilder
from tiered.archive import segmeta
from tiered.archive.filewrite import DIRECT_MIN
from tiered.format.batch import RecordBatch
from tiered.format.segbuffer import SegmentBuffer

from dispatchkit import direct_opens, extend_like_the_pass, props_batch

PROPS = [b"KEYS\x01k%d a%d\x02UNIQ_KEY\x01u%d" % (i, i % 3, i) for i in range(40)]


def _address(buf: SegmentBuffer | bytes) -> int:
    return int(np.frombuffer(buf, np.uint8).ctypes.data)


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


def _pack(builder: SegmentBuilder) -> bytes | SegmentBuffer:
    built = builder.build(1_700_000_000_000)
    desc = segmeta.Descriptor(cluster="c", broker="b", topic="T", queue_id=3, history="h", segment=built.segment)
    return segmeta.pack_v2(built.commitlog, built.consumequeue, built.index, desc, consume=True)


def test_the_pool_hands_out_page_aligned_buffers_and_reuses_them_in_place() -> None:
    pool = BufferPool(limit=4, max_bytes=64 << 20)
    for n in (1, ALIGN, ALIGN + 1, 5000, 1 << 16, (1 << 20) + 3, 16 << 20):
        buf = pool.take(n)
        assert isinstance(buf, SegmentBuffer) and len(buf) == n and _address(buf) % ALIGN == 0, n
    buf = pool.take(16 << 20)
    at = _address(buf)
    assert pool.give(buf)
    again = pool.take((16 << 20) - 12345)  # a little shorter: the same memory, its pages mapped already
    assert again is buf and _address(again) == at and len(again) == (16 << 20) - 12345
    assert pool.give(again)
    big = pool.take(20 << 20)  # longer: the same buffer, remapped, still at a page
    assert big is buf and _address(big) % ALIGN == 0 and len(big) == 20 << 20 and pool._idle == []


@pytest.mark.parametrize("record", [2000, 40_000])
def test_alignment_survives_reserve_buffer_extend_build_and_pack_v2(record: int) -> None:
    whole = _batch(record)
    builder = SegmentBuilder("p", 0, 1000)
    _pass_like(builder, whole)
    buf = builder._cl
    assert isinstance(buf, SegmentBuffer) and _address(buf) % ALIGN == 0
    packed = _pack(builder)
    assert packed is buf and _address(packed) % ALIGN == 0  # the tail appended to the records' buffer
    assert (len(packed) >= DIRECT_MIN) == (record > 20_000)
    plain = SegmentBuilder("p", 0, 1000)
    plain.add(whole)  # no reservation: grown as it goes
    assert bytes(_pack(plain)) == bytes(packed)


def test_a_builder_growing_past_its_reservation_stays_aligned_with_its_bytes() -> None:
    expected = SegmentBuilder("p", 0, 1000)
    expected.add(_batch(30_000))
    want = bytes(expected.build(5).commitlog)
    builder = SegmentBuilder("p", 0, 1000)
    builder.reserve(5000)  # far short: grown again and again while adding
    builder.add(_batch(30_000))
    assert _address(builder._cl) % ALIGN == 0 and len(builder._cl) > 5000
    got = builder.build(5).commitlog
    assert isinstance(got, SegmentBuffer) and bytes(got) == want and _address(got) % ALIGN == 0


def test_a_round_gives_each_buffer_back_only_once_its_put_returned(tmp_path, clock, monkeypatch) -> None:  # noqa: ANN001
    """The upload is a buffer's last holder: it gives it back after the
    store has written it (with O_DIRECT, the kernel reading its pages), never
    while the write is on, so no next segment is copied into pages still
    being written."""
    from dispatchkit import assert_exact, new_dispatcher, new_writer, produce
    from tiered.archive.storage import FileStore
    from tiered.store.localstore import LocalStore

    queues = [("T", 0), ("T", 1)]
    sd = tmp_path / "store"
    with new_writer(sd, commitlog_file_size=1 << 20) as w:
        for i in range(8):
            for q in queues:
                produce(w, *q, 20, clock=clock, body_size=5000, seed=i)
    clock.advance(1)
    store = FileStore(str(tmp_path / "cold"), direct=True)
    writing = threading.local()
    events: list[tuple[str, bool]] = []
    real_put, real_give = store.put, SEGMENT_BUFFERS.give

    def put(key: str, data, **kw) -> None:  # noqa: ANN001
        writing.on = True
        try:
            real_put(key, data, **kw)
        finally:
            writing.on = False

    def give(buf: object) -> bool:
        events.append(("give", getattr(writing, "on", False)))
        return real_give(buf)

    monkeypatch.setattr(store, "put", put)
    monkeypatch.setattr(SEGMENT_BUFFERS, "give", give)
    direct = direct_opens(monkeypatch)
    d = new_dispatcher(store, LocalStore(sd), tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=1 << 20, layout=2, parallelism=2)
    result = d.run_round()
    assert not result.errors and result.segments >= 2 and direct
    assert len(events) == result.segments and not any(on for _e, on in events)  # each once, after its put
    assert assert_exact(store, LocalStore(sd), queues) == {q: 160 for q in queues}


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
