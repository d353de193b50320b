"""``PrometheusRecorder``: the ``tiered.recorder.Recorder`` protocol over prometheus-client.

Every metric is declared here, in one place, against an injected
``CollectorRegistry`` (never the process-global one, so two recorders and
parallel tests do not collide). Counters and histograms are plain
prometheus-client metrics; state the core *reports* rather than *counts*
(archive lag per queue, cold-tier shape per topic) is kept in a dict and
turned into gauges at scrape time by ``_StateCollector``, which is what lets
``per_queue=False`` aggregate per topic without losing per-queue values.

Contracts:

* Thread-safe: the dispatcher calls in from one thread per queue.
  prometheus-client metrics lock internally; the collector's state has its
  own lock and is copied before families are built, so a scrape never
  blocks a recorder call for longer than a dict copy.
* Never raises on bad input: a metrics call must not fail an archive round.
  Negative counts are dropped with a warning; an ``op`` or ``outcome``
  outside ``OPS`` / ``OUTCOMES`` is recorded as ``"other"`` / ``"error"``
  (bounding cardinality) with a warning, once per value.
* Labels are low-cardinality: topic, queue id, task, op, outcome. Never
  ``job`` or ``instance``: those are the scraper's. No offsets,
  no keys, no URLs, no credentials.
* Counters that alerts watch (``tiered_gaps_total``,
  ``tiered_corrupt_records_total``, ...) are created at 0 for a topic the
  first time the recorder hears of that topic, so ``increase()`` sees the
  step from 0 to 1 instead of a series appearing at 1. Job-labelled and
  op/outcome-labelled series are created at 0 up front.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client import disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiered.metrics.consumers import ConsumerPositionCollector
from tiered import __version__, native
from tiered.store.survey import KINDS as LAYOUT_KINDS

log = logging.getLogger(__name__)

# No ``*_created`` series: a third of all series at 900 queues, and nothing
# here reads them (prometheus-client's switch is process-wide).
disable_created_metrics()

#: The two scheduled jobs, values of the ``task`` label (never ``job``: that
#: label belongs to Prometheus, and ours would force ``honor_labels``).
JOBS: tuple[str, ...] = ("dispatch", "clean")
#: Object-store operations, values of the ``op`` label; anything else is "other".
OPS: tuple[str, ...] = ("get", "put", "put_if_absent", "put_if_match", "delete", "list", "head", "copy")
#: Object-store request outcomes, values of the ``outcome`` label. The storage
#: layer maps every failure onto one of these; anything else is "error".
#: ``not_found`` and ``precondition_failed`` are often expected (existence
#: probes, an ``IfNoneMatch`` retry of an identical object), so alerts treat
#: only ``error``, ``throttled`` and ``timeout`` as failures.
OUTCOMES: tuple[str, ...] = ("ok", "error", "throttled", "not_found", "precondition_failed", "timeout")
#: Values of the ``event`` label of ``tiered_recoveries_total``.
RECOVERY_EVENTS: tuple[str, ...] = ("manifest_rebuilt", "bucket_identity_changed")
#: Values of the ``reason`` label of ``tiered_queue_stuck``; anything else is "error".
STUCK_REASONS: tuple[str, ...] = ("corrupt_local_data", "store_behind", "manifest", "unaccounted_objects", "error")
#: Values of the ``event`` label of ``tiered_lease_changes_total``.
LEASE_EVENTS: tuple[str, ...] = ("acquired", "lost")
#: Outcomes after which the object store counts as down (it did not answer usefully).
DOWN_OUTCOMES: frozenset[str] = frozenset({"error", "timeout"})
#: Label value that stands for every queue of a topic when ``per_queue=False``.
ALL_QUEUES = "all"

# Object-store latency: from a cached HEAD (ms) to a multi-hundred-MB PUT (a minute).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Rounds: a dispatch round with nothing new is sub-second; a backlog or a
# cleaner pass over many manifests can take minutes.
ROUND_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


@dataclass(frozen=True, slots=True)
class _Lag:
    messages: int
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Cold:
    nbytes: int
    segments: int
    oldest_store_ms: int | None


class _StateCollector(Collector):
    """Gauges computed at scrape time from the last reported values."""

    def __init__(self, per_queue: bool) -> None:
        self._per_queue = per_queue
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], _Lag] = {}
        self._cold: dict[tuple[str, int], _Cold] = {}
        self._stuck: dict[tuple[str, int], str] = {}  # queue -> reason, only while stopped
        self._committed: dict[tuple[str, int], float] = {}  # queue -> unix time of its last commit
        self._store_up: int | None = None  # None until the first request or probe says
        self._lease: tuple[int, float | None] = (0, None)  # held, expiry (unix s)
        self._confirm: int | None = None  # the confirm offset the archive waits at; None: no bound

    def set_lag(self, topic: str, queue_id: int, lag: _Lag) -> None:
        with self._lock:
            self._lag[(topic, queue_id)] = lag

    def forget_queue(self, topic: str, queue_id: int) -> None:
        with self._lock:
            self._lag.pop((topic, queue_id), None)
            self._stuck.pop((topic, queue_id), None)
            self._committed.pop((topic, queue_id), None)

    def set_stuck(self, topic: str, queue_id: int, reason: str | None) -> None:
        with self._lock:
            if reason is None:
                self._stuck.pop((topic, queue_id), None)
            else:
                self._stuck[(topic, queue_id)] = reason

    def set_committed(self, topic: str, queue_id: int, now_s: float) -> None:
        with self._lock:
            self._committed[(topic, queue_id)] = now_s

    def set_store_up(self, up: bool) -> None:
        self._store_up = int(up)  # one int store: atomic, no lock needed

    def set_lease(self, held: bool, expires_s: float | None) -> None:
        self._lease = (int(held), expires_s if held else None)

    def set_confirm(self, offset: int | None) -> None:
        self._confirm = offset  # one store: atomic, no lock needed

    def set_cold(self, topic: str, queue_id: int, cold: _Cold) -> None:
        with self._lock:
            self._cold[(topic, queue_id)] = cold

    def describe(self) -> Iterable[Metric]:
        # Lets the registry check for name clashes without calling collect().
        return self._families()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            lag = dict(self._lag)
            cold = dict(self._cold)
            stuck = dict(self._stuck)
            committed = dict(self._committed)
        families = self._families()
        (lag_messages, lag_bytes, lag_seconds, cold_bytes, cold_segments, oldest,
         stuck_family, committed_family, store_up, lease_held, lease_expiry, confirm_family) = families
        confirm = self._confirm
        if confirm is not None:
            confirm_family.add_metric([], confirm)
        for (topic, queue), value in sorted(self._lag_rows(lag).items()):
            lag_messages.add_metric([topic, queue], value.messages)
            lag_bytes.add_metric([topic, queue], value.nbytes)
            lag_seconds.add_metric([topic, queue], value.seconds)
        # Per queue in both modes: a stopped queue is the exception, named exactly.
        for (topic, queue_id), reason in sorted(stuck.items()):
            stuck_family.add_metric([topic, str(queue_id), reason], 1)
        for (topic, queue), when in sorted(self._committed_rows(committed).items()):
            committed_family.add_metric([topic, queue], when)
        if self._store_up is not None:
            store_up.add_metric([], self._store_up)
        held, expires_s = self._lease
        lease_held.add_metric([], held)
        if expires_s is not None:
            lease_expiry.add_metric([], expires_s)
        for topic, shape in sorted(self._cold_by_topic(cold).items()):
            cold_bytes.add_metric([topic], shape.nbytes)
            cold_segments.add_metric([topic], shape.segments)
            # No data left in the cold tier means no oldest time: the series
            # is absent rather than a sentinel that would read as 1970.
            if shape.oldest_store_ms is not None:
                oldest.add_metric([topic], shape.oldest_store_ms / 1000.0)
        return families

    @staticmethod
    def _cold_by_topic(cold: dict[tuple[str, int], _Cold]) -> dict[str, _Cold]:
        # Queues report their own shape; topics sum them at scrape time, so
        # parallel queue threads never publish each other's stale totals.
        out: dict[str, _Cold] = {}
        for (topic, _), shape in cold.items():
            prev = out.get(topic)
            if prev is None:
                out[topic] = shape
                continue
            oldest = [t for t in (prev.oldest_store_ms, shape.oldest_store_ms) if t is not None]
            out[topic] = _Cold(prev.nbytes + shape.nbytes, prev.segments + shape.segments,
                               min(oldest) if oldest else None)
        return out

    def _committed_rows(self, committed: dict[tuple[str, int], float]) -> dict[tuple[str, str], float]:
        if self._per_queue:
            return {(topic, str(queue_id)): when for (topic, queue_id), when in committed.items()}
        # Per-topic mode: the topic is as fresh as its stalest queue.
        rows: dict[tuple[str, str], float] = {}
        for (topic, _), when in committed.items():
            rows[(topic, ALL_QUEUES)] = min(when, rows.get((topic, ALL_QUEUES), when))
        return rows

    def _lag_rows(self, lag: dict[tuple[str, int], _Lag]) -> dict[tuple[str, str], _Lag]:
        if self._per_queue:
            return {(topic, str(queue_id)): value for (topic, queue_id), value in lag.items()}
        # Per-topic mode: backlog adds up across queues, age is the worst queue's.
        rows: dict[tuple[str, str], _Lag] = {}
        for (topic, _), value in lag.items():
            prev = rows.get((topic, ALL_QUEUES))
            if prev is not None:
                value = _Lag(
                    prev.messages + value.messages,
                    prev.nbytes + value.nbytes,
                    max(prev.seconds, value.seconds),
                )
            rows[(topic, ALL_QUEUES)] = value
        return rows

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        q = ["topic", "queue"]
        return [
            GaugeMetricFamily(
                "tiered_archive_lag_messages",
                "Messages on local disk not yet archived (queue=\"all\": sum over the topic's queues).",
                labels=q,
            ),
            GaugeMetricFamily(
                "tiered_archive_lag_bytes",
                "Bytes on local disk not yet archived (queue=\"all\": sum over the topic's queues).",
                labels=q,
            ),
            GaugeMetricFamily(
                "tiered_archive_lag_seconds",
                "Age of the oldest message not yet archived, 0 when caught up "
                "(queue=\"all\": max over the topic's queues).",
                labels=q,
            ),
            GaugeMetricFamily("tiered_cold_bytes", "Bytes held in the cold tier.", labels=["topic"]),
            GaugeMetricFamily("tiered_cold_segments", "Segments held in the cold tier.", labels=["topic"]),
            GaugeMetricFamily(
                "tiered_oldest_archived_timestamp_seconds",
                "Store time of the oldest message still in the cold tier (absent when empty).",
                labels=["topic"],
            ),
            GaugeMetricFamily(
                "tiered_queue_stuck",
                "1 while a queue is stopped (reason: corrupt_local_data | store_behind | manifest | "
                "unaccounted_objects | error); the series is gone once the queue moves again.",
                labels=["topic", "queue", "reason"],
            ),
            GaugeMetricFamily(
                "tiered_queue_last_success_timestamp_seconds",
                "Unix time this process last committed for the queue (an upload or a recorded gap); "
                "absent until its first commit (queue=\"all\": the topic's stalest queue).",
                labels=q,
            ),
            GaugeMetricFamily(
                "tiered_object_store_up",
                "1 when the latest object-store request or probe got an answer, 0 when it failed "
                "(error or timeout); absent before the first one.",
            ),
            GaugeMetricFamily("tiered_lease_held", "1 while this sidecar holds the write lease."),
            GaugeMetricFamily(
                "tiered_lease_expiry_timestamp_seconds",
                "Expiry of the write lease this sidecar holds (renewed before writes and by the "
                "store probe once half its TTL is gone); absent when not held or lapsed.",
            ),
            GaugeMetricFamily(
                "tiered_broker_confirm_offset_bytes",
                "CommitLog offset the cluster confirmed (controller mode): records ending after it wait "
                "to be archived; absent where the broker mode binds nothing.",
            ),
        ]


class PrometheusRecorder:
    """Implements ``tiered.recorder.Recorder`` against a ``CollectorRegistry``.

    ``registry`` defaults to a fresh private registry (see ``.registry``);
    pass one in to serve it. ``per_queue=False`` exposes lag per topic with
    ``queue="all"``. ``started_s`` (default: now) seeds
    ``tiered_last_success_timestamp_seconds`` so that "no success for N
    seconds" counts from process start until the first round succeeds,
    instead of firing at start-up against a 1970 timestamp.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        per_queue: bool = True,
        started_s: float | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._state = _StateCollector(per_queue)
        r.register(self._state)
        # consumer positions: computed at scrape time from a source the sidecar sets
        self.consumers = ConsumerPositionCollector()
        r.register(self.consumers)
        self._topics: set[str] = set()
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

        self._declare_dispatch(r)
        self._declare_jobs(r, time.time() if started_s is None else started_s)
        self._declare_store_and_cleaner(r)

    def _declare_dispatch(self, r: CollectorRegistry) -> None:
        """What the dispatcher counts: archived data, gaps, bad records, recoveries."""
        # dispatcher
        self._archived_messages = Counter(
            "tiered_archived_messages", "Messages committed to the cold tier.", ["topic"], registry=r
        )
        self._archived_bytes = Counter(
            "tiered_archived_bytes", "Record bytes committed to the cold tier.", ["topic"], registry=r
        )
        self._gaps = Counter(
            "tiered_gaps",
            "Gaps recorded: local data deleted by the broker before it was archived (data loss).",
            ["topic"],
            registry=r,
        )
        self._gap_messages = Counter(
            "tiered_gap_messages", "Messages lost in recorded gaps.", ["topic"], registry=r
        )
        self._corrupt = Counter(
            "tiered_corrupt_records", "Records that failed validation.", ["topic"], registry=r
        )
        self._quarantined = Counter(
            "tiered_quarantined_records",
            "Records or objects set aside because they differ from what was expected.",
            ["topic"],
            registry=r,
        )
        self._queue_errors = Counter(
            "tiered_queue_errors",
            "Queue-level failures; the job went on with the other queues.",
            ["task", "topic"],
            registry=r,
        )
        self._recoveries = Counter(
            "tiered_recoveries",
            "State recovered from the bucket: manifest_rebuilt (a lost manifest rebuilt from its segment "
            "objects), bucket_identity_changed (a new or emptied bucket: everything archived again).",
            ["event"], registry=r,
        )
        for event in RECOVERY_EVENTS:
            self._recoveries.labels(event)
        self._skipped_busy = Counter(
            "tiered_queues_skipped_busy",
            "Queues a pass left for the next one because the other job held them for all of it.",
            ["task"], registry=r,
        )
        for job in JOBS:
            self._skipped_busy.labels(job)
        # what the last survey of the broker store did not understand: 0 per kind until one says otherwise
        layout_help = ("Entries of the broker store tiered does not understand, by kind (directory | file | "
                       "magic | queue_type), from the last survey; `tiered status` names each.")
        self._unknown_layout = Gauge("tiered_store_unknown_layout", layout_help, ["kind"], registry=r)
        for kind in LAYOUT_KINDS:
            self._unknown_layout.labels(kind).set(0)

    def _declare_jobs(self, r: CollectorRegistry, started: float) -> None:
        """Per task (dispatch, clean): rounds, their duration and last success."""
        # both jobs
        self._round_duration = Histogram(
            "tiered_round_duration_seconds", "Wall time of one job round.", ["task"],
            buckets=ROUND_BUCKETS, registry=r,
        )
        self._rounds = Counter(
            "tiered_rounds", "Job rounds by outcome (ok | error).", ["task", "outcome"], registry=r
        )
        self._last_success = Gauge(
            "tiered_last_success_timestamp_seconds",
            "Unix time of the last successful round (process start until the first one).",
            ["task"],
            registry=r,
        )
        for job in JOBS:
            self._round_duration.labels(job)
            for outcome in ("ok", "error"):
                self._rounds.labels(job, outcome)
            self._last_success.labels(job).set(started)

    def _declare_store_and_cleaner(self, r: CollectorRegistry) -> None:
        """Object-store requests, the cleaner's work, build info, process and lease."""
        # object store
        self._requests = Counter(
            "tiered_object_store_requests", "Object-store requests by operation and outcome.",
            ["op", "outcome"], registry=r,
        )
        self._request_duration = Histogram(
            "tiered_object_store_request_duration_seconds", "Object-store request latency.", ["op"],
            buckets=REQUEST_BUCKETS, registry=r,
        )
        self._retries = Counter(
            "tiered_object_store_retries", "Object-store requests retried.", ["op"], registry=r
        )
        # cleaner
        self._deleted_segments = Counter(
            "tiered_cleaner_deleted_segments", "Expired segments deleted by the cleaner.", ["topic"], registry=r
        )
        self._deleted_bytes = Counter(
            "tiered_cleaner_deleted_bytes", "Bytes of expired segments deleted by the cleaner.", ["topic"], registry=r
        )
        self._orphans = Counter(
            "tiered_orphans_collected", "Unreferenced objects deleted after the grace period.", registry=r
        )
        self._merges = Counter("tiered_merges", "Merges of small adjacent segments.", ["topic"], registry=r)
        self._merged_segments = Counter(
            "tiered_merged_segments", "Segments consumed by merges.", ["topic"], registry=r
        )
        self._skew = Counter(
            "tiered_clock_skew_segments",
            "Segments whose store timestamps are out of order or in the future.",
            ["topic"],
            registry=r,
        )
        Info("tiered_build", "Build information.", registry=r).info({"version": __version__})
        Gauge("tiered_native_core_loaded", "1 when the native core (tiered/_native.c) is loaded; 0: the slower "
              "Python path runs.", registry=r).set(int(native.loaded()))
        # process_start_time_seconds & co.: alerts tell a fresh process from an old one
        ProcessCollector(registry=r)
        self._lease_changes = Counter(
            "tiered_lease_changes", "Write lease taken (acquired) or lost to another writer (lost).",
            ["event"], registry=r,
        )
        for event in LEASE_EVENTS:
            self._lease_changes.labels(event)

        for op in OPS:
            self._request_duration.labels(op)
            self._retries.labels(op)
            for outcome in OUTCOMES:
                self._requests.labels(op, outcome)

    # -- dispatcher ---------------------------------------------------------

    def archived(self, topic: str, queue_id: int, messages: int, nbytes: int) -> None:
        self._seen(topic)
        self._archived_messages.labels(topic).inc(self._count(messages, "messages"))
        self._archived_bytes.labels(topic).inc(self._count(nbytes, "nbytes"))

    def lag(self, topic: str, queue_id: int, messages: int, nbytes: int, seconds: float) -> None:
        self._seen(topic)
        self._state.set_lag(topic, queue_id, _Lag(messages, nbytes, seconds))

    def store_layout(self, counts: Mapping[str, int]) -> None:
        for kind in LAYOUT_KINDS:
            self._unknown_layout.labels(kind).set(self._count(counts.get(kind, 0), "layout findings"))

    def forget_queue(self, topic: str, queue_id: int) -> None:
        """Drop a queue's lag series (its topic or queue no longer exists).

        Not in the ``Recorder`` protocol (yet): without it a deleted queue
        keeps exporting its last lag forever.
        """
        self._state.forget_queue(topic, queue_id)

    def queue_stuck(self, topic: str, queue_id: int, reason: str | None) -> None:
        """A queue stopped (``reason``) or moving again (None)."""
        if reason is not None:
            reason = self._vocab(reason, STUCK_REASONS, "error", "reason")
        self._state.set_stuck(topic, queue_id, reason)

    def queue_committed(self, topic: str, queue_id: int, now_s: float) -> None:
        self._state.set_committed(topic, queue_id, now_s)

    def confirm_offset(self, offset: int | None) -> None:
        """The confirm offset the archive waits at (controller mode), None elsewhere."""
        self._state.set_confirm(offset)

    def gap(self, topic: str, queue_id: int, messages: int) -> None:
        self._seen(topic)
        self._gaps.labels(topic).inc()
        self._gap_messages.labels(topic).inc(self._count(messages, "messages"))

    def corrupt_record(self, topic: str, queue_id: int) -> None:
        self._seen(topic)
        self._corrupt.labels(topic).inc()

    def quarantined(self, topic: str, queue_id: int) -> None:
        self._seen(topic)
        self._quarantined.labels(topic).inc()

    def skipped_busy(self, job: str, topic: str, queue_id: int) -> None:
        self._skipped_busy.labels(job if job in JOBS else "dispatch").inc()

    def recovery(self, event: str, topic: str = "") -> None:
        self._recoveries.labels(event if event in RECOVERY_EVENTS else "other").inc()

    def queue_error(self, job: str, topic: str, queue_id: int) -> None:
        self._seen(topic)
        self._queue_errors.labels(job, topic).inc()

    # -- both jobs ----------------------------------------------------------

    def round_finished(self, job: str, seconds: float, ok: bool, now_s: float) -> None:
        self._round_duration.labels(job).observe(seconds)
        self._rounds.labels(job, "ok" if ok else "error").inc()
        if ok:
            self._last_success.labels(job).set(now_s)

    # -- object store -------------------------------------------------------

    def store_request(self, op: str, outcome: str, seconds: float) -> None:
        op = self._vocab(op, OPS, "other", "op")
        outcome = self._vocab(outcome, OUTCOMES, "error", "outcome")
        self._requests.labels(op, outcome).inc()
        self._request_duration.labels(op).observe(seconds)
        self._state.set_store_up(outcome not in DOWN_OUTCOMES)

    def store_probe(self, ok: bool) -> None:
        """A probe's answer, for when no real request said anything lately."""
        self._state.set_store_up(ok)

    # -- lease ----------------------------------------------------------------

    def lease_state(self, held: bool, expires_s: float | None) -> None:
        self._state.set_lease(held, expires_s)

    def lease_change(self, event: str) -> None:
        self._lease_changes.labels(self._vocab(event, LEASE_EVENTS, "lost", "event")).inc()

    def store_retry(self, op: str) -> None:
        self._retries.labels(self._vocab(op, OPS, "other", "op")).inc()

    # -- cold tier ----------------------------------------------------------

    def cold_tier(self, topic: str, queue_id: int, nbytes: int, segments: int, oldest_store_ms: int | None) -> None:
        """A queue's cold-tier shape after a commit; summed per topic at scrape time."""
        self._seen(topic)
        self._state.set_cold(topic, queue_id, _Cold(nbytes, segments, oldest_store_ms))

    # -- cleaner ------------------------------------------------------------

    def cleaner_deleted(self, topic: str, segments: int, nbytes: int) -> None:
        self._seen(topic)
        self._deleted_segments.labels(topic).inc(self._count(segments, "segments"))
        self._deleted_bytes.labels(topic).inc(self._count(nbytes, "nbytes"))

    def orphans_collected(self, objects: int) -> None:
        self._orphans.inc(self._count(objects, "objects"))

    def merged(self, topic: str, segments: int) -> None:
        self._seen(topic)
        self._merges.labels(topic).inc()
        self._merged_segments.labels(topic).inc(self._count(segments, "segments"))

    def skew_detected(self, topic: str, queue_id: int) -> None:
        self._seen(topic)
        self._skew.labels(topic).inc()

    # -- helpers ------------------------------------------------------------

    def _seen(self, topic: str) -> None:
        """Create the topic's alert-watched counters at 0 on first sight."""
        if topic in self._topics:
            return
        with self._lock:
            if topic in self._topics:
                return
            for counter in (
                self._archived_messages, self._archived_bytes, self._gaps, self._gap_messages,
                self._corrupt, self._quarantined, self._deleted_segments, self._deleted_bytes,
                self._merges, self._merged_segments, self._skew,
            ):
                counter.labels(topic)
            for job in JOBS:
                self._queue_errors.labels(job, topic)
            self._topics.add(topic)

    def _count(self, value: int, what: str) -> int:
        if value >= 0:
            return value
        self._warn_once(what, str(value), f"negative {what}={value} ignored")
        return 0

    def _vocab(self, value: str, allowed: tuple[str, ...], fallback: str, kind: str) -> str:
        for known in allowed:
            if value == known:
                return known  # the canonical str, even if handed a str-Enum member
        self._warn_once(kind, str(value), f"unknown {kind} {value!r} recorded as {fallback!r}")
        return fallback

    def _warn_once(self, kind: str, value: str, message: str) -> None:
        with self._lock:
            if (kind, value) in self._warned:
                return
            self._warned.add((kind, value))
        log.warning("metrics: %s", message)
