"""Which topics the dispatcher archives.

System topics the broker uses internally are skipped unless asked for:
an explicit include pattern naming one (no wildcard) archives it anyway.
``%RETRY%{group}`` and ``%DLQ%{group}`` are ordinary topics here: the DLQ is
what people most want to analyse later, and so are ``%LMQ%`` queues
(an MQTT client's queue; ``tiered.format.lmq``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

SYSTEM_TOPICS = frozenset({
    "SCHEDULE_TOPIC_XXXX", "TBW102", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
})
SYSTEM_PREFIXES = ("RMQ_SYS_", "rmq_sys_")


def is_system_topic(topic: str, extra: frozenset[str] = frozenset()) -> bool:
    return topic in SYSTEM_TOPICS or topic in extra or topic.startswith(SYSTEM_PREFIXES)


@dataclass(frozen=True)
class TopicFilter:
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    include_system: bool = False
    # The broker also creates topics named after its cluster and itself.
    extra_system: frozenset[str] = frozenset()

    def accepts(self, topic: str) -> bool:
        if any(fnmatchcase(topic, p) for p in self.exclude):
            return False
        if is_system_topic(topic, self.extra_system) and not self.include_system:
            return topic in self.include  # named explicitly, not through a wildcard
        return any(fnmatchcase(topic, p) for p in self.include)
