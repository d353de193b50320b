"""The sidecar's one HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

stdlib ``ThreadingHTTPServer`` in a daemon thread, so a slow scraper never
blocks the jobs and the process can exit without joining it.

* ``/metrics``: the registry in Prometheus text format, or OpenMetrics when
  the scraper's ``Accept`` asks for it (``prometheus_client.exposition``'s
  ``choose_encoder``).
* ``/healthz``: liveness. 200 with the reason while ``alive()`` returns
  ``(True, reason)`` (the sidecar: its scheduler loop beat recently), 503
  otherwise. Never depends on the object store, the lease or the store, so
  a restart is only asked for when a restart can help. Without ``alive``:
  200 ``ok`` while the process serves HTTP.
* ``/readyz``: 200 with the reason when ``ready()`` returns ``(True,
  reason)``, 503 with the reason otherwise (for standalone use: the
  sidecar can write; a pod probe on it would take the broker out of
  service on S3 trouble). If a check raises, 503 with the exception's type
  name only: exception text may carry an endpoint URL or a credential and
  is never sent.
* anything else: 404. Only GET and HEAD are served.

No request logging: a scrape every 15 s would drown the useful logs.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], tuple[bool, str]]

_TEXT = "text/plain; charset=utf-8"


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # request threads never hold up shutdown
    registry: CollectorRegistry
    ready: ReadyCheck
    alive: ReadyCheck


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 30  # a stalled client cannot pin a thread forever
    server_version = "tiered"
    sys_version = ""

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, *, body: bool) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            status, payload = 200, encoder(self.server.registry)
        elif path == "/healthz":
            ok, reason = self._check(self.server.alive, "liveness")
            status, payload, content_type = (200 if ok else 503), reason.encode(), _TEXT
        elif path == "/readyz":
            ok, reason = self._check(self.server.ready, "readiness")
            status, payload, content_type = (200 if ok else 503), reason.encode(), _TEXT
        else:
            status, payload, content_type = 404, b"not found", _TEXT
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(payload)

    @staticmethod
    def _check(check: ReadyCheck, what: str) -> tuple[bool, str]:
        try:
            ok, reason = check()
        except Exception as exc:  # process edge: a broken check means "no"
            log.warning("%s check raised %s", what, type(exc).__name__)
            return False, f"{what} check failed: {type(exc).__name__}"
        return bool(ok), str(reason)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib name)
        pass


class MetricsServer:
    """Serves ``registry`` and the probes on ``host:port`` until ``stop()``.

    ``port=0`` binds a free port; ``.port`` then tells which. ``start()`` binds
    (raising ``OSError`` if the address is taken) and returns once the socket
    listens; ``stop()`` is idempotent and waits for the serving thread.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str,
        port: int,
        ready: ReadyCheck,
        alive: ReadyCheck | None = None,
    ) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._ready = ready
        self._alive: ReadyCheck = alive or (lambda: (True, "ok"))
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port; only meaningful once started."""
        if self._server is None:
            raise RuntimeError("MetricsServer is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._host or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("MetricsServer already started")
        cls = _Server6 if ":" in self._host else _Server
        server = cls((self._host, self._port), _Handler)
        server.registry = self._registry
        server.ready = self._ready
        server.alive = self._alive
        thread = threading.Thread(target=server.serve_forever, name="tiered-metrics", daemon=True)
        thread.start()
        self._server, self._thread = server, thread
        log.info("metrics endpoint listening on %s", self.url)

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
