"""Orphan collection: data objects no manifest references.

Orphans come from uploads whose commit never happened (a crash, a lost
race, a failed merge commit) and from deletions that failed after their
manifest commit. One LIST of the broker prefix finds data objects older than
the grace period that the cached manifests do not reference; each affected
queue is then locked (skipped if busy) and its manifest re-read from the
bucket, and only objects the fresh manifest does not reference either are
deleted, in batched requests. The grace period covers uploads in flight: the
dispatcher writes data objects before the manifest that names them. A
segment object that carries manifest chunks is referenced while a head
reaches one of them (``Manifest.chunk_keys``); an uncommitted one is an
orphan like any other upload.

Data objects of a queue with no manifest at all are never collected: a lost
or unreadable manifest must not turn an archive into garbage. They are
reported (and logged); the dispatcher rebuilds the manifest from them. An
unreferenced object of a queue with a manifest is deleted only when it is
accountable to that manifest's history (``plan.accountable_orphans``);
anything else is kept and reported as unaccounted. Individual failures are
logged, never raised: collection is housekeeping.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tiered.cleaner.plan import accountable_orphans, plan_orphans
from tiered.cleaner.report import CleanReport
from tiered.archive.coldtier import ColdTier
from tiered.archive import segmeta
from tiered.errors import CorruptRecordError, FencedError, TieredError
from tiered.archive.segmeta import Descriptor
from tiered.archive.storage import ObjectInfo
from tiered.recorder import Recorder

log = logging.getLogger(__name__)


def collect_orphans(
    cold: ColdTier,
    now_ms: int,
    grace_ms: int,
    report: CleanReport,
    recorder: Recorder,
    *,
    dry_run: bool = False,
    before_write: Callable[[], object] = lambda: None,
) -> None:
    report.orphan_scan = True
    prefix = cold.prefix
    try:
        listing = cold.store.list_keys(prefix + "/")
    except TieredError as exc:
        report.errors["orphan scan"] = str(exc)
        log.error("orphan scan: listing failed", extra={"error": str(exc)})
        return
    _collect_leftovers(cold, now_ms, grace_ms, report, dry_run=dry_run, before_write=before_write)
    referenced = {k: m.referenced_keys() for k, m in cold.manifests().items()}
    found = plan_orphans(listing, prefix, referenced, now_ms, grace_ms)
    for (topic, qid), n in sorted(found.unmanaged.items()):
        report.unmanaged[f"{topic}/{qid}"] = n
        log.warning("data objects without a manifest are kept; restore the manifest or delete them by hand",
                    extra={"topic": topic, "queue": qid, "objects": n})
    doomed: list[str] = []
    held: list[threading.Lock] = []
    try:
        for (topic, qid), objects in sorted(found.candidates.items()):
            if not dry_run:
                lock = cold.lock(topic, qid)
                if not lock.acquire(blocking=False):
                    report.busy.append((topic, qid))
                    continue
                held.append(lock)
            try:
                fresh = cold.fetch(topic, qid)
            except TieredError as exc:
                report.errors[f"{topic}/{qid} orphans"] = str(exc)
                log.error("orphan scan: manifest unreadable; queue skipped",
                          extra={"topic": topic, "queue": qid, "error": str(exc)})
                continue
            if fresh is None:
                report.unmanaged[f"{topic}/{qid}"] = len(objects)
                continue
            refs = fresh.referenced_keys()
            loose = [o for o in objects if o.key not in refs]
            deletable, kept = accountable_orphans(fresh, loose, _descriptors(cold, loose))
            doomed.extend(deletable)
            if kept:
                report.unaccounted[f"{topic}/{qid}"] = kept
                log.warning("unreferenced objects that the manifest's history cannot account for are kept; "
                            "see `tiered repair`", extra={"topic": topic, "queue": qid, "objects": len(kept),
                                                         "keys": kept[:5]})
        report.orphans = doomed
        if doomed and not dry_run:
            try:
                before_write()
                report.delete_requests += cold.store.delete_many(doomed)
            except FencedError:
                raise
            except TieredError as exc:
                report.errors["orphan delete"] = str(exc)
                log.error("orphan scan: delete failed; next scan retries", extra={"error": str(exc)})
                return
            recorder.orphans_collected(len(doomed))
            log.info("collected orphans", extra={"objects": len(doomed)})
    finally:
        for lock in held:
            lock.release()


def _descriptors(cold: ColdTier, objects: list[ObjectInfo]) -> dict[str, Descriptor | None]:
    """Descriptors of the ConsumeQueue objects among ``objects``; an object
    that cannot be read or parsed is left out, and so is kept."""
    out: dict[str, Descriptor | None] = {}
    for obj in objects:
        if "/consumequeue/" not in obj.key:
            continue
        try:
            out[obj.key] = segmeta.parse(cold.store.get(obj.key), obj.key)
        except (CorruptRecordError, TieredError) as exc:
            log.warning("orphan scan: cannot read a descriptor; object kept", extra={"key": obj.key, "error": str(exc)})
    return out


def _collect_leftovers(cold: ColdTier, now_ms: int, grace_ms: int, report: CleanReport, *, dry_run: bool,
                       before_write: Callable[[], object]) -> None:
    """Temporary files of writes a crash interrupted, once older than the grace
    period (a write in flight is younger). Failures are logged, never raised."""
    try:
        stale = [o.key for o in cold.store.leftovers(cold.prefix + "/") if o.mtime_ms <= now_ms - grace_ms]
        report.leftovers = stale
        if stale and not dry_run:
            before_write()
            report.delete_requests += cold.store.delete_many(stale)
            log.info("removed temporary files of interrupted writes", extra={"objects": len(stale)})
    except FencedError:
        raise
    except TieredError as exc:
        report.errors["leftovers"] = str(exc)
        log.error("orphan scan: removing temporary files failed", extra={"error": str(exc)})
