"""``s3://bucket/prefix`` objects, through boto3 and s3fs.

boto3 makes the writes and the whole-object reads: conditional writes
(``IfNoneMatch``/``IfMatch``), batched deletes, single PUTs of a buffer
without copying it (s3fs copies a body several times while sending); s3fs's
client the ranged reads (Spark's ``s3fs.NAME`` options apply to it) and the
multipart write past a single PUT's limit. Before its first write to a
bucket, ``S3Store`` runs the capability probe of ``tiered.archive.s3probe``
(the If-Match form the server takes, the upload checksum it verifies; a store
ignoring conditional writes is refused).

Every answer of both clients is checked in one place (``_check_answer``): a
GET, HEAD or PUT without ETag, or an HTML page, is not S3's. That, garbage,
a body shorter than declared or other bytes than the range asked, or a
checksum mismatch is a ``BadResponseError``: retried and counted like a 500.
Only S3's own answer that fails the data's own checks is corrupt data.
Errors are translated once, in ``S3Store._translate``, by exception type and
S3 error code.
"""

from __future__ import annotations

import base64
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zlib_ng.zlib_ng import crc32

from tiered.archive.objectstore import ObjectInfo, ObjectStore
from tiered.format.segbuffer import SegmentBuffer
from tiered.errors import (
    BadResponseError,
    ConfigError,
    CredentialsMissingError,
    ObjectNotFoundError,
    PreconditionFailedError,
    SpoiledAnswerError,
    StorageError,
)

if TYPE_CHECKING:
    from tiered.archive.s3probe import Capabilities

_SINGLE_PUT_LIMIT = 5 << 30  # S3's largest single PUT
_POOL = 64  # connections kept per client: dispatch.parallelism's upper bound


@dataclass(frozen=True, kw_only=True)
class S3Options:
    """Everything needed to rebuild an S3 client anywhere (Spark executors
    included). Secrets are held here and never rendered: ``repr`` hides them."""

    endpoint_url: str | None = None
    region: str | None = None
    addressing: str = "auto"
    sse: str = "none"
    sse_kms_key_id: str | None = None
    checksum_mode: str = "when_supported"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    profile: str | None = None  # a named AWS profile; None: AWS_PROFILE or the default chain
    extra: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def put_kwargs(self) -> dict[str, str]:
        if self.sse == "AES256":
            return {"ServerSideEncryption": "AES256"}
        if self.sse == "aws:kms":
            out = {"ServerSideEncryption": "aws:kms"}
            if self.sse_kms_key_id:
                out["SSEKMSKeyId"] = self.sse_kms_key_id
            return out
        return {}


class S3Store(ObjectStore):
    """``s3://bucket/prefix`` through s3fs; boto3 for conditional writes and
    batched deletes. Clients are built lazily per process, so the store
    pickles to Spark executors and survives fork."""

    scheme = "s3"

    def __init__(self, root: str, options: S3Options | None = None, **kw: Any) -> None:
        super().__init__(root, **kw)
        self.options = options or S3Options()
        bucket, _, prefix = self.root.partition("/")
        if len(bucket) < 3:
            raise ValueError("an S3 URL needs a bucket name of 3+ characters")
        if (self.options.access_key_id is None) != (self.options.secret_access_key is None):
            # botocore would sign with half a key pair and fail far from here
            raise ConfigError("s3.access_key_id and s3.secret_access_key: set both or neither (neither: the AWS "
                              "credential chain: environment, profile, web identity, instance metadata)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._fs: Any = None
        self._client: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def full_key(self, key: str) -> str:
        """``key``'s name in the bucket: the store's prefix before it."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def _botocore_config(self) -> dict[str, Any]:
        o = self.options
        cfg: dict[str, Any] = {
            "connect_timeout": o.connect_timeout,
            "read_timeout": o.read_timeout,
            "retries": {"total_max_attempts": 1, "mode": "standard"},  # no retry in botocore: retries are ours
            # one pooled connection per upload thread (dispatch.parallelism is
            # at most 64): past botocore's default of 10, every extra request
            # opened a new connection (a TLS handshake) and dropped it after
            "max_pool_connections": _POOL,
            "request_checksum_calculation": o.checksum_mode,
            "response_checksum_validation": o.checksum_mode,
        }
        if o.addressing != "auto":
            cfg["s3"] = {"addressing_style": o.addressing}
        return cfg

    @property
    def fs(self) -> Any:
        self._check_pid()
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    import s3fs

                    o = self.options
                    client_kwargs: dict[str, Any] = {}
                    if o.region:
                        client_kwargs["region_name"] = o.region
                    if o.endpoint_url:
                        client_kwargs["endpoint_url"] = o.endpoint_url
                    self._fs = s3fs.S3FileSystem(
                        key=o.access_key_id, secret=o.secret_access_key, token=o.session_token, profile=o.profile,
                        client_kwargs=client_kwargs, config_kwargs=self._botocore_config(),
                        s3_additional_kwargs=o.put_kwargs(), use_listings_cache=False,
                        skip_instance_cache=True, **dict(o.extra),
                    )
                    self._fs.retries = 1  # class attribute in s3fs; every retry is ours
        return self._fs

    @property
    def client(self) -> Any:
        self._check_pid()
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3
                    from botocore.config import Config

                    o = self.options
                    session = boto3.session.Session(
                        aws_access_key_id=o.access_key_id, aws_secret_access_key=o.secret_access_key,
                        aws_session_token=o.session_token, region_name=o.region, profile_name=o.profile,
                    )
                    client = session.client(
                        "s3", endpoint_url=o.endpoint_url, config=Config(**self._botocore_config()),
                    )
                    client.meta.events.register("before-sign.s3.PutObject", _checksum_is_ours)
                    _check_answers(client)
                    self._client = client
        return self._client

    def _check_pid(self) -> None:
        if self._pid != os.getpid():  # forked: clients and their loops do not survive
            self._fs = None
            self._client = None
            self._pid = os.getpid()
            self._lock = threading.Lock()

    def _before_write(self) -> None:
        self.capabilities()

    def capabilities(self) -> Capabilities:
        """What this bucket honours (If-Match form, upload checksum); probed on
        the first write in this process, ConditionalWritesUnsupportedError
        when conditional writes are not honoured."""
        from tiered.archive.s3probe import capabilities

        return capabilities(self)

    def _translate(self, op: str, key: str, exc: Exception) -> StorageError:
        from botocore import exceptions as bx

        if isinstance(exc, OSError) and isinstance(exc.__cause__, bx.ClientError):
            exc = exc.__cause__  # s3fs's OSError for S3's error answer (its multipart write): the answer decides
        err = _s3_error(op, key, exc)
        if err is not None:
            return err
        if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
            from tiered.archive.s3probe import endpoint_name

            return CredentialsMissingError(op, key, endpoint_name(self))
        if isinstance(exc, bx.ProfileNotFound):
            return StorageError(op, key, f"AWS profile {self.options.profile or os.environ.get('AWS_PROFILE')!r} "
                                "is in neither ~/.aws/config nor ~/.aws/credentials", retriable=False)
        return super()._translate(op, key, exc)

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self.full_key(key)}"

    def _raw_get(self, key: str, start: int | None, end: int | None) -> bytes:
        if start is None:
            return self._raw_get_etag(key)[0]
        if end is None or end <= start:
            # "bytes=5-4" is no range to S3: it would answer the whole object
            return b""
        return self._get_range(key, start, end)

    def _raw_get_etag(self, key: str) -> tuple[bytes, str]:
        # boto3, as the writes: a writer's reads (identity, catalog,
        # manifests, chunks) never start s3fs's event loop thread and its
        # aiohttp stack (~12 MiB per process, measured), and it is one GET
        # (s3fs may HEAD for the size first, a request the recorder never sees)
        resp = self.client.get_object(Bucket=self.bucket, Key=self.full_key(key))
        try:
            body = bytes(resp["Body"].read())
        finally:
            resp["Body"].close()
        return _asked_body("get", key, resp, body, None), _etag("get", key, resp)

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) with s3fs's client (the readers': Spark's
        ``s3fs.NAME`` options apply), its answer checked as boto3's are."""
        from fsspec.asyn import sync

        fs = self.fs

        async def fetch() -> bytes:
            await fs.set_session()
            s3 = await fs.get_s3(self.bucket)
            _check_answers(s3)
            resp = await s3.get_object(**fs._get_s3_method_kwargs(
                s3.get_object, Bucket=self.bucket, Key=self.full_key(key), Range=f"bytes={start}-{end - 1}"))
            try:
                body = await resp["Body"].read()
            finally:
                resp["Body"].close()
            return _asked_body("get", key, resp, bytes(body), (start, end))

        return sync(fs.loop, fetch)

    def _raw_put(self, key: str, data: bytes | SegmentBuffer, crc: int | None = None) -> None:
        if len(data) < _SINGLE_PUT_LIMIT:
            # boto3, not s3fs: s3fs's put holds ~3 extra copies of a bytearray body
            # while it sends (measured: +88 MiB for 32 MiB), which would break the
            # dispatcher's memory bound of parallelism x segment size; boto3 sends
            # the caller's buffer as it is, and is ~15% faster doing it.
            self.client.put_object(Bucket=self.bucket, Key=self.full_key(key), Body=_body(data),
                                   **self.options.put_kwargs(), **self._checksum(data, crc))
        else:
            self.fs.pipe_file(self._path(key), data)  # multipart beyond a single PUT's limit

    def _checksum(self, data: bytes | SegmentBuffer, crc: int | None = None) -> dict[str, str]:
        """The checksum the store verifies the upload against, the one the
        probe found it honours: CRC32 (``crc`` when the caller has it, else
        computed here: zlib-ng, ~5x what botocore's zlib does) instead of by
        botocore, else Content-MD5 (Ceph RGW ignores CRC32 but checks MD5).
        Where it verifies neither (moto), CRC32 all the same, as before there
        was a probe: harmless."""
        mode = self.capabilities().upload_checksum
        if mode == "crc32" or (mode == "none" and self.options.checksum_mode == "when_supported"):
            value = crc if crc is not None else crc32(data)
            return {"ChecksumCRC32": base64.b64encode(value.to_bytes(4, "big")).decode("ascii")}
        if mode == "md5":
            from tiered.archive.s3probe import content_md5

            return {"ContentMD5": content_md5(data)}
        return {}

    def _raw_put_if(self, key: str, data: bytes, etag: str | None) -> str:
        # If-Match in the form the server accepts: Ceph RGW compares the
        # header with its bare ETag byte for byte, so a quoted tag never matches
        cond = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": self.capabilities().if_match(etag)}
        resp = self.client.put_object(Bucket=self.bucket, Key=self.full_key(key), Body=data,
                                      **self.options.put_kwargs(), **self._checksum(data), **cond)
        return _etag(op_of(etag), key, resp)

    def _raw_head(self, key: str) -> ObjectInfo:
        resp = self.client.head_object(Bucket=self.bucket, Key=self.full_key(key))
        return ObjectInfo(key, resp["ContentLength"], int(resp["LastModified"].timestamp() * 1000),
                          _etag("head", key, resp))

    def _raw_list(self, prefix: str) -> list[ObjectInfo]:
        full = self.full_key(prefix)
        out: list[ObjectInfo] = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                out.append(ObjectInfo(obj["Key"][strip:], obj["Size"],
                                      int(obj["LastModified"].timestamp() * 1000), (obj.get("ETag") or "").strip('"') or None))
        return out

    def _raw_list_dirs(self, prefix: str) -> list[str]:
        full = self.full_key(prefix + "/" if prefix else "")
        names: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full,
                                                                          Delimiter="/"):
            names.extend(p["Prefix"][len(full):].rstrip("/") for p in page.get("CommonPrefixes", []))
        return sorted(names)

    def _raw_delete(self, keys: list[str]) -> None:
        resp = self.client.delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": self.full_key(k)} for k in keys], "Quiet": True}
        )
        errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            raise StorageError("delete", first.get("Key", "?"), f"{len(errors)} keys not deleted ({first.get('Code')})",
                               retriable=True)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_fs"] = None
        state["_client"] = None
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()
        self._pid = os.getpid()


def _body(data: bytes | SegmentBuffer) -> bytes | _MappedBody:
    """``data`` as boto3 takes it: bytes as they are; a segment's mapped
    buffer (boto3 takes no other buffer) as a file over it."""
    return _MappedBody(data) if isinstance(data, SegmentBuffer) else data


class _MappedBody:
    """A file over a segment's buffer whose reads are views of it, not
    copies: boto3 hashes and sends the segment in blocks as it would a
    bytearray, without a copy of each. The views end with the request; one
    that outlives it (a failed try's traceback, kept) keeps that buffer out
    of the next segments: the pool's ``take`` hands out a fresh one."""

    def __init__(self, data: SegmentBuffer) -> None:
        self._view = memoryview(data)
        self._at = 0

    def __len__(self) -> int:
        return len(self._view)

    def read(self, n: int = -1) -> memoryview:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._at + n)
        chunk, self._at = self._view[self._at:end], max(self._at, end)
        return chunk

    def seek(self, at: int, whence: int = 0) -> int:
        self._at = max(0, at + (0, self._at, len(self._view))[whence])
        return self._at

    def tell(self) -> int:
        return self._at


def _checksum_is_ours(request: Any, **_: Any) -> None:
    """Tell botocore's signer that the x-amz-checksum-crc32 header we
    computed (``S3Store._checksum``) is the request's checksum, as one it
    computed itself would be: over https it then sends the body as
    UNSIGNED-PAYLOAD (TLS plus a checksum the store verifies), not hashed
    whole with SHA-256 first (~0.5 CPU-s per GB); over plain http it still
    signs the payload, the one integrity check such a link has."""
    checksum = request.context.setdefault("checksum", {})
    if "x-amz-checksum-crc32" in request.headers and not checksum.get("request_algorithm"):
        checksum["request_algorithm"] = {"algorithm": "crc32", "in": "header", "name": "x-amz-checksum-crc32"}


# the answers S3 always gives an ETag: the object's (GET, HEAD) or the written one's
_TAGGED = frozenset({"GetObject", "HeadObject", "PutObject", "UploadPart"})
_ANSWER_CHECK = "tiered-answer-check"


def _check_answers(client: Any) -> None:
    """Check every answer of ``client`` (boto3's or s3fs's aiobotocore one)
    with ``_check_answer``; registering it again is a no-op."""
    client.meta.events.register("after-call.s3", _check_answer, unique_id=_ANSWER_CHECK)


def _check_answer(http_response: Any, parsed: Any, model: Any, **_: Any) -> None:
    """The one place every 2xx answer of S3 is checked for being S3's (a
    proxy, captive portal or load balancer answering in its place): a GET,
    HEAD or PUT answered without an ETag, or an HTML page where S3 sends XML
    or the object's bytes (ours are never HTML: they are written without a
    Content-Type). Either is a spoiled answer, retried like a 500, never data
    to parse; an error status is left to botocore (a ClientError)."""
    status = int(getattr(http_response, "status_code", 0) or 0)
    if not 200 <= status < 300:
        return
    headers = http_response.headers
    ctype = str(headers.get("content-type") or "")
    # moto labels its empty answers (PUT, DELETE) text/html: only a body counts
    has_body = model.http.get("method") != "HEAD" and status != 204 and headers.get("content-length") != "0"
    reason = None
    if has_body and ctype.lower().startswith("text/html"):
        reason = f"an HTML page ({ctype}) where S3 answers XML or the object's bytes"
    elif model.name in _TAGGED and not headers.get("etag"):
        reason = "no ETag header"
    if reason is None:
        return
    body = parsed.get("Body") if isinstance(parsed, dict) else None
    if body is not None:
        body.close()
    raise SpoiledAnswerError(reason)


def _asked_body(op: str, key: str, resp: dict[str, Any], body: bytes, asked: tuple[int, int] | None) -> bytes:
    """``body`` when it is what was asked: as long as its Content-Length says
    and, for a ranged GET, the bytes [start, end) (cut at the object's end)."""
    declared = resp.get("ContentLength")
    if declared is not None and len(body) != int(declared):
        raise BadResponseError(op, key, f"{len(body)} bytes where Content-Length says {declared}")
    if asked is None:
        return body
    start, end = asked
    found = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", str(resp.get("ContentRange") or "").strip())
    if found is None:
        raise BadResponseError(op, key, f"no Content-Range in the answer to a GET of bytes {start}-{end - 1}")
    first, last, total = (int(g) for g in found.groups())
    if (first, last) != (start, min(end, total) - 1) or len(body) != last - first + 1:
        raise BadResponseError(op, key, f"bytes {first}-{last} ({len(body)}) answered where {start}-{end - 1} "
                               f"of {total} were asked")
    return body


def op_of(etag: str | None) -> str:
    return "put_if_absent" if etag is None else "put_if_match"


def _etag(op: str, key: str, resp: dict[str, Any]) -> str:
    """The ETag of a response; a response without one is a bad answer (a
    proxy or node misbehaving), retried, never a KeyError."""
    etag = str(resp.get("ETag") or "").strip('"')
    if not etag:
        raise BadResponseError(op, key, "no ETag header")
    return etag


# S3's error codes by meaning (a HEAD's answer has no body: botocore puts its
# HTTP status in the code)
_NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
_LOST_RACE = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412"})
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "503"})
_SERVER = frozenset({"InternalError", "RequestTimeout", "500"})
_DENIED = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"})


def _s3_error(op: str, key: str, exc: Exception) -> StorageError | None:
    """``exc`` as a StorageError when it is botocore's or aiohttp's: a spoiled
    answer, S3's error answer (by its code and status), or a transport
    failure; None for anything else."""
    from botocore import exceptions as bx

    bad = _bad_response(op, key, exc)
    if bad is not None:
        return bad
    if isinstance(exc, bx.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _NOT_FOUND:
            return ObjectNotFoundError(op, key)
        if code in _LOST_RACE or status in (409, 412):
            return PreconditionFailedError(op, key)
        if code in _THROTTLED or status == 503:
            return StorageError(op, key, "throttled", retriable=True, outcome="throttled")
        if status >= 500 or code in _SERVER:
            return StorageError(op, key, f"server error {code}", retriable=True)
        if code in _DENIED:
            return StorageError(op, key, f"access denied ({code})", retriable=False)
        return StorageError(op, key, f"S3 error {code}", retriable=False)
    transport = _transport_error(exc)
    if transport is not None:
        return StorageError(op, key, transport[0], retriable=True, outcome=transport[1])
    return None


def _bad_response(op: str, key: str, exc: Exception) -> BadResponseError | None:
    """A 2xx that is not S3's (``SpoiledAnswerError``) or whose body cannot
    be used: unparsable (garbage XML), cut short (fewer bytes than
    Content-Length), or failing the checksum botocore verifies. Each is the
    same typed, retriable error, so it is retried and counted like a 500
    instead of ending in a traceback."""
    from botocore import exceptions as bx
    from botocore.parsers import ResponseParserError

    if isinstance(exc, SpoiledAnswerError):
        return BadResponseError(op, key, exc.reason)
    if isinstance(exc, bx.FlexibleChecksumError):
        return BadResponseError(op, key, "checksum mismatch")
    if isinstance(exc, (bx.IncompleteReadError, bx.ResponseStreamingError)):
        return BadResponseError(op, key, "truncated body")
    if isinstance(exc, ResponseParserError):
        return BadResponseError(op, key, "unparsable body")
    aiohttp = _aiohttp()
    if aiohttp is not None and isinstance(exc, aiohttp.ClientPayloadError):
        return BadResponseError(op, key, "truncated body")
    return None


def _aiohttp() -> Any:
    """aiohttp when something in this process loaded it (s3fs does), else
    None: an exception cannot be one of its types before it is imported, and
    a writer that never used s3fs must not load it to translate a 404."""
    return sys.modules.get("aiohttp")


def _transport_error(exc: Exception) -> tuple[str, str] | None:
    """(reason, outcome) when ``exc`` is a transport failure of botocore or
    aiohttp (connection refused or reset, endpoint unreachable, timeout):
    always retriable, whatever the request was."""
    from botocore import exceptions as bx

    name = type(exc).__name__  # the reason's text only
    if isinstance(exc, (bx.ReadTimeoutError, bx.ConnectTimeoutError)):
        return name, "timeout"
    # ConnectionError: EndpointConnectionError, ProxyConnectionError, SSLError;
    # HTTPClientError: ConnectionClosedError and the other broken exchanges
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError)):
        return name, "error"
    aiohttp = _aiohttp()
    if aiohttp is None:
        return None
    if isinstance(exc, (aiohttp.ServerTimeoutError, aiohttp.ConnectionTimeoutError)):
        return name, "timeout"
    if isinstance(exc, aiohttp.ClientError):
        return name, "error"
    return None
