"""The pure decisions of recovery: which segments a rebuilt manifest adopts,
and which unreferenced objects the cleaner may delete."""

from __future__ import annotations

import pytest

from tiered.cleaner.plan import accountable_orphans
from tiered.archive import segmeta
from tiered.errors import CorruptRecordError
from tiered.archive.manifest import Gap, Manifest, Segment, segment_keys
from tiered.archive.rebuild import Found, plan_rebuild, queues_in
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectInfo

P = "C/b/T/0"
H = "a" * 32


def seg(q0: int, q1: int, cl0: int, cl1: int) -> Segment:
    cl, cq, ix = segment_keys(P, cl0, cl1, q0, q1)
    return Segment(q_start=q0, q_end=q1, cl_start=cl0, cl_end=cl1, min_store_ms=1, max_store_ms=2, min_born_ms=1, max_born_ms=2, commitlog_key=cl, consumequeue_key=cq, index_key=ix, commitlog_crc=0, consumequeue_crc=0, created_ms=5)


def desc(s: Segment, history: str = H, gaps: tuple[Gap, ...] = ()) -> Descriptor:
    return Descriptor(cluster="C", broker="b", topic="T", queue_id=0, history=history, segment=s, gaps_before=gaps)


def sizes_of(*segs: Segment) -> dict[str, int]:
    out = {}
    for s in segs:
        out[s.commitlog_key] = s.nbytes
        out[s.consumequeue_key] = s.messages * 20 + 100
        out[s.index_key] = 10  # type: ignore[index]
    return out


def plan(*descs: Descriptor, extra: dict[str, int] | None = None, found: list[Found] | None = None):  # noqa: ANN201
    found = (found or []) + [Found(key=d.segment.consumequeue_key, descriptor=d) for d in descs]
    return plan_rebuild("T", 0, found, {**sizes_of(*(d.segment for d in descs)), **(extra or {})})


def test_contiguous_segments_and_recorded_gaps_are_adopted() -> None:
    a, b = seg(0, 5, 0, 500), seg(8, 10, 500, 700)
    gap = Gap(5, 8, "expired_locally", 7)
    p = plan(desc(a), desc(b, gaps=(gap,)))
    assert p.ok and p.manifest is not None
    assert p.manifest.segments == (a, b) and p.manifest.gaps == (gap,)
    assert (p.manifest.next_offset, p.manifest.cl_next, p.manifest.history) == (10, 700, H)


def test_merge_originals_are_superseded_and_the_longest_chain_wins() -> None:
    a, b, c = seg(0, 5, 0, 500), seg(5, 10, 500, 1000), seg(10, 12, 1000, 1200)
    merged = seg(0, 10, 0, 1000)
    p = plan(desc(a), desc(b), desc(merged), desc(c))
    assert p.ok and p.manifest is not None
    assert [(s.q_start, s.q_end) for s in p.manifest.segments] in ([(0, 10), (10, 12)], [(0, 5), (5, 10), (10, 12)])
    assert p.manifest.next_offset == 12 and len(p.superseded) in (1, 2)


def test_a_hole_no_gap_explains_is_a_problem() -> None:
    p = plan(desc(seg(0, 5, 0, 500)), desc(seg(7, 9, 500, 700)))
    assert not p.ok and "hole" in p.problems[0]


def test_two_histories_are_refused() -> None:
    p = plan(desc(seg(0, 5, 0, 500)), desc(seg(5, 9, 500, 700), history="b" * 32))
    assert not p.ok and p.manifest is None and "2 different archive histories" in p.problems[0]


def test_a_missing_commitlog_object_is_a_problem() -> None:
    a = seg(0, 5, 0, 500)
    found = [Found(key=a.consumequeue_key, descriptor=desc(a))]
    p = plan_rebuild("T", 0, found, {a.consumequeue_key: 200, a.index_key: 10})  # type: ignore[dict-item]
    assert not p.ok and a.commitlog_key in p.problems[0]


def test_unreadable_or_legacy_objects_are_problems_but_an_uncommitted_first_upload_is_not() -> None:
    a = seg(0, 5, 0, 500)
    p = plan(desc(a), found=[Found(key=f"{P}/consumequeue/x", problem="x: written before segment descriptors")])
    assert not p.ok and "before segment descriptors" in p.problems[0]
    # only a CommitLog object, no ConsumeQueue object at all: an upload killed before its first commit
    p = plan_rebuild("T", 0, [], {a.commitlog_key: 500})
    assert p.ok and p.manifest is None
    # loose objects before the first adopted segment: history nothing describes
    b = seg(5, 9, 500, 700)
    p = plan(desc(b), extra={a.commitlog_key: 500})
    assert not p.ok and a.commitlog_key in p.problems[0]
    # loose objects after it: superseded or never-committed uploads
    p = plan(desc(a), extra={seg(5, 7, 500, 600).commitlog_key: 100})
    assert p.ok


def test_descriptor_round_trip_and_corruption() -> None:
    a = seg(0, 2, 0, 200)
    entries = bytes(40)
    obj = segmeta.attach(entries, desc(a, gaps=(Gap(0, 0, "x", 1),)))
    d = segmeta.parse(obj, "k")
    assert d is not None and d.segment == a and d.history == H and obj[:40] == entries
    assert segmeta.parse(entries, "k") is None  # written before descriptors
    bad = bytearray(obj)
    bad[45] ^= 1
    with pytest.raises(CorruptRecordError, match="k @ 40: descriptor CRC mismatch"):
        segmeta.parse(bytes(bad), "k")
    with pytest.raises(CorruptRecordError, match="entries"):
        segmeta.parse(bytes(20) + obj[40:], "k")


def test_queues_in_a_listing_include_topics_named_like_internal_files() -> None:
    keys = ["C/b/_catalog.json", "C/b/_lease.json", "C/b/_catalog.json/0/manifest.json",
            "C/b/T/1/commitlog/0-1", "C/b/T/1/notes.txt", "C/b/U/x/commitlog/0-1"]
    assert queues_in(keys, "C/b") == {("_catalog.json", 0), ("T", 1)}


def _obj(key: str) -> ObjectInfo:
    return ObjectInfo(key=key, size=1, mtime_ms=0)


def test_orphans_are_deleted_only_when_accountable_to_the_manifest_history() -> None:
    kept_seg, mine_old, theirs = seg(10, 20, 1000, 2000), seg(10, 15, 1000, 1500), seg(0, 10, 0, 1000)
    m = Manifest(topic="T", queue_id=0, next_offset=20, cl_next=2000, segments=(kept_seg,), history=H)
    objs = [_obj(k) for k in (*mine_old.keys(), *theirs.keys(), seg(20, 22, 2000, 2200).commitlog_key)]
    descs = {mine_old.consumequeue_key: desc(mine_old), theirs.consumequeue_key: desc(theirs, history="f" * 32)}
    deletable, kept = accountable_orphans(m, objs, descs)
    # ours (superseded) and an upload beyond the end go; another history's objects stay
    assert sorted(deletable) == sorted([*mine_old.keys(), seg(20, 22, 2000, 2200).commitlog_key])
    assert sorted(kept) == sorted(theirs.keys())
    # a manifest from before history ids keeps the old rule
    legacy = Manifest(topic="T", queue_id=0, next_offset=20, cl_next=2000, segments=(kept_seg,))
    deletable, kept = accountable_orphans(legacy, [_obj(k) for k in theirs.keys()], {})
    assert sorted(deletable) == sorted(theirs.keys()) and kept == []
