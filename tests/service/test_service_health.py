"""A live ``tiered serve`` against a moto server that is stopped and started
again mid-test. /metrics is scraped throughout; the scrapes become a
promtool test input (time-scaled: one scrape, half a second apart, is one
minute for promtool), and promtool evaluates the real alert rules over them.

What must hold: lag is recomputed every round for every queue while the
store is down (messages and bytes exact, seconds growing); last-success
times stand still until the queues commit again; ``tiered_object_store_up``
drops to 0; /healthz stays 200 throughout (liveness never depends on S3);
TieredDispatchStalled and TieredObjectStoreDown fire during the outage and
resolve after it.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from promtool_kit import ALERTS, run_rule_tests
from tiered.store.storewriter import StoreWriter

pytestmark = pytest.mark.s3

TICK_S = 0.5  # real seconds between scrapes
SCALE = 60 / TICK_S  # one scrape = one promtool minute
QUEUES = (("Orders", 0), ("Orders", 1))
INSTANCE = "sidecar-0:9464"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass(frozen=True, kw_only=True)
class Scrape:
    at: float  # wall-clock unix seconds
    healthz: int
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def one(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class Moto:
    """moto's S3 server on a fixed port, stoppable and startable again (its
    state lives in this process, so the bucket survives a restart)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def moto_on_port() -> Iterator[Moto]:
    moto = Moto(free_port())
    moto.start()
    yield moto
    moto.stop()


def produce(store_writer: Callable[..., StoreWriter], n: int) -> Path:
    """``n`` messages into each of QUEUES; the store's root."""
    now = time.time_ns() // 1_000_000
    with store_writer() as w:
        for i in range(n):
            for topic, qid in QUEUES:
                w.put(topic, qid, os.urandom(150), keys=[f"k{i}"], store_timestamp=now)
    return w.root


def to_promtool_series(scrapes: list[Scrape]) -> list[dict[str, str]]:
    """One input series per scraped series, one value per scrape (``_`` where
    absent), on promtool's time line: scrape i at i minutes. Values that are
    times move with it (timestamps: promtool time minus their real age,
    scaled; durations in seconds: scaled); counts stay as they are."""
    keys = sorted({k for s in scrapes for k in s.samples})
    series = []
    for name, labels in keys:
        values = []
        for i, scrape in enumerate(scrapes):
            v = scrape.samples.get((name, labels))
            if v is None or math.isnan(v):
                values.append("_")
                continue
            if name.endswith("_timestamp_seconds") or name == "process_start_time_seconds":
                v = i * 60 - (scrape.at - v) * SCALE
            elif name == "tiered_archive_lag_seconds":
                v = v * SCALE
            values.append(repr(float(v)))
        all_labels = dict(labels) | {"job": "tiered", "instance": INSTANCE}
        selector = ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items()))
        series.append({"series": f"{name}{{{selector}}}", "values": " ".join(values)})
    # the scraper's own series: every scrape above succeeded
    series.append({"series": f'up{{instance="{INSTANCE}",job="tiered"}}', "values": " ".join("1" for _ in scrapes)})
    return series


def alert_names() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_store_outage_live(tmp_path: Path, moto_on_port: Moto, store_writer) -> None:  # noqa: ANN001
    import boto3

    endpoint = f"http://127.0.0.1:{moto_on_port.port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="outage")
    store = produce(store_writer, 40)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    env.update({
        "TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C1", "TIERED_BROKER": "b1",
        "TIERED_DISPATCH__INTERVAL": "0.5", "TIERED_DISPATCH__MAX_DELAY": "0.01",
        "TIERED_DISPATCH__RETRY__ATTEMPTS": "2", "TIERED_DISPATCH__RETRY__BASE_DELAY": "0.01",
        "TIERED_DISPATCH__RETRY__MAX_DELAY": "0.02", "TIERED_S3__MAX_ATTEMPTS": "1",
        "TIERED_S3__CONNECT_TIMEOUT": "1", "TIERED_S3__READ_TIMEOUT": "2",
        "TIERED_S3__ENDPOINT_URL": endpoint, "TIERED_METRICS__HOST": "127.0.0.1", "TIERED_LOG__FORMAT": "json",
    })
    err = open(tmp_path / "serve.err", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "tiered.cli", "serve", "--store", str(store), "--cold",
                             "s3://outage/archive", "--metrics-port", str(port)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=err, text=True)
    base = f"http://127.0.0.1:{port}"
    scrapes: list[Scrape] = []
    next_tick = time.monotonic()

    def scrape() -> Scrape:
        nonlocal next_tick
        next_tick += TICK_S
        time.sleep(max(0.0, next_tick - time.monotonic()))
        if proc.poll() is not None:
            raise AssertionError(Path(err.name).read_text())
        try:
            status, text = get(base + "/metrics")
            healthz = get(base + "/healthz")[0]
        except OSError:
            return Scrape(at=time.time(), healthz=0, samples={})  # not listening yet: no sample
        s = Scrape(at=time.time(), healthz=healthz, samples=parse(text) if status == 200 else {})
        if s.samples:
            scrapes.append(s)
        return s

    def caught_up(s: Scrape, archived: int) -> bool:
        return all(s.one("tiered_archive_lag_messages", topic=t, queue=str(q)) == 0 for t, q in QUEUES) and \
            s.one("tiered_archived_messages_total", topic="Orders") == archived

    try:
        for _ in range(240):
            if caught_up(scrape(), 80):
                break
        else:
            raise AssertionError("not caught up before the outage")
        for _ in range(5):
            scrape()
        before = len(scrapes) - 1
        good = scrapes[before]
        good_success = good.one("tiered_last_success_timestamp_seconds", task="dispatch")
        queue_success = {q: good.one("tiered_queue_last_success_timestamp_seconds", topic=q[0], queue=str(q[1]))
                         for q in QUEUES}
        assert all(queue_success.values())

        moto_on_port.stop()
        produce(store_writer, 7)
        produced_at = time.time()
        down = [scrape() for _ in range(20)]
        # An idle round makes no request (the bucket identity is read at most
        # once a minute), so one may still succeed between the good scrape and
        # the produce; from the first round that sees the new records on, the
        # success stays where it was while the store is down.
        frozen = down[4].one("tiered_last_success_timestamp_seconds", task="dispatch")
        assert good_success <= frozen <= produced_at + 0.5
        for s in down[4:]:  # a round or two after the stop
            for t, q in QUEUES:
                assert s.one("tiered_archive_lag_messages", topic=t, queue=str(q)) == 7
                assert s.one("tiered_archive_lag_bytes", topic=t, queue=str(q)) > 7 * 150
                lag_s = s.one("tiered_archive_lag_seconds", topic=t, queue=str(q))
                assert s.at - produced_at - 1.5 <= lag_s <= s.at - produced_at + 1.0  # fresh, not frozen
                assert s.one("tiered_queue_last_success_timestamp_seconds", topic=t, queue=str(q)) == \
                    queue_success[(t, q)]
            assert s.one("tiered_last_success_timestamp_seconds", task="dispatch") == frozen
            assert s.one("tiered_object_store_up") == 0
            assert s.one("tiered_lease_held") == 1
        assert [s.healthz for s in down] == [200] * len(down)  # liveness never asks the object store
        last_down = len(scrapes) - 1

        moto_on_port.start()
        for _ in range(240):
            if caught_up(scrape(), 94):
                break
        else:
            raise AssertionError("not caught up after the outage")
        for _ in range(12):
            scrape()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        err.close()
    end = scrapes[-1]
    assert end.one("tiered_object_store_up") == 1
    assert end.one("tiered_last_success_timestamp_seconds", task="dispatch") > good_success
    for t, q in QUEUES:
        assert end.one("tiered_queue_last_success_timestamp_seconds", topic=t, queue=str(q)) > queue_success[(t, q)]
    assert all(s.healthz == 200 for s in scrapes)

    # the real rules over the scraped series
    labels = {"job": "tiered", "instance": INSTANCE}
    firing_down = {
        "TieredDispatchStalled": [{"severity": "warning", "task": "dispatch", **labels}],
        "TieredObjectStoreDown": [{"severity": "critical", **labels}],
        "TieredObjectStoreErrors": [{"severity": "warning", **labels}],
    }
    cases = []
    for at, firing in ((before, {}), (last_down, firing_down), (len(scrapes) - 1, {})):
        for name in alert_names():
            cases.append({"eval_time": f"{at}m", "alertname": name,
                          "exp_alerts": [{"exp_labels": lab} for lab in firing.get(name, [])]})
    tests = {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": to_promtool_series(scrapes), "alert_rule_test": cases}]}
    out = run_rule_tests(tmp_path / "promtool", tests)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "SUCCESS" in out.stdout
