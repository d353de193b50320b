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
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from queue import SimpleQueue

from dispatcher.archiver import ArchiveOptions, QueueArchiver, QueueResult
from dispatcher.buildpool import shared_builds
from dispatcher.filters import TopicFilter
from tiered.clock import Clock, SystemClock
from tiered.coldtier import ColdTier
from tiered.config import RetentionSettings
from tiered.errors import ConfigError, FencedError, TieredError
from tiered.lease import LeaseManager
from tiered.localstore import LocalStore
from tiered.recorder import NullRecorder, Recorder
from tiered.retention import load_retention

log = logging.getLogger(__name__)


@dataclass(frozen=True)
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
    # recorded per topic in the catalog, for a cleaner without the store
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    # Worker processes building segments (dispatcher.buildpool); None: one
    # per core, at most ``parallelism``; 0 or 1: built in this process.
    build_processes: int | None = None

    def resolved_build_processes(self) -> int:
        if self.build_processes is not None:
            return self.build_processes
        return min(self.parallelism, os.cpu_count() or 1)


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
        processes = self.options.resolved_build_processes()
        self.archiver = QueueArchiver(
            local, cold, self.options.archive, self.recorder, self.clock,
            before_write=self._before_write, on_bytes=on_bytes,
            builds=shared_builds(processes) if processes > 1 else None,
        )
        self._failures: dict[tuple[str, int], tuple[int, float]] = {}
        self._rng = random.Random()
        self._fenced: str | None = None
        self._was_fenced = False
        self._round_lock = threading.Lock()
        self._check_lock = threading.Lock()
        self._checked_at: float | None = None  # monotonic time of this round's last lease read
        self.started = False

    def _before_write(self) -> None:
        if self._fenced is not None:
            raise FencedError(self._fenced)
        if self.lease is None:
            return
        with self._check_lock:
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
        self.started = True

    def eligible_queues(self) -> list[tuple[str, int]]:
        return [(t, q) for t in self.local.topics() if self.filter.accepts(t) for q in self.local.queue_ids(t)]

    def run_round(self) -> RoundResult:
        """One round over every eligible queue. Never two at once: a call made
        while another runs returns at once with ``skipped`` set."""
        if not self._round_lock.acquire(blocking=False):
            return RoundResult(skipped=True)
        try:
            return self._run_round()
        finally:
            self._round_lock.release()

    def _run_round(self) -> RoundResult:
        started = time.perf_counter()
        result = RoundResult()
        if not self.started:
            try:
                self.start()
            except FencedError as exc:
                return self._finish_fenced(result, str(exc), started)
        try:
            # the bucket is the truth: a new or emptied one means archiving again
            self.cold.check_identity()
        except TieredError as exc:
            result.errors["_identity.json"] = str(exc)
            log.error("cannot check the bucket identity; nothing written this round: %s", exc)
            result.seconds = time.perf_counter() - started
            self.recorder.round_finished("dispatch", result.seconds, False, self.clock.now_ms() / 1000)
            return result
        now = self.clock.monotonic()
        deadline = now + self.options.round_budget_s
        self._checked_at = None  # the lease is read again before this round's first write
        self.local.commitlog.refresh()  # files the broker deleted or started since the last round
        queues = [k for k in self.eligible_queues() if self._failures.get(k, (0, 0.0))[1] <= now]
        result.queues = len(queues)
        # Idle queues are settled here, without a thread hop, a lock or a request.
        busy = [k for k in queues if not self._idle(k)]
        outcomes: dict[tuple[str, int], QueueResult] = {}
        try:
            if busy:
                self._archive(busy, deadline, outcomes)
        except FencedError as exc:
            return self._finish_fenced(result, str(exc), started)
        committed = False
        for r in outcomes.values():
            self._account(r, result)
            committed = committed or r.committed
        if committed:
            self._record_retention()
            try:
                self.cold.write_catalog()
            except Exception as exc:  # noqa: BLE001 - the catalog is a hint; next round rewrites it
                result.errors["_catalog.json"] = f"{type(exc).__name__}: {exc}"
        result.seconds = time.perf_counter() - started
        self.recorder.round_finished("dispatch", result.seconds, result.ok, self.clock.now_ms() / 1000)
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
        """Round robin: every queue gets one step (a segment) in turn; a queue
        with more to do goes to the back of the line while the budget lasts.
        At most ``parallelism`` segments are built at once, so memory stays
        within parallelism x segment size."""
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

        if self.options.parallelism <= 1 or len(queues) <= 1:
            line = deque(queues)
            while line:
                key = line.popleft()
                if merge(self._step(key[0], key[1], deadline)):
                    line.append(key)
            return
        # At most `parallelism` queues are in flight; the line holds the rest,
        # and completions come back through one queue (no per-completion scan
        # of every pending future: a round over 10,000 queues stays linear).
        line = deque(queues)
        done: SimpleQueue[Future[QueueResult]] = SimpleQueue()
        fenced: FencedError | None = None
        inflight = 0
        with ThreadPoolExecutor(self.options.parallelism, thread_name_prefix="dispatch") as pool:
            def fill() -> None:
                nonlocal inflight
                while fenced is None and line and inflight < self.options.parallelism:
                    topic, qid = line.popleft()
                    pool.submit(self._step, topic, qid, deadline).add_done_callback(done.put)
                    inflight += 1

            fill()
            while inflight:
                fut = done.get()
                inflight -= 1
                try:
                    r = fut.result()
                except FencedError as exc:
                    fenced = fenced or exc
                else:
                    if merge(r):
                        line.append((r.topic, r.queue_id))
                fill()
        if fenced is not None:
            raise fenced

    def _finish_fenced(self, result: RoundResult, message: str, started: float) -> RoundResult:
        self._fenced = None
        self._was_fenced = True
        self.started = False  # the next round must win the lease again, then reload
        result.fenced = message
        log.error("dispatch round stopped, not writing: %s", message)
        result.seconds = time.perf_counter() - started
        self.recorder.round_finished("dispatch", result.seconds, False, self.clock.now_ms() / 1000)
        return result

    def _account(self, r: QueueResult, result: RoundResult) -> None:
        key = (r.topic, r.queue_id)
        result.segments += r.segments
        result.messages += r.messages
        result.nbytes += r.nbytes
        result.gaps += r.gaps
        result.lag_messages += r.lag_messages
        if r.error is None:
            self._failures.pop(key, None)
            return
        result.errors[f"{r.topic}/{r.queue_id}"] = r.error
        failures = self._failures.get(key, (0, 0.0))[0] + 1
        # The first retry comes with the next round; then capped exponential
        # backoff with jitter, so a persistent failure does not hammer the store.
        pause = min(self.options.failure_backoff_max_s, self.options.failure_backoff_s * 2 ** (failures - 2))
        pause = self._rng.uniform(0.5, 1.0) * pause if failures > 1 else 0.0
        self._failures[key] = (failures, self.clock.monotonic() + pause)

    def backoff(self, topic: str, queue_id: int) -> tuple[int, float]:
        """(consecutive failures, monotonic time before which the queue is not retried)."""
        return self._failures.get((topic, queue_id), (0, 0.0))
