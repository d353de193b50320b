"""Per-queue status: what is on local disk, what is archived, the lag."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from tiered.archive.coldtier import ColdTier
from tiered.archive.layout import compressed
from tiered.archive.manifest import Manifest
from tiered.errors import CorruptRecordError, StoreBehindError, TieredError
from tiered.query.batchread import is_batch, message_bounds
from tiered.store.brokermode import BrokerMode
from tiered.store.localstore import LocalStore


@dataclass(frozen=True, kw_only=True)
class QueueStatus:
    topic: str
    queue_id: int
    local_min_offset: int | None
    local_max_offset: int | None
    archived_first_offset: int | None
    archived_next_offset: int | None
    lag_messages: int | None
    oldest_archived_ms: int | None
    newest_archived_ms: int | None
    segments: int
    nbytes: int
    gaps: int
    problem: str | None = None  # why the queue is not archiving (its manifest cannot be read...)
    # record bytes per stored byte (layout v2 segments; > 1 with zstd); None: not recorded
    compression_ratio: float | None = None
    # store time of the oldest record waiting to be archived (None: no lag, or unreadable)
    pending_since_ms: int | None = None
    # the codec of the compressed segment objects ("zstd"), and record bytes
    # per stored byte over those objects only; None: no object is compressed
    compression: str | None = None
    compressed_ratio: float | None = None
    # the confirm offset (controller mode) the queue's next record ends past: it waits for the cluster
    waiting_confirm_offset: int | None = None
    # a BatchCQ queue: offsets and lag count messages, as RocketMQ does (docs/batchcq.md)
    batch: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_status(cold: ColdTier, local: LocalStore | None = None,
                 accepts: Callable[[str], bool] | None = None) -> list[QueueStatus]:
    """Rows for every queue archived or (with ``local``) present locally.

    ``accepts`` is the dispatcher's topic filter: a local queue of a topic it
    excludes (``SCHEDULE_TOPIC_XXXX`` by default) is nobody's lag and gets no
    row; one archived before it was excluded keeps its archived columns,
    with no lag and no problem.

    Reads the manifests through ``cold`` (fetched if not cached), the
    local ConsumeQueues and, of a queue with a lag, its first waiting record
    (its store time is the lag's age); never archived data.
    """
    if not cold.manifests():
        cold.rebuild(use_catalog=False)
    manifests = cold.manifests()
    keys = set(manifests) | set(cold.broken)
    mode = local.broker_mode() if local is not None else None
    if local is not None:
        keys.update(k for k in local.queues() if accepts is None or accepts(k[0]))
    rows = []
    for topic, qid in sorted(keys):
        m = manifests.get((topic, qid))
        watched = accepts is None or accepts(topic)
        lmin = lmax = None
        if local is not None:
            try:
                rng = local.queue_range(topic, qid)
                lmin, lmax = rng.min_offset, rng.max_offset
            except (OSError, TieredError):
                pass
        lag = pending_since = waiting_at = None
        problem = f"manifest unreadable: {cold.broken[(topic, qid)]}" if (topic, qid) in cold.broken else None
        if lmax is not None and local is not None and watched:
            nxt = max(m.next_offset, lmin or 0) if m else (lmin or 0)
            lag = max(0, lmax - nxt)
            if problem is None and m is not None and lmax < m.next_offset:
                problem = str(StoreBehindError(topic, qid, lmax, m.next_offset))
            elif problem is None and (lag or local.truncated(topic, qid)):
                problem = _local_problem(local, topic, qid, nxt)
            if lag:
                pending_since = _store_ms(local, topic, qid, nxt)
            if lag and mode is not None and (waiting := waits_for_confirm(local, mode, topic, qid, nxt)) is not None:
                waiting_at = waiting
                if problem is None and mode.problem is not None:
                    problem = f"waits for the cluster to confirm: {mode.problem}"
        codec, ratio = _compression(m)
        row = QueueStatus(
            topic=topic, queue_id=qid, local_min_offset=lmin, local_max_offset=lmax,
            archived_first_offset=m.first_offset if m else None, archived_next_offset=m.next_offset if m else None,
            lag_messages=lag, oldest_archived_ms=m.min_store_ms if m else None,
            newest_archived_ms=m.max_store_ms if m else None, segments=len(m.segments) if m else 0,
            nbytes=m.nbytes if m else 0, gaps=len(m.gaps) if m else 0, problem=problem, compression_ratio=m.compression_ratio if m else None,
            pending_since_ms=pending_since, compression=codec, compressed_ratio=ratio,
            waiting_confirm_offset=waiting_at,
        )
        if is_batch(m) or (local is not None and local.is_batch(topic)):
            row = _in_messages(row, m, local)
        rows.append(row)
    return rows


def _in_messages(row: QueueStatus, m: Manifest | None, local: LocalStore | None) -> QueueStatus:
    """A BatchCQ queue's row in message offsets: its entries' base offsets
    and batch sizes (local), its segments' message ranges (archived)."""
    first = nxt = lmin = lmax = lag = None
    if m is not None and is_batch(m):
        first, nxt = message_bounds(m)
    if local is not None and row.local_max_offset is not None:
        try:
            rng = local.batch_offset_range(row.topic, row.queue_id)
            lmin, lmax = rng.min_offset, rng.max_offset
            if row.lag_messages is not None:
                pending = local.batch_entry(row.topic, row.queue_id, max(row.archived_next_offset or 0,
                                                                         row.local_min_offset or 0))
                lag = 0 if pending is None else max(0, lmax - pending.base_offset)
        except (OSError, TieredError):
            pass
    return replace(row, local_min_offset=lmin, local_max_offset=lmax, archived_first_offset=first,
                   archived_next_offset=nxt, lag_messages=lag, batch=True)


def _store_ms(local: LocalStore, topic: str, qid: int, offset: int) -> int | None:
    """The store time of the queue's record at ``offset``; None when unreadable."""
    try:
        for item in local.iter_queue(topic, qid, offset, max_count=1, verify_crc=False):
            return item.record.store_timestamp
    except (OSError, TieredError):
        return None
    return None


def _compression(m: Manifest | None) -> tuple[str | None, float | None]:
    """("zstd", record bytes per stored byte) over the compressed segment
    objects; (None, None) when none is. Uncompressed v2 objects are larger
    than their records (key index, descriptor): no compression to show."""
    packed = [s for s in (m.segments if m else ()) if compressed(s.commitlog_key.partition("#")[0])]
    stored = sum(s.stored_bytes for s in packed if s.stored_bytes)
    if not packed:
        return None, None
    return "zstd", (sum(s.nbytes for s in packed if s.stored_bytes) / stored if stored else None)


def waits_for_confirm(local: LocalStore, mode: BrokerMode, topic: str, qid: int, offset: int) -> int | None:
    """The confirm offset when the record at queue ``offset`` ends past it
    (controller mode): the queue waits for the cluster, not on its data."""
    if mode.confirm_offset is None:
        return None
    entry = local.entry_at(topic, qid, offset)
    return mode.confirm_offset if entry is not None and mode.holds(entry[0], entry[1]) else None


def _local_problem(local: LocalStore, topic: str, qid: int, offset: int) -> str | None:
    """Why the queue cannot move past ``offset`` when that is corrupt local
    data (the ConsumeQueue, or the first pending record): what the dispatcher
    stops on, named with file and offset."""
    stuck = local.why_stopped(topic, qid, offset)
    if stuck is None:
        try:
            # two entries: a record missing while a later entry exists is corruption, not a tail
            for _item in local.iter_queue(topic, qid, offset, max_count=2, verify_crc=False):
                break
        except CorruptRecordError as exc:
            stuck = exc
        except (OSError, TieredError):
            return None
    return None if stuck is None else f"corrupt local data: {stuck}"


@dataclass(frozen=True, kw_only=True)
class TopicNote:
    """Why a topic is archived or not, for a broker topic or one the config leaves out."""

    topic: str
    archived: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "topic", **asdict(self)}

    def line(self) -> str:
        return f"{'ARCHIVED' if self.archived else 'EXCLUDED'} {self.topic}: {self.reason}"


class _Verdict(Protocol):  # dispatcher.filters.TopicVerdict
    @property
    def archived(self) -> bool: ...

    @property
    def reason(self) -> str | None: ...


def topic_notes(topics: Iterable[str], verdict: Callable[[str], _Verdict]) -> list[TopicNote]:
    """A note per topic with a reason to tell (``TopicFilter.verdict``):
    every broker topic, archived or excluded, and every topic excluded."""
    notes = []
    for topic in sorted(set(topics)):
        v = verdict(topic)
        if v.reason is not None:
            notes.append(TopicNote(topic=topic, archived=v.archived, reason=v.reason))
    return notes

