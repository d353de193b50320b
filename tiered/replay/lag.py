"""``tiered_replay_group_lag_messages{group,topic}``: how far each consumer
group is behind the end of the archive, computed at scrape time.

For every group with a committed offset this process knows (read from the
bucket or committed through it) and every topic it committed in, the sum
over that topic's queues of the archive's max offset minus the committed
offset, never below 0. Queues the group never committed do not count: a
group reading one queue of a topic is not charged for the others. Series
are per topic, not per queue, so a group costs one series per topic it
reads. Group names reach the labels only once they passed RocketMQ's name
rule (and the ACL, when one is set).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tiered.replay.offsets import GroupOffsets
from tiered.replay.source import ArchiveSource

log = logging.getLogger(__name__)

GROUP_LAG = "tiered_replay_group_lag_messages"


class GroupLagCollector(Collector):
    """Over every broker served: a group's lag in a topic sums its queues on all of them."""

    def __init__(self, served: Sequence[tuple[ArchiveSource, GroupOffsets]]) -> None:
        self.served = served

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(GROUP_LAG, "Messages archived past each consumer group's committed offsets, "
                                 "summed over the queues of a topic it committed in.", labels=["group", "topic"])

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        try:
            lags: dict[tuple[str, str], int] = {}
            for source, offsets in self.served:
                for (group, topic), behind in _lags(source, offsets):
                    lags[(group, topic)] = lags.get((group, topic), 0) + behind
            for (group, topic), lag in lags.items():
                family.add_metric([group, topic], float(lag))
        except Exception as exc:  # a scrape is a process edge: log, leave the samples absent
            log.error("replay group lag unavailable: %s", exc)
            family = self._family()
        yield family


def _lags(source: ArchiveSource, offsets: GroupOffsets) -> Iterable[tuple[tuple[str, str], int]]:
    """(group, topic) and messages behind, for each queue a group committed on one broker."""
    topics = source.topics
    for group, queues in sorted(offsets.committed().items()):
        for (topic, queue_id), offset in sorted(queues.items()):
            if topic not in topics or not 0 <= queue_id < topics[topic]:
                continue  # a topic no longer archived has no end to lag behind
            yield (group, topic), max(source.max_offset(topic, queue_id) - offset, 0)
