"""The cleaner over chunked manifests (tiered/archive/chunks.py), on file://
and moto: expiry moves the head's first reference (no chunk rewritten),
a merge rewrites only the chunks it touched, and the orphan collector
removes chunks no committed head reaches while keeping every one it does.
Object mtimes come from the store's real clock, so the rig's ManualClock
starts at the real time."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from clean_support import PREFIX, Rig

from tiered.cleaner import CleanOptions
from tiered.cleaner.plan import PlanOptions, Verdict, plan_queue, still_referenced
from tiered.cleaner.retention import Retention
from tiered.archive.chunks import CHUNK_DIR, span
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import MANIFEST, Manifest, Segment
from tiered.clock import ManualClock
from tiered.config import RetentionSettings

GRACE_MS = 3_600_000
H = 3_600_000
CLUSTER, BROKER = PREFIX.split("/")


def chunk_keys(rig: Rig, topic: str) -> set[str]:
    return {o.key for o in rig.objects.list_keys(f"{PREFIX}/{topic}/0/{CHUNK_DIR}/")}


def chunk_puts(rig: Rig, since: int) -> list[str]:
    return [e.key for e in rig.events.events[since:] if e.op == "put" and f"/{CHUNK_DIR}/" in e.key]


def head(rig: Rig, topic: str) -> dict:
    return json.loads(rig.objects.get(f"{PREFIX}/{topic}/0/{MANIFEST}"))


def one_segment_a_minute(rig: Rig, topic: str, n: int) -> None:
    for _ in range(n):
        rig.produce(topic, 0, 1)
        rig.dispatch()
        rig.advance(60)


@pytest.fixture
def rig(tmp_path: Path, cold_url: str, open_cold) -> Rig:  # noqa: ANN001
    r = Rig(tmp_path, store=open_cold(cold_url), clock=ManualClock(time.time_ns() // 1_000_000),
            retention=RetentionSettings(default_hours=1),
            options=CleanOptions(merge=False, orphan_grace_ms=GRACE_MS, orphan_scan_interval_ms=6 * GRACE_MS))
    yield r
    r.close()


def test_expiry_of_a_chunked_queue_writes_no_chunk_and_orphans_only_unreached_chunks(rig: Rig) -> None:
    one_segment_a_minute(rig, "T", 40)  # segments 0..39; chunks [0,16) and [16,32), a tail of 8
    before = chunk_keys(rig, "T")
    assert len(before) == 2
    rig.advance(39 * 60 + 30)  # now - 1 h falls between segment 19 and segment 20
    mark = len(rig.events.events)
    rep = rig.clean(orphans=False)
    assert rep.ok and rig.recorder.deleted == {"T": 20}
    assert chunk_puts(rig, mark) == []  # expiry moved the head's first reference; no chunk rewritten
    h = head(rig, "T")
    assert [(c["level"], c["total"], c["skip"]) for c in h["chunks"]] == [(0, 16, 4)]
    m = rig.manifest("T")
    assert m.first_offset == 20 and len(m.segments) == 20
    assert ColdTier(rig.objects, CLUSTER, BROKER).fetch("T", 0) == m
    assert rig.archive("T") == {o: raw for o, raw in rig.expected("T").items() if o >= 20}
    # the chunk of segments 0..15 is reached by no head now: an orphan; the other stays
    [dropped] = before - set(m.chunk_keys)
    rep = rig.clean(orphans=True)
    assert rep.ok and dropped in rep.orphans
    assert chunk_keys(rig, "T") == set(m.chunk_keys) == before - {dropped}
    assert rig.archive("T") == {o: raw for o, raw in rig.expected("T").items() if o >= 20}


def test_a_merge_in_a_chunked_queue_rewrites_only_the_chunk_it_touched(tmp_path: Path, cold_url: str,
                                                                        open_cold) -> None:  # noqa: ANN001
    options = CleanOptions(merge=True, merge_min_bytes=1000, merge_target_bytes=4000, merge_fanin=4,
                           merge_max_span_fraction=1.0, orphan_grace_ms=GRACE_MS)
    rig = Rig(tmp_path, store=open_cold(cold_url), clock=ManualClock(time.time_ns() // 1_000_000),
              retention=RetentionSettings(default_hours=24), options=options)
    try:
        for i in range(100):  # segments of 6 records (not small), but 40..47 of one record (small)
            rig.produce("T", 0, 1 if 40 <= i < 48 else 6)
            rig.dispatch()
            rig.advance(60)
        before = rig.manifest("T")
        old_refs = head(rig, "T")["chunks"]
        assert [c["total"] for c in old_refs] == [16] * 6
        mark = len(rig.events.events)
        rep = rig.clean(orphans=False)
        assert rep.ok and rep.merged_segments == 8
        m = rig.manifest("T")
        assert len(m.segments) == 93 and (m.segments[40].q_start, m.segments[40].q_end) == (240, 248)
        # one chunk written: the one that held segments 32..47, now 9 segments; the others are reused
        [written] = chunk_puts(rig, mark)
        refs = head(rig, "T")["chunks"]
        assert [c["total"] for c in refs] == [16, 16, 9, 16, 16, 16]
        assert [c["name"] for c in refs[:2] + refs[3:]] == [c["name"] for c in old_refs[:2] + old_refs[3:]]
        assert written.endswith(refs[2]["name"])
        fresh = ColdTier(rig.objects, CLUSTER, BROKER).fetch("T", 0)
        assert fresh == m and fresh.segments == m.segments and len(before.segments) == 100
        assert rig.archive("T") == rig.expected("T")
        rig.advance(2 * GRACE_MS / 1000)
        rep = rig.clean(orphans=True)
        assert rep.ok and [k for k in rep.orphans if f"/{CHUNK_DIR}/" in k] == [
            f"{PREFIX}/T/0/{CHUNK_DIR}/{old_refs[2]['name']}"]
        assert chunk_keys(rig, "T") == set(m.chunk_keys)
        assert rig.archive("T") == rig.expected("T")
    finally:
        rig.close()


# --- layout v2: chunks carried in segment objects (format 4.0) ----------------------------------


def carrier_refs(rig: Rig, topic: str) -> list[tuple[str, int, int]]:
    """(carrier object, first, end offset described) of every carried chunk the head reaches."""
    m = rig.manifest(topic)
    return sorted((obj, *span(name)) for name, obj in zip(m.chunk_names, m.chunk_keys) if "/segment/" in obj)


def check_plan(rig: Rig) -> None:
    """Nothing a committed manifest still references after the plan is deleted by it."""
    plan = rig.cleaner.plan()
    for qp in plan.queues:
        m = rig.cold.cached(qp.topic, qp.queue_id)
        doomed = set(qp.expired_keys()) | set(qp.pending_keys())
        assert not doomed & still_referenced(m, qp), (qp.topic, sorted(doomed & still_referenced(m, qp)))


@pytest.fixture
def rig2(tmp_path: Path, cold_url: str, open_cold) -> Rig:  # noqa: ANN001
    r = Rig(tmp_path, store=open_cold(cold_url), clock=ManualClock(time.time_ns() // 1_000_000),
            retention=RetentionSettings(default_hours=1), layout=2,
            options=CleanOptions(merge=False, orphan_grace_ms=GRACE_MS, orphan_scan_interval_ms=6 * GRACE_MS))
    yield r
    r.close()


def test_expiry_deletes_a_carrier_only_with_what_its_chunks_describe(rig2: Rig) -> None:
    rig = rig2
    one_segment_a_minute(rig, "T", 50)  # chunks [0,16) in segment 16, [16,32) in 32, [32,48) in 48
    assert [(first, end) for _, first, end in carrier_refs(rig, "T")] == [(0, 16), (16, 32), (32, 48)]
    assert head(rig, "T")["format_version"] == "4.0" and chunk_keys(rig, "T") == set()
    rig.advance(10 * 60)  # nothing expired yet: the oldest segment is 59 minutes old
    for minute in range(45):  # a pass a minute: every prefix, every carrier's turn
        check_plan(rig)
        rep = rig.clean(orphans=False)
        assert rep.ok, rep.errors
        m = rig.manifest("T")
        assert rig.archive("T") == {o: raw for o, raw in rig.expected("T").items() if o >= m.first_offset}
        # a carrier is gone only once every segment its chunks describe is gone
        kept = {s.keys()[0] for s in m.segments}
        assert {obj for obj, _, end in carrier_refs(rig, "T") if end > m.first_offset} <= kept
        rig.advance(60)
    assert rig.manifest("T").first_offset == 44 and rig.recorder.deleted == {"T": 44}
    assert [(first, end) for _, first, end in carrier_refs(rig, "T")] == [(32, 48)]
    assert head(rig, "T")["chunks"][0]["skip"] == 12
    rig.advance(2 * GRACE_MS / 1000)
    rep = rig.clean(orphans=True)
    assert rep.ok and rep.orphans == [] and not rep.unaccounted


def test_the_plan_keeps_a_carrier_whose_chunk_describes_kept_segments() -> None:
    """Not something tiered writes (a carrier is newer than what it
    describes), but the plan never relies on it: a segment carrying a chunk
    of segments that stay is kept with them, and says why."""
    now = 1_800_000_000_000
    segs = tuple(Segment(q_start=i, q_end=i + 1, cl_start=i * 10, cl_end=i * 10 + 10, min_store_ms=now - 100 * H,
                         max_store_ms=now - (100 if i < 6 else 0) * H, min_born_ms=now, max_born_ms=now,
                         commitlog_key=f"{PREFIX}/T/0/segment/{i}#0+10", consumequeue_key=f"{PREFIX}/T/0/segment/{i}#10+20",
                         index_key=None, commitlog_crc=0, consumequeue_crc=0, created_ms=now) for i in range(10))
    m = Manifest(topic="T", queue_id=0, next_offset=10, cl_next=100, segments=segs,
                 chunk_names=(f"chunk-L0-{3:020d}-{9:020d}-0123456789abcdef.json",),
                 chunk_keys=(f"{PREFIX}/T/0/segment/2",))
    opts = PlanOptions(merge=False)
    qp = plan_queue(m, Retention(ms=72 * H, source="config"), now, opts)
    assert [s.q_start for s in qp.expire] == [0, 1] and qp.stopped_by is Verdict.CARRIER
    assert not set(qp.expired_keys()) & still_referenced(m, qp)
    # without the chunk the prefix is the six expired segments
    plain = plan_queue(replace(m, chunk_names=(), chunk_keys=()), Retention(ms=72 * H, source="config"), now, opts)
    assert [s.q_start for s in plain.expire] == list(range(6)) and plain.stopped_by is Verdict.YOUNG


def test_a_merge_over_a_carrier_writes_its_chunk_on_its_own_first(tmp_path: Path, cold_url: str,
                                                                  open_cold) -> None:  # noqa: ANN001
    options = CleanOptions(merge=True, merge_min_bytes=1000, merge_target_bytes=4000, merge_fanin=4,
                           merge_max_span_fraction=1.0, orphan_grace_ms=GRACE_MS)
    rig = Rig(tmp_path, store=open_cold(cold_url), clock=ManualClock(time.time_ns() // 1_000_000),
              retention=RetentionSettings(default_hours=24), options=options, layout=2)
    try:
        for i in range(100):  # segments of 6 records, but 48..55 of one record (small)
            rig.produce("T", 0, 1 if 48 <= i < 56 else 6)
            rig.dispatch()
            rig.advance(60)
        before = rig.manifest("T")
        carriers_before = carrier_refs(rig, "T")
        c48 = before.segments[48].keys()[0]
        [(_, first, end)] = [c for c in carriers_before if c[0] == c48]  # segment 48 carries chunk [32,48)
        assert (first, end) == (before.segments[32].q_start, before.segments[48].q_start)
        check_plan(rig)
        mark = len(rig.events.events)
        rep = rig.clean(orphans=False)
        assert rep.ok and rep.merged_segments == 8
        m = rig.manifest("T")
        assert len(m.segments) == 93
        # the chunk segment 48 carried is an object of its own now, under the same name (the same
        # content); the chunk holding the merged run is written anew; the head names neither old place
        old_name = next(n for n, o in zip(before.chunk_names, before.chunk_keys) if o == c48)
        assert sorted(k.rsplit("/", 1)[1] for k in chunk_puts(rig, mark)) == sorted(
            n for n, o in zip(m.chunk_names, m.chunk_keys) if f"/{CHUNK_DIR}/" in o)
        assert f"{PREFIX}/T/0/{CHUNK_DIR}/{old_name}" in m.chunk_keys and len(chunk_puts(rig, mark)) == 2
        merged_away = {s.keys()[0] for s in before.segments[48:56]}
        assert not merged_away & set(m.chunk_keys) and not merged_away & m.referenced_keys() - {
            k for p in m.pending_deletes for k in p.keys}
        assert head(rig, "T")["format_version"] == "4.0"  # the other chunks stay carried
        fresh = ColdTier(rig.objects, CLUSTER, BROKER).fetch("T", 0)
        assert fresh == m and rig.archive("T") == rig.expected("T")
        # after the grace period the merged run's objects go, segment 48's with them: all still reads
        rig.advance(2 * GRACE_MS / 1000)
        check_plan(rig)
        rep = rig.clean(orphans=True)
        assert rep.ok and not rep.unaccounted, rep.errors
        assert all(rig.objects.head(k) is None for k in merged_away)
        assert ColdTier(rig.objects, CLUSTER, BROKER).fetch("T", 0).segments == m.segments
        assert rig.archive("T") == rig.expected("T")
    finally:
        rig.close()


def test_an_uncommitted_carrier_is_an_orphan(rig2: Rig) -> None:
    rig = rig2
    one_segment_a_minute(rig, "T", 16)
    rig.produce("T", 0, 1)
    uploaded = rig.crash_before_commit(rig.dispatch)  # the 17th segment would carry the first chunk
    [carrier] = uploaded
    assert "/segment/" in carrier and rig.objects.head(carrier) is not None
    assert "chunks" not in head(rig, "T")
    rig.retention = RetentionSettings(default_hours=24)  # the grace period below expires nothing
    rig.restart()
    rig.advance(2 * GRACE_MS / 1000)
    rep = rig.clean(orphans=True)
    assert rep.ok and rep.orphans == [carrier] and rig.objects.head(carrier) is None
    res = rig.dispatch()  # the retry uploads it again, chunk and all, and commits
    assert res.ok and res.segments == 1, res
    assert [(first, end) for _, first, end in carrier_refs(rig, "T")] == [(0, 16)]
    assert rig.archive("T") == rig.expected("T")
