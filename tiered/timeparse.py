"""ISO 8601 / epoch-millisecond parsing for CLI flags and config values."""

from __future__ import annotations

from datetime import datetime, timezone


def parse_time_ms(value: str | int) -> int:
    """Milliseconds since the epoch from an ISO 8601 string or an integer.

    A naive ISO time is taken as UTC: a sidecar's local zone is an accident
    of the pod it runs in.
    """
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO 8601 time or epoch milliseconds: {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp() * 1000)


def format_time_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
