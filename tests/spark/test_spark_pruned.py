"""What Spark 4.1-4.3 let a Python source prune, on a real ``local[2]``: a
DataFrame declared with fewer columns (the ``columns`` option or
``.schema(...)``) decodes only those, and one of queue columns only (or none)
is answered from the manifests; the ``msgId`` option reads one record.
Truth comes from the local store."""

from __future__ import annotations

import glob
import json
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql.types import StructType

from readerkit import local_rows
from tiered.format.codec import Host, offset_msg_id
from tiered.query.spark_source import load, register

pytestmark = pytest.mark.spark


@pytest.fixture
def archived(build, tmp_path: Path):
    url = f"file://{tmp_path / 'cold'}"
    _, local, _ = build(url)
    return url, local_rows(local)


def stats(path: Path) -> list[dict]:
    return [json.loads(line) for f in glob.glob(str(path / "*.jsonl")) for line in open(f)]


def test_count_over_queue_columns_reads_no_object(spark, archived, tmp_path: Path) -> None:
    url, rows = archived
    by_topic = Counter(r["topic"] for r in rows)
    register(spark)
    st = tmp_path / "stats"
    df = load(spark, url, columns="topic,queue_id,queue_offset", statsPath=str(st))
    assert df.columns == ["topic", "queue_id", "queue_offset"]
    assert df.count() == len(rows) == 280
    df.createOrReplaceTempView("q")
    got = {r[0]: r[1] for r in spark.sql("SELECT topic, count(*) FROM q GROUP BY topic").collect()}
    assert got == dict(by_topic)
    keys = sorted(tuple(r) for r in spark.sql("SELECT topic, queue_id, queue_offset FROM q").collect())
    assert keys == sorted((r["topic"], r["queue_id"], r["queue_offset"]) for r in rows)
    done = stats(st)
    assert done and all(s["requests"] == 0 and s["bytes"] == 0 for s in done)
    # no column at all (a DataFrame made for counting): the same answer
    empty = spark.read.format("rocketmq").schema(StructType([])).load(url)
    assert empty.count() == 280


def test_pruned_columns_equal_the_full_read(spark, archived) -> None:
    url, rows = archived
    cols = "topic,queue_offset,store_timestamp,keys,body_crc"
    pruned = load(spark, url, columns=cols)
    full = load(spark, url).selectExpr(*cols.split(","))
    assert pruned.schema == full.schema
    assert sorted(map(tuple, pruned.collect())) == sorted(map(tuple, full.collect()))
    assert pruned.where("topic = 'Orders'").selectExpr("sum(body_crc)").collect()[0][0] == \
        sum(r["body_crc"] for r in rows if r["topic"] == "Orders")


def test_msg_id_reads_one_record(spark, archived, tmp_path: Path) -> None:
    url, rows = archived
    target = next(r for r in rows if r["topic"] == "%DLQ%billing" and r["queue_offset"] == 8)  # an IPv6 born host
    host = Host.parse(target["store_host"])
    mid = offset_msg_id(host, target["commitlog_offset"])
    st = tmp_path / "stats"
    got = load(spark, url, msgId=mid, statsPath=str(st)).collect()
    assert len(got) == 1
    row = got[0]
    assert (row["topic"], row["queue_id"], row["queue_offset"]) == ("%DLQ%billing", 0, 8)
    assert bytes(row["body"]) == target["body"] and row["commitlog_offset"] == target["commitlog_offset"]
    assert sum(s["rows"] for s in stats(st)) == 1
    # the same id through SQL, and one nobody stored
    spark.sql(f"CREATE OR REPLACE TEMP VIEW one USING rocketmq OPTIONS (path '{url}', msgId '{mid}')")
    assert spark.sql("SELECT queue_offset FROM one").collect()[0][0] == 8
    missing = offset_msg_id(host, target["commitlog_offset"] + 1)
    assert load(spark, url, msgId=missing).count() == 0


def test_a_malformed_msg_id_fails_the_load_naming_the_option(spark, archived) -> None:
    url, _ = archived
    register(spark)
    with pytest.raises(Exception) as info:
        spark.read.format("rocketmq").option("msgId", "not-an-id").load(url)
    assert "option msgId" in str(info.value)
