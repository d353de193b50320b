"""An LMQ queue of the RocketMQ 5.3.3 fixture in Spark: its rows by its own
topic and offsets, pruned by them, each the parent's record RocketMQ's
ConsumeQueue entry points at."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from lmqkit import cli_env, invoke, lmq_lines, unconfirmed

from tiered.query.spark_source import load

pytestmark = pytest.mark.spark

RED = "%LMQ%room-red"


def test_spark_reads_an_lmq_queue_by_its_offsets(spark, rmq5_store: Path, rmq5_expected: list[dict],
                                                 tmp_path: Path) -> None:
    store = unconfirmed(rmq5_store)
    cold = f"file://{tmp_path / 'cold'}"
    code, _out, err = invoke(cli_env(tmp_path), "dispatch", "--all", "--store", str(store), "--cold", cold,
                             "--topic", "ChatRoom", "--topic", "%LMQ%*")
    assert code == 0, err
    df = load(spark, cold).where(f"topic = '{RED}' AND queue_offset >= 5")
    rows = sorted(df.select("topic", "queue_id", "queue_offset", "commitlog_offset", "real_topic", "unique_key",
                            "body").collect(), key=lambda r: r["queue_offset"])
    want = lmq_lines(rmq5_expected, RED)[5:]
    assert [(r["topic"], r["queue_id"], r["queue_offset"], r["commitlog_offset"], r["real_topic"], r["unique_key"],
             bytes(r["body"])) for r in rows] == [
        (RED, 0, e["cq_offset"], e["commitlog_offset"], "ChatRoom", e["unique_key"], base64.b64decode(e["body_b64"]))
        for e in want]
    # every LMQ row is a ChatRoom record; the parent's rows stay the parent's
    counts = {r["topic"]: r["n"] for r in load(spark, cold).groupBy("topic").count().withColumnRenamed(
        "count", "n").collect()}
    assert counts == {"ChatRoom": 35, RED: 17, "%LMQ%room-blue": 15, "%LMQ%room-green": 17}
