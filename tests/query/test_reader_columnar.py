"""The column-wise decoder against the record-at-a-time codec, and its checks."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from tiered.format.codec import CQ_ENTRY, Host, MagicVersion, Message, decode_record, encode_record
from tiered.query.columnar import BatchDecoder, QueueInfo, Where, check_entries, parse_entries
from tiered.errors import CorruptRecordError
from tiered.query.spark_schema import arrow_schema, spark_schema

BASE = 5000  # cold CommitLog offset of the object's first byte
Q0 = 700  # queue offset of the first record


def make(topic: str, n: int, seed: int, *, version: MagicVersion | None = None, mixed: bool = False
         ) -> tuple[bytes, bytes, list[bytes]]:
    rng = random.Random(seed)
    cl, cq, raws = bytearray(), bytearray(), []
    for i in range(n):
        props = {}
        if rng.random() < 0.8:
            props["KEYS"] = " ".join(f"k{rng.randrange(50)}" for _ in range(rng.randrange(0, 4))) + \
                            ("  " if rng.random() < 0.1 else "")
        if rng.random() < 0.7:
            props["TAGS"] = rng.choice(["a", "b", "ünï"])
        if rng.random() < 0.9:
            props["UNIQ_KEY"] = f"U{i:06d}"
        if rng.random() < 0.2:
            props["DELAY"] = str(rng.randrange(1, 19)) if rng.random() < 0.8 else "x"
        if rng.random() < 0.2:
            props[rng.choice(["RETRY_TOPIC", "REAL_TOPIC", "DLQ_ORIGIN_TOPIC"])] = "Origin"
        if rng.random() < 0.3:
            props["val=ue"] = "with \x03 odd chars ✓"
        six_b = mixed and rng.random() < 0.3
        six_s = mixed and rng.random() < 0.2
        v = version if version is not None else (rng.choice([MagicVersion.V1, MagicVersion.V2]) if mixed else None)
        msg = Message(
            topic=topic, queue_id=2, body=rng.randbytes(rng.choice([0, 1, 13, 300])), properties=props,
            flag=rng.randrange(-5, 5), sys_flag=rng.choice([0, 0x8]), born_timestamp=1_700_000_000_000 + i,
            born_host=Host("2001:db8::1", 7) if six_b else Host(f"10.1.0.{i % 7}", 3000 + i % 2),
            store_timestamp=1_700_000_000_500 + i, store_host=Host("::1", 10911) if six_s else Host("127.0.0.1", 10911),
            reconsume_times=rng.randrange(3), queue_offset=Q0 + i, physical_offset=10 ** 9 + i * 977, version=v,
        )
        raw = encode_record(msg)
        cq += CQ_ENTRY.pack(BASE + len(cl), len(raw), 0)
        cl += raw
        raws.append(raw)
    return bytes(cl), bytes(cq), raws


def decode(cl: bytes, cq: bytes, topic: str, **kw) -> tuple[pa.RecordBatch, BatchDecoder]:
    where = Where("q/commitlog/x", BASE, "q/consumequeue/x", Q0)
    offsets, sizes = parse_entries(cq, where, Q0)
    check_entries(offsets, sizes, BASE, len(cl), where, Q0)
    dec = BatchDecoder(QueueInfo("C", "B", topic, 2), **kw)
    return dec.decode(pa.py_buffer(cl), BASE, offsets, sizes, Q0, where), dec


def expected_row(raw: bytes) -> dict:
    rec = decode_record(memoryview(raw), 0)
    d = rec.to_dict()
    props = d["properties"]
    real = next((props[p] for p in ("RETRY_TOPIC", "DLQ_ORIGIN_TOPIC", "REAL_TOPIC") if p in props), d["topic"])
    try:
        delay = int(props["DELAY"]) if "DELAY" in props else None
    except ValueError:
        delay = None
    utc = lambda ms: datetime.fromtimestamp(ms / 1000, tz=timezone.utc)  # noqa: E731
    return {"topic": d["topic"], "queue_id": d["queue_id"], "queue_offset": d["queue_offset"],
            "commitlog_offset": d["commitlog_offset"], "born_timestamp": utc(d["born_timestamp"]),
            "store_timestamp": utc(d["store_timestamp"]), "born_host": d["born_host"], "store_host": d["store_host"],
            "sys_flag": d["sys_flag"], "flag": d["flag"], "reconsume_times": d["reconsume_times"], "tags": d["tags"],
            "keys": d["keys"], "unique_key": d["unique_key"], "properties": list(props.items()),
            "body": rec.body_bytes(), "body_crc": d["body_crc"], "delay_level": delay, "real_topic": real,
            "cluster": "C", "broker": "B"}


@pytest.mark.parametrize("topic,mixed,version", [
    ("Orders", False, None),
    ("%DLQ%group-with-a-long-name", True, None),  # v1 and v2, IPv4 and IPv6 in one run
    ("T" * 200, False, MagicVersion.V2),  # only v2 can carry it
])
def test_columns_equal_the_codec(topic: str, mixed: bool, version) -> None:
    cl, cq, raws = make(topic, 300, seed=len(topic), version=version, mixed=mixed)
    batch, dec = decode(cl, cq, topic)
    assert batch.schema == arrow_schema()
    assert batch.to_pylist() == [expected_row(r) for r in raws]
    assert dec.skipped == 0


def test_schema_is_what_spark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(spark_schema(), timezone="UTC").equals(arrow_schema())


def test_a_column_subset_decodes_only_those() -> None:
    cl, cq, raws = make("Orders", 50, seed=3)
    batch, _ = decode(cl, cq, "Orders", columns=("queue_offset", "tags"))
    assert batch.schema.names == ["queue_offset", "tags"]
    assert batch.column(0).to_pylist() == list(range(Q0, Q0 + 50))


def _flip(cl: bytes, at: int) -> bytes:
    b = bytearray(cl)
    b[at] ^= 0x41
    return bytes(b)


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("what,reason", [("body", "CRC"), ("magic", "magic"), ("queue_offset", "queue offset")])
def test_corrupt_record_names_object_and_offset_or_is_skipped(mixed: bool, what: str, reason: str) -> None:
    cl, cq, raws = make("Orders", 40, seed=11, mixed=mixed)
    victim = 17
    pos = sum(len(r) for r in raws[:victim])
    rec = decode_record(memoryview(raws[victim]), 0)
    assert rec.body_length > 0
    at = {"magic": pos + 5, "queue_offset": pos + 27, "body": pos + rec.body_start + rec.body_length // 2}[what]
    bad = _flip(cl, at)
    with pytest.raises(CorruptRecordError) as info:
        decode(bad, cq, "Orders")
    assert info.value.source == "q/commitlog/x" and info.value.offset == pos
    assert reason in str(info.value) and f"queue offset {Q0 + victim}" in str(info.value)

    batch, dec = decode(bad, cq, "Orders", skip_corrupt=True)
    assert dec.skipped == 1
    assert batch.column("queue_offset").to_pylist() == [Q0 + i for i in range(40) if i != victim]
    assert batch.column("body").to_pylist() == [decode_record(memoryview(r), 0).body_bytes()
                                                for i, r in enumerate(raws) if i != victim]


def test_corrupt_consumequeue_entry_is_named() -> None:
    cl, cq, _ = make("Orders", 10, seed=5)
    bad = bytearray(cq)
    bad[3 * 20 + 7] ^= 1  # entry 3's CommitLog offset
    where = Where("q/commitlog/x", BASE, "q/consumequeue/x", Q0 - 100)
    offsets, sizes = parse_entries(bytes(bad), where, Q0)
    with pytest.raises(CorruptRecordError) as info:
        check_entries(offsets, sizes, BASE, len(cl), where, Q0)
    assert info.value.source == "q/consumequeue/x" and info.value.offset == (100 + 3) * 20


def test_a_slice_read_in_pieces_equals_one_read(tmp_path, monkeypatch) -> None:
    """Large slices are fetched in pieces (each while the previous one is
    decoded); the rows are the same and each piece is one ranged GET."""
    import tiered.query.scan as scan
    from readerkit import CLUSTER, BROKER, TopicSpec, archive, write_store
    from tiered.query.reader import ColdReader, QueueRef, ReadStats
    from tiered.archive.storage import open_store

    write_store(tmp_path / "store", [TopicSpec("Big", queues=1, messages=120)])
    store = open_store(f"file://{tmp_path / 'cold'}")
    archive(tmp_path / "store", store, tmp_path / "state", segment_bytes=1 << 20)
    m = ColdReader(store).archive.manifest(QueueRef(CLUSTER, BROKER, "Big", 0))
    (seg,) = m.segments
    sl = scan.segment_slices(QueueRef(CLUSTER, BROKER, "Big", 0), seg, 0, 1 << 62, 1 << 30)[0]

    def run() -> tuple[list, ReadStats]:
        stats = ReadStats()
        dec = BatchDecoder(QueueInfo(CLUSTER, BROKER, "Big", 0))
        rows = [r for b in scan.read_slice(store, sl, dec, stats=stats) for r in b.to_pylist()]
        return rows, stats

    whole, one = run()
    monkeypatch.setattr(scan, "PIECE_BYTES", 4096)
    pieced, many = run()
    assert pieced == whole and len(whole) == 120
    assert one.gets == 2 and many.gets - 1 >= seg.nbytes // 4096 >= 5  # the ConsumeQueue, then the pieces
    assert many.bytes == one.bytes
