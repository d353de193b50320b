"""The batch reader: runs of records checked at once must accept exactly
what the record-by-record decoder accepts, stop exactly where it stops and
raise exactly what it raises."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from tiered.format.codec import Host
from tiered.errors import CorruptRecordError
from tiered.store import mappedfiles
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import Appended, StoreWriter

FILE = 1 << 20
V6 = Host("2001:db8::7", 50000)


def write(store_writer: Callable[..., StoreWriter], n: int, topic: str = "T", queues: int = 3,
          hosts: str = "v4") -> tuple[Path, list[Appended]]:
    """A store of ``n`` records (its root, and where each went)."""
    with store_writer(store_host=V6 if hosts == "v6-store" else Host("10.0.0.1", 10911)) as w:
        return w.root, [w.put(topic, i % queues, bytes([i % 256]) * (50 + i * 7 % 300), tags="t", keys=[f"k{i}"],
                              store_timestamp=1_700_000_000_000 + i, born_timestamp=1_600_000_000_000 + i,
                              born_host=V6 if hosts in ("v6-born", "mixed") and i % 2 else None)
                        for i in range(n)]


@pytest.mark.parametrize("hosts", ["v4", "v6-born", "v6-store", "mixed"])
@pytest.mark.parametrize("topic", ["T", "t" * 200])  # 200 bytes: magic v2, 2-byte topic length
def test_batches_hold_every_record_exactly(store_writer, hosts: str, topic: str) -> None:
    root, appended = write(store_writer, 600, topic=topic, hosts=hosts)
    with LocalStore(root) as store:
        for qid in range(3):
            mine = [a for a in appended if a.queue_id == qid]
            batches = list(store.iter_batches(topic, qid, 0))
            assert max(b.count for b in batches) > 50  # runs, not one record at a time
            offset = 0
            for b in batches:
                assert b.first_offset == offset
                for i in range(b.count):
                    a = mine[offset + i]
                    pos, size = int(b.positions[i]), int(b.sizes[i])
                    assert size == a.size
                    raw = bytes(b.view[pos:pos + size])
                    rec = store.read_at(a.commitlog_offset)
                    assert raw == bytes(rec.raw)
                    assert int(b.store_ms[i]) == rec.store_timestamp and int(b.born_ms[i]) == rec.born_timestamp
                    assert bytes(b.view[int(b.props_at[i]):pos + size]) == bytes(rec.properties_raw)
                    assert int(b.tags[i]) == rec_tags(store, topic, qid, offset + i)
                offset += b.count
            assert offset == len(mine)


def rec_tags(store: LocalStore, topic: str, qid: int, offset: int) -> int:
    return next(iter(store.iter_queue(topic, qid, offset, max_count=1))).tags_code


def patch(root: Path, phys: int, at: int, data: bytes) -> None:
    start = phys - phys % FILE
    fd = os.open(root / "commitlog" / f"{start:020d}", os.O_RDWR)
    try:
        os.pwrite(fd, data, phys - start + at)
    finally:
        os.close(fd)


# (what is broken, offset inside the record, bytes written there)
CORRUPTIONS = [
    ("body", 100, b"\xff\xfe"),  # the CRC no longer matches
    ("stored crc", 8, b"\x00\x00\x00\x01"),
    ("magic", 4, b"\x12\x34\x56\x78"),
    ("queue id", 12, struct.pack(">i", 7)),
    ("queue offset", 20, struct.pack(">q", 999)),
    ("physical offset", 28, struct.pack(">q", 12345)),
    ("body length", 84, struct.pack(">i", 40)),
    ("total size", 0, struct.pack(">i", 80)),
]


@pytest.mark.parametrize(("what", "at", "data"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupt_record_inside_a_run_ends_it_there(store_writer, what: str, at: int, data: bytes) -> None:
    root, appended = write(store_writer, 300, queues=1)
    bad = appended[137]
    patch(root, bad.commitlog_offset, at, data)
    with LocalStore(root) as store:
        seen = 0
        with pytest.raises(CorruptRecordError) as exc:
            for b in store.iter_batches("T", 0, 0):
                assert b.first_offset == seen
                seen += b.count
        assert seen == 137  # every record before it, none after
        start = bad.commitlog_offset - bad.commitlog_offset % FILE
        assert exc.value.source == str(root / "commitlog" / f"{start:020d}")
        assert bad.commitlog_offset - start <= exc.value.offset < bad.commitlog_offset - start + bad.size
        # the same error, record by record
        with pytest.raises(CorruptRecordError) as one:
            list(store.iter_queue("T", 0, 137))
        assert (one.value.source, one.value.offset) == (exc.value.source, exc.value.offset)


def test_topic_and_properties_are_checked_in_a_run(store_writer) -> None:
    root, appended = write(store_writer, 200, topic="Orders", queues=1)
    rec = appended[60]
    with LocalStore(root) as store:
        r = store.read_at(rec.commitlog_offset)
        topic_at = r.size - len(r.properties_raw) - 2 - len("Orders")
    patch(root, rec.commitlog_offset, topic_at, b"X")  # another topic's record, same length
    with LocalStore(root) as store:
        seen = 0
        with pytest.raises(CorruptRecordError, match="topic"):
            for b in store.iter_batches("Orders", 0, 0):
                seen += b.count
        assert seen == 60


def test_max_bytes_and_max_count_cut_runs_exactly(store_writer) -> None:
    root, appended = write(store_writer, 400, queues=1)
    with LocalStore(root) as store:
        got = sum(b.count for b in store.iter_batches("T", 0, 10, max_count=123))
        assert got == 123
        budget = sum(a.size for a in appended[10:60]) + 5
        batches = list(store.iter_batches("T", 0, 10, max_bytes=budget))
        assert sum(b.count for b in batches) == 50
        assert sum(b.nbytes for b in batches) <= budget


def test_pages_are_mapped_at_once_only_for_dense_runs(store_writer) -> None:
    # queue 0: every other record; queue 1: one record per ~100 KiB of others
    with store_writer(commitlog_file_size=64 << 20, cq_entries_per_file=10_000) as w:
        for i in range(3000):
            w.put("T", 0 if i % 2 else 2, b"d" * 1000)
            if i % 100 == 0:
                w.put("T", 1, b"s" * 1000)
    calls: list[tuple[int, int]] = []
    original = mappedfiles.FileSet.populate

    def counting(self, start, lo, hi):  # noqa: ANN001, ANN202
        calls.append((lo, hi))
        return original(self, start, lo, hi)

    with mock.patch.object(mappedfiles.FileSet, "populate", counting), LocalStore(w.root) as store:
        assert sum(b.count for b in store.iter_batches("T", 1, 0)) == 30
        assert calls == []  # sparse: faults map what is read, a populate would map 3 MiB for 30 records
        assert sum(b.count for b in store.iter_batches("T", 0, 0)) == 1500
        assert calls  # dense: mapped in one call per run
