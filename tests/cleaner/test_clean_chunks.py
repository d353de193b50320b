"""The cleaner over chunked manifests (tiered/archive/chunks.py), on file://
and moto: expiry moves the head's first reference (no chunk rewritten),
a merge rewrites only the chunks it touched, and the orphan collector
removes chunks no committed head reaches while keeping every one it does.
Object mtimes come from the store's real clock, so the rig's ManualClock
starts at the real time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from clean_support import PREFIX, Rig

from cleaner import CleanOptions
from tiered.archive.chunks import CHUNK_DIR
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import MANIFEST
from tiered.clock import ManualClock
from tiered.config import RetentionSettings

GRACE_MS = 3_600_000
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
