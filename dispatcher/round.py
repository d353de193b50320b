"""One dispatch round over every eligible queue of the store.

Idle queues are settled first, in the calling thread: a cached manifest and
a few ConsumeQueue bytes per queue, no lock, no request. The others take
turns in a bounded thread pool (memory <= parallelism x segment size): one
segment per turn, round robin, each queue at least one turn per round and
more only while the round's time budget lasts, so one huge backlog cannot
starve the others and two backlogs share the budget. A queue that failed is
retried from its first uncommitted offset: at the next round, then after a
jittered, growing pause. A lost lease stops the round (nothing more is
written) and makes the next round win the lease back and reload first.

What the round reports does not depend on what it managed to write. Lag
(messages, bytes, seconds) is recomputed at the end of every round for every
eligible queue from the local store and the cached manifests, for a queue
that failed, waits in back-off or cannot start as much as for one that
archived. A queue stopped on its own data (corrupt, store behind its
archive, an unreadable manifest, unaccounted objects) is reported stuck
with that reason until it moves again. The round counts as a success only
when nothing failed for another reason (object store, lease, unexpected
errors) and no queue waits in back-off for one: a store outage stops
``tiered_last_success_timestamp_seconds`` instead of leaving the failing
queues out of the verdict.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from tiered.dispatcher.archiver import ArchiveOptions, QueueArchiver, QueueResult
from tiered.dispatcher.segment import SEGMENT_BUFFERS
from tiered.dispatcher.filters import TopicFilter
from tiered.dispatcher.layoutwatch import LayoutWatch
from tiered.clock import Clock, SystemClock
from tiered.archive.coldtier import ColdTier
from tiered.config import RetentionSettings
from tiered.errors import ConfigError, FencedError, TieredError
from tiered.archive.manifest import Manifest
from tiered.archive.lease import LeaseManager
from tiered.store.localstore import LocalStore
from tiered.recorder import NullRecorder, Recorder
from tiered.retention import load_retention

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DispatchOptions:
    archive: ArchiveOptions = ArchiveOptions()
    parallelism: int = 4
    round_budget_s: float = 15.0
    failure_backoff_s: float = 20.0
    failure_backoff_max_s: float = 600.0
    # A lease read before the first write of each round, then at most this
    # often: a writer whose lease was taken over stops within it. Safety does
    # not rest on it (commits are conditional, data keys fixed by content).
    lease_check_s: float = 5.0
    # The bucket identity (invariant 7: a new or emptied bucket is noticed) is
    # read before every round that writes, and in a row of idle rounds at most
    # this often: an idle round makes no request in between. A failed read is
    # tried again every round until one succeeds (the round fails meanwhile).
    identity_check_s: float = 60.0
    # recorded per topic in the catalog, for a cleaner without the store
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # Record bytes one pass builds at most (a wave), held until their upload;
    # None: parallelism x segment size, the memory bound of the per-queue builds
    pass_bytes: int | None = None


@dataclass
class RoundResult:
    queues: int = 0
    segments: int = 0
    messages: int = 0
    nbytes: int = 0
    gaps: int = 0
    lag_messages: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    fenced: str | None = None
    seconds: float = 0.0
    skipped: bool = False  # another round was still running

    # an error that is not a queue stopped on its own data: the round failed
    failed: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors and self.fenced is None


class Dispatcher:
    def __init__(
        self,
        local: LocalStore,
        cold: ColdTier,
        *,
        lease: LeaseManager | None = None,
        topic_filter: TopicFilter | None = None,
        options: DispatchOptions | None = None,
        recorder: Recorder | None = None,
        clock: Clock | None = None,
        on_bytes: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.local = local
        self.cold = cold
        self.lease = lease
        self.filter = topic_filter or TopicFilter()
        self.options = options or DispatchOptions()
        self.recorder = recorder or NullRecorder()
        self.clock = clock or SystemClock()
        self.archiver = QueueArchiver(
            local, cold, self.options.archive, self.recorder, self.clock,
            before_write=self._before_write, on_bytes=on_bytes,
        )
        self.layout = LayoutWatch(local, self.recorder, self.clock)
        self._failures: dict[tuple[str, int], tuple[int, float]] = {}
        # queues failing now, with whether that fails the round (not a data stop)
        self._failing: dict[tuple[str, int], bool] = {}
        self._stuck: set[tuple[str, int]] = set()
        self._reported: set[tuple[str, int]] = set()  # queues whose lag the last round reported
        # (topic, queue) -> (first pending offset, unix ms we first saw it pending):
        # the lag age of a queue whose oldest pending record cannot be read
        self._pending_since: dict[tuple[str, int], tuple[int, int]] = {}
        self._rng = random.Random()
        self._mode_problem: str | None = None  # the last checkpoint problem logged (controller mode)
        self._fenced: str | None = None
        self._was_fenced = False
        self._round_lock = threading.Lock()
        self._check_lock = threading.Lock()
        self._checked_at: float | None = None  # monotonic time of this round's last lease read
        self._identity_at: float | None = None  # monotonic time of the last identity read that succeeded
        self.started = False

    def _before_write(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        if self.lease is None:
            return
        with self._check_lock:
            if self._fenced is not None:
                # another thread lost the lease while this one waited: a check
                # now would find no lease of ours and take a new one mid-round
                raise FencedError(self._fenced)
            now = self.clock.monotonic()
            try:
                if self._checked_at is not None and now - self._checked_at < self.options.lease_check_s:
                    self.lease.ensure()  # renews when due; no request otherwise
                else:
                    self.lease.check()
                    self._checked_at = now
            except FencedError as exc:
                self._fenced = str(exc)
                raise

    def start(self) -> None:
        """Take the write lease and load the manifest cache (requests happen here).

        Raises FencedError when another writer holds the prefix."""
        epoch = self.lease.acquire().epoch if self.lease is not None else 0
        # after losing the lease, what we cached may be stale: read it all again
        self.cold.load(epoch, rebuild=self._was_fenced)
        if not self.cold.identity:
            self.cold.check_identity()  # created at a writer's first start
        self._fenced = None
        self._was_fenced = False
        self._identity_at = None  # the first round reads it again, idle or not
        self.started = True
        log.info("broker mode %s", self.local.told_mode.describe())

    def eligible_queues(self) -> list[tuple[str, int]]:
        unreadable = self.layout.current().unreadable_topics  # a queue type we cannot read
        return [(t, q) for t in self.local.topics() if t not in unreadable and self.filter.accepts(t)
                for q in self.local.queue_ids(t)]

    @property
    def pass_budget(self) -> int:
        """Record bytes built and held at most at once: two waves, one
        uploading while the next is built."""
        return self.options.pass_bytes or max(1, self.options.parallelism) * self.options.archive.segment_bytes

    def run_round(self) -> RoundResult:
        """One round over every eligible queue. Never two at once: a call made
        while another runs returns at once with ``skipped`` set."""
        if not self._round_lock.acquire(blocking=False):
            return RoundResult(skipped=True)
        try:
            # Every buffer of the two waves in flight comes back for the next
            # wave (a fresh one page-faults all of its pages again; a wave may
            # pass its half by a segment, hence twice); none is kept past the
            # round, so an idle sidecar holds no segment memory.
            SEGMENT_BUFFERS.max_bytes = 2 * self.pass_budget
            started = time.perf_counter()
            result = self._run_round()
            watched = self._refresh_lag(result)
            if watched is not None:
                # the starts fixed this round (by the archiver or the lag),
                # kept for the queues still watched and not yet archived
                self.archiver.starts.save(lambda k: k in watched and self.cold.cached(*k) is None)
            result.seconds = time.perf_counter() - started
            ok = result.fenced is None and not result.failed and not any(self._failing.values())
            self.recorder.round_finished("dispatch", result.seconds, ok, self.clock.now_ms() / 1000)
            return result
        finally:
            SEGMENT_BUFFERS.clear()
            self._round_lock.release()

    def _run_round(self) -> RoundResult:
        result = RoundResult()
        if not self.started:
            try:
                self.start()
            except FencedError as exc:
                return self._finish_fenced(result, str(exc))
            except TieredError as exc:  # the object store cannot be read: nothing written, lag still reported
                result.errors["start"] = str(exc)
                result.failed = True
                log.error("cannot start archiving: %s", exc)
                return result
        now = self.clock.monotonic()
        self._checked_at = None  # the lease is read again before this round's first write
        self.local.commitlog.refresh()  # files the broker deleted or started since the last round
        self.archiver.passes.clear()
        queues = [k for k in self.eligible_queues() if self._failures.get(k, (0, 0.0))[1] <= now]
        result.queues = len(queues)
        # Idle queues are settled here, without a thread hop, a lock or a request.
        busy = [k for k in queues if not self._idle(k)]
        if busy or self._identity_at is None or now - self._identity_at >= self.options.identity_check_s:
            try:
                # the bucket is the truth: a new or emptied one means archiving again
                if self.cold.check_identity():
                    busy = [k for k in queues if not self._idle(k)]  # the cache was rebuilt from the bucket
            except TieredError as exc:
                result.errors["_identity.json"] = str(exc)
                result.failed = True
                log.error("cannot check the bucket identity; nothing written this round: %s", exc)
                return result
            self._identity_at = now
        deadline = self.clock.monotonic() + self.options.round_budget_s
        outcomes: dict[tuple[str, int], QueueResult] = {}
        try:
            if busy:
                self._archive(busy, deadline, outcomes)
        except FencedError as exc:
            return self._finish_fenced(result, str(exc))
        committed = False
        for r in outcomes.values():
            self._account(r, result)
            committed = committed or r.committed
        if committed:
            self._record_retention()
        try:
            # written when it would be wrong (a new queue, in the round that first
            # commits it; a changed retention), its ranges at most every
            # dispatch.catalog_refresh: no request in most rounds
            self.cold.refresh_catalog()
        except Exception as exc:  # noqa: BLE001 - the catalog is a hint; the next round writes it again
            result.errors["_catalog.json"] = f"{type(exc).__name__}: {exc}"
            result.failed = True
            log.error("writing the catalog failed; the next round writes it again: %s", result.errors["_catalog.json"])
        return result

    def _idle(self, key: tuple[str, int]) -> bool:
        try:
            return self.archiver.idle(*key)
        finally:
            self.local.release_queue(*key)  # RSS stays flat over thousands of queues

    def _step(self, topic: str, queue_id: int, deadline: float) -> QueueResult:
        """One turn of one queue (a segment); its mapped ConsumeQueue pages
        are given back after."""
        try:
            return self.archiver.run(topic, queue_id, deadline, max_steps=1)
        finally:
            self.local.release_queue(topic, queue_id)

    def _record_retention(self) -> None:
        """Each archived topic's retention as the broker and the config say, for
        a cleaner that runs without the store (tiered.retention)."""
        try:
            policy = load_retention(self.options.retention, self.local)
        except ConfigError as exc:
            log.warning("retention not recorded this round: %s", exc)
            return
        self.cold.record_retention(policy.table({t for t, _q in self.cold.manifests()}))

    def _archive(self, queues: list[tuple[str, int]], deadline: float,
                 outcomes: dict[tuple[str, int], QueueResult]) -> None:
        """Round robin in waves: every queue gets one step (a segment) in turn;
        a queue with more to do goes to the back of the line while the budget
        lasts. A wave is as many queues as their next segments fit in
        ``pass_bytes`` (the memory bound); their segments are built in one
        CommitLog pass, then uploaded, at most ``parallelism`` at once, while
        the next wave's pass runs."""
        def merge(r: QueueResult) -> bool:
            key = (r.topic, r.queue_id)
            prev = outcomes.get(key)
            if prev is not None:
                r.segments += prev.segments
                r.messages += prev.messages
                r.nbytes += prev.nbytes
                r.gaps += prev.gaps
                r.committed = r.committed or prev.committed
            outcomes[key] = r
            return r.more and r.error is None and self.clock.monotonic() < deadline

        line = deque(queues)
        try:
            # One upload pool for the round, its queue first in, first out: the
            # next wave's steps are queued as soon as its pass is done and start
            # as this wave's last uploads free their threads, not after all of
            # them. Memory stays two waves: the next pass waits for this wave.
            with ThreadPoolExecutor(max(1, self.options.parallelism), thread_name_prefix="dispatch") as pool:
                wave = self._wave(line)
                running = self._submit(pool, wave, deadline)
                while wave:
                    # the next wave's pass reads the CommitLog while this one uploads
                    nxt = self._wave(line) if line else []
                    ahead = self._submit(pool, nxt, deadline) if nxt else []
                    try:
                        results = self._collect(running)
                    except FencedError:
                        for fut in ahead:
                            fut.cancel()  # not started: nothing more is written
                        raise
                    self.archiver.drop_prebuilt(wave)
                    for r in results:
                        if merge(r):
                            line.append((r.topic, r.queue_id))
                    if nxt:
                        wave, running = nxt, ahead
                    else:
                        wave = self._wave(line) if line else []
                        running = self._submit(pool, wave, deadline)
        finally:
            self.archiver.drop_prebuilt()  # a fenced round leaves nothing built behind

    def _wave(self, line: deque[tuple[str, int]]) -> list[tuple[str, int]]:
        """The next queues of the line whose next segments fit half of
        ``pass_bytes`` (two waves are held at once: one uploading, the next
        built meanwhile), at least one, those segments built ahead in one pass."""
        budget = max(1, self.pass_budget // 2)
        wave: list[tuple[str, int]] = []
        jobs = []
        used = 0
        while line and (not wave or used < budget):
            key = line.popleft()
            wave.append(key)
            try:
                planned = self.archiver.next_job(*key)
            finally:
                self.local.release_queue(*key)  # a wave of 1,000 queues must not keep their pages
            if planned is not None:
                jobs.append(planned[0])
                used += planned[1]
        turn = max(1, self.options.parallelism)
        if line and len(wave) > turn and len(wave) % turn:
            # Cut by the budget: whole turns of the upload pool, the rest back
            # to the front of the line. A wave of parallelism + 1 segments
            # would upload its last one alone while the next wave waits.
            keep = len(wave) - len(wave) % turn
            back = wave[keep:]
            line.extendleft(reversed(back))
            wave = wave[:keep]
            moved = set(back)
            jobs = [j for j in jobs if (j.topic, j.queue_id) not in moved]
        self.archiver.prebuild(jobs)
        return wave

    def _submit(self, pool: ThreadPoolExecutor, wave: list[tuple[str, int]],
                deadline: float) -> list[Future[QueueResult]]:
        """One step of each queue of the wave, queued on the round's upload
        pool (``parallelism`` threads)."""
        return [pool.submit(self._step, topic, qid, deadline) for topic, qid in wave]

    @staticmethod
    def _collect(futures: list[Future[QueueResult]]) -> list[QueueResult]:
        """The wave's results, in the order they complete. A FencedError stops
        the steps not started yet (each would refuse to write anyway) and is
        raised once every started one has finished."""
        results: list[QueueResult] = []
        fenced: FencedError | None = None
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            try:
                results.append(fut.result())
            except FencedError as exc:
                if fenced is None:
                    fenced = exc
                    for other in futures:
                        other.cancel()
        if fenced is not None:
            raise fenced
        return results

    def _finish_fenced(self, result: RoundResult, message: str) -> RoundResult:
        self._fenced = None
        self._was_fenced = True
        self.started = False  # the next round must win the lease again, then reload
        result.fenced = message
        log.error("dispatch round stopped, not writing: %s", message)
        return result

    def _account(self, r: QueueResult, result: RoundResult) -> None:
        key = (r.topic, r.queue_id)
        result.segments += r.segments
        result.messages += r.messages
        result.nbytes += r.nbytes
        result.gaps += r.gaps
        if r.committed:
            self.recorder.queue_committed(r.topic, r.queue_id, self.clock.now_ms() / 1000)
        if r.error is None:
            self._failures.pop(key, None)
            if not r.skipped_busy:
                self._failing.pop(key, None)
                self._set_stuck(key, None)
            return
        result.errors[f"{r.topic}/{r.queue_id}"] = r.error
        reason = r.stuck_reason
        self._failing[key] = reason is None or reason == "error"
        self._set_stuck(key, reason)
        failures = self._failures.get(key, (0, 0.0))[0] + 1
        # The first retry comes with the next round; then capped exponential
        # backoff with jitter, so a persistent failure does not hammer the store.
        pause = min(self.options.failure_backoff_max_s, self.options.failure_backoff_s * 2 ** (failures - 2))
        pause = self._rng.uniform(0.5, 1.0) * pause if failures > 1 else 0.0
        self._failures[key] = (failures, self.clock.monotonic() + pause)

    def backoff(self, topic: str, queue_id: int) -> tuple[int, float]:
        """(consecutive failures, monotonic time before which the queue is not retried)."""
        return self._failures.get((topic, queue_id), (0, 0.0))

    def _set_stuck(self, key: tuple[str, int], reason: str | None) -> None:
        if reason is None and key not in self._stuck:
            return  # the common case: nothing to clear, no recorder call
        (self._stuck.add if reason is not None else self._stuck.discard)(key)
        self.recorder.queue_stuck(key[0], key[1], reason)

    # --- lag, whatever the round managed to write ---------------------------

    def _refresh_lag(self, result: RoundResult) -> set[tuple[str, int]] | None:
        """Every eligible queue's lag from the local store and the cached
        manifest: failed, in back-off, stuck or not even started alike.
        Returns the eligible queues, None when they cannot be listed."""
        try:
            keys = self.eligible_queues()
        except OSError as exc:
            log.error("cannot list the local store's queues; lag not refreshed: %s", exc)
            return None
        now_ms = self.clock.now_ms()
        mode = self.local.broker_mode()
        self.recorder.confirm_offset(mode.confirm_offset)
        if mode.problem != self._mode_problem:  # logged when it appears or changes, not every round
            if mode.problem is not None:
                log.warning("the archive waits for the cluster to confirm: %s", mode.problem)
            self._mode_problem = mode.problem
        total = 0
        for key in keys:
            try:
                lag = self._queue_lag(key[0], key[1], now_ms)
            finally:
                self.local.release_queue(*key)  # the pages the lag read, given back as the round's are
            if lag is not None:
                total += lag[0]
                self.recorder.lag(key[0], key[1], *lag)
        result.lag_messages = total
        # A queue gone from the store (or from the topic filter) is nobody's
        # lag any more: its series go rather than repeat a last value forever.
        current = set(keys)
        for gone in self._reported - current:
            self.recorder.forget_queue(*gone)
            self._pending_since.pop(gone, None)
            self._stuck.discard(gone)
            self._failing.pop(gone, None)  # nor does its last failure fail the rounds
            self._failures.pop(gone, None)
        self._reported = current
        return current

    def _queue_lag(self, topic: str, qid: int, now_ms: int) -> tuple[int, int, float] | None:
        local = self.local
        try:
            manifest: Manifest | None = self.cold.cached(topic, qid)
            max_offset = local.max_offset(topic, qid)
            if manifest is not None and max_offset <= manifest.next_offset:
                self._pending_since.pop((topic, qid), None)
                return 0, 0, 0.0  # idle: no more reads
            rng = local.queue_range(topic, qid)
            start = max(self.archiver.start_offset(topic, qid, rng.min_offset, rng.max_offset), rng.min_offset)
            if rng.max_offset <= start:
                self._pending_since.pop((topic, qid), None)
                return 0, 0, 0.0
            count, nbytes = local.pending(topic, qid, start)
        except FileNotFoundError:
            local.refresh()  # the broker deleted a file meanwhile: next round reads the new view
            return None
        except (OSError, TieredError) as exc:
            # The queue's ConsumeQueue cannot be read: its error is reported by the
            # archiver; the lag keeps its last value rather than a made-up one.
            log.debug("lag of %s/%s not refreshed: %s", topic, qid, exc)
            return None
        # pending() counts at most 1M entries; the message count is exact anyway
        count = max(count, rng.max_offset - start)
        if local.is_batch(topic):  # a BatchCQ queue's lag counts messages, not entries (docs/batchcq.md)
            unit = local.batch_entry(topic, qid, start)
            if unit is not None:
                count = local.batch_offset_range(topic, qid).max_offset - unit.base_offset
        seen = self._pending_since.get((topic, qid))
        if seen is None or seen[0] != start:
            seen = (start, now_ms)
            self._pending_since[(topic, qid)] = seen
        # at least as old as we have seen it pending (all we know when the
        # record is unreadable), and as old as its store time says
        age_ms = now_ms - seen[1]
        oldest = self.archiver.oldest_pending_ms(topic, qid, start)
        if oldest is not None:
            age_ms = max(age_ms, now_ms - oldest)
        return count, nbytes, max(0.0, age_ms / 1000)
