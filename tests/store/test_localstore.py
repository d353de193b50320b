"""LocalStore against real stores written by StoreWriter: rolling CommitLog
and ConsumeQueue files, fillers, delayed and retry/DLQ topics, config with
.bak fallback, the checkpoint, files deleted under the reader, torn tails
and corrupt records."""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.format.batch import CQ_DTYPE
from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE, CQ_FILLER_SIZE, Host, Message, encode_record, tags_code
from tiered.errors import CorruptRecordError, ExpiredLocallyError, NotWrittenYetError
from tiered.store.localstore import LocalStore, QueueRange
from tiered.store.storewriter import SCHEDULE_TOPIC, Appended, StoreWriter

FILE = 4096
CQ_PER_FILE = 5


def body_of(i: int) -> bytes:
    return bytes([i % 251]) * ((i * 37) % 700)


def make_store(store_writer: Callable[..., StoreWriter], n: int = 60, queues: int = 2, topic: str = "T",
               **kw) -> list[Appended]:
    out = []
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE) as w:
        for i in range(n):
            out.append(w.put(topic, i % queues, body_of(i), tags=f"tag{i % 3}", keys=[f"k{i}", "common"],
                             unique_key=f"U{i:08d}", store_timestamp=1_000_000 + i * 10, **kw))
    return out


def raw_at(root: Path, phys: int, size: int) -> bytes:
    start = phys - phys % FILE
    with open(root / "commitlog" / f"{start:020d}", "rb") as fh:
        fh.seek(phys - start)
        return fh.read(size)


def cl_path(root: Path, phys: int) -> Path:
    return root / "commitlog" / f"{phys - phys % FILE:020d}"


def cq_path(root: Path, topic: str, qid: int, offset: int) -> Path:
    per = CQ_PER_FILE * 20
    byte = offset * 20
    return root / "consumequeue" / topic / str(qid) / f"{byte - byte % per:020d}"


def patch(path: Path, at: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, at)
    finally:
        os.close(fd)


# --- reading everything ---------------------------------------------------------------------


def test_reads_every_record_across_rolling_files(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer)
    assert len(os.listdir(root / "commitlog")) > 5
    assert len(os.listdir(root / "consumequeue" / "T" / "0")) == 6
    with LocalStore(root) as store:
        assert store.topics() == ["T"]
        assert store.queue_ids("T") == [0, 1]
        assert store.queues() == [("T", 0), ("T", 1)]
        for qid in (0, 1):
            mine = [a for a in appended if a.queue_id == qid]
            assert store.queue_range("T", qid) == QueueRange(0, 30)
            items = list(store.iter_queue("T", qid, 0))
            assert [it.queue_offset for it in items] == list(range(30))
            for it, a in zip(items, mine):
                i = appended.index(a)
                rec = it.record
                assert it.tags_code == tags_code(f"tag{i % 3}")
                assert bytes(rec.raw) == raw_at(root, a.commitlog_offset, a.size)
                assert rec.physical_offset == a.commitlog_offset and rec.size == a.size
                assert rec.queue_offset == a.queue_offset and rec.queue_id == qid
                assert rec.body_bytes() == body_of(i)
                assert rec.store_timestamp == 1_000_000 + i * 10
                assert rec.tags == f"tag{i % 3}"
                assert rec.keys == [f"k{i}", "common"]
                assert rec.unique_key == f"U{i:08d}"
                assert rec.source == str(cl_path(root, a.commitlog_offset))
                assert rec.position == a.commitlog_offset % FILE


def test_record_bytes_match_an_independent_encoding(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=6, queues=1)
    with LocalStore(root) as store:
        for it, a in zip(store.iter_queue("T", 0, 0), appended):
            i = appended.index(a)
            expected = encode_record(Message(
                topic="T", queue_id=0, body=body_of(i),
                properties={"KEYS": f"k{i} common", "TAGS": f"tag{i % 3}", "UNIQ_KEY": f"U{i:08d}"},
                born_timestamp=1_000_000 + i * 10, born_host=Host("127.0.0.1", 50000),
                store_timestamp=1_000_000 + i * 10, store_host=Host("127.0.0.1", 10911),
                queue_offset=i, physical_offset=a.commitlog_offset))
            assert bytes(it.record.raw) == expected


def test_iter_from_the_middle_and_limits(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = [a for a in make_store(store_writer, n=40, queues=1)]
    sizes = [a.size for a in appended]
    with LocalStore(root) as store:
        assert [i.queue_offset for i in store.iter_queue("T", 0, 7)] == list(range(7, 40))
        assert [i.queue_offset for i in store.iter_queue("T", 0, 10)] == list(range(10, 40))  # file boundary
        assert [i.queue_offset for i in store.iter_queue("T", 0, 39)] == [39]
        assert list(store.iter_queue("T", 0, 40)) == []
        assert list(store.iter_queue("T", 0, 1000)) == []
        assert [i.queue_offset for i in store.iter_queue("T", 0, 3, max_count=4)] == [3, 4, 5, 6]
        assert list(store.iter_queue("T", 0, 3, max_count=0)) == []
        budget = sizes[3] + sizes[4] + sizes[5]
        assert [i.queue_offset for i in store.iter_queue("T", 0, 3, max_bytes=budget)] == [3, 4, 5]
        assert [i.queue_offset for i in store.iter_queue("T", 0, 3, max_bytes=budget - 1)] == [3, 4]
        # at least one record, however small the budget
        assert [i.queue_offset for i in store.iter_queue("T", 0, 3, max_bytes=1)] == [3]
        assert [i.queue_offset for i in store.iter_queue("T", 0, 3, max_count=2, max_bytes=budget)] == [3, 4]


def test_read_at(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=10, queues=1)
    with LocalStore(root) as store:
        for a in appended:
            assert bytes(store.read_at(a.commitlog_offset).raw) == raw_at(root, a.commitlog_offset, a.size)
        end = appended[-1].commitlog_offset + appended[-1].size
        with pytest.raises(NotWrittenYetError):
            store.read_at(end)


# --- find_offset ------------------------------------------------------------------------------


def test_find_offset_first_offset_at_or_after(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    stamps = [100, 100, 100, 105, 110, 110, 120, 121, 121, 121, 121, 150, 150, 200, 201, 300, 300]
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=4) as w:
        for ts in stamps:
            w.put("T", 0, b"x" * 300, store_timestamp=ts)
    with LocalStore(root) as store:
        for t in range(90, 310):
            expected = next((i for i, s in enumerate(stamps) if s >= t), len(stamps))
            assert store.find_offset("T", 0, t) == expected, t
        assert store.find_offset("T", 0, -(2**63)) == 0
        assert store.find_offset("T", 0, 2**63 - 1) == len(stamps)
        assert store.find_offset("T", 9, 100) == 0  # no such queue


def test_find_offset_with_filler_head(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=4) as w:
        w.fill_queue_head("T", 0, 6)
        for i in range(5):
            w.put("T", 0, b"x", store_timestamp=1000 + i)
    with LocalStore(root) as store:
        assert store.find_offset("T", 0, 0) == 6
        assert store.find_offset("T", 0, 1002) == 8
        assert store.find_offset("T", 0, 5000) == 11


# --- filler head, delayed, retry/DLQ, IPv6 -------------------------------------------------------


def test_filler_entries_at_the_head(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE) as w:
        w.fill_queue_head("T", 0, 13)
        for i in range(4):
            w.put("T", 0, b"%d" % i)
    with LocalStore(root) as store:
        assert store.queue_range("T", 0) == QueueRange(13, 17)
        items = list(store.iter_queue("T", 0, 13))
        assert [(i.queue_offset, i.record.body_bytes()) for i in items] == [(13, b"0"), (14, b"1"), (15, b"2"), (16, b"3")]
        for start in (10, 12):  # fillers: not messages
            with pytest.raises(ExpiredLocallyError) as info:
                list(store.iter_queue("T", 0, start))
            assert info.value.next_available == 13 and info.value.offset == start
        with pytest.raises(ExpiredLocallyError) as info:
            list(store.iter_queue("T", 0, 0))  # before the first ConsumeQueue file
        assert info.value.next_available == 13


def test_delayed_messages(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE) as w:
        for i in range(3):
            w.put("orders", 2, b"d%d" % i, tags="late", delay_level=3, store_timestamp=5000 + i)
    with LocalStore(root) as store:
        assert store.queues() == [(SCHEDULE_TOPIC, 2)]
        items = list(store.iter_queue(SCHEDULE_TOPIC, 2, 0))
        assert [i.tags_code for i in items] == [15000, 15001, 15002]  # delivery time, level 3 = 10 s
        rec = items[1].record
        assert rec.topic == SCHEDULE_TOPIC and rec.queue_id == 2
        assert rec.properties["REAL_TOPIC"] == "orders"
        assert rec.properties["REAL_QID"] == "2"
        assert rec.properties["DELAY"] == "3"
        assert rec.tags == "late"


def test_retry_and_dlq_topics(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE) as w:
        w.put("%RETRY%g1", 0, b"r", reconsume_times=1)
        w.put("%DLQ%g1", 0, b"d", reconsume_times=16, properties={"DLQ_ORIGIN_TOPIC": "orders"})
    with LocalStore(root) as store:
        assert store.topics() == ["%DLQ%g1", "%RETRY%g1"]
        (r,) = store.iter_queue("%RETRY%g1", 0, 0)
        (d,) = store.iter_queue("%DLQ%g1", 0, 0)
        assert r.record.reconsume_times == 1 and r.record.properties["RECONSUME_TIME"] == "1"
        assert d.record.reconsume_times == 16 and d.record.properties["DLQ_ORIGIN_TOPIC"] == "orders"
        assert d.record.topic == "%DLQ%g1"


def test_ipv6_hosts_and_long_topic(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    topic = "v2-" + "x" * 140
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=3, store_host=Host("fd00::5", 10911)) as w:
        appended = [w.put(topic, 0, b"b" * 500, born_host=Host("2001:db8::7", 4242), store_timestamp=i) for i in range(12)]
    with LocalStore(root) as store:
        items = list(store.iter_queue(topic, 0, 0))
        assert len(items) == 12
        for it, a in zip(items, appended):
            rec = it.record
            assert rec.born_host == Host("2001:db8::7", 4242)
            assert rec.store_host == Host("fd00::5", 10911)
            assert rec.sys_flag & 0x30 == 0x30
            assert rec.store_timestamp == a.queue_offset
            assert rec.topic == topic and rec.version == 2
            assert bytes(rec.raw) == raw_at(root, a.commitlog_offset, a.size)
        assert store.find_offset(topic, 0, 5) == 5


# --- config and checkpoint ------------------------------------------------------------------------


def _topics(attrs: dict) -> dict:
    return {"topicConfigTable": {"T": {"topicName": "T", "attributes": attrs}}}


@pytest.mark.parametrize("main", [None, b"", b"   \n", b"{garbage", b"\xff\xfe", b"[" * 100_000])
def test_config_falls_back_to_bak(tmp_path: Path, main: bytes | None, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json.bak").write_text(json.dumps(_topics({"reserve.time": "36"})))
    if main is not None:
        (config / "topics.json").write_bytes(main)
    store = LocalStore(tmp_path)
    with caplog.at_level("WARNING", logger="tiered.format.jsonfile"):
        assert store.read_config("topics.json") == _topics({"reserve.time": "36"})
    # the fallback is said, naming the file and why (the backup is one write older)
    warned = [r.getMessage() for r in caplog.records if r.name == "tiered.format.jsonfile"]
    why = "missing" if main is None else "topics.json: "
    assert len(warned) == 1 and str(config / "topics.json") in warned[0] and why in warned[0], warned
    assert "topics.json.bak" in warned[0]
    assert store.retention_hours() == {"T": 36.0}


def test_config_main_file_wins_over_bak(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json.bak").write_text(json.dumps(_topics({"reserve.time": "36"})))
    (config / "topics.json").write_text(json.dumps(_topics({"reserve.time": "12"})))
    assert LocalStore(tmp_path).retention_hours() == {"T": 12.0}


def test_config_missing_or_broken(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert store.read_config("topics.json") == {}
    assert store.retention_hours() == {}
    config = tmp_path / "config"
    config.mkdir()
    (config / "topics.json").write_text("{nope")
    (config / "topics.json.bak").write_text("")
    with pytest.raises(CorruptRecordError) as info:
        store.read_config("topics.json")
    assert info.value.source == str(config / "topics.json")
    (config / "topics.json").write_text("[1, 2]")
    with pytest.raises(CorruptRecordError):
        store.read_config("topics.json")


def test_retention_hours_from_topic_attributes(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE) as w:
        for t in ("A", "B", "C", "D", "E"):
            w.put(t, 0, b"")
        w.set_topic_attribute("A", "reserve.time", "48")
        w.set_topic_attribute("B", "reserve.time", "0.5")
        w.set_topic_attribute("C", "reserve.time", "forever")
        w.set_topic_attribute("D", "reserve.time", "-1")
        w.set_topic_attribute("E", "+reserve.time", "24")
    assert LocalStore(root).retention_hours() == {"A": 48.0, "B": 0.5, "E": 24.0}
    # a stale topics.json.tmp left by a crash does not matter
    (root / "config" / "topics.json.tmp").write_text("{")
    assert LocalStore(root).topic_configs()["A"]["attributes"] == {"reserve.time": "48"}


def test_confirmed_offset_bounds_iteration_in_controller_mode(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=20, queues=1)
    with LocalStore(root, broker_mode="controller") as store:
        assert store.confirmed_offset() == 0  # no checkpoint: nothing confirmed (tests/store/test_brokermode.py)
    end7 = appended[7].commitlog_offset + appended[7].size
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE) as w:
        w.write_checkpoint(confirm_offset=end7)
    with LocalStore(root) as store:
        assert store.confirmed_offset() is None  # default mode: the broker binds nothing to it
        assert len(list(store.iter_queue("T", 0, 0))) == 20
    with LocalStore(root, broker_mode="controller") as store:
        assert store.confirmed_offset() == end7
        assert [i.queue_offset for i in store.iter_queue("T", 0, 0)] == list(range(8))
        assert [i.queue_offset for i in store.iter_queue("T", 0, 5)] == [5, 6, 7]
        assert list(store.iter_queue("T", 0, 8)) == []
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE) as w:
        w.write_checkpoint(confirm_offset=end7 - 1)  # record 7 not wholly confirmed
    with LocalStore(root, broker_mode="controller") as store:
        assert [i.queue_offset for i in store.iter_queue("T", 0, 0)] == list(range(7))


# --- files deleted under the reader -------------------------------------------------------------------


def _first_offset_at_or_after(appended: list[Appended], qid: int, phys: int) -> int:
    return next(a.queue_offset for a in appended if a.queue_id == qid and a.commitlog_offset >= phys)


def test_commitlog_head_deleted_fresh_reader(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=40, queues=1)
    (root / "commitlog" / f"{0:020d}").unlink()
    (root / "commitlog" / f"{FILE:020d}").unlink()
    nxt = _first_offset_at_or_after(appended, 0, 2 * FILE)
    with LocalStore(root) as store:
        assert store.queue_range("T", 0) == QueueRange(nxt, 40)
        for start in (0, nxt - 1):
            with pytest.raises(ExpiredLocallyError) as info:
                list(store.iter_queue("T", 0, start))
            assert (info.value.topic, info.value.queue_id, info.value.offset) == ("T", 0, start)
            assert info.value.next_available == nxt
        assert [i.queue_offset for i in store.iter_queue("T", 0, nxt)] == list(range(nxt, 40))
        assert store.find_offset("T", 0, 0) == nxt


def test_commitlog_deleted_while_iterating(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=40, queues=1)
    nxt = _first_offset_at_or_after(appended, 0, 3 * FILE)
    with LocalStore(root) as store:
        it = store.iter_queue("T", 0, 0)
        first = [next(it) for _ in range(2)]
        # the broker deletes the oldest files, including ones the reader has not reached
        for start in (0, FILE, 2 * FILE):
            (root / "commitlog" / f"{start:020d}").unlink()
        seen = [i.queue_offset for i in first]
        with pytest.raises(ExpiredLocallyError) as info:
            for item in it:
                seen.append(item.queue_offset)
                a = appended[item.queue_offset]
                assert (item.record.physical_offset, item.record.size) == (a.commitlog_offset, a.size)
                assert item.record.body_bytes() == body_of(item.queue_offset)
        # what was still mapped was read correctly; the first missing offset is reported
        assert seen == list(range(len(seen)))
        assert info.value.offset == len(seen)
        assert info.value.next_available == nxt
        # after refresh the store no longer offers the deleted range
        store.refresh()
        assert store.queue_range("T", 0).min_offset == nxt
        with pytest.raises(ExpiredLocallyError):
            list(store.iter_queue("T", 0, 0))


def test_consumequeue_head_deleted(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    make_store(store_writer, n=40, queues=1)
    with LocalStore(root) as store:
        assert [i.queue_offset for i in store.iter_queue("T", 0, 0, max_count=3)] == [0, 1, 2]
        cq_path(root, "T", 0, 0).unlink()
        cq_path(root, "T", 0, 5).unlink()
        store.refresh()
        assert store.queue_range("T", 0) == QueueRange(10, 40)
        with pytest.raises(ExpiredLocallyError) as info:
            list(store.iter_queue("T", 0, 3))
        assert info.value.next_available == 10
        assert [i.queue_offset for i in store.iter_queue("T", 0, 10)][:2] == [10, 11]
    with LocalStore(root) as fresh:
        with pytest.raises(ExpiredLocallyError) as info:
            list(fresh.iter_queue("T", 0, 0))
        assert info.value.next_available == 10


def test_consumequeue_file_deleted_before_the_reader_reaches_it(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    make_store(store_writer, n=40, queues=1)
    with LocalStore(root) as store:
        it = store.iter_queue("T", 0, 0)
        assert next(it).queue_offset == 0
        for off in (0, 5, 10):
            cq_path(root, "T", 0, off).unlink()
        seen = []
        with pytest.raises(ExpiredLocallyError) as info:
            for item in it:
                seen.append(item.queue_offset)
        assert seen == [1, 2, 3, 4]  # the file already mapped still reads
        assert (info.value.offset, info.value.next_available) == (5, 15)


def test_everything_deleted(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    make_store(store_writer, n=10, queues=1)
    for name in os.listdir(root / "commitlog"):
        (root / "commitlog" / name).unlink()
    with LocalStore(root) as store:
        rng = store.queue_range("T", 0)
        assert rng.count == 0
        with pytest.raises(ExpiredLocallyError):
            list(store.iter_queue("T", 0, 0))


# --- torn tails --------------------------------------------------------------------------------------------


def test_entry_present_but_record_zeroed(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=12, queues=1)
    last = appended[-1]
    patch(cl_path(root, last.commitlog_offset), last.commitlog_offset % FILE, bytes(last.size))
    with LocalStore(root) as store:
        assert [i.queue_offset for i in store.iter_queue("T", 0, 0)] == list(range(11))
        assert list(store.iter_queue("T", 0, 11)) == []
        assert store.find_offset("T", 0, 2**62) in (11, 12)


def test_entry_present_but_commitlog_truncated_inside_the_record(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=12, queues=1)
    last = appended[-1]
    for cut in (last.size - 1, 40, 8, 3, 0):
        os.truncate(cl_path(root, last.commitlog_offset), last.commitlog_offset % FILE + cut)
        with LocalStore(root) as store:  # a fresh map of the now shorter file
            assert [i.queue_offset for i in store.iter_queue("T", 0, 0)] == list(range(11)), cut
            with pytest.raises(NotWrittenYetError):
                store.read_at(last.commitlog_offset)


def test_consumequeue_torn_in_the_middle_of_an_entry(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=100, preallocate=False) as w:
        for i in range(7):
            w.put("T", 0, b"%d" % i)
    os.truncate(cq_path(root, "T", 0, 0), 6 * 20 + 11)
    with LocalStore(root) as store:
        assert store.queue_range("T", 0) == QueueRange(0, 6)
        assert [i.queue_offset for i in store.iter_queue("T", 0, 0)] == list(range(6))
        assert list(store.iter_queue("T", 0, 6)) == []


def test_reader_follows_growing_files_and_new_files(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    # not preallocated: files grow under a reader that mapped them shorter
    kw = dict(commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE, preallocate=False)
    with store_writer(**kw) as w:
        w.put("T", 0, b"a" * 100)
        with LocalStore(root) as store:
            assert [i.queue_offset for i in store.iter_queue("T", 0, 0)] == [0]
            for i in range(1, 30):
                w.put("T", 0, bytes([i]) * 900)
            # no refresh(): the reader finds new CommitLog and ConsumeQueue files itself
            items = list(store.iter_queue("T", 0, 1))
            assert [i.queue_offset for i in items] == list(range(1, 30))
            assert [i.record.body_bytes()[:1] for i in items] == [bytes([i]) for i in range(1, 30)]
            store.refresh()
            assert store.queue_range("T", 0) == QueueRange(0, 30)


def test_new_consumequeue_file_seen_while_still_empty(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE) as w:
        for i in range(5):
            w.put("T", 0, b"x")
        # the broker creates the next file before writing into it: empty for a moment
        nxt = cq_path(root, "T", 0, 5)
        nxt.touch()
        with LocalStore(root) as store:
            assert len(list(store.iter_queue("T", 0, 0))) == 5
            assert store.queue_range("T", 0) == QueueRange(0, 5)
            for i in range(3):
                w.put("T", 0, b"y")  # extends the empty file to its full size
            assert [i.queue_offset for i in store.iter_queue("T", 0, 5)] == [5, 6, 7]
            assert store.queue_range("T", 0) == QueueRange(0, 8)


# --- corruption --------------------------------------------------------------------------------------------


def _corrupt_case(store_writer: Callable[..., StoreWriter], root: Path,
                  victim: int = 6) -> tuple[list[Appended], Appended, Path, int]:
    appended = make_store(store_writer, n=12, queues=1)
    a = appended[victim]
    return appended, a, cl_path(root, a.commitlog_offset), a.commitlog_offset % FILE


def _iter_until_error(store: LocalStore, start: int = 0) -> tuple[list[int], CorruptRecordError]:
    seen = []
    with pytest.raises(CorruptRecordError) as info:
        for item in store.iter_queue("T", 0, start):
            seen.append(item.queue_offset)
    return seen, info.value


@pytest.mark.parametrize(
    ("what", "at", "data"),
    [
        ("body bit flip", 88 + 1, None),
        ("bad magic", 4, struct.pack(">I", 0x12345678)),
        ("queue id", 12, struct.pack(">i", 1)),
        ("queue offset", 20, struct.pack(">q", 99)),
        ("physical offset", 28, struct.pack(">q", 12345)),
        ("total size", 0, None),
        ("body length", 84, struct.pack(">i", 1)),
    ],
)
def test_corrupt_record_names_file_and_offset(tmp_path: Path, store_writer, what: str, at: int,  # noqa: ANN001
                                              data: bytes | None) -> None:
    root = tmp_path / "store"
    appended, a, path, rel = _corrupt_case(store_writer, root)
    if what == "body bit flip":
        byte = open(path, "rb").read()[rel + at]
        data = bytes([byte ^ 0x10])
    if what == "total size":
        data = struct.pack(">i", a.size - 1)
    patch(path, rel + at, data)
    with LocalStore(root) as store:
        seen, err = _iter_until_error(store)
        assert seen == list(range(6)), what
        assert err.source == str(path), (what, err)
        if what in ("total size", "body length"):
            # found where the walk through the fields stops adding up
            assert rel < err.offset < rel + a.size, (what, err)
        else:
            assert err.offset == rel, (what, err)
        # records before the bad one stay valid, and skipping past it works
        assert [i.queue_offset for i in store.iter_queue("T", 0, 7)] == list(range(7, 12))


def test_wrong_topic_is_corruption(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended, a, path, rel = _corrupt_case(store_writer, root)
    raw = bytearray(raw_at(root, a.commitlog_offset, a.size))
    topic_at = 88 + struct.unpack_from(">i", raw, 84)[0] + 1
    assert raw[topic_at:topic_at + 1] == b"T"
    patch(path, rel + topic_at, b"U")
    with LocalStore(root) as store:
        seen, err = _iter_until_error(store)
        assert seen == list(range(6)) and (err.source, err.offset) == (str(path), rel)


def test_consumequeue_size_mismatch(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended, a, path, rel = _corrupt_case(store_writer, root)
    for bad in (a.size + 1, a.size - 1, 10, 3 * FILE):
        patch(cq_path(root, "T", 0, 6), (6 % CQ_PER_FILE) * 20 + 8, struct.pack(">i", bad))
        with LocalStore(root) as store:
            seen, err = _iter_until_error(store)
            assert seen == list(range(6)) and (err.source, err.offset) == (str(path), rel), bad


def test_consumequeue_entry_pointing_elsewhere(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended, a, path, rel = _corrupt_case(store_writer, root)
    other = appended[2]
    patch(cq_path(root, "T", 0, 6), (6 % CQ_PER_FILE) * 20, struct.pack(">qi", other.commitlog_offset, other.size))
    with LocalStore(root) as store:
        seen, err = _iter_until_error(store)
        assert seen == list(range(6))
        assert err.source == str(cl_path(root, other.commitlog_offset))
        assert err.offset == other.commitlog_offset % FILE


def test_consumequeue_entry_pointing_at_the_filler(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=20, queues=1)
    # the first file's filler sits right after its last record
    last_in_first = max((a for a in appended if a.commitlog_offset < FILE), key=lambda a: a.commitlog_offset)
    filler_at = last_in_first.commitlog_offset + last_in_first.size
    assert open(cl_path(root, 0), "rb").read()[filler_at + 4:filler_at + 8] == bytes.fromhex("CBD43194")
    patch(cq_path(root, "T", 0, 6), (6 % CQ_PER_FILE) * 20, struct.pack(">q", filler_at))
    with LocalStore(root) as store:
        seen, err = _iter_until_error(store)
        assert seen == list(range(6)) and err.source == str(cl_path(root, 0)) and err.offset == filler_at


def test_impossible_consumequeue_entries(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    make_store(store_writer, n=12, queues=1)
    cq = cq_path(root, "T", 0, 6)
    for entry in (struct.pack(">qi", 0, -5), struct.pack(">qi", -100, 200)):
        patch(cq, 20, entry)
        with LocalStore(root) as store:
            seen, err = _iter_until_error(store)
            assert seen == list(range(6)) and err.source == str(cq) and err.offset == 20


# --- memory: pages behind the reader are given back ---------------------------------------------------------


def _mapped_rss_kib(path_prefix: str) -> int:
    """Resident KiB of this process's mappings of files under ``path_prefix``."""
    total = 0
    current = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                current = path_prefix in line
            elif current and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_resident_pages_are_given_back(tmp_path: Path, store_writer, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiered.store.queuecursor as queuecursor

    root = tmp_path / "store"
    with store_writer(commitlog_file_size=8 << 20, cq_entries_per_file=1000) as w:
        appended = [w.put("T", 0, bytes([i % 256]) * 3000) for i in range(1000)]
    prefix = str(root / "commitlog")
    with LocalStore(root) as store:
        it = store.iter_queue("T", 0, 0)
        halfway = [next(it) for _ in range(500)]
        assert _mapped_rss_kib(prefix) > 1024  # 1.5 MB read so far, all resident (below the default window)
        rest = list(it)
        assert _mapped_rss_kib(prefix) < 64  # given back when the iteration ended
    monkeypatch.setattr(queuecursor, "_RELEASE_EVERY", 64 * 1024)
    with LocalStore(root) as store:
        it = store.iter_queue("T", 0, 0)
        halfway = [next(it) for _ in range(500)]
        assert _mapped_rss_kib(prefix) <= 256  # a window behind the reader, not the store
        items = halfway + list(it)
        assert _mapped_rss_kib(prefix) < 64
        # the records' views stay valid: pages fault back in from the page cache
        assert [i.record.body_bytes()[:1] for i in items] == [bytes([i % 256]) for i in range(1000)]
        assert [i.record.physical_offset for i in items] == [a.commitlog_offset for a in appended]
        assert len(rest) == 500


def test_zeroed_record_before_the_tail_is_corruption(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    # not a tail being written: later entries (and their records) exist
    appended = make_store(store_writer, n=12, queues=1)
    a = appended[5]
    patch(cl_path(root, a.commitlog_offset), a.commitlog_offset % FILE, bytes(a.size))
    with LocalStore(root) as store:
        seen, err = _iter_until_error(store)
        assert seen == list(range(5))
        assert (err.source, err.offset) == (str(cl_path(root, a.commitlog_offset)), a.commitlog_offset % FILE)
        # stopping right before it is fine, and so is a read that ends on it
        assert [i.queue_offset for i in store.iter_queue("T", 0, 0, max_count=5)] == list(range(5))
        assert [i.queue_offset for i in store.iter_queue("T", 0, 3, max_count=3)] == [3, 4]
        assert [i.queue_offset for i in store.iter_queue("T", 0, 6)] == list(range(6, 12))


def test_truncated_commitlog_with_later_entries_is_corruption(tmp_path: Path, store_writer) -> None:
    root = tmp_path / "store"
    appended = make_store(store_writer, n=12, queues=1)
    a = appended[8]
    os.truncate(cl_path(root, a.commitlog_offset), a.commitlog_offset % FILE + 20)
    with LocalStore(root) as store:
        seen, err = _iter_until_error(store)
        assert seen == list(range(8)) and err.offset == a.commitlog_offset % FILE


def test_read_gives_a_files_bytes_as_they_are_now_without_mapping(tmp_path: Path) -> None:
    """``FileSet.read`` (the CommitLog pass's ConsumeQueue reads): the bytes
    asked, fewer where the file ends, the file's size, and nothing mapped;
    ``entries_end`` bounds a file's entries by the next file's start."""
    d = tmp_path / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    (d / f"{0:020d}").write_bytes(bytes(range(100)))
    (d / f"{60:020d}").write_bytes(b"\x07" * 30)
    store = LocalStore(tmp_path)
    files = store.queue_files("T", 0)
    assert files.read(0, 10, 20) == (bytes(range(10, 30)), 100)
    assert files.read(0, 90, 20) == (bytes(range(90, 100)), 100)  # the file ends there
    assert files.read(60, 0, 100) == (b"\x07" * 30, 30)
    assert files.read_bytes(0, 95, 20) == bytes(range(95, 100))
    assert files._maps == {}
    assert files.entries_end(0, 100) == 60  # the next file starts at entry 3
    assert files.entries_end(60, 30) == 30  # the last file: its size
    with (d / f"{0:020d}").open("ab") as fh:
        fh.write(b"\x09" * 5)  # grown: read sees it
    assert files.read(0, 98, 20) == (bytes([98, 99]) + b"\x09" * 5, 105)
    (d / f"{0:020d}").unlink()
    with pytest.raises(FileNotFoundError):
        files.read(0, 0, 20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 5000), st.sampled_from([-3, CQ_FILLER_SIZE])), max_size=3000),
       st.integers(0, 3000), st.integers(0, 40), st.integers(0, 5000))
def test_counting_written_entries_as_arrays_counts_them_one_by_one(sizes, first, zeros_after, length):
    """``count_written`` (pending's count, in steps of arrays) against the
    entry by entry count it replaced: entries up to the first of size 0,
    bytes without fillers, whatever the span (a few entries or thousands),
    where it starts and whether the written end is in it."""
    from tiered.store.cqscan import count_written

    table = np.zeros(len(sizes) + zeros_after, CQ_DTYPE)
    table["size"][:len(sizes)] = sizes
    table["phys"] = np.arange(len(table)) * 7
    view = memoryview(table.tobytes())
    rel = min(first, len(table)) * CQ_ENTRY_SIZE
    end = min(len(view), rel + length * CQ_ENTRY_SIZE)
    want_count = want_bytes = 0
    ended = False
    for _phys, size, _tags in CQ_ENTRY.iter_unpack(view[rel:end]):
        if size == 0:
            ended = True
            break
        want_bytes += size if size != CQ_FILLER_SIZE else 0
        want_count += 1
    assert count_written(view, rel, end) == (want_count, want_bytes, ended)


def test_pending_counts_across_files_up_to_the_written_end(tmp_path: Path, store_writer) -> None:
    """Thousands of pending entries over two ConsumeQueue files, the second
    preallocated: counted (and their bytes) up to its first zero entry, at
    most ``max_entries``, never touching the preallocated zeros past it."""
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=1 << 20, cq_entries_per_file=3000) as w:
        for i in range(4500):
            w.put("P", 0, b"x" * (i % 50))
    store = LocalStore(root)
    sizes = [e.record.size for e in store.iter_queue("P", 0, 0)]
    assert store.pending("P", 0, 0) == (4500, sum(sizes))
    assert store.pending("P", 0, 1234) == (4500 - 1234, sum(sizes[1234:]))
    assert store.pending("P", 0, 1234, max_entries=2000) == (2000, sum(sizes[1234:3234]))
    assert store.pending("P", 0, 4500) == (0, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=400), st.integers(0, 50), st.integers(0, 25))
def test_a_first_look_by_reads_finds_the_written_end_the_mapping_finds(tmp_path_factory, sizes, zeros, cut):
    """``written_by_reads`` (a first look at a ConsumeQueue file: its probes
    read, not faulted in) answers as ``cq_written_entries`` over the mapped
    file without a hint, zeros in the middle and all; a file cut since it
    was mapped reads as not written past its end."""
    from tiered.format.codec import cq_written_entries
    from tiered.store.cqscan import written_by_reads

    table = np.zeros(len(sizes) + zeros, CQ_DTYPE)
    table["size"][:len(sizes)] = sizes
    table["phys"] = 1
    data = table.tobytes()
    path = tmp_path_factory.mktemp("cq") / f"{0:020d}"
    path.write_bytes(data)
    n = len(table)
    assert written_by_reads(str(path), n) == cq_written_entries(memoryview(data))
    kept = max(0, len(data) - cut * 7)
    os.truncate(path, kept)
    assert written_by_reads(str(path), n) == cq_written_entries(memoryview(data[:kept] + bytes(len(data) - kept)))


def test_max_offset_at_first_look_and_after(tmp_path: Path, store_writer) -> None:
    """The first look finds a preallocated file's written end by reads (no
    page of the mapping touched); later looks check the hint it left."""
    root = tmp_path / "store"
    with store_writer(commitlog_file_size=1 << 20, cq_entries_per_file=1000) as w:
        for _ in range(1234):
            w.put("M", 0, b"z")
        store = LocalStore(root)
        files = store.queue_files("M", 0)
        assert store.max_offset("M", 0) == 1234
        assert files.written == {20000: 234}  # the last file's, where the written end is
        for _ in range(10):
            w.put("M", 0, b"z")
        w.flush()
        assert store.max_offset("M", 0) == 1244


def _queue_range_by_entries(store: LocalStore, topic: str, queue_id: int) -> QueueRange:
    """``queue_range`` as it was written: each probe through ``_entry``."""
    files = store.queue_files(topic, queue_id)
    max_offset = store._max_offset(files)
    lo, hi = files.starts[0] // CQ_ENTRY_SIZE, max_offset
    min_phys = store.commitlog.starts[0] if store.commitlog.starts else None
    while lo < hi:
        mid = (lo + hi) // 2
        entry = store._entry(files, mid)
        if entry is None or (entry[1] != CQ_FILLER_SIZE and min_phys is not None and entry[0] >= min_phys):
            hi = mid
        else:
            lo = mid + 1
    return QueueRange(lo, max_offset)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(["ok", "ok", "filler", "old", "zero"]), max_size=24),
                          st.sampled_from(["zeros", "end", "cut", "long"])), min_size=1, max_size=4),
       st.integers(0, 3), st.sampled_from([None, 0, 5000]))
def test_queue_range_probes_as_entry_by_entry(tmp_path_factory, files, first_file, commitlog_start):
    """The bisection of ``queue_range`` (keeping the probed file's view
    between probes) finds what probing through ``_entry`` found, over files
    of any shape: fillers, entries below the CommitLog's start, zeros in
    the middle, files cut short or inside an entry or longer than their
    slot, several files."""
    root = tmp_path_factory.mktemp("qr")
    d = root / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    (root / "commitlog").mkdir()
    if commitlog_start is not None:
        (root / "commitlog" / f"{commitlog_start:020d}").write_bytes(b"")
    per_file = 24
    for fi, (kinds, ending) in enumerate(files):
        table = np.zeros(per_file, CQ_DTYPE)
        for i, kind in enumerate(kinds):
            table[i] = {"ok": (6000 + i * 100, 100, 1), "filler": (6000, CQ_FILLER_SIZE, 0),
                        "old": (10 * i, 100, 1), "zero": (0, 0, 0)}[kind]
        data = table.tobytes()
        if ending == "end":
            data = data[:len(kinds) * CQ_ENTRY_SIZE]
        elif ending == "cut":
            data = data[:max(0, len(kinds) * CQ_ENTRY_SIZE - 9)]
        elif ending == "long":  # past the next file's start (a crashed writer's): read there from the next file
            data += np.array([(1, 100, 1)] * 10, CQ_DTYPE).tobytes()
        (d / f"{(first_file + fi) * per_file * CQ_ENTRY_SIZE:020d}").write_bytes(data)
    store, reference = LocalStore(root), LocalStore(root)
    assert store.queue_range("T", 0) == _queue_range_by_entries(reference, "T", 0)


def _resident_kib(path: Path) -> int:
    """This process's resident KiB of its mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.endswith(" " + str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_release_queue_gives_back_the_mapped_pages_of_every_file_and_views_stay_valid(tmp_path: Path) -> None:
    d = tmp_path / "consumequeue" / "T" / "0"
    d.mkdir(parents=True)
    files_bytes = {start: bytes([start % 251 + 1]) * (256 << 10) for start in (0, 256 << 10)}
    for start, data in files_bytes.items():
        (d / f"{start:020d}").write_bytes(data)
    store = LocalStore(tmp_path)
    files = store.queue_files("T", 0)
    views = {start: files.view(start) for start in files_bytes}
    assert all(bytes(views[s]) == data for s, data in files_bytes.items())  # every page touched
    assert all(_resident_kib(d / f"{s:020d}") >= 256 for s in files_bytes)
    store.release_queue("T", 0)
    assert all(_resident_kib(d / f"{s:020d}") == 0 for s in files_bytes)
    assert all(bytes(views[s]) == data for s, data in files_bytes.items())  # faulted in again, same bytes
    store.release_queue("T", 9)  # a queue never read: nothing to give back
