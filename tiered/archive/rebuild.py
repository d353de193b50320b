"""Rebuild a queue's manifest from the segment objects in the bucket.

The bucket is the truth (docs/design.md invariant 7). A manifest that is gone
while the queue's data objects remain (deleted by hand, a lifecycle rule, a
partial restore) is rebuilt from the descriptors its ConsumeQueue objects
carry (tiered/archive/segmeta.py) before anything new is written for the queue.

Decide, then act: ``scan_queue`` reads (one LIST, one GET per ConsumeQueue
object), ``plan_rebuild`` is a pure function of what was read, and the
caller commits the plan's manifest only when ``plan.ok``. A plan is not ok
when the bucket holds anything it cannot account for: a ConsumeQueue object
without a descriptor (written before descriptors existed), a corrupt or
foreign descriptor, segments of more than one history, a hole between
segments that no recorded gap explains, or a descriptor whose CommitLog
object is missing. Then nothing is written for the queue: its objects are
left as they are for an operator (``tiered repair`` reports them).

The adopted chain is the longest run of segments contiguous in queue
offsets (or joined by the recorded gaps before a segment) and in cold
CommitLog bytes. Segments inside the chain's range that are not part of it
are superseded (originals of a merge, an upload that lost a race) and are
accounted for; CommitLog or index objects beyond the chain's end without a
descriptor are uploads whose commit never happened.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from tiered.archive import layout, segmeta
from tiered.format.codec import crc32
from tiered.errors import CorruptRecordError
from tiered.archive.manifest import Gap, Manifest, Segment, topic_of_dir
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)

CQ_ENTRY_SIZE = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """One ConsumeQueue object as read from the bucket."""

    key: str
    descriptor: Descriptor | None = None
    problem: str | None = None  # why it cannot be used; None when it checks out


@dataclass(frozen=True, slots=True, kw_only=True)
class RebuildPlan:
    topic: str
    queue_id: int
    manifest: Manifest | None  # None: nothing to adopt
    superseded: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def adopted(self) -> tuple[Segment, ...]:
        return self.manifest.segments if self.manifest is not None else ()


def scan_queue(store: ObjectStore, prefix: str, topic: str, queue_id: int) -> tuple[list[Found], dict[str, int]]:
    """Every descriptor carrier of ``prefix`` (v1 ConsumeQueue objects, v2
    segment objects) with its descriptor checked against its own entries,
    and the size of every object under ``prefix``."""
    sizes = {o.key: o.size for o in store.list_keys(prefix + "/")}
    found: list[Found] = []
    for key in sorted(k for k in sizes if k.startswith((prefix + "/consumequeue/", prefix + "/segment/"))):
        try:
            data = layout.read_payload(store, key) if "/segment/" in key else store.get(key)
            desc = segmeta.parse(data, key)
        except CorruptRecordError as exc:
            found.append(Found(key=key, problem=str(exc)))
            continue
        if desc is None:
            found.append(Found(key=key, problem=f"{key}: written before segment descriptors; cannot be adopted"))
            continue
        seg = desc.segment
        at = layout.split(seg.consumequeue_key)[1]
        if (desc.topic, desc.queue_id) != (topic, queue_id) or layout.object_of(seg.consumequeue_key) != key:
            found.append(Found(key=key, problem=f"{key}: descriptor names {desc.topic}/{desc.queue_id} "
                                                f"{seg.consumequeue_key}"))
        elif crc32(memoryview(data)[at:at + seg.messages * CQ_ENTRY_SIZE]) != seg.consumequeue_crc:
            found.append(Found(key=key, problem=f"{key}: entries do not match the descriptor's CRC"))
        elif seg.layout == 2 and crc32(memoryview(data)[:seg.nbytes]) != seg.commitlog_crc:
            found.append(Found(key=key, problem=f"{key}: records do not match the descriptor's CRC"))
        else:
            found.append(Found(key=key, descriptor=desc))
    return found, sizes


def _complete(seg: Segment, sizes: dict[str, int]) -> str | None:
    if seg.layout == 2:
        return None  # one object: read whole and checked by scan_queue
    if sizes.get(seg.commitlog_key) != seg.nbytes:
        return f"{seg.commitlog_key}: missing or not {seg.nbytes} bytes"
    if seg.index_key and seg.index_key not in sizes:
        return f"{seg.index_key}: missing"
    return None


def _joins(prev: Descriptor, nxt: Descriptor) -> bool:
    a, b = prev.segment, nxt.segment
    if b.cl_start != a.cl_end:
        return False
    at = a.q_end
    for gap in nxt.gaps_before:
        if gap.q_start != at:
            return False
        at = gap.q_end
    return at == b.q_start


def _chain(cands: list[Descriptor]) -> list[Descriptor]:
    """The longest contiguous chain starting at the lowest queue offset."""
    cands = sorted(cands, key=lambda d: (d.segment.q_start, -d.segment.q_end))
    reach: dict[int, tuple[int, int | None]] = {}  # index -> (furthest q_end, next index)
    for i in range(len(cands) - 1, -1, -1):
        best: tuple[int, int | None] = (cands[i].segment.q_end, None)
        for j in range(i + 1, len(cands)):
            if _joins(cands[i], cands[j]) and reach[j][0] > best[0]:
                best = (reach[j][0], j)
        reach[i] = best
    low = cands[0].segment.q_start
    starts = [i for i, d in enumerate(cands) if d.segment.q_start == low]
    at: int | None = max(starts, key=lambda i: reach[i][0])
    chain: list[Descriptor] = []
    while at is not None:
        chain.append(cands[at])
        at = reach[at][1]
    return chain


def plan_rebuild(topic: str, queue_id: int, found: list[Found], sizes: dict[str, int]) -> RebuildPlan:
    """What a rebuilt manifest would hold, and what cannot be accounted for."""
    problems = [f.problem for f in found if f.problem]
    descs = [f.descriptor for f in found if f.descriptor is not None]
    usable: list[Descriptor] = []
    for d in descs:
        missing = _complete(d.segment, sizes)
        if missing is None:
            usable.append(d)
        else:
            problems.append(missing)
    histories = sorted({d.history for d in usable})
    if len(histories) > 1:
        problems.append(f"segments of {len(histories)} different archive histories ({', '.join(histories)})")
        return RebuildPlan(topic=topic, queue_id=queue_id, manifest=None, problems=tuple(problems))
    if not usable:
        # Without any ConsumeQueue object, CommitLog and index objects are an
        # uncommitted first upload (the ConsumeQueue object is written last).
        return RebuildPlan(topic=topic, queue_id=queue_id, manifest=None, problems=tuple(problems))
    chain = _chain(usable)
    first, last = chain[0].segment, chain[-1].segment
    in_chain = {d.segment.consumequeue_key for d in chain}  # unique per segment in both layouts
    superseded = []
    for d in usable:
        s = d.segment
        if s.consumequeue_key in in_chain:
            continue
        if first.q_start <= s.q_start and s.q_end <= last.q_end and first.cl_start <= s.cl_start \
                and s.cl_end <= last.cl_end:
            superseded.append(layout.object_of(s.consumequeue_key))
        else:
            problems.append(f"{s.consumequeue_key}: segment [{s.q_start},{s.q_end}) does not continue "
                            f"the archive [{first.q_start},{last.q_end}) (a hole no recorded gap explains)")
    named = {k for d in descs for k in d.segment.keys()}
    problems += [f"{k}: lies before the archive's first segment and no descriptor names it"
                 for k in _loose(sizes, named, first)]
    gaps: tuple[Gap, ...] = tuple(g for d in chain for g in d.gaps_before)
    # a v2 segment's stored size is the object's, which its own descriptor cannot hold
    segments = tuple(replace(d.segment, stored_bytes=sizes.get(d.segment.keys()[0], 0)) if d.segment.layout == 2
                     else d.segment for d in chain)
    manifest = Manifest(topic=topic, queue_id=queue_id, next_offset=last.q_end, cl_next=last.cl_end,
                        segments=segments, gaps=gaps, history=histories[0])
    try:
        manifest.check()
    except ValueError as exc:
        problems.append(str(exc))
    return RebuildPlan(topic=topic, queue_id=queue_id, manifest=manifest, superseded=tuple(superseded),
                       problems=tuple(problems))


def _loose(sizes: dict[str, int], named: set[str], first: Segment) -> list[str]:
    """CommitLog and index objects no descriptor names that lie before the
    first adopted segment: history nothing describes. From the first segment
    on, such objects are superseded uploads (their range is covered by the
    chain) or uploads beyond its end whose commit never happened."""
    out = []
    for key in sorted(sizes):
        kind = key.rsplit("/", 2)[-2] if key.count("/") >= 2 else ""
        if kind not in ("commitlog", "index") or key in named:
            continue
        start = _range_start(key)
        if start is None or start < (first.cl_start if kind == "commitlog" else first.q_start):
            out.append(key)
    return out


def _range_start(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairReport:
    """What ``tiered repair`` found per queue ("topic/qid")."""

    adopted: dict[str, RebuildPlan]  # manifest rebuilt (or, dry run, rebuildable)
    problems: dict[str, tuple[str, ...]]  # could not be rebuilt: objects left as they are
    intact: int  # queues whose manifest is there and readable

    @property
    def ok(self) -> bool:
        return not self.problems


def queues_in(keys: list[str], prefix: str) -> set[tuple[str, int]]:
    """Every (topic, queue id) with a manifest or a data object under
    ``{prefix}/{topic}/{qid}/`` (a topic may be named like ``_catalog.json``)."""
    out = set()
    for key in keys:
        parts = key[len(prefix) + 1:].split("/") if key.startswith(prefix + "/") else []
        if len(parts) >= 3 and parts[1].isdigit() and parts[2] in ("commitlog", "consumequeue", "index",
                                                                    "manifest.json"):
            out.add((topic_of_dir(parts[0]), int(parts[1])))
        elif len(parts) >= 3 and parts[1].isdigit() and parts[2] == "segment":
            out.add((topic_of_dir(parts[0]), int(parts[1])))
    return out
