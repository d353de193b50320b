"""When the catalog is written (tiered/archive/catalog.py), on file:// and S3:
at once when it would mislead a reader (a new queue, a changed retention, a
first offset or an oldest time that went down, what the bucket holds being
unknown, a failed write), its ranges at most every catalog_refresh seconds
once a commit changed them; and what every reader of it gets from a
catalog that lags that much. The clock is a ManualClock: nothing sleeps."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dispatchkit import BROKER, CLUSTER, CountingRecorder, new_dispatcher, new_writer, produce
from tiered.archive.catalog import CatalogKeeper
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import CATALOG, Catalog, CatalogEntry, Manifest, Segment
from tiered.archive.storage import ObjectStore
from tiered.cli import app
from tiered.ops.status import queue_status
from tiered.query import scan
from tiered.query.reader import Archive, ColdReader, ReadStatus
from tiered.store.localstore import LocalStore

REFRESH_S = 300.0
KEY = f"{CLUSTER}/{BROKER}/{CATALOG}"


class CatalogWrites:
    """Every catalog PUT that reached the store (its ``_raw_put`` hook), and
    an optional failure of the next ones."""

    def __init__(self, store: ObjectStore) -> None:
        self.count = 0
        self.fail = 0
        raw = store._raw_put

        def put(key: str, data: bytes, *crc: int | None) -> None:
            if key == KEY:
                if self.fail:
                    self.fail -= 1
                    raise PermissionError("refused")  # not retried: the write fails
                self.count += 1
            return raw(key, data, *crc)

        store._raw_put = put  # type: ignore[method-assign]


def rig(tmp_path, open_cold, cold_url, clock, **kw):  # noqa: ANN001, ANN003, ANN202
    w = new_writer(tmp_path / "store")
    store = open_cold(cold_url)
    writes = CatalogWrites(store)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       catalog_refresh_s=REFRESH_S, **kw)
    return w, local, store, writes, d


def round_(d, local: LocalStore, clock, seconds: float = 20):  # noqa: ANN001, ANN201
    clock.advance(seconds)
    local.refresh()
    return d.run_round()


def catalog(store: ObjectStore) -> Catalog:
    return Catalog.from_bytes(store.get(KEY))


def test_a_new_queue_is_listed_in_the_round_that_first_commits_it(cold_url, open_cold, tmp_path, clock) -> None:
    w, local, store, writes, d = rig(tmp_path, open_cold, cold_url, clock)
    produce(w, "A", 0, 3, clock=clock)
    assert round_(d, local, clock).ok and writes.count == 1
    assert [(q.topic, q.queue_id, q.next_offset) for q in catalog(store).queues] == [("A", 0, 3)]
    # more of A, round after round: its ranges wait (no write in 280 s)
    for _ in range(14):
        produce(w, "A", 0, 2, clock=clock)
        assert round_(d, local, clock).ok
    assert writes.count == 1 and catalog(store).queues[0].next_offset == 3
    # a queue that first commits now is listed now, with the others' ranges as they are
    produce(w, "B", 1, 1, clock=clock)
    assert round_(d, local, clock).ok and writes.count == 2
    assert [(q.topic, q.queue_id, q.next_offset) for q in catalog(store).queues] == [("A", 0, 31), ("B", 1, 1)]
    # then 300 s since that write, with commits since: the ranges are refreshed once
    produce(w, "A", 0, 1, clock=clock)
    assert round_(d, local, clock, 299).ok and writes.count == 2
    assert round_(d, local, clock, 1).ok and writes.count == 3
    assert catalog(store).queues[0].next_offset == 32
    # idle rounds, however long: no commit, no write
    for _ in range(5):
        assert round_(d, local, clock, REFRESH_S).ok
    assert writes.count == 3
    w.close()


def test_what_only_goes_down_in_a_stale_catalog_is_written_at_once(cold_url, open_cold, tmp_path, clock) -> None:
    w, local, store, writes, d = rig(tmp_path, open_cold, cold_url, clock)
    produce(w, "A", 0, 3, clock=clock)
    assert round_(d, local, clock).ok and writes.count == 1
    oldest = catalog(store).queues[0].min_store_ms
    # a broker clock stepped back: a record stored earlier than anything archived
    w.put("A", 0, b"late", store_timestamp=oldest - 3_600_000, born_timestamp=oldest - 3_600_000)
    assert round_(d, local, clock).ok and writes.count == 2
    assert catalog(store).queues[0].min_store_ms == oldest - 3_600_000
    # a changed retention (the broker's reserve.time) is recorded at the next commit
    w.set_topic_attribute("A", "reserve.time", "12")
    produce(w, "A", 0, 1, clock=clock)
    assert round_(d, local, clock).ok and writes.count == 3
    assert catalog(store).retention["A"] == (12.0, "reserve.time")
    # and nothing else is: more records, same retention
    produce(w, "A", 0, 1, clock=clock)
    assert round_(d, local, clock).ok and writes.count == 3
    w.close()


def test_a_failed_catalog_write_fails_the_round_and_the_next_round_writes_it(
        cold_url, open_cold, tmp_path, clock) -> None:
    w, local, store, writes, d = rig(tmp_path, open_cold, cold_url, clock, recorder=(rec := CountingRecorder()))
    produce(w, "A", 0, 3, clock=clock)
    writes.fail = 1
    result = round_(d, local, clock)
    assert not result.ok and result.failed and "_catalog.json" in result.errors and rec.rounds == [("dispatch", False)]
    assert store.head(KEY) is None and d.cold.cached("A", 0).next_offset == 3  # the commit stands
    # nothing new to archive: the next round writes the catalog all the same, and succeeds
    result = round_(d, local, clock)
    assert result.ok and result.segments == 0 and writes.count == 1 and rec.rounds == [("dispatch", False), ("dispatch", True)]
    assert [(q.topic, q.next_offset) for q in catalog(store).queues] == [("A", 3)]
    w.close()


def test_a_queue_committed_before_a_crash_is_listed_by_the_restarted_writer(
        cold_url, open_cold, tmp_path, clock) -> None:
    w, local, store, writes, d = rig(tmp_path, open_cold, cold_url, clock)
    produce(w, "A", 0, 3, clock=clock)
    assert round_(d, local, clock).ok
    produce(w, "B", 0, 2, clock=clock)
    writes.fail = 1  # as if the process died between B's first commit and the catalog write
    assert not round_(d, local, clock).ok
    assert [q.topic for q in catalog(store).queues] == ["A"]
    # a restart with the manifest cache: its copy of the catalog does not list B, so the first round does
    d2 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                        max_delay_ms=0, catalog_refresh_s=REFRESH_S)
    d2.start()
    assert round_(d2, local, clock).ok and writes.count == 2
    assert [q.topic for q in catalog(store).queues] == ["A", "B"]
    # and a further restart, with nothing new, writes nothing (its copy says what the bucket has)
    d3 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state", clock, upload_bytes=1,
                        max_delay_ms=0, catalog_refresh_s=REFRESH_S)
    d3.start()
    assert round_(d3, local, clock, REFRESH_S).ok and writes.count == 2
    # a writer whose cache is lost reads the bucket's catalog as it loads: it knows, and writes nothing
    d4 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state-lost", clock, upload_bytes=1,
                        max_delay_ms=0, catalog_refresh_s=REFRESH_S)
    d4.start()
    assert round_(d4, local, clock).ok and writes.count == 2  # it read the catalog to load: it knows
    # without a catalog to load from (a LIST found the queues), it does not: written at the first round
    store.delete_many([KEY])
    d5 = new_dispatcher(store, LocalStore(tmp_path / "store"), tmp_path / "state-lost-too", clock, upload_bytes=1,
                        max_delay_ms=0, catalog_refresh_s=REFRESH_S)
    d5.start()
    assert round_(d5, local, clock).ok and writes.count == 3
    assert [q.topic for q in catalog(store).queues] == ["A", "B"]
    w.close()


def test_readers_get_every_queue_and_row_from_a_catalog_that_lags(cold_url, open_cold, tmp_path, clock,
                                                                  request) -> None:
    """Within catalog_refresh a catalog's ranges are old: `ls`, `status`, the
    scan planner (Spark's and `tiered sql`'s), `cat` and the restore's queue
    list still answer from the manifests, whole."""
    w, local, store, writes, d = rig(tmp_path, open_cold, cold_url, clock)
    produce(w, "A", 0, 3, clock=clock)
    produce(w, "B", 0, 2, clock=clock)
    assert round_(d, local, clock).ok
    stale = catalog(store)
    clock.advance(60)
    produce(w, "A", 0, 4, clock=clock)  # newer than anything the catalog knows of
    assert round_(d, local, clock).ok and writes.count == 1
    assert catalog(store) == stale and [(q.topic, q.next_offset) for q in stale.queues] == [("A", 3), ("B", 2)]
    # the scan plans from the manifests: a time range past what the catalog knows of A finds its new rows
    archive = Archive(store, cluster=CLUSTER, broker=BROKER)
    newest = ColdTier(store, CLUSTER, BROKER).fetch("A", 0).max_store_ms
    spec = scan.ScanSpec(store_us=scan.Bounds((stale.queues[0].max_store_ms + 1) * 1000, newest * 1000))
    planned = scan.plan(archive, spec)
    assert {(s.topic, s.q_start, s.q_end) for s in planned.slices} == {("A", 3, 7)}
    reader = ColdReader(store, cluster=CLUSTER, broker=BROKER)
    ref = reader.queue("A", 0)
    assert ref is not None
    got = reader.read(ref, 3, max_count=10)
    assert got.status == ReadStatus.FOUND and [r.queue_offset for r in got.records] == [3, 4, 5, 6]
    # status lists the manifests; ls names the queues by the catalog and reads their manifests
    rows = {(r.topic, r.queue_id): r for r in queue_status(ColdTier(store, CLUSTER, BROKER), local)}
    assert rows[("A", 0)].archived_next_offset == 7 and rows[("B", 0)].archived_next_offset == 2
    env = {"TIERED_STATE_DIR": str(tmp_path / "cli-state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER}
    if cold_url.startswith("s3:"):
        env["TIERED_S3__ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
    res = CliRunner().invoke(app, ["ls", "--cold", cold_url, "--json"], env=env)
    assert res.exit_code == 0, res.output
    listed = {(r["topic"], r["queue_id"]): r["next_offset"] for r in map(json.loads, res.stdout.splitlines())}
    assert listed == {("A", 0): 7, ("B", 0): 2}
    w.close()


@pytest.mark.parametrize("refresh", [0.0, 1.0])
def test_a_short_refresh_writes_after_every_committing_round(tmp_path, open_cold, clock, refresh: float) -> None:
    w, local, store, writes, d = rig(tmp_path, open_cold, f"file://{tmp_path / 'cold'}", clock)
    d.cold._catalog.refresh_s = refresh
    for i in range(3):
        produce(w, "A", 0, 1, clock=clock)
        assert round_(d, local, clock, 1).ok
        assert writes.count == i + 1 and catalog(store).queues[0].next_offset == i + 1
    w.close()


def test_the_keeper_writes_what_would_mislead_at_once_and_ranges_when_due(tmp_path) -> None:
    """The decision on its own (tiered/archive/catalog.py), case by case."""
    def m(topic: str, first: int, nxt: int, lo: int | None) -> Manifest:
        seg = () if lo is None else (Segment(q_start=first, q_end=nxt, cl_start=0, cl_end=10, min_store_ms=lo,
                                             max_store_ms=lo + 5, min_born_ms=lo, max_born_ms=lo, commitlog_key="c",
                                             consumequeue_key="q", index_key=None, commitlog_crc=0,
                                             consumequeue_crc=0, created_ms=0),)
        return Manifest(topic=topic, queue_id=0, next_offset=nxt, cl_next=10, segments=seg)

    now = 1_700_000_000_000
    written = {("A", 0): m("A", 10, 20, 1000)}
    keeper = CatalogKeeper(REFRESH_S, tmp_path / "copy.json")
    cat = Catalog("C", "b", tuple(CatalogEntry.of(x) for x in written.values()), now, retention={"A": (1.0, "x")})
    keeper.written(cat, cat.to_bytes())
    table = {"A": (1.0, "x")}

    def due(current: dict, retention: dict = table, at: int = now + 1000) -> str | None:
        return keeper.due(current.get, lambda: bool(current), retention, at)

    assert due(written) is None
    keeper.changed(("A", 0))
    assert due({("A", 0): m("A", 10, 30, 1000)}) is None  # ranges grew: they wait
    assert due({("A", 0): m("A", 10, 30, 1000)}, at=now + 300_000) == "its ranges are due for a refresh"
    assert "first offset went down" in due({("A", 0): m("A", 5, 30, 1000)})
    assert "oldest store time went down" in due({("A", 0): m("A", 10, 30, 999)})
    assert due({("A", 0): m("A", 12, 30, None)}) is None  # all expired: nothing older to find
    assert due(written, {"A": (2.0, "x")}) == "the retention table changed"
    keeper.changed(("B", 0))
    assert "B/0 is not listed" in due({**written, ("B", 0): m("B", 0, 1, 5)})
    # a failed write is written again, whatever changed; then only what changed since counts
    taken = keeper.taking()
    keeper.failed(taken)
    assert due(written) == "the last catalog write failed"
    keeper.written(cat, cat.to_bytes())
    assert due(written) is None
    # a restart reads the copy: the same answers; without a copy it does not know
    again = CatalogKeeper(REFRESH_S, tmp_path / "copy.json")
    again.load_copy({("A", 0): written[("A", 0)], ("B", 0): m("B", 0, 1, 5)})
    assert "B/0 is not listed" in again.due({("B", 0): m("B", 0, 1, 5)}.get, lambda: True, None, now)
    none = CatalogKeeper(REFRESH_S, tmp_path / "none.json")
    none.load_copy(written)
    assert none.due(written.get, lambda: True, None, now) == "what the bucket's catalog says is unknown"
    assert none.due({}.get, lambda: False, None, now) is None
