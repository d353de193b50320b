"""Retention lives in ``tiered.retention``: the dispatcher records it in the
catalog and the cleaner applies it. Re-exported for the cleaner's callers."""

from tiered.retention import MS_PER_HOUR, Retention, RetentionPolicy, load_retention

__all__ = ["MS_PER_HOUR", "Retention", "RetentionPolicy", "load_retention"]
