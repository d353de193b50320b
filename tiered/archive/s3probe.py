"""What an S3-compatible store really honours, asked once per bucket and process.

The archive's safety rests on conditional writes (manifest commits, the
write lease), and S3-compatible servers differ in ways that fail silently:
Ceph RGW compares ``If-Match`` with its bare ETag byte for byte (a quoted tag
never matches, so every commit after the first answers 412 forever) and
ignores ``x-amz-checksum-crc32`` (it verifies Content-MD5); other stores
ignore conditional headers altogether, which would let manifest updates be
lost and two writers hold the lease. So before the first write to a bucket,
a few requests on a probe key under the store's prefix find out:

1. a plain PUT (its ETag is the current tag);
2. ``If-None-Match: *`` on that existing key must answer 412;
3. a stale ``If-Match``, quoted and bare, must answer 412;
4. ``If-Match`` with the current tag: quoted if the server takes it, else bare;
5. a PUT with a wrong ``ChecksumCRC32`` must be refused, else uploads carry
   Content-MD5 (and a wrong Content-MD5 must be refused, else a warning).

Any answer but 412 in steps 2-4, or no form of the current tag accepted,
raises ``ConditionalWritesUnsupportedError`` naming endpoint and bucket:
tiered writes nothing there, and there is no switch to write anyway.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tiered.errors import ConditionalWritesUnsupportedError, ObjectNotFoundError

if TYPE_CHECKING:
    from tiered.archive.s3store import S3Store
    from tiered.format.segbuffer import SegmentBuffer

log = logging.getLogger(__name__)

# One flat object at the root, never a folder: delimiter listings (how readers
# find clusters) show only folders, so the probe is never taken for a cluster,
# and a cluster really named "_probe" is not hidden either.
PROBE_PREFIX = "_probe-"
_STALE_TAG = "00000000000000000000000000000000"
_WRONG_CRC32 = base64.b64encode(b"\0\0\0\0").decode("ascii")
_WRONG_MD5 = base64.b64encode(b"\0" * 16).decode("ascii")


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What the probe learned. ``answers`` keeps each step's HTTP status, for
    the log line and for whoever compares servers."""

    if_match_form: str  # "quoted" | "bare": how the current ETag goes into If-Match
    upload_checksum: str  # "crc32" | "md5" | "none": what the server verifies an upload with
    answers: tuple[tuple[str, int], ...] = ()

    def if_match(self, etag: str) -> str:
        bare = etag.strip('"')
        return f'"{bare}"' if self.if_match_form == "quoted" else bare


_cache: dict[tuple[int, str, str], Capabilities] = {}
_cache_lock = threading.Lock()
_bucket_locks: dict[tuple[int, str, str], threading.Lock] = {}


def endpoint_name(store: S3Store) -> str:
    """The endpoint as an operator would name it, never with credentials."""
    url = store.options.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return f"AWS S3 ({store.options.region or os.environ.get('AWS_DEFAULT_REGION') or 'default region'})"
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def capabilities(store: S3Store) -> Capabilities:
    """The bucket's capabilities, probed on first use in this process."""
    ident = (os.getpid(), store.options.endpoint_url or "", store.bucket)
    with _cache_lock:
        found = _cache.get(ident)
        if found is not None:
            return found
        lock = _bucket_locks.setdefault(ident, threading.Lock())
    with lock:  # one probe per bucket, even with many writer threads
        found = _cache.get(ident)
        if found is None:
            found = probe(store)
            with _cache_lock:
                _cache[ident] = found
        return found


def forget() -> None:
    """Drop every remembered answer (tests, and a store replaced under us)."""
    with _cache_lock:
        _cache.clear()


class _Prober:
    def __init__(self, store: S3Store) -> None:
        self.store = store
        key = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        self.key = key
        self.full = store.full_key(key)
        self.answers: list[tuple[str, int]] = []

    def refuse(self, finding: str) -> ConditionalWritesUnsupportedError:
        return ConditionalWritesUnsupportedError(endpoint_name(self.store), self.store.bucket, self.key, finding)

    def put(self, step: str, op: str, body: bytes, **kw: Any) -> tuple[int, str | None]:
        """(HTTP status, ETag) of one PUT; 5xx, throttling and transport
        failures go through the store's retries like any request."""
        from botocore.exceptions import ClientError

        s = self.store

        def attempt() -> tuple[int, str | None]:
            try:
                resp = s.client.put_object(Bucket=s.bucket, Key=self.full, Body=body, **s.options.put_kwargs(), **kw)
            except ClientError as exc:
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
                if status in (500, 502, 503, 504, 429):
                    raise
                return status, None
            return 200, resp.get("ETag")

        status, etag = s.request(op, self.key, attempt)
        self.answers.append((step, status))
        return status, etag

    def head_etag(self) -> str:
        # an answer without ETag fails inside the store's head, so it is retried
        info = self.store.head(self.key)
        if info is None:
            raise ObjectNotFoundError("head", self.key)
        return str(info.etag)

    def expect_412(self, step: str, op: str, **cond: str) -> None:
        status, _ = self.put(step, op, b"tiered probe: must not be written", **cond)
        if status == 412:
            return
        if 200 <= status < 300:
            raise self.refuse(f"{step} was ignored: the write succeeded instead of answering 412")
        raise self.refuse(f"{step} answered HTTP {status} instead of 412")

    def match_form(self, current: str) -> str:
        """The If-Match form the server takes for the current tag. A 412 is
        checked with a HEAD: a retried request whose first attempt was applied
        also answers 412, and then the tag has moved."""
        for n, form in enumerate(("quoted", "bare")):
            value = f'"{current}"' if form == "quoted" else current
            status, _ = self.put(f"If-Match {form} current ETag", "put_if_match", f"tiered probe {n}".encode(),
                                 IfMatch=value)
            if 200 <= status < 300:
                return form
            if status != 412:
                raise self.refuse(f"If-Match with the current ETag answered HTTP {status}")
            moved = self.head_etag()
            if moved != current:
                return form
        raise self.refuse("If-Match with the current ETag answered 412 quoted and bare")

    def upload_checksum(self) -> str:
        body = b"tiered probe: checksums"
        if self.store.options.checksum_mode == "when_supported":
            good = base64.b64encode(_crc32(body).to_bytes(4, "big")).decode("ascii")
            status, _ = self.put("right ChecksumCRC32", "put", body, ChecksumCRC32=good)
            if 200 <= status < 300:
                status, _ = self.put("wrong ChecksumCRC32", "put", body, ChecksumCRC32=_WRONG_CRC32)
                if 400 <= status < 500:
                    return "crc32"
        status, _ = self.put("wrong Content-MD5", "put", body, ContentMD5=_WRONG_MD5)
        if 400 <= status < 500:
            return "md5"
        log.warning("%s bucket %s verifies neither ChecksumCRC32 nor Content-MD5: uploads are not checked by "
                    "the server", endpoint_name(self.store), self.store.bucket)
        return "none"

    def cleanup(self) -> None:
        s = self.store
        try:
            s.request("delete", self.key, lambda: s.client.delete_object(Bucket=s.bucket, Key=self.full))
        except Exception as exc:  # noqa: BLE001 - a leftover probe object is harmless; the orphan pass is not needed
            log.warning("could not delete probe object %s: %s", self.key, exc)


def _crc32(data: bytes) -> int:
    from zlib_ng.zlib_ng import crc32

    return crc32(data)


def probe(store: S3Store) -> Capabilities:
    """Run the probe (see the module docstring) and log what it found."""
    p = _Prober(store)
    try:
        status, etag = p.put("plain PUT", "put", b"tiered probe")
        if not 200 <= status < 300:
            raise p.refuse(f"a plain PUT of the probe object answered HTTP {status}")
        current = (etag or "").strip('"') or p.head_etag()
        p.expect_412("If-None-Match: * on an existing key", "put_if_absent", IfNoneMatch="*")
        p.expect_412("stale If-Match (quoted)", "put_if_match", IfMatch=f'"{_STALE_TAG}"')
        p.expect_412("stale If-Match (bare)", "put_if_match", IfMatch=_STALE_TAG)
        form = p.match_form(current)
        checksum = p.upload_checksum()
    finally:
        p.cleanup()
    caps = Capabilities(if_match_form=form, upload_checksum=checksum, answers=tuple(p.answers))
    log.info("probed %s bucket %s: If-Match %s, uploads verified by %s; answers %s", endpoint_name(store),
             store.bucket, form, checksum, ", ".join(f"{s}={c}" for s, c in caps.answers))
    return caps


def content_md5(data: bytes | bytearray | memoryview | SegmentBuffer) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")
