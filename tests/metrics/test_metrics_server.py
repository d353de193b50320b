"""MetricsServer over real HTTP on a free port."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from tiered.metrics import MetricsServer, PrometheusRecorder


class Readiness:
    """A ready() callback the test can flip."""

    def __init__(self) -> None:
        self.state: tuple[bool, str] = (False, "no dispatch round yet")
        self.error: Exception | None = None

    def __call__(self) -> tuple[bool, str]:
        if self.error is not None:
            raise self.error
        return self.state


_READY = Readiness()


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    # One server for the module (stop() waits out serve_forever's poll);
    # each test gets the readiness callback reset through `ready`.
    registry = CollectorRegistry()
    PrometheusRecorder(registry).archived("orders", 0, 3, 300)
    srv = MetricsServer(registry, host="127.0.0.1", port=0, ready=_READY)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def ready() -> Readiness:
    _READY.state, _READY.error = (False, "no dispatch round yet"), None
    return _READY


def get(srv: MetricsServer, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_binds_a_free_port(server: MetricsServer) -> None:
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


def test_metrics_in_prometheus_text_format(server: MetricsServer) -> None:
    status, ctype, body = get(server, "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    assert 'tiered_archived_messages_total{topic="orders"} 3.0' in body
    assert "# TYPE tiered_archived_bytes_total counter" in body


def test_metrics_in_openmetrics_when_asked(server: MetricsServer) -> None:
    status, ctype, body = get(server, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200
    assert ctype.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")
    assert 'tiered_archived_messages_total{topic="orders"} 3.0' in body


def test_metrics_ignores_query_string(server: MetricsServer) -> None:
    assert get(server, "/metrics?name[]=tiered_gaps_total")[0] == 200


def test_healthz(server: MetricsServer) -> None:
    assert get(server, "/healthz")[:3:2] == (200, "ok")


def test_readyz_flips_from_503_to_200(server: MetricsServer, ready: Readiness) -> None:
    assert get(server, "/readyz")[:3:2] == (503, "no dispatch round yet")
    ready.state = (True, "dispatch round ok")
    assert get(server, "/readyz")[:3:2] == (200, "dispatch round ok")
    ready.state = (False, "object store unreachable")
    assert get(server, "/readyz")[:3:2] == (503, "object store unreachable")


def test_readyz_hides_the_text_of_a_failing_check(server: MetricsServer, ready: Readiness) -> None:
    ready.error = RuntimeError("https://AKIAEXAMPLE:hunter2@s3.example.com")
    status, _, body = get(server, "/readyz")
    assert status == 503
    assert "RuntimeError" in body and "hunter2" not in body and "AKIA" not in body
    assert get(server, "/healthz")[0] == 200  # still serving


@pytest.mark.parametrize("path", ["/", "/metricsx", "/healthz/extra", "/favicon.ico", "/../metrics"])
def test_other_paths_are_404(server: MetricsServer, path: str) -> None:
    assert get(server, path)[0] == 404


def test_head_has_status_and_no_body(server: MetricsServer, ready: Readiness) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("HEAD", "/readyz")
        resp = conn.getresponse()
        assert resp.status == 503
        assert resp.read() == b""
    finally:
        conn.close()


def test_requests_are_not_logged_to_stderr(server: MetricsServer, capfd: pytest.CaptureFixture[str]) -> None:
    for path in ("/metrics", "/healthz", "/readyz", "/nope"):
        get(server, path)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("DELETE", "/metrics")  # unsupported method: answered, not logged
    assert conn.getresponse().status == 501
    conn.close()
    assert capfd.readouterr().err == ""


def test_lifecycle() -> None:
    srv = MetricsServer(CollectorRegistry(), host="127.0.0.1", port=0, ready=lambda: (True, "ok"))
    with pytest.raises(RuntimeError):
        _ = srv.port
    with srv:
        port = srv.port
        with pytest.raises(RuntimeError):
            srv.start()
        assert get(srv, "/healthz")[0] == 200
    srv.stop()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_port_in_use_raises_on_start(server: MetricsServer) -> None:
    other = MetricsServer(CollectorRegistry(), host="127.0.0.1", port=server.port, ready=lambda: (True, ""))
    with pytest.raises(OSError):
        other.start()
