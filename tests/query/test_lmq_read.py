"""LMQ queues in the columnar read (Spark, export): a parent topic's records,
of several parents and layouts, as rows of the LMQ queue; and ``tiered
export`` of the RocketMQ 5.3.3 fixture's LMQ queue."""

from __future__ import annotations

import base64
import glob
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lmqkit import cli_env, invoke, lmq_lines, unconfirmed

from tiered.errors import CorruptRecordError
from tiered.format.codec import CQ_ENTRY, Host, Message, encode_record
from tiered.query.columnar import BatchDecoder, QueueInfo, Where, check_entries, parse_entries

RED = "%LMQ%room-red"
BASE = 5000  # cold CommitLog offset of the first record
Q0 = 40  # LMQ offset of the first record


def _records(bad: int | None = None) -> tuple[bytes, bytes, list[tuple[str, int, int]]]:
    """Records of two parents (different topic lengths, one V2, one IPv6 born
    host) dispatched to RED at offsets Q0.. (record ``bad`` claims the wrong one)."""
    cl, cq, parents = bytearray(), bytearray(), []
    for i in range(6):
        topic, qid = ("ChatRoom", i % 2) if i % 3 else ("Lobby-" + "x" * 140, 0)
        offset = Q0 + i + (1 if i == bad else 0)
        msg = Message(topic=topic, queue_id=qid, queue_offset=100 + i, physical_offset=10**6 + 400 * i,
                      body=b"m%d" % i, born_host=Host("fd12::9", 1) if i == 4 else Host("10.0.0.1", 2),
                      properties={"INNER_MULTI_DISPATCH": f"%LMQ%other,{RED}", "INNER_MULTI_QUEUE_OFFSET": f"9,{offset}",
                                  "KEYS": f"K{i}"})
        raw = encode_record(msg)
        cq += CQ_ENTRY.pack(BASE + len(cl), len(raw), 0)
        cl += raw
        parents.append((topic, qid, 100 + i))
    return bytes(cl), bytes(cq), parents


def _decode(cl: bytes, cq: bytes, **kw: bool) -> tuple[pa.RecordBatch, BatchDecoder]:
    where = Where("q/commitlog/x", BASE, "q/consumequeue/x", Q0)
    offsets, sizes = parse_entries(cq, where, Q0)
    check_entries(offsets, sizes, BASE, len(cl), where, Q0)
    dec = BatchDecoder(QueueInfo("C", "B", RED, 0), **kw)
    return dec.decode(pa.py_buffer(cl), BASE, offsets, sizes, Q0, where), dec


def test_lmq_rows_are_the_parents_records_at_the_lmq_offsets() -> None:
    cl, cq, parents = _records()
    batch, dec = _decode(cl, cq)
    rows = batch.to_pylist()
    assert [(r["topic"], r["queue_id"], r["queue_offset"]) for r in rows] == [(RED, 0, Q0 + i) for i in range(6)]
    assert [r["real_topic"] for r in rows] == [t for t, _, _ in parents]  # the business topic: the parent
    assert [r["commitlog_offset"] for r in rows] == [10**6 + 400 * i for i in range(6)]
    assert [r["keys"] for r in rows] == [[f"K{i}"] for i in range(6)]
    assert [r["body"] for r in rows] == [b"m%d" % i for i in range(6)]
    assert rows[4]["born_host"] == "[fd12::9]:1" and dec.skipped == 0
    count, _ = _decode(cl, cq, columns=())  # count(*): rows without columns
    assert count.num_rows == 6


def test_an_lmq_record_of_another_offset_is_named_or_skipped() -> None:
    cl, cq, _ = _records(bad=2)
    with pytest.raises(CorruptRecordError) as info:
        _decode(cl, cq)
    assert info.value.source == "q/commitlog/x" and info.value.offset == CQ_ENTRY.unpack_from(cq, 40)[0] - BASE
    assert "queue offset 42" in info.value.reason and "gives '%LMQ%room-red' offset 43 != 42" in info.value.reason
    batch, dec = _decode(cl, cq, skip_corrupt=True)
    assert batch.column("queue_offset").to_pylist() == [40, 41, 43, 44, 45] and dec.skipped == 1


def test_export_writes_the_lmq_queue_s_rows(rmq5_store: Path, rmq5_expected: list[dict], tmp_path: Path) -> None:
    store = unconfirmed(rmq5_store)
    cold = f"file://{tmp_path / 'cold'}"
    env = cli_env(tmp_path)
    code, _out, err = invoke(env, "dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", RED)
    assert code == 0, err
    code, _out, err = invoke(env, "export", "--cold", cold, "--to", f"file://{tmp_path / 'out'}")
    assert code == 0, err
    files = glob.glob(str(tmp_path / "out" / "topic=%25LMQ%25room-red" / "date=*" / "*.parquet"))
    rows = sorted(pq.read_table(files[0]).to_pylist(), key=lambda r: r["queue_offset"])
    want = lmq_lines(rmq5_expected, RED)
    assert len(files) == 1 and len(rows) == len(want)
    for row, e in zip(rows, want):
        assert (row["queue_id"], row["queue_offset"], row["commitlog_offset"]) == (0, e["cq_offset"],
                                                                                 e["commitlog_offset"])
        assert (row["unique_key"], row["real_topic"], row["body"]) == (e["unique_key"], "ChatRoom",
                                                                     base64.b64decode(e["body_b64"]))
        assert dict(row["properties"]) == e["properties"]
