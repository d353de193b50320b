"""Exactness: rounds interleaved with produce leave every queue's archive
equal to the broker's records, byte for byte, in order, no duplicates, on
file:// and on a real S3 endpoint; and ``tiered dispatch`` / ``tiered
verify`` do the same from the command line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dispatchkit import (
    BROKER,
    CLUSTER,
    archived_records,
    assert_exact,
    local_records,
    new_dispatcher,
    new_writer,
    produce,
    read_manifest,
)
from tiered.archive import layout
from tiered.cli import app
from tiered.archive.coldtier import ColdTier
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import CATALOG, Catalog
from tiered.archive.storage import FileStore
from tiered.ops.verify import verify

ARCHIVED = [("TopicA", 0), ("TopicA", 1), ("TopicA", 2), ("%RETRY%group1", 0), ("%DLQ%group1", 0), ("TopicV6", 0)]
SYSTEM = [("SCHEDULE_TOPIC_XXXX", 2), ("RMQ_SYS_TRACE_TOPIC", 0), ("TBW102", 0), ("rmq_sys_wheel", 0),
          ("OFFSET_MOVED_EVENT", 0)]


def test_rounds_interleaved_with_produce_archive_exactly(cold_url, open_cold, tmp_path, clock, recorder):
    store = open_cold(cold_url, recorder=recorder)
    rng = random.Random(11)
    with new_writer(tmp_path / "store") as w:
        local = LocalStore(tmp_path / "store")
        d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder,
                           upload_bytes=1500, segment_bytes=2500, max_delay_ms=5000, parallelism=3)
        produced = dict.fromkeys(ARCHIVED, 0)
        for step in range(8):
            for topic, qid in rng.sample(ARCHIVED, 4):
                n = rng.randint(1, 25)
                produce(w, topic, qid, n, clock=clock, seed=step, ipv6=topic == "TopicV6")
                produced[(topic, qid)] += n
            for topic, qid in SYSTEM:
                produce(w, topic, qid, 2, clock=clock, seed=step)
            clock.advance(rng.choice([0, 1, 3, 10]))
            d.run_round()
            if step % 3 == 2:  # meanwhile, what is archived is exact: a prefix of each queue
                assert_exact(store, local, [k for k in ARCHIVED if read_manifest(store, *k) is not None],
                             complete=False)
        clock.advance(10)
        result = d.run_round()
        assert result.ok, result.errors
    counts = assert_exact(store, local, ARCHIVED)
    assert counts == produced
    for topic, qid in SYSTEM:
        assert read_manifest(store, topic, qid) is None, f"system topic {topic} was archived"
    report = verify(ColdTier(store, CLUSTER, BROKER), local)
    assert report.ok, report.problems
    assert report.compared_locally == sum(produced.values())
    assert not report.orphans and not report.unarchived
    catalog = Catalog.from_bytes(store.get(f"{CLUSTER}/{BROKER}/{CATALOG}"))
    # every queue listed from the round that first committed it; its ranges
    # may lag (at most dispatch.catalog_refresh, 300 s here): refreshed after
    assert {(q.topic, q.queue_id) for q in catalog.queues} == set(produced)
    assert all(q.next_offset <= produced[(q.topic, q.queue_id)] for q in catalog.queues)
    clock.advance(300)
    assert d.run_round().ok
    catalog = Catalog.from_bytes(store.get(f"{CLUSTER}/{BROKER}/{CATALOG}"))
    assert {(q.topic, q.queue_id): q.next_offset for q in catalog.queues} == produced
    assert catalog.format_version.startswith("1.")


def test_concurrent_producer_never_yields_a_torn_or_skipped_record(tmp_path, clock):
    """A producer thread appends while rounds run: records are read only once
    complete, and nothing is skipped or duplicated."""
    store = FileStore(str(tmp_path / "cold"))
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=3000,
                       max_delay_ms=0, parallelism=2)
    stop = threading.Event()

    def producer() -> None:
        i = 0
        while not stop.is_set() and i < 3000:
            produce(w, "Live", i % 3, 1, seed=i)
            i += 1

    t = threading.Thread(target=producer)
    t.start()
    try:
        rounds = 0
        while t.is_alive() and rounds < 400:
            result = d.run_round()
            assert result.ok, result.errors
            rounds += 1
    finally:
        stop.set()
        t.join()
        w.close()
    d.run_round()
    queues = [("Live", q) for q in range(3)]
    counts = assert_exact(store, local, queues)
    assert sum(counts.values()) == sum(local.max_offset("Live", q) for q in range(3))


def _cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
           "TIERED_LOG__LEVEL": "WARNING"}
    env.update(extra)
    return env


def test_cli_dispatch_once_then_verify(cold_url, open_cold, tmp_path, clock, moto_endpoint):
    with new_writer(tmp_path / "store") as w:
        for topic, qid in ARCHIVED:
            produce(w, topic, qid, 30, seed=1)
        produce(w, "SCHEDULE_TOPIC_XXXX", 0, 5)
    store_dir = str(tmp_path / "store")
    # The standard AWS setting names the endpoint: no tiered-specific option needed.
    env = _cli_env(tmp_path, AWS_ENDPOINT_URL_S3=moto_endpoint)
    runner = CliRunner()
    res = runner.invoke(app, ["dispatch", "--store", store_dir, "--cold", cold_url, "--once", "--all"], env=env)
    assert res.exit_code == 0, res.output
    assert "archived 180 messages" in res.output
    res = runner.invoke(app, ["verify", "--store", store_dir, "--cold", cold_url], env=env)
    assert res.exit_code == 0, res.output
    assert "compared byte for byte 180" in res.stdout and res.stdout.rstrip().endswith("OK")
    res = runner.invoke(app, ["verify", "--store", store_dir, "--cold", cold_url, "--json"], env=env)
    assert res.exit_code == 0 and json.loads(res.stdout)["records"] == 180
    # A second --once right away finds nothing new.
    res = runner.invoke(app, ["dispatch", "--store", store_dir, "--cold", cold_url, "--once", "--all"], env=env)
    assert res.exit_code == 0 and "archived 0 messages" in res.output, res.output

    # Tamper with one archived record: verify names it and fails.
    store = open_cold(cold_url)
    m = read_manifest(store, "TopicA", 1)
    seg = m.segments[0]
    obj = layout.object_of(seg.commitlog_key)  # records first in either layout
    data = bytearray(store.get(obj))
    data[seg.nbytes - 3] ^= 0xFF  # inside the properties of the last record: framing intact
    store.put(obj, bytes(data))
    res = runner.invoke(app, ["verify", "--store", store_dir, "--cold", cold_url], env=env)
    assert res.exit_code == 1
    assert "DIFFERS: TopicA/1" in res.output and "FAILED" in res.output


def test_cli_verify_reports_a_local_difference_and_orphans(tmp_path):
    cold_url = f"file://{tmp_path / 'cold'}"
    with new_writer(tmp_path / "store") as w:
        produce(w, "T", 0, 20)
    env = _cli_env(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["dispatch", "--store", str(tmp_path / "store"), "--cold", cold_url, "--once",
                               "--all"], env=env).exit_code == 0
    store = FileStore(str(tmp_path / "cold"))
    store.put(f"{CLUSTER}/{BROKER}/T/0/commitlog/00000000000000009999-00000000000000010000", b"x")
    # Rewrite one archived record consistently (manifest checksums updated):
    # only the comparison with the local store can tell.
    from dataclasses import replace
    import zlib

    m = read_manifest(store, "T", 0)
    seg = m.segments[0]
    obj = layout.object_of(seg.commitlog_key)
    data = bytearray(store.get(obj))
    data[seg.nbytes - 3] ^= 0x01
    store.put(obj, bytes(data))
    m2 = replace(m, segments=(replace(seg, commitlog_crc=zlib.crc32(data[:seg.nbytes])),) + m.segments[1:])
    store.put(f"{CLUSTER}/{BROKER}/T/0/manifest.json", m2.to_bytes())
    res = runner.invoke(app, ["verify", "--store", str(tmp_path / "store"), "--cold", cold_url], env=env)
    assert res.exit_code == 1, res.output
    assert "archived bytes differ from the local record" in res.output
    assert "orphan (no manifest references it)" in res.output


def test_python_dash_m_tiered_cli_runs(tmp_path):
    with new_writer(tmp_path / "store") as w:
        produce(w, "T", 0, 10)
    env = {**os.environ, **_cli_env(tmp_path)}
    cold_url = f"file://{tmp_path / 'cold'}"
    out = subprocess.run([sys.executable, "-m", "tiered.cli", "dispatch", "--store", str(tmp_path / "store"),
                          "--cold", cold_url, "--once", "--all"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "tiered.cli", "verify", "--store", str(tmp_path / "store"),
                          "--cold", cold_url], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert archived_records(FileStore(str(tmp_path / "cold")), "T", 0) == local_records(
        LocalStore(tmp_path / "store"), "T", 0)


@pytest.mark.parametrize("missing", ["store", "no-consumequeue"])
def test_cli_dispatch_rejects_a_missing_store(tmp_path, missing):
    args = ["dispatch", "--cold", f"file://{tmp_path / 'cold'}", "--once"]
    if missing == "no-consumequeue":
        (tmp_path / "empty").mkdir()
        args += ["--store", str(tmp_path / "empty")]
    res = CliRunner().invoke(app, args, env=_cli_env(tmp_path))
    assert res.exit_code == 2
    assert "invalid configuration: store" in res.output
