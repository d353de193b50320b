"""Liveness is the scheduler's heartbeat and nothing else: not the object
store, the lease or the store (a probe failing on those would restart, or
take out of service, a broker pod a restart cannot help)."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from tiered.cli.serve import LIVENESS_MIN_S, Sidecar
from tiered.clock import ManualClock
from tiered.config import load_settings
from tiered.archive.lease import LeaseManager
from tiered.archive.storage import open_store


def status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_healthz_follows_the_heartbeat_only(tmp_path: Path, monkeypatch, store_writer) -> None:  # noqa: ANN001
    for key in [k for k in os.environ if k.startswith("TIERED_")]:
        monkeypatch.delenv(key)
    with store_writer() as w:
        w.put("Orders", 0, b"x" * 10)
    # an object store nobody listens on: every request fails
    settings = load_settings(None, store=tmp_path / "store", cold_url="s3://nowhere/archive",
                             state_dir=tmp_path / "state", **{
                                 "metrics.host": "127.0.0.1", "metrics.port": 0, "dispatch.interval": 20,
                                 "s3.endpoint_url": "http://127.0.0.1:9", "s3.max_attempts": 1,
                                 "dispatch.retry.attempts": 1, "s3.connect_timeout": 1})
    clock = ManualClock()
    sidecar = Sidecar(settings, clock=clock)
    assert sidecar.liveness_s == max(LIVENESS_MIN_S, 3 * 20)
    sidecar.server.start()
    try:
        base = sidecar.server.url
        assert status(base + "/healthz") == (200, "starting")
        sidecar.heartbeat()
        sidecar.dispatch_round()  # the object store is down: a failed round, not a dead process
        assert status(base + "/healthz") == (200, "alive")
        code, reason = status(base + "/readyz")
        assert code == 503 and reason.startswith("cold tier not ready")
        assert sidecar.registry.get_sample_value("tiered_object_store_up") == 0
        assert sidecar.registry.get_sample_value("tiered_lease_held") == 0
        clock.advance(sidecar.liveness_s)
        assert status(base + "/healthz")[0] == 200  # at the limit still alive
        clock.advance(1)
        code, reason = status(base + "/healthz")
        assert code == 503 and reason == "scheduler stalled: no heartbeat for 61s (limit 60s)"
        sidecar.heartbeat()
        assert status(base + "/healthz") == (200, "alive")
    finally:
        sidecar.server.stop()


def _idle_sidecar(tmp_path: Path, monkeypatch, store_writer) -> tuple[Sidecar, ManualClock, str]:  # noqa: ANN001
    for key in [k for k in os.environ if k.startswith("TIERED_")]:
        monkeypatch.delenv(key)
    with store_writer() as w:
        w.put("Orders", 0, b"x" * 10)
    cold = f"file://{tmp_path / 'cold'}"
    settings = load_settings(None, store=tmp_path / "store", cold_url=cold, state_dir=tmp_path / "state",
                             cluster="C", broker="b", **{"metrics.port": 0, "lease_ttl": 120})
    clock = ManualClock()
    return Sidecar(settings, clock=clock), clock, cold


def test_lease_gauges_and_changes(tmp_path: Path, monkeypatch, store_writer) -> None:  # noqa: ANN001
    sidecar, clock, cold = _idle_sidecar(tmp_path, monkeypatch, store_writer)
    value = sidecar.registry.get_sample_value
    assert value("tiered_lease_held") == 0 and value("tiered_lease_expiry_timestamp_seconds") is None
    sidecar.dispatch_round()
    assert value("tiered_lease_held") == 1
    assert value("tiered_lease_expiry_timestamp_seconds") == clock.now_ms() / 1000 + 120
    assert value("tiered_lease_changes_total", {"event": "acquired"}) == 1
    # another writer forces a takeover: the next round is fenced and the change counted
    other = LeaseManager(open_store(cold), "C/b", "intruder", clock=clock, force=True)
    other.acquire()
    with store_writer() as w:
        w.put("Orders", 0, b"y" * 10)  # something to write, so the round reads the lease
    clock.advance(120)
    sidecar.dispatch_round()
    assert value("tiered_lease_held") == 0 and value("tiered_lease_expiry_timestamp_seconds") is None
    assert value("tiered_lease_changes_total", {"event": "lost"}) == 1
    assert value("tiered_lease_changes_total", {"event": "acquired"}) == 1


def test_an_idle_sidecar_renews_its_lease_through_the_probe(tmp_path: Path, monkeypatch,  # noqa: ANN001
                                                            store_writer) -> None:  # noqa: ANN001
    sidecar, clock, cold = _idle_sidecar(tmp_path, monkeypatch, store_writer)
    value = sidecar.registry.get_sample_value
    bucket = LeaseManager(open_store(cold), "C/b", "reader", clock=clock)
    sidecar.dispatch_round()  # archives the one message; every later round is idle
    first = bucket.current()
    assert first is not None and first.expires_ms == clock.now_ms() + 120_000
    clock.advance(50)  # 70 s left, more than half the TTL: no write
    sidecar.dispatch_round()
    sidecar.probe_store()
    assert bucket.current() == first
    clock.advance(20)  # 50 s left: the probe renews, though no round writes
    sidecar.dispatch_round()
    sidecar.probe_store()
    renewed = bucket.current()
    assert renewed is not None and renewed.expires_ms == clock.now_ms() + 120_000
    assert renewed.epoch == first.epoch and renewed.owner == first.owner
    assert value("tiered_lease_held") == 1
    assert value("tiered_lease_expiry_timestamp_seconds") == renewed.expires_ms / 1000
    assert value("tiered_lease_changes_total", {"event": "lost"}) == 0


def test_a_lapsed_or_taken_lease_reads_not_held(tmp_path: Path, monkeypatch, store_writer) -> None:  # noqa: ANN001
    sidecar, clock, cold = _idle_sidecar(tmp_path, monkeypatch, store_writer)
    value = sidecar.registry.get_sample_value
    sidecar.dispatch_round()
    # no renewal got through (a storage outage): past its expiry the lease is
    # anyone's, whatever this sidecar last wrote
    clock.advance(121)
    sidecar._note_lease()
    assert value("tiered_lease_held") == 0 and value("tiered_lease_expiry_timestamp_seconds") is None
    assert value("tiered_lease_changes_total", {"event": "lost"}) == 1
    # the probe's renewal wins it back, since nobody else took it
    sidecar.probe_store()
    assert value("tiered_lease_held") == 1
    assert value("tiered_lease_changes_total", {"event": "acquired"}) == 2
    # another writer takes the prefix while we idle: the probe's renewal is refused
    LeaseManager(open_store(cold), "C/b", "intruder", clock=clock, force=True).acquire()
    clock.advance(70)
    sidecar.probe_store()
    assert value("tiered_lease_held") == 0 and value("tiered_lease_expiry_timestamp_seconds") is None
    assert value("tiered_lease_changes_total", {"event": "lost"}) == 2
