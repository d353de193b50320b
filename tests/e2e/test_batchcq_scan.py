"""Spark and ``export`` over the archived BatchCQ topic of the 5.3.3 store:
one row per inner message, at its queue offset, with its own properties
and body, as RocketMQ's read-back has them."""

from __future__ import annotations

import base64
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from bcqkit import TOPIC, messages_by_queue, run


def wanted(expected: list[dict]) -> list[tuple]:
    return [(qid, m["queue_offset"], m["flag"], m["msg_id"], m["properties"], base64.b64decode(m["body_b64"]),
             m["commitlog_offset"])
            for qid, msgs in sorted(messages_by_queue(expected).items()) for m in msgs]


def rows_of(rows: list[dict]) -> list[tuple]:
    return sorted((r["queue_id"], r["queue_offset"], r["flag"], r["unique_key"], dict(r["properties"]), r["body"],
                   r["commitlog_offset"]) for r in rows)


def test_export_gives_one_row_per_message(archived: tuple[Path, str], tmp_path: Path,
                                          rmq5_expected: list[dict]) -> None:
    _store, cold = archived
    code, out, err = run(tmp_path, "export", "--to", f"file://{tmp_path}/export", "--cold", cold, "--topic", TOPIC,
                         "--parallelism", "1")
    assert code == 0, out + err
    table = ds.dataset(tmp_path / "export" / f"topic={TOPIC}", format="parquet", partitioning="hive").to_table()
    assert rows_of(table.to_pylist()) == wanted(rmq5_expected)
    # keys and tags come from each message's own properties
    assert sorted(k for ks in table.column("keys").to_pylist() for k in ks)[:3] == ["BLK-0-0", "BLK-0-1", "BLK-0-2"]


@pytest.mark.spark
def test_spark_reads_one_row_per_message(spark, archived: tuple[Path, str], rmq5_expected: list[dict]) -> None:  # noqa: ANN001
    from tiered.query.spark_source import load

    _store, cold = archived
    df = load(spark, cold, topics=TOPIC)
    assert rows_of([r.asDict() for r in df.collect()]) == wanted(rmq5_expected)
    # queue columns only: answered from the manifests' message ranges, no object read
    offsets = load(spark, cold, topics=TOPIC, columns="queue_id,queue_offset").collect()
    assert sorted((r.queue_id, r.queue_offset) for r in offsets) == [(w[0], w[1]) for w in wanted(rmq5_expected)]
