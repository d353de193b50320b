"""Restore a broker store directory from the archive (disaster recovery).

``restore`` writes, into an empty directory, what a RocketMQ broker loads as
its own store, following the broker's load rules (``DefaultMessageStore``
load/recover, ``ConsumeQueue.recover`` and ``correctMinOffset``):

- ``commitlog/{start:020d}``: files of exactly the configured size, named by
  their start byte. Full files end with the end-of-file filler; the last one
  is zeros after its last record, which is where the broker's recovery stops.
- The CommitLog starts above 0, at the first file boundary past the end of
  every archived record's original position. Two reasons: the broker's
  ``correctMinOffset`` skips the leading ConsumeQueue filler entries only
  because their CommitLog offset (0) is below the CommitLog's minimum; and
  messages the restored broker stores later get offset message ids that
  never collide with the ids of archived messages.
- Records go into the CommitLog in their original order across queues
  (merged by their original physical offset), so store times grow as the
  broker wrote them. Each record's bytes are the archived bytes except its
  physical offset (bytes 28..36), the one field naming its own position,
  which the broker also writes at append time. Queue offsets are preserved.
  A record several queues hold (a parent topic's and its LMQ queues',
  ``docs/lmq.md``) is written once, and each queue's entry points at it.
- ``consumequeue/{topic}/{qid}/{start:020d}``: files of exactly the
  ConsumeQueue file size, named by their start byte (a multiple of it). The
  first file begins with the broker's filler entries (offset 0, size
  2147483647, tags 0) up to the first restored queue offset, as the broker
  itself writes them (``fillPreBlank``). The tags code is the archived one.
  A recorded gap inside the restored range becomes filler entries too (a
  ConsumeQueue cannot have holes) and is reported.
- ``batchconsumequeue/{topic}/{qid}/{start:020d}``: a BatchCQ queue's
  46-byte entries (``tiered.ops.restorebatch``); its topic keeps
  ``"attributes":{"queue.type":"BatchCQ"}`` in topics.json.
- ``config/topics.json`` lists the restored topics (no LMQ queue: the broker
  never lists them).
- ``index/``: the broker's key and message-id index over the restored
  records (``tiered.store.indexfile``), sized as the broker is configured
  (``maxHashSlotNum``/``maxIndexNum``), and ``checkpoint`` with its
  ``indexMsgTimestamp`` at the last indexed store time: every restored index
  file is complete and synced, so the broker keeps them even after a crash
  (``IndexService.load`` drops files ending after that time). The broker does
  not rebuild an index on a normal start, so without these files its
  ``queryMessage`` by key or unique key finds nothing. A record several
  queues hold (LMQ) is indexed once, as the broker indexes each record.

The target must be empty (or absent): anything else is refused before a
byte is written. After writing, ``check`` reads the restored store back
through ``LocalStore`` and compares every record with the archive.
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tiered.format.codec import BLANK_LENGTH, CQ_ENTRY, CQ_ENTRY_SIZE, CQ_FILLER_SIZE, Record, decode_record, encode_blank, \
    entry_offset, entry_problem
from tiered.errors import CorruptRecordError, RestoreCheckError, TargetNotEmptyError, TieredError
from tiered.format.jsonfile import write_json
from tiered.format.lmq import is_lmq
from tiered.store.indexfile import DEFAULT_ENTRIES, DEFAULT_HASH_SLOTS, IndexWriter
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import Manifest
from tiered.query.batchread import is_batch
from tiered.query.reader import ColdReader, QueueRef, get_range
from tiered.ops.restorebatch import BatchQueueWriter, check_batch
from tiered.store.batchcq import BCQ_ENTRY_SIZE

log = logging.getLogger(__name__)

DEFAULT_COMMITLOG_FILE_SIZE = 1 << 30
DEFAULT_CQ_ENTRIES = 300_000
# The broker writes a record's physical offset at byte 28 (queue offset at 20).
_PHYS = struct.Struct(">q")
_PHYS_AT = 28
_BATCH_ENTRIES = 512
_BATCH_BYTES = 4 << 20
_FLUSH_BYTES = 8 << 20
_FILLER_ENTRY = CQ_ENTRY.pack(0, CQ_FILLER_SIZE, 0)
_CHECKPOINT_SIZE = 4096  # the broker maps one OS page
_CHECKPOINT_INDEX_AT = 16  # physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp, ...


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreOptions:
    commitlog_file_size: int = DEFAULT_COMMITLOG_FILE_SIZE
    cq_entries_per_file: int = DEFAULT_CQ_ENTRIES
    bcq_entries_per_file: int = DEFAULT_CQ_ENTRIES  # mapperFileSizeBatchConsumeQueue / 46
    topics: frozenset[str] | None = None  # None: every archived topic
    since_ms: int | None = None  # first record stored at or after
    until_ms: int | None = None  # last record stored at or before
    index: bool = True  # write index/ (the broker's messageIndexEnable)
    index_hash_slots: int = DEFAULT_HASH_SLOTS  # the broker's maxHashSlotNum
    index_entries: int = DEFAULT_ENTRIES  # the broker's maxIndexNum

    def __post_init__(self) -> None:
        if self.commitlog_file_size < 4096:
            raise ValueError("CommitLog files must hold at least 4096 bytes")
        if self.index_hash_slots < 1 or self.index_entries < 2:
            raise ValueError("an index file needs at least 1 hash slot and 2 entries")
        if self.cq_entries_per_file < 1 or self.bcq_entries_per_file < 1:
            raise ValueError("a ConsumeQueue file holds at least one entry")


@dataclass(frozen=True, kw_only=True, slots=True)
class QueuePlan:
    """Queue offsets [first, end) of one archived queue to restore."""

    ref: QueueRef
    manifest: Manifest
    first: int
    end: int
    last_original_end: int  # original CommitLog position after the queue's last restored record
    batch: bool = False  # a BatchCQ queue: offsets number its entries (tiered.ops.restorebatch)

    @property
    def gaps(self) -> list[tuple[int, int]]:
        """Recorded gaps inside [first, end), clipped."""
        return [(max(g.q_start, self.first), min(g.q_end, self.end)) for g in self.manifest.gaps
                if g.q_end > self.first and g.q_start < self.end]

    @property
    def messages(self) -> int:
        return self.end - self.first - sum(b - a for a, b in self.gaps)


@dataclass(frozen=True, kw_only=True, slots=True)
class RestorePlan:
    cluster: str
    broker: str
    queues: tuple[QueuePlan, ...]
    commitlog_start: int
    read_queue_nums: dict[str, int] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return sum(q.messages for q in self.queues)


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreResult:
    plan: RestorePlan
    messages: int
    nbytes: int
    commitlog_end: int
    filler_gaps: tuple[tuple[str, int, int, int], ...]  # (topic, queue, first, end) written as fillers
    index_files: tuple[str, ...] = ()  # names under index/
    index_entries: int = 0  # keys indexed


Progress = Callable[[int, int], None]  # (messages written so far, bytes written so far)


def check_target(target: Path) -> None:
    """Raise TargetNotEmptyError unless ``target`` is absent or an empty directory."""
    if not target.exists():
        return
    if not target.is_dir():
        raise TargetNotEmptyError(str(target), ["(a file, not a directory)"])
    entries = sorted(os.listdir(target))
    if entries:
        raise TargetNotEmptyError(str(target), entries)


def _select_broker(refs: list[QueueRef]) -> tuple[str, str]:
    brokers = sorted({(r.cluster, r.broker) for r in refs})
    if not brokers:
        raise TieredError("no archived queue matches (check --cold, --cluster, --broker and --topic)")
    if len(brokers) > 1:
        names = ", ".join(f"{c}/{b}" for c, b in brokers)
        raise TieredError(f"the archive holds several brokers ({names}): choose one with --cluster/--broker")
    return brokers[0]


def plan_restore(reader: ColdReader, options: RestoreOptions) -> RestorePlan:
    """Which offsets of which queues to restore, and where the CommitLog starts."""
    topics = options.topics
    refs = reader.archive.queues(topics=(lambda t: t in topics) if topics is not None else None)
    cluster, broker = _select_broker(refs)
    refs = [r for r in refs if (r.cluster, r.broker) == (cluster, broker)]
    manifests = reader.archive.manifests(refs)
    nums: dict[str, int] = {}
    plans: list[QueuePlan] = []
    for ref in refs:
        m = manifests.get(ref)
        if m is None or not m.segments:
            continue
        nums[ref.topic] = max(nums.get(ref.topic, 0), ref.queue_id + 1)
        # leading gaps are data the broker deleted before it was archived: start at the first record
        first = m.segments[0].q_start
        end = m.next_offset
        if options.since_ms is not None:
            first = max(first, reader.offset_for_time(ref, options.since_ms) or first)
        if options.until_ms is not None:
            end = min(end, reader.offset_for_time(ref, options.until_ms + 1) or 0)
        while end > first and m.segment_for(end - 1) is None:
            end -= 1  # never end on a gap: the last entry must point at a record
        if end <= first:
            continue
        batch = is_batch(m)
        res = reader.read(ref, end - 1, max_count=1)
        last = res.records[0] if res.records and res.next_offset == end else None
        if last is None or (entry_offset(last, ref.topic) != end - 1 and not batch):
            raise CorruptRecordError(f"{ref.prefix}/manifest.json", end - 1,
                                     "the archive's last record of the range cannot be read")
        plans.append(QueuePlan(ref=ref, manifest=m, first=first, end=end,
                               last_original_end=last.physical_offset + last.size, batch=batch))
    size = options.commitlog_file_size
    orig_end = max((p.last_original_end for p in plans), default=0)
    start = (orig_end // size + 1) * size
    return RestorePlan(cluster=cluster, broker=broker, queues=tuple(plans), commitlog_start=start,
                       read_queue_nums={t: n for t, n in nums.items() if any(p.ref.topic == t for p in plans)})


# --- reading the archive with the tags codes ----------------------------------------


def _archived(reader: ColdReader, plan: QueuePlan) -> Iterator[tuple[int, Record, int]]:
    """(queue offset, record, cold tags code) of ``plan``'s range in
    queue-offset order, checked as ``ColdReader`` checks them; gaps are
    simply absent. (An LMQ queue's records carry their parent's offsets; a
    BatchCQ queue's offsets number its entries, its records carry their
    first message's.)"""
    store = reader.store
    topic = plan.ref.topic.encode("utf-8")
    for seg in plan.manifest.segments:
        lo, hi = max(seg.q_start, plan.first), min(seg.q_end, plan.end)
        offset = lo
        while offset < hi:
            n = min(_BATCH_ENTRIES, hi - offset)
            first = (offset - seg.q_start) * CQ_ENTRY_SIZE
            cq = get_range(store, seg.consumequeue_key, first, first + n * CQ_ENTRY_SIZE, reader.stats)
            if len(cq) != n * CQ_ENTRY_SIZE:
                raise CorruptRecordError(seg.consumequeue_key, first + len(cq), "object shorter than its manifest says")
            entries = [CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE) for i in range(n)]
            total, keep = 0, 0
            for _, size, _ in entries:
                if keep and total + size > _BATCH_BYTES:
                    break
                total += size
                keep += 1
            entries = entries[:keep]
            cl_lo = entries[0][0] - seg.cl_start
            cl_hi = entries[-1][0] + entries[-1][1] - seg.cl_start
            if cl_lo < 0 or cl_hi > seg.nbytes or cl_hi - cl_lo != total:
                raise CorruptRecordError(seg.consumequeue_key, first, "entries do not tile the segment's CommitLog")
            cl = memoryview(get_range(store, seg.commitlog_key, cl_lo, cl_hi, reader.stats))
            if len(cl) != cl_hi - cl_lo:
                raise CorruptRecordError(seg.commitlog_key, cl_lo + len(cl), "object shorter than its manifest says")
            for i, (off, size, tags) in enumerate(entries):
                q = offset + i
                pos = off - seg.cl_start - cl_lo
                rec = decode_record(cl, pos, seg.commitlog_key)
                expect_at = q if not seg.batch else rec.queue_offset if \
                    (seg.msg_start or 0) <= rec.queue_offset < (seg.msg_end or 0) else -1
                if rec.size != size or entry_problem(rec, topic=topic, queue_id=plan.ref.queue_id,
                                                     queue_offset=expect_at):
                    raise CorruptRecordError(seg.commitlog_key, off - seg.cl_start,
                                             f"queue offset {q}: record does not match its cold ConsumeQueue entry")
                yield q, rec, tags
            offset += len(entries)


# --- writing the store ----------------------------------------------------------------


class _Files:
    """Preallocated files of one fixed size, written through buffered runs."""

    def __init__(self, file_size: int) -> None:
        self.file_size = file_size
        self._fd: int | None = None
        self._path: Path | None = None
        self._buf = bytearray()
        self._buf_at = 0  # position in the file of the buffer's first byte

    def open(self, path: Path, at: int) -> None:
        self.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, self.file_size)  # exactly the configured size: the broker refuses any other length
        self._fd, self._path, self._buf_at = fd, path, at

    def write(self, data: bytes | memoryview) -> None:
        self._buf += data
        if len(self._buf) >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._fd is not None and self._buf:
            os.pwrite(self._fd, self._buf, self._buf_at)
            self._buf_at += len(self._buf)
            self._buf.clear()

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
        self._fd = None


class _QueueWriter:
    """One restored ConsumeQueue, written in offset order."""

    def __init__(self, root: Path, topic: str, queue_id: int, cq_file_bytes: int, first: int) -> None:
        self.dir = root / "consumequeue" / topic / str(queue_id)
        self.files = _Files(cq_file_bytes)
        file_start = first * CQ_ENTRY_SIZE // cq_file_bytes * cq_file_bytes
        self.next = file_start // CQ_ENTRY_SIZE
        self._file_end = -1
        self._open_for(self.next)
        while self.next < first:  # the broker's fillPreBlank
            self.add(_FILLER_ENTRY)

    def _open_for(self, offset: int) -> None:
        start = offset * CQ_ENTRY_SIZE // self.files.file_size * self.files.file_size
        self.files.open(self.dir / f"{start:020d}", 0)
        self._file_end = start + self.files.file_size

    def add(self, entry: bytes) -> None:
        if self.next * CQ_ENTRY_SIZE >= self._file_end:
            self._open_for(self.next)
        self.files.write(entry)
        self.next += 1


class _CommitLogWriter:
    def __init__(self, root: Path, file_size: int, start: int) -> None:
        self.dir = root / "commitlog"
        self.files = _Files(file_size)
        self.position = start
        self.files.open(self.dir / f"{start:020d}", 0)

    def append(self, raw: memoryview) -> int:
        size = self.files.file_size
        rel = self.position % size
        if rel + len(raw) + BLANK_LENGTH > size:  # the broker keeps room for the filler
            self.files.write(encode_blank(size - rel))
            self.position += size - rel
            self.files.open(self.dir / f"{self.position:020d}", 0)
        phys = self.position
        data = bytearray(raw)
        _PHYS.pack_into(data, _PHYS_AT, phys)
        self.files.write(data)
        self.position += len(data)
        return phys


def _merged(reader: ColdReader, plan: RestorePlan) -> Iterator[tuple[int, int, Record, int]]:
    """(queue index, queue offset, record, tags code) of every queue, in
    original CommitLog order: a record several queues hold (a parent's and
    its LMQ queues') comes once per queue, one after the other."""
    iters = [_archived(reader, q) for q in plan.queues]
    heap: list[tuple[int, int, int, Record, int]] = []
    for i, it in enumerate(iters):
        nxt = next(it, None)
        if nxt is not None:
            heap.append((nxt[1].physical_offset, i, *nxt))
    heapq.heapify(heap)
    while heap:
        _, i, q, rec, tags = heap[0]
        yield i, q, rec, tags
        nxt = next(iters[i], None)
        if nxt is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (nxt[1].physical_offset, i, *nxt))


def write_store(reader: ColdReader, plan: RestorePlan, target: Path, options: RestoreOptions,
                progress: Progress | None = None) -> RestoreResult:
    """Write ``plan`` into ``target`` (checked empty first)."""
    check_target(target)
    target.mkdir(parents=True, exist_ok=True)
    cq_bytes = options.cq_entries_per_file * CQ_ENTRY_SIZE
    cl = _CommitLogWriter(target, options.commitlog_file_size, plan.commitlog_start)
    bcq_bytes = options.bcq_entries_per_file * BCQ_ENTRY_SIZE
    queues = [BatchQueueWriter(_Files(bcq_bytes), target, q.ref.topic, q.ref.queue_id, q.first) if q.batch else
              _QueueWriter(target, q.ref.topic, q.ref.queue_id, cq_bytes, q.first) for q in plan.queues]
    index = IndexWriter(target / "index", hash_slots=options.index_hash_slots,
                        entries=options.index_entries) if options.index else None
    fillers: list[tuple[str, int, int, int]] = []
    messages = nbytes = keys = 0
    copied = (-1, -1)  # (original, restored) physical offset of the last record written
    try:
        for i, offset, rec, tags in _merged(reader, plan):
            qw = queues[i]
            if offset > qw.next:  # a recorded gap: the broker's filler entries keep offsets in place
                q = plan.queues[i]
                fillers.append((q.ref.topic, q.ref.queue_id, qw.next, offset))
                log.warning("%s/%d: offsets %d..%d are a recorded gap in the archive; restored as filler entries "
                            "(the broker may report the minimum offset after them)",
                            q.ref.topic, q.ref.queue_id, qw.next, offset - 1)
                while isinstance(qw, _QueueWriter) and qw.next < offset:
                    qw.add(_FILLER_ENTRY)
            if rec.physical_offset == copied[0]:
                phys = copied[1]  # the same record through another queue (LMQ): written once, as the broker did
            else:
                phys = cl.append(rec.raw)
                copied = (rec.physical_offset, phys)
                nbytes += rec.size
                if index is not None:
                    keys += index.add(topic=rec.topic, properties=rec.properties, sys_flag=rec.sys_flag,
                                      phy=phys, store_ts=rec.store_timestamp)
            if isinstance(qw, BatchQueueWriter):
                qw.add_record(rec, phys, tags, offset)
            else:
                qw.add(CQ_ENTRY.pack(phys, rec.size, tags))
            messages += 1
            if progress is not None and messages % 1024 == 0:
                progress(messages, nbytes)
    finally:
        cl.files.close()
        for qw in queues:
            qw.files.close()
        written = index.close() if index is not None else []
    if progress is not None:
        progress(messages, nbytes)
    _write_topics(target, plan)
    _write_checkpoint(target, written[-1].header.end_timestamp if written else 0)
    return RestoreResult(plan=plan, messages=messages, nbytes=nbytes, commitlog_end=cl.position,
                         filler_gaps=tuple(fillers), index_files=tuple(f.path.name for f in written),
                         index_entries=keys)


def _write_checkpoint(target: Path, index_msg_timestamp: int) -> None:
    """``checkpoint`` as a new broker's (zeros: normal recovery, no confirmed
    offset) but for the index time, which keeps the restored index files."""
    data = bytearray(_CHECKPOINT_SIZE)
    struct.pack_into(">q", data, _CHECKPOINT_INDEX_AT, index_msg_timestamp)
    fd = os.open(target / "checkpoint", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_topics(target: Path, plan: RestorePlan) -> None:
    batch = {q.ref.topic for q in plan.queues if q.batch}
    table = {
        topic: {"topicName": topic, "readQueueNums": n, "writeQueueNums": n, "perm": 6,
                "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False,
                "attributes": {"queue.type": "BatchCQ"} if topic in batch else {}}
        for topic, n in sorted(plan.read_queue_nums.items())
        if not is_lmq(topic)  # the broker never lists LMQ queues there
    }
    write_json(target / "config" / "topics.json",
               {"topicConfigTable": table, "dataVersion": {"counter": len(table), "timestamp": int(time.time() * 1000)}})


# --- checking the result ------------------------------------------------------------


def check(reader: ColdReader, result: RestoreResult, target: Path) -> int:
    """Read the restored store back through ``LocalStore`` and compare it with
    the archive: per queue the offset range, and per record the bytes (with
    the physical offset masked) and the tags code. Returns records compared;
    raises RestoreCheckError naming the queue and offset of the first difference."""
    compared = 0
    filler = {(t, q): (a, b) for t, q, a, b in result.filler_gaps}
    with LocalStore(target) as local:
        for q in result.plan.queues:
            if q.batch:
                compared += check_batch(local, _archived(reader, q), q.ref.topic, q.ref.queue_id)
                continue
            name = f"{q.ref.topic}/{q.ref.queue_id}"
            rng = local.queue_range(q.ref.topic, q.ref.queue_id)
            if rng.max_offset != q.end or ((q.ref.topic, q.ref.queue_id) not in filler and rng.min_offset != q.first):
                raise RestoreCheckError(f"{name}: restored offsets {rng.min_offset}..{rng.max_offset}, "
                                        f"expected {q.first}..{q.end}")
            local_iter: Iterator | None = None
            expect = -1
            for offset, rec, tags in _archived(reader, q):
                if offset != expect:  # start, or after a gap
                    run_end = min([a for a, _ in q.gaps if a > offset] + [q.end])
                    local_iter = iter(local.iter_queue(q.ref.topic, q.ref.queue_id, offset,
                                                       max_count=run_end - offset))
                item = next(local_iter, None) if local_iter is not None else None
                if item is None or item.queue_offset != offset:
                    raise RestoreCheckError(f"{name}: offset {offset} missing from the restored store")
                mine = bytearray(item.record.raw)
                _PHYS.pack_into(mine, _PHYS_AT, rec.physical_offset)
                if mine != rec.raw or item.tags_code != tags:
                    raise RestoreCheckError(f"{name}: offset {offset}: restored record differs from the archive")
                expect = offset + 1
                compared += 1
    return compared


def restore(reader: ColdReader, target: Path, options: RestoreOptions,
            progress: Progress | None = None,
            planned: Callable[[RestorePlan], None] | None = None) -> tuple[RestoreResult, int]:
    """Plan, write, check: (result, records checked). Refuses a non-empty target first."""
    check_target(target)
    plan = plan_restore(reader, options)
    if planned is not None:
        planned(plan)
    result = write_store(reader, plan, target, options, progress)
    return result, check(reader, result, target)


__all__ = ["QueuePlan", "RestoreCheckError", "RestoreOptions", "RestorePlan", "RestoreResult",
           "TargetNotEmptyError", "check", "check_target", "plan_restore", "restore", "write_store"]
