"""One dispatch round over every eligible queue of the store.

Queues run in a bounded thread pool (memory <= parallelism x segment size).
Each queue gets at least one segment per round; catch-up beyond that only
while the round's time budget lasts, so one huge backlog cannot starve the
others. A queue that failed is retried from its first uncommitted offset
after a jittered, growing pause. An idle round reads a few ConsumeQueue
bytes per queue and makes no object-store request.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dispatcher.archiver import ArchiveOptions, QueueArchiver, QueueResult
from dispatcher.filters import TopicFilter
from tiered.clock import Clock, SystemClock
from tiered.coldtier import ColdTier
from tiered.errors import FencedError
from tiered.lease import LeaseManager
from tiered.localstore import LocalStore
from tiered.recorder import NullRecorder, Recorder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DispatchOptions:
    archive: ArchiveOptions = ArchiveOptions()
    parallelism: int = 4
    round_budget_s: float = 15.0
    failure_backoff_s: float = 20.0
    failure_backoff_max_s: float = 600.0


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
        self._failures: dict[tuple[str, int], tuple[int, float]] = {}
        self._rng = random.Random()
        self.started = False

    def _before_write(self) -> None:
        if self.lease is not None:
            self.lease.ensure()

    def start(self) -> None:
        """Take the write lease and load the manifest cache (requests happen here)."""
        epoch = self.lease.acquire().epoch if self.lease is not None else 0
        self.cold.load(epoch)
        self.started = True

    def eligible_queues(self) -> list[tuple[str, int]]:
        return [(t, q) for t in self.local.topics() if self.filter.accepts(t) for q in self.local.queue_ids(t)]

    def run_round(self) -> RoundResult:
        if not self.started:
            self.start()
        started = time.perf_counter()
        now = self.clock.monotonic()
        deadline = now + self.options.round_budget_s
        result = RoundResult()
        queues = [k for k in self.eligible_queues() if self._failures.get(k, (0, 0.0))[1] <= now]
        result.queues = len(queues)
        try:
            if self.options.parallelism <= 1 or len(queues) <= 1:
                outcomes = [self.archiver.run(t, q, deadline) for t, q in queues]
            else:
                with ThreadPoolExecutor(self.options.parallelism, thread_name_prefix="dispatch") as pool:
                    outcomes = list(pool.map(lambda k: self.archiver.run(k[0], k[1], deadline), queues))
        except FencedError as exc:
            result.fenced = str(exc)
            log.error("dispatch round stopped: %s", exc)
            outcomes = []
        committed = False
        for r in outcomes:
            self._account(r, result)
            committed = committed or r.committed
        if committed and result.fenced is None:
            try:
                self.cold.write_catalog()
            except Exception as exc:  # noqa: BLE001 - the catalog is a hint; next round rewrites it
                result.errors["_catalog.json"] = f"{type(exc).__name__}: {exc}"
        result.seconds = time.perf_counter() - started
        self.recorder.round_finished("dispatch", result.seconds, result.ok, self.clock.now_ms() / 1000)
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
        pause = min(self.options.failure_backoff_max_s, self.options.failure_backoff_s * 2 ** (failures - 1))
        # jitter, and never longer than the cap; the first retry waits one pause at most
        pause = self._rng.uniform(0.5, 1.0) * pause if failures > 1 else 0.0
        self._failures[key] = (failures, self.clock.monotonic() + pause)
