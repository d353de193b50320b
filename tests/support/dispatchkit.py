"""Shared pieces of the dispatcher tests: a store producer, a dispatcher
built the tests' way, and an archive reader that is independent of
``tiered.ops.verify``. ``CountingRecorder`` (tests/support/counting.py) is
re-exported for the tests that take it from here."""

from __future__ import annotations

import os
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from counting import CountingRecorder  # noqa: F401 - re-exported

from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions, TopicFilter
from tiered.clock import ManualClock
from tiered.format.batch import RecordBatch
from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE, Host, decode_record
from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError
from tiered.archive.lease import LeaseManager
from tiered.store.localstore import LocalStore
from tiered.archive import layout, segmeta
from tiered.archive.manifest import MANIFEST, Manifest, Segment, queue_prefix
from tiered.archive.storage import ObjectStore
from tiered.store.storewriter import StoreWriter

CLUSTER = "TestCluster"
BROKER = "broker-a"


def produce(writer: StoreWriter, topic: str, queue_id: int, count: int, *, clock: ManualClock | None = None,
            body_size: int = 100, seed: int = 0, ipv6: bool = False) -> None:
    """``count`` messages with varied bodies, keys and tags."""
    import random

    rng = random.Random(hash((topic, queue_id, seed)) & 0xFFFFFFFF)
    for i in range(count):
        size = rng.randint(max(0, body_size // 2), body_size * 2)
        ts = clock.now_ms() if clock is not None else None
        host = Host("::1", 50000) if ipv6 else None
        writer.put(topic, queue_id, rng.randbytes(size), tags=rng.choice([None, "TagA", "TagB"]),
                   keys=[f"k-{topic}-{queue_id}-{seed}-{i}"], unique_key=os.urandom(16).hex().upper(),
                   store_timestamp=ts, born_timestamp=ts, born_host=host)


def local_records(local: LocalStore, topic: str, queue_id: int, start: int | None = None) -> list[tuple[int, bytes]]:
    """Valid local records from ``start`` (default: the first on disk); a
    corrupt record is left out (a caller can compare everything around it)."""
    rng = local.queue_range(topic, queue_id)
    offset = rng.min_offset if start is None else start
    out: list[tuple[int, bytes]] = []
    while True:
        try:
            for item in local.iter_queue(topic, queue_id, offset):
                out.append((item.queue_offset, bytes(item.record.raw)))
                offset = item.queue_offset + 1
            return out
        except CorruptRecordError:
            offset += 1


def read_manifest(store: ObjectStore, topic: str, queue_id: int, cluster: str = CLUSTER,
                  broker: str = BROKER) -> Manifest | None:
    key = f"{queue_prefix(cluster, broker, topic, queue_id)}/{MANIFEST}"
    if store.head(key) is None:
        return None
    # through a fresh ColdTier: a chunked head (format 3.0) is read with its chunks
    return ColdTier(store, cluster, broker).fetch(topic, queue_id)


def archived_records(store: ObjectStore, topic: str, queue_id: int, cluster: str = CLUSTER,
                     broker: str = BROKER) -> list[tuple[int, bytes]]:
    """Every archived record of a queue as (queue offset, raw bytes), read
    through the manifest and the cold ConsumeQueue, in manifest order."""
    m = read_manifest(store, topic, queue_id, cluster, broker)
    if m is None:
        return []
    out: list[tuple[int, bytes]] = []
    for seg in m.segments:
        cl = layout.read_part(store, seg.commitlog_key)  # a v1 object or a v2 section
        cq = cq_entries(store, seg)
        for i in range(seg.messages):
            off, size, _tags = CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE)
            rec = decode_record(memoryview(cl), off - seg.cl_start, seg.commitlog_key)
            assert rec.size == size
            assert rec.queue_offset == seg.q_start + i
            out.append((rec.queue_offset, bytes(rec.raw)))
    return out


def assert_exact(store: ObjectStore, local: LocalStore, queues: list[tuple[str, int]], *, complete: bool = True,
                 cluster: str = CLUSTER, broker: str = BROKER) -> dict[tuple[str, int], int]:
    """Every queue's archive equals the local records byte for byte, in
    order, no duplicates, no hole but recorded gaps; with ``complete`` it
    also reaches the local end. Returns the archived record count per queue."""
    counts = {}
    for topic, qid in queues:
        m = read_manifest(store, topic, qid, cluster, broker)
        assert m is not None, f"{topic}/{qid}: no manifest"
        m.check()
        archived = archived_records(store, topic, qid, cluster, broker)
        offsets = [o for o, _ in archived]
        assert len(offsets) == len(set(offsets)), f"{topic}/{qid}: duplicate offsets"
        assert offsets == sorted(offsets), f"{topic}/{qid}: out of order"
        gap_offsets = {o for g in m.gaps for o in range(g.q_start, g.q_end)}
        assert not gap_offsets & set(offsets), f"{topic}/{qid}: a gap overlaps archived records"
        assert set(offsets) | gap_offsets == set(range(m.first_offset, m.next_offset)), f"{topic}/{qid}: hole"
        local_map = dict(local_records(local, topic, qid))
        for g in m.gaps:
            if g.reason == "expired_locally":
                still = [o for o in range(g.q_start, g.q_end) if o in local_map]
                assert not still, f"{topic}/{qid}: gap {g} covers records still on local disk: {still[:5]}"
        for off, raw in archived:
            if off in local_map:
                assert raw == local_map[off], f"{topic}/{qid} offset {off}: bytes differ"
        if complete:
            assert m.next_offset == local.max_offset(topic, qid), f"{topic}/{qid}: not archived to the end"
            missing = [o for o in local_map if o >= m.first_offset and o not in set(offsets) | gap_offsets]
            assert not missing, f"{topic}/{qid}: local records missing from the archive: {missing[:5]}"
        counts[(topic, qid)] = len(archived)
    return counts


def new_writer(root: Path, **kw: Any) -> StoreWriter:
    kw.setdefault("commitlog_file_size", 64 * 1024)
    kw.setdefault("cq_entries_per_file", 128)
    return StoreWriter(root, **kw)


def new_dispatcher(store: ObjectStore, local: LocalStore, state_dir: Path, clock: ManualClock, *,
                   identity: str = "writer-1", recorder: Any = None, lease: bool = True,
                   topic_filter: TopicFilter | None = None, ttl_s: float = 120.0, force: bool = False,
                   **opts: Any) -> Dispatcher:
    archive_keys = {"upload_bytes", "max_delay_ms", "segment_bytes", "start_position", "quarantine_corrupt",
                    "key_index", "layout", "compression", "commit_pass"}
    archive = ArchiveOptions(**{k: v for k, v in opts.items() if k in archive_keys})
    rest = {k: v for k, v in opts.items() if k not in archive_keys and k != "catalog_refresh_s"}
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=state_dir, writer=identity, clock=clock,
                    **{k: v for k, v in opts.items() if k == "catalog_refresh_s"})
    lm = (LeaseManager(store, f"{CLUSTER}/{BROKER}", identity, clock=clock, ttl_s=ttl_s, force=force)
          if lease else None)
    return Dispatcher(local, cold, lease=lm, topic_filter=topic_filter, options=DispatchOptions(
        archive=archive, **rest),
                      recorder=recorder, clock=clock)


def archive_all(d: Dispatcher, local: LocalStore, queues: list[tuple[str, int]]) -> None:
    """Rounds until every queue is archived to its local end (each must succeed)."""
    for _ in range(1000):
        local.refresh()
        result = d.run_round()
        assert result.ok, result.errors
        if all((m := d.cold.cached(t, q)) is not None and m.next_offset == local.max_offset(t, q) for t, q in queues):
            return
    raise AssertionError("the dispatcher stopped making progress")


def direct_opens(monkeypatch: Any) -> list[str]:
    """The paths ``os.open`` is asked to open with O_DIRECT from now on
    (the opens themselves go through unchanged)."""
    real_open = os.open
    direct: list[str] = []

    def open_(path: Any, flags: int, *a: Any) -> int:
        if flags & os.O_DIRECT:
            direct.append(str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", open_)
    return direct


def extend_like_the_pass(builder: Any, whole: RecordBatch, windows: list[tuple[int, int]]) -> None:
    """What the CommitLog pass does with a segment builder: the records of
    each window ``[lo, hi)`` of ``whole`` copied into ``builder.buffer``,
    then ``extend`` with their arrays and keys."""
    from tiered.format.keyindex import record_key_hashes

    sizes, ends = whole.sizes, whole.positions + whole.sizes
    owners, hashes = record_key_hashes(whole.view, whole.props_at, ends)
    for lo, hi in windows:
        at = builder.nbytes
        end = at + int(sizes[lo:hi].sum())
        buf = builder.buffer(end)
        assert len(buf) >= end
        for p, e in zip(whole.positions[lo:hi].tolist(), ends[lo:hi].tolist()):
            buf[at:at + e - p] = whole.view[p:e]
            at += e - p
        mine = (owners >= lo) & (owners < hi)
        builder.extend(end, sizes[lo:hi], whole.tags[lo:hi], whole.store_ms[lo:hi], whole.born_ms[lo:hi],
                       owners[mine], hashes[mine])


def cq_entries(store: ObjectStore, seg: Segment) -> bytes:
    """The entries of a segment's cold ConsumeQueue object, after checking that
    the descriptor trailing them describes exactly this segment."""
    parts = segmeta.read_parts(store, seg)  # v1: the ConsumeQueue object; v2: the segment object
    assert parts.descriptor is not None, f"{parts.carrier} has no descriptor"
    assert replace(parts.descriptor.segment, bloom=seg.bloom, created_ms=seg.created_ms,
                   stored_bytes=seg.stored_bytes) == seg
    assert len(parts.entries) == seg.messages * CQ_ENTRY_SIZE
    if seg.layout == 1:
        assert len(store.get(seg.consumequeue_key)) > seg.messages * CQ_ENTRY_SIZE  # the trailer is there
    return parts.entries


def expire_below(store_dir: Path, cut: int) -> None:
    """What broker retention does: delete CommitLog files wholly below
    ``cut`` and ConsumeQueue files whose entries all point below it."""
    for f in sorted((store_dir / "commitlog").iterdir()):
        if int(f.name) + f.stat().st_size <= cut:
            f.unlink()
    for qdir in (store_dir / "consumequeue").glob("*/*"):
        for f in sorted(qdir.iterdir())[:-1]:  # never the last (active) file
            data = f.read_bytes()
            used = [struct.unpack_from(">q", data, i)[0] for i in range(0, len(data), CQ_ENTRY_SIZE)
                    if struct.unpack_from(">i", data, i + 8)[0] != 0]
            if used and max(used) < cut:
                f.unlink()


def produce_draws(seed: int, n: int, body_size: int) -> list[tuple[str, bytes]]:
    """(unique key, body) of each message as ``tiered produce`` draws them, one
    message at a time (produce draws thousands at once from the same stream:
    one SFC64 stream, ceil((16 + body) / 8) words a message, little-endian bytes)."""
    import numpy as np

    gen = np.random.SFC64(seed)
    words = (16 + body_size + 7) // 8
    out = []
    for _ in range(n):
        raw = b"".join(int(w).to_bytes(8, "little") for w in gen.random_raw(words))
        out.append((raw[:16].hex().upper(), raw[16:16 + body_size]))
    return out


def props_batch(records: list[tuple[bytes, bytes]], first_offset: int = 0) -> RecordBatch:
    """A batch over a buffer of (bytes before the properties, properties)
    pairs: all that batch_keys reads of a record."""
    buf = bytearray()
    positions, sizes, props_at = [], [], []
    for head, props in records:
        positions.append(len(buf))
        props_at.append(len(buf) + len(head))
        buf += head + props
        sizes.append(len(head) + len(props))
    n = len(records)
    a = lambda v: np.array(v, np.int64)  # noqa: E731
    return RecordBatch(first_offset=first_offset, view=memoryview(bytes(buf)), source="/store/commitlog/0",
                       positions=a(positions), sizes=a(sizes), tags=np.zeros(n, np.int64),
                       store_ms=np.zeros(n, np.int64), born_ms=np.zeros(n, np.int64), props_at=a(props_at))
