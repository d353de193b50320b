"""A PUT with the CRC-32 its caller has already (``ObjectStore.put(crc=)``):
a segment's, kept as its records were copied in, continued over the v2
object's tail. The S3 store sends it as the upload's ChecksumCRC32 instead
of reading the object again for it, so a server that checks uploads checks
the bytes sent against what the CRC was computed over when the segment was
built: a right one lands, a wrong one (the buffer changed since) is refused
and nothing is written. A file store has no use for it.

On the server under test (moto, which checks no checksum, and SeaweedFS,
which does: TIERED_TEST_S3_SERVER=seaweedfs), and on a SeaweedFS started
here whatever the server under test is."""

from __future__ import annotations

import random
from typing import Any

import pytest
from zlib_ng.zlib_ng import crc32

from s3sent import b64, computed_crcs, new_bucket, sent_checksums
from tiered.archive.storage import FileStore, RetryPolicy, S3Options, open_store
from tiered.errors import StorageError

FAST = RetryPolicy(attempts=2, base_delay=0.001, max_delay=0.01)
DATA = bytearray(random.Random(5).randbytes(300_000))


def _put_right(store: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list[int]]:
    store.capabilities()  # the probe's own PUTs first
    sent, computed = sent_checksums(store), computed_crcs(monkeypatch)
    right = crc32(DATA)
    store.put("obj/right", DATA, crc=right)
    assert store.get("obj/right") == DATA
    assert [h for _p, h in sent] == [b64(right)]  # the CRC given, and no other
    assert len(DATA) not in computed  # not read again for it
    return sent, computed


def test_a_precomputed_crc_is_the_checksum_the_server_checks(moto_endpoint, s3_bucket, monkeypatch) -> None:
    store = open_store(f"s3://{s3_bucket}/arch", s3=S3Options(endpoint_url=moto_endpoint), retry=FAST)
    sent, computed = _put_right(store, monkeypatch)
    wrong = crc32(DATA) ^ 0x10
    if store.capabilities().upload_checksum == "crc32":  # SeaweedFS, AWS: the server checks it
        with pytest.raises(StorageError) as refused:
            store.put("obj/wrong", DATA, crc=wrong)
        assert store.head("obj/wrong") is None  # nothing written
        # refused once, not retried: the same bytes would be refused again (the round builds them anew)
        assert not refused.value.retriable and [h for _p, h in sent[1:]] == [b64(wrong)]
    else:  # moto checks none: the object lands, and the checksum it came with was the one given
        store.put("obj/wrong", DATA, crc=wrong)
        assert [h for _p, h in sent[1:]] == [b64(wrong)]
    assert len(DATA) not in computed



def test_a_segment_buffer_is_sent_whole_on_every_put(moto_endpoint, s3_bucket, monkeypatch) -> None:
    """A segment's mapped buffer (no bytes object) goes to boto3 as a file
    read from its start: whole on every put, a second one included (the
    first left it read to its end), big enough for a 100-continue, with the
    CRC given and not computed again."""
    from tiered.format.segbuffer import SegmentBuffer

    store = open_store(f"s3://{s3_bucket}/arch", s3=S3Options(endpoint_url=moto_endpoint), retry=FAST)
    store.capabilities()
    sent, computed = sent_checksums(store), computed_crcs(monkeypatch)
    data = random.Random(6).randbytes(3 << 20)
    buf = SegmentBuffer(len(data))
    buf[:] = data
    for key in ("obj/seg-1", "obj/seg-2"):
        store.put(key, buf, crc=crc32(data))
        assert store.get(key) == data
    assert [h for _p, h in sent] == [b64(crc32(data))] * 2 and len(data) not in computed

def test_seaweedfs_refuses_a_wrong_precomputed_crc(seaweedfs_endpoint, monkeypatch) -> None:
    store = open_store(f"s3://{new_bucket(seaweedfs_endpoint)}/arch", s3=S3Options(endpoint_url=seaweedfs_endpoint),
                       retry=FAST)
    assert store.capabilities().upload_checksum == "crc32"
    _put_right(store, monkeypatch)
    with pytest.raises(StorageError) as refused:
        store.put("obj/wrong", DATA, crc=crc32(DATA) ^ 1)
    assert store.head("obj/wrong") is None and "BadDigest" in str(refused.value) and not refused.value.retriable
    # a precomputed CRC of other bytes: a buffer changed after its CRC was kept
    changed = bytearray(DATA)
    changed[123_456] ^= 0x01
    with pytest.raises(StorageError):
        store.put("obj/changed", changed, crc=crc32(DATA))
    assert store.head("obj/changed") is None
    assert store.get("obj/right") == DATA


def test_a_file_store_writes_the_data_whatever_crc_it_is_given(tmp_path) -> None:
    store = FileStore(str(tmp_path / "cold"))
    store.put("a/b", DATA, crc=crc32(DATA) ^ 1)
    assert (tmp_path / "cold" / "a" / "b").read_bytes() == DATA
