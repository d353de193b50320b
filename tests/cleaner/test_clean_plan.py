"""The plan is a pure function of manifests, retention and a clock: checked here
without any storage."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from tiered.cleaner.plan import (
    LONG_MAX,
    PlanOptions,
    Verdict,
    make_plan,
    parse_data_key,
    plan_expiry,
    plan_merges,
    plan_orphans,
    plan_queue,
    verdict,
)
from tiered.cleaner.retention import Retention, RetentionPolicy
from tiered.archive.manifest import Gap, Manifest, PendingDelete, Segment, segment_keys
from tiered.archive.storage import ObjectInfo

NOW = 1_750_000_000_000
HOUR = 3_600_000
PREFIX = "C/b"
R1 = Retention(HOUR, "default")
OPTS = PlanOptions(skew_tolerance_ms=300_000, merge_min_bytes=1000, merge_target_bytes=5000, merge_fanin=4)


def seg(q0: int, q1: int, *, cl0: int | None = None, nbytes: int = 100, lo: int | None = None,
        hi: int | None = None, topic: str = "T") -> Segment:
    cl0 = q0 * 100 if cl0 is None else cl0
    hi = NOW - 2 * HOUR if hi is None else hi
    lo = hi if lo is None else lo
    cl, cq, ix = segment_keys(f"{PREFIX}/{topic}/0", cl0, cl0 + nbytes, q0, q1)
    return Segment(q_start=q0, q_end=q1, cl_start=cl0, cl_end=cl0 + nbytes, min_store_ms=lo, max_store_ms=hi, min_born_ms=lo, max_born_ms=hi, commitlog_key=cl, consumequeue_key=cq, index_key=ix, commitlog_crc=0, consumequeue_crc=0, created_ms=NOW - 3 * HOUR)


def chain(*specs: dict, start: int = 0) -> tuple[Segment, ...]:
    """Contiguous segments: each spec gives n (messages), nbytes, hi, lo."""
    out, q, cl = [], start, start * 100
    for s in specs:
        n, nb = s.get("n", 1), s.get("nbytes", 100)
        out.append(seg(q, q + n, cl0=cl, nbytes=nb, lo=s.get("lo"), hi=s.get("hi")))
        q, cl = q + n, cl + nb
    return tuple(out)


def manifest(segments=(), gaps=(), pending=(), topic="T") -> Manifest:
    items = sorted([(s.q_start, s.q_end) for s in segments] + [(g.q_start, g.q_end) for g in gaps])
    nxt = items[-1][1] if items else 0
    cl = segments[-1].cl_end if segments else 0
    m = Manifest(topic=topic, queue_id=0, next_offset=nxt, cl_next=cl, generation=1, segments=tuple(segments),
                 gaps=tuple(gaps), pending_deletes=tuple(pending))
    m.check()
    return m


# --- verdicts -------------------------------------------------------------------


def test_expiry_is_strictly_older_than_now_minus_retention() -> None:
    cutoff = NOW - HOUR
    assert verdict(seg(0, 1, hi=cutoff - 1), cutoff, NOW, 0) is Verdict.EXPIRED
    assert verdict(seg(0, 1, hi=cutoff), cutoff, NOW, 0) is Verdict.YOUNG
    assert verdict(seg(0, 1, hi=NOW), cutoff, NOW, 0) is Verdict.YOUNG


@pytest.mark.parametrize("lo, hi", [
    (LONG_MAX, LONG_MAX),  # RocketMQ's "no data yet" max timestamp
    (0, 0), (-1, -1), (0, NOW - 5 * HOUR),  # uninitialised minimum
    (NOW - 5 * HOUR, LONG_MAX),
    (NOW - 2 * HOUR, NOW - 3 * HOUR),  # max below min
    (1000, 2000),  # 1970: a broken clock, never a real time
])
def test_sentinels_are_never_compared_as_times(lo: int, hi: int) -> None:
    s = seg(0, 1, lo=lo, hi=hi)
    v = verdict(s, NOW - HOUR, NOW, 300_000)
    assert v is Verdict.BAD_TIME and v.skewed
    expire, _gaps, stopped = plan_expiry(manifest([s]), NOW - HOUR, NOW, 300_000)
    assert expire == () and stopped is Verdict.BAD_TIME


def test_empty_segment_is_never_expired() -> None:
    empty = Segment(q_start=0, q_end=0, cl_start=0, cl_end=0, min_store_ms=NOW - 9 * HOUR, max_store_ms=NOW - 9 * HOUR, min_born_ms=0, max_born_ms=0, commitlog_key="a", consumequeue_key="b", index_key=None, commitlog_crc=0, consumequeue_crc=0, created_ms=0)
    assert verdict(empty, NOW - HOUR, NOW, 0) is Verdict.EMPTY
    no_bytes = Segment(q_start=0, q_end=3, cl_start=0, cl_end=0, min_store_ms=NOW - 9 * HOUR, max_store_ms=NOW - 9 * HOUR, min_born_ms=0, max_born_ms=0, commitlog_key="a", consumequeue_key="b", index_key=None, commitlog_crc=0, consumequeue_crc=0, created_ms=0)
    assert verdict(no_bytes, NOW - HOUR, NOW, 0) is Verdict.EMPTY


def test_future_beyond_tolerance_is_kept_and_reported() -> None:
    tol = 300_000
    assert verdict(seg(0, 1, lo=NOW - 2 * HOUR, hi=NOW + tol), NOW - HOUR, NOW, tol) is Verdict.YOUNG
    assert verdict(seg(0, 1, lo=NOW - 2 * HOUR, hi=NOW + tol + 1), NOW - HOUR, NOW, tol) is Verdict.FUTURE
    # a future segment stops the prefix even when everything after it is ancient
    segs = chain({"hi": NOW - 5 * HOUR}, {"lo": NOW - 5 * HOUR, "hi": NOW + HOUR}, {"hi": NOW - 4 * HOUR})
    qp = plan_queue(manifest(segs), R1, NOW, OPTS)
    assert qp.expire == segs[:1]
    assert qp.stopped_by is Verdict.FUTURE
    assert [s.segment for s in qp.skewed] == [segs[1]]


# --- prefix and gaps -------------------------------------------------------------


def test_only_a_prefix_is_expired_never_a_hole() -> None:
    old, young = NOW - 5 * HOUR, NOW - 10 * 60_000
    segs = chain({"hi": old}, {"hi": old}, {"hi": young}, {"hi": old}, {"hi": old})
    qp = plan_queue(manifest(segs), R1, NOW, OPTS)
    assert qp.expire == segs[:2]
    assert qp.stopped_by is Verdict.YOUNG


def test_everything_expired_keeps_progress() -> None:
    segs = chain({"hi": NOW - 5 * HOUR, "n": 10}, {"hi": NOW - 4 * HOUR, "n": 5})
    m = manifest(segs)
    qp = plan_queue(m, R1, NOW, OPTS)
    assert qp.expire == segs
    after = Manifest(topic=m.topic, queue_id=0, next_offset=m.next_offset, cl_next=m.cl_next, segments=(), gaps=())
    after.check()  # next_offset 15 and cl_next stay; an empty archive is a valid one


def test_gaps_go_with_an_expired_segment_after_them() -> None:
    g = Gap(0, 10, "expired_locally", NOW - 10 * 60_000)  # recorded recently
    s = seg(10, 12, cl0=0, hi=NOW - 5 * HOUR)
    expire, gaps, _ = plan_expiry(manifest([s], [g]), NOW - HOUR, NOW, 0)
    assert expire == (s,) and gaps == (g,)


def test_trailing_recent_gap_stays_old_gap_goes() -> None:
    s = seg(0, 2, hi=NOW - 5 * HOUR)
    recent = Gap(2, 5, "expired_locally", NOW - 60_000)
    expire, gaps, _ = plan_expiry(manifest([s], [recent]), NOW - HOUR, NOW, 0)
    assert expire == (s,) and gaps == ()
    old = Gap(2, 5, "expired_locally", NOW - 2 * HOUR)
    expire, gaps, _ = plan_expiry(manifest([s], [old]), NOW - HOUR, NOW, 0)
    assert expire == (s,) and gaps == (old,)


def test_gap_between_kept_items_is_never_removed() -> None:
    young = seg(0, 2, hi=NOW - 60_000)
    old_gap = Gap(2, 5, "expired_locally", NOW - 9 * HOUR)
    expire, gaps, _ = plan_expiry(manifest([young], [old_gap]), NOW - HOUR, NOW, 0)
    assert expire == () and gaps == ()


def test_queue_of_only_gaps() -> None:
    gaps = (Gap(0, 5, "expired_locally", NOW - 9 * HOUR), Gap(5, 9, "quarantined", NOW - 60_000))
    expire, dropped, _ = plan_expiry(manifest([], gaps), NOW - HOUR, NOW, 0)
    assert expire == () and dropped == gaps[:1]


# --- per-topic retention ------------------------------------------------------------


def test_retention_precedence_broker_then_config_then_default() -> None:
    p = RetentionPolicy(MappingProxyType({"A": 2.0}), MappingProxyType({"A": 5.0, "B": 3.0}), 72.0)
    assert p.for_topic("A") == Retention(2 * HOUR, "reserve.time")
    assert p.for_topic("B") == Retention(3 * HOUR, "config")
    assert p.for_topic("C") == Retention(72 * HOUR, "default")


def test_plan_uses_each_topics_retention() -> None:
    a = manifest(chain({"hi": NOW - 3 * HOUR}), topic="A")
    b = manifest(chain({"hi": NOW - 3 * HOUR}), topic="B")
    p = RetentionPolicy(MappingProxyType({"A": 2.0}), MappingProxyType({}), 72.0)
    plan = make_plan({("A", 0): a, ("B", 0): b}, p.for_topic, NOW, OPTS)
    by = {q.topic: q for q in plan.queues}
    assert len(by["A"].expire) == 1 and by["B"].expire == ()
    assert by["A"].retention.source == "reserve.time"


def test_unknown_retention_expires_nothing_but_due_pending_deletes_go() -> None:
    due = PendingDelete(("x",), NOW - 1)
    later = PendingDelete(("y",), NOW + 1)
    m = manifest(chain({"hi": NOW - 900 * HOUR}), pending=[due, later])
    plan = make_plan({("T", 0): m}, None, NOW, OPTS)
    (qp,) = plan.queues
    assert qp.expire == () and qp.merges == () and qp.due_pending == (due,)


# --- merges ---------------------------------------------------------------------------


def young(**kw: int) -> dict:
    return {"hi": NOW - 10 * 60_000, **kw}


def test_merge_runs_reach_min_bytes_or_fanin() -> None:
    # 3 x 400 bytes = 1200 >= min 1000: one run
    segs = chain(young(nbytes=400), young(nbytes=400), young(nbytes=400))
    runs = plan_merges(segs, HOUR, NOW - HOUR, NOW, OPTS)
    assert [r.segments for r in runs] == [segs]
    # 3 x 100 bytes: below min and below fan-in 4: wait
    small = chain(young(), young(), young())
    assert plan_merges(small, HOUR, NOW - HOUR, NOW, OPTS) == []
    # 4 x 100: fan-in reached
    four = chain(young(), young(), young(), young())
    assert [r.segments for r in plan_merges(four, HOUR, NOW - HOUR, NOW, OPTS)] == [four]


def test_merge_never_crosses_a_gap_or_a_big_segment() -> None:
    a = chain(young(nbytes=600), young(nbytes=600))
    b = chain(young(nbytes=600), young(nbytes=600), start=10)
    b = tuple(Segment(**{**{f: getattr(s, f) for f in s.__dataclass_fields__},
                         "cl_start": s.cl_start - 1000 + 1200, "cl_end": s.cl_end - 1000 + 1200}) for s in b)
    m = manifest(a + b, [Gap(2, 10, "expired_locally", NOW)])
    runs = plan_merges(m.segments, HOUR, NOW - HOUR, NOW, OPTS)
    assert [r.segments for r in runs] == [a, b]
    big = chain(young(nbytes=600), young(nbytes=2000), young(nbytes=600))
    assert plan_merges(big, HOUR, NOW - HOUR, NOW, OPTS) == []


def test_merge_respects_target_size() -> None:
    segs = chain(*[young(nbytes=900)] * 12)
    runs = plan_merges(segs, HOUR, NOW - HOUR, NOW, OPTS)
    assert all(r.nbytes <= OPTS.merge_target_bytes for r in runs)
    assert [len(r.segments) for r in runs] == [5, 5, 2]  # the last 2 (1800 bytes) reach min bytes too


def test_merge_span_is_capped_by_retention_fraction() -> None:
    # fraction 0.1 of 1 h = 6 min: segments 7 min apart never share a run, 4 min apart pair up
    segs = chain(*[{"hi": NOW - 40 * 60_000 + i * 7 * 60_000, "nbytes": 600} for i in range(4)])
    assert plan_merges(segs, HOUR, NOW - HOUR, NOW, OPTS) == []
    segs = chain(*[{"hi": NOW - 40 * 60_000 + i * 4 * 60_000, "nbytes": 600} for i in range(4)])
    assert [len(r.segments) for r in plan_merges(segs, HOUR, NOW - HOUR, NOW, OPTS)] == [2, 2]
    segs = chain(*[{"hi": NOW - 40 * 60_000 + i * 60_000, "nbytes": 600} for i in range(4)])
    assert [len(r.segments) for r in plan_merges(segs, HOUR, NOW - HOUR, NOW, OPTS)] == [4]


def test_merge_skips_skewed_and_expired_segments() -> None:
    segs = chain(young(nbytes=600), {"lo": NOW - 60_000, "hi": NOW + HOUR, "nbytes": 600}, young(nbytes=600),
                 young(nbytes=600))
    runs = plan_merges(segs, HOUR, NOW - HOUR, NOW, OPTS)
    assert [r.segments for r in runs] == [segs[2:]]
    # an expired prefix is removed, never merged
    segs = chain({"hi": NOW - 2 * HOUR, "nbytes": 600}, young(nbytes=600), young(nbytes=600))
    qp = plan_queue(manifest(segs), R1, NOW, OPTS)
    assert qp.expire == segs[:1]
    assert [r.segments for r in qp.merges] == [segs[1:]]


def test_merge_budget_bounds_one_pass() -> None:
    opts = PlanOptions(merge_min_bytes=1000, merge_target_bytes=1200, merge_fanin=100, merge_budget_bytes=2000)
    ms = {("T", q): manifest(chain(young(nbytes=600), young(nbytes=600))) for q in range(5)}
    ms = {k: Manifest(topic=k[0], queue_id=k[1], next_offset=m.next_offset, cl_next=m.cl_next, generation=1,
                      segments=m.segments) for k, m in ms.items()}
    plan = make_plan(ms, lambda t: R1, NOW, opts)
    assert sum(len(q.merges) for q in plan.queues) == 2


def test_merge_can_be_switched_off() -> None:
    segs = chain(*[young()] * 8)
    assert plan_queue(manifest(segs), R1, NOW, OPTS, merge=False).merges == ()
    assert plan_queue(manifest(segs), R1, NOW, PlanOptions(merge=False, merge_fanin=2)).merges == ()


# --- orphans ----------------------------------------------------------------------------


def info(key: str, age_ms: int) -> ObjectInfo:
    return ObjectInfo(key, 1, NOW - age_ms)


def test_parse_data_key() -> None:
    assert parse_data_key(PREFIX, f"{PREFIX}/T/3/commitlog/1-2") == ("T", 3, "commitlog")
    assert parse_data_key(PREFIX, f"{PREFIX}/%DLQ%g/0/index/1-2") == ("%DLQ%g", 0, "index")
    for key in (f"{PREFIX}/T/3/manifest.json", f"{PREFIX}/_catalog.json", f"{PREFIX}/_lease.json",
                f"{PREFIX}/T/x/commitlog/1", f"{PREFIX}/T/3/other/1", f"{PREFIX}/T/3/commitlog/a/b",
                "C/other/T/3/commitlog/1", f"{PREFIX}/T/3/commitlog/"):
        assert parse_data_key(PREFIX, key) is None, key


def test_orphan_plan() -> None:
    grace = HOUR
    referenced = {("T", 0): {f"{PREFIX}/T/0/commitlog/a", f"{PREFIX}/T/0/commitlog/pending"}}
    listing = [
        info(f"{PREFIX}/T/0/manifest.json", 9 * HOUR),
        info(f"{PREFIX}/T/0/commitlog/a", 9 * HOUR),  # referenced
        info(f"{PREFIX}/T/0/commitlog/pending", 9 * HOUR),  # referenced by a pending delete
        info(f"{PREFIX}/T/0/commitlog/orphan", 2 * HOUR),  # collect
        info(f"{PREFIX}/T/0/index/young", HOUR - 1),  # within grace: maybe in flight
        info(f"{PREFIX}/T/0/consumequeue/future", -HOUR),  # mtime in the future
        info(f"{PREFIX}/U/1/commitlog/x", 9 * HOUR),  # queue without a manifest: kept
        info(f"{PREFIX}/_catalog.json", 9 * HOUR),
        info(f"{PREFIX}/T/0/junk.txt", 9 * HOUR),
    ]
    p = plan_orphans(listing, PREFIX, referenced, NOW, grace)
    assert {k: [o.key for o in v] for k, v in p.candidates.items()} == {("T", 0): [f"{PREFIX}/T/0/commitlog/orphan"]}
    assert p.unmanaged == {("U", 1): 1}
    assert p.scanned == len(listing)


def test_manifest_referenced_keys_include_pending_deletes() -> None:
    s = seg(0, 1)
    m = manifest([s], pending=[PendingDelete(("old-a", "old-b"), NOW)])
    assert {"old-a", "old-b", *s.keys()} == m.referenced_keys()
