"""Archive one queue: read from the manifest's end, build segments, commit.

Progress exists only in the committed manifest. Every attempt starts from
``manifest.next_offset``, the first offset not yet committed: after any
failure (an upload, a commit, a crash) the failed message itself is read
again, never the one after it. Data objects are written before the manifest
names them, under names fixed by their offset ranges, so a repeated attempt
rewrites the same bytes under the same keys and a crash leaves at worst an
orphan, which the cleaner collects.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tiered.dispatcher.commitpass import BuildJob, PassOptions, PassStats, Planned, build_pass, build_segment
from tiered.dispatcher.firststarts import FirstStarts, starts_path
from tiered.dispatcher.segment import SEGMENT_BUFFERS, BuiltSegment
from tiered.clock import Clock
from tiered.archive.coldtier import ColdTier, ConflictError
from tiered.format.lmq import is_lmq
from tiered.errors import (CorruptRecordError, ExpiredLocallyError, FencedError, StoreBehindError, TieredError,
                           stuck_reason)
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import Gap, Manifest, queue_prefix
from tiered.recorder import Recorder
from tiered.timeparse import parse_time_ms

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ArchiveOptions:
    upload_bytes: int = 64 << 20
    max_delay_ms: int = 60_000
    segment_bytes: int = 256 << 20
    start_position: str = "earliest"
    quarantine_corrupt: bool = False
    key_index: bool = True
    # segment layout written (tiered/archive/layout.py): 2 = one object per
    # segment (dispatch.layout); 1 = the three objects of format 1.x, for a
    # fleet with older readers
    layout: int = 2
    compression: str = "none"  # "zstd": v2 objects compressed whole
    commit_pass: PassOptions = PassOptions()  # how the CommitLog pass reads


@dataclass
class QueueResult:
    topic: str
    queue_id: int
    segments: int = 0
    messages: int = 0
    nbytes: int = 0
    gaps: int = 0
    lag_messages: int = 0
    error: str | None = None
    # with ``error``: the tiered_queue_stuck reason the error carries (None: the
    # store failed or a race was lost, so the queue is retried, not stuck)
    stuck_reason: str | None = None
    committed: bool = False
    skipped_busy: bool = False
    more: bool = False
    notes: list[str] = field(default_factory=list)


class QueueArchiver:
    def __init__(
        self,
        local: LocalStore,
        cold: ColdTier,
        options: ArchiveOptions,
        recorder: Recorder,
        clock: Clock,
        *,
        before_write: Callable[[], object] = lambda: None,
        on_bytes: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.local = local
        self.cold = cold
        self.options = options
        self.recorder = recorder
        self.clock = clock
        self.before_write = before_write  # lease check before the first write of a queue
        self.on_bytes = on_bytes
        # first-archive start fixed for queues without a manifest, kept across
        # restarts in the state directory (a writer's), so data deleted before
        # the first commit is a gap even after a restart
        self.starts = FirstStarts(starts_path(cold.state_dir, cold.cluster, cold.broker)
                                  if cold.state_dir is not None else None)
        self._reported_corrupt: set[tuple[str, int, int]] = set()
        # (topic, queue) -> (first pending offset, when we first saw it pending)
        self._pending_since: dict[tuple[str, int], tuple[int, int]] = {}
        # (topic, queue) -> (offset, its ConsumeQueue entry, the record's store time): _oldest_pending_ms
        self._oldest: dict[tuple[str, int], tuple[int, tuple[int, int, int], int]] = {}
        # A segment the pass did not build ahead is built by its per-queue
        # read, one at a time: builders in several threads only hand the GIL
        # back and forth. The other threads upload and commit meanwhile.
        self._build_lock = threading.Lock()
        # segments a CommitLog pass built ahead (dispatcher.commitpass), taken
        # by ``_build`` when its job is exactly the one the pass built
        self._prebuilt: dict[tuple[str, int], Planned] = {}
        self.passes: list[PassStats] = []  # this round's (the dispatcher clears it), for benchmarks and tests

    def _local(self, fn: Callable[..., T], *args: object, **kw: object) -> T:
        """A LocalStore read, once more after a rescan when a file it knew of
        is gone: the broker deleted it since the last look (retention)."""
        try:
            return fn(*args, **kw)
        except FileNotFoundError:
            self.local.refresh()
            return fn(*args, **kw)

    # --- where to start ----------------------------------------------------------

    def _first_start(self, topic: str, queue_id: int, min_offset: int, max_offset: int) -> int:
        """Where a queue without a manifest starts, fixed at first sight. Data
        the broker deletes from there before the first commit is a gap, like
        any later one (not a silently later start)."""
        key = (topic, queue_id)
        start = self.starts.get(key)
        if start is not None and start > max_offset:
            # the store now ends below it (wiped, or the topic re-created): the
            # offsets start over, so does the queue's first start
            log.warning("%s/%s: first-seen start %d is past the store's end %d; fixing it again",
                        topic, queue_id, start, max_offset, extra={"topic": topic, "queue": queue_id,
                                                                    "offset": start, "end_offset": max_offset})
            start = None
        if start is None:
            pos = self.options.start_position
            if pos == "earliest":
                start = min_offset
            else:
                start = max_offset if pos == "latest" else self.local.find_offset(
                    topic, queue_id, parse_time_ms(pos))
            self.starts.set(key, start)
        return start

    def start_offset(self, topic: str, queue_id: int, min_offset: int, max_offset: int) -> int:
        """The first offset not yet archived: the manifest's end, else the first start."""
        manifest = self.cold.cached(topic, queue_id)
        if manifest is not None:
            return manifest.next_offset
        return self._first_start(topic, queue_id, min_offset, max_offset)

    def oldest_pending_ms(self, topic: str, queue_id: int, offset: int) -> int | None:
        return self._oldest_pending_ms(topic, queue_id, offset)

    # --- one queue, one round ------------------------------------------------------

    def idle(self, topic: str, queue_id: int) -> bool:
        """True when the queue certainly has nothing new: its cached manifest
        already reaches the local end, or the queue is empty. No request, no
        lock, a few ConsumeQueue bytes read: what a round costs per idle queue."""
        manifest = self.cold.cached(topic, queue_id)
        max_offset = self._local(self.local.max_offset, topic, queue_id)
        if manifest is not None and max_offset < manifest.next_offset:
            return False  # the local store is behind its archive: run() reports it
        if max_offset == 0 or (manifest is not None and max_offset <= manifest.next_offset):
            if self.local.truncated(topic, queue_id):
                return False  # not idle: stopped on a cut ConsumeQueue file, which run() reports
            self.recorder.lag(topic, queue_id, 0, 0, 0.0)
            return True
        return False

    def run(self, topic: str, queue_id: int, deadline: float, *, max_steps: int | None = None) -> QueueResult:
        """Archive what is due for one queue: at least one step (a segment or a
        quarantined record), more while ``deadline`` (monotonic clock) has not
        passed, at most ``max_steps``; ``result.more`` says work was left.

        Never raises for data or storage problems: they are logged, counted
        and returned in ``error``. FencedError is raised: the round must stop."""
        result = QueueResult(topic, queue_id)
        lock = self.cold.lock(topic, queue_id)
        if not lock.acquire(blocking=False):
            result.skipped_busy = True  # a previous round or the cleaner still works on it
            return result
        try:
            self._run(topic, queue_id, deadline, max_steps, result)
        except CorruptRecordError as exc:
            result.error = str(exc)
            result.stuck_reason = stuck_reason(exc)
            result.more = False
            at = self._at(topic, queue_id)
            key = (topic, queue_id, at if at is not None else -1)
            if key not in self._reported_corrupt:
                self._reported_corrupt.add(key)
                self.recorder.corrupt_record(topic, queue_id)
            log.error("corrupt local data: %s/%s stopped at offset %s (%s @ %d: %s)", topic, queue_id, at,
                      exc.source, exc.offset, exc.reason, extra={
                          "topic": topic, "queue": queue_id, "offset": at, "file": exc.source,
                          "file_offset": exc.offset, "reason": exc.reason})
        except FencedError:
            raise  # stops the whole round: nobody else may write either
        except Exception as exc:  # noqa: BLE001 - the queue's edge: log, count, retry next round
            result.error = f"{type(exc).__name__}: {exc}"
            result.stuck_reason = stuck_reason(exc)
            result.more = False
            self.recorder.queue_error("dispatch", topic, queue_id)
            log.error("archiving %s/%s failed; will retry from offset %s, the first not committed: %s",
                      topic, queue_id, self._at(topic, queue_id), result.error, extra={
                          "topic": topic, "queue": queue_id, "offset": self._at(topic, queue_id),
                          "error": result.error})
        finally:
            lock.release()
        return result

    def _at(self, topic: str, queue_id: int) -> int | None:
        m = self.cold.cached(topic, queue_id)
        return m.next_offset if m is not None else self.starts.get((topic, queue_id))

    def _run(self, topic: str, queue_id: int, deadline: float, max_steps: int | None, result: QueueResult) -> None:
        manifest = self.cold.cached(topic, queue_id)
        max_offset = self._local(self.local.max_offset, topic, queue_id)
        if manifest is not None and max_offset < manifest.next_offset:
            raise StoreBehindError(topic, queue_id, max_offset, manifest.next_offset)
        if manifest is not None and max_offset <= manifest.next_offset:
            stuck = self.local.why_stopped(topic, queue_id, manifest.next_offset)
            if stuck is not None and self.local.truncated(topic, queue_id):
                raise stuck
            self.recorder.lag(topic, queue_id, 0, 0, 0.0)
            return  # idle: no request, no CommitLog read
        rng = self._local(self.local.queue_range, topic, queue_id)
        if manifest is None:
            start = self._first_start(topic, queue_id, rng.min_offset, rng.max_offset)
            if rng.max_offset <= start:
                return
        steps = 0
        conflicts = 0
        while True:
            if steps and ((max_steps is not None and steps >= max_steps) or self.clock.monotonic() >= deadline):
                # catch-up continues later; other queues get their turn
                # (a cut ConsumeQueue file looks like the end: one more turn reports it)
                result.more = manifest is not None and (self._local(
                    self.local.max_offset, topic, queue_id) > manifest.next_offset
                    or self.local.truncated(topic, queue_id))
                break
            next_offset = manifest.next_offset if manifest else self._first_start(
                topic, queue_id, rng.min_offset, rng.max_offset)
            try:
                if next_offset < rng.min_offset:
                    manifest = self._commit_gap(topic, queue_id, manifest, next_offset, rng.min_offset,
                                                "expired_locally", "broker deleted the data before it was archived")
                    result.gaps += 1
                    result.committed = True
                    continue
                count, nbytes = self._local(self.local.pending, topic, queue_id, next_offset,
                                                   max_entries=max(1, self.options.upload_bytes // 16))
                if count == 0:
                    stuck = self._local(self.local.why_stopped, topic, queue_id, next_offset)
                    if stuck is not None:
                        raise stuck  # loud, and the queue waits here: nothing skipped
                    break
                if nbytes < self.options.upload_bytes and not self._old_enough(topic, queue_id, next_offset):
                    break
                if manifest is None:
                    # A queue the cache does not know: look it up once before
                    # writing anything for it (never assume it is new), and only
                    # when there is something to write, so waiting costs nothing.
                    manifest = self.cold.current(topic, queue_id)
                    if manifest is not None:
                        continue
                built, stop = self._build(topic, queue_id, next_offset, manifest)
                if built is not None:
                    manifest = self._upload(topic, queue_id, manifest, built, result)
                    steps += 1
                if stop is not None:
                    manifest = self._commit_stop(topic, queue_id, manifest, next_offset, stop, result)
                    if isinstance(stop, ExpiredLocallyError):
                        rng = self._local(self.local.queue_range, topic, queue_id)
                    else:
                        steps += 1
                    continue
                if built is None:
                    stuck = self._local(self.local.why_stopped, topic, queue_id, next_offset)
                    if stuck is not None:
                        raise stuck
                    break  # nothing complete to read yet (torn tail, or beyond the confirmed offset)
            except ConflictError as exc:
                # The manifest moved under a stale cache (a restart after a crash
                # between the manifest write and the cache update, or another
                # writer): commit() re-read it; continue from what it says.
                conflicts += 1
                if conflicts > 3:
                    raise
                log.info("%s; continuing from the re-read manifest", exc)
                manifest = self.cold.current(topic, queue_id)
                rng = self._local(self.local.queue_range, topic, queue_id)
        if not result.more or self.clock.monotonic() >= deadline:
            self._report_lag(topic, queue_id, manifest, result)  # the queue's last turn this round

    def _commit_stop(self, topic: str, queue_id: int, manifest: Manifest | None, next_offset: int,
                     stop: Exception, result: QueueResult) -> Manifest:
        """A build stopped early. Data the broker deleted becomes an
        ``expired_locally`` gap; a corrupt record is raised (the queue waits
        there: nothing skipped) unless quarantining, then it is a one-record gap."""
        at = manifest.next_offset if manifest else next_offset
        if isinstance(stop, ExpiredLocallyError):
            rng = self._local(self.local.queue_range, topic, queue_id)
            target = max(rng.min_offset, stop.next_available or 0)
            if target <= at:
                raise stop  # inconsistent local view: retry next round, never skip
            manifest = self._commit_gap(topic, queue_id, manifest, at, target, "expired_locally",
                                        "broker deleted the data before it was archived")
            result.gaps += 1
        else:
            if not self.options.quarantine_corrupt:
                raise stop
            manifest = self._commit_gap(topic, queue_id, manifest, at, at + 1, "quarantined", str(stop))
            self.recorder.quarantined(topic, queue_id)
        result.committed = True
        return manifest

    def _oldest_pending_ms(self, topic: str, queue_id: int, offset: int) -> int | None:
        """The store time of the queue's record at ``offset``; None when it
        cannot be read (the build reads it again and deals with it). Kept a
        queue: while the ConsumeQueue entry at ``offset`` is the one the time
        was read under, the record is too (records are never rewritten in
        place), so a queue waiting to be due, asked every round by
        ``next_job``, ``run`` and the lag, costs an entry read, not a record
        read and decode."""
        key = (topic, queue_id)
        entry = self.local.entry_at(topic, queue_id, offset)
        kept = self._oldest.get(key)
        if kept is not None and entry is not None and kept[0] == offset and kept[1] == entry:
            return kept[2]
        stamp = None
        try:
            for item in self.local.iter_queue(topic, queue_id, offset, max_count=1, verify_crc=False):
                stamp = item.record.store_timestamp
                break
        except TieredError:
            return None  # the build reads it again and deals with it
        if stamp is not None and entry is not None:
            self._oldest[key] = (offset, entry, stamp)
        return stamp

    def _old_enough(self, topic: str, queue_id: int, offset: int) -> bool:
        """Due by age: the oldest pending message's store time, or (when the
        broker's clock runs ahead of ours) how long we have seen it pending,
        so a fast broker clock delays an upload by at most ``max_delay``."""
        now = self.clock.now_ms()
        seen = self._pending_since.get((topic, queue_id))
        if seen is None or seen[0] != offset:
            seen = (offset, now)
            self._pending_since[(topic, queue_id)] = seen
        ts = self._oldest_pending_ms(topic, queue_id, offset)
        age = max(now - seen[1], now - ts if ts is not None else self.options.max_delay_ms)
        return age >= self.options.max_delay_ms

    def _job(self, topic: str, queue_id: int, start: int, manifest: Manifest | None) -> BuildJob:
        return BuildJob(prefix=queue_prefix(self.cold.cluster, self.cold.broker, topic, queue_id), topic=topic,
                        queue_id=queue_id, start=start, cl_start=manifest.cl_next if manifest else 0,
                        segment_bytes=self.options.segment_bytes, key_index=self.options.key_index,
                        layout=self.options.layout, compression=self.options.compression,
                        batch=self.local.is_batch(topic))

    # --- building ahead, in one CommitLog pass --------------------------------------

    def next_job(self, topic: str, queue_id: int) -> tuple[BuildJob, int] | None:
        """The segment ``run`` would build first for this queue now, with its
        pending bytes (at most the segment's); None when its first step is
        something else (idle, a gap, not due yet, unreadable: ``run`` deals
        with it). The same decisions as ``_run``, made without a request."""
        try:
            if self.local.is_batch(topic):
                return None  # the pass checks one record per queue offset: read on its own (docs/batchcq.md)
            manifest = self.cold.cached(topic, queue_id)
            max_offset = self._local(self.local.max_offset, topic, queue_id)
            if manifest is not None and max_offset <= manifest.next_offset:
                return None
            rng = self._local(self.local.queue_range, topic, queue_id)
            start = manifest.next_offset if manifest else self._first_start(
                topic, queue_id, rng.min_offset, rng.max_offset)
            if rng.max_offset <= start or start < rng.min_offset:
                return None
            most = max(1, self.options.upload_bytes // 16)
            count, nbytes = self._local(self.local.pending, topic, queue_id, start, max_entries=most)
            if count == 0 or (nbytes < self.options.upload_bytes and not self._old_enough(topic, queue_id, start)):
                return None
        except (OSError, TieredError):
            return None
        # counted up to ``most`` entries: the rest estimated at their average size
        planned = min(self.options.segment_bytes, nbytes * max(count, rng.max_offset - start) // count)
        return self._job(topic, queue_id, start, manifest), planned

    def prebuild(self, jobs: list[BuildJob]) -> None:
        """Build these jobs' segments now, in one CommitLog pass; ``run`` takes
        them instead of building. Never raises: a pass that fails leaves
        every queue to its own build, which reports what is wrong."""
        # LMQ queues hold their parents' records, which the pass's compiled
        # check refuses one by one: their own build reads them (queuecursor)
        jobs = [job for job in jobs if not is_lmq(job.topic)]
        if not jobs:
            return
        try:
            built, stats = build_pass(self.local, jobs, self.options.commit_pass)
        except Exception as exc:  # noqa: BLE001 - each queue's own build reads and reports it
            log.warning("the CommitLog pass over %d queues failed (%s: %s); building them one by one",
                        len(jobs), type(exc).__name__, exc)
            return
        self._prebuilt.update(built)
        self.passes.append(stats)

    def drop_prebuilt(self, keys: list[tuple[str, int]] | None = None) -> None:
        """Forget what was built ahead for ``keys`` (None: all) and not taken
        (memory; a later round reads again)."""
        if keys is None:
            self._prebuilt.clear()
        for key in keys or ():
            self._prebuilt.pop(key, None)

    def _build(
        self, topic: str, queue_id: int, start: int, manifest: Manifest | None
    ) -> tuple[BuiltSegment | None, Exception | None]:
        job = self._job(topic, queue_id, start, manifest)
        ahead = self._prebuilt.pop((topic, queue_id), None)
        if ahead is not None and ahead[0] == job:
            builder, stop = ahead[1], ahead[2]
            return (builder.build(self.clock.now_ms()) if builder.count else None), stop
        with self._build_lock:
            return build_segment(self.local, job, self.clock.now_ms())

    def _upload(
        self, topic: str, queue_id: int, manifest: Manifest | None, built: BuiltSegment, result: QueueResult
    ) -> Manifest:
        self.before_write()
        seg = built.segment
        committed = self.cold.append(topic, queue_id, manifest, built)
        if seg.layout == 2 and built.compression == "none":
            # packed in place (a bytearray) and uploaded: its mapped pages serve a next segment
            SEGMENT_BUFFERS.give(built.commitlog)  # committed: its last holder is done with it
        result.segments += 1
        result.messages += seg.messages
        result.nbytes += seg.nbytes
        result.committed = True
        self.recorder.archived(topic, queue_id, seg.messages, seg.nbytes)
        self.on_bytes(seg.nbytes)
        log.info("archived segment", extra={
            "topic": topic, "queue": queue_id, "offset": seg.q_start, "end_offset": seg.q_end,
            "messages": seg.messages, "bytes": seg.nbytes})
        return committed

    def _commit_gap(
        self, topic: str, queue_id: int, manifest: Manifest | None, start: int, end: int | None,
        reason: str, detail: str,
    ) -> Manifest:
        end = end if end is not None else start + 1
        self.before_write()
        committed = self.cold.append_gap(topic, queue_id, manifest,
                                         Gap(start, end, reason, self.clock.now_ms(), detail[:500]))
        if reason == "expired_locally":
            self.recorder.gap(topic, queue_id, end - start)
            log.error("GAP: %s/%s offsets [%d, %d) were deleted locally before they were archived; "
                      "recorded in the manifest, continuing at %d", topic, queue_id, start, end, end, extra={
                          "topic": topic, "queue": queue_id, "offset": start, "end_offset": end,
                          "messages": end - start})
        else:
            log.error("quarantined the corrupt record %s/%s offset %d and moved on: %s", topic, queue_id, start,
                      detail, extra={"topic": topic, "queue": queue_id, "offset": start, "reason": detail})
        return committed

    def _report_lag(self, topic: str, queue_id: int, manifest: Manifest | None, result: QueueResult) -> None:
        # Lag is recomputed by the round for every queue (dispatcher.round), failed or not.
        if manifest is None:
            return
        self.recorder.cold_tier(topic, queue_id, manifest.nbytes, len(manifest.segments), manifest.min_store_ms)

