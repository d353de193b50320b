"""Spark and ``tiered export`` read layout v2 archives, zstd-compressed, and
archives that hold both layouts, with the same rows as a v1 archive of the
same store."""

from __future__ import annotations

from pathlib import Path

import pytest

from readerkit import CLUSTER, TopicSpec, archive, write_store
from tiered.query.export import Exporter
from tiered.query.spark_source import load
from tiered.archive.storage import open_store

pytestmark = pytest.mark.spark

SPECS = [TopicSpec("Orders", queues=2, messages=120), TopicSpec("%DLQ%billing", queues=1, messages=30,
                                                                 ipv6_every=4)]
COLUMNS = ["topic", "queue_id", "queue_offset", "store_timestamp", "body_crc", "keys", "tags"]


def _rows(spark, url: str) -> list[tuple]:
    return sorted(tuple(r) for r in load(spark, url).select(*COLUMNS).collect())


def test_spark_and_export_read_zstd_v2_like_v1(spark, tmp_path: Path) -> None:
    write_store(tmp_path / "store", SPECS)
    v1, v2 = f"file://{tmp_path / 'v1'}", f"file://{tmp_path / 'v2'}"
    archive(tmp_path / "store", open_store(v1), tmp_path / "s1", segment_bytes=8 * 1024, layout=1)
    archive(tmp_path / "store", open_store(v2), tmp_path / "s2", segment_bytes=8 * 1024, layout=2,
            compression="zstd")
    assert any(k.endswith(".zst") for k in (o.key for o in open_store(v2).list_keys(f"{CLUSTER}/")))
    want = _rows(spark, v1)
    assert len(want) == 150
    assert _rows(spark, v2) == want
    # a pushed-down offset range reads sections of compressed objects
    part = load(spark, v2).where("topic = 'Orders' AND queue_id = 1 AND queue_offset BETWEEN 30 AND 44")
    assert sorted(r.queue_offset for r in part.select("queue_offset").collect()) == list(range(30, 45))
    out = tmp_path / "out"
    report = Exporter(open_store(v2), open_store(f"file://{out}")).run()
    assert report.rows == 150
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["queue_offset", "body_crc", "queue_id"])
    exported = sorted(zip(table["queue_id"].to_pylist(), table["queue_offset"].to_pylist(),
                          table["body_crc"].to_pylist()))
    assert exported == sorted((r[1], r[2], r[4]) for r in want)
