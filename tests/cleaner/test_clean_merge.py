"""Merging small adjacent segments: identical read-back, old readers keep
working until the deferred deletion, never across a gap, never from bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from clean_support import Rig, read_archive
from dispatchkit import cq_entries

from tiered.cleaner import CleanOptions
from tiered.cleaner.execute import _change
from tiered.cleaner.merge import MergedSegment
from tiered.cleaner.plan import MergeRun, QueuePlan
from tiered.config import RetentionSettings
from tiered.errors import ObjectNotFoundError
from tiered.format.keyindex import bloom_may_contain, lookup
from tiered.archive.manifest import Gap, Manifest

GRACE_MS = 600_000


def merge_options(**kw) -> CleanOptions:  # noqa: ANN003
    base = dict(merge=True, merge_min_bytes=1 << 20, merge_target_bytes=4 << 20, merge_fanin=4,
                orphan_grace_ms=GRACE_MS)
    base.update(kw)
    return CleanOptions(**base)


@pytest.fixture
def rig(tmp_path: Path, cold_url: str, open_cold) -> Rig:  # noqa: ANN001
    r = Rig(tmp_path, store=open_cold(cold_url), options=merge_options(),
            retention=RetentionSettings(default_hours=24))
    yield r
    r.close()


def small_segments(rig: Rig, n: int, per: int = 3, topic: str = "T") -> None:
    for _ in range(n):
        rig.produce(topic, 0, per)
        rig.dispatch()
        rig.advance(20)


def test_merged_segment_reads_back_identically(rig: Rig) -> None:
    small_segments(rig, 3)
    assert rig.clean(orphans=False).merged_segments == 0  # 3 small segments: below the fan-in of 4, wait
    small_segments(rig, 3)
    before = rig.manifest("T")
    assert len(before.segments) == 6
    rep = rig.clean(orphans=False)
    assert rep.ok and rep.merged_segments == 6
    m = rig.manifest("T")
    assert [(s.q_start, s.q_end) for s in m.segments] == [(0, 18)]
    merged = m.segments[0]
    assert (merged.cl_start, merged.cl_end) == (before.segments[0].cl_start, before.segments[-1].cl_end)
    assert merged.min_store_ms == before.segments[0].min_store_ms
    assert merged.max_store_ms == before.segments[-1].max_store_ms
    assert rig.archive("T") == rig.expected("T")
    # the cold ConsumeQueue entries are the old ones, concatenated (same cold offsets)
    old_cq = b"".join(cq_entries(rig.objects, s) for s in before.segments)
    assert cq_entries(rig.objects, merged) == old_cq
    # key index and bloom rebuilt from the records
    index = rig.objects.get(merged.index_key)
    for off in range(18):
        key = f"k-T-0-{off}"
        assert off in lookup(index, key)
        assert bloom_may_contain(merged.bloom, key)
    assert rig.recorder.merges == {"T": 1} and rig.recorder.merged_segments == {"T": 6}
    assert len(rig.events.data("delete")) == 0  # the old objects wait for the grace period


def test_reader_holding_the_previous_manifest_still_reads_after_a_merge(rig: Rig) -> None:
    small_segments(rig, 4)
    old = rig.manifest("T")
    rig.clean(orphans=False)
    assert len(rig.manifest("T").segments) == 1
    assert read_archive(rig.objects, old) == rig.expected("T")
    rig.advance(GRACE_MS / 1000 - 60)
    rig.clean(orphans=False)
    assert read_archive(rig.objects, old) == rig.expected("T")  # still within the grace period
    rig.advance(120)
    rep = rig.clean(orphans=False)
    assert rep.deleted_objects == 12 and rig.manifest("T").pending_deletes == ()
    with pytest.raises(ObjectNotFoundError):
        read_archive(rig.objects, old)
    assert read_archive(rig.objects, rig.manifest("T")) == rig.expected("T")


def test_merges_never_cross_a_gap(tmp_path: Path) -> None:
    rig = Rig(tmp_path, options=merge_options(merge_fanin=2), retention=RetentionSettings(default_hours=24))
    small_segments(rig, 2, per=1)
    rig.produce("T", 0, 2)  # offsets 2, 3: the broker lost them before they were archived
    rig.cold.commit("T", 0, lambda m: m.with_gap(Gap(2, 4, "expired_locally", rig.clock.now_ms())))
    small_segments(rig, 2, per=1)
    m = rig.manifest("T")
    assert [(s.q_start, s.q_end) for s in m.segments] == [(0, 1), (1, 2), (4, 5), (5, 6)]
    rep = rig.clean(orphans=False)
    assert rep.ok and rep.merged_segments == 4
    m = rig.manifest("T")
    assert [(s.q_start, s.q_end) for s in m.segments] == [(0, 2), (4, 6)]
    assert [(g.q_start, g.q_end) for g in m.gaps] == [(2, 4)]
    assert rig.archive("T") == {o: r for o, r in rig.expected("T").items() if o not in (2, 3)}
    rig.close()


def test_corrupt_input_is_never_merged(rig: Rig) -> None:
    small_segments(rig, 4)
    before = rig.manifest("T")
    victim = before.segments[1].commitlog_key
    data = bytearray(rig.objects.get(victim))
    data[-3] ^= 0xFF
    rig.objects.put(victim, bytes(data))
    rep = rig.clean(orphans=False)
    assert not rep.ok and any("merge" in k for k in rep.errors)
    assert any(victim in v for v in rep.errors.values()), rep.errors  # names the object
    assert rep.merged_segments == 0
    assert rig.manifest("T").segments == before.segments
    assert rig.recorder.queue_errors[("clean", "T", 0)] == 1


def test_merged_segment_expires_as_a_whole(tmp_path: Path) -> None:
    rig = Rig(tmp_path, options=merge_options(), retention=RetentionSettings(default_hours=1))
    small_segments(rig, 4)
    rig.clean(orphans=False)
    (merged,) = rig.manifest("T").segments
    rig.advance(3600 - 4 * 20 + 30)  # the oldest record is past 1 h, the newest is not
    rep = rig.clean(orphans=False)
    assert rep.expired_segments == 0 and rep.deleted_objects == 12  # only the grace-period leftovers
    assert rig.archive("T") == rig.expected("T")
    rig.advance(60)
    rep = rig.clean(orphans=False)
    assert rep.expired_segments == 1
    assert set(merged.keys()) == {e.key for e in rig.events.data("delete")[-3:]}
    m = rig.manifest("T")
    assert m.segments == () and m.next_offset == 12
    rig.close()


def test_crash_after_merge_upload_is_harmless(tmp_path: Path) -> None:
    rig = Rig(tmp_path, options=merge_options(), retention=RetentionSettings(default_hours=24))
    small_segments(rig, 4)
    rig.crash_before_commit(lambda: rig.clean(orphans=False))
    assert len(rig.manifest("T").segments) == 4 and rig.archive("T") == rig.expected("T")
    rig.restart()
    rep = rig.clean(orphans=False)  # the same merge again: same names, same bytes
    assert rep.ok and rep.merged_segments == 4
    assert rig.archive("T") == rig.expected("T")
    puts = [e.key for e in rig.events.data("put") if "/commitlog/" in e.key]
    assert len(puts) == 4 + 2  # four dispatched, the merged one twice (identical retry)
    rig.close()


def test_merge_survives_a_dispatcher_append_between_build_and_commit(tmp_path: Path) -> None:
    rig = Rig(tmp_path, options=merge_options(), retention=RetentionSettings(default_hours=24))
    small_segments(rig, 5)
    m = rig.manifest("T")
    run = MergeRun(m.segments[:4])
    qp = QueuePlan(topic="T", queue_id=0, retention=None, merges=(run,))
    fake = MergedSegment(run, m.segments[0].__class__(**{**{f: getattr(m.segments[0], f)
                                                             for f in m.segments[0].__dataclass_fields__},
                                                          "q_end": 12, "cl_end": m.segments[3].cl_end}),
                         b"", b"", None, m.history)
    applied: list = []
    # the manifest gained a segment meanwhile: the run is still there, so the merge applies
    new = _change(qp, [fake], 99, applied)(m)
    assert applied == [fake] and [(s.q_start, s.q_end) for s in new.segments] == [(0, 12), (12, 15)]
    assert new.pending_deletes[-1].after_ms == 99
    # the run is gone (another writer merged or expired it): this merge is dropped, nothing else fails
    other = Manifest(topic=m.topic, queue_id=0, next_offset=m.next_offset, cl_next=m.cl_next, segments=m.segments[2:])
    new = _change(qp, [fake], 99, applied)(other)
    assert applied == [] and new.segments == other.segments
    rig.close()
