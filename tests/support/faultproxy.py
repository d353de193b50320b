"""A fault-injecting HTTP proxy in front of the moto S3 server.

The real clients (s3fs/aiobotocore and boto3/urllib3) talk to this proxy as
their S3 endpoint; it forwards each request to moto unchanged (the Host
header too, so nothing about signing changes) and, per a seeded schedule,
answers some of them with a fault instead:

``500``          ``500 InternalError`` with S3's XML error body
``503``          ``503 SlowDown`` with S3's XML error body
``reset``        the connection is reset (SO_LINGER 0 close) before forwarding
``stall``        nothing is answered for longer than the client's read timeout
``reset_after``  the request IS forwarded (and applied by moto), then the
                 connection is reset: the response is lost, the write is not

Every response closes the client connection (``Connection: close``), which
keeps the proxy simple and makes every request a fresh connection.
"""

from __future__ import annotations

import http.client
import random
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("500", "503", "reset", "stall", "reset_after")

_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{msg}</Message>'
        '<RequestId>faultproxy</RequestId></Error>')


@dataclass
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def key(self) -> str:
        """The object key part of the path (after the bucket), unquoted."""
        path = urllib.parse.urlsplit(self.path).path
        parts = urllib.parse.unquote(path).lstrip("/").split("/", 1)
        return parts[1] if len(parts) > 1 else ""


@dataclass
class FaultSchedule:
    """Which requests fail, and how. ``rate`` of the requests that
    ``applies`` accepts get a fault drawn from ``kinds``, from a seeded RNG."""

    rate: float = 0.0
    kinds: tuple[str, ...] = KINDS
    seed: int = 0
    applies: Callable[[Request], bool] = lambda r: True
    # Or an explicit decision per request (overrides rate): kind or None.
    decide: Callable[[Request], str | None] | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def pick(self, req: Request) -> str | None:
        if self.decide is not None:
            return self.decide(req)
        if not self.applies(req):
            return None
        if self._rng.random() >= self.rate:
            return None
        return self._rng.choice(self.kinds)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(30)
        rfile = sock.makefile("rb")
        try:
            req = _read_request(rfile, sock.sendall)
        except (OSError, ValueError):
            return
        if req is None:
            return
        proxy = self.server.proxy
        kind = proxy.decide(req)
        if kind == "reset":
            _reset(sock)
            return
        if kind == "stall":
            time.sleep(proxy.stall_s)
            _reset(sock)
            return
        if kind in ("500", "503"):
            code, status, reason = (("InternalError", 500, "Internal Server Error") if kind == "500"
                                    else ("SlowDown", 503, "Slow Down"))
            body = _XML.format(code=code, msg="injected by faultproxy").encode() if req.method != "HEAD" else b""
            head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            sock.sendall(head + body)
            return
        try:
            status, reason, headers, body = proxy.forward(req)
        except OSError:
            _reset(sock)
            return
        if kind == "reset_after":
            _reset(sock)
            return
        out = [f"HTTP/1.1 {status} {reason}"]
        for name, value in headers:
            if name.lower() in ("transfer-encoding", "connection", "content-length", "keep-alive"):
                continue
            out.append(f"{name}: {value}")
        length = len(body)
        # a subclass's forward() may declare a longer body than it sends (a body cut short)
        declared = next((v for n, v in headers if n.lower() == "x-faultproxy-declared-length"), None)
        if declared is not None:
            length = int(declared)
            out = [h for h in out if not h.lower().startswith("x-faultproxy-declared-length")]
        if req.method == "HEAD":
            length = next((int(v) for n, v in headers if n.lower() == "content-length"), 0)
            body = b""
        out.append(f"Content-Length: {length}")
        out.append("Connection: close")
        try:
            sock.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
        except OSError:
            pass


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _read_request(rfile, send: Callable[[bytes], object]) -> Request | None:  # noqa: ANN001 - a socket file
    line = rfile.readline(65537)
    if not line:
        return None
    method, path, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: list[tuple[str, str]] = []
    while True:
        h = rfile.readline(65537)
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    lower = {n.lower(): v for n, v in headers}
    body = b""
    if lower.get("expect", "").lower() == "100-continue":
        send(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it before sending the body
        headers = [(n, v) for n, v in headers if n.lower() != "expect"]
    if lower.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size_line = rfile.readline(65537)
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            chunks.append(rfile.read(size))
            rfile.readline(65537)
        body = b"".join(chunks)
        headers = [(n, v) for n, v in headers if n.lower() != "transfer-encoding"]
        headers.append(("Content-Length", str(len(body))))
    elif "content-length" in lower:
        body = rfile.read(int(lower["content-length"]))
    return Request(method, path, headers, body)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class FaultProxy:
    """``with FaultProxy(upstream, schedule) as proxy: ... proxy.url ...``"""

    def __init__(self, upstream: str, schedule: FaultSchedule | None = None, *, stall_s: float = 1.5) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.upstream_host = u.hostname or "127.0.0.1"
        self.upstream_port = u.port or 80
        self.schedule = schedule or FaultSchedule()
        self.stall_s = stall_s
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.log: list[tuple[str, str, str | None]] = []  # (method, key, fault)
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def decide(self, req: Request) -> str | None:
        with self._lock:
            kind = self.schedule.pick(req)
            self.requests += 1
            if kind is not None:
                self.injected[kind] += 1
            self.log.append((req.method, req.key, kind))
            return kind

    def forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=30)
        try:
            conn.putrequest(req.method, req.path, skip_host=True, skip_accept_encoding=True)
            for name, value in req.headers:
                conn.putheader(name, value)
            conn.endheaders(req.body if req.body else None)
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, resp.reason, resp.getheaders(), body
        finally:
            conn.close()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
