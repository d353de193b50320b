"""Retention per topic, re-read at the start of every clean pass.

Precedence, first match wins:

1. the broker's ``reserve.time`` topic attribute (hours) in
   ``{store}/config/topics.json`` (with the ``.bak`` fallback), when a store
   directory is known and the attribute is set to a positive number;
2. ``retention.topics[topic]`` in the configuration;
3. with a store: ``retention.default_hours`` (72 h unless configured);
   without one, the ``reserve.time`` the dispatcher (which reads the
   broker's topics.json) last recorded in the bucket's catalog stands in
   for step 1, and the default applies only to topics the catalog knows
   (checked against topics.json, no ``reserve.time``). A topic the catalog
   does not know has an unknown retention: its data is kept, and the clean
   report says why (``RetentionPolicy.for_topic`` returns None).

A ``topics.json`` that exists but cannot be read (neither it nor its
backup parses) is NOT treated as "no attribute set": falling back to the
default could delete a topic whose ``reserve.time`` is longer. The caller
gets a ``ConfigError`` and expires nothing that pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tiered.config import RetentionSettings
from tiered.errors import ConfigError, CorruptRecordError
from tiered.store.localstore import LocalStore

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
    # without a store: topic -> (hours, source) as the dispatcher recorded it
    recorded: Mapping[str, tuple[float, str]] | None = None

    def for_topic(self, topic: str) -> Retention | None:
        hours = self.broker.get(topic)
        if hours is not None:
            return Retention(_hours_to_ms(hours), "reserve.time")
        if self.recorded is not None and self.recorded.get(topic, (0.0, ""))[1] == "reserve.time":
            return Retention(_hours_to_ms(self.recorded[topic][0]), "catalog: reserve.time")
        hours = self.overrides.get(topic)
        if hours is not None:
            return Retention(_hours_to_ms(hours), "config")
        if self.recorded is None or topic in self.recorded:
            # a topic the dispatcher checked against topics.json: no reserve.time
            return Retention(_hours_to_ms(self.default_hours), "default")
        return None

    def unknown_reason(self, topic: str) -> str:
        return ("no broker store given, and the catalog records no retention for this topic "
                "(set retention.topics or pass --store)")

    def table(self, topics: Iterable[str]) -> dict[str, tuple[float, str]]:
        """topic -> (hours, source), for the catalog."""
        out = {}
        for t in topics:
            r = self.for_topic(t)
            if r is not None:
                out[t] = (r.hours, r.source)
        return out

    @classmethod
    def fixed(cls, hours: float) -> RetentionPolicy:
        return cls(default_hours=hours)


def load_retention(
    settings: RetentionSettings, local: LocalStore | None = None,
    recorded: Mapping[str, tuple[float, str]] | None = None,
) -> RetentionPolicy:
    """The policy as of now. Without ``local``, ``recorded`` (the catalog's
    record, possibly empty) stands in for the broker's own settings. Raises
    ConfigError when the broker's topics.json exists but is unreadable (see
    the module docstring)."""
    broker: dict[str, float] = {}
    if local is None:
        return RetentionPolicy(MappingProxyType({}), MappingProxyType(dict(settings.topics)),
                               settings.default_hours, MappingProxyType(dict(recorded or {})))
    if local is not None:
        try:
            broker = local.retention_hours()
        except (CorruptRecordError, OSError) as exc:
            raise ConfigError(f"cannot read the broker's topic configuration ({exc}); "
                              "expiring nothing until it is readable") from None
    return RetentionPolicy(MappingProxyType(broker), MappingProxyType(dict(settings.topics)),
                           settings.default_hours)
