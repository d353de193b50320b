"""The source's reader without Spark: rows answered from the manifests (no
object read), pruned column sets (no body touched) and message-id lookups,
each compared with the local store."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from dispatchkit import BROKER as BROKER_D, CLUSTER as CLUSTER_D, expire_below, new_dispatcher, new_writer, produce
from readerkit import BROKER, CLUSTER
from tiered.clock import ManualClock
from tiered.store.localstore import LocalStore
from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError
from tiered.format.codec import Host, offset_msg_id
from tiered.query.reader import Archive, QueueRef
from tiered.query.spark_schema import COLUMN_NAMES, spark_schema
from tiered.query.spark_source import OptionError, RocketMQDataSource, RocketMQReader, SourceConfig


ENDPOINT: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _endpoint(moto_endpoint: str):  # noqa: ANN202
    """The moto endpoint for s3:// archives (the source's ``endpoint`` option)."""
    ENDPOINT["endpoint"] = moto_endpoint
    yield
    ENDPOINT.clear()


def reader_for(url: str, schema_columns: tuple[str, ...] = COLUMN_NAMES, **options: str) -> RocketMQReader:
    reader = RocketMQDataSource({"path": url, **ENDPOINT, **options}).reader(spark_schema(schema_columns))
    assert isinstance(reader, RocketMQReader)
    return reader


def read_all(reader: RocketMQReader) -> pa.Table:
    batches = [b for part in reader.partitions() for b in reader.read(part)]
    rows = sum(b.num_rows for b in batches)
    table = pa.Table.from_batches(batches) if batches and batches[0].num_columns else None
    return table if table is not None else pa.table({"n": pa.nulls(rows)}).select([])


def ordered(table: pa.Table) -> pa.Table:
    return table.sort_by([("topic", "ascending"), ("queue_id", "ascending"),
                          ("queue_offset", "ascending")]).combine_chunks()


def local_index(local) -> dict[tuple[str, int, int], object]:
    out = {}
    for topic, qid in local.queues():
        for item in local.iter_queue(topic, qid, local.queue_range(topic, qid).min_offset):
            out[(topic, qid, item.queue_offset)] = item.record
    return out


def expire(store) -> set[tuple[str, int, int]]:
    """The cleaner's expiry of Orders/1's first segment (the manifest drops a
    prefix): the (topic, queue, offset) it takes away."""
    m1 = Archive(store).manifest(QueueRef(CLUSTER, BROKER, "Orders", 1))
    ColdTier(store, CLUSTER, BROKER).commit("Orders", 1, lambda cur: replace(cur, segments=cur.segments[1:]))
    return {("Orders", 1, o) for o in range(m1.segments[0].q_start, m1.segments[0].q_end)}


@pytest.fixture
def gapped(cold_url: str, open_cold, tmp_path: Path):
    """A queue whose archive has a recorded gap (the broker deleted records
    before they were archived, as in tests/dispatcher/test_dispatch_baddata.py)
    and a first segment expired by the cleaner: (url, truth) where truth maps
    each queue offset the archive holds to its body, taken from the local
    store before its retention deleted anything."""
    store = open_cold(cold_url)
    sd = tmp_path / "gstore"
    clock = ManualClock(1_700_000_000_000)
    w = new_writer(sd)
    produce(w, "Gapped", 0, 40, clock=clock, body_size=300)
    local = LocalStore(sd)
    d = new_dispatcher(store, local, tmp_path / "gstate", clock, upload_bytes=1, max_delay_ms=0, segment_bytes=4000)
    assert d.run_round().ok
    archived_to = Archive(store).manifest(QueueRef(CLUSTER_D, BROKER_D, "Gapped", 0)).next_offset
    for step in range(20):
        produce(w, "Gapped", 0, 20, clock=clock, body_size=300, seed=step)
    w.flush()
    snapshot = {i.queue_offset: i.record.body_bytes() for i in LocalStore(sd).iter_queue("Gapped", 0, 0)}
    expire_below(sd, sorted(int(f.name) for f in (sd / "commitlog").iterdir())[3])
    deleted_unarchived = set(range(archived_to, LocalStore(sd).queue_range("Gapped", 0).min_offset))
    assert len(deleted_unarchived) > 20
    assert d.run_round().ok
    w.close()
    m = Archive(store).manifest(QueueRef(CLUSTER_D, BROKER_D, "Gapped", 0))
    assert [(g.q_start, g.q_end) for g in m.gaps] == [(archived_to, max(deleted_unarchived) + 1)]
    first = m.segments[0]
    ColdTier(store, CLUSTER_D, BROKER_D).commit("Gapped", 0, lambda cur: replace(cur, segments=cur.segments[1:]))
    expired = set(range(first.q_start, first.q_end))
    truth = {o: b for o, b in snapshot.items() if o not in deleted_unarchived and o not in expired}
    return cold_url, truth


def test_count_from_manifests_is_exact_with_a_gap_and_an_expired_segment(gapped) -> None:
    url, truth = gapped
    assert read_all(reader_for(url, ())).num_rows == len(truth) > 50
    got = read_all(reader_for(url, ("queue_offset",))).column("queue_offset").to_pylist()
    assert sorted(got) == sorted(truth)
    # the same rows by reading every record, bodies included
    full = read_all(reader_for(url, ("queue_offset", "body")))
    assert dict(zip(full.column("queue_offset").to_pylist(), full.column("body").to_pylist())) == truth
    assert full.num_rows == len(truth)


def test_count_and_queue_columns_come_from_manifests_alone(archived) -> None:
    gone = expire(archived.store)
    truth = set(local_index(archived.local)) - gone
    assert len(truth) == 280 - len(gone) and len(gone) > 5
    for columns in ((), ("topic", "queue_id", "queue_offset"), ("cluster", "broker", "queue_offset", "topic")):
        reader = reader_for(archived.url, columns)
        assert reader.from_manifests
        parts = reader.partitions()
        archived.counter.reset()
        table = read_all(reader)
        assert archived.counter.ops["get"] == 0 and archived.counter.ops["head"] == 0  # not an object read
        assert table.num_rows == len(truth)
        if "queue_id" in columns:
            got = zip(table.column("topic").to_pylist(), table.column("queue_id").to_pylist(),
                      table.column("queue_offset").to_pylist())
            assert sorted(got) == sorted(truth)
        elif columns:
            got = Counter(zip(table.column("topic").to_pylist(), table.column("queue_offset").to_pylist()))
            assert got == Counter((t, o) for t, _, o in truth)
            assert set(table.column("cluster").to_pylist()) == {CLUSTER}
            assert set(table.column("broker").to_pylist()) == {BROKER}
        assert len(parts) >= 1 and table.column_names == list(columns)


def test_filters_and_skip_corrupt_still_read_the_records(archived) -> None:
    for options in ({"startTime": "0"}, {"key": "Orders-k7"}, {"skipCorrupt": "true"},
                    {"msgId": "0A00000100009C40000000000000000F"}):
        assert not reader_for(archived.url, ("topic",), **options).from_manifests, options
    assert not reader_for(archived.url, ("topic", "store_timestamp")).from_manifests
    # a count over a time range is exact: the records are read and filtered
    records = local_index(archived.local)
    lo = sorted(r.store_timestamp for r in records.values())[100]
    reader = reader_for(archived.url, (), startTime=str(lo))
    assert read_all(reader).num_rows == sum(1 for r in records.values() if r.store_timestamp >= lo)


def test_a_pruned_read_equals_the_full_read_and_never_touches_bodies(archived) -> None:
    narrow = ("topic", "queue_id", "queue_offset", "store_timestamp", "keys", "unique_key", "body_crc", "store_host")
    full = ordered(read_all(reader_for(archived.url)).select(list(narrow)))
    pruned = ordered(read_all(reader_for(archived.url, narrow)))
    assert pruned.equals(full) and pruned.num_rows == 280
    # a corrupt body (CRC mismatch) fails a read of the body, not a read of other columns
    store = archived.store
    seg = Archive(store).manifest(QueueRef(CLUSTER, BROKER, "Orders", 0)).segments[1]
    obj, _, section = seg.commitlog_key.partition("#")
    at = int(section.split("+")[0]) if section else 0
    data = bytearray(store.get(obj))
    data[at + 88 + 10] ^= 0xFF  # 10 bytes into the first record's body (IPv4 hosts: body at 88)
    store.put(obj, bytes(data))
    assert ordered(read_all(reader_for(archived.url, narrow))).equals(pruned)
    with pytest.raises(CorruptRecordError) as info:
        read_all(reader_for(archived.url, ("queue_offset", "body")))
    assert info.value.source == seg.commitlog_key and "CRC" in str(info.value)


def test_msg_id_finds_one_record_through_a_binary_search(archived) -> None:
    records = local_index(archived.local)
    for (topic, qid, offset) in (("Orders", 0, 0), ("Orders", 1, 77), ("%DLQ%billing", 0, 39), ("Orders", 0, 119)):
        rec = records[(topic, qid, offset)]
        mid = offset_msg_id(rec.store_host, rec.physical_offset)
        assert mid == rec.msg_id
        for text in (mid, mid.lower()):
            reader = reader_for(archived.url, msgId=text)
            archived.counter.reset()
            parts = reader.partitions()
            planned = archived.counter.ops["get"]
            # per queue (3): about 2 * log2(records) header probes, never a data scan
            assert planned <= 3 * 2 * 9 + 10, planned
            table = read_all(reader)
            assert table.num_rows == 1
            row = table.to_pylist()[0]
            assert (row["topic"], row["queue_id"], row["queue_offset"]) == (topic, qid, offset)
            assert row["body"] == rec.body_bytes() and row["commitlog_offset"] == rec.physical_offset
            assert sum(len(p.slices) for p in parts) == 1


def test_msg_id_not_archived_or_of_another_host_gives_no_rows(archived) -> None:
    records = local_index(archived.local)
    gone = expire(archived.store)
    expired = records[sorted(gone)[0]]
    some = records[("Orders", 0, 5)]
    other_host = Host("10.9.9.9", some.store_host.port)
    for mid in (offset_msg_id(expired.store_host, expired.physical_offset),  # expired by the cleaner
                offset_msg_id(some.store_host, some.physical_offset + 1),  # inside a record: no record there
                offset_msg_id(some.store_host, 1 << 40),  # past the end
                offset_msg_id(other_host, some.physical_offset)):  # the offset, on another broker
        assert read_all(reader_for(archived.url, msgId=mid)).num_rows == 0, mid


@pytest.mark.parametrize("bad", ["xyz", "0A0000010000", "0A00000100009C40000000000000000G", "0A" * 20])
def test_a_malformed_msg_id_is_an_option_error(bad: str) -> None:
    with pytest.raises(OptionError) as info:
        SourceConfig.from_options({"path": "file:///nowhere", "msgId": bad})
    assert str(info.value) == ("option msgId: a message id is 32 hex digits (IPv4 store host, or a client "
                               "UNIQ_KEY id) or 56 (IPv6 store host)")


def test_columns_option_is_checked_and_shapes_the_schema() -> None:
    ds = RocketMQDataSource({"path": "file:///nowhere", "columns": "topic, queue_offset"})
    assert [f.name for f in ds.schema().fields] == ["topic", "queue_offset"]
    for bad, words in (("topic,nope", "unknown column nope"), ("topic,topic", "named twice")):
        with pytest.raises(OptionError) as info:
            SourceConfig.from_options({"path": "file:///nowhere", "columns": bad})
        assert words in str(info.value)
    with pytest.raises(OptionError) as info:
        SourceConfig.from_options({"path": "file:///nowhere", "msgId": "0A00000100009C40000000000000000F",
                                   "key": "k"})
    assert "key and msgId" in str(info.value)


def test_scans_from_manifests_are_packed_by_rows() -> None:
    from tiered.query.scan import Slice
    from tiered.query.spark_source import pack_rows

    def sl(q0: int, q1: int) -> Slice:
        return Slice(cluster="c", broker="b", topic="T", queue_id=0, commitlog_key="cl", consumequeue_key="cq",
                     seg_q_start=q0, seg_q_end=q1, seg_cl_start=0, seg_cl_end=100, min_store_ms=0, max_store_ms=0,
                     q_start=q0, q_end=q1)

    a, b, c, big = sl(0, 5), sl(5, 10), sl(10, 15), sl(15, 40)
    assert pack_rows([a, b, c, big], 10) == [[a, b], [c], [big]]
    assert pack_rows([a, b, c], 1 << 30) == [[a, b, c]]
    assert pack_rows([], 10) == []


def test_msg_id_of_an_ipv6_store_host_and_a_client_id(cold_url: str, open_cold, tmp_path: Path,  # noqa: ANN001
                                                       store_writer) -> None:  # noqa: ANN001
    """A 56-digit offset id (IPv6 store host) and a client id (UNIQ_KEY, 32
    hex digits as producers make them) each find their record."""
    from readerkit import archive

    store = open_cold(cold_url)
    six, four = Host("fd00::7", 10911), Host("10.1.2.3", 10911)
    with store_writer("s6") as w:
        for i in range(60):
            w.put("Six", i % 2, f"body-{i}".encode() * 20, keys=[f"k{i}"], unique_key=f"{0xC0A80001 + i:032X}",
                  store_host=six if i % 3 == 0 else four, store_timestamp=1_700_000_000_000 + i)
    local = archive(tmp_path / "s6", store, tmp_path / "st6", segment_bytes=2048)
    records = local_index(local)
    rec = next(r for r in records.values() if r.store_host == six and r.queue_offset == 12)
    mid = offset_msg_id(rec.store_host, rec.physical_offset)
    assert len(mid) == 56
    rows = read_all(reader_for(cold_url, msgId=mid)).to_pylist()
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["body"]) for r in rows] == \
        [("Six", rec.queue_id, 12, rec.body_bytes())]
    client = next(r for r in records.values() if r.queue_offset == 20 and r.queue_id == 1)
    rows = read_all(reader_for(cold_url, msgId=client.unique_key)).to_pylist()
    assert [(r["queue_id"], r["queue_offset"], r["unique_key"]) for r in rows] == [(1, 20, client.unique_key)]


def test_a_time_range_packs_by_the_bytes_it_will_read() -> None:
    from tiered.query.scan import Bounds, Slice
    from tiered.query.spark_source import pack, read_estimate

    def sl(i: int) -> Slice:  # 100 MB over one hour each, hours one after the other
        return Slice(cluster="c", broker="b", topic="T", queue_id=0, commitlog_key=f"cl{i}", consumequeue_key="cq",
                     seg_q_start=0, seg_q_end=1000, seg_cl_start=0, seg_cl_end=100_000_000, min_store_ms=i * 3_600_000,
                     max_store_ms=(i + 1) * 3_600_000 - 1, q_start=0, q_end=1000)

    day = [sl(i) for i in range(24)]
    assert [len(g) for g in pack(day, 128 << 20, 4 << 20)] == [1] * 24
    quarter = Bounds(lo=0, hi=900_000 * 1000 - 1)  # the first 15 minutes
    assert read_estimate(day[0], quarter) == 25_000_000 and read_estimate(day[1], quarter) == 0
    assert read_estimate(day[5], Bounds()) == 100_000_000
    # a range over the whole day reads every byte: a segment a partition, as without one;
    # 15 minutes read a quarter of one segment: one partition (the others cost their open cost)
    every = Bounds(lo=0, hi=24 * 3_600_000 * 1000)
    assert [len(g) for g in pack(day, 128 << 20, 4 << 20, every)] == [1] * 24
    assert [len(g) for g in pack(day, 128 << 20, 4 << 20, quarter)] == [24]


@pytest.mark.parametrize("columns", [COLUMN_NAMES, ("body", "topic"), ("queue_offset",), ()])
def test_the_reader_yields_arrow_batches_spark_passes_through(archived, columns: tuple[str, ...]) -> None:
    """Spark's Python worker hands RecordBatches whose schema equals the one
    it derives from the declared schema straight to the JVM (no conversion
    row by row, pyspark/sql/worker/plan_data_source_read.py); anything else
    fails the query."""
    from pyspark.sql.pandas.types import to_arrow_schema

    expected = to_arrow_schema(spark_schema(columns), timezone="UTC")
    for options in ({}, {"startTime": "0"}, {"key": "Orders-k7"}):
        reader = reader_for(archived.url, columns, **options)
        batches = [b for part in reader.partitions() for b in reader.read(part)]
        assert batches and all(isinstance(b, pa.RecordBatch) and b.schema.equals(expected) for b in batches)


@pytest.mark.parametrize("layout,compression", [(2, "none"), (2, "zstd")])
def test_layout_v2_counts_prunes_and_finds_msg_ids(cold_url: str, open_cold, tmp_path: Path, layout: int,
                                                   compression: str) -> None:
    """The same paths over one-object segments (v2), plain and zstd-compressed."""
    from readerkit import SPECS_V2, archive, write_store

    store = open_cold(cold_url)
    write_store(tmp_path / "s", SPECS_V2)
    local = archive(tmp_path / "s", store, tmp_path / "st", layout=layout, compression=compression)
    assert all(s.layout == 2 for m in (Archive(store).manifest(r) for r in Archive(store).queues())
               for s in m.segments)
    records = local_index(local)
    assert read_all(reader_for(cold_url, ())).num_rows == len(records) == 140
    narrow = ("topic", "queue_id", "queue_offset", "tags", "store_timestamp")
    full = ordered(read_all(reader_for(cold_url)).select(list(narrow)))
    assert ordered(read_all(reader_for(cold_url, narrow))).equals(full)
    for key in (("Orders", 1, 33), ("%DLQ%billing", 0, 7)):
        rec = records[key]
        rows = read_all(reader_for(cold_url, msgId=offset_msg_id(rec.store_host, rec.physical_offset))).to_pylist()
        assert [(r["topic"], r["queue_id"], r["queue_offset"], r["body"]) for r in rows] == \
            [(*key, rec.body_bytes())]
