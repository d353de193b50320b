"""The topics a RocketMQ 5.3.3 broker creates for itself, and what the
dispatcher does with each by default, with the reason ``status`` shows.

Names and prefixes come from RocketMQ's ``TopicValidator``,
``TopicConfigManager.init``, ``PopAckConstants``, ``TimerMessageStore``,
``TraceConstants`` and ``MessageStoreUtil``. The rule behind each choice: a
topic is archived when it holds data that exists nowhere else once the broker
deletes it; it is excluded when it is the broker's bookkeeping, or a waiting
copy of a message that is archived under its real topic when delivered.
``topics.include`` naming a topic archives it anyway, ``topics.exclude``
drops it; see docs/system-topics.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SystemTopic:
    pattern: str  # the topic's name, or a prefix ending in "*"
    archive: bool  # the default
    reason: str

    def matches(self, topic: str) -> bool:
        if self.pattern.endswith("*"):
            return topic.startswith(self.pattern[:-1])
        return topic == self.pattern


_WAITING = "archived under its real topic once delivered"

KNOWN: tuple[SystemTopic, ...] = (
    SystemTopic(pattern="SCHEDULE_TOPIC_XXXX", archive=False,
                reason=f"delay-level messages waiting for their time; each is {_WAITING} "
                       "(DELAY, REAL_TOPIC, REAL_QID kept)"),
    SystemTopic(pattern="rmq_sys_wheel_timer", archive=False,
                reason=f"timer wheel: timer messages waiting, their roll copies and recall markers; "
                       f"each is {_WAITING} (TIMER_*, REAL_TOPIC kept)"),
    SystemTopic(pattern="RMQ_SYS_TRANS_HALF_TOPIC", archive=False,
                reason="transaction half messages: a committed one is archived under its real topic "
                       "(sys_flag 0x8, __transactionId__ kept); rolled-back and open ones reach no consumer"),
    SystemTopic(pattern="RMQ_SYS_TRANS_OP_HALF_TOPIC", archive=False,
                reason="transaction op records: which half messages the broker resolved (its bookkeeping)"),
    SystemTopic(pattern="TRANS_CHECK_MAX_TIME_TOPIC", archive=True,
                reason="transactions the broker gave up checking (transactionCheckMax): found nowhere "
                       "else, kept like a DLQ"),
    SystemTopic(pattern="RMQ_SYS_TRACE_TOPIC", archive=False,
                reason="message traces, as many as the messages traced; name it in topics.include to keep them"),
    SystemTopic(pattern="rmq_sys_TRACE_DATA_*", archive=False,
                reason="message traces, as many as the messages traced; name it in topics.include to keep them"),
    SystemTopic(pattern="rmq_sys_REVIVE_LOG_*", archive=False,
                reason="POP consumption checkpoints and acks (ck/ack): the broker's bookkeeping of invisible time"),
    SystemTopic(pattern="rmq_sys_SYNC_BROKER_MEMBER_*", archive=False,
                reason="broker member sync topic: no messages"),
    SystemTopic(pattern="rmq_sys_INDEX", archive=False, reason="RocketMQ's own tiered-store index"),
    SystemTopic(pattern="CHECKPOINT_TOPIC", archive=False,
                reason="RocksDB consumer-offset checkpoints: the broker's bookkeeping"),
    SystemTopic(pattern="OFFSET_MOVED_EVENT", archive=False,
                reason="the broker's notices of consumer offsets it corrected"),
    SystemTopic(pattern="TBW102", archive=False, reason="auto-create template topic: no messages"),
    SystemTopic(pattern="SELF_TEST_TOPIC", archive=False, reason="broker self-test topic"),
    SystemTopic(pattern="BenchmarkTest", archive=False, reason="the benchmark tool's topic"),
)

_REPLY_SUFFIX = "_REPLY_TOPIC"  # MixAll.REPLY_TOPIC_POSTFIX after "{cluster}_"
_ROUTE = SystemTopic(pattern="", archive=False,
                     reason="the broker's cluster or broker-name route topic: no messages")
_UNKNOWN = SystemTopic(pattern="", archive=False,
                       reason="a broker topic this version does not know; name it in topics.include to archive it")


def classify(topic: str, route_topics: frozenset[str] = frozenset(), *, system: bool = False) -> SystemTopic | None:
    """What a broker topic is, None for an application's topic.

    ``route_topics`` are the cluster and broker names (topics the broker
    creates after them); ``system`` says the name has a system prefix this
    table does not list (what ``filters.is_system_topic`` says).
    """
    for known in KNOWN:
        if known.matches(topic):
            return known
    if topic in route_topics:
        return _ROUTE
    if topic.endswith(_REPLY_SUFFIX) and topic[:-len(_REPLY_SUFFIX)] in route_topics:
        return SystemTopic(pattern=topic, archive=True,
                           reason="request-reply responses: application data the requesters received")
    return _UNKNOWN if system else None
