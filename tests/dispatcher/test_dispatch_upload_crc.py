"""A round's uploads carry their segment's CRC-32 as the object's checksum
(``QueueArchiver._upload``, ``ObjectStore.put(crc=)``): the CRC kept as the
records were copied into the segment (dispatcher.commitpass, SegmentBuilder),
continued over the v2 object's tail, so the server checks the bytes sent
against the bytes the pass checked, and no thread reads the object again
for its checksum."""

from __future__ import annotations

from typing import Any

import pytest
from zlib_ng.zlib_ng import crc32

from dispatchkit import assert_exact, new_dispatcher, new_writer, produce, read_manifest
from s3sent import b64, computed_crcs, new_bucket, sent_checksums
from tiered.archive import segmeta
from tiered.archive.storage import ObjectStore, RetryPolicy, S3Options, open_store
from tiered.store.localstore import LocalStore

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.01)
Q = ("Crc", 0)


def _round_on(store: ObjectStore, tmp_path, clock, **opts: Any):  # noqa: ANN001, ANN202
    sd = tmp_path / "store"
    with new_writer(sd) as w:
        produce(w, *Q, 60, clock=clock, body_size=700)
    local = LocalStore(sd)
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, segment_bytes=12_000,
                       parallelism=2, **opts)
    return local, d


@pytest.mark.parametrize(("layout", "compression"), [(2, "none"), (1, "none"), (2, "zstd")])
def test_dispatch_sends_each_segment_crc_as_its_objects_checksum(moto_endpoint, s3_bucket, tmp_path, clock,
                                                                 monkeypatch, layout: int, compression: str) -> None:
    """A round's data objects go with the CRC-32 of the object's bytes as
    stored, taken from the segment's (v2: continued over the tail; v1: the
    CommitLog object is the segment), never computed over the object again;
    a zstd object's is computed (it is not the segment's bytes)."""
    store = open_store(f"s3://{s3_bucket}/arch", s3=S3Options(endpoint_url=moto_endpoint), retry=FAST)
    local, d = _round_on(store, tmp_path, clock, layout=layout, compression=compression)
    store.capabilities()
    sent, computed = sent_checksums(store), computed_crcs(monkeypatch)
    result = d.run_round()
    assert result.ok and result.segments >= 4, result.errors
    assert assert_exact(store, local, [Q]) == {Q: 60}
    segments = read_manifest(store, *Q).segments
    checked = 0
    for seg in segments:
        key = seg.keys()[0] if layout == 2 else seg.commitlog_key
        body = store.get(key)
        headers = [h for path, h in sent if path.endswith("/arch/" + key)]
        assert headers == [b64(crc32(body))], key
        if compression == "none":
            assert len(body) not in computed, key  # continued from the segment's, not computed
            checked += 1
        else:
            assert len(body) in computed, key  # and the spy sees a CRC computed over an object
    assert checked == (len(segments) if compression == "none" else 0)


def test_a_segment_changed_after_its_build_is_refused_and_archived_next_round(seaweedfs_endpoint, tmp_path, clock,
                                                                             monkeypatch) -> None:
    """A byte of a built segment changes before its upload (memory gone bad,
    a buffer reused too soon): the object's checksum, continued from the CRC
    kept while the records were copied in, no longer matches the bytes sent;
    SeaweedFS refuses them, nothing is committed, and the next round builds
    the segment again from the CommitLog and archives it exactly."""
    store = open_store(f"s3://{new_bucket(seaweedfs_endpoint)}/arch", s3=S3Options(endpoint_url=seaweedfs_endpoint),
                       retry=FAST)
    local, d = _round_on(store, tmp_path, clock, layout=2)
    real = segmeta.pack_v2
    spoiled: list[int] = []

    def pack_then_spoil(records, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        packed = real(records, *a, **kw)
        if not spoiled:
            spoiled.append(len(packed))
            packed[100] ^= 0x01  # in the first record: a byte of the segment
        return packed

    monkeypatch.setattr(segmeta, "pack_v2", pack_then_spoil)
    first = d.run_round()
    assert spoiled and not first.ok
    assert "BadDigest" in str(first.errors), first.errors  # refused for its checksum, nothing else
    manifest = read_manifest(store, *Q)
    assert manifest is None or not manifest.segments  # the queue's first segment: nothing after it either
    second = d.run_round()
    assert second.ok, second.errors
    assert assert_exact(store, local, [Q]) == {Q: 60}
