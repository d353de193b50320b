"""Retention per topic, re-read at the start of every clean pass.

Precedence, first match wins:

1. the broker's ``reserve.time`` topic attribute (hours) in
   ``{store}/config/topics.json`` (with the ``.bak`` fallback), when a store
   directory is known and the attribute is set to a positive number;
2. ``retention.topics[topic]`` in the configuration;
3. ``retention.default_hours`` (72 h unless configured).

A ``topics.json`` that exists but cannot be read (neither it nor its
backup parses) is NOT treated as "no attribute set": falling back to the
default could delete a topic whose ``reserve.time`` is longer. The caller
gets a ``ConfigError`` and expires nothing that pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tiered.config import RetentionSettings
from tiered.errors import ConfigError, CorruptRecordError
from tiered.localstore import LocalStore

MS_PER_HOUR = 3_600_000


@dataclass(frozen=True, slots=True)
class Retention:
    """How long a topic's archived data is kept, and where that came from."""

    ms: int
    source: str  # "reserve.time" | "config" | "default"

    @property
    def hours(self) -> float:
        return self.ms / MS_PER_HOUR


def _hours_to_ms(hours: float) -> int:
    return max(1, int(round(hours * MS_PER_HOUR)))


@dataclass(frozen=True)
class RetentionPolicy:
    broker: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    overrides: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    default_hours: float = 72.0

    def for_topic(self, topic: str) -> Retention:
        hours = self.broker.get(topic)
        if hours is not None:
            return Retention(_hours_to_ms(hours), "reserve.time")
        hours = self.overrides.get(topic)
        if hours is not None:
            return Retention(_hours_to_ms(hours), "config")
        return Retention(_hours_to_ms(self.default_hours), "default")

    @classmethod
    def fixed(cls, hours: float) -> RetentionPolicy:
        return cls(default_hours=hours)


def load_retention(settings: RetentionSettings, local: LocalStore | None = None) -> RetentionPolicy:
    """The policy as of now. Raises ConfigError when the broker's topics.json
    exists but is unreadable (see the module docstring)."""
    broker: dict[str, float] = {}
    if local is not None:
        try:
            broker = local.retention_hours()
        except (CorruptRecordError, OSError) as exc:
            raise ConfigError(f"cannot read the broker's topic configuration ({exc}); "
                              "expiring nothing until it is readable") from None
    return RetentionPolicy(MappingProxyType(broker), MappingProxyType(dict(settings.topics)),
                           settings.default_hours)
