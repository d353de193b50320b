"""`tiered serve` as a real process: metrics over HTTP against moto, SIGTERM,
bad configuration, and secrets that must never leak."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tiered.metrics.names import declared_sample_names, metric_names_in_dashboard, metric_names_in_rules
from tiered.archive.coldtier import ColdTier
from tiered.archive.storage import S3Options, open_store
from tiered.store.storewriter import StoreWriter
from tiered.ops.verify import verify

ROOT = Path(__file__).resolve().parents[2]
CLUSTER, BROKER = "C1", "b1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_store(store_writer: Callable[..., StoreWriter], topics: dict[str, int], body: int = 200,
               queues: int = 2) -> dict[str, int]:
    with store_writer() as w:
        for topic, n in topics.items():
            for i in range(n):
                w.put(topic, i % queues, bytes([i % 251]) * body, keys=[f"{topic}-{i}"], tags="t")
    return topics


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    env.update({
        "TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
        "TIERED_DISPATCH__INTERVAL": "0.5", "TIERED_DISPATCH__MAX_DELAY": "0.01",
        "TIERED_DISPATCH__RETRY__BASE_DELAY": "0.01", "TIERED_DISPATCH__RETRY__MAX_DELAY": "0.05",
        "TIERED_METRICS__HOST": "127.0.0.1", "TIERED_LOG__FORMAT": "json",
    })
    env.update(extra)
    return env


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(predicate, timeout: float = 60, every: float = 0.2):  # noqa: ANN001, ANN201
    """Poll until ``predicate()`` is truthy (a bound on waiting, not a timing assertion)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def samples(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metrics_text(proc: subprocess.Popen, port: int) -> str | None:
    """A live sidecar's /metrics page; None while it is not listening yet.
    A sidecar that died fails the test with its stderr."""
    if proc.poll() is not None:
        raise AssertionError(Path(proc.err_path).read_text())  # type: ignore[attr-defined]
    try:
        return get(f"http://127.0.0.1:{port}/metrics")[1]
    except OSError:
        return None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:  # noqa: ANN001
    procs: list[subprocess.Popen] = []

    def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
        # Output goes to files, not pipes: a chatty process must never block on a full pipe.
        n = len(procs)
        out = open(tmp_path / f"serve{n}.out", "w+")  # noqa: SIM115 - closed with the process
        err = open(tmp_path / f"serve{n}.err", "w+")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "tiered.cli", "serve", *args], env=env, cwd=tmp_path,
                                stdout=out, stderr=err, text=True)
        proc.out_path, proc.err_path = out.name, err.name  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_live_metrics_match_the_archive(tmp_path: Path, moto_endpoint: str, s3_url: str, serve,  # noqa: ANN001
                                        store_writer) -> None:  # noqa: ANN001
    store = tmp_path / "store"
    produced = make_store(store_writer, {"Orders": 300, "%DLQ%g": 40})
    port = free_port()
    proc = serve(["--store", str(store), "--cold", s3_url, "--metrics-port", str(port)],
                 serve_env(tmp_path, TIERED_S3__ENDPOINT_URL=moto_endpoint))
    base = f"http://127.0.0.1:{port}"

    def caught_up() -> str | None:
        text = metrics_text(proc, port)
        if text is None:
            return None
        archived = samples(text, "tiered_archived_messages_total")
        lag = samples(text, "tiered_archive_lag_messages")
        done = (archived.get('tiered_archived_messages_total{topic="Orders"}') == 300
                and archived.get('tiered_archived_messages_total{topic="%DLQ%g"}') == 40
                and lag and all(v == 0 for v in lag.values()))
        return text if done else None

    text = wait_for(caught_up)
    assert get(base + "/healthz")[0] == 200
    assert get(base + "/readyz") == (200, "ready")
    assert get(base + "/nope")[0] == 404

    cold = ColdTier(open_store(s3_url, s3=S3Options(endpoint_url=moto_endpoint)), CLUSTER, BROKER)
    cold.rebuild(use_catalog=False)
    manifests = cold.manifests()
    by_topic: dict[str, tuple[int, int]] = {}
    for (topic, _), m in manifests.items():
        n, b = by_topic.get(topic, (0, 0))
        by_topic[topic] = (n + m.messages, b + m.nbytes)
    assert {t: n for t, (n, _) in by_topic.items()} == produced
    for topic, (n, nbytes) in by_topic.items():
        assert samples(text, "tiered_archived_bytes_total")[f'tiered_archived_bytes_total{{topic="{topic}"}}'] == nbytes
        assert samples(text, "tiered_cold_bytes")[f'tiered_cold_bytes{{topic="{topic}"}}'] == nbytes
    assert samples(text, "tiered_archive_lag_seconds")  # per queue series exist
    ok_puts = samples(text, "tiered_object_store_requests_total")
    # layout v2: one data object per segment (the manifest commits are conditional puts)
    assert ok_puts['tiered_object_store_requests_total{op="put",outcome="ok"}'] >= len(manifests)
    assert samples(text, "tiered_last_success_timestamp_seconds")['tiered_last_success_timestamp_seconds{task="dispatch"}'] > 0

    # every metric the alert rules and the dashboard use exists in this live scrape
    declared = declared_sample_names(text)
    wanted = metric_names_in_rules(ROOT / "metrics" / "alerts.yaml") | metric_names_in_dashboard(
        ROOT / "metrics" / "dashboards" / "tiered.json")
    assert wanted, "no metric names found in the rules and dashboard"
    assert wanted - declared == set()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    events = [json.loads(line) for line in Path(proc.err_path).read_text().splitlines() if line.startswith("{")]
    archived = [e for e in events if e["message"] == "archived segment"]
    assert len(archived) == len(manifests) and all({"topic", "queue", "offset"} <= set(e) for e in archived)
    assert sum(e["messages"] for e in archived) == sum(produced.values())


def test_sigterm_during_upload_exits_zero_and_archive_verifies(tmp_path: Path, serve,  # noqa: ANN001
                                                               store_writer) -> None:  # noqa: ANN001
    store = tmp_path / "store"
    with store_writer(commitlog_file_size=64 << 20, cq_entries_per_file=100_000) as w:
        body = os.urandom(4096)
        for i in range(24_000):  # ~100 MB over 4 queues: uploads are still running at SIGTERM
            w.put("Big", i % 4, body)
    cold_url = f"file://{tmp_path / 'cold'}"
    port = free_port()
    env = serve_env(tmp_path, TIERED_DISPATCH__SEGMENT_BYTES="8MiB", TIERED_DISPATCH__PARALLELISM="2",
                    TIERED_SHUTDOWN_TIMEOUT="5", TIERED_DISPATCH__ROUND_BUDGET="600")
    proc = serve(["--store", str(store), "--cold", cold_url, "--metrics-port", str(port)], env)

    def first_segment() -> bool:
        text = metrics_text(proc, port)
        return text is not None and bool(samples(text, "tiered_archived_messages_total"))

    wait_for(first_segment)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0  # bounded by shutdown_timeout; 60 s only guards the test run
    from tiered.store.localstore import LocalStore

    cold = ColdTier(open_store(cold_url), CLUSTER, BROKER)
    report = verify(cold, LocalStore(store))
    assert report.ok, report.problems
    assert report.records > 0


@pytest.mark.parametrize(
    ("yaml_text", "env", "key"),
    [
        ("cleaner:\n  interval: -5\n", {}, "cleaner.interval"),
        ("dispatch:\n  upload_bytes: lots\n", {}, "dispatch.upload_bytes"),
        ("dispatch:\n  interval: 20s\n", {"TIERED_METRICS__PORT": "not-a-port"}, "metrics.port"),
        ("cleaner:\n  intervall: 1h\n", {}, "cleaner.intervall"),
        ("retention:\n  topics:\n    Orders: 0\n", {}, "retention.topics"),
        ("s3:\n  sse: rot13\n", {}, "s3.sse"),
        ("cold_url: ftp://x/y\n", {}, "cold_url"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(tmp_path: Path, yaml_text: str, env: dict[str, str], key: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"store: {tmp_path}\n" + yaml_text)
    proc = subprocess.run([sys.executable, "-m", "tiered.cli", "serve", "--config", str(cfg)],
                          env=serve_env(tmp_path, **env), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert key in lines[0] and lines[0].startswith("tiered: invalid configuration:")


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    from tiered.config import load_settings

    cfg = tmp_path / "c.yaml"
    cfg.write_text("metrics:\n  port: 1111\ncluster: FromFile\nbroker: fileb\n")
    os.environ["TIERED_METRICS__PORT"] = "2222"
    os.environ["TIERED_CLUSTER"] = "FromEnv"
    try:
        s = load_settings(cfg, **{"metrics.port": 3333})
        assert (s.metrics.port, s.cluster, s.broker) == (3333, "FromEnv", "fileb")
        s = load_settings(cfg)
        assert s.metrics.port == 2222
    finally:
        del os.environ["TIERED_METRICS__PORT"], os.environ["TIERED_CLUSTER"]
    assert load_settings(cfg).metrics.port == 1111


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSECRETKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLE-SESSION-TOKEN-VALUE"


def test_secrets_never_leak(tmp_path: Path, serve, store_writer) -> None:  # noqa: ANN001
    """A run that hits errors (nothing listens at the endpoint) with secrets in env
    and in the config file: none of them in logs, /metrics, /readyz, status or errors."""
    store = tmp_path / "store"
    make_store(store_writer, {"Orders": 20})
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"s3:\n  access_key_id: AKIAEXAMPLEKEYID\n  session_token: {TOKEN}\n")
    env = serve_env(tmp_path, TIERED_S3__SECRET_ACCESS_KEY=SECRET, TIERED_S3__ENDPOINT_URL=dead,
                    TIERED_LOG__LEVEL="DEBUG", TIERED_DISPATCH__RETRY__ATTEMPTS="2",
                    TIERED_S3__CONNECT_TIMEOUT="0.2")
    port = free_port()
    proc = serve(["--config", str(cfg), "--store", str(store), "--cold", "s3://no-such-bucket/x",
                  "--metrics-port", str(port)], env)
    base = f"http://127.0.0.1:{port}"

    def scraped() -> tuple[str, str] | None:
        try:
            text = get(base + "/metrics")[1]
            ready = get(base + "/readyz")
        except OSError:
            return None
        errors = samples(text, "tiered_object_store_requests_total")
        failed = sum(v for k, v in errors.items() if 'outcome="ok"' not in k)
        return (text, ready[1]) if failed >= 2 and ready[0] == 503 else None

    text, ready = wait_for(scraped)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    out, err = Path(proc.out_path).read_text(), Path(proc.err_path).read_text()
    status = subprocess.run([sys.executable, "-m", "tiered.cli", "status", "--config", str(cfg), "--cold",
                             "s3://no-such-bucket/x", "--store", str(store)], env=env, capture_output=True,
                            text=True, timeout=120)
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text(f"s3:\n  secret_access_key: {SECRET}\n  max_attempts: {SECRET}\n")
    bad = subprocess.run([sys.executable, "-m", "tiered.cli", "serve", "--config", str(bad_cfg), "--store", str(store)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "error" in err.lower() or "retrying" in err.lower()  # the run did hit errors
    for blob in (out, err, text, ready, status.stdout, status.stderr, bad.stdout, bad.stderr):
        assert SECRET not in blob
        assert TOKEN not in blob
    for line in err.splitlines():
        if line.startswith("{"):
            json.loads(line)  # JSON lines, one object each
