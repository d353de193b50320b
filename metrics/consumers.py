"""``tiered_consumer_offset_in_archive_only{group,topic,queue}``: computed at
scrape time from the broker's committed consumer offsets, the local store's
queue ranges and the cached manifests (no object-store request).

1 when the group's committed offset is below the local store's minimum but
archived, so the group can only be served from the archive; 0 otherwise.
Until the sidecar hands in a source, the family is declared with no samples.
A source that fails is logged and counted, and its samples are absent for
that scrape (absent, not a stale or made-up 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiered.store.consumeroffsets import ConsumerPosition

log = logging.getLogger(__name__)

ARCHIVE_ONLY = "tiered_consumer_offset_in_archive_only"
READ_ERRORS = "tiered_consumer_offset_read_errors"


class ConsumerPositionCollector(Collector):
    def __init__(self) -> None:
        self.source: Callable[[], Iterable[ConsumerPosition]] | None = None
        self._errors = 0

    def describe(self) -> Iterable[Metric]:
        return self._families()[:2]

    def _families(self) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(ARCHIVE_ONLY, "1 when a consumer group's committed offset is below the local store's "
                              "minimum offset but archived: only the archive can serve it.",
                              labels=["group", "topic", "queue"]),
            CounterMetricFamily(READ_ERRORS, "Scrapes whose consumer offsets (config/consumerOffset.json and its "
                                ".bak) could not be read."),
        )

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        gauge, errors = self._families()
        if self.source is not None:
            try:
                for p in self.source():
                    gauge.add_metric([p.group, p.topic, str(p.queue_id)], 1.0 if p.archive_only else 0.0)
            except Exception as exc:  # a scrape is a process edge: log, count, leave the samples absent
                self._errors += 1
                log.error("consumer positions unavailable: %s", exc)
                gauge, _ = self._families()
        errors.add_metric([], self._errors)
        yield gauge
        yield errors
