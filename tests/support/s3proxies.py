"""Proxies in front of a real S3 server that behave like other S3 servers.

Built on ``faultproxy.FaultProxy`` (every request forwarded unchanged unless
said otherwise; a fault schedule still applies):

``RgwIfMatchProxy``       behaves as Ceph RGW does: compares ``If-Match``
                          byte for byte with the bare ETag, so a quoted tag
                          never matches (412) and a bare one is left to the
                          server; ignores ``x-amz-checksum-*`` (dropped) and
                          verifies Content-MD5 (400 BadDigest). In front of
                          moto: the dropped headers are signed
``RefuseConditionsProxy`` answers 501 (or 400) to any conditional write
``StripConditionsProxy``  drops ``If-Match`` / ``If-None-Match``: a store that
                          ignores conditional writes (upstream must not check
                          signatures, as moto does not: the headers are signed)
``MangleProxy``           spoils some answers of the server: ``no_etag``
                          (ETag header removed), ``garbage`` (the 200's body
                          replaced by bytes no parser takes), ``truncated``
                          (half the body sent, the whole length declared),
                          ``bad_checksum`` (a body byte flipped, the server's
                          checksum header kept)
``SpoilProxy``            answers a seeded share of requests as a captive
                          portal or a misrouted load balancer would: ``html``
                          (a 200 text/html page without ETag; the request
                          never reaches the server) and ``strip_etag`` (the
                          request applied, its answer without the ETag)
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections import Counter
from collections.abc import Callable

from faultproxy import _XML, FaultProxy, Request

MANGLES = ("no_etag", "garbage", "truncated", "bad_checksum")


class RgwIfMatchProxy(FaultProxy):
    def __init__(self, upstream: str, **kw: object) -> None:
        super().__init__(upstream, **kw)  # type: ignore[arg-type]
        self.refused_quoted = 0
        self.refused_keys: list[str] = []
        self.bad_digests = 0

    def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        md5 = next((v for n, v in req.headers if n.lower() == "content-md5"), None)
        if md5 is not None and md5 != base64.b64encode(hashlib.md5(req.body).digest()).decode("ascii"):
            with self._lock:
                self.bad_digests += 1
            body = _XML.format(code="BadDigest", msg="The Content-MD5 you specified did not match").encode()
            return 400, "Bad Request", [("Content-Type", "application/xml")], body
        # RGW ignores the flexible checksums: dropped before moto sees them
        # (so upstream must not check signatures, as moto does not)
        req = Request(req.method, req.path, [(n, v) for n, v in req.headers
                                             if not n.lower().startswith(("x-amz-checksum-", "x-amz-sdk-checksum"))],
                      req.body)
        value = next((v for n, v in req.headers if n.lower() == "if-match"), None)
        if value is not None and value.startswith('"'):
            with self._lock:
                self.refused_quoted += 1
                self.refused_keys.append(req.key)
            body = _XML.format(code="PreconditionFailed", msg="At least one of the pre-conditions you "
                               "specified did not hold").encode()
            return 412, "Precondition Failed", [("Content-Type", "application/xml")], body
        return super().forward(req)


class StripConditionsProxy(FaultProxy):
    def __init__(self, upstream: str, **kw: object) -> None:
        super().__init__(upstream, **kw)  # type: ignore[arg-type]
        self.stripped = 0

    def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        kept = [(n, v) for n, v in req.headers if n.lower() not in ("if-match", "if-none-match")]
        if len(kept) != len(req.headers):
            with self._lock:
                self.stripped += 1
        return super().forward(Request(req.method, req.path, kept, req.body))


class MangleProxy(FaultProxy):
    """``mangle(req)`` names the spoiling for a request, or None."""

    def __init__(self, upstream: str, mangle: Callable[[Request], str | None], **kw: object) -> None:
        super().__init__(upstream, **kw)  # type: ignore[arg-type]
        self.mangle = mangle
        self.mangled: Counter[str] = Counter()

    def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        status, reason, headers, body = super().forward(req)
        kind = self.mangle(req) if 200 <= status < 300 else None
        if kind is None:
            return status, reason, headers, body
        with self._lock:
            self.mangled[kind] += 1
        if kind == "no_etag":
            headers = [(n, v) for n, v in headers if n.lower() != "etag"]
        elif kind == "garbage":
            body = b"\x00\xffnot xml <<" + b"\x13" * 20
            headers = [(n, v) for n, v in headers if n.lower() not in ("etag", "x-amz-checksum-crc32")]
        elif kind == "truncated":
            headers = headers + [("X-Faultproxy-Declared-Length", str(len(body)))]
            body = body[: len(body) // 2]
        elif kind == "bad_checksum":  # the checksum of the body as sent, then one byte flipped on the way
            crc = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode("ascii")
            headers = [(n, v) for n, v in headers if not n.lower().startswith("x-amz-checksum-")]
            headers.append(("x-amz-checksum-crc32", crc))
            body = bytes([body[0] ^ 0xFF]) + body[1:] if body else body
        return status, reason, headers, body


class RefuseConditionsProxy(FaultProxy):
    """Answers ``status`` (501 NotImplemented, or 400) to any request carrying
    ``If-Match`` / ``If-None-Match``, as some stores do."""

    def __init__(self, upstream: str, status: int = 501, **kw: object) -> None:
        super().__init__(upstream, **kw)  # type: ignore[arg-type]
        self.status = status

    def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if any(n.lower() in ("if-match", "if-none-match") for n, _ in req.headers):
            code, reason = (("NotImplemented", "Not Implemented") if self.status == 501
                            else ("InvalidArgument", "Bad Request"))
            body = _XML.format(code=code, msg="conditional headers are not supported").encode()
            return self.status, reason, [("Content-Type", "application/xml")], body
        return super().forward(req)


SPOILS = ("html", "strip_etag")
_PORTAL = (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>"
           b"<body><p>Please sign in to continue.</p></body></html>\n")


class SpoilProxy(FaultProxy):
    """``html`` for a share ``html`` of the requests, ``strip_etag`` for a
    share ``strip_etag``, drawn from a hash of (seed, method, path, how many
    times that request was seen before): the same requests are spoiled in
    every run whatever the order of the client's threads (the bucket's name
    and a random id in a path, as the probe's, are left out of the hash). One request is never
    spoiled more than ``max_in_a_row`` times in a row, so its retries get
    through. ``force(req, n)`` may name the spoiling of the n-th sighting of
    a request (n from 0) before the shares are drawn."""

    def __init__(self, upstream: str, *, html: float = 0.15, strip_etag: float = 0.10, seed: int = 0,
                 max_in_a_row: int = 2, force: Callable[[Request, int], str | None] | None = None,
                 **kw: object) -> None:
        super().__init__(upstream, **kw)  # type: ignore[arg-type]
        self.shares = (html, strip_etag)
        self.seed = seed
        self.max_in_a_row = max_in_a_row
        self.force = force
        self.seen: Counter[tuple[str, str]] = Counter()
        self.streak: Counter[tuple[str, str]] = Counter()
        self.spoiled: list[tuple[str, str, str]] = []  # (kind, method, key) of each answer spoiled

    @staticmethod
    def _ident(req: Request) -> tuple[str, str]:
        # the path without the bucket (a test's bucket has a random name)
        path = req.path.lstrip("/")
        cut = min((i for i in (path.find("/"), path.find("?")) if i >= 0), default=len(path))
        return req.method, re.sub(r"[0-9a-f]{32}", "*", path[cut:])

    def _choose(self, req: Request) -> str | None:
        ident = self._ident(req)
        with self._lock:
            n = self.seen[ident]
            self.seen[ident] += 1
            if self.streak[ident] >= self.max_in_a_row:
                self.streak[ident] = 0
                return None
            kind = self.force(req, n) if self.force is not None else None
            if kind is None:
                digest = hashlib.blake2b(f"{self.seed}|{ident[0]}|{ident[1]}|{n}".encode(), digest_size=8).digest()
                draw = int.from_bytes(digest, "big") / 2 ** 64
                html, strip = self.shares
                kind = "html" if draw < html else "strip_etag" if draw < html + strip else None
            self.streak[ident] = self.streak[ident] + 1 if kind is not None else 0
            return kind

    def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        kind = self._choose(req)
        if kind == "html":
            with self._lock:
                self.spoiled.append((kind, req.method, req.key))
            return 200, "OK", [("Content-Type", "text/html; charset=utf-8"),
                               ("Content-Length", str(len(_PORTAL)))], _PORTAL
        status, reason, headers, body = super().forward(req)
        if kind != "strip_etag":
            return status, reason, headers, body
        kept = [(n, v) for n, v in headers if n.lower() != "etag"]
        with self._lock:
            if 200 <= status < 300 and len(kept) < len(headers):
                self.spoiled.append((kind, req.method, req.key))
                return status, reason, kept, body
            self.streak[self._ident(req)] = 0  # an error or a list: nothing to strip, nothing spoiled
        return status, reason, headers, body
