"""Producer-compressed bodies (sys flag bit 0; 5.x type bits zlib/lz4/zstd)
come out as consumers see them: in the columnar reader, ``tiered cat``/``find``
and ``tiered export``; the stored bytes stay reachable; a body that does not
decompress is one bad record."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from readerkit import T0, archive
from tiered.archive import layout
from tiered.cli import app
from tiered.query.columnar import BatchDecoder, QueueInfo
from tiered.format.compression import BodyDecompressError, codec_name, compress, decompress
from tiered.errors import CorruptRecordError
from tiered.query.export import Exporter, iter_files
from tiered.query.reader import Archive
from tiered.query.scan import ScanSpec, SliceResult, plan, read_slice
from tiered.archive.storage import open_store

CODECS = ("zlib4", "zlib", "lz4", "zstd")
TOPIC = "Zipped"


def body_of(i: int) -> bytes:
    # text that compresses, larger than the Java producer's 4 KiB threshold
    return (f"order {i} " * 700).encode()


def test_codecs_round_trip_and_name_the_type_bits() -> None:
    for codec in CODECS:
        packed, flag = compress(body_of(1), codec)
        assert packed != body_of(1) and decompress(packed, flag) == body_of(1)
        assert codec_name(flag) == ("zlib" if codec == "zlib4" else codec)
    assert decompress(b"plain", 0) == b"plain" and codec_name(0x100) is None  # type bits without bit 0: not compressed
    assert codec_name(0x1 | 0x400) == "unknown(4)"
    with pytest.raises(BodyDecompressError, match="unknown"):
        decompress(b"x", 0x1 | 0x400)
    for codec in CODECS:
        _, flag = compress(b"", codec)
        with pytest.raises(BodyDecompressError) as info:
            decompress(b"not compressed at all", flag)
        assert info.value.codec == codec_name(flag)
    truncated, flag = compress(body_of(2), "zlib")
    with pytest.raises(BodyDecompressError, match="truncated"):
        decompress(truncated[:-10], flag)


@pytest.fixture
def zipped(tmp_path: Path, store_writer):  # noqa: ANN001
    """Queue 0 of TOPIC: i = 0..11, codec CODECS[i % 4] except i = 5 (plain) and
    i = 7 (flagged zstd but not zstd). Returns (store, expected bodies, stored bodies)."""
    expected, stored = [], []
    with store_writer() as w:
        for i in range(12):
            body, flag = compress(body_of(i), CODECS[i % 4])
            if i == 5:
                body, flag = body_of(i), 0
            if i == 7:
                body = b"garbage, not a zstd frame"
            w.put(TOPIC, 0, body, keys=[f"z{i}"], sys_flag=flag, store_timestamp=T0 + i, born_timestamp=T0 + i)
            expected.append(body_of(i))
            stored.append(body)
    store = open_store(f"file://{tmp_path / 'cold'}")
    archive(tmp_path / "store", store, tmp_path / "state", segment_bytes=1 << 20)
    return store, expected, stored


def read_all(store, **kw) -> tuple[list[bytes], list[int], SliceResult]:
    result = SliceResult()
    bodies, offsets = [], []
    for sl in plan(Archive(store), ScanSpec()).slices:
        decoder = BatchDecoder(QueueInfo(sl.cluster, sl.broker, sl.topic, sl.queue_id), ("queue_offset", "body"), **kw)
        for batch in read_slice(store, sl, decoder, result=result):
            bodies += batch.column("body").to_pylist()
            offsets += batch.column("queue_offset").to_pylist()
    return bodies, offsets, result


def test_columnar_reader_decompresses_and_keeps_raw_reachable(zipped) -> None:
    store, expected, stored = zipped
    with pytest.raises(CorruptRecordError) as info:
        read_all(store)
    assert "queue offset 7: body does not decompress as zstd" in str(info.value)
    (sl,) = plan(Archive(store), ScanSpec()).slices
    assert info.value.source == sl.commitlog_key  # the object, and the record's byte offset in it
    # (in layout 2 the records are a section of the segment's object)
    assert layout.read_part(store, sl.commitlog_key)[info.value.offset + 4:info.value.offset + 8] == b"\xda\xa3\x20\xa7"
    bodies, offsets, result = read_all(store, skip_corrupt=True)
    assert offsets == [i for i in range(12) if i != 7]  # only the bad record is skipped
    assert bodies == [expected[i] for i in offsets]
    assert result.skipped == 1 and "queue offset 7" in result.problems[0]
    raw, offsets, result = read_all(store, decompress=False)
    assert raw == stored and offsets == list(range(12)) and result.skipped == 0


def test_cat_and_find_print_consumer_bodies(zipped, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'cold'}"
    runner = CliRunner()
    result = runner.invoke(app, ["cat", "--topic", TOPIC, "--queue", "0", "--body", "--json", "--cold", url])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    _, expected, stored = zipped
    assert [r["queue_offset"] for r in rows] == list(range(12))
    for i, r in enumerate(rows):
        if i == 7:
            assert r["body_error"].startswith("body does not decompress as zstd")
            assert base64.b64decode(r["body"]) == stored[7] or r["body"] == stored[7].decode()
        else:
            assert r["body"].encode() == expected[i] and "body_error" not in r
            want = None if i == 5 else ("zlib" if CODECS[i % 4] == "zlib4" else CODECS[i % 4])
            assert r.get("body_compression") == want
    raw = runner.invoke(app, ["cat", "--topic", TOPIC, "--queue", "0", "--offset", "2", "--count", "1", "--body",
                              "--raw-body", "--json", "--cold", url])
    assert raw.exit_code == 0, raw.output
    assert base64.b64decode(json.loads(raw.stdout)["body"]) == stored[2]
    found = runner.invoke(app, ["find", "--key", "z3", "--body", "--json", "--cold", url])
    assert found.exit_code == 0, found.output
    doc = json.loads(found.stdout)
    assert doc["body"].encode() == expected[3] and doc["body_compression"] == "zstd"
    line = runner.invoke(app, ["cat", "--topic", TOPIC, "--queue", "0", "--offset", "1", "--count", "1", "--body",
                               "--cold", url])
    assert line.exit_code == 0 and "[zlib]" in line.stdout and "order 1 order 1" in line.stdout


def test_export_writes_consumer_bodies(zipped, tmp_path: Path) -> None:
    store, expected, _ = zipped
    target = open_store(f"file://{tmp_path / 'parquet'}")
    report = Exporter(store, target, skip_corrupt=True).run()
    assert report.rows == 11 and report.skipped == 1 and any("queue offset 7" in p for p in report.problems)
    rows = []
    for key in iter_files(target):
        rows += pq.read_table(tmp_path / "parquet" / key, columns=["queue_offset", "body"]).to_pylist()
    assert sorted((r["queue_offset"], r["body"]) for r in rows) == [(i, expected[i]) for i in range(12) if i != 7]
