"""Which topics the dispatcher archives, and why a topic is not.

System topics the broker uses internally are skipped unless asked for:
an explicit include pattern naming one (no wildcard) archives it anyway.
A few broker topics hold data found nowhere else and are archived like an
application's (``systopics.KNOWN`` says which, and why).
``%RETRY%{group}`` and ``%DLQ%{group}`` are ordinary topics here: the DLQ is
what people most want to analyse later, and so are ``%LMQ%`` queues
(an MQTT client's queue; ``tiered.format.lmq``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from tiered.dispatcher.systopics import classify

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
        return self.verdict(topic).archived

    def verdict(self, topic: str) -> TopicVerdict:
        """Whether the dispatcher archives ``topic``, with the reason where
        there is one to tell (a broker topic, or one the config leaves out)."""
        known = classify(topic, self.extra_system, system=is_system_topic(topic, self.extra_system))
        hit = next((p for p in self.exclude if fnmatchcase(topic, p)), None)
        if hit is not None:
            why = f"topics.exclude matches {hit!r}"
            return TopicVerdict(topic=topic, archived=False, system=known is not None,
                                reason=why if known is None else f"{known.reason}; {why}")
        included = any(fnmatchcase(topic, p) for p in self.include)
        if known is None:
            return TopicVerdict(topic=topic, archived=included, system=False,
                                reason=None if included else "no topics.include pattern matches")
        if known.archive or self.include_system:
            return TopicVerdict(topic=topic, archived=included, system=True, reason=known.reason if included
                                else f"{known.reason}; no topics.include pattern matches")
        if topic in self.include:  # named explicitly, not through a wildcard
            return TopicVerdict(topic=topic, archived=True, system=True,
                                reason=f"{known.reason}; archived: named in topics.include")
        return TopicVerdict(topic=topic, archived=False, system=True, reason=known.reason)


@dataclass(frozen=True, kw_only=True)
class TopicVerdict:
    topic: str
    archived: bool
    system: bool  # a topic the broker made for itself
    reason: str | None  # None: an application's topic the include patterns take
