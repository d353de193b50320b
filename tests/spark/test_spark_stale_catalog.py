"""Real Spark (``local[2]``) over a catalog that lags the manifests, as it
may for up to ``dispatch.catalog_refresh`` (tiered/archive/catalog.py): no
queue and no row is missed, with or without a store-time range; and the one
thing that would make a lagging catalog prune wrongly (an oldest store time
that went down) is written at once."""

from __future__ import annotations

import time

import pytest

from dispatchkit import BROKER, CLUSTER, new_dispatcher, new_writer, produce
from tiered.archive.manifest import CATALOG, Catalog
from tiered.clock import ManualClock
from tiered.query.spark_source import load
from tiered.store.localstore import LocalStore

pytestmark = pytest.mark.spark

KEY = f"{CLUSTER}/{BROKER}/{CATALOG}"


def test_spark_misses_nothing_over_a_lagging_catalog(spark, tmp_path, open_cold) -> None:
    clock = ManualClock(time.time_ns() // 1_000_000)
    url = f"file://{tmp_path / 'cold'}"
    store = open_cold(url)
    w = new_writer(tmp_path / "store")
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       catalog_refresh_s=300.0)
    t0 = clock.now_ms()
    for qid in (0, 1):
        produce(w, "A", qid, 3, clock=clock)
    assert d.run_round().ok
    first = store.get(KEY)
    clock.advance(60)
    for qid in (0, 1):
        produce(w, "A", qid, 2, clock=clock, seed=1)
    local.refresh()
    assert d.run_round().ok
    lagging = Catalog.from_bytes(store.get(KEY))
    assert store.get(KEY) == first and all(q.next_offset == 3 and q.max_store_ms == t0 for q in lagging.queues)
    # every row, and the rows newer than anything the catalog knows of
    assert load(spark, url).count() == 10
    newer = load(spark, url, startTime=str(t0 + 30_000)).collect()
    assert sorted((r["queue_id"], r["queue_offset"]) for r in newer) == [(0, 3), (0, 4), (1, 3), (1, 4)]
    # a broker clock stepped back: A/1 stores a record an hour older than anything archived
    late = t0 - 3_600_000
    w.put("A", 1, b"late", store_timestamp=late, born_timestamp=late)
    w.close()
    clock.advance(20)
    local.refresh()
    assert d.run_round().ok
    cat = Catalog.from_bytes(store.get(KEY))
    assert [q.min_store_ms for q in cat.queues] == [t0, late]  # written at once: its oldest time went down
    old = load(spark, url, endTime=str(t0 - 1_800_000)).collect()
    assert [(r["queue_id"], r["queue_offset"], bytes(r["body"])) for r in old] == [(1, 5, b"late")]
    assert load(spark, url).count() == 11
    # what that rule prevents: with the catalog as it was, the scan would rule A/1 out by its oldest time
    store.put(KEY, first)
    assert load(spark, url, endTime=str(t0 - 1_800_000)).count() == 0
