"""The lookups behind ``tiered cat`` and ``tiered find``: a message id, a
store-time window, the last N records, following a queue as it grows; the
same over every queue of a topic, merged by store time.

Pure reading on a :class:`ColdReader`; the commands print.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

from tiered.format.codec import Host, Record, entry_offset, parse_offset_msg_id
from tiered.format.innerbatch import inner_records
from tiered.query import batchread
from tiered.query.reader import ColdReader, QueueRef, ReadStatus


@dataclass(frozen=True, kw_only=True)
class OffsetMsgId:
    """RocketMQ's offset message id: the storing broker's address and the
    record's physical offset in its CommitLog."""

    store_host: Host
    physical_offset: int


def parse_msg_id(text: str) -> OffsetMsgId | None:
    """The offset id in ``text``, or None when it cannot be one (then it can
    only be a client UNIQ_KEY id; both are 32 hex digits for IPv4)."""
    try:
        host, offset = parse_offset_msg_id(text.strip())
    except ValueError:
        return None
    if offset < 0 or not 0 < host.port < 65536:
        return None
    return OffsetMsgId(store_host=host, physical_offset=offset)


def _record_at(reader: ColdReader, ref: QueueRef, offset: int) -> tuple[Record | None, int]:
    """The record at ``offset`` or the first one after a gap; (None, end) past the end."""
    while True:
        res = reader.read(ref, offset, max_count=1)
        if res.status is ReadStatus.FOUND and res.records:
            # where the read began: an LMQ record carries its parent's queue offset, a
            # BatchCQ record its first message's, neither the entry read
            return res.records[0], res.next_offset - 1
        if res.status in (ReadStatus.OFFSET_IN_GAP, ReadStatus.OFFSET_TOO_SMALL) and res.next_offset > offset:
            offset = res.next_offset
            continue
        return None, res.next_offset


def find_physical(reader: ColdReader, ref: QueueRef, physical_offset: int) -> Record | None:
    """The record of ``ref`` at broker CommitLog ``physical_offset``: a binary
    search on queue offsets (physical offsets grow with them in a queue),
    about log2(records) ranged reads."""
    m = reader.archive.manifest(ref)
    if m is None or m.next_offset <= m.first_offset:
        return None
    lo, hi = m.first_offset, m.next_offset
    while lo < hi:
        mid = (lo + hi) // 2
        rec, at = _record_at(reader, ref, mid)
        if rec is None or rec.physical_offset >= physical_offset:
            hi = mid
        else:
            lo = at + 1
    rec, _ = _record_at(reader, ref, lo)
    return rec if rec is not None and rec.physical_offset == physical_offset else None


def find_msg_id(reader: ColdReader, msg_id: str, *,
                topics: Callable[[str], bool] | None = None) -> Iterator[tuple[QueueRef, Record]]:
    """Records with this id: as an offset message id (store host, port,
    physical offset) and as a client UNIQ_KEY id; each record once."""
    seen: set[tuple[QueueRef, int]] = set()
    parsed = parse_msg_id(msg_id)
    if parsed is not None:
        for ref in reader.archive.queues(topics):
            rec = find_physical(reader, ref, parsed.physical_offset)
            if rec is not None and rec.store_host == parsed.store_host:
                for msg in inner_records(rec):  # an inner batch: each of its messages shares the id
                    seen.add((ref, entry_offset(msg, ref.topic)))
                    yield ref, msg
    for ref, rec in reader.find_key(msg_id.strip(), topics=topics):
        if rec.unique_key == msg_id.strip() and (ref, entry_offset(rec, ref.topic)) not in seen:
            seen.add((ref, entry_offset(rec, ref.topic)))
            yield ref, rec


@dataclass(frozen=True, kw_only=True)
class Window:
    """What ``cat`` reads: [start, end) in queue offsets (end None = to the end)."""

    start: int
    end: int | None


def window(reader: ColdReader, ref: QueueRef, *, offset: int | None, since_ms: int | None, until_ms: int | None,
           last: int | None, limit: int | None) -> Window:
    """The offsets ``cat`` prints, from ``--offset``/``--since``/``--last``,
    ``--until`` and ``--limit`` (store times are taken to grow with offsets,
    as a broker writes them)."""
    m = reader.archive.manifest(ref)
    first = m.first_offset if m is not None else 0
    next_offset = m.next_offset if m is not None else 0
    if last is not None:
        start = max(first, next_offset - last)
    elif since_ms is not None:
        found = reader.offset_for_time(ref, since_ms)
        start = first if found is None else found
    else:
        start = offset or 0
    end = reader.offset_for_time(ref, until_ms) if until_ms is not None else None
    if limit is not None:
        end = start + limit if end is None else min(end, start + limit)
    return Window(start=start, end=None if end is None else max(start, end))


def follow(reader: ColdReader, ref: QueueRef, start: int, *, sleep: Callable[[], None],
           stop: Callable[[], bool] = lambda: False) -> Iterator[Record]:
    """Records from ``start`` on, then newly archived ones as they appear:
    after reaching the archive's end, ``sleep()`` and read the manifest again.
    Ends when ``stop()`` says so (the CLI: never, until interrupted)."""
    offset = start
    while True:
        for rec in reader.iter_queue(ref, offset):
            yield rec
            offset = entry_offset(rec, ref.topic) + 1
        if stop():
            return
        sleep()
        reader.archive.forget()  # the next manifest GET sees what was archived meanwhile


# --- a topic: every archived queue of it, merged by store time --------------------------


def _order(item: tuple[QueueRef, Record]) -> tuple[int, int, str, str, int]:
    ref, rec = item
    return rec.store_timestamp, ref.queue_id, ref.cluster, ref.broker, entry_offset(rec, ref.topic)


def _tagged(ref: QueueRef, records: Iterator[Record]) -> Iterator[tuple[QueueRef, Record]]:
    for rec in records:
        yield ref, rec


def merged(parts: Iterable[tuple[QueueRef, Iterator[Record]]]) -> Iterator[tuple[QueueRef, Record]]:
    """Records of several queues as one stream, by store time, then queue id
    (then broker), then offset. Each queue's records come in offset order,
    and a broker stores a queue's records in time order, so one pass of each
    queue is enough."""
    return heapq.merge(*(_tagged(ref, recs) for ref, recs in parts), key=_order)


def topic_records(reader: ColdReader, refs: Iterable[QueueRef], *, since_ms: int | None, until_ms: int | None,
                  last: int | None, limit: int | None) -> Iterator[tuple[QueueRef, Record]]:
    """What ``cat --topic T`` prints without ``--queue``: every queue's
    window (as :func:`window`), merged by store time, each record once; the
    last ``last`` of the merged stream, at most ``limit``."""
    parts: list[tuple[QueueRef, Iterator[Record]]] = []
    for ref in refs:
        # each queue's share of the topic's first ``limit`` or last ``last`` is within its own
        m = reader.archive.manifest(ref)
        if batchread.is_batch(m) and m is not None:  # a BatchCQ queue: its messages, by their offsets
            start, end = batchread.message_window(reader, ref, m, offset=None, since_ms=since_ms,
                                                  until_ms=until_ms, last=last, limit=limit)
            parts.append((ref, batchread.iter_messages(reader, ref, m, start, None if end is None else end - start)))
            continue
        win = window(reader, ref, offset=None, since_ms=since_ms, until_ms=until_ms, last=last, limit=limit)
        parts.append((ref, reader.iter_queue(ref, win.start, None if win.end is None else win.end - win.start)))
    stream = merged(parts)
    if last is not None:
        stream = iter(deque(stream, maxlen=last))
    return stream if limit is None else islice(stream, limit)


def _records_from(reader: ColdReader, ref: QueueRef, offset: int) -> Iterator[Record]:
    """A queue's records from queue ``offset`` on: a BatchCQ queue's messages."""
    m = reader.archive.manifest(ref)
    if batchread.is_batch(m) and m is not None:
        return batchread.iter_messages(reader, ref, m, offset)
    return reader.iter_queue(ref, offset)


def follow_topic(reader: ColdReader, refs: Callable[[], list[QueueRef]], starts: Mapping[QueueRef, int], *,
                 sleep: Callable[[], None], stop: Callable[[], bool] = lambda: False,
                 ) -> Iterator[tuple[QueueRef, Record]]:
    """Every queue of a topic from ``starts`` on, merged by store time, then
    what is newly archived in any of them, poll after poll (each poll's new
    records merged by store time). ``refs()`` lists the topic's queues at
    each poll: a queue archived for the first time is read from its first
    offset. Ends when ``stop()`` says so."""
    positions = dict(starts)
    while True:
        for ref in refs():
            if ref not in positions:
                m = reader.archive.manifest(ref)
                positions[ref] = (batchread.message_bounds(m)[0] if batchread.is_batch(m) and m is not None
                                  else m.first_offset if m is not None else 0)
        for ref, rec in merged((ref, _records_from(reader, ref, at)) for ref, at in positions.items()):
            yield ref, rec
            positions[ref] = entry_offset(rec, ref.topic) + 1
        if stop():
            return
        sleep()
        reader.archive.forget()  # the next catalog and manifest GETs see what was archived meanwhile
