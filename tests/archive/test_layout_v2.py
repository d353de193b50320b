"""Segment layout v2 (tiered/archive/layout.py): one object per segment, optional
zstd, read by everything that read v1, and v1 archives still readable."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from dispatchkit import BROKER, CLUSTER, archived_records, assert_exact, new_dispatcher, new_writer, produce, \
    read_manifest
from tiered.archive import layout, segmeta
from tiered.archive.chunks import CHUNK_DIR, CHUNK_SEGMENTS
from tiered.cli import app
from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import CATALOG, MANIFEST, queue_prefix
from tiered.query.reader import ColdReader, ReadStatus
from tiered.archive.storage import ObjectStore
from tiered.ops.verify import verify

Q = ("Orders", 0)


def _count_puts(store: ObjectStore) -> Counter[str]:
    """Counts every PUT the store sends, by kind of object (the folder under the queue)."""
    puts: Counter[str] = Counter()

    def wrap(raw: Callable) -> Callable:  # noqa: ANN202
        def call(key, *args):  # noqa: ANN001, ANN202
            name = key.rsplit("/", 1)[-1]
            puts[name if name in (MANIFEST, CATALOG) else key.rsplit("/", 2)[-2]] += 1
            return raw(key, *args)
        return call

    store._raw_put = wrap(store._raw_put)  # type: ignore[method-assign]
    store._raw_put_if = wrap(store._raw_put_if)  # type: ignore[method-assign]
    return puts


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_v2_segment_is_one_object_and_one_commit(compression, cold_url, open_cold, tmp_path, clock):
    store = open_cold(cold_url)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 60, clock=clock, body_size=200)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=3000,
                       max_delay_ms=0, parallelism=1, layout=2, compression=compression)
    d.run_round()  # identity, lease, first manifest lookups: not per segment
    first = len(d.cold.cached(*Q).segments)
    puts = _count_puts(store)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 90, clock=clock, body_size=200, seed=1)
    res = d.run_round()
    assert res.ok, res.errors
    assert res.segments >= 5 and first + res.segments > CHUNK_SEGMENTS + 1
    # exactly two requests per segment: the segment object and the commit. The
    # manifest chunk sealed meanwhile rides in a segment object
    # (tiered/archive/chunks.py), and the catalog, which already lists the
    # queue, is not written again before dispatch.catalog_refresh
    assert puts == Counter({"segment": res.segments, MANIFEST: res.segments})
    head = json.loads(store.get(f"{queue_prefix(CLUSTER, BROKER, *Q)}/{MANIFEST}"))
    assert head["format_version"] == "4.0" and all("#" in c["in"] for c in head["chunks"])
    m = read_manifest(store, *Q)
    assert m.format_version == "2.0" and all(s.layout == 2 and s.bloom is None for s in m.segments)
    assert not any(f"/{CHUNK_DIR}/" in k for k in m.chunk_keys) and set(m.chunk_keys) <= {
        s.keys()[0] for s in m.segments}
    prefix = queue_prefix(CLUSTER, BROKER, *Q)
    listed = sorted(o.key for o in store.list_keys(prefix + "/") if not o.key.endswith(MANIFEST))
    assert listed == sorted(k for s in m.segments for k in s.keys())  # chunks: only inside them
    assert all(k.endswith(".zst") == (compression == "zstd") for k in listed if f"/{CHUNK_DIR}/" not in k)
    assert assert_exact(store, local, [Q]) == {Q: 150}
    report = verify(ColdTier(store, CLUSTER, BROKER), local)
    assert report.ok and report.records == 150 and report.compared_locally == 150, report.problems


def test_zstd_objects_are_smaller_and_read_by_cat_find_and_time(tmp_path, clock, open_cold):
    url = f"file://{tmp_path / 'cold'}"
    store = open_cold(url)
    with new_writer(tmp_path / "store") as w:
        # compressible bodies: what a log or JSON payload looks like
        for i in range(80):
            w.put("Orders", 0, (b'{"order": %d, "status": "PAID", "note": "' % i) + b"x" * 400 + b'"}',
                  keys=[f"order-{i}"], unique_key=f"U{i:031d}", store_timestamp=clock.now_ms() + i,
                  born_timestamp=clock.now_ms())
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=8000,
                       max_delay_ms=0, parallelism=1, layout=2, compression="zstd")
    assert d.run_round().ok
    m = read_manifest(store, "Orders", 0)
    stored = sum(o.size for o in store.list_keys(queue_prefix(CLUSTER, BROKER, "Orders", 0) + "/segment/"))
    assert stored * 4 < m.nbytes  # the records alone are m.nbytes
    assert sum(s.stored_bytes for s in m.segments) == stored and m.compression_ratio == m.nbytes / stored
    env = {"TIERED_STATE_DIR": str(tmp_path / "cli-state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
           "TIERED_LOG__LEVEL": "WARNING"}
    res = CliRunner().invoke(app, ["status", "--store", str(tmp_path / "store"), "--cold", url, "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["compression_ratio"] == pytest.approx(m.nbytes / stored)
    res = CliRunner().invoke(app, ["status", "--store", str(tmp_path / "store"), "--cold", url, "--wide"], env=env)
    assert res.exit_code == 0 and "COMPRESSION" in res.stdout and f"zstd {m.nbytes / stored:.2f}x" in res.stdout, \
        res.output
    reader = ColdReader(store, cluster=CLUSTER, broker=BROKER)
    ref = reader.queue("Orders", 0)
    res = reader.read(ref, 37, max_count=2)
    assert res.status is ReadStatus.FOUND and [r.queue_offset for r in res.records] == [37, 38]
    got = list(reader.iter_queue(ref, 37, 5))  # across a segment boundary (39)
    assert [r.queue_offset for r in got] == [37, 38, 39, 40, 41]
    want = {item.queue_offset: bytes(item.record.raw) for item in local.iter_queue("Orders", 0, 0)}
    assert [bytes(r.raw) for r in got] == [want[q] for q in range(37, 42)]
    hits = [(r.queue_offset, r.unique_key) for _, r in reader.find_key("order-51")]
    assert hits == [(51, f"U{51:031d}")]
    assert [r.queue_offset for _, r in reader.find_key(f"U{7:031d}")] == [7]
    assert list(reader.find_key("order-999")) == []
    assert reader.offset_for_time(ref, clock.now_ms() + 66) == 66


def test_a_v1_archive_stays_readable_and_continues_in_v2(cold_url, open_cold, tmp_path, clock):
    store = open_cold(cold_url)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 40, clock=clock, body_size=150)
    local = LocalStore(tmp_path / "store")
    old = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=2500,
                         max_delay_ms=0, parallelism=1, layout=1)  # the old way: three objects a segment
    assert old.run_round().ok
    m1 = read_manifest(store, *Q)
    assert m1.format_version == "1.1" and {s.layout for s in m1.segments} == {1}
    assert all("/commitlog/" in s.commitlog_key and s.bloom for s in m1.segments)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 40, clock=clock, body_size=150, seed=2)
    new = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=2500,
                         max_delay_ms=0, parallelism=1, layout=2, compression="zstd")
    assert new.run_round().ok
    m = read_manifest(store, *Q)
    assert m.segments[:len(m1.segments)] == m1.segments  # v1 segments untouched
    assert {s.layout for s in m.segments[len(m1.segments):]} == {2} and m.format_version == "2.0"
    assert assert_exact(store, local, [Q]) == {Q: 80}
    assert verify(ColdTier(store, CLUSTER, BROKER), local).ok
    reader = ColdReader(store, cluster=CLUSTER, broker=BROKER)
    got = list(reader.iter_queue(reader.queue(*Q), 0))
    assert [bytes(r.raw) for r in got] == [raw for _, raw in archived_records(store, *Q)]
    # a key in a v1 segment (bloom + index object) and one in a v2 segment (index section)
    assert [r.queue_offset for _, r in reader.find_key(f"k-Orders-0-0-{5}")] == [5]
    assert [r.queue_offset for _, r in reader.find_key(f"k-Orders-0-2-{5}")] == [45]


def test_a_lost_v2_manifest_is_rebuilt_from_the_segment_objects(cold_url, open_cold, tmp_path, clock):
    store = open_cold(cold_url)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 50, clock=clock, body_size=150)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=2500,
                       max_delay_ms=0, parallelism=1, layout=2, compression="zstd")
    assert d.run_round().ok
    before = read_manifest(store, *Q)
    key = f"{queue_prefix(CLUSTER, BROKER, *Q)}/{MANIFEST}"
    store.delete_many([key])
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=tmp_path / "state2", writer="w2", clock=clock)
    report = cold.repair()
    assert report.ok and list(report.adopted) == ["Orders/0"]
    after = read_manifest(store, *Q)
    assert after.segments == before.segments and after.next_offset == 50 and after.history == before.history
    assert assert_exact(store, local, [Q]) == {Q: 50}


def test_a_corrupt_v2_object_is_named_by_verify_and_refused_by_rebuild(tmp_path, clock, open_cold):
    url = f"file://{tmp_path / 'cold'}"
    store = open_cold(url)
    with new_writer(tmp_path / "store") as w:
        produce(w, *Q, 20, clock=clock, body_size=150)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, segment_bytes=1 << 20,
                       max_delay_ms=0, parallelism=1, layout=2)
    assert d.run_round().ok
    seg = read_manifest(store, *Q).segments[0]
    obj = layout.object_of(seg.commitlog_key)
    data = bytearray(store.get(obj))
    data[seg.nbytes + 5] ^= 0xFF  # inside the ConsumeQueue section
    store.put(obj, bytes(data))
    report = verify(ColdTier(store, CLUSTER, BROKER), local)
    assert report.problems == [f"Orders/0 [0,20): {seg.consumequeue_key} size/checksum differs from the manifest"]
    cold = ColdTier(store, CLUSTER, BROKER)
    plan = cold.plan_recovery(*Q)
    assert plan.problems == (f"{obj}: entries do not match the descriptor's CRC",)
    data[-1] ^= 0xFF  # the footer magic: no descriptor at all
    store.put(obj, bytes(data))
    assert segmeta.parse(bytes(data), obj) is None
    with pytest.raises(CorruptRecordError, match="malformed segment section"):
        layout.split(obj + "#12")
    assert replace(seg, consumequeue_key=obj).layout == 1  # a key without a section is v1
