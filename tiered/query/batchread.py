"""Reading a BatchCQ queue's archive by the queue offsets of its messages.

A BatchCQ queue is archived one record per BatchConsumeQueue entry, its
segments numbered by entry (``q_start``/``q_end``) and carrying the queue
offsets of the messages inside (``msg_start``/``msg_end``; docs/batchcq.md).
Readers speak in message offsets, as RocketMQ does: offset N is message
N - base of the record whose messages [base, base + batch size) hold it.
These helpers turn one into the other and yield each message as a record of
its own (``innerbatch.inner_records``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from tiered.archive.manifest import Manifest
from tiered.format.codec import Record
from tiered.format.innerbatch import inner_records

if TYPE_CHECKING:
    from tiered.query.reader import ColdReader, QueueRef


def is_batch(m: Manifest | None) -> bool:
    return m is not None and any(s.batch for s in m.segments)


def message_bounds(m: Manifest) -> tuple[int, int]:
    """(first, next) message offsets the archive still holds."""
    segs = [s for s in m.segments if s.batch]
    if not segs:
        return 0, 0
    return int(segs[0].msg_start or 0), int(segs[-1].msg_end or 0)


def entry_for(reader: ColdReader, ref: QueueRef, m: Manifest, offset: int) -> int:
    """The entry whose record holds message ``offset``: the first archived
    entry below the archive, ``next_offset`` past it. By segment, then by
    bisection over the segment's records (one read each)."""
    segs = [s for s in m.segments if s.batch]
    if not segs or offset < int(segs[0].msg_start or 0):
        return m.first_offset
    seg = next((s for s in segs if offset < int(s.msg_end or 0)), None)
    if seg is None:
        return m.next_offset
    lo, hi = seg.q_start, seg.q_end - 1  # the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        base = record_base(reader, ref, mid)
        if base is None or base <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo


def record_base(reader: ColdReader, ref: QueueRef, entry: int) -> int | None:
    """The queue offset of the first message of the record at ``entry``
    (None when it cannot be read)."""
    res = reader.read(ref, entry, max_count=1)
    return res.records[0].queue_offset if res.records else None


def message_offset(reader: ColdReader, ref: QueueRef, m: Manifest, entry: int) -> int:
    """The first message offset of ``entry`` (the archive's message end at
    or past ``next_offset``)."""
    if entry >= m.next_offset:
        return message_bounds(m)[1]
    base = record_base(reader, ref, entry)
    return base if base is not None else message_bounds(m)[1]


def iter_messages(reader: ColdReader, ref: QueueRef, m: Manifest, start: int,
                  count: int | None = None) -> Iterator[Record]:
    """The messages from queue offset ``start`` on, at most ``count``."""
    left = count
    for rec in reader.iter_queue(ref, entry_for(reader, ref, m, start)):
        for msg in inner_records(rec):
            if msg.queue_offset < start:
                continue
            if left is not None:
                if left <= 0:
                    return
                left -= 1
            yield msg
        if left is not None and left <= 0:
            return


def message_window(reader: ColdReader, ref: QueueRef, m: Manifest, *, offset: int | None, since_ms: int | None,
                   until_ms: int | None, last: int | None, limit: int | None) -> tuple[int, int | None]:
    """``lookup.window`` in message offsets: (start, end or None)."""
    first, nxt = message_bounds(m)
    if last is not None:
        start = max(first, nxt - last)
    elif since_ms is not None:
        found = reader.offset_for_time(ref, since_ms)
        start = first if found is None else message_offset(reader, ref, m, found)
    else:
        start = offset or 0
    end = None
    if until_ms is not None:
        found = reader.offset_for_time(ref, until_ms)
        end = nxt if found is None else message_offset(reader, ref, m, found)
    if limit is not None:
        end = start + limit if end is None else min(end, start + limit)
    return start, None if end is None else max(start, end)


def follow_messages(reader: ColdReader, ref: QueueRef, start: int, *, sleep: Callable[[], None],
                    stop: Callable[[], bool] = lambda: False) -> Iterator[Record]:
    """``lookup.follow`` for a BatchCQ queue: messages from ``start`` on, then
    newly archived ones as they appear."""
    offset = start
    while True:
        m = reader.archive.manifest(ref)
        if m is not None:
            for msg in iter_messages(reader, ref, m, offset):
                yield msg
                offset = msg.queue_offset + 1
        if stop():
            return
        sleep()
        reader.archive.forget()
