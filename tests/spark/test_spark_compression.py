"""Producer-compressed bodies in Spark: ``body`` as consumers see it, the
stored bytes with ``decompress=false``, a body that does not decompress is
one record's error (named, or skipped and counted with ``skipCorrupt``)."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from readerkit import T0, archive
from tiered.format.compression import compress
from tiered.query.spark_source import load
from tiered.archive.storage import open_store

pytestmark = pytest.mark.spark

CODECS = ("zlib4", "zlib", "lz4", "zstd")


def test_spark_reads_bodies_as_consumers_see_them(spark, tmp_path: Path, store_writer) -> None:  # noqa: ANN001
    expected, stored = {}, {}
    with store_writer() as w:
        for i in range(16):
            body = (f"payment {i} " * 600).encode()
            packed, flag = compress(body, CODECS[i % 4]) if i % 5 else (body, 0)
            if i == 9:
                packed = b"\x78\x9c garbage"  # a zlib header, then nothing valid (i = 9: zlib type bits)
            w.put("Pay", i % 2, packed, sys_flag=flag, store_timestamp=T0 + i, born_timestamp=T0 + i)
            expected[i] = body
            stored[i] = packed
    url = f"file://{tmp_path / 'cold'}"
    archive(tmp_path / "store", open_store(url), tmp_path / "state", segment_bytes=1 << 20)

    def rows(**options: str) -> dict[int, bytes]:
        df = load(spark, url, **options).selectExpr("commitlog_offset", "queue_id", "queue_offset", "body")
        return {2 * r["queue_offset"] + r["queue_id"]: bytes(r["body"]) for r in df.collect()}

    bad = r"Pay/1/segment/[\d.-]+#\d+\+\d+ @ \d+: queue offset 4: body does not decompress as zlib"
    with pytest.raises(Exception, match=bad):  # the object and the record's offset in it
        rows()
    stats = tmp_path / "stats"
    assert rows(skipCorrupt="true", statsPath=str(stats)) == {i: b for i, b in expected.items() if i != 9}
    docs = [json.loads(line) for f in glob.glob(str(stats / "*.jsonl")) for line in open(f)]
    assert sum(d["skipped"] for d in docs) == 1
    assert [p for d in docs for p in d["problems"]] and all(
        "queue offset 4: body does not decompress as zlib" in p for d in docs for p in d["problems"])
    assert rows(decompress="false") == stored
