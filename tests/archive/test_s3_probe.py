"""The capability probe and conditional writes on real S3 servers.

On the server under test (moto, SeaweedFS, TIERED_TEST_S3_ENDPOINT), and
through proxies in front of moto that behave like Ceph RGW (If-Match compared
byte for byte with the bare ETag, CRC32 ignored, Content-MD5 checked), like a
store that ignores conditional headers, and like one that answers 501/400.
"""

from __future__ import annotations

import base64
import hashlib

import boto3
import pytest
from botocore.exceptions import ClientError
from s3proxies import RefuseConditionsProxy, RgwIfMatchProxy, StripConditionsProxy
from typer.testing import CliRunner

from tiered.cli import app
from tiered.errors import ConditionalWritesUnsupportedError, PreconditionFailedError
from tiered.archive.storage import RetryPolicy, S3Options, open_store

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01)


def _store(endpoint: str, bucket: str, **opts):  # noqa: ANN202
    return open_store(f"s3://{bucket}/arch", s3=S3Options(endpoint_url=endpoint, **opts), retry=FAST)


def _bucket(endpoint: str) -> str:
    import uuid

    name = f"tiered-probe-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def _keys(endpoint: str, bucket: str) -> list[str]:
    resp = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)
    return [o["Key"] for o in resp.get("Contents", [])]


def _commit_chain(store, rounds: int = 5) -> None:  # noqa: ANN001
    """A manifest's life: create, then replace it conditionally round after round."""
    etag = store.put_if_absent("C/b/t/0/manifest.json", b"v0")
    for n in range(1, rounds + 1):
        etag = store.put_if_match("C/b/t/0/manifest.json", f"v{n}".encode(), etag)
    assert store.get_with_etag("C/b/t/0/manifest.json") == (f"v{rounds}".encode(), etag)
    with pytest.raises(PreconditionFailedError):
        store.put_if_match("C/b/t/0/manifest.json", b"stale", "0" * 32)
    with pytest.raises(PreconditionFailedError):
        store.put_if_absent("C/b/t/0/manifest.json", b"again")
    assert store.get("C/b/t/0/manifest.json") == f"v{rounds}".encode()


def test_probe_on_the_server_under_test(moto_endpoint, s3_bucket):
    store = _store(moto_endpoint, s3_bucket)
    caps = store.capabilities()
    answers = dict(caps.answers)
    assert answers["If-None-Match: * on an existing key"] == 412
    assert answers["stale If-Match (quoted)"] == 412 and answers["stale If-Match (bare)"] == 412
    assert caps.if_match_form == "quoted"  # AWS, moto and SeaweedFS take the quoted tag
    _commit_chain(store)
    assert store.capabilities() is caps  # asked once per bucket and process
    assert _keys(moto_endpoint, s3_bucket) == ["arch/C/b/t/0/manifest.json"]  # the probe object is gone


def test_seaweedfs_verifies_crc32(seaweedfs_endpoint):
    """The real SeaweedFS: quoted If-Match, uploads checked by CRC32."""
    bucket = _bucket(seaweedfs_endpoint)
    store = _store(seaweedfs_endpoint, bucket)
    caps = store.capabilities()
    assert (caps.if_match_form, caps.upload_checksum) == ("quoted", "crc32")
    assert dict(caps.answers)["wrong ChecksumCRC32"] == 400
    _commit_chain(store)


def test_rgw_byte_for_byte_if_match_is_learned(real_moto_endpoint, tmp_path):
    """RGW answers 412 to a quoted If-Match forever: the probe learns the bare
    form, and every later commit sends it."""
    bucket = _bucket(real_moto_endpoint)
    with RgwIfMatchProxy(real_moto_endpoint) as rgw:
        client = boto3.client("s3", endpoint_url=rgw.url)
        etag = client.put_object(Bucket=bucket, Key="x", Body=b"1")["ETag"]
        with pytest.raises(ClientError) as quoted:  # the bug this catches: a quoted tag never matches
            client.put_object(Bucket=bucket, Key="x", Body=b"2", IfMatch=etag)
        assert quoted.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        client.put_object(Bucket=bucket, Key="x", Body=b"2", IfMatch=etag.strip('"'))

        store = _store(rgw.url, bucket)
        caps = store.capabilities()
        assert caps.if_match_form == "bare"
        assert caps.upload_checksum == "md5"  # CRC32 ignored, Content-MD5 checked
        assert dict(caps.answers)["If-Match quoted current ETag"] == 412
        refused = rgw.refused_quoted
        _commit_chain(store, rounds=6)
        assert rgw.refused_quoted == refused  # no quoted If-Match after the probe
        # Content-MD5 is checked: a body that does not match it is refused
        with pytest.raises(ClientError) as bad:
            client.put_object(Bucket=bucket, Key="y", Body=b"abc",
                              ContentMD5=base64.b64encode(hashlib.md5(b"abd").digest()).decode())
        assert bad.value.response["Error"]["Code"] == "BadDigest"
        bad_digests = rgw.bad_digests
        store.put("C/b/t/0/commitlog/0-3", b"abc")  # every upload carries the right MD5
        assert rgw.bad_digests == bad_digests and store.get("C/b/t/0/commitlog/0-3") == b"abc"


def test_store_ignoring_conditions_is_refused(real_moto_endpoint):
    bucket = _bucket(real_moto_endpoint)
    with StripConditionsProxy(real_moto_endpoint) as proxy:
        store = _store(proxy.url, bucket)
        with pytest.raises(ConditionalWritesUnsupportedError) as err:
            store.put_if_absent("C/b/_lease.json", b"lease")
        msg = str(err.value)
        assert msg == (f"{proxy.url} bucket {bucket}: conditional writes are not honoured (If-None-Match: * on an "
                       "existing key was ignored: the write succeeded instead of answering 412); tiered writes "
                       "nothing to this store (see the README's 'Supported object stores' table)")
        assert not err.value.retriable and proxy.stripped == 1
        with pytest.raises(ConditionalWritesUnsupportedError):  # plain writes too: nothing is written
            store.put("C/b/t/0/commitlog/0-1", b"x")
    assert _keys(real_moto_endpoint, bucket) == []


@pytest.mark.parametrize("status", [501, 400])
def test_store_refusing_conditional_headers_is_refused(real_moto_endpoint, status):
    bucket = _bucket(real_moto_endpoint)
    with RefuseConditionsProxy(real_moto_endpoint, status=status) as proxy:
        with pytest.raises(ConditionalWritesUnsupportedError) as err:
            _store(proxy.url, bucket).put_if_absent("C/b/_lease.json", b"lease")
    assert f"If-None-Match: * on an existing key answered HTTP {status} instead of 412" in str(err.value)
    assert f"bucket {bucket}: conditional writes are not honoured" in str(err.value)
    assert _keys(real_moto_endpoint, bucket) == []


def test_cli_refuses_a_store_ignoring_conditions(real_moto_endpoint, tmp_path):
    """Through the CLI: one line naming endpoint and bucket, non-zero exit,
    no traceback, and not one object written."""
    from dispatchkit import new_writer, produce

    with new_writer(tmp_path / "store") as w:
        produce(w, "T", 0, 5)
    bucket = _bucket(real_moto_endpoint)
    with StripConditionsProxy(real_moto_endpoint) as proxy:
        env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_S3__ENDPOINT_URL": proxy.url,
               "TIERED_LOG__LEVEL": "WARNING"}
        res = CliRunner().invoke(app, ["dispatch", "--store", str(tmp_path / "store"), "--cold", f"s3://{bucket}/a",
                                       "--once", "--all"], env=env)
    assert res.exit_code != 0
    assert "conditional writes are not honoured" in res.output and f"bucket {bucket}" in res.output
    assert "Traceback" not in res.output
    assert _keys(real_moto_endpoint, bucket) == []


def test_a_probe_left_behind_is_no_cluster_and_hides_none(moto_endpoint, s3_bucket):
    """A probe cut short by a crash leaves its object at the root: readers,
    which find clusters by a delimiter listing, must not take it for one, and
    a cluster really named "_probe" must still be found."""
    from tiered.query.reader import discover, list_dirs

    store = _store(moto_endpoint, s3_bucket)
    store.capabilities()
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    client.put_object(Bucket=s3_bucket, Key="arch/_probe-0123456789abcdef", Body=b"left by a crash")
    store.put("_probe/b/_catalog.json", b"{}")
    store.put("C/b/_lease.json", b"{}")
    assert list_dirs(store) == ["C", "_probe"]
    assert discover(store) == [("C", "b"), ("_probe", "b")]
