"""Check the archive against the local store, byte for byte.

For every queue with a manifest: segments and gaps tile the archived range;
every segment's objects exist with the recorded checksums; every cold
ConsumeQueue entry points at a record that decodes, has the right topic,
queue id, queue offset and CRC, and the records tile the segment's cold
CommitLog bytes exactly; where the broker still has the record locally, the
archived bytes and tags code equal the local ones exactly; and no gap
recorded as expired covers a record the broker still has. Objects that no
manifest references are reported as orphans (not an error: the cleaner
collects them after a grace period).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from tiered.archive import segmeta
from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE, Record, crc32, decode_record, entry_problem
from tiered.format.innerbatch import batch_size
from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError, ExpiredLocallyError, NotWrittenYetError, TieredError
from tiered.format.keyindex import lookup
from tiered.store.localstore import LocalStore, QueuedRecord
from tiered.archive.manifest import CATALOG, IDENTITY, LEASE, MANIFEST, Manifest, Segment
from tiered.archive.rebuild import queues_in
from tiered.query.reader import list_dirs


@dataclass
class VerifyReport:
    queues: int = 0
    segments: int = 0
    records: int = 0
    compared_locally: int = 0
    expired_locally: int = 0
    gaps: int = 0
    problems: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    unarchived: dict[str, int] = field(default_factory=dict)  # not yet archived, within the max delay or not
    pending: dict[str, str] = field(default_factory=dict)  # overdue: older than the max delay, not archived
    within_delay: set[str] = field(default_factory=set)  # unarchived, the oldest younger than the max delay
    waiting_confirm: dict[str, int] = field(default_factory=dict)  # held at this confirm offset (controller mode)
    missing_prefix: str | None = None  # no archive at all under the prefix
    known_prefixes: list[str] = field(default_factory=list)  # the cluster/broker prefixes that do exist

    @property
    def ok(self) -> bool:
        return not self.problems and not self.pending and self.missing_prefix is None


def verify_segment(cold: ColdTier, m: Manifest, seg: Segment, report: VerifyReport,
                   local: LocalStore | None) -> None:
    where = f"{m.topic}/{m.queue_id} [{seg.q_start},{seg.q_end})"
    parts = _checked_parts(cold, m, seg, report, where)
    if parts is None:
        return
    ends = _verify_records(m, seg, parts, report, where, _local_records(local, m, seg))
    if ends is None:
        return
    expected_pos, next_msg = ends
    if next_msg is not None and next_msg != seg.msg_end:
        report.problems.append(f"{where}: records end at queue offset {next_msg}, the segment at {seg.msg_end}")
        return
    if expected_pos != seg.cl_end:
        report.problems.append(f"{where}: records end at cold CommitLog byte {expected_pos}, the segment at "
                               f"{seg.cl_end}")
        return
    if parts.index is not None and seg.index_key:
        try:
            lookup(parts.index, "", seg.index_key)
        except TieredError as exc:
            report.problems.append(f"{where}: key index: {exc}")


def _checked_parts(cold: ColdTier, m: Manifest, seg: Segment, report: VerifyReport,
                   where: str) -> segmeta.SegmentParts | None:
    """The segment's objects, read and held to the manifest's sizes and
    checksums; None (the problem reported) when they cannot be."""
    try:
        parts = segmeta.read_parts(cold.store, seg)  # either layout; a compressed v2 object is inflated
    except CorruptRecordError as exc:
        report.problems.append(f"{where}: {exc}")
        return None
    except TieredError as exc:
        report.problems.append(f"{m.topic}/{m.queue_id} segment {seg.q_start}-{seg.q_end}: {exc}")
        return None
    cl, cq, desc = parts.commitlog, parts.entries, parts.descriptor
    if len(cl) != seg.nbytes or crc32(cl) != seg.commitlog_crc:
        report.problems.append(f"{where}: {seg.commitlog_key} size/checksum differs from the manifest")
        return None
    if desc is not None and replace(desc.segment, bloom=seg.bloom, created_ms=seg.created_ms,
                                    stored_bytes=seg.stored_bytes) != seg:
        # reported, and the records are still compared: they say what differs
        report.problems.append(f"{where}: {parts.carrier} descriptor differs from the manifest")
    if len(cq) != seg.messages * CQ_ENTRY_SIZE or crc32(cq) != seg.consumequeue_crc:
        report.problems.append(f"{where}: {seg.consumequeue_key} size/checksum differs from the manifest")
        return None
    return parts


def _local_records(local: LocalStore | None, m: Manifest, seg: Segment) -> Iterator[QueuedRecord] | None:
    """The broker's own records of the segment's range, or None where it has none to read."""
    if local is None:
        return None
    try:
        return iter(local.iter_queue(m.topic, m.queue_id, seg.q_start, max_count=seg.messages))
    except TieredError:
        return None


def _verify_records(m: Manifest, seg: Segment, parts: segmeta.SegmentParts, report: VerifyReport, where: str,
                    local_iter: Iterator[QueuedRecord] | None) -> tuple[int, int | None] | None:
    """Every cold ConsumeQueue entry against the record it points at (and the
    broker's copy of it, while there is one): where the records end (cold
    CommitLog byte, next queue offset of a BatchCQ segment), or None once a
    problem is reported."""
    cq = parts.entries
    view = memoryview(parts.commitlog)
    topic_raw = m.topic.encode()
    expected_pos = seg.cl_start
    next_msg = seg.msg_start  # a BatchCQ segment: the queue offset its next record starts at
    for i in range(seg.messages):
        off, size, tags = CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE)
        q = seg.q_start + i
        if off != expected_pos:
            report.problems.append(f"{where}: entry {q} points at {off}, expected {expected_pos}")
            return None
        expected_pos += size
        try:
            rec = decode_record(view, off - seg.cl_start, seg.commitlog_key)
        except TieredError as exc:
            report.problems.append(f"{where}: offset {q}: {exc}")
            return None
        if rec.size != size or entry_problem(rec, topic=topic_raw, queue_id=m.queue_id,
                                             queue_offset=q if next_msg is None else next_msg):
            report.problems.append(f"{where}: offset {q}: record does not match its cold ConsumeQueue entry")
            return None
        if next_msg is not None:
            try:
                next_msg += batch_size(rec)
            except TieredError as exc:
                report.problems.append(f"{where}: offset {q}: {exc}")
                return None
        report.records += 1
        same, local_iter = _against_local(local_iter, q, rec, tags, report, where)
        if not same:
            return None
    return expected_pos, next_msg


def _against_local(local_iter: Iterator[QueuedRecord] | None, q: int, rec: Record, tags: int, report: VerifyReport,
                   where: str) -> tuple[bool, Iterator[QueuedRecord] | None]:
    """One archived record against the broker's copy: (False, _) when they
    differ (reported), else (True, the local records to go on with, None
    once there are no more)."""
    if local_iter is None:
        report.expired_locally += 1
        return True, None
    try:
        item = next(local_iter)
    except (StopIteration, ExpiredLocallyError):
        report.expired_locally += 1
        return True, None
    except TieredError as exc:
        report.problems.append(f"{where}: local read at {q}: {exc}")
        return True, None
    if item.queue_offset != q or item.record.raw != rec.raw:
        report.problems.append(f"{where}: offset {q}: archived bytes differ from the local record")
        return False, None
    if item.tags_code != tags:
        report.problems.append(f"{where}: offset {q}: cold ConsumeQueue tags code {tags} differs from the "
                               f"local {item.tags_code}")
        return False, None
    report.compared_locally += 1
    return True, local_iter


def verify_gaps(m: Manifest, report: VerifyReport, local: LocalStore) -> None:
    """A gap recorded as expired must really be gone locally: a local record
    inside it would be a hole in the archive, not a gap."""
    try:
        rng = local.queue_range(m.topic, m.queue_id)
    except (OSError, TieredError):
        return
    for gap in m.gaps:
        if gap.reason != "expired_locally" or rng.max_offset <= rng.min_offset:
            continue
        lo, hi = max(gap.q_start, rng.min_offset), min(gap.q_end, rng.max_offset)
        if lo < hi:
            report.problems.append(f"{m.topic}/{m.queue_id}: gap [{gap.q_start},{gap.q_end}) is recorded as expired "
                                   f"locally, but the local store still holds offsets [{lo},{hi})")


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingCheck:
    """What the dispatcher is responsible for: local records of an accepted
    topic stored more than ``max_delay_ms`` before ``now_ms`` must be archived."""

    accepts: Callable[[str], bool]
    max_delay_ms: int
    now_ms: int


def check_pending(manifests: dict[tuple[str, int], Manifest], local: LocalStore, check: PendingCheck,
                  report: VerifyReport) -> None:
    """Name every local queue holding records older than the max delay that the
    archive does not hold, whatever holds them back: no manifest, an archive
    ending before them, or (controller mode) a confirm offset below them. The
    oldest record is read past the confirm offset: its age is what counts."""
    mode = local.broker_mode()
    for topic in local.topics():
        if not check.accepts(topic):
            continue
        for qid in local.queue_ids(topic):
            m = manifests.get((topic, qid))
            where = f"{topic}/{qid}"
            try:
                rng = local.queue_range(topic, qid)
                start = max(m.next_offset, rng.min_offset) if m is not None else rng.min_offset
                if rng.max_offset <= start:
                    continue
                entry = local.entry_at(topic, qid, start)
                if entry is None:
                    continue  # its ConsumeQueue entry is not written yet
                oldest = local.read_at(entry[0], verify_crc=False)
            except NotWrittenYetError as exc:
                # still being written, unless a later entry exists: the broker writes records in
                # order and each entry after its record, so then it is lost, not late
                if local.entry_at(topic, qid, start + 1) is not None:
                    report.problems.append(f"{where}: its first unarchived record (offset {start}) is missing "
                                           f"while later ConsumeQueue entries exist: {exc}")
                continue
            except (OSError, TieredError) as exc:
                report.problems.append(f"{where}: local store unreadable at its first unarchived record: {exc}")
                continue
            held = mode.holds(entry[0], entry[1])
            if held and mode.confirm_offset is not None:
                report.waiting_confirm[where] = mode.confirm_offset
            age_ms = check.now_ms - oldest.store_timestamp
            if age_ms < check.max_delay_ms:
                report.within_delay.add(where)
                continue
            first, count, end = start, rng.max_offset - start, m.next_offset if m is not None else 0
            if local.is_batch(topic):  # offsets and counts of messages, not of BatchConsumeQueue entries
                first, count = _batch_pending(local, topic, qid, start)
                end = first
            if held:
                why = (f"waiting for the cluster to confirm: confirmed CommitLog offset {mode.confirm_offset}, "
                       f"the first record ends at {entry[0] + entry[1]}"
                       + (f" ({mode.problem})" if mode.problem else ""))
            else:
                why = "never archived (no manifest)" if m is None else f"archive ends at offset {end}"
            report.pending[where] = (
                f"{count} messages from offset {first} not archived, the oldest stored "
                f"{age_ms // 1000} s ago (max delay {check.max_delay_ms // 1000} s); {why}")


def _batch_pending(local: LocalStore, topic: str, qid: int, entry: int) -> tuple[int, int]:
    """(first queue offset, messages) of a BatchCQ queue from ``entry`` on."""
    unit = local.batch_entry(topic, qid, entry)
    end = local.batch_offset_range(topic, qid).max_offset
    return (end, 0) if unit is None else (unit.base_offset, end - unit.base_offset)


def verify(cold: ColdTier, local: LocalStore | None = None, *, orphans: bool = True,
           pending: PendingCheck | None = None, topics: Callable[[str], bool] | None = None,
           on_segment: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check every manifest of the prefix (found by a LIST, not the catalog)
    and, with ``local``, every archived record against the broker's; with
    ``pending`` also that nothing overdue is missing from the archive. A
    manifest that cannot be read is a problem of its queue, not a crash.
    ``topics`` keeps only the topics it accepts (orphans are then not
    looked for: they belong to no topic). ``on_segment(nbytes, total_bytes)``
    is called after each segment (a progress bar)."""
    report = VerifyReport()
    listing = cold.store.list_keys(cold.prefix + "/")
    if not listing:
        report.missing_prefix = cold.prefix
        report.known_prefixes = [f"{c}/{b}" for c in list_dirs(cold.store) for b in list_dirs(cold.store, c)]
    manifests: dict[tuple[str, int], Manifest] = {}
    for obj in listing:
        if not obj.key.endswith("/" + MANIFEST):
            continue
        queue = next(iter(queues_in([obj.key], cold.prefix)), None)
        try:
            # through the cold tier: a head's chunks are read and checked with it
            m = cold.fetch(*queue) if queue is not None else Manifest.from_bytes(cold.store.get(obj.key), obj.key)
        except TieredError as exc:
            report.problems.append(f"{obj.key}: {exc}")
            continue
        if m is None:
            continue  # deleted since the listing
        if topics is None or topics(m.topic):
            manifests[(m.topic, m.queue_id)] = m
    if topics is not None:
        orphans = False  # the caller's pending check filters its own topics
    total_bytes = sum(seg.nbytes for m in manifests.values() for seg in m.segments)
    for (topic, qid), m in sorted(manifests.items()):
        report.queues += 1
        try:
            m.check()
        except ValueError as exc:
            report.problems.append(str(exc))
            continue
        report.gaps += len(m.gaps)
        if local is not None:
            verify_gaps(m, report, local)
        for seg in m.segments:
            report.segments += 1
            verify_segment(cold, m, seg, report, local)
            if on_segment is not None:
                on_segment(seg.nbytes, total_bytes)
        if local is not None:
            try:
                ahead = local.max_offset(topic, qid) - m.next_offset
                if ahead > 0 and local.is_batch(topic):
                    ahead = _batch_pending(local, topic, qid, m.next_offset)[1]
            except (OSError, TieredError):
                ahead = 0
            if ahead > 0:
                report.unarchived[f"{topic}/{qid}"] = ahead
    if local is not None and pending is not None:
        check_pending(manifests, local, pending, report)
    if orphans:
        referenced = set()
        for m in manifests.values():
            referenced |= m.referenced_keys()
        for obj in listing:
            name = obj.key.rsplit("/", 1)[-1]
            if name in (MANIFEST, CATALOG, LEASE, IDENTITY):
                continue
            if obj.key not in referenced:
                report.orphans.append(obj.key)
    return report
