"""Per-queue status: what is on local disk, what is archived, the lag."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tiered.archive.coldtier import ColdTier
from tiered.errors import CorruptRecordError, StoreBehindError, TieredError
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def queue_status(cold: ColdTier, local: LocalStore | None = None,
                 accepts: Callable[[str], bool] | None = None) -> list[QueueStatus]:
    """Rows for every queue archived or (with ``local``) present locally.

    ``accepts`` is the dispatcher's topic filter: a local queue of a topic it
    excludes (``SCHEDULE_TOPIC_XXXX`` by default) is nobody's lag and gets no
    row; one archived before it was excluded keeps its archived columns,
    with no lag and no problem.

    Reads the manifests through ``cold`` (fetched if not cached) and the
    local ConsumeQueues; never the CommitLog or archived data.
    """
    if not cold.manifests():
        cold.rebuild(use_catalog=False)
    manifests = cold.manifests()
    keys = set(manifests) | set(cold.broken)
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
        lag = None
        problem = f"manifest unreadable: {cold.broken[(topic, qid)]}" if (topic, qid) in cold.broken else None
        if lmax is not None and local is not None and watched:
            nxt = max(m.next_offset, lmin or 0) if m else (lmin or 0)
            lag = max(0, lmax - nxt)
            if problem is None and m is not None and lmax < m.next_offset:
                problem = str(StoreBehindError(topic, qid, lmax, m.next_offset))
            elif problem is None and (lag or local.truncated(topic, qid)):
                problem = _local_problem(local, topic, qid, nxt)
        rows.append(QueueStatus(topic=topic, queue_id=qid, local_min_offset=lmin, local_max_offset=lmax,
                                archived_first_offset=m.first_offset if m else None,
                                archived_next_offset=m.next_offset if m else None, lag_messages=lag,
                                oldest_archived_ms=m.min_store_ms if m else None,
                                newest_archived_ms=m.max_store_ms if m else None, segments=len(m.segments) if m else 0,
                                nbytes=m.nbytes if m else 0, gaps=len(m.gaps) if m else 0, problem=problem,
                                compression_ratio=m.compression_ratio if m else None))
    return rows


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
