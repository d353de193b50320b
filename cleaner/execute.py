"""Carry out a clean plan: manifests first, then the objects.

Per queue, under the queue's lock (taken without waiting: a queue the
dispatcher is working on is skipped this pass):

1. merges: read and verify the run, upload the merged objects (new names);
2. one conditional manifest commit that removes the expired prefix, drops
   due pending deletes, and replaces each merged run by its merged segment
   plus a ``PendingDelete`` of the run's objects due after the orphan grace
   period. A manifest chunk carried by an object the commit stops
   referencing (a merged segment's) is written on its own by that commit
   (``ColdTier._store_chunks``, ``chunks.going``): nothing deleted later is
   still referenced. The change re-checks every planned item against the manifest as
   it is now; anything that moved raises ``ConflictError`` (or, for a merge,
   leaves that run alone) and is retried by a later pass.

After all commits, the keys of the expired segments and due pending deletes
of every queue go out together, in batched requests of up to 1000 keys. A
key still referenced by a committed manifest is never sent. A crash or a
failed delete between commit and delete leaves unreferenced objects: orphans,
collected later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

from tiered.cleaner.merge import MergedSegment, build_merged
from tiered.cleaner.plan import CleanPlan, QueuePlan
from tiered.cleaner.report import CleanReport, QueueOutcome
from tiered.clock import Clock
from tiered.archive.coldtier import ColdTier
from tiered.errors import ConflictError, FencedError, TieredError
from tiered.archive.manifest import Manifest, PendingDelete, queue_prefix
from tiered.recorder import Recorder

log = logging.getLogger(__name__)


def _change(
    qp: QueuePlan, merged: list[MergedSegment], after_ms: int, applied: list[MergedSegment]
) -> Callable[[Manifest | None], Manifest]:
    """The manifest change for one queue, re-validated against ``current``."""

    def change(current: Manifest | None) -> Manifest:
        applied.clear()
        if current is None:
            raise ConflictError(f"{qp.topic}/{qp.queue_id}: the manifest is gone")
        segs = list(current.segments)
        n = len(qp.expire)
        if tuple(segs[:n]) != qp.expire:
            raise ConflictError(f"{qp.topic}/{qp.queue_id}: the oldest segments changed since the plan")
        gaps = list(current.gaps)
        if any(g not in gaps for g in qp.drop_gaps):
            raise ConflictError(f"{qp.topic}/{qp.queue_id}: a gap to drop is gone")
        segs = segs[n:]
        gaps = [g for g in gaps if g not in qp.drop_gaps]
        # what goes must lie entirely before what stays: never a hole
        first_kept = min([s.q_start for s in segs[:1]] + [g.q_start for g in gaps] + [current.next_offset])
        if any(s.q_end > first_kept for s in qp.expire) or any(g.q_end > first_kept for g in qp.drop_gaps):
            raise ConflictError(f"{qp.topic}/{qp.queue_id}: removal would not be a prefix")
        pending = [p for p in current.pending_deletes if p not in qp.due_pending]
        for m in merged:
            run = m.run.segments
            try:
                i = segs.index(run[0])
            except ValueError:
                continue  # the run moved: leave it; its new objects become orphans
            if tuple(segs[i:i + len(run)]) != run:
                continue
            segs[i:i + len(run)] = [m.segment]
            pending.append(PendingDelete(tuple(k for s in run for k in s.keys()), after_ms))
            applied.append(m)
        history = applied[0].history if applied else current.history
        if current.history not in ("", history):
            raise ConflictError(f"{qp.topic}/{qp.queue_id}: the manifest's history changed since the merge")
        return replace(current, segments=tuple(segs), gaps=tuple(gaps), pending_deletes=tuple(pending),
                       history=current.history or history)

    return change


class Executor:
    def __init__(
        self,
        cold: ColdTier,
        recorder: Recorder,
        clock: Clock,
        *,
        orphan_grace_ms: int,
        before_write: Callable[[], object] = lambda: None,
        lock_wait_s: float = 120.0,
    ) -> None:
        self.lock_wait_s = lock_wait_s
        self.cold = cold
        self.recorder = recorder
        self.clock = clock
        self.orphan_grace_ms = orphan_grace_ms
        self.before_write = before_write

    def run(self, plan: CleanPlan, report: CleanReport) -> None:
        doomed: list[str] = []
        expired_by_topic: dict[str, tuple[int, int]] = {}
        for qp in self._in_turn(plan, report):
            outcome = self._queue(qp, report)
            if outcome is None:
                continue
            report.committed.append(outcome)
            still = outcome.manifest.referenced_keys()
            keys = qp.expired_keys() + qp.pending_keys()
            kept = [k for k in keys if k in still]
            if kept:  # cannot happen with distinct segment names; never delete a referenced object
                log.error("refusing to delete objects the manifest still references",
                          extra={"topic": qp.topic, "queue": qp.queue_id, "keys": kept[:5]})
            doomed.extend(k for k in keys if k not in still)
            if qp.expire:
                segs, nbytes = expired_by_topic.get(qp.topic, (0, 0))
                expired_by_topic[qp.topic] = (segs + len(qp.expire), nbytes + qp.expired_bytes)
                last = qp.expire[-1]
                log.info("expired segments", extra={
                    "topic": qp.topic, "queue": qp.queue_id, "segments": len(qp.expire),
                    "offset": qp.expire[0].q_start, "end_offset": last.q_end, "bytes": qp.expired_bytes,
                    "newest_store_ms": max(s.max_store_ms for s in qp.expire),
                    "retention_hours": qp.retention.hours if qp.retention else None})
            m = outcome.manifest
            self.recorder.cold_tier(qp.topic, qp.queue_id, m.nbytes, len(m.segments), m.min_store_ms)
        for topic, (segs, nbytes) in expired_by_topic.items():
            self.recorder.cleaner_deleted(topic, segs, nbytes)
        if doomed:
            # ConsumeQueue objects last: if a batch fails, what is left is still
            # described by its descriptor, so the orphan pass can account for it
            doomed.sort(key=lambda k: "/consumequeue/" in k)
            report.deleted_objects += len(doomed)
            try:
                report.delete_requests += self.cold.store.delete_many(doomed)
            except TieredError as exc:
                # the manifests no longer name them: orphans, collected after the grace period
                report.errors["delete"] = str(exc)
                log.error("deleting expired objects failed; they will be collected as orphans",
                          extra={"error": str(exc), "objects": len(doomed)})

    def _in_turn(self, plan: CleanPlan, report: CleanReport) -> Iterator[QueuePlan]:
        """Each queue with changes, its lock held while the caller works on it.
        A queue the dispatcher holds is retried after the others, waiting up
        to ``lock_wait_s`` for it, so a busy queue's expiry is not skipped pass
        after pass; one still busy then is counted and reported."""
        later = []
        for qp in plan.changes:
            if self.cold.lock(qp.topic, qp.queue_id).acquire(blocking=False):
                yield qp
            else:
                later.append(qp)
        for qp in later:
            if self.cold.lock(qp.topic, qp.queue_id).acquire(timeout=self.lock_wait_s):
                yield qp
            else:
                report.busy.append(qp.key)
                self.recorder.skipped_busy("clean", qp.topic, qp.queue_id)
                log.warning("queue busy for the whole pass; its clean waits for the next one",
                            extra={"topic": qp.topic, "queue": qp.queue_id})

    def _queue(self, qp: QueuePlan, report: CleanReport) -> QueueOutcome | None:
        """One queue's changes; its lock is held (``_in_turn``) and released here."""
        lock = self.cold.lock(qp.topic, qp.queue_id)
        try:
            merged = self._build_merges(qp, report)
            if not (qp.expire or qp.drop_gaps or qp.due_pending or merged):
                return None
            self.before_write()
            applied: list[MergedSegment] = []
            now = self.clock.now_ms()
            committed = self.cold.commit(qp.topic, qp.queue_id,
                                         _change(qp, merged, now + self.orphan_grace_ms, applied))
            for m in applied:
                self.recorder.merged(qp.topic, len(m.run.segments))
                log.info("merged segments", extra={
                    "topic": qp.topic, "queue": qp.queue_id, "segments": len(m.run.segments),
                    "offset": m.segment.q_start, "end_offset": m.segment.q_end, "bytes": m.segment.nbytes})
            if len(applied) < len(merged):
                report.conflicts.append(f"{qp.topic}/{qp.queue_id}: {len(merged) - len(applied)} merge(s) "
                                        "no longer applied")
            return QueueOutcome(qp, committed, [(m.run, m.segment) for m in applied])
        except ConflictError as exc:
            report.conflicts.append(str(exc))
            log.info("clean of a queue skipped: %s", exc, extra={"topic": qp.topic, "queue": qp.queue_id})
            return None
        except FencedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the queue's edge: log, count, next pass retries
            report.errors[f"{qp.topic}/{qp.queue_id}"] = f"{type(exc).__name__}: {exc}"
            self.recorder.queue_error("clean", qp.topic, qp.queue_id)
            log.error("clean of a queue failed", extra={"topic": qp.topic, "queue": qp.queue_id,
                                                        "error": f"{type(exc).__name__}: {exc}"})
            return None
        finally:
            lock.release()

    def _build_merges(self, qp: QueuePlan, report: CleanReport) -> list[MergedSegment]:
        out: list[MergedSegment] = []
        prefix = queue_prefix(self.cold.cluster, self.cold.broker, qp.topic, qp.queue_id)
        store = self.cold.store
        manifest = self.cold.cached(qp.topic, qp.queue_id)
        if manifest is None:
            return out
        history = manifest.history or self.cold.history_for(qp.topic, qp.queue_id, manifest.first_offset)
        for run in qp.merges:
            try:
                m = build_merged(store, prefix, qp.topic, qp.queue_id, run, self.clock.now_ms(),
                                 lambda seg: self.cold.descriptor(qp.topic, qp.queue_id, history, seg,
                                                                  manifest.gaps_before(seg.q_start)))
                self.before_write()
                for key, data in m.objects():
                    store.put(key, data)
            except FencedError:
                raise
            except (TieredError, ValueError) as exc:
                where = f"{qp.topic}/{qp.queue_id} merge [{run.q_start},{run.q_end})"
                report.errors[where] = str(exc)
                self.recorder.queue_error("clean", qp.topic, qp.queue_id)
                log.error("merge skipped: %s", exc, extra={"topic": qp.topic, "queue": qp.queue_id,
                                                           "offset": run.q_start, "end_offset": run.q_end})
                continue
            out.append(m)
        return out
