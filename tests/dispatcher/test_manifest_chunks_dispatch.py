"""Manifest chunks under the real dispatcher, on file:// and on S3 (moto,
SeaweedFS with TIERED_TEST_S3_SERVER=seaweedfs): the bytes of a commit stay
flat over hundreds of segments, a segment costs exactly two write requests
in layout v2 (its chunks ride in segment objects), a crash between a chunk
write and the head commit loses nothing, fencing still stops a stale
writer, and a lost head or a lost chunk is recovered from the bucket.
tests/dispatcher/test_carried_chunks.py has the bad days of carried chunks."""

from __future__ import annotations

import json

import pytest

from chunkkit import orphan_pass, Recording
from dispatchkit import (BROKER, CLUSTER, CountingRecorder, archive_all, assert_exact, local_records,
                         new_dispatcher, new_writer, produce)
from tiered.archive.chunks import CHUNK_DIR, CHUNK_FANOUT, CHUNK_SEGMENTS, ManifestChunkError
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import LEASE, MANIFEST, queue_prefix
from tiered.archive.storage import ObjectStore
from tiered.ops.verify import verify
from tiered.query.reader import ColdReader, ReadStatus
from tiered.store.localstore import LocalStore

TOPIC = "Chunky"
WRITE_OPS = ("put", "put_if_absent", "put_if_match")



def chunk_objects(store: ObjectStore, qid: int = 0) -> set[str]:
    return {o.key for o in store.list_keys(f"{queue_prefix(CLUSTER, BROKER, TOPIC, qid)}/{CHUNK_DIR}/")}


def setup(tmp_path, open_cold, cold_url, clock, n: int, queues: int = 1, **kw):  # noqa: ANN001, ANN003, ANN202
    w = new_writer(tmp_path / "store")
    for qid in range(queues):
        produce(w, TOPIC, qid, n, clock=clock, body_size=60)
    rec = CountingRecorder()
    store = open_cold(cold_url, recorder=rec)
    recording = Recording(store)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=rec, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=1, **kw)
    return w, local, store, recording, d, rec


@pytest.mark.parametrize("layout", [1, 2])
def test_commit_bytes_stay_flat_over_330_segments(cold_url, open_cold, tmp_path, clock, layout: int) -> None:
    w, local, store, rec, d, _ = setup(tmp_path, open_cold, cold_url, clock, 330, layout=layout)
    archive_all(d, local, [(TOPIC, 0)])
    w.close()
    m = d.cold.cached(TOPIC, 0)
    assert len(m.segments) == 330 and len(rec.commits) == 330  # one message, one segment, one commit each
    # a chunk sealed every 16 segments (the newest segment always inline), 8 folded into one a level up;
    # layout v2 carries them in segment objects, layout v1 writes objects of their own
    levels = rec.levels()
    assert levels.count(0) == (330 - 1) // CHUNK_SEGMENTS == 20
    assert levels.count(1) == 20 // CHUNK_FANOUT == 2
    assert (len(rec.chunk_puts), len(rec.carried)) == ((22, 0) if layout == 1 else (0, 20))
    early, late = rec.commits[16:116], rec.commits[-100:]
    # flat: the last hundred commits cost what commits 17..116 cost (the
    # chunks a commit seals counted in it, whether standalone or carried)
    assert max(late) <= 1.1 * max(early), (max(early), max(late))
    assert sum(late) / 100 <= 1.1 * sum(early) / 100, (sum(early), sum(late))
    # the head holds at most 16 segments inline, whatever the history
    doc = json.loads(store.get(f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/{MANIFEST}"))
    assert len(doc["segments"]) == 330 % CHUNK_SEGMENTS
    assert doc["format_version"] == ("3.0" if layout == 1 else "4.0")
    # what one whole-manifest commit would write now
    assert len(m.to_bytes()) > 15 * max(late)
    # exact through a fresh reader (head + chunks), and the reader's manifest is the writer's
    fresh = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert fresh.to_bytes() == m.to_bytes()
    assert set(fresh.chunk_keys) == set(m.chunk_keys)
    if layout == 1:
        assert chunk_objects(store) == set(fresh.chunk_keys)
    else:  # no chunk object at all: every chunk is a section of a segment object the head references
        assert chunk_objects(store) == set() and set(fresh.chunk_keys) <= {s.keys()[0] for s in fresh.segments}
    assert_exact(store, local, [(TOPIC, 0)])
    # the query reader and verify find every segment through the chunks
    reader = ColdReader(store, cluster=CLUSTER, broker=BROKER)
    ref = reader.queue(TOPIC, 0)
    expected = dict(local_records(local, TOPIC, 0))
    for offset in (0, 15, 16, 200, 329):
        got = reader.read(ref, offset, max_count=1)
        assert got.status == ReadStatus.FOUND and bytes(got.records[0].raw) == expected[offset]
    report = verify(ColdTier(store, CLUSTER, BROKER), local)
    assert report.ok and report.segments == 330 and report.records == 330 and not report.orphans, report.problems


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_two_write_requests_per_segment_over_330_segments(cold_url, open_cold, tmp_path, clock,
                                                          compression: str) -> None:
    """Steady state in layout v2: the segment object (with any chunk its
    commit seals) and the head commit, nothing else: no chunk object, no
    catalog (it lists the queues already; its ranges wait for
    dispatch.catalog_refresh)."""
    w, local, store, rec, d, counting = setup(tmp_path, open_cold, cold_url, clock, 1, queues=2, layout=2,
                                              compression=compression)
    archive_all(d, local, [(TOPIC, 0), (TOPIC, 1)])  # creates the queues, their heads and the catalog
    assert rec.catalog_writes() == 1
    marks = (len(rec.writes), len(rec.commits))
    counted = sum(counting.total_requests(op) for op in WRITE_OPS)  # as bench/dispatch.py counts
    for _ in range(11):  # a round every 20 s, 15 segments a queue each
        for qid in (0, 1):
            produce(w, TOPIC, qid, 15, clock=clock, body_size=60, seed=qid)
        clock.advance(20)
        archive_all(d, local, [(TOPIC, 0), (TOPIC, 1)])
    w.close()
    segments = sum(len(d.cold.cached(TOPIC, q).segments) for q in (0, 1)) - 2
    assert segments == 330
    # every write request that reached the store, but the lease's renewals
    # (one each lease_ttl / 2 whatever is written: a cost per minute, not per segment)
    writes = [k for k in rec.writes[marks[0]:] if not k.endswith("/" + LEASE)]
    assert len(writes) / segments == 2.0, [k for k in writes if "/segment/" not in k and MANIFEST not in k]
    counted = sum(counting.total_requests(op) for op in WRITE_OPS) - counted
    assert counted == len(rec.writes) - marks[0]  # the recorder counts the requests the store saw
    assert len(rec.commits) - marks[1] == 330 and not rec.chunk_puts and rec.catalog_writes() == 1
    # both queues sealed chunks, all carried (one level-0 chunk each 16 segments)
    assert len(rec.carried) == 2 * ((166 - 1) // CHUNK_SEGMENTS)
    assert_exact(store, local, [(TOPIC, 0), (TOPIC, 1)])
    report = verify(ColdTier(store, CLUSTER, BROKER), local)
    assert report.ok and report.segments == 332 and not report.orphans, report.problems



def test_a_crash_between_chunk_write_and_head_commit_loses_nothing(cold_url, open_cold, tmp_path, clock) -> None:
    # layout v1: a chunk is an object of its own, written before the head's commit
    w, local, store, rec, d, _ = setup(tmp_path, open_cold, cold_url, clock, CHUNK_SEGMENTS, layout=1)
    head_key = f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/{MANIFEST}"
    archive_all(d, local, [(TOPIC, 0)])
    assert not rec.chunk_puts and d.cold.cached(TOPIC, 0).next_offset == CHUNK_SEGMENTS
    produce(w, TOPIC, 0, 5, clock=clock, body_size=60, seed=1)
    rec.crash_after_chunk = True  # the 17th commit seals the first 16 segments
    local.refresh()
    result = d.run_round()
    assert not result.ok and "access denied" in result.errors[f"{TOPIC}/0"]
    [orphan] = rec.chunk_puts
    assert store.head(orphan) is not None
    # the bucket is consistent: the previous head, which references no chunk
    before = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert before.next_offset == CHUNK_SEGMENTS and before.chunk_keys == ()
    assert "chunks" not in json.loads(store.get(head_key))
    # the cleaner collects the unreferenced chunk (and the uncommitted segment)
    collected = orphan_pass(store)
    assert orphan in collected and store.head(orphan) is None
    # a restarted writer goes on from the bucket: nothing lost, nothing twice
    d2 = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, segment_bytes=1,
                        layout=1)
    archive_all(d2, local, [(TOPIC, 0)])
    w.close()
    assert_exact(store, local, [(TOPIC, 0)])
    m = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert len(m.chunk_keys) == 1 and chunk_objects(store) == set(m.chunk_keys)
    assert orphan_pass(store) == []


@pytest.mark.parametrize("layout", [1, 2])
def test_fencing_stops_a_stale_writer_of_a_chunked_queue(cold_url, open_cold, tmp_path, clock, layout: int) -> None:
    w, local, store, _, a, rec_a = setup(tmp_path, open_cold, cold_url, clock, 40, layout=layout)
    archive_all(a, local, [(TOPIC, 0)])
    assert a.cold.cached(TOPIC, 0).chunk_keys
    store_b = open_cold(cold_url)
    b = new_dispatcher(store_b, local, tmp_path / "state-b", clock, identity="writer-2", force=True,
                       upload_bytes=1, max_delay_ms=0, segment_bytes=1, layout=layout)
    produce(w, TOPIC, 0, CHUNK_SEGMENTS, clock=clock, body_size=60)
    archive_all(b, local, [(TOPIC, 0)])  # b takes over and seals another chunk
    produce(w, TOPIC, 0, CHUNK_SEGMENTS, clock=clock, body_size=60)
    writes = ("put", "put_if_absent", "put_if_match", "delete")
    before = sum(rec_a.total_requests(op) for op in writes)
    local.refresh()
    result = a.run_round()
    assert result.fenced is not None
    assert sum(rec_a.total_requests(op) for op in writes) == before, "the fenced writer wrote"
    head = json.loads(store.get(f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/{MANIFEST}"))
    assert head["writer"] == "writer-2" and head["next_offset"] == 40 + CHUNK_SEGMENTS
    archive_all(b, local, [(TOPIC, 0)])
    w.close()
    assert_exact(store, local, [(TOPIC, 0)])
    assert ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0).next_offset == 40 + 2 * CHUNK_SEGMENTS


@pytest.mark.parametrize("layout", [1, 2])
def test_a_lost_head_is_rebuilt_from_the_segments_and_its_old_chunks_collected(
        cold_url, open_cold, tmp_path, clock, layout: int) -> None:
    w, local, store, _, d, _ = setup(tmp_path, open_cold, cold_url, clock, 40, layout=layout)
    archive_all(d, local, [(TOPIC, 0)])
    old = d.cold.cached(TOPIC, 0)
    store.delete_many([f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/{MANIFEST}"])
    produce(w, TOPIC, 0, 5, clock=clock, body_size=60)
    d2 = new_dispatcher(store, local, tmp_path / "state-new", clock, upload_bytes=1, max_delay_ms=0, segment_bytes=1,
                        layout=layout)
    archive_all(d2, local, [(TOPIC, 0)])
    w.close()
    m = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert m.next_offset == 45 and m.segments[:40] == old.segments and m.chunk_keys
    assert_exact(store, local, [(TOPIC, 0)])
    orphan_pass(store)  # chunks the new head does not reach go; those it references stay
    # (the rebuild's commit writes its chunks as objects of their own; old
    # carried ones are sections of segment objects the new head still references)
    assert chunk_objects(store) == {k for k in m.chunk_keys if f"/{CHUNK_DIR}/" in k}
    assert {o.key for o in store.list_keys(f"{queue_prefix(CLUSTER, BROKER, TOPIC, 0)}/segment/")} == (
        {s.keys()[0] for s in m.segments} if layout == 2 else set())
    assert ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0) == m


def test_a_lost_chunk_stops_its_queue_only_and_repair_rebuilds_it(cold_url, open_cold, tmp_path, clock) -> None:
    # layout v1: a chunk is an object of its own (v2 carries it in a segment object)
    w, local, store, _, d, _ = setup(tmp_path, open_cold, cold_url, clock, 40, queues=2, layout=1)
    archive_all(d, local, [(TOPIC, 0), (TOPIC, 1)])
    old = d.cold.cached(TOPIC, 0)
    lost = sorted(chunk_objects(store, 0))[0]
    store.delete_many([lost])
    produce(w, TOPIC, 0, 3, clock=clock, body_size=60)
    produce(w, TOPIC, 1, 3, clock=clock, body_size=60)
    rec = CountingRecorder()
    d2 = new_dispatcher(store, local, tmp_path / "state-new", clock, recorder=rec, upload_bytes=1, max_delay_ms=0,
                        segment_bytes=1, layout=1)
    local.refresh()
    result = d2.run_round()
    assert set(result.errors) == {f"{TOPIC}/0"} and lost in result.errors[f"{TOPIC}/0"]
    # counted and logged as bad input naming the object (the manifest-error path of the dispatcher)
    assert rec.corrupt[(TOPIC, 0)] == 1 and d2.cold.cached(TOPIC, 1).next_offset == 43
    assert rec.stuck == {(TOPIC, 0): "manifest"}  # `tiered repair`'s case, as the alert tells
    with pytest.raises(ManifestChunkError) as err:
        ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert err.value.source == lost
    # repair: the segments describe themselves
    report = ColdTier(store, CLUSTER, BROKER, writer="repair").repair()
    assert report.ok and set(report.adopted) == {f"{TOPIC}/0"} and report.intact == 1
    m = ColdTier(store, CLUSTER, BROKER).fetch(TOPIC, 0)
    assert m.segments == old.segments and m.generation == old.generation + 1
    assert store.head(lost) is not None  # the same content: the same chunk name, written again
    archive_all(d2, local, [(TOPIC, 0), (TOPIC, 1)])
    w.close()
    assert_exact(store, local, [(TOPIC, 0), (TOPIC, 1)])
