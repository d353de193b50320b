"""The S3 client as the upload path needs it. What botocore's real signer
does with our PUTs: the CRC32 header we
compute (zlib-ng) counts as the request's checksum, so over https the body
goes as UNSIGNED-PAYLOAD (as with botocore's own checksum) instead of being
hashed whole with SHA-256; over plain http it stays signed. The request is
captured after signing, just before it would be sent (no server needed).
And its connection pool holds one connection per upload thread."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from zlib_ng.zlib_ng import crc32

from tiered.archive.storage import S3Options, S3Store

BODY = bytes(range(256)) * 4096  # 1 MiB


class _Raw:
    """The empty body of the answer given in place of a server's."""

    def stream(self, *_: Any, **__: Any) -> Any:
        return iter(())


class _Sent:
    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    def __call__(self, request: Any, **_: Any) -> AWSResponse:
        self.headers.append({k: v if isinstance(v, str) else v.decode() for k, v in request.headers.items()})
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _Raw())


def _put(endpoint: str, **extra: str) -> dict[str, str]:
    store = S3Store("bucket-x/p", S3Options(endpoint_url=endpoint, region="us-east-1", access_key_id="a",
                                           secret_access_key="b"))
    sent = _Sent()
    store.client.meta.events.register("before-send.s3.PutObject", sent)
    store.client.put_object(Bucket="bucket-x", Key="p/k", Body=BODY, **extra)
    assert len(sent.headers) == 1
    return sent.headers[0]


def _crc(data: bytes) -> str:
    return base64.b64encode(crc32(data).to_bytes(4, "big")).decode()


def test_https_put_with_our_crc32_is_not_hashed_with_sha256() -> None:
    headers = _put("https://s3.example.invalid", ChecksumCRC32=_crc(BODY))
    assert headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    assert headers["x-amz-checksum-crc32"] == _crc(BODY)  # the one checksum, as computed here
    assert "Content-MD5" not in headers


def test_http_put_stays_signed_over_its_payload() -> None:
    headers = _put("http://s3.example.invalid", ChecksumCRC32=_crc(BODY))
    assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(BODY).hexdigest()
    assert headers["x-amz-checksum-crc32"] == _crc(BODY)


@pytest.mark.parametrize("endpoint", ["https://s3.example.invalid", "http://s3.example.invalid"])
def test_a_put_without_our_checksum_is_signed_as_botocore_decides(endpoint: str) -> None:
    # no checksum header of ours: nothing is changed (botocore's own
    # trailer checksum over https, its header and a signed payload over http)
    headers = _put(endpoint)
    if endpoint.startswith("https"):
        assert headers["X-Amz-Content-SHA256"].startswith("STREAMING-UNSIGNED-PAYLOAD")
    else:
        assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(BODY).hexdigest()


def test_the_client_keeps_a_connection_per_upload_thread() -> None:
    from tiered.config import DispatchSettings

    store = S3Store("bucket-x/p", S3Options(endpoint_url="https://s3.example.invalid", region="us-east-1"))
    most = DispatchSettings.model_fields["parallelism"].metadata
    le = next(m.le for m in most if getattr(m, "le", None) is not None)
    assert store.client.meta.config.max_pool_connections == le == 64
