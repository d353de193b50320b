"""Reading the archive: a queue from an offset, by time, by key.

Everything here reads the object store only, never the broker's disk, so it
works from any machine that can reach the bucket.

- ``Archive`` finds the brokers under a cold-tier root (one delimiter listing
  per level, never a listing of the whole bucket), their catalogs (one GET
  per broker) and the queues' manifests (one GET per queue, cached).
- ``ColdReader.read`` returns records of one queue from a queue offset with at
  most two ranged GETs once the manifest is cached: the cold ConsumeQueue
  entries, then the cold CommitLog bytes they point at.
- ``ColdReader.offset_for_time``: the first queue offset whose store time is
  >= T: the manifest's per-segment time ranges pick the segment, a binary
  search over its records (ranged GETs of one record header each) the offset.
  Store times grow with queue offsets (the broker stamps them in append
  order); after a broker clock step back the answer is one such offset, as
  with RocketMQ's own ``searchOffset``.
- ``ColdReader.find_key`` looks a ``KEYS`` entry or ``UNIQ_KEY`` up: a
  segment whose bloom filter (in the manifest) rules the key out is never
  read; one with a key index costs the index and the candidate records; an
  older segment without an index is scanned.

Corrupt data raises ``CorruptRecordError`` naming the object and the byte
offset in it; with ``skip_corrupt`` the bad record (or, when a ConsumeQueue
object is unusable, the rest of its range) is skipped and counted in
``skipped``.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE, CQ_FILLER_SIZE, MAGIC_V1, MAGIC_V2, MIN_RECORD_SIZE, Record, \
    decode_record, entry_offset, entry_problem
from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError, ObjectNotFoundError, StorageError, TieredError
from tiered.format.innerbatch import inner_records
from tiered.format.keyindex import bloom_may_contain, lookup
from tiered.archive.layout import read_part, read_range
from tiered.archive.manifest import CATALOG, LEASE, MANIFEST, Catalog, Gap, Manifest, Segment, queue_prefix, topic_of_dir
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)

# A record header up to the store timestamp, with an IPv6 born host.
PROBE_BYTES = 76
_PROBE_HEAD = struct.Struct(">iI28xi")  # size, magic, ..., sys flag at 36
_I64 = struct.Struct(">q")


@dataclass(frozen=True, order=True)
class QueueRef:
    """One archived queue: (cluster, broker, topic, queue id)."""

    cluster: str
    broker: str
    topic: str
    queue_id: int

    @property
    def prefix(self) -> str:
        return queue_prefix(self.cluster, self.broker, self.topic, self.queue_id)

    def __str__(self) -> str:
        return f"{self.cluster}/{self.broker}/{self.topic}/{self.queue_id}"


@dataclass
class ReadStats:
    """Object-store reads made by a reader (requests and bytes), by kind."""

    gets: int = 0
    bytes: int = 0
    keys: list[str] = field(default_factory=list)
    record_keys: bool = False

    def add(self, key: str, nbytes: int) -> None:
        self.gets += 1
        self.bytes += nbytes
        if self.record_keys:
            self.keys.append(key)


def get_range(store: ObjectStore, key: str, start: int, end: int, stats: ReadStats | None) -> bytes:
    data = read_range(store, key, start, end)  # a v1 object or a v2 section alike
    if stats is not None and end > start:
        stats.add(key, len(data))
    return data


def get_object(store: ObjectStore, key: str, stats: ReadStats | None) -> bytes:
    data = read_part(store, key)
    if stats is not None:
        stats.add(key, len(data))
    return data


# --- finding brokers --------------------------------------------------------------


def list_dirs(store: ObjectStore, prefix: str = "") -> list[str]:
    """Names of the "directories" right under ``prefix`` (``ObjectStore.list_dirs``:
    one delimiter listing, never a recursive one)."""
    return store.list_dirs(prefix)


def discover(store: ObjectStore, cluster: str | None = None, broker: str | None = None) -> list[tuple[str, str]]:
    """Every (cluster, broker) under the root holding an archive (a catalog,
    or a lease left by a sidecar that has not completed a round yet)."""
    clusters = [cluster] if cluster else list_dirs(store)
    found: list[tuple[str, str]] = []
    for c in clusters:
        brokers = [broker] if broker else list_dirs(store, c)
        for b in brokers:
            if broker or store.head(f"{c}/{b}/{CATALOG}") is not None or store.head(f"{c}/{b}/{LEASE}") is not None:
                found.append((c, b))
    return found


class Archive:
    """Catalogs and manifests of the brokers under one cold-tier root, read
    on demand and cached (a reader's view: nothing is written)."""

    def __init__(self, store: ObjectStore, *, cluster: str | None = None, broker: str | None = None,
                 brokers: Iterable[tuple[str, str]] | None = None, parallelism: int = 16,
                 stats: ReadStats | None = None, skip_corrupt: bool = False) -> None:
        self.store = store
        self.skip_corrupt = skip_corrupt  # an unreadable manifest leaves its queue out (logged)
        self.cluster = cluster
        self.broker = broker
        self._brokers = list(brokers) if brokers is not None else None
        self.parallelism = parallelism
        self.stats = stats
        self._tiers: dict[tuple[str, str], ColdTier] = {}
        self._catalogs: dict[tuple[str, str], Catalog | None] = {}
        self._manifests: dict[QueueRef, Manifest | None] = {}

    @property
    def brokers(self) -> list[tuple[str, str]]:
        if self._brokers is None:
            self._brokers = discover(self.store, self.cluster, self.broker)
        return self._brokers

    def tier(self, cluster: str, broker: str) -> ColdTier:
        key = (cluster, broker)
        if key not in self._tiers:
            self._tiers[key] = ColdTier(self.store, cluster, broker)
        return self._tiers[key]

    def catalog(self, cluster: str, broker: str) -> Catalog | None:
        """The broker's catalog; None when it has none (or it is unreadable:
        the manifests are the truth, the catalog only a hint)."""
        key = (cluster, broker)
        if key not in self._catalogs:
            try:
                cat = self.tier(cluster, broker).read_catalog()
                if self.stats is not None:
                    self.stats.add(f"{cluster}/{broker}/{CATALOG}", 0)
            except ObjectNotFoundError:
                cat = None
            except CorruptRecordError as exc:
                log.warning("catalog unusable, listing manifests instead: %s", exc)
                cat = None
            self._catalogs[key] = cat
        return self._catalogs[key]

    def queues(self, topics: Callable[[str], bool] | None = None,
               queue_ids: Callable[[int], bool] | None = None,
               brokers: Callable[[str, str], bool] | None = None) -> list[QueueRef]:
        """Archived queues (from the catalogs; a broker without one is listed)."""
        out: list[QueueRef] = []
        for c, b in self.brokers:
            if brokers is not None and not brokers(c, b):
                continue
            cat = self.catalog(c, b)
            if cat is not None:
                names = [(q.topic, q.queue_id) for q in cat.queues]
            else:
                log.warning("%s/%s has no readable catalog: listing its manifests", c, b)
                names = []
                for o in self.store.list_keys(f"{c}/{b}/"):
                    parts = o.key.split("/")
                    if len(parts) == 5 and parts[4] == MANIFEST and parts[3].lstrip("-").isdigit():
                        names.append((topic_of_dir(parts[2]), int(parts[3])))
            for topic, qid in names:
                if (topics is None or topics(topic)) and (queue_ids is None or queue_ids(qid)):
                    out.append(QueueRef(c, b, topic, qid))
        return sorted(out)

    def catalog_entry(self, ref: QueueRef) -> Any:
        cat = self._catalogs.get((ref.cluster, ref.broker))
        if cat is None:
            return None
        return next((q for q in cat.queues if q.topic == ref.topic and q.queue_id == ref.queue_id), None)

    def _fetch(self, ref: QueueRef) -> Manifest | None:
        try:
            return self.tier(ref.cluster, ref.broker).fetch(ref.topic, ref.queue_id)
        except CorruptRecordError as exc:
            if not self.skip_corrupt:
                raise
            log.error("queue %s left out: its manifest is unreadable: %s", ref, exc)
            return None

    def manifest(self, ref: QueueRef) -> Manifest | None:
        if ref not in self._manifests:
            m = self._fetch(ref)
            if self.stats is not None:
                self.stats.add(f"{ref.prefix}/{MANIFEST}", 0)
            self._manifests[ref] = m
        return self._manifests[ref]

    def manifests(self, refs: Iterable[QueueRef]) -> dict[QueueRef, Manifest]:
        """Manifests of ``refs`` (fetched in parallel; queues without one left out)."""
        refs = list(refs)
        missing = [r for r in refs if r not in self._manifests]
        if len(missing) > 1 and self.parallelism > 1:
            # one ColdTier per broker is not thread-safe for writes, but fetch only
            # replaces dict entries: build the tiers first, then fetch concurrently
            for r in missing:
                self.tier(r.cluster, r.broker)
            with ThreadPoolExecutor(min(self.parallelism, len(missing))) as pool:
                for r, m in zip(missing, pool.map(self._fetch, missing)):
                    self._manifests[r] = m
                    if self.stats is not None:
                        self.stats.add(f"{r.prefix}/{MANIFEST}", 0)
        return {r: m for r in refs if (m := self.manifest(r)) is not None}

    def forget(self) -> None:
        """Drop cached catalogs and manifests (the next read fetches them again)."""
        self._catalogs.clear()
        self._manifests.clear()
        self._tiers.clear()


# --- reading one queue --------------------------------------------------------------


class ReadStatus(str, Enum):
    FOUND = "found"
    NO_SUCH_QUEUE = "no_such_queue"
    OFFSET_TOO_SMALL = "offset_too_small"  # expired from the archive: next_offset is the first kept
    OFFSET_IN_GAP = "offset_in_gap"  # never archived (recorded gap): next_offset is after it
    NO_NEW_MESSAGE = "no_new_message"  # at or past the end of the archive


@dataclass
class ReadResult:
    status: ReadStatus
    records: list[Record]
    next_offset: int
    gap: Gap | None = None


def parse_entries_py(cq: bytes) -> list[tuple[int, int, int]]:
    return list(CQ_ENTRY.iter_unpack(cq))


def probe_store_ms(store: ObjectStore, seg: Segment, cl_offset: int, stats: ReadStats | None) -> int:
    """The store timestamp of the record at cold CommitLog ``cl_offset`` (one
    ranged GET of its header)."""
    pos = cl_offset - seg.cl_start
    data = get_range(store, seg.commitlog_key, pos, min(pos + PROBE_BYTES, seg.nbytes), stats)
    if len(data) < 64:
        raise CorruptRecordError(seg.commitlog_key, pos, "record header beyond the end of the object")
    size, magic, sys_flag = _PROBE_HEAD.unpack_from(data, 0)
    if magic not in (MAGIC_V1, MAGIC_V2) or size < MIN_RECORD_SIZE:
        raise CorruptRecordError(seg.commitlog_key, pos, f"no record header here (magic 0x{magic:08X})")
    at = 68 if sys_flag & 0x10 else 56
    if len(data) < at + 8:
        raise CorruptRecordError(seg.commitlog_key, pos, "record header beyond the end of the object")
    return _I64.unpack_from(data, at)[0]


def first_at_or_after(n: int, ts_of: Callable[[int], int], target: int) -> int:
    """Smallest i in [0, n) with ts_of(i) >= target (n if none): a binary
    search, assuming times grow with i."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if ts_of(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


class ColdReader:
    """Reads archived records of any queue under a cold-tier root.

    Not thread-safe (one per thread); cheap to create.
    """

    def __init__(self, store: ObjectStore, *, cluster: str | None = None, broker: str | None = None,
                 archive: Archive | None = None, verify_crc: bool = True, skip_corrupt: bool = False,
                 stats: ReadStats | None = None) -> None:
        self.store = store
        self.stats = stats if stats is not None else ReadStats()
        self.archive = archive or Archive(store, cluster=cluster, broker=broker, stats=self.stats,
                                          skip_corrupt=skip_corrupt)
        self.verify_crc = verify_crc
        self.skip_corrupt = skip_corrupt
        self.skipped = 0
        self.problems: list[str] = []

    # --- corruption policy -------------------------------------------------------

    def _skip(self, exc: TieredError, count: int) -> None:
        if not self.skip_corrupt:
            raise exc
        self.skipped += count
        self.problems.append(str(exc))
        log.warning("skipped %d corrupt or missing archived records: %s", count, exc)

    # --- queue reads --------------------------------------------------------------

    def queue(self, topic: str, queue_id: int) -> QueueRef | None:
        """The queue (topic, queue_id) under the root; an error when several
        brokers have one (name the broker)."""
        refs = [QueueRef(c, b, topic, queue_id) for c, b in self.archive.brokers]
        found = [r for r in refs if self.archive.manifest(r) is not None]
        if len(found) > 1:
            names = ", ".join(f"{r.cluster}/{r.broker}" for r in found)
            raise TieredError(f"{topic}/{queue_id} is archived by several brokers ({names}): choose one with --broker")
        return found[0] if found else None

    def read(self, ref: QueueRef, offset: int, *, max_count: int = 32, max_bytes: int = 4 << 20) -> ReadResult:
        """Records of ``ref`` from queue ``offset``, within one segment: at most
        ``max_count`` records and about ``max_bytes`` (always at least one).
        Two ranged GETs once the manifest is cached."""
        m = self.archive.manifest(ref)
        if m is None:
            return ReadResult(ReadStatus.NO_SUCH_QUEUE, [], offset)
        seg = m.segment_for(offset)
        if seg is None:
            if offset >= m.next_offset:
                return ReadResult(ReadStatus.NO_NEW_MESSAGE, [], m.next_offset)
            gap = next((g for g in m.gaps if g.q_start <= offset < g.q_end), None)
            if gap is not None:
                return ReadResult(ReadStatus.OFFSET_IN_GAP, [], gap.q_end, gap)
            later = [s.q_start for s in m.segments if s.q_start > offset] + \
                    [g.q_start for g in m.gaps if g.q_start > offset]
            return ReadResult(ReadStatus.OFFSET_TOO_SMALL, [], min(later, default=m.next_offset))
        count = max(1, min(max_count, seg.q_end - offset))
        records, covered = self._read_segment(ref, seg, offset, count, max_bytes)
        return ReadResult(ReadStatus.FOUND, records, offset + covered)

    def _read_segment(self, ref: QueueRef, seg: Segment, offset: int, count: int,
                      max_bytes: int) -> tuple[list[Record], int]:
        """(records, how many offsets they cover): skipped records count as covered."""
        first = (offset - seg.q_start) * CQ_ENTRY_SIZE
        try:
            cq = get_range(self.store, seg.consumequeue_key, first, first + count * CQ_ENTRY_SIZE, self.stats)
            if len(cq) != count * CQ_ENTRY_SIZE:
                raise CorruptRecordError(seg.consumequeue_key, first + len(cq),
                                         f"object shorter than its manifest says ({seg.messages} entries)")
            entries = parse_entries_py(cq)
            # fit max_bytes (at least one record)
            total = 0
            keep = 0
            for _, size, _ in entries:
                if keep and total + size > max_bytes:
                    break
                total += size
                keep += 1
            entries = entries[:keep]
            expect = entries[0][0]
            for i, (off, size, _) in enumerate(entries):
                if off != expect or size < MIN_RECORD_SIZE or size == CQ_FILLER_SIZE or off + size > seg.cl_end \
                        or off < seg.cl_start:
                    raise CorruptRecordError(seg.consumequeue_key, first + i * CQ_ENTRY_SIZE,
                                             f"entry for queue offset {offset + i} points at {off} size {size}")
                expect = off + size
            lo = entries[0][0] - seg.cl_start
            hi = expect - seg.cl_start
            cl = get_range(self.store, seg.commitlog_key, lo, hi, self.stats)
            if len(cl) != hi - lo:
                raise CorruptRecordError(seg.commitlog_key, lo + len(cl),
                                         f"object shorter than its manifest says ({seg.nbytes} bytes)")
        except (CorruptRecordError, StorageError) as exc:
            self._skip(exc, count)
            return [], count
        view = memoryview(cl)
        topic = ref.topic.encode("utf-8")
        out: list[Record] = []
        for i, (off, size, _) in enumerate(entries):
            q = offset + i
            pos = off - seg.cl_start - lo
            try:
                rec = decode_record(view, pos, seg.commitlog_key, verify_crc=self.verify_crc)
                problem = None
                if rec.size != size:
                    problem = f"total size {rec.size} != ConsumeQueue size {size}"
                else:
                    # a BatchCQ record's queue offset is its first message's, inside the segment's range
                    at = q if not seg.batch else rec.queue_offset if \
                        (seg.msg_start or 0) <= rec.queue_offset < (seg.msg_end or 0) else -1
                    problem = entry_problem(rec, topic=topic, queue_id=ref.queue_id, queue_offset=at)
                if problem:
                    raise CorruptRecordError(seg.commitlog_key, pos, problem)
            except CorruptRecordError as exc:
                self._skip(CorruptRecordError(seg.commitlog_key, exc.offset + lo,
                                              f"queue offset {q}: {exc.reason}"), 1)
                continue
            except TieredError as exc:  # NotWrittenYetError: zeros inside a sealed object
                self._skip(CorruptRecordError(seg.commitlog_key, off - seg.cl_start,
                                              f"queue offset {q}: {exc}"), 1)
                continue
            rec.position = off - seg.cl_start  # position in the object, for messages
            out.append(rec)
        return out, len(entries)

    def iter_queue(self, ref: QueueRef, offset: int, count: int | None = None, *,
                   batch: int = 256) -> Iterator[Record]:
        """Records of ``ref`` from ``offset`` on (across segments, over gaps),
        at most ``count``."""
        left = count
        while left is None or left > 0:
            n = batch if left is None else min(batch, left)
            res = self.read(ref, offset, max_count=n)
            if res.status is ReadStatus.NO_SUCH_QUEUE or res.status is ReadStatus.NO_NEW_MESSAGE:
                return
            if res.status is ReadStatus.OFFSET_TOO_SMALL or res.status is ReadStatus.OFFSET_IN_GAP:
                offset = res.next_offset
                continue
            for rec in res.records:
                yield rec
                if left is not None:
                    left -= 1
            offset = res.next_offset

    # --- by time --------------------------------------------------------------------

    def offset_for_time(self, ref: QueueRef, timestamp_ms: int) -> int | None:
        """The first queue offset whose store time is >= ``timestamp_ms``; the
        archive's end (``next_offset``) when every record is older; None for an
        unknown queue."""
        m = self.archive.manifest(ref)
        if m is None:
            return None
        for seg in m.segments:
            if seg.max_store_ms < timestamp_ms:
                continue
            if seg.min_store_ms >= timestamp_ms:
                return seg.q_start
            return self._search_segment(seg, timestamp_ms)
        return m.next_offset

    def _search_segment(self, seg: Segment, timestamp_ms: int) -> int:
        cq = get_object(self.store, seg.consumequeue_key, self.stats)
        if len(cq) < seg.messages * CQ_ENTRY_SIZE:  # entries, then the segment descriptor
            raise CorruptRecordError(seg.consumequeue_key, len(cq),
                                     f"object of {len(cq)} bytes, manifest says {seg.messages} entries")
        cache: dict[int, int] = {}

        def ts_of(i: int) -> int:
            if i not in cache:
                off = CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE)[0]
                cache[i] = probe_store_ms(self.store, seg, off, self.stats)
            return cache[i]

        return seg.q_start + first_at_or_after(seg.messages, ts_of, timestamp_ms)

    # --- by key ---------------------------------------------------------------------

    def find_key(self, key: str, *, topics: Callable[[str], bool] | None = None,
                 refs: Iterable[QueueRef] | None = None) -> Iterator[tuple[QueueRef, Record]]:
        """Records whose ``KEYS`` hold ``key`` or whose ``UNIQ_KEY`` is ``key``, in
        queue order per queue. Reads only the segments that may hold it."""
        refs = list(refs) if refs is not None else self.archive.queues(topics)
        manifests = self.archive.manifests(refs)
        for ref in refs:
            m = manifests.get(ref)
            if m is None:
                continue
            for seg in m.segments:
                if seg.bloom and not bloom_may_contain(seg.bloom, key):
                    continue
                if seg.index_key:
                    yield from ((ref, r) for r in self._indexed(ref, seg, key))
                else:
                    yield from ((ref, r) for r in self._scan_for_key(ref, seg, key))

    @staticmethod
    def _has_key(rec: Record, key: str) -> bool:
        return rec.unique_key == key or key in rec.keys

    def _indexed(self, ref: QueueRef, seg: Segment, key: str) -> Iterator[Record]:
        assert seg.index_key is not None
        try:
            index = get_object(self.store, seg.index_key, self.stats)
            offsets = sorted(set(lookup(index, key, seg.index_key)))
        except (CorruptRecordError, StorageError) as exc:
            log.warning("key index unusable, scanning the segment instead: %s", exc)
            yield from self._scan_for_key(ref, seg, key)
            return
        i = 0
        while i < len(offsets):
            # candidates close together come in one read
            j = i
            while j + 1 < len(offsets) and offsets[j + 1] - offsets[i] < 64:
                j += 1
            start, count = offsets[i], offsets[j] - offsets[i] + 1
            if seg.q_start <= start and start + count <= seg.q_end:
                wanted = set(offsets[i:j + 1])
                for rec in self._read_segment(ref, seg, start, count, 1 << 62)[0]:
                    if seg.batch:  # the index names records; a batch's key is one of its messages'
                        yield from (msg for msg in inner_records(rec) if self._has_key(msg, key))
                    elif entry_offset(rec, ref.topic) in wanted and self._has_key(rec, key):
                        yield rec
            i = j + 1

    def _scan_for_key(self, ref: QueueRef, seg: Segment, key: str) -> Iterator[Record]:
        for rec in self._read_segment(ref, seg, seg.q_start, seg.messages, 1 << 62)[0]:
            for msg in inner_records(rec) if seg.batch else (rec,):
                if self._has_key(msg, key):
                    yield msg

