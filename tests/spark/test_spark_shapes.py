"""One loaded DataFrame (or a view of it) read more than once in a query, or by
several threads, returns exactly what separate reads would: truth is computed
from the local store. Plus the errors a user can act on."""

from __future__ import annotations

import glob
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from readerkit import BROKER, CLUSTER, T0, local_rows
from tiered.query.reader import Archive, QueueRef
from tiered.archive import layout
from tiered.archive.storage import open_store
from tiered.cli import app
from tiered.query.spark_source import load, register

pytestmark = pytest.mark.spark

MIN = 60_000
ORDERS, DLQ = "Orders", "%DLQ%billing"


def truth(rows: list[dict], **where) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


@pytest.fixture
def archived(build, tmp_path: Path):
    url = f"file://{tmp_path / 'cold'}"
    _, local, _ = build(url)
    return url, local_rows(local)


def test_one_view_read_twice_in_one_query(spark, archived) -> None:
    url, rows = archived
    register(spark)
    df = spark.read.format("rocketmq").load(url)  # a bare load: no helper, no guard
    df.createOrReplaceTempView("m")
    one = lambda q: tuple(spark.sql(q).collect()[0])  # noqa: E731

    # scalar subqueries with different filters
    assert one(f"SELECT (SELECT count(*) FROM m WHERE topic = '{ORDERS}'), "
               f"(SELECT count(*) FROM m WHERE topic = '{DLQ}')") == (240, 40)
    # a self-union, different filters on each side
    orders_q1 = truth(rows, topic=ORDERS, queue_id=1)
    late = T0 + 200 * MIN
    dlq_late = [r for r in truth(rows, topic=DLQ) if r["store_timestamp"] >= late]
    assert one(f"SELECT count(*), sum(body_crc) FROM (SELECT * FROM m WHERE topic = '{ORDERS}' AND queue_id = 1 "
               f"UNION ALL SELECT * FROM m WHERE topic = '{DLQ}' AND store_timestamp >= timestamp_millis({late}))") \
        == (len(orders_q1) + len(dlq_late), sum(r["body_crc"] for r in orders_q1 + dlq_late))
    # a self-join: the DLQ against Orders at the same queue position
    orders = {(r["queue_id"], r["queue_offset"]): r for r in truth(rows, topic=ORDERS)}
    pairs = [(d, orders[(d["queue_id"], d["queue_offset"])]) for d in truth(rows, topic=DLQ)
             if (d["queue_id"], d["queue_offset"]) in orders]
    assert one(f"SELECT count(*), sum(o.body_crc) FROM m d JOIN m o ON d.queue_id = o.queue_id "
               f"AND d.queue_offset = o.queue_offset WHERE d.topic = '{DLQ}' AND o.topic = '{ORDERS}'") \
        == (len(pairs), sum(o["body_crc"] for _, o in pairs))
    # IN subquery
    delayed = {r["queue_offset"] for r in truth(rows, topic=DLQ) if "DELAY" in r["properties"]}
    want = [r for r in truth(rows, topic=ORDERS) if r["queue_offset"] in delayed]
    assert one(f"SELECT count(*), sum(body_crc) FROM m WHERE topic = '{ORDERS}' AND queue_offset IN "
               f"(SELECT queue_offset FROM m WHERE topic = '{DLQ}' AND delay_level IS NOT NULL)") \
        == (len(want), sum(r["body_crc"] for r in want))
    # a CTE used twice, different filters on each use
    early = T0 + 30 * MIN
    assert one(f"WITH t AS (SELECT * FROM m) SELECT (SELECT count(*) FROM t WHERE topic = '{ORDERS}' AND "
               f"queue_id = 0), (SELECT count(*) FROM t WHERE store_timestamp < timestamp_millis({early}))") \
        == (len(truth(rows, topic=ORDERS, queue_id=0)), sum(1 for r in rows if r["store_timestamp"] < early))
    # the DataFrame API: one DataFrame joined with itself
    a = df.where(f"topic = '{DLQ}'").select("queue_id", "queue_offset")
    b = df.where(f"topic = '{ORDERS}'").select("queue_id", "queue_offset", "body_crc")
    assert a.join(b, ["queue_id", "queue_offset"]).selectExpr("count(*)", "sum(body_crc)").collect()[0] == (
        len(pairs), sum(o["body_crc"] for _, o in pairs))
    # and after all those filtered queries, an unfiltered one still reads everything
    assert df.count() == len(rows) and df.selectExpr("sum(body_crc)").collect()[0][0] == sum(
        r["body_crc"] for r in rows)


def test_threads_sharing_one_dataframe(spark, archived) -> None:
    url, rows = archived
    register(spark)
    df = spark.read.format("rocketmq").load(url)
    queries = [(f"topic = '{ORDERS}' AND queue_id = 0", truth(rows, topic=ORDERS, queue_id=0)),
               (f"topic = '{DLQ}'", truth(rows, topic=DLQ)),
               (f"store_timestamp < timestamp_millis({T0 + 40 * MIN})",
                [r for r in rows if r["store_timestamp"] < T0 + 40 * MIN]),
               ("true", rows)]
    jobs = [queries[i % len(queries)] for i in range(12)]

    def run(job):  # noqa: ANN001, ANN202
        cond, _ = job
        return tuple(df.where(cond).selectExpr("count(*)", "sum(body_crc)").collect()[0])

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(run, jobs))
    assert got == [(len(want), sum(r["body_crc"] for r in want)) for _, want in jobs]


def sql(url: str, query: str, *options: str):
    args = ["sql", query, "--cold", url, "--json"]
    for o in options:
        args += ["--option", o]
    return CliRunner().invoke(app, args)


def test_sql_command_is_exact_and_names_the_cause(spark, archived, build, tmp_path: Path) -> None:
    url, rows = archived
    result = sql(url, f"SELECT (SELECT count(*) FROM messages WHERE topic = '{ORDERS}') AS a, "
                      f"(SELECT count(*) FROM messages WHERE topic = '{DLQ}') AS b")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"a": 240, "b": 40}
    result = sql(url, f"SELECT count(*) AS n FROM messages d JOIN messages o ON d.queue_id = o.queue_id AND "
                      f"d.queue_offset = o.queue_offset WHERE d.topic = '{DLQ}' AND o.topic = '{ORDERS}'")
    assert result.exit_code == 0, result.output
    orders = {(r["queue_id"], r["queue_offset"]) for r in truth(rows, topic=ORDERS)}
    assert json.loads(result.stdout) == {"n": sum(1 for d in truth(rows, topic=DLQ)
                                                  if (d["queue_id"], d["queue_offset"]) in orders)}

    # the real cause, in one line: an analysis error, a misspelt option, no archive, corrupt data
    bad = sql(url, "SELECT nope FROM messages")  # a query Spark cannot resolve: usage, exit 2
    assert bad.exit_code == 2 and "nope" in bad.stderr and len(bad.stderr.strip().splitlines()) <= 2
    bad = sql(url, "SELECT count(*) FROM messages", "topic=Orders")  # a misspelt option: usage, exit 2
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) <= 2
    assert "OptionError: unknown option topic; the rocketmq source takes: endpoint" in " ".join(bad.stderr.split())
    missing = f"file://{tmp_path / 'nowhere'}"
    bad = sql(missing, "SELECT count(*) FROM messages")  # found before Spark is asked: exit 1, as every reader
    assert bad.exit_code == 1
    assert bad.stderr == f"tiered: no archive at {missing} (nothing under it: check the bucket and prefix)\n"
    store = open_store(url)
    seg = Archive(store).manifest(QueueRef(CLUSTER, BROKER, ORDERS, 1)).segments[1]
    obj, at, _length = layout.split(seg.commitlog_key)  # the records' section of the segment's object
    data = bytearray(store.get(obj))
    pos = int.from_bytes(layout.read_part(store, seg.consumequeue_key)[20:28], "big") - seg.cl_start  # 2nd record
    data[at + pos + 100] ^= 0x55  # inside the body
    store.put(obj, bytes(data))
    # (a query that reads the body: one that does not never touches it, tests/spark/test_spark_sql_prune.py)
    bad = sql(url, f"SELECT count(*), sum(length(body)) FROM messages WHERE topic = '{ORDERS}'")
    assert bad.exit_code == 1 and len(bad.stderr.strip().splitlines()) <= 2
    assert f"CorruptRecordError: {seg.commitlog_key} @ {pos}: queue offset {seg.q_start + 1}: body CRC mismatch" \
        in " ".join(bad.stderr.split())


def test_options_are_checked_at_load(spark, archived, tmp_path: Path) -> None:
    url, _ = archived
    register(spark)
    with pytest.raises(Exception, match=r"unknown option topic; the rocketmq source takes: .*topics"):
        spark.read.format("rocketmq").option("topic", ORDERS).load(url)
    with pytest.raises(Exception, match="option skipCorrupt: expected true or false"):
        spark.read.format("rocketmq").option("skipCorrupt", "maybe").load(url)
    with pytest.raises(Exception, match="option maxPartitionBytes"):
        spark.read.format("rocketmq").option("maxPartitionBytes", "lots").load(url)
    with pytest.raises(Exception, match="option queues: comma-separated queue ids"):
        spark.read.format("rocketmq").option("queues", "first").load(url)
    missing = f"file://{tmp_path / 'nowhere'}"
    with pytest.raises(Exception, match=f"no archive at {missing}"):
        spark.read.format("rocketmq").load(missing).count()


def test_key_option_reads_only_the_indexed_records(spark, archived, tmp_path: Path) -> None:
    url, rows = archived
    stats = tmp_path / "stats"
    for key in ("Orders-k77", "shared-3", "UNIQ%DLQ%billing00000005", "no-such-key"):
        want = sorted((r["topic"], r["queue_id"], r["queue_offset"]) for r in rows
                      if key in r["keys"] or r["unique_key"] == key)
        df = load(spark, url, key=key, statsPath=str(stats / key))
        got = sorted(tuple(r) for r in df.select("topic", "queue_id", "queue_offset").collect())
        assert got == want
    read = [json.loads(line) for f in glob.glob(str(stats / "Orders-k77" / "*.jsonl")) for line in open(f)]
    assert sum(r["rows"] for r in read) == 1 and sum(r["bytes"] for r in read) < 2048  # one record, one entry
