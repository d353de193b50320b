"""Where a group with no committed offset starts: ``--start GROUP=WHERE``.

A group new to the archive starts at its earliest archived offset (the point
of a replay). ``latest`` starts it at the end, and a time starts it at the
first offset stored at or after that time, as ``mqadmin resetOffsetByTime``
sets a group's offsets on a broker. ``client`` leaves it to the client:
the group's offset query is answered "not found", as a broker answers for a
group it has never seen (``ConsumerManageProcessor``), so the client's own
``consumeFromWhere`` decides (a timestamp, its first or last offset). A
committed offset always wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiered.errors import BadRequestError
from tiered.replay.offsets import check_name
from tiered.timeparse import parse_time_ms

EARLIEST = "earliest"
LATEST = "latest"
TIME = "time"
CLIENT = "client"


@dataclass(frozen=True, kw_only=True)
class Start:
    where: str = EARLIEST
    time_ms: int | None = None


def parse_start(value: str) -> tuple[str, Start]:
    """``GROUP=earliest|latest|client|TIME`` (TIME: ISO 8601, UTC when naive, or
    epoch milliseconds); ValueError naming what is wrong."""
    group, sep, where = value.partition("=")
    if not sep or not group or not where:
        raise ValueError(f"--start {value}: GROUP=earliest, GROUP=latest, GROUP=client or GROUP=TIME")
    try:
        check_name("group", group)
    except BadRequestError as exc:
        raise ValueError(f"--start {value}: {exc}") from None
    if where in (EARLIEST, LATEST, CLIENT):
        return group, Start(where=where)
    try:
        return group, Start(where=TIME, time_ms=parse_time_ms(where))
    except ValueError as exc:
        raise ValueError(f"--start {value}: earliest, latest, client or a time ({exc})") from None
