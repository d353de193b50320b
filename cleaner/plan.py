"""The cleaner's decisions: a pure function of manifests, retention and a clock.

Nothing here performs I/O; ``execute`` carries a plan out. Tests check plans.

Expiry (docs/design.md section 4, invariant 4)
    A segment is *expired* only when it holds data (messages > 0, bytes > 0),
    its store timestamps are real times (see ``verdict``), none lies beyond
    ``now + skew_tolerance``, and its maximum store timestamp is older than
    ``now - retention``. Every segment in a manifest is sealed (the dispatcher
    only commits complete uploads; its open batch is never in a manifest),
    and a queue without a manifest is not in the input at all, so neither can
    ever be expired.

    Only a prefix of a queue is removed, never a hole: the walk from the
    oldest offset stops at the first segment that is not expired, and at a
    segment whose object carries a manifest chunk (tiered/archive/chunks.py)
    still describing a segment the prefix keeps (``Verdict.CARRIER``;
    tiered never writes one: a carrier is newer than what it describes).
    ``still_referenced`` is what a plan must never delete. Gaps
    (offsets the broker lost before they were archived) are metadata: a gap
    goes with the prefix when a later segment in the prefix has expired (the
    lost data was older than data already past retention), or on its own when
    it was recorded more than the retention ago. A gap is never removed from
    between two kept items. ``next_offset`` and ``cl_next`` never change, so
    an idle queue whose segments all expired keeps its progress.

Sentinels
    A time that is not a real time (``Long.MAX_VALUE``, 0, -1, anything before
    2010 or a maximum below the minimum) is never compared against the
    cut-off: such a segment is kept and reported, like one stamped in the
    future beyond the tolerance.

Merging
    Runs of adjacent small segments (each below ``merge_min_bytes``, no gap
    between them, all with sane young timestamps) are packed greedily up to
    ``merge_target_bytes``. A packed run is merged when it reaches
    ``merge_min_bytes`` or has ``merge_fanin`` members, so a slow queue is not
    rewritten on every pass. Its store-time span is capped at a fraction of
    the topic's retention, so merging delays the expiry of the oldest record
    in it by at most that fraction (and a busy tail never keeps absorbing old
    data forever).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from tiered.cleaner.retention import Retention
from tiered.archive.chunks import CHUNK_DIR, span
from tiered.archive.manifest import Gap, Manifest, PendingDelete, Segment, topic_of_dir
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectInfo

QueueKey = tuple[str, int]

# Before this instant (2010-01-01T00:00:00Z) a store timestamp is taken as a
# broken clock or an uninitialised field, never as a real time.
MIN_PLAUSIBLE_MS = 1_262_304_000_000
# Java's Long.MAX_VALUE: the "no data yet" sentinel of RocketMQ's tiered store.
LONG_MAX = (1 << 63) - 1

DATA_DIRS = ("commitlog", "consumequeue", "index", "segment")  # segment/: layout v2


class Verdict(str, Enum):
    EXPIRED = "expired"
    YOUNG = "young"  # within retention
    EMPTY = "empty"  # holds no data: never expired
    FUTURE = "future"  # stamped beyond now + tolerance: never expired, reported
    BAD_TIME = "bad_time"  # not a real time (sentinel, pre-2010, max < min): never expired, reported
    # its object carries a manifest chunk that still describes kept segments:
    # kept with them (cannot happen with what tiered writes: a carrier is
    # newer than what it describes; checked anyway)
    CARRIER = "carrier"

    @property
    def skewed(self) -> bool:
        return self in (Verdict.FUTURE, Verdict.BAD_TIME)


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    skew_tolerance_ms: int = 300_000
    orphan_grace_ms: int = 3_600_000
    merge: bool = True
    merge_target_bytes: int = 256 << 20
    merge_min_bytes: int = 16 << 20
    merge_fanin: int = 16
    # A merged segment spans at most this fraction of the topic's retention in store time.
    merge_max_span_fraction: float = 0.1
    # Bytes merged per pass (read once, written once); the rest waits for the next pass.
    merge_budget_bytes: int = 1 << 30


def verdict(seg: Segment, cutoff_ms: int, now_ms: int, skew_tolerance_ms: int) -> Verdict:
    """The expiry verdict of one segment. ``cutoff_ms`` = now - retention."""
    if seg.messages <= 0 or seg.nbytes <= 0:
        return Verdict.EMPTY
    lo, hi = seg.min_store_ms, seg.max_store_ms
    # Sentinels first: none of them is ever compared as a time below.
    if not (MIN_PLAUSIBLE_MS <= lo <= hi < LONG_MAX):
        return Verdict.BAD_TIME
    if hi > now_ms + skew_tolerance_ms:
        return Verdict.FUTURE
    if hi < cutoff_ms:
        return Verdict.EXPIRED
    return Verdict.YOUNG


def gap_expired(gap: Gap, cutoff_ms: int, now_ms: int, skew_tolerance_ms: int) -> bool:
    """A gap recorded more than the retention ago: the data it stands for was older still."""
    return MIN_PLAUSIBLE_MS <= gap.recorded_ms <= now_ms + skew_tolerance_ms and gap.recorded_ms < cutoff_ms


@dataclass(frozen=True)
class SkewedSegment:
    segment: Segment
    verdict: Verdict


@dataclass(frozen=True)
class MergeRun:
    """Adjacent segments to be replaced by one."""

    segments: tuple[Segment, ...]

    @property
    def q_start(self) -> int:
        return self.segments[0].q_start

    @property
    def q_end(self) -> int:
        return self.segments[-1].q_end

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def messages(self) -> int:
        return sum(s.messages for s in self.segments)


@dataclass(frozen=True, kw_only=True)
class QueuePlan:
    topic: str
    queue_id: int
    retention: Retention | None
    expire: tuple[Segment, ...] = ()
    drop_gaps: tuple[Gap, ...] = ()
    merges: tuple[MergeRun, ...] = ()
    due_pending: tuple[PendingDelete, ...] = ()
    skewed: tuple[SkewedSegment, ...] = ()
    # why the expiry prefix stopped where it did (for the operator)
    stopped_by: Verdict | None = None

    @property
    def key(self) -> QueueKey:
        return (self.topic, self.queue_id)

    @property
    def changes(self) -> bool:
        return bool(self.expire or self.drop_gaps or self.merges or self.due_pending)

    @property
    def expired_bytes(self) -> int:
        return sum(s.nbytes for s in self.expire)

    @property
    def expired_messages(self) -> int:
        return sum(s.messages for s in self.expire)

    def expired_keys(self) -> list[str]:
        return [k for s in self.expire for k in s.keys()]

    def pending_keys(self) -> list[str]:
        return [k for p in self.due_pending for k in p.keys]


@dataclass(frozen=True)
class CleanPlan:
    now_ms: int
    queues: tuple[QueuePlan, ...] = ()

    @property
    def changes(self) -> tuple[QueuePlan, ...]:
        return tuple(q for q in self.queues if q.changes)

    @property
    def expired_segments(self) -> int:
        return sum(len(q.expire) for q in self.queues)

    @property
    def skewed(self) -> tuple[tuple[QueuePlan, SkewedSegment], ...]:
        return tuple((q, s) for q in self.queues for s in q.skewed)


def carriers(m: Manifest) -> dict[str, int]:
    """Segment objects that carry a manifest chunk ``m`` reaches (format
    4.0), each with the end offset of the newest segment its chunks describe:
    the object must stay while that segment does."""
    out: dict[str, int] = {}
    for name, obj in zip(m.chunk_names, m.chunk_keys):
        if f"/{CHUNK_DIR}/" not in obj:
            out[obj] = max(out.get(obj, 0), span(name)[1])
    return out


def still_referenced(m: Manifest, qp: QueuePlan) -> set[str]:
    """What ``m`` still references once ``qp``'s expiry is committed: the kept
    segments' objects, the chunks that still describe a kept segment and the
    objects carrying them, the pending deletes not due. No key of
    ``qp.expired_keys()`` or ``qp.pending_keys()`` may be in it."""
    kept = m.segments[len(qp.expire):]
    end = qp.expire[-1].q_end if qp.expire else -1
    out = {k for s in kept for k in s.keys()}
    out.update(k for p in m.pending_deletes if p not in qp.due_pending for k in p.keys)
    out.update(obj for name, obj in zip(m.chunk_names, m.chunk_keys) if span(name)[1] > end)
    return out


def plan_expiry(
    m: Manifest, cutoff_ms: int, now_ms: int, skew_tolerance_ms: int, *, limit: int | None = None,
) -> tuple[tuple[Segment, ...], tuple[Gap, ...], Verdict | None]:
    """(segments, gaps) forming the removable prefix of ``m``, and the verdict
    of the segment that stopped the walk (None: nothing stopped it). Nothing
    from queue offset ``limit`` on is removed. A segment whose object
    carries a manifest chunk describing a segment the prefix keeps stops it
    (``Verdict.CARRIER``)."""
    segments, gaps, stopped = _expiry(m, cutoff_ms, now_ms, skew_tolerance_ms, limit)
    held = carriers(m)
    while held and segments:
        end = segments[-1].q_end
        stop = next((s for s in segments if any(held.get(k, 0) > end for k in s.keys())), None)
        if stop is None:
            break
        segments, gaps, _ = _expiry(m, cutoff_ms, now_ms, skew_tolerance_ms, stop.q_start)
        stopped = Verdict.CARRIER
    return segments, gaps, stopped


def _expiry(
    m: Manifest, cutoff_ms: int, now_ms: int, skew_tolerance_ms: int, limit: int | None,
) -> tuple[tuple[Segment, ...], tuple[Gap, ...], Verdict | None]:
    items: list[Segment | Gap] = sorted([*m.segments, *m.gaps], key=lambda x: (x.q_start, x.q_end))
    last = -1
    stopped: Verdict | None = None
    for i, item in enumerate(items):
        if limit is not None and item.q_start >= limit:
            stopped = Verdict.CARRIER
            break
        if isinstance(item, Gap):
            if gap_expired(item, cutoff_ms, now_ms, skew_tolerance_ms):
                last = i
            continue  # transparent: goes only with something expired after it
        v = verdict(item, cutoff_ms, now_ms, skew_tolerance_ms)
        if v is not Verdict.EXPIRED:
            stopped = v
            break
        last = i
    prefix = items[:last + 1]
    segments = tuple(x for x in prefix if isinstance(x, Segment))
    gaps = tuple(x for x in prefix if isinstance(x, Gap))
    return segments, gaps, stopped


def plan_merges(
    segments: Iterable[Segment],
    retention_ms: int,
    cutoff_ms: int,
    now_ms: int,
    opts: PlanOptions,
) -> list[MergeRun]:
    """Runs of adjacent small segments worth merging (see the module docstring)."""
    span_limit = max(1, int(retention_ms * opts.merge_max_span_fraction))
    runs: list[MergeRun] = []
    cur: list[Segment] = []
    total = 0
    lo = hi = 0

    def flush() -> None:
        if len(cur) >= 2 and (total >= opts.merge_min_bytes or len(cur) >= opts.merge_fanin):
            runs.append(MergeRun(tuple(cur)))

    for seg in segments:
        ok = (seg.nbytes < opts.merge_min_bytes
              and verdict(seg, cutoff_ms, now_ms, opts.skew_tolerance_ms) is Verdict.YOUNG)
        if not ok:
            flush()
            cur, total = [], 0
            continue
        if cur:
            prev = cur[-1]
            adjacent = seg.q_start == prev.q_end and seg.cl_start == prev.cl_end
            fits = total + seg.nbytes <= opts.merge_target_bytes
            span_ok = max(hi, seg.max_store_ms) - min(lo, seg.min_store_ms) <= span_limit
            if not (adjacent and fits and span_ok):
                flush()
                cur, total = [], 0
        if not cur:
            lo, hi = seg.min_store_ms, seg.max_store_ms
        cur.append(seg)
        total += seg.nbytes
        lo, hi = min(lo, seg.min_store_ms), max(hi, seg.max_store_ms)
    flush()
    return runs


def plan_queue(
    m: Manifest,
    retention: Retention | None,
    now_ms: int,
    opts: PlanOptions,
    *,
    merge: bool | None = None,
    merge_budget: list[int] | None = None,
) -> QueuePlan:
    """One queue's plan. ``retention`` None (unknown this pass): nothing
    expires and nothing merges; due pending deletes still go."""
    due = tuple(p for p in m.pending_deletes if p.after_ms <= now_ms)
    if retention is None:
        return QueuePlan(topic=m.topic, queue_id=m.queue_id, retention=None, due_pending=due)
    cutoff = now_ms - retention.ms
    tol = opts.skew_tolerance_ms
    skewed = tuple(SkewedSegment(s, v) for s in m.segments
                   if (v := verdict(s, cutoff, now_ms, tol)).skewed)
    expire, gaps, stopped = plan_expiry(m, cutoff, now_ms, tol)
    merges: tuple[MergeRun, ...] = ()
    if opts.merge if merge is None else merge:
        remaining = m.segments[len(expire):]
        chosen = []
        for run in plan_merges(remaining, retention.ms, cutoff, now_ms, opts):
            if merge_budget is not None:
                if merge_budget[0] <= 0:
                    break  # overshoots by at most one run (<= merge_target_bytes)
                merge_budget[0] -= run.nbytes
            chosen.append(run)
        merges = tuple(chosen)
    return QueuePlan(topic=m.topic, queue_id=m.queue_id, retention=retention, expire=expire, drop_gaps=gaps,
                     merges=merges, due_pending=due, skewed=skewed, stopped_by=stopped)


def make_plan(
    manifests: Mapping[QueueKey, Manifest],
    retention: Callable[[str], Retention | None] | None,
    now_ms: int,
    opts: PlanOptions,
    *,
    merge: bool | None = None,
) -> CleanPlan:
    """The whole pass. ``retention`` None: the policy could not be read; only
    due pending deletes are planned."""
    budget = [opts.merge_budget_bytes]
    queues = []
    for key in sorted(manifests):
        m = manifests[key]
        r = retention(m.topic) if retention is not None else None
        queues.append(plan_queue(m, r, now_ms, opts, merge=merge, merge_budget=budget))
    return CleanPlan(now_ms, tuple(queues))


# --- orphans ---------------------------------------------------------------------


def parse_data_key(prefix: str, key: str) -> tuple[str, int, str] | None:
    """(topic, queue id, kind) of a data object under ``{prefix}/``, else None.

    Only ``{prefix}/{topic}/{qid}/{commitlog|consumequeue|index|segment}/{name}`` is a
    data object; manifests, the catalog, the lease and anything unknown are not
    and are never collected. (RocketMQ topic names cannot contain ``/``.)
    """
    if not key.startswith(prefix + "/"):
        return None
    parts = key[len(prefix) + 1:].split("/")
    if len(parts) != 4 or parts[2] not in DATA_DIRS or not parts[1].isdigit() or not parts[3] or not parts[0]:
        return None
    return topic_of_dir(parts[0]), int(parts[1]), parts[2]


def parse_chunk_key(prefix: str, key: str) -> tuple[str, int, str] | None:
    """(topic, queue id, "manifest") of a manifest chunk object
    ``{prefix}/{topic}/{qid}/manifest/chunk-...`` (tiered/archive/chunks.py), else None.
    An unreferenced chunk is an orphan like an unreferenced segment object."""
    if not key.startswith(prefix + "/"):
        return None
    parts = key[len(prefix) + 1:].split("/")
    if len(parts) != 4 or parts[2] != CHUNK_DIR or not parts[1].isdigit() or not parts[0] \
            or not parts[3].startswith("chunk-"):
        return None
    return topic_of_dir(parts[0]), int(parts[1]), parts[2]


@dataclass(frozen=True)
class OrphanPlan:
    """Data objects older than the grace period that the known manifests do
    not reference, per queue. ``unmanaged`` counts old data objects of queues
    with no manifest at all: those are kept (a lost manifest must not turn a
    whole archive into garbage) and reported."""

    candidates: Mapping[QueueKey, tuple[ObjectInfo, ...]] = field(default_factory=dict)
    unmanaged: Mapping[QueueKey, int] = field(default_factory=dict)
    scanned: int = 0

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.candidates.values())


def plan_orphans(
    listing: Iterable[ObjectInfo],
    prefix: str,
    referenced: Mapping[QueueKey, set[str]],
    now_ms: int,
    grace_ms: int,
) -> OrphanPlan:
    """Candidates from one LIST of ``{prefix}/``. A queue counts as managed when
    its ``manifest.json`` is in the listing; ``referenced`` holds the keys the
    manifests known to us reference (a queue missing from it has all its old
    data objects as candidates, to be re-checked against a fresh manifest)."""
    objects = list(listing)
    managed: set[QueueKey] = set()
    for obj in objects:
        rel = obj.key[len(prefix) + 1:] if obj.key.startswith(prefix + "/") else ""
        parts = rel.split("/")
        if len(parts) == 3 and parts[2] == "manifest.json" and parts[1].isdigit():
            managed.add((topic_of_dir(parts[0]), int(parts[1])))
    candidates: dict[QueueKey, list[ObjectInfo]] = {}
    unmanaged: dict[QueueKey, int] = {}
    for obj in objects:
        parsed = parse_data_key(prefix, obj.key) or parse_chunk_key(prefix, obj.key)
        if parsed is None:
            continue
        if obj.mtime_ms > now_ms - grace_ms:
            continue  # young, or stamped in the future: may be an upload in flight
        q = (parsed[0], parsed[1])
        if q not in managed:
            unmanaged[q] = unmanaged.get(q, 0) + 1
            continue
        if obj.key in referenced.get(q, ()):
            continue
        candidates.setdefault(q, []).append(obj)
    return OrphanPlan({k: tuple(v) for k, v in candidates.items()}, unmanaged, len(objects))


def accountable_orphans(
    manifest: Manifest, objects: Iterable[ObjectInfo], descriptors: Mapping[str, Descriptor | None],
) -> tuple[list[str], list[str]]:
    """(deletable, kept) among unreferenced data objects of one queue whose
    manifest was just read. An object is deletable only when it provably
    belongs to the manifest's own history: a ConsumeQueue object by its
    descriptor, a CommitLog or index object by a deletable descriptor naming
    it, or by lying at or after the archive's first segment (a superseded or
    never-committed upload). Anything else (another history's segments,
    objects before the archive with nothing describing them) is kept: it
    may be history a lost manifest no longer names. Manifests from before
    descriptors (no history id) keep the old rule: unreferenced is orphan."""
    legacy = not manifest.history
    deletable: list[str] = []
    kept: list[str] = []
    named: set[str] = set()
    others = []
    for obj in objects:
        folder, name = (["", ""] + obj.key.rsplit("/", 2))[-2:]
        if folder == CHUNK_DIR and name.startswith("chunk-"):
            # a manifest chunk the fresh head does not reach: only a head can
            # reference one, and this queue's head was just read
            deletable.append(obj.key)
            continue
        if "/consumequeue/" not in obj.key:
            others.append(obj)
            continue
        desc = descriptors.get(obj.key)
        if (desc is None and legacy) or (desc is not None and desc.history == manifest.history):
            deletable.append(obj.key)
            if desc is not None:
                named.update(desc.segment.keys())
        else:
            kept.append(obj.key)
    first_cl = manifest.segments[0].cl_start if manifest.segments else manifest.cl_next
    first_q = manifest.first_offset
    for obj in others:
        start = obj.key.rsplit("/", 1)[-1].split("-", 1)[0]
        floor = first_cl if "/commitlog/" in obj.key else first_q
        if legacy or obj.key in named or (start.isdigit() and int(start) >= floor):
            deletable.append(obj.key)
        else:
            kept.append(obj.key)
    return deletable, kept
