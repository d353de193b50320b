"""The tests' one fake recorder: it counts what the core reports, so a test
asserts exact numbers (requests by op and outcome, gaps, rounds...) without
a Prometheus registry. Thread-safe: upload threads report concurrently."""

from __future__ import annotations

import threading
from collections import Counter

from tiered.recorder import NullRecorder


class CountingRecorder(NullRecorder):
    """Counts by what a test asserts on: queues as (topic, queue id), rounds
    and queue errors with their job ("dispatch", "clean")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()  # (op, outcome)
        self.retries: Counter[str] = Counter()
        self.rounds: list[tuple[str, bool]] = []  # (job, ok)
        self.queue_errors: Counter[tuple[str, str, int]] = Counter()  # (job, topic, queue id)
        self.skipped: Counter[tuple[str, str, int]] = Counter()  # (job, topic, queue id): busy queues
        # the dispatcher's
        self.gaps: Counter[tuple[str, int]] = Counter()
        self.corrupt: Counter[tuple[str, int]] = Counter()
        self.quarantines: Counter[tuple[str, int]] = Counter()
        self.archived_messages: Counter[tuple[str, int]] = Counter()
        self.archived_segments: Counter[tuple[str, int]] = Counter()
        self.stuck: dict[tuple[str, int], str | None] = {}
        # the cleaner's
        self.deleted: Counter[str] = Counter()  # segments by topic
        self.deleted_bytes: Counter[str] = Counter()
        self.orphans = 0
        self.merges: Counter[str] = Counter()
        self.merged_segments: Counter[str] = Counter()
        self.skew: Counter[tuple[str, int]] = Counter()

    # -- reading ---------------------------------------------------------------

    @property
    def ops(self) -> Counter[str]:
        """Requests by op, whatever their outcome."""
        with self._lock:
            out: Counter[str] = Counter()
            for (op, _outcome), n in self.requests.items():
                out[op] += n
            return out

    def total_requests(self, op: str | None = None) -> int:
        with self._lock:
            return sum(n for (o, _), n in self.requests.items() if op is None or o == op)

    def reset(self) -> None:
        """Forget the requests so far (to count those of one step)."""
        with self._lock:
            self.requests.clear()

    # -- the Recorder protocol -------------------------------------------------

    def store_request(self, op: str, outcome: str, seconds: float) -> None:
        with self._lock:
            self.requests[(op, outcome)] += 1

    def store_retry(self, op: str) -> None:
        with self._lock:
            self.retries[op] += 1

    def round_finished(self, job: str, seconds: float, ok: bool, now_s: float) -> None:
        with self._lock:
            self.rounds.append((job, ok))

    def queue_error(self, job: str, topic: str, queue_id: int) -> None:
        with self._lock:
            self.queue_errors[(job, topic, queue_id)] += 1

    def skipped_busy(self, job: str, topic: str, queue_id: int) -> None:
        with self._lock:
            self.skipped[(job, topic, queue_id)] += 1

    def gap(self, topic: str, queue_id: int, messages: int) -> None:
        with self._lock:
            self.gaps[(topic, queue_id)] += messages

    def corrupt_record(self, topic: str, queue_id: int) -> None:
        with self._lock:
            self.corrupt[(topic, queue_id)] += 1

    def quarantined(self, topic: str, queue_id: int) -> None:
        with self._lock:
            self.quarantines[(topic, queue_id)] += 1

    def queue_stuck(self, topic: str, queue_id: int, reason: str | None) -> None:
        with self._lock:
            self.stuck[(topic, queue_id)] = reason

    def archived(self, topic: str, queue_id: int, messages: int, nbytes: int) -> None:
        with self._lock:
            self.archived_messages[(topic, queue_id)] += messages
            self.archived_segments[(topic, queue_id)] += 1

    def cleaner_deleted(self, topic: str, segments: int, nbytes: int) -> None:
        with self._lock:
            self.deleted[topic] += segments
            self.deleted_bytes[topic] += nbytes

    def orphans_collected(self, objects: int) -> None:
        with self._lock:
            self.orphans += objects

    def merged(self, topic: str, segments: int) -> None:
        with self._lock:
            self.merges[topic] += 1
            self.merged_segments[topic] += segments

    def skew_detected(self, topic: str, queue_id: int) -> None:
        with self._lock:
            self.skew[(topic, queue_id)] += 1
