"""The ``rocketmq`` data source on a real Spark ``local[2]``, reading moto S3 and file://."""

from __future__ import annotations

import glob
import json
import os
import zlib
from datetime import datetime, timezone
from pathlib import Path

import pytest

from readerkit import BROKER, CLUSTER, T0
from tiered.archive import layout
from tiered.query.reader import ColdReader, QueueRef
from tiered.query.spark_source import load, plan_partitions

pytestmark = pytest.mark.spark

MIN = 60_000


def local_rows(local) -> list[dict]:
    out = []
    for topic, qid in local.queues():
        for item in local.iter_queue(topic, qid, local.queue_range(topic, qid).min_offset):
            d = item.record.to_dict()
            d["body"] = item.record.body_bytes()
            out.append(d)
    return out


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def read(spark, url: str, moto_endpoint: str, **options: str):
    return load(spark, url, endpoint=moto_endpoint, **options)


def stats_of(path: Path) -> list[dict]:
    return [json.loads(line) for f in glob.glob(str(path / "*.jsonl")) for line in open(f)]


def test_results_equal_the_local_store(spark, build, cold_url: str, moto_endpoint: str, tmp_path: Path,
                                      s3_server: str) -> None:
    store, local, keys = build(cold_url)
    expected = local_rows(local)
    secrets = {"access_key_id": "AKIA-SPARK-TEST", "secret_access_key": "s3cr3t-never-shown"}
    if s3_server != "moto":  # a server that checks keys: its own (never shown either)
        secrets = {"access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
                   "secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
    df = read(spark, cold_url, moto_endpoint, **(secrets if cold_url.startswith("s3") else {}))
    assert df.count() == len(expected)
    by_topic = {r["topic"]: r["n"] for r in df.groupBy("topic").agg({"*": "count"})
                .withColumnRenamed("count(1)", "n").collect()}
    assert by_topic == {"Orders": 240, "%DLQ%billing": 40}
    assert df.selectExpr("sum(body_crc)").collect()[0][0] == sum(r["body_crc"] for r in expected)
    assert df.selectExpr("sum(crc32(body))").collect()[0][0] == sum(zlib.crc32(r["body"]) for r in expected)

    # a time range: [T0 + 30 min, T0 + 90 min)
    lo, hi = T0 + 30 * MIN, T0 + 90 * MIN
    n = df.where(f"store_timestamp >= timestamp_millis({lo}) AND store_timestamp < timestamp_millis({hi})").count()
    assert n == sum(1 for r in expected if lo <= r["store_timestamp"] < hi)

    # a key lookup, by KEYS entry and by UNIQ_KEY
    hit = df.where("array_contains(keys, 'Orders-k77') OR unique_key = 'UNIQ%DLQ%billing00000005'") \
        .select("topic", "queue_id", "queue_offset").collect()
    assert sorted(tuple(r) for r in hit) == sorted([keys["Orders-k77"], ("%DLQ%billing", 0, 5)])

    # every column of the DLQ topic (IPv6 hosts, delay properties) equals the local record
    rows = {r["queue_offset"]: r for r in df.where("topic = '%DLQ%billing'").collect()}
    for d in (r for r in expected if r["topic"] == "%DLQ%billing"):
        row = rows[d["queue_offset"]]
        assert row["queue_id"] == d["queue_id"] and row["commitlog_offset"] == d["commitlog_offset"]
        # collected timestamps are naive, in the session time zone (UTC in the fixture)
        assert row["store_timestamp"] == utc(d["store_timestamp"]).replace(tzinfo=None)
        assert row["born_timestamp"] == utc(d["born_timestamp"]).replace(tzinfo=None)
        assert row["born_host"] == d["born_host"] and row["store_host"] == d["store_host"]
        assert (row["sys_flag"], row["flag"], row["reconsume_times"]) == (d["sys_flag"], d["flag"],
                                                                         d["reconsume_times"])
        assert (row["tags"], row["keys"], row["unique_key"]) == (d["tags"], d["keys"], d["unique_key"])
        assert dict(row["properties"]) == d["properties"] and bytes(row["body"]) == d["body"]
        assert row["body_crc"] == d["body_crc"]
        delayed = "DELAY" in d["properties"]
        assert row["delay_level"] == (3 if delayed else None)
        assert row["real_topic"] == ("%DLQ%billing-real" if delayed else "%DLQ%billing")
        assert (row["cluster"], row["broker"]) == (CLUSTER, BROKER)

    # the same DataFrame queried again without a filter is not pruned by the last query's filters
    assert df.count() == len(expected)
    assert sorted(r[0] for r in df.select("topic").distinct().collect()) == ["%DLQ%billing", "Orders"]

    if cold_url.startswith("s3"):
        plan = df.where("topic = 'Orders'")._jdf.queryExecution().toString()
        assert "s3cr3t-never-shown" not in plan and "AKIA-SPARK-TEST" not in plan


def test_options_prune_segments_before_reading(spark, build, tmp_path: Path, moto_endpoint: str) -> None:
    url = f"file://{tmp_path / 'cold'}"
    store, local, _ = build(url)
    reader = ColdReader(store)
    manifests = reader.archive.manifests(reader.archive.queues())
    segments = {ref: m.segments for ref, m in manifests.items()}
    total = sum(len(s) for s in segments.values())
    dlq = segments[QueueRef(CLUSTER, BROKER, "%DLQ%billing", 0)]
    one_each = {"openCostInBytes": "1MiB", "maxPartitionBytes": "1MiB"}  # one partition per segment

    # a topics option: planning keeps that topic's segments only, and Spark reads only those
    parts, plan = plan_partitions({"path": url, "topics": "%DLQ%billing", **one_each})
    assert plan.segments_kept == len(dlq) < total and len(parts) == len(dlq)
    stats = tmp_path / "stats-topic"
    df = read(spark, url, moto_endpoint, statsPath=str(stats), topics="%DLQ%billing", **one_each)
    assert df.rdd.getNumPartitions() == len(dlq)
    assert df.count() == 40
    read_slices = [s for r in stats_of(stats) for s in r["slices"]]
    assert len(read_slices) == len(dlq) and all("/%DLQ%billing/" in s for s in read_slices)

    # one hour of Orders (4 hours of data): only the segments overlapping it are read, and inside
    # them only about that hour
    lo, hi = T0 + 60 * MIN, T0 + 120 * MIN
    window = {"startTime": str(lo), "endTime": str(hi)}
    parts, plan = plan_partitions({"path": url, **window, **one_each})
    overlapping = [s for ss in segments.values() for s in ss if s.max_store_ms >= lo and s.min_store_ms < hi]
    assert plan.segments_kept == len(overlapping) < total / 2
    stats = tmp_path / "stats-hour"
    df = read(spark, url, moto_endpoint, statsPath=str(stats), **window, **one_each)
    assert df.count() == 60
    got = stats_of(stats)
    assert sum(len(r["slices"]) for r in got) == len(overlapping)
    archived_bytes = sum(s.nbytes + 20 * s.messages for ss in segments.values() for s in ss)
    assert sum(r["bytes"] for r in got) < 0.4 * archived_bytes
    assert df.selectExpr("min(store_timestamp)", "max(store_timestamp)").collect()[0] == (
        utc(lo).replace(tzinfo=None), utc(hi - MIN).replace(tzinfo=None))

    # a column subset given as the schema decodes only those columns
    sub = spark.read.format("rocketmq").schema("topic string, queue_offset bigint, keys array<string>").load(url)
    assert sub.where("topic = 'Orders'").count() == 240 and sub.columns == ["topic", "queue_offset", "keys"]


def test_corrupt_object_is_named_or_skipped_and_counted(spark, build, tmp_path: Path, moto_endpoint: str) -> None:
    url = f"file://{tmp_path / 'cold'}"
    store, local, _ = build(url)
    seg = ColdReader(store).archive.manifest(QueueRef(CLUSTER, BROKER, "Orders", 1)).segments[2]
    obj = layout.object_of(seg.commitlog_key)  # records first in either layout
    data = bytearray(store.get(obj))
    cq = layout.read_part(store, seg.consumequeue_key)
    pos = int.from_bytes(cq[40:48], "big") - seg.cl_start  # the segment's third record
    data[pos + 120] ^= 0x55  # inside its body
    store.put(obj, bytes(data))

    with pytest.raises(Exception) as info:
        read(spark, url, moto_endpoint).count()
    message = str(info.value)
    assert f"{seg.commitlog_key} @ {pos}" in message and "CRC" in message

    stats = tmp_path / "stats"
    df = read(spark, url, moto_endpoint, skipCorrupt="true", statsPath=str(stats))
    assert df.count() == 280 - 1
    assert sum(r["skipped"] for r in stats_of(stats)) == 1
    problems = [p for r in stats_of(stats) for p in r["problems"]]
    assert any(seg.commitlog_key in p for p in problems)


def test_sql_command_runs_on_the_messages_view(spark, build, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tiered.cli import app

    url = f"file://{tmp_path / 'cold'}"
    build(url)
    result = CliRunner().invoke(app, ["sql", "SELECT topic, count(*) AS n, min(queue_offset) AS first FROM messages "
                                             "GROUP BY topic ORDER BY topic", "--cold", url, "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows == [{"topic": "%DLQ%billing", "n": 40, "first": 0}, {"topic": "Orders", "n": 240, "first": 0}]
    start = datetime.fromtimestamp((T0 + 200 * MIN) / 1000, tz=timezone.utc).isoformat()
    result = CliRunner().invoke(app, ["sql", "SELECT count(*) AS n FROM messages", "--cold", url,
                                      "--option", f"startTime={start}", "--option", "topics=Orders", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"n": 40}
    # a query Spark cannot resolve is a usage error (exit 2), one line
    bad = CliRunner().invoke(app, ["sql", "SELECT nope FROM messages", "--cold", url])
    assert bad.exit_code == 2 and "nope" in bad.stderr and len(bad.stderr.splitlines()) == 1
    # the table: the output layer's, 80 columns off a terminal, every cell whole
    result = CliRunner().invoke(app, ["sql", "SELECT topic, count(*) AS n FROM messages GROUP BY topic ORDER BY topic",
                                      "--cold", url])
    assert result.exit_code == 0, result.output
    assert [ln.split() for ln in result.stdout.splitlines()] == [["topic", "n"], ["%DLQ%billing", "40"],
                                                                 ["Orders", "240"]]
