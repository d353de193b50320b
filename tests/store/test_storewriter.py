"""StoreWriter writes the broker's exact on-disk layout: checked byte by byte
from the files, independently of the reader."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from tiered.format.codec import Host, Message, encode_record, tags_code
from tiered.store.storewriter import DELAY_LEVELS, SCHEDULE_TOPIC, StoreWriter

BLANK_MAGIC = 0xCBD43194
MAGIC_V1 = 0xDAA320A7


def cl_file(root: Path, start: int) -> Path:
    return root / "commitlog" / f"{start:020d}"


def cq_file(root: Path, topic: str, qid: int, start: int) -> Path:
    return root / "consumequeue" / topic / str(qid) / f"{start:020d}"


def cq_entries(path: Path) -> list[tuple[int, int, int]]:
    data = path.read_bytes()
    out = []
    for i in range(0, len(data) - len(data) % 20, 20):
        entry = struct.unpack_from(">qiq", data, i)
        if entry[1] == 0:
            break
        out.append(entry)
    return out


def test_records_fill_files_then_roll_with_a_filler(tmp_path: Path) -> None:
    body = b"b" * 1000
    with StoreWriter(tmp_path, commitlog_file_size=4096, cq_entries_per_file=1000) as w:
        appended = [w.put("T", 0, body, store_timestamp=1000 + i, born_timestamp=1000 + i) for i in range(6)]
    size = appended[0].size
    assert {a.size for a in appended} == {size}
    per_file = (4096 - 8) // size  # the broker keeps 8 bytes for the filler
    assert per_file == 3
    assert [a.commitlog_offset for a in appended] == [0, size, 2 * size, 4096, 4096 + size, 4096 + 2 * size]
    assert [a.queue_offset for a in appended] == list(range(6))
    first = cl_file(tmp_path, 0).read_bytes()
    assert len(first) == 4096  # preallocated
    assert struct.unpack_from(">iI", first, 3 * size) == (4096 - 3 * size, BLANK_MAGIC)
    assert first[3 * size + 8:] == bytes(4096 - 3 * size - 8)
    second = cl_file(tmp_path, 4096).read_bytes()
    assert len(second) == 4096
    assert second[3 * size:] == bytes(4096 - 3 * size)  # preallocated zero tail
    for i, a in enumerate(appended):
        data = first if a.commitlog_offset < 4096 else second
        rel = a.commitlog_offset % 4096
        total, magic, crc, qid, flag, qoff, phys = struct.unpack_from(">iIiiiqq", data, rel)
        assert (total, magic, crc, qid, flag, qoff, phys) == (
            size, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF, 0, 0, i, a.commitlog_offset)
    assert cq_entries(cq_file(tmp_path, "T", 0, 0)) == [(a.commitlog_offset, size, 0) for a in appended]


def test_record_bytes_equal_the_encoded_message_with_assigned_offsets(tmp_path: Path) -> None:
    msg = Message(topic="T", queue_id=2, body=b"xyz", properties={"TAGS": "A"}, born_timestamp=5, store_timestamp=6,
                  born_host=Host("1.2.3.4", 5), store_host=Host("5.6.7.8", 9))
    with StoreWriter(tmp_path, commitlog_file_size=8192) as w:
        w.put("other", 0, b"first")
        a = w.append(msg)
    assert a.queue_offset == 0
    expected = encode_record(Message(**{**{f: getattr(msg, f) for f in Message.__dataclass_fields__},
                                        "physical_offset": a.commitlog_offset}))
    data = cl_file(tmp_path, 0).read_bytes()
    assert data[a.commitlog_offset:a.commitlog_offset + a.size] == expected
    assert cq_entries(cq_file(tmp_path, "T", 2, 0)) == [(a.commitlog_offset, a.size, tags_code("A"))]


def test_consumequeue_files_roll_and_are_preallocated(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=1 << 20, cq_entries_per_file=4) as w:
        for i in range(10):
            w.put("T", 1, b"%d" % i, tags=f"t{i % 3}")
    files = sorted(os.listdir(tmp_path / "consumequeue" / "T" / "1"))
    assert files == [f"{0:020d}", f"{80:020d}", f"{160:020d}"]
    for name in files:
        assert (tmp_path / "consumequeue" / "T" / "1" / name).stat().st_size == 80
    entries = [e for name in files for e in cq_entries(tmp_path / "consumequeue" / "T" / "1" / name)]
    assert len(entries) == 10
    assert [e[2] for e in entries] == [tags_code(f"t{i % 3}") for i in range(10)]
    assert cq_file(tmp_path, "T", 1, 160).read_bytes()[40:] == bytes(40)


def test_without_preallocation_files_hold_only_written_bytes(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=4096, cq_entries_per_file=4, preallocate=False) as w:
        a = [w.put("T", 0, b"x") for _ in range(5)]
    assert cl_file(tmp_path, 0).stat().st_size == a[-1].commitlog_offset + a[-1].size
    assert cq_file(tmp_path, "T", 0, 0).stat().st_size == 80
    assert cq_file(tmp_path, "T", 0, 80).stat().st_size == 20


def test_reopen_continues_position_and_queue_offsets(tmp_path: Path) -> None:
    kw = dict(commitlog_file_size=4096, cq_entries_per_file=3)
    with StoreWriter(tmp_path, **kw) as w:
        first = [w.put("T", q % 2, b"z" * 900) for q in range(7)]
    with StoreWriter(tmp_path, **kw) as w:
        assert w.position == first[-1].commitlog_offset + first[-1].size
        assert w.next_queue_offset("T", 0) == 4 and w.next_queue_offset("T", 1) == 3
        more = [w.put("T", q % 2, b"z" * 900) for q in range(3)]
    assert [m.queue_offset for m in more] == [4, 3, 5]
    size = first[0].size  # 992: four records and a filler per 4096-byte file
    assert [a.commitlog_offset for a in first] == [0, size, 2 * size, 3 * size, 4096, 4096 + size, 4096 + 2 * size]
    assert [m.commitlog_offset for m in more] == [4096 + 3 * size, 8192, 8192 + size]


def test_reopen_after_a_filler_starts_the_next_file(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=4096) as w:
        a = [w.put("T", 0, b"q" * 1900) for _ in range(2)]
        # the third does not fit: filler written, next file opened
        b = w.put("T", 0, b"q" * 1900)
    assert b.commitlog_offset == 4096
    with StoreWriter(tmp_path, commitlog_file_size=4096) as w:
        assert w.position == 4096 + b.size
    assert a[1].commitlog_offset == a[0].size


def test_reopen_keeps_the_existing_file_size(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=4096) as w:
        for _ in range(3):
            w.put("T", 0, b"q" * 1900)
    with StoreWriter(tmp_path, commitlog_file_size=8192) as w:
        assert w.commitlog_file_size == 4096
        a = w.put("T", 0, b"q" * 1900)
        b = w.put("T", 0, b"q" * 1900)
    assert a.commitlog_offset == 4096 + a.size  # second record of the second 4096-byte file
    assert b.commitlog_offset == 8192  # a third does not fit it
    assert sorted(os.listdir(tmp_path / "commitlog")) == [f"{n:020d}" for n in (0, 4096, 8192)]


def test_record_larger_than_a_file_is_refused(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=4096) as w:
        with pytest.raises(ValueError):
            w.put("T", 0, b"x" * 4096)
    with pytest.raises(ValueError):
        StoreWriter(tmp_path / "small", commitlog_file_size=1024)


def test_delayed_message_goes_to_the_schedule_topic(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16) as w:
        a = w.put("orders", 3, b"later", tags="T", delay_level=4, store_timestamp=1_000_000)
        with pytest.raises(ValueError):
            w.put("orders", 3, b"x", delay_level=19)
    assert (a.topic, a.queue_id) == (SCHEDULE_TOPIC, 3)
    assert DELAY_LEVELS[3] == 30
    (entry,) = cq_entries(cq_file(tmp_path, SCHEDULE_TOPIC, 3, 0))
    assert entry == (0, a.size, 1_000_000 + 30_000)
    raw = cl_file(tmp_path, 0).read_bytes()[:a.size]
    assert b"REAL_TOPIC\x01orders\x02" in raw and b"REAL_QID\x013\x02" in raw and b"DELAY\x014\x02" in raw


def test_retry_and_dlq_topics_carry_reconsume_time(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16) as w:
        r = w.put("%RETRY%grp", 0, b"r", reconsume_times=2)
        d = w.put("%DLQ%grp", 0, b"d", reconsume_times=16)
    raw = cl_file(tmp_path, 0).read_bytes()
    assert b"RECONSUME_TIME\x012\x02" in raw[r.commitlog_offset:r.commitlog_offset + r.size]
    assert b"RECONSUME_TIME\x0116\x02" in raw[d.commitlog_offset:d.commitlog_offset + d.size]
    assert struct.unpack_from(">i", raw, d.commitlog_offset + 72)[0] == 16  # reconsume times field (48 + 8 + 8 + 8)
    assert (tmp_path / "consumequeue" / "%DLQ%grp" / "0").is_dir()


def test_fill_queue_head_writes_broker_fillers(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, cq_entries_per_file=10) as w:
        w.fill_queue_head("T", 0, 13)
        a = w.put("T", 0, b"x")
        w.fill_queue_head("U", 0, 20)  # exactly at a file boundary: no fillers at all
        u = w.put("U", 0, b"y")
        with pytest.raises(ValueError):
            w.fill_queue_head("T", 0, 50)
    assert a.queue_offset == 13 and u.queue_offset == 20
    assert sorted(os.listdir(tmp_path / "consumequeue" / "T" / "0")) == [f"{200:020d}"]
    data = cq_file(tmp_path, "T", 0, 200).read_bytes()
    assert data[:60] == struct.pack(">qiq", 0, 0x7FFFFFFF, 0) * 3
    assert struct.unpack_from(">qiq", data, 60) == (a.commitlog_offset, a.size, 0)
    assert sorted(os.listdir(tmp_path / "consumequeue" / "U" / "0")) == [f"{400:020d}"]
    assert struct.unpack_from(">qiq", cq_file(tmp_path, "U", 0, 400).read_bytes(), 0) == (u.commitlog_offset, u.size, 0)
    with StoreWriter(tmp_path, cq_entries_per_file=10) as w:
        assert w.next_queue_offset("T", 0) == 14


def test_topics_json_registration_and_bak(tmp_path: Path) -> None:
    with StoreWriter(tmp_path) as w:
        w.put("A", 0, b"")
        w.put("A", 3, b"")
        w.set_topic_attribute("A", "reserve.time", "48")
    cfg = json.loads((tmp_path / "config" / "topics.json").read_text())
    a = cfg["topicConfigTable"]["A"]
    assert a["topicName"] == "A" and a["readQueueNums"] == 4 and a["writeQueueNums"] == 4 and a["perm"] == 6
    assert a["attributes"] == {"reserve.time": "48"}
    bak = json.loads((tmp_path / "config" / "topics.json.bak").read_text())
    assert bak["topicConfigTable"]["A"]["attributes"] == {}
    assert not (tmp_path / "config" / "topics.json.tmp").exists()
    with StoreWriter(tmp_path) as w:
        w.set_topic_attribute("A", "reserve.time", None)
        w.put("A", 0, b"")
    cfg = json.loads((tmp_path / "config" / "topics.json").read_text())
    assert cfg["topicConfigTable"]["A"]["attributes"] == {}
    assert cfg["topicConfigTable"]["A"]["readQueueNums"] == 4


def test_checkpoint_layout(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16) as w:
        w.put("A", 0, b"abc")
        w.write_checkpoint(confirm_offset=77)
        pos = w.position
    data = (tmp_path / "checkpoint").read_bytes()
    assert len(data) == 4096
    assert struct.unpack_from(">q", data, 24)[0] == pos
    assert struct.unpack_from(">q", data, 32)[0] == 77


def test_ipv6_hosts_and_long_topic(tmp_path: Path) -> None:
    topic = "L" * 130
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16, store_host=Host("::1", 10911)) as w:
        a = w.put(topic, 0, b"v6", born_host=Host("fe80::1", 7))
    raw = cl_file(tmp_path, 0).read_bytes()[:a.size]
    assert struct.unpack_from(">I", raw, 4)[0] == 0xDAA320AB
    assert struct.unpack_from(">i", raw, 36)[0] & 0x30 == 0x30
    assert raw[48:64] == bytes.fromhex("fe800000000000000000000000000001")
    assert raw[76:92] == bytes(15) + b"\x01"


def test_reopen_keeps_the_existing_consumequeue_file_size(tmp_path: Path) -> None:
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16, cq_entries_per_file=4) as w:
        for i in range(6):
            w.put("T", 0, b"x")
        w.put("U", 0, b"u")
    with StoreWriter(tmp_path, commitlog_file_size=1 << 16, cq_entries_per_file=1000) as w:
        assert w.cq_file_bytes == 80
        a = w.put("T", 0, b"y")
        b = w.put("U", 0, b"v")
    assert (a.queue_offset, b.queue_offset) == (6, 1)
    assert cq_entries(cq_file(tmp_path, "T", 0, 80))[-1] == (a.commitlog_offset, a.size, 0)
    assert cq_file(tmp_path, "T", 0, 0).stat().st_size == 80
    assert cq_entries(cq_file(tmp_path, "U", 0, 0))[-1] == (b.commitlog_offset, b.size, 0)
    # only single preallocated files: their length is the file size
    other = tmp_path / "other"
    with StoreWriter(other, commitlog_file_size=1 << 16, cq_entries_per_file=7) as w:
        w.put("T", 0, b"x")
    with StoreWriter(other, commitlog_file_size=1 << 16, cq_entries_per_file=1000) as w:
        assert w.cq_file_bytes == 140
