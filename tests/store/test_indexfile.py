"""The broker's index files: read the ones RocketMQ 5.3.3 wrote, write the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered.errors import CorruptRecordError
from tiered.format.codec import Peek, Record, decode_record, peek
from tiered.store.indexfile import (
    HEADER_SIZE,
    IndexFile,
    IndexWriter,
    file_name,
    index_files,
    index_key,
    iter_entries,
    java_string_hash,
    key_hash,
    query_offsets,
    record_keys,
)

SLOTS, ENTRIES = 1500, 6000  # what the fixture's broker ran with (126040-byte files)


def commitlog_records(store: Path) -> list[Record]:
    """Every record of the fixture's CommitLog in offset order."""
    out = []
    for path in sorted((store / "commitlog").iterdir()):
        buf = memoryview(path.read_bytes())
        pos = 0
        while (kind := peek(buf, pos, str(path)))[0] == Peek.RECORD:
            out.append(decode_record(buf, pos, str(path)))
            pos += kind[1]
    return out


def test_java_string_hash() -> None:
    # values java.lang.String.hashCode gave (JDK 21)
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Shipment#SHP-1-a") == -1511044150
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert java_string_hash("é") == 0xE9
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # a surrogate pair: two UTF-16 units
    assert java_string_hash("Hello World") == -862545276
    assert java_string_hash("zzzzzzz") == 215481018
    assert key_hash("polygenelubricants") == 0  # Math.abs(MIN_VALUE) stays negative: the broker uses 0
    assert key_hash("Hello World") == 862545276


def test_record_keys_follow_build_index() -> None:
    props = {"UNIQ_KEY": "U1", "KEYS": "a  b c ", "TAGS": "t"}
    assert record_keys("T", props, 0) == ["T#U1", "T#a", "T#b", "T#c"]
    assert record_keys("T", props, 0x8) == ["T#U1", "T#a", "T#b", "T#c"]  # commit
    assert record_keys("T", props, 0x4) == ["T#U1", "T#a", "T#b", "T#c"]  # prepared: indexed too
    assert record_keys("T", props, 0xC) == []  # rollback
    assert record_keys("T", {"UNIQ_KEY": "", "KEYS": ""}, 0) == []  # empty values are no property
    assert index_key("T", "k") == "T#k"


def test_file_name_is_local_time_to_the_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert file_name(1796170339266) == "20261202001219266"
        monkeypatch.setenv("TZ", "Asia/Shanghai")
        time.tzset()
        assert file_name(1796170339266) == "20261202081219266"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_reads_the_index_rocketmq_wrote(rmq5_unpacked: Path, rmq5_expected: list[dict]) -> None:
    """Every key and unique key of the fixture is found through the broker's
    own index files, with exactly the offsets the broker's lookup gives."""
    index = rmq5_unpacked / "store" / "index"
    files = index_files(index)
    assert [p.name for p in files] == ["20261202001219325", "20261202001255479"]
    first = IndexFile(files[0], hash_slots=SLOTS, entries=ENTRIES)
    assert (first.header.index_count, first.header.end_phy_offset) == (6000, 2118739)
    first.close()
    records = {r["commitlog_offset"]: r for r in rmq5_expected}
    # entries in CommitLog order: the unique key first, then each key (no rollbacks in the fixture)
    written = [(f"{r['topic']}#{k}", off) for off, r in sorted(records.items())
               for k in ([r["unique_key"]] if r.get("unique_key") else []) + r.get("keys", [])]
    assert len(written) == 5999 + 3592
    by_hash: dict[int, list[int]] = {}
    for k, o in reversed(written):  # newest first, every entry whose hash matches
        by_hash.setdefault(key_hash(k), []).append(o)
    assert max(len(v) for v in by_hash.values()) > 1  # some keys repeat or collide
    looked = 0
    for off, r in records.items():
        for key in ([r["unique_key"]] if r.get("unique_key") else []) + r.get("keys", []):
            want = by_hash[key_hash(index_key(r["topic"], key))][:64]
            got = query_offsets(index, r["topic"], key, hash_slots=SLOTS, entries=ENTRIES)
            assert got == want, (r["topic"], key)
            assert off in got or len(want) == 64
            looked += 1
    assert looked == len(written)
    # a time window cuts the answer as the broker's does
    ts = {off: r["store_timestamp"] for off, r in records.items()}
    r = next(r for r in records.values() if r["topic"] == "Shipment" and r.get("keys"))
    assert query_offsets(index, "Shipment", r["keys"][0], begin=ts[r["commitlog_offset"]] + 1000,
                         hash_slots=SLOTS, entries=ENTRIES) == []
    assert query_offsets(index, "Shipment", "no-such-key", hash_slots=SLOTS, entries=ENTRIES) == []


def test_writes_the_files_rocketmq_wrote(rmq5_unpacked: Path, tmp_path: Path) -> None:
    """Given the fixture's records in CommitLog order and the broker's 1500/6000
    sizes, the writer produces the broker's two files byte for byte (names are
    creation times: the writer takes the first record's store time)."""
    store = rmq5_unpacked / "store"
    w = IndexWriter(tmp_path / "index", hash_slots=SLOTS, entries=ENTRIES)
    keys = 0
    for rec in commitlog_records(store):
        keys += w.add(topic=rec.topic, properties=rec.properties, sys_flag=rec.sys_flag,
                      phy=rec.physical_offset, store_ts=rec.store_timestamp)
    written = w.close()
    assert keys == 5999 + 3592
    theirs = index_files(store / "index")
    assert len(written) == len(theirs) == 2
    for mine, real in zip(written, theirs):
        assert mine.path.read_bytes() == real.read_bytes(), real.name
    assert written[0].header.end_timestamp == 1796170375477  # the fixture checkpoint's indexMsgTimestamp
    assert w.end_timestamp == 1796170410080


def test_a_full_file_continues_in_the_next(tmp_path: Path) -> None:
    """Three entries a file (entry 0 unused): a record's keys spill into the
    next file, which begins where the full one ended; every key is found."""
    w = IndexWriter(tmp_path / "index", hash_slots=7, entries=3)
    t0 = 1_700_000_000_000
    for i in range(5):
        w.add(topic="T", properties={"UNIQ_KEY": f"U{i}", "KEYS": f"k{i} shared"}, sys_flag=0,
              phy=1000 * i, store_ts=t0 + 1500 * i)
    w.add(topic="T", properties={"UNIQ_KEY": "RB", "KEYS": "shared"}, sys_flag=0xC, phy=9000, store_ts=t0 + 9000)
    files = w.close()
    assert [f.header.index_count for f in files] == [3] * 7 + [2]  # 15 keys, 2 a file
    assert files[1].header.begin_phy_offset == 0 and files[1].header.begin_timestamp == t0
    assert files[2].header.begin_timestamp == t0 + 1500  # the first put moves the begin
    names = [f.path.name for f in files]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert file_name(t0) == names[0]
    kw = {"hash_slots": 7, "entries": 3}
    d = tmp_path / "index"
    for i in range(5):
        assert query_offsets(d, "T", f"U{i}", **kw) == [1000 * i]
        assert query_offsets(d, "T", f"k{i}", **kw) == [1000 * i]
    assert query_offsets(d, "T", "shared", **kw) == [4000, 3000, 2000, 1000, 0]
    assert query_offsets(d, "T", "shared", max_num=2, **kw) == [4000, 3000]
    assert query_offsets(d, "T", "RB", **kw) == []  # rollback: not indexed
    assert query_offsets(d, "T", "shared", begin=t0 + 3000, **kw) == [4000, 3000, 2000]
    f = IndexFile(files[0].path, **kw)
    assert [e[1] for e in iter_entries(f)] == [0, 0]
    f.close()


def test_default_size_is_sparse(tmp_path: Path) -> None:
    w = IndexWriter(tmp_path / "index")
    w.add(topic="T", properties={"UNIQ_KEY": "U"}, sys_flag=0, phy=64, store_ts=1_700_000_000_000)
    (f,) = w.close()
    st = f.path.stat()
    assert st.st_size == HEADER_SIZE + 5_000_000 * 4 + 20_000_000 * 20
    assert st.st_blocks * 512 <= 64 * 1024
    assert query_offsets(tmp_path / "index", "T", "U") == [64]


def test_bad_files(tmp_path: Path) -> None:
    assert query_offsets(tmp_path / "absent", "T", "k") == []
    d = tmp_path / "index"
    w = IndexWriter(d, hash_slots=7, entries=3)
    w.add(topic="T", properties={"KEYS": "k"}, sys_flag=0, phy=5, store_ts=1_700_000_000_000)
    (f,) = w.close()
    with pytest.raises(CorruptRecordError) as err:  # sized for another broker configuration
        query_offsets(d, "T", "k", hash_slots=8, entries=3)
    assert err.value.source == str(f.path)
    # a slot pointing past indexCount is ignored, as the broker ignores it
    raw = bytearray(f.path.read_bytes())
    slot = HEADER_SIZE + key_hash("T#k") % 7 * 4
    raw[slot:slot + 4] = (9).to_bytes(4, "big")
    f.path.write_bytes(raw)
    assert query_offsets(d, "T", "k", hash_slots=7, entries=3) == []
